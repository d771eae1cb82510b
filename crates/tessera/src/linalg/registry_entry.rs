//! LSMR's place in the [registry](crate::registry) (operator `lsmr`): verify and bench cases,
//! the kernel variants, the CuPy / SciPy baselines and a CPU demonstration.

use std::time::Instant;

use super::lsmr::{istop_reason, lsmr_host, LsmrOptions};
use super::{bench, dense_operator, lsmr_device, verify};
use crate::error::Result;
use crate::harness::{Baselines, BenchJob, VerifyJob};
use crate::registry::Operator;
use crate::runtime::{Arch, KernelSpec};
use crate::sparse::generate::{generate, random_vector, MatrixClass};
use crate::sparse::CsrHost;

pub struct Lsmr;

/// The registry entry.
pub static OPERATOR: Lsmr = Lsmr;

impl Operator for Lsmr {
    fn name(&self) -> &'static str {
        "lsmr"
    }

    fn verify_jobs(&self, quick: bool) -> Vec<VerifyJob> {
        let mut jobs: Vec<VerifyJob> = verify::cases(quick)
            .into_iter()
            .map(|c| VerifyJob::new(c.name(), c, verify::verify_case))
            .collect();
        jobs.push(VerifyJob::new("lsmr argument errors".into(), (), verify::verify_errors));
        jobs.extend(
            verify::damp_cases(quick)
                .into_iter()
                .map(|c| VerifyJob::new(c.name(), c, verify::verify_damp_case)),
        );
        jobs.extend(
            verify::scale_cases(quick)
                .into_iter()
                .map(|c| VerifyJob::new(c.name(), c, verify::verify_scale_case)),
        );
        jobs.extend(
            verify::dense_cases(quick)
                .into_iter()
                .map(|c| VerifyJob::new(c.name(), c, verify::verify_dense_case)),
        );
        jobs.push(VerifyJob::new(
            "lsmr dense argument errors".into(),
            (),
            verify::verify_dense_errors,
        ));
        jobs.push(VerifyJob::new(
            "lsmr damps argument errors".into(),
            (),
            verify::verify_damp_errors,
        ));
        jobs.extend(
            verify::many_cases(quick)
                .into_iter()
                .map(|c| VerifyJob::new(c.name(), c, verify::verify_many_case)),
        );
        jobs.push(VerifyJob::new(
            "lsmr many batched products".into(),
            (),
            verify::verify_many_products,
        ));
        jobs.push(VerifyJob::new(
            "lsmr many argument errors".into(),
            (),
            verify::verify_many_errors,
        ));
        // the multi-GPU code path on one GPU: NCCL with a communicator of size 1
        jobs.push(VerifyJob::new(
            "lsmr distributed size-1 all-reduce".into(),
            (),
            crate::distributed::verify::verify_all_reduce,
        ));
        jobs.extend(
            crate::distributed::verify::cases(quick)
                .into_iter()
                .map(|c| VerifyJob::new(c.name(), c, crate::distributed::verify::verify_case)),
        );
        jobs
    }

    fn bench_jobs(&self, quick: bool) -> Vec<BenchJob> {
        let mut jobs: Vec<BenchJob> = bench::cases(quick)
            .into_iter()
            .map(|c| {
                let baseline = Some((c.name(), c.params()));
                // the autotuned row shares its case (and baselines) with the rules' row
                let job = if c.autotune {
                    format!("{} autotuned", c.name())
                } else {
                    c.name()
                };
                BenchJob::new(job, baseline, c, bench::bench_case)
            })
            .collect();
        jobs.extend(
            bench::damp_cases(quick)
                .into_iter()
                .map(|c| BenchJob::new(c.name(), None, c, bench::bench_damp_case)),
        );
        jobs.extend(
            bench::many_cases(quick)
                .into_iter()
                .map(|c| BenchJob::new(c.name(), None, c, bench::bench_many_case)),
        );
        jobs
    }

    fn kernel_specs(&self, _arch: Arch) -> Vec<KernelSpec> {
        let mut specs: Vec<KernelSpec> = lsmr_device::all_variants().into_iter().map(|v| v.spec()).collect();
        specs.extend(dense_operator::all_variants().into_iter().map(|v| v.spec()));
        specs.extend(crate::distributed::lsmr::all_variants().into_iter().map(|v| v.spec()));
        specs
    }

    fn baselines(&self) -> Option<Baselines> {
        Some(Baselines {
            script: "bench_torch.py",
            impls: &["cupy", "scipy-cpu"],
            in_process: &[],
        })
    }

    /// The CPU reference on a random tall system: the optimality of its answer checked
    /// directly (`||A^T (b - A x)||` small against `||A|| ||b - A x||`).
    fn cpu_demo(&self, seed: u64) -> Result<bool> {
        let (m, n) = (20_000, 400);
        let a: CsrHost<f64, i32> = generate(MatrixClass::TallLeastSquares { per_row: 12 }, m, n, seed);
        let b = random_vector(m, seed ^ 0xb);
        let t = Instant::now();
        let res = lsmr_host(&a, &b, &LsmrOptions::default())?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let mut r = b.clone();
        super::HostLinearOperator::apply(&a, -1.0, &res.x, 1.0, &mut r);
        let mut atr = vec![0.0; n];
        super::HostLinearOperator::apply_transposed(&a, 1.0, &r, 0.0, &mut atr);
        let norm = |v: &[f64]| v.iter().map(|e| e * e).sum::<f64>().sqrt();
        let optimality = norm(&atr) / (res.norma * norm(&r));
        let ok = res.istop == 2 || res.istop == 1;
        let ok = ok && optimality <= 1e-5;
        println!(
            "lsmr {m} x {n} tallls12 (CPU reference): istop {} ({}), itn {}, {ms:.1} ms, \
             ||A^T r|| / (||A|| ||r||) {optimality:.1e} {}",
            res.istop,
            istop_reason(res.istop),
            res.itn,
            if ok { "ok" } else { "FAIL" }
        );
        Ok(ok)
    }
}
