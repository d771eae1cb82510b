//! The main job on a machine without a GPU: run the CPU references on small shapes, check
//! their defining properties and time them, so a fresh machine shows what tessera computes.

use std::time::Instant;

use tessera::runtime::{compile_only, probe, Arch};
use tessera::softmax::reference::softmax_reference;
use tessera::softmax::SoftmaxKind;
use tessera::testdata::{random_matrix, seed_from_env_or_time, Dist};

pub fn run() -> Result<bool, String> {
    let seed = seed_from_env_or_time().map_err(|e| e.to_string())?;
    println!("CPU reference (f64), seed {seed}");
    println!(
        "{:<14} {:>12} {:>10} {:>14} {:>14}",
        "op", "shape", "ms", "max |sum-1|", "max |ln sm - lsm|"
    );
    let mut ok = true;
    for &(rows, cols) in &[(64usize, 128usize), (64, 1024), (16, 4096), (4, 32768)] {
        let x: Vec<f64> = random_matrix(seed, rows, cols, cols, Dist::WithOutliers { std: 2.0 });
        let t = Instant::now();
        let sm = softmax_reference(&x, rows, cols, cols, 1.0, SoftmaxKind::Softmax);
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let lsm = softmax_reference(&x, rows, cols, cols, 1.0, SoftmaxKind::LogSoftmax);
        let sum_err = sm
            .chunks(cols)
            .map(|r| (r.iter().sum::<f64>() - 1.0).abs())
            .fold(0.0, f64::max);
        let log_err = sm
            .iter()
            .zip(&lsm)
            .map(|(a, b)| (a.ln() - b).abs())
            .filter(|e| e.is_finite())
            .fold(0.0, f64::max);
        ok &= sum_err < 1e-12 && log_err < 1e-9;
        println!(
            "{:<14} {:>12} {:>10.3} {:>14.2e} {:>14.2e}",
            "softmax",
            format!("{rows}x{cols}"),
            ms,
            sum_err,
            log_err
        );
    }
    match probe::nvrtc() {
        Ok(n) => {
            let variants = tessera::softmax::plan::ci_variants_for(Arch::SM90);
            let sample: Vec<_> = variants.iter().step_by(variants.len().div_ceil(6).max(1)).collect();
            let t = Instant::now();
            let mut failed = 0;
            for v in &sample {
                match compile_only(&v.spec(), Arch::SM90) {
                    Ok(c) => println!(
                        "  compiled {:<64} sm_90a: {:>3} registers, {} B spilled",
                        v.spec().name,
                        c.resources.registers,
                        c.resources.spill_store_bytes
                    ),
                    Err(e) => {
                        failed += 1;
                        println!("  FAILED {}: {e}", v.spec().name)
                    }
                }
            }
            ok &= failed == 0;
            println!(
                "NVRTC {}.{} ({}): compiled {} sample softmax kernels for sm_90a in {:.1}s",
                n.version.0,
                n.version.1,
                n.library.path,
                sample.len(),
                t.elapsed().as_secs_f64()
            );
        }
        Err(e) => println!("NVRTC not found, kernels not compiled: {e}"),
    }
    println!(
        "\nNo GPU: nothing was run on a device. On a machine with an NVIDIA GPU, `tessera` verifies and benchmarks."
    );
    Ok(ok)
}
