//! GEMM's place in the [registry](crate::registry): verify and bench cases, the kernel
//! variants, the torch (cuBLAS / cuBLASLt) baselines and a CPU demonstration.

use std::time::Instant;

use super::problem::{Activation, GemmProblem, Precision};
use super::{bench, plan, reference, verify};
use crate::dtype::DType;
use crate::error::Result;
use crate::harness::{Baselines, BenchJob, VerifyJob};
use crate::registry::Operator;
use crate::runtime::{Arch, KernelSpec};
use crate::testdata::{random_matrix, Dist};

pub struct Gemm;

/// The registry entry.
pub static OPERATOR: Gemm = Gemm;

impl Operator for Gemm {
    fn name(&self) -> &'static str {
        "gemm"
    }

    fn verify_jobs(&self, quick: bool) -> Vec<VerifyJob> {
        let mut jobs: Vec<VerifyJob> = verify::cases(quick)
            .into_iter()
            .map(|c| VerifyJob::new(c.name(), c, verify::verify_case))
            .collect();
        jobs.push(VerifyJob::new("gemm bad input".into(), (), verify::verify_bad_inputs));
        for layout in [super::problem::Layout::ColMajor, super::problem::Layout::RowMajor] {
            jobs.push(VerifyJob::new(
                format!(
                    "gemm glu interleave + swiglu {}",
                    if layout == super::problem::Layout::ColMajor {
                        "B[2N,K]"
                    } else {
                        "B[K,2N]"
                    }
                ),
                layout,
                verify::verify_glu_interleave,
            ));
        }
        jobs.push(VerifyJob::new(
            "gemm hopper self-check".into(),
            verify::HopperJob::SelfCheck,
            verify::verify_hopper,
        ));
        jobs.push(VerifyJob::new(
            "gemm hopper tf32/fp8/int8 plans".into(),
            verify::HopperJob::PlanCheck,
            verify::verify_hopper,
        ));
        jobs.push(VerifyJob::new(
            "gemm sm80 tf32/fp8/int8 plans".into(),
            verify::HopperJob::Sm80PlanCheck,
            verify::verify_hopper,
        ));
        if !quick {
            // The Hopper kernel alone against cuBLAS in one process, each tiling forced.
            jobs.push(VerifyJob::new(
                "gemm hopper bench".into(),
                verify::HopperJob::Bench,
                verify::verify_hopper,
            ));
        }
        jobs
    }

    fn bench_jobs(&self, quick: bool) -> Vec<BenchJob> {
        bench::cases(quick)
            .into_iter()
            .map(|c| {
                let baseline = (c.path == plan::GemmPath::Auto && !c.autotune).then(|| (c.name(), c.params()));
                BenchJob::new(
                    format!("{} {}", c.name(), c.implementation()),
                    baseline,
                    c,
                    bench::bench_case,
                )
            })
            .collect()
    }

    fn kernel_specs(&self, arch: Arch) -> Vec<KernelSpec> {
        plan::kernel_specs(arch)
    }

    fn device_headers(&self) -> &'static [(&'static str, &'static str)] {
        super::DEVICE_HEADERS
    }

    fn baselines(&self) -> Option<Baselines> {
        Some(Baselines {
            script: "bench_torch.py",
            impls: &["torch"],
            in_process: &[],
        })
    }

    /// The blocked parallel reference against the naive triple loop on odd shapes, then a
    /// timed 512^3 product with a GELU epilogue.
    fn cpu_demo(&self, seed: u64) -> Result<bool> {
        let mut ok = true;
        for (m, n, k) in [(7, 9, 13), (33, 517, 65), (130, 70, 300)] {
            let a: Vec<f64> = random_matrix(seed, m, k, k, Dist::Normal { std: 1.0 });
            let b: Vec<f64> = random_matrix(seed ^ 1, k, n, n, Dist::Normal { std: 1.0 });
            let blocked = reference::matmul(&a, &b, m, n, k);
            let naive = reference::matmul_naive(&a, &b, m, n, k);
            let err = blocked
                .iter()
                .zip(&naive)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f64::max);
            let good = err == 0.0;
            ok &= good;
            println!(
                "gemm reference {m}x{n}x{k}: blocked vs triple loop max |diff| {err:.1e} {}",
                if good { "ok" } else { "FAIL" }
            );
        }
        let s = 512;
        let p = GemmProblem::new(Precision::F64, DType::F64, s, s, s)
            .bias(true)
            .activation(Activation::GeluErf);
        let a: Vec<f64> = random_matrix(seed ^ 2, s, s, s, Dist::Normal { std: 1.0 });
        let b: Vec<f64> = random_matrix(seed ^ 3, s, s, s, Dist::Normal { std: 1.0 });
        let bias: Vec<f64> = random_matrix(seed ^ 4, 1, s, s, Dist::Normal { std: 1.0 });
        let t = Instant::now();
        let (d, _) = reference::gemm(
            &p,
            &reference::Logical {
                a: &a,
                b: &b,
                c: None,
                bias: Some(&bias),
                residual: None,
            },
            1.0,
            0.0,
        );
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let finite = d.iter().all(|x| x.is_finite());
        ok &= finite;
        println!(
            "gemm reference {s}^3 fp64 + bias + gelu: {ms:.1} ms ({:.2} GFLOP/s incl. the |A||B| bound) {}",
            2.0 * 2.0 * (s * s * s) as f64 / (ms * 1e-3) / 1e9,
            if finite { "ok" } else { "FAIL" }
        );
        Ok(ok)
    }
}
