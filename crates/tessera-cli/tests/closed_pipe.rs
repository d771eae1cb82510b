//! `tessera ... | head`: a reader that closes the pipe early ends the CLI quietly (SIGPIPE at
//! its default action), not with a panic on the next `println!`.

#[cfg(unix)]
#[test]
fn a_closed_stdout_pipe_ends_the_cli_without_a_panic() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};

    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .arg("info") // prints several lines and exits 0, with or without a GPU
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tessera");
    drop(child.stdout.take()); // the reader is gone before the first line is written
    let out = child.wait_with_output().expect("wait for tessera");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("panicked"),
        "tessera panicked on a closed pipe:\n{stderr}"
    );
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "status {:?}, stderr:\n{stderr}",
        out.status
    );
}
