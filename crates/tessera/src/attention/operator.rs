//! Attention's place in the [registry](crate::registry).

use std::time::Instant;

use super::reference::{attention_reference, padded_cu_seqlens, RefInputs, RefParams};
use super::{bench, plan, verify, AttentionPath};
use crate::error::Result;
use crate::harness::{Baselines, BenchJob, Chart, VerifyJob};
use crate::registry::Operator;
use crate::runtime::{Arch, KernelSpec};
use crate::testdata::{random_matrix, Dist};

pub struct Attention;

/// The registry entry.
pub static OPERATOR: Attention = Attention;

impl Operator for Attention {
    fn name(&self) -> &'static str {
        "attention"
    }

    fn verify_jobs(&self, quick: bool) -> Vec<VerifyJob> {
        verify::cases(quick)
            .into_iter()
            .map(|c| VerifyJob::new(c.name(), c, verify::verify_case))
            .collect()
    }

    fn bench_jobs(&self, quick: bool) -> Vec<BenchJob> {
        bench::cases(quick)
            .into_iter()
            .map(|c| {
                let baseline = (c.path == AttentionPath::Auto).then(|| (c.name(), c.params()));
                // the impl is part of the job name so `--filter tessera-sm80` selects it
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
        plan::ci_variants_for(arch)
            .iter()
            .map(|v| v.spec())
            .chain(plan::ci_combine_variants().iter().map(|v| v.spec()))
            .collect()
    }

    fn device_headers(&self) -> &'static [(&'static str, &'static str)] {
        super::DEVICE_HEADERS
    }

    fn baselines(&self) -> Option<Baselines> {
        Some(Baselines {
            // torch SDPA backends and FlashInfer
            script: "bench_attention.py",
            impls: &[
                "torch-flash",
                "torch-cudnn",
                "torch-efficient",
                "torch-math",
                "flashinfer-fa3",
                "flashinfer-fa2",
            ],
            in_process: &[],
        })
    }

    fn chart(&self) -> Chart {
        Chart::TflopsOverN
    }

    /// The attention CPU reference (f64, explicit causal mask, GQA) on a small shape, with checks
    /// of what it must satisfy: every row sees a key (finite LSE), outputs lie within V's range
    /// per column, and query 0 of a causal sequence sees only key 0, so its output is exactly v_0.
    fn cpu_demo(&self, seed: u64) -> Result<bool> {
        let (b, hq, hkv, n, d) = (2usize, 8usize, 2usize, 256usize, 64usize);
        let q: Vec<f64> = random_matrix(seed, b * n * hq, d, d, Dist::Normal { std: 1.0 });
        let k: Vec<f64> = random_matrix(seed ^ 1, b * n * hkv, d, d, Dist::Normal { std: 1.0 });
        let v: Vec<f64> = random_matrix(seed ^ 2, b * n * hkv, d, d, Dist::Normal { std: 1.0 });
        let cu = padded_cu_seqlens(b, n);
        let p = RefParams::causal(hq, hkv, d);
        let t = Instant::now();
        let out = attention_reference(
            &RefInputs {
                q: &q,
                k: &k,
                v: &v,
                cu_q: &cu,
                cu_k: &cu,
            },
            &p,
        );
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let finite_lse = out.lse.iter().all(|l| l.is_finite());
        let (vmin, vmax) = v
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, z), &x| (a.min(x), z.max(x)));
        let in_range = out.o.iter().all(|&x| x >= vmin - 1e-12 && x <= vmax + 1e-12);
        // Query 0 of sequence 0, head 0 reads KV head 0: only key 0 is visible.
        let first_err = out.o[..d]
            .iter()
            .zip(&v[..d])
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        let ok = finite_lse && in_range && first_err < 1e-12;
        println!(
            "\nattention (CPU reference, f64, causal, GQA {hq}/{hkv}): B={b} N={n} D={d} in {ms:.1} ms; \
             all LSE finite: {finite_lse}, outputs within V's range: {in_range}, |o_0 - v_0| = {first_err:.1e}"
        );
        Ok(ok)
    }
}
