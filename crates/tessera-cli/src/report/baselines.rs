//! The Python baseline runners in `scripts/baselines/`: where a script lives, running it on a
//! list of cases, and reading what it wrote.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;

use super::json::BenchRow;

/// Where a baseline script lives: `$TESSERA_BASELINES_DIR/<name>` (device-run.sh sets it to
/// `.bundle/baselines`), else `baselines/<name>` in the bundle folder above the executable,
/// else `scripts/baselines/<name>` under the current directory.
pub fn baseline_script(name: &str) -> PathBuf {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(d) = std::env::var_os("TESSERA_BASELINES_DIR") {
        candidates.push(PathBuf::from(d).join(name));
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent()?.parent().map(Path::to_path_buf))
    {
        candidates.push(dir.join("baselines").join(name));
    }
    let fallback = PathBuf::from("scripts/baselines").join(name);
    candidates.into_iter().find(|p| p.is_file()).unwrap_or(fallback)
}

/// Result of one baseline runner invocation.
#[derive(Debug, Clone, PartialEq)]
pub enum BaselineOutcome {
    /// Rows as measured (a failed case has `ms: None`).
    Rows(Vec<BenchRow>),
    /// The baseline cannot run here (torch/CUDA missing, script failed, ...): why.
    Missing(String),
}

/// Parses what a baseline runner wrote: `{"rows": [...]}`, a bare list of rows, or
/// `{"missing": "reason"}`.
pub fn parse_baseline_output(text: &str) -> BaselineOutcome {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Out {
        Missing { missing: String },
        Rows { rows: Vec<BenchRow> },
        List(Vec<BenchRow>),
    }
    match serde_json::from_str::<Out>(text) {
        Ok(Out::Missing { missing }) => BaselineOutcome::Missing(missing),
        Ok(Out::Rows { rows }) | Ok(Out::List(rows)) => BaselineOutcome::Rows(rows),
        Err(e) => BaselineOutcome::Missing(format!("unreadable baseline output: {e}")),
    }
}

/// Runs `python3 SCRIPT --op OP --cases IN.json --out OUT.json` (python from `$TESSERA_PYTHON`,
/// default `python3`) with `cases` as `[{"case", "params"}]` and `TESSERA_BENCH_TIMING=timing`
/// (the runner times as ours does: `scripts/baselines/bench_common.py`); the script's stderr
/// (one line per case) passes through to ours. Never fails: anything that goes wrong becomes
/// `Missing`.
pub fn run_python_baseline(
    script: &Path,
    op: &str,
    cases: &[(String, serde_json::Value)],
    timing: &str,
) -> BaselineOutcome {
    if !script.is_file() {
        return BaselineOutcome::Missing(format!("{} not found", script.display()));
    }
    let python = std::env::var("TESSERA_PYTHON").unwrap_or_else(|_| "python3".into());
    let stamp = format!(
        "tessera-baseline-{}-{}-{}",
        std::process::id(),
        op,
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    let dir = std::env::temp_dir();
    let cases_path = dir.join(format!("{stamp}-cases.json"));
    let out_path = dir.join(format!("{stamp}-out.json"));
    let list: Vec<serde_json::Value> = cases
        .iter()
        .map(|(c, p)| serde_json::json!({"case": c, "params": p}))
        .collect();
    let result = (|| {
        std::fs::write(&cases_path, serde_json::to_string(&list).map_err(|e| e.to_string())?)
            .map_err(|e| format!("cannot write {}: {e}", cases_path.display()))?;
        let status = Command::new(&python)
            .arg(script)
            .args(["--op", op, "--cases"])
            .arg(&cases_path)
            .arg("--out")
            .arg(&out_path)
            .env("PYTHONUNBUFFERED", "1")
            .env("TESSERA_BENCH_TIMING", timing)
            .stdin(std::process::Stdio::null())
            .status()
            .map_err(|e| format!("cannot run {python}: {e}"))?;
        let text = std::fs::read_to_string(&out_path);
        match (status.success(), text) {
            (_, Ok(t)) => Ok(parse_baseline_output(&t)),
            (false, Err(_)) => Err(format!("{} exited with {status}", script.display())),
            (true, Err(e)) => Err(format!("{} wrote no output: {e}", script.display())),
        }
    })();
    let _ = std::fs::remove_file(&cases_path);
    let _ = std::fs::remove_file(&out_path);
    result.unwrap_or_else(BaselineOutcome::Missing)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use crate::report::json::TIMING_SUSTAINED;

    #[test]
    fn baseline_output_parses() {
        match parse_baseline_output(r#"{"missing": "torch not importable"}"#) {
            BaselineOutcome::Missing(m) => assert!(m.contains("torch")),
            o => panic!("{o:?}"),
        }
        let text = r#"{"torch": "2.11", "rows": [{"case": "a", "params": {"rows": 1},
            "impl": "torch", "ms": 0.5, "tflops": null, "gbps": 10.0, "extra_mib": null,
            "max_abs_err": null, "rel_l2": null, "error": null}]}"#;
        match parse_baseline_output(text) {
            BaselineOutcome::Rows(rows) => {
                assert_eq!(rows.len(), 1);
                assert_eq!(rows[0].r#impl, "torch");
                assert_eq!(rows[0].ms, Some(0.5));
            }
            o => panic!("{o:?}"),
        }
        assert!(matches!(parse_baseline_output("nope"), BaselineOutcome::Missing(_)));
    }

    #[test]
    fn runners_without_gpu_report_missing() {
        // CI has python3 but no GPU (and usually no torch): the runner must say "missing"
        if Command::new("python3").arg("--version").output().is_err() {
            eprintln!("python3 not found: skipped");
            return;
        }
        let softmax = (
            "64x128 fp16".to_string(),
            json!({"rows": 64, "cols": 128, "dtype": "fp16", "op": "softmax"}),
        );
        let attention = (
            "causal fp16 B1 H32 N1024 D128".to_string(),
            json!({"B": 1, "Hq": 32, "Hkv": 32, "N": 1024, "D": 128, "causal": true,
                "dtype": "fp16", "varlen": false}),
        );
        for (op, case) in [("softmax", &softmax), ("attention", &attention)] {
            let script = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../scripts/baselines")
                .join(
                    tessera::registry::find(op)
                        .and_then(|o| o.baselines())
                        .map_or("bench_torch.py", |b| b.script),
                );
            match run_python_baseline(&script, op, std::slice::from_ref(case), TIMING_SUSTAINED) {
                BaselineOutcome::Missing(m) => assert!(
                    m.contains("torch not importable") || m.contains("CUDA not available"),
                    "{op}: {m}"
                ),
                BaselineOutcome::Rows(r) => panic!("a GPU here? {r:?}"),
            }
        }
        let absent = run_python_baseline(Path::new("/nonexistent/x.py"), "softmax", &[softmax], TIMING_SUSTAINED);
        assert!(matches!(absent, BaselineOutcome::Missing(_)));
    }

    #[test]
    fn row_reasons_round_trip_and_stay_out_when_unset() {
        let text = r#"{"rows": [{"case": "a", "params": {}, "impl": "torch-math", "ms": null,
            "tflops": null, "gbps": null, "extra_mib": null, "max_abs_err": null, "rel_l2": null,
            "missing": "too big"}, {"case": "a", "params": {}, "impl": "torch-flash", "ms": 1.0,
            "tflops": 2.0, "gbps": null, "extra_mib": 3.0, "max_abs_err": null, "rel_l2": null,
            "note": "one sequence at a time"}], "flashinfer_jit": []}"#;
        let BaselineOutcome::Rows(rows) = parse_baseline_output(text) else {
            panic!("not rows")
        };
        assert_eq!(rows[0].missing.as_deref(), Some("too big"));
        assert_eq!(rows[1].note.as_deref(), Some("one sequence at a time"));
        assert!(rows[1].error.is_none());
        let v = serde_json::to_value(&rows[1]).unwrap();
        assert!(v.get("error").is_none() && v.get("missing").is_none() && v.get("note").is_some());
    }

    /// Runs a baseline runner's own test script (fake torch/flashinfer, no GPU needed).
    fn run_python_runner_test(script: &str) {
        if Command::new("python3").arg("--version").output().is_err() {
            eprintln!("python3 not found: skipped");
            return;
        }
        let test = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../scripts/baselines")
            .join(script);
        let out = Command::new("python3").arg(&test).output().unwrap();
        assert!(
            out.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn attention_runner_logic_with_fake_torch() {
        run_python_runner_test("test_bench_attention.py");
    }

    #[test]
    fn kvcache_runner_logic_with_fake_torch() {
        run_python_runner_test("test_bench_kvcache.py");
    }
}
