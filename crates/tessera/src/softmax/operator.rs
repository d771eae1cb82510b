//! Softmax's place in the [registry](crate::registry).

use std::time::Instant;

use super::reference::softmax_reference;
use super::{bench, plan, verify, SoftmaxKind, SoftmaxPath};
use crate::error::Result;
use crate::harness::{Baselines, BenchJob, VerifyJob};
use crate::registry::Operator;
use crate::runtime::{Arch, KernelSpec};
use crate::testdata::{random_matrix, Dist};

pub struct Softmax;

/// The registry entry.
pub static OPERATOR: Softmax = Softmax;

impl Operator for Softmax {
    fn name(&self) -> &'static str {
        "softmax"
    }

    fn verify_jobs(&self, quick: bool) -> Vec<VerifyJob> {
        verify::cases(quick)
            .into_iter()
            .map(|c| VerifyJob::new(c.name(), c, verify::verify_case))
            .collect()
    }

    fn bench_jobs(&self, quick: bool) -> Vec<BenchJob> {
        let ours = bench::cases(quick).into_iter().map(|c| {
            let baseline = (c.path == SoftmaxPath::Auto).then(|| (c.name(), c.params()));
            // the impl is part of the job name so `--filter tessera-split-row` selects it
            BenchJob::new(
                format!("{} {}", c.name(), c.implementation()),
                baseline,
                c,
                bench::bench_case,
            )
        });
        // `--filter copy` selects the same-size device copies
        let copies = bench::copy_cases(quick)
            .into_iter()
            .map(|c| BenchJob::new(format!("{} copy", c.name()), None, c, bench::bench_copy));
        ours.chain(copies).collect()
    }

    fn kernel_specs(&self, arch: Arch) -> Vec<KernelSpec> {
        plan::ci_variants_for(arch).iter().map(|v| v.spec()).collect()
    }

    fn baselines(&self) -> Option<Baselines> {
        Some(Baselines {
            script: "bench_torch.py",
            // `copy`: a same-size device copy (bench::bench_copy), ours the same bytes
            impls: &["torch", "copy"],
            in_process: &["copy"],
        })
    }

    /// The f64 reference on a few shapes: each softmax row sums to 1 and log-softmax is its log.
    fn cpu_demo(&self, seed: u64) -> Result<bool> {
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
        Ok(ok)
    }
}
