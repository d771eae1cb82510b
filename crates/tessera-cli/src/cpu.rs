//! The main job on a machine without a GPU: every registered operator runs its CPU reference
//! on small shapes and checks its defining properties ([`Operator::cpu_demo`]), and, where
//! NVRTC is found, a sample of each operator's kernels is compiled for sm_90a, so a fresh
//! machine shows what tessera computes.

use std::time::Instant;

use tessera::registry::{Operator, OPERATORS};
use tessera::runtime::{compile_only, probe, Arch};
use tessera::testdata::seed_from_env_or_time;

/// Kernels compiled per operator when NVRTC is found.
const SAMPLE_PER_OPERATOR: usize = 3;

pub fn run() -> Result<bool, String> {
    let seed = seed_from_env_or_time().map_err(|e| e.to_string())?;
    println!("CPU reference (f64), seed {seed}");
    let mut ok = true;
    for op in OPERATORS {
        match op.cpu_demo(seed) {
            Ok(passed) => ok &= passed,
            Err(e) => {
                println!("{}: CPU demo failed: {e}", op.name());
                ok = false;
            }
        }
    }
    match probe::nvrtc() {
        Ok(n) => {
            println!();
            let t = Instant::now();
            let mut compiled = 0;
            for op in OPERATORS {
                let (count, failed) = compile_sample(*op);
                compiled += count;
                ok &= failed == 0;
            }
            println!(
                "NVRTC {}.{} ({}): compiled {compiled} sample kernels for sm_90a in {:.1}s",
                n.version.0,
                n.version.1,
                n.library.path,
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

/// Compiles a few of `op`'s sm_90a kernels, evenly spread over its variant list; returns
/// (compiled, failed).
fn compile_sample(op: &dyn Operator) -> (usize, usize) {
    let specs = op.kernel_specs(Arch::SM90);
    let step = specs.len().div_ceil(SAMPLE_PER_OPERATOR).max(1);
    let mut failed = 0;
    let sample: Vec<_> = specs.iter().step_by(step).collect();
    for spec in &sample {
        match compile_only(spec, Arch::SM90) {
            Ok(c) => println!(
                "  compiled {:<72} sm_90a: {:>3} registers, {} B spilled",
                spec.name, c.resources.registers, c.resources.spill_store_bytes
            ),
            Err(e) => {
                failed += 1;
                println!("  FAILED {}: {e}", spec.name)
            }
        }
    }
    (sample.len(), failed)
}
