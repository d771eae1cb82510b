//! Sparse's place in the [registry](crate::registry): SpMV, SpMM and block-sparse verify and
//! bench cases, the kernel variants, cuSPARSE baselines and a CPU demonstration.

use std::time::Instant;

use super::descriptor::SparseDescriptor;
use super::generate::{generate, random_vector, MatrixClass};
use super::{
    bench, bsr, convert, reference, sell, spmm, spmv, spmv_merge, spmv_panels, spmv_transposed, verify, verify_block,
    verify_convert,
};
use crate::error::Result;
use crate::harness::{Baselines, BenchJob, VerifyJob};
use crate::registry::Operator;
use crate::runtime::{Arch, KernelSpec};

pub struct Sparse;

/// The registry entry.
pub static OPERATOR: Sparse = Sparse;

impl Operator for Sparse {
    fn name(&self) -> &'static str {
        "sparse"
    }

    fn verify_jobs(&self, quick: bool) -> Vec<VerifyJob> {
        let spmv = verify::cases(quick)
            .into_iter()
            .map(|c| VerifyJob::new(c.name(), c, verify::verify_case));
        let spmm = verify::spmm_cases(quick)
            .into_iter()
            .map(|c| VerifyJob::new(c.name(), c, verify::verify_spmm_case));
        let transposed = verify::transposed_cases(quick)
            .into_iter()
            .map(|c| VerifyJob::new(c.name(), c, verify::verify_transposed_case));
        let conversions = verify_convert::cases(quick)
            .into_iter()
            .map(|c| VerifyJob::new(c.name(), c, verify_convert::verify_case));
        let blocks = verify_block::cases(quick)
            .into_iter()
            .map(|c| VerifyJob::new(c.name(), c, verify_block::verify_case));
        spmv.chain(spmm)
            .chain(transposed)
            .chain(conversions)
            .chain(blocks)
            .collect()
    }

    fn bench_jobs(&self, quick: bool) -> Vec<BenchJob> {
        let cases = bench::cases(quick);
        // SELL-C-sigma beside CSR on the short-row, uneven matrices (no baseline of its own)
        let sell = cases
            .iter()
            .filter(|c| {
                matches!(
                    c.source,
                    bench::MatrixSource::Generated(MatrixClass::PowerLaw { .. } | MatrixClass::FewLongRows { .. })
                )
            })
            .map(|c| BenchJob::new(format!("{} sell", c.name()), None, c.clone(), bench::bench_sell_case))
            .collect::<Vec<_>>();
        // block-sparse SpMM: our CSR (with the baselines: cuSPARSE CSR and BSR through torch),
        // BSR, Blocked-ELL, and for halves BSR on CUDA cores, on the same matrix
        let blocks = bench::block_cases(quick).into_iter().flat_map(|c| {
            let mut impls = vec![bench::BlockImpl::Csr, bench::BlockImpl::Bsr, bench::BlockImpl::Bell];
            if c.value.size() == 2 {
                impls.push(bench::BlockImpl::BsrCudaCores);
                impls.push(bench::BlockImpl::BsrStaged);
            }
            impls.into_iter().map(move |which| {
                let baseline = (which == bench::BlockImpl::Csr).then(|| (c.name(), c.params()));
                let name = format!("{} {}", c.name(), which.name());
                BenchJob::new(name, baseline, (c.clone(), which), bench::bench_block_case)
            })
        });
        // the autotuned plan beside the rules' on every SpMV case (no baseline of its own)
        let autotuned = cases
            .iter()
            .map(|c| {
                BenchJob::new(
                    format!("{} autotuned", c.name()),
                    None,
                    c.clone(),
                    bench::bench_autotuned_case,
                )
            })
            .collect::<Vec<_>>();
        // the merge path (opt-in) beside the rules' on every SpMV case (no baseline of its own)
        let merge = cases
            .iter()
            .map(|c| BenchJob::new(format!("{} merge", c.name()), None, c.clone(), bench::bench_merge_case))
            .collect::<Vec<_>>();
        // the column panels (default width) beside the rules' on every SpMV case where they fit
        let panels = cases
            .iter()
            .filter(|c| bench::panels_apply(c))
            .map(|c| {
                BenchJob::new(
                    format!("{} panels", c.name()),
                    None,
                    c.clone(),
                    bench::bench_panels_case,
                )
            })
            .collect::<Vec<_>>();
        // 16-bit columns forced on beside the rules' row on every SpMV case of at most 65536
        // columns (opt-in until measured: these rows are the measurement)
        let compact = cases
            .iter()
            .filter(|c| bench::compact_applies(c))
            .map(|c| {
                BenchJob::new(
                    format!("{} compact", c.name()),
                    None,
                    c.clone(),
                    bench::bench_compact_case,
                )
            })
            .collect::<Vec<_>>();
        cases
            .into_iter()
            .map(|c| {
                let baseline = Some((c.name(), c.params()));
                BenchJob::new(c.name(), baseline, c, bench::bench_case)
            })
            .chain(compact)
            .chain(autotuned)
            .chain(merge)
            .chain(panels)
            .chain(sell)
            .chain(blocks)
            .collect()
    }

    fn kernel_specs(&self, _arch: Arch) -> Vec<KernelSpec> {
        let spmv = spmv::all_variants()
            .into_iter()
            .map(|v| v.spec())
            .chain(spmv_merge::all_variants().into_iter().map(|v| v.spec()))
            .chain(spmv_panels::all_variants().into_iter().map(|v| v.spec()));
        let transposed = spmv_transposed::all_variants().into_iter().map(|v| v.spec());
        spmv.chain(spmm::all_variants().into_iter().map(|v| v.spec()))
            .chain(transposed)
            .chain(convert::all_variants().into_iter().map(|v| v.spec()))
            .chain(sell::all_variants().into_iter().map(|v| v.spec()))
            .chain(bsr::all_spmm_variants().into_iter().map(|v| v.spec()))
            .chain(bsr::all_spmv_variants().into_iter().map(|v| v.spec()))
            .collect()
    }

    fn baselines(&self) -> Option<Baselines> {
        Some(Baselines {
            script: "bench_torch.py",
            impls: &["torch-csr", "cupy-csr", "torch-bsr"],
            in_process: &[],
        })
    }

    /// The f64 reference on a few structures: A x against the transposed matrix's A^T-product
    /// (two independent routes to the same numbers), with each matrix's descriptor.
    fn cpu_demo(&self, seed: u64) -> Result<bool> {
        let mut ok = true;
        for (class, rows, cols) in [
            (MatrixClass::Uniform { per_row: 16 }, 20000, 20000),
            (MatrixClass::Banded { diagonals: 9 }, 20000, 20000),
            (
                MatrixClass::PowerLaw {
                    mean: 20.0,
                    exponent: 2.0,
                },
                10000,
                10000,
            ),
            (MatrixClass::TallLeastSquares { per_row: 18 }, 30000, 617),
        ] {
            let a = generate::<f64, i32>(class, rows, cols, seed);
            let x = random_vector(cols, seed ^ 1);
            let t = Instant::now();
            let mut y = vec![0.0; rows];
            reference::spmv(&a, 1.0, &x, 0.0, &mut y);
            let ms = t.elapsed().as_secs_f64() * 1e3;
            let mut y_t = vec![0.0; rows];
            reference::spmv_transposed(&a.transpose(), 1.0, &x, 0.0, &mut y_t);
            let err = y.iter().zip(&y_t).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            let good = err <= 1e-12;
            ok &= good;
            println!(
                "sparse {:<12} {:>8} x {:<6} A x {:8.3} ms, max |A x - (A^T)^T x| {err:.1e} {}\n  {}",
                class.name(),
                rows,
                cols,
                ms,
                if good { "ok" } else { "FAIL" },
                SparseDescriptor::of(&a)
            );
        }
        Ok(ok)
    }
}
