//! The main job on a machine without a GPU: run the CPU references on small shapes, check
//! their defining properties and time them, so a fresh machine shows what tessera computes.

use std::time::Instant;

use tessera::attention::reference::{attention_reference, padded_cu_seqlens, RefInputs, RefParams};
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
    ok &= attention_reference_demo(seed);
    ok &= kvcache_reference_demo(seed);
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

/// The attention CPU reference (f64, explicit causal mask, GQA) on a small shape, with checks
/// of what it must satisfy: every row sees a key (finite LSE), outputs lie within V's range
/// per column, and query 0 of a causal sequence sees only key 0, so its output is exactly v_0.
fn attention_reference_demo(seed: u64) -> bool {
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
    ok
}

/// The paged KV cache on the CPU: the block manager maps three sequences (two sharing a
/// prompt prefix) onto pages, their K/V rows are written into host pages through the block
/// tables, and the paged decode reference over the gathered pages must equal the attention
/// reference over the contiguous K/V (last query row, which sees every key).
fn kvcache_reference_demo(seed: u64) -> bool {
    use tessera::kvcache::block_manager::{BlockManager, BlockManagerConfig};
    use tessera::kvcache::reference::{append_reference, decode_reference, gather_sequence};
    use tessera::kvcache::KvCacheConfig;
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
            return false;
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
                return false;
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
    ok
}
