//! The paged KV cache's place in the [registry](crate::registry).

use std::time::Instant;

use super::block_manager::{BlockManager, BlockManagerConfig};
use super::reference::{append_reference, decode_reference, gather_sequence};
use super::{bench, ci_append_variants, decode, verify, KvCacheConfig};
use crate::attention::reference::{attention_reference, RefInputs, RefParams};
use crate::error::Result;
use crate::harness::{Baselines, BenchJob, VerifyJob};
use crate::registry::Operator;
use crate::runtime::{Arch, KernelSpec};
use crate::testdata::{random_matrix, Dist};

pub struct KvCache;

/// The registry entry.
pub static OPERATOR: KvCache = KvCache;

impl Operator for KvCache {
    fn name(&self) -> &'static str {
        "kvcache"
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
                // one baseline run per shape: the forced variants share their shape's params
                let forced = c.tuning.is_some() || c.layout.is_some() || c.chunk.is_some();
                let baseline = (!forced).then(|| (c.name(), c.params()));
                BenchJob::new(
                    format!("{} {}", c.name(), c.implementation()),
                    baseline,
                    c,
                    bench::bench_case,
                )
            })
            .collect()
    }

    fn kernel_specs(&self, _arch: Arch) -> Vec<KernelSpec> {
        decode::ci_variants()
            .iter()
            .map(|v| v.spec())
            .chain(ci_append_variants().iter().map(|v| v.spec()))
            .collect()
    }

    fn device_headers(&self) -> &'static [(&'static str, &'static str)] {
        super::DEVICE_HEADERS
    }

    fn baselines(&self) -> Option<Baselines> {
        Some(Baselines {
            // FlashInfer paged decode / append, torch SDPA GQA
            script: "bench_kvcache.py",
            impls: &[
                "flashinfer",
                "torch-cudnn-gqa",
                "torch-flash-gqa",
                "torch-flash-expanded",
                "torch-index",
            ],
            in_process: &[],
        })
    }

    /// The paged KV cache on the CPU: the block manager maps three sequences (two sharing a
    /// prompt prefix) onto pages, their K/V rows are written into host pages through the block
    /// tables, and the paged decode reference over the gathered pages must equal the attention
    /// reference over the contiguous K/V (last query row, which sees every key).
    fn cpu_demo(&self, seed: u64) -> Result<bool> {
        let (hq, hkv, d, page) = (8usize, 2usize, 64usize, 16usize);
        let cfg = KvCacheConfig {
            num_pages: 64,
            page_size: page,
            heads_kv: hkv,
            head_dim: d,
            ..Default::default()
        };
        let mut bm = match BlockManager::new(BlockManagerConfig {
            num_pages: cfg.num_pages,
            page_size: page,
            ..Default::default()
        }) {
            Ok(b) => b,
            Err(e) => {
                println!("kvcache demo: {e}");
                return Ok(false);
            }
        };
        let system: Vec<u32> = (0..100).collect();
        let prompts: Vec<Vec<u32>> = vec![
            system.iter().copied().chain(1000..1037).collect(),
            system.iter().copied().chain(2000..2090).collect(),
            (5000..5021).collect(),
        ];
        let t = Instant::now();
        let mut layer = vec![0u8; cfg.layer_bytes().unwrap_or(0)];
        let mut ok = true;
        let mut hits = 0;
        let mut max_err = 0.0f64;
        for (s, prompt) in prompts.iter().enumerate() {
            let alloc = match bm.allocate(s as u64, prompt) {
                Ok(a) => a,
                Err(e) => {
                    println!("kvcache demo: {e}");
                    return Ok(false);
                }
            };
            hits += alloc.cached_tokens;
            let table: Vec<i32> = bm
                .block_table(s as u64)
                .unwrap_or(&[])
                .iter()
                .map(|&p| p as i32)
                .collect();
            // K/V rows of a token depend only on (token id, position): shared pages agree
            let row = |tok: u32, pos: usize, salt: u64| -> Vec<f32> {
                random_matrix(
                    seed ^ salt ^ ((tok as u64) << 20) ^ pos as u64,
                    1,
                    hkv * d,
                    hkv * d,
                    Dist::Normal { std: 1.0 },
                )
            };
            let new: Vec<usize> = (alloc.cached_tokens..prompt.len()).collect();
            let rows_k: Vec<f32> = new.iter().flat_map(|&i| row(prompt[i], i, 1)).collect();
            let rows_v: Vec<f32> = new.iter().flat_map(|&i| row(prompt[i], i, 2)).collect();
            let targets: Vec<(Vec<i32>, usize)> = new.iter().map(|&i| (table.clone(), i)).collect();
            append_reference(&cfg, &mut layer, None, &rows_k, &rows_v, &targets);
            let len = prompt.len();
            let (k, v) = gather_sequence(&cfg, &layer, None, &table, len);
            let q: Vec<f64> = random_matrix(seed ^ 7 ^ s as u64, 1, hq * d, hq * d, Dist::Normal { std: 1.0 });
            let paged = decode_reference(
                &q,
                std::slice::from_ref(&k),
                std::slice::from_ref(&v),
                1,
                hq,
                hkv,
                d,
                1.0 / (d as f64).sqrt(),
            );
            // the same row through the attention reference: one query (the last position) over len keys
            let cu_q = vec![0usize, 1];
            let cu_k = vec![0usize, len];
            let dense = attention_reference(
                &RefInputs {
                    q: &q,
                    k: &k,
                    v: &v,
                    cu_q: &cu_q,
                    cu_k: &cu_k,
                },
                &RefParams::causal(hq, hkv, d),
            );
            let err = paged
                .o
                .iter()
                .zip(&dense.o)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            max_err = max_err.max(err);
            ok &= err < 1e-12;
        }
        ok &= hits > 0 && bm.check_invariants().is_ok();
        let ms = t.elapsed().as_secs_f64() * 1e3;
        println!(
            "\nkvcache (CPU reference, f64, pages of {page}, GQA {hq}/{hkv}, D={d}): 3 sequences in {} pages, \
             {hits} prompt tokens served from shared prefix pages, paged decode vs attention reference max |diff| \
             {max_err:.1e} in {ms:.1} ms",
            bm.num_used_pages()
        );
        Ok(ok)
    }
}
