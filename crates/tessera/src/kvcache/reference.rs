//! CPU references of the paged KV cache operators, in f64, from the *logical* (gathered) K/V:
//! an independent path from the kernels, which read pages in place.
//!
//! - [`gather_sequence`]: a sequence's logical `[len][Hkv][D]` K and V from a host copy of a
//!   layer's pages, its block table and (fp8) the scales.
//! - [`decode_reference`]: `O[b, i, h] = softmax_j(q . k_j * scale) v_j` over the keys
//!   `j <= len - q_len + i` of KV head `h / (Hq / Hkv)`, and the natural-log LSE (`-inf`, with
//!   `O = 0`, when no key is visible).
//! - [`append_reference`]: the bytes a layer holds after an append, by plain indexing.

use rayon::prelude::*;

use super::KvCacheConfig;
use crate::dtype::DType;
use crate::numeric;

/// Decodes cache element `idx` (in elements) of a layer's raw bytes to f64 (fp8 without scale).
pub fn element(cfg: &KvCacheConfig, bytes: &[u8], idx: usize) -> f64 {
    match cfg.dtype {
        d @ (DType::F16 | DType::BF16 | DType::F8E4M3) => numeric::load(d, bytes, idx),
        d => panic!("not a cache dtype: {d}"),
    }
}

/// Element offset of (page, K|V half, offset in page, head, dim 0) in a layer.
pub fn slot(cfg: &KvCacheConfig, page: usize, kv: usize, off: usize, h: usize) -> usize {
    (((page * 2 + kv) * cfg.page_size + off) * cfg.heads_kv + h) * cfg.head_dim
}

/// The logical K and V (`[len][Hkv][D]` each, f64, fp8 scales applied) of one sequence.
pub fn gather_sequence(
    cfg: &KvCacheConfig,
    layer: &[u8],
    scales: Option<&[f32]>,
    table: &[i32],
    len: usize,
) -> (Vec<f64>, Vec<f64>) {
    let (hkv, d) = (cfg.heads_kv, cfg.head_dim);
    let mut k = vec![0.0; len * hkv * d];
    let mut v = vec![0.0; len * hkv * d];
    for t in 0..len {
        let page = table[t / cfg.page_size] as usize;
        for h in 0..hkv {
            for (kv, dst) in [(0usize, &mut k), (1, &mut v)] {
                let scale = scales.map_or(1.0, |s| s[(page * hkv + h) * 2 + kv] as f64);
                let base = slot(cfg, page, kv, t % cfg.page_size, h);
                for c in 0..d {
                    dst[(t * hkv + h) * d + c] = element(cfg, layer, base + c) * scale;
                }
            }
        }
    }
    (k, v)
}

/// Outputs of [`decode_reference`]: `o` is `[B][q_len][Hq][D]`, `lse` `[B][q_len][Hq]`.
pub struct DecodeRef {
    pub o: Vec<f64>,
    pub lse: Vec<f64>,
}

/// Decode attention in f64. `q` is `[B][q_len][Hq][D]`; `keys[b]` / `values[b]` are sequence b's
/// logical `[len_b][Hkv][D]`.
#[allow(clippy::too_many_arguments)]
pub fn decode_reference(
    q: &[f64],
    keys: &[Vec<f64>],
    values: &[Vec<f64>],
    q_len: usize,
    heads_q: usize,
    heads_kv: usize,
    d: usize,
    scale: f64,
) -> DecodeRef {
    let batch = keys.len();
    let group = heads_q / heads_kv;
    let rows: Vec<(usize, usize, usize)> = (0..batch)
        .flat_map(|b| (0..q_len).flat_map(move |i| (0..heads_q).map(move |h| (b, i, h))))
        .collect();
    let results: Vec<(Vec<f64>, f64)> = rows
        .par_iter()
        .map(|&(b, i, h)| {
            let len = keys[b].len() / (heads_kv * d);
            let kvh = h / group;
            let qrow = &q[((b * q_len + i) * heads_q + h) * d..][..d];
            // visible keys: j <= len - q_len + i
            let visible = (len + i + 1).saturating_sub(q_len).min(len);
            if visible == 0 {
                return (vec![0.0; d], f64::NEG_INFINITY);
            }
            let scores: Vec<f64> = (0..visible)
                .map(|j| {
                    let krow = &keys[b][(j * heads_kv + kvh) * d..][..d];
                    qrow.iter().zip(krow).map(|(a, b)| a * b).sum::<f64>() * scale
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let l: f64 = w.iter().sum();
            let mut o = vec![0.0; d];
            for (j, wj) in w.iter().enumerate() {
                let vrow = &values[b][(j * heads_kv + kvh) * d..][..d];
                for c in 0..d {
                    o[c] += wj * vrow[c];
                }
            }
            o.iter_mut().for_each(|x| *x /= l);
            (o, m + l.ln())
        })
        .collect();
    let mut o = Vec::with_capacity(rows.len() * d);
    let mut lse = Vec::with_capacity(rows.len());
    for (row, l) in results {
        o.extend_from_slice(&row);
        lse.push(l);
    }
    DecodeRef { o, lse }
}

/// Encodes an f64 value as cache bytes (little endian) of `cfg.dtype`; fp8 values are divided
/// by `scale` as the device does (`x * (1 / scale)` in f32, round to nearest even, satfinite).
pub fn encode(cfg: &KvCacheConfig, x: f32, scale: f32, out: &mut [u8]) {
    match cfg.dtype {
        d @ (DType::F16 | DType::BF16) => numeric::store(d, x, out),
        DType::F8E4M3 => numeric::store(DType::F8E4M3, x * (1.0 / scale), out),
        d => panic!("not a cache dtype: {d}"),
    }
}

/// The layer bytes after appending rows: `rows_k` / `rows_v` are the `[N][Hkv][D]` inputs as
/// f32 (already rounded to the input dtype), row `i` going to `(table of seq, position)` of
/// `targets[i]`.
pub fn append_reference(
    cfg: &KvCacheConfig,
    layer: &mut [u8],
    scales: Option<&[f32]>,
    rows_k: &[f32],
    rows_v: &[f32],
    targets: &[(Vec<i32>, usize)],
) {
    let (hkv, d, eb) = (cfg.heads_kv, cfg.head_dim, cfg.element_bytes());
    for (i, (table, pos)) in targets.iter().enumerate() {
        let page = table[pos / cfg.page_size] as usize;
        for h in 0..hkv {
            for (kv, rows) in [(0usize, rows_k), (1, rows_v)] {
                let scale = scales.map_or(1.0, |s| s[(page * hkv + h) * 2 + kv]);
                let base = slot(cfg, page, kv, pos % cfg.page_size, h);
                for c in 0..d {
                    let x = rows[(i * hkv + h) * d + c];
                    encode(cfg, x, scale, &mut layer[(base + c) * eb..(base + c + 1) * eb]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(dtype: DType) -> KvCacheConfig {
        KvCacheConfig {
            num_pages: 4,
            page_size: 8,
            heads_kv: 2,
            head_dim: 64,
            dtype,
            ..Default::default()
        }
    }

    #[test]
    fn uniform_keys_average_the_values_and_lse_is_log_len() {
        // all keys equal: weights are uniform, O = mean of the visible values, LSE = s + ln n
        let (hkv, d, hq, len) = (2, 4, 4, 5);
        let k = vec![vec![0.5; len * hkv * d]];
        let v: Vec<Vec<f64>> = vec![(0..len * hkv * d).map(|i| (i / (hkv * d)) as f64).collect()];
        let q = vec![1.0; hq * d];
        let r = decode_reference(&q, &k, &v, 1, hq, hkv, d, 1.0);
        for h in 0..hq {
            assert!((r.o[h * d] - 2.0).abs() < 1e-12); // mean of 0..5
            assert!((r.lse[h] - (2.0 + (5f64).ln())).abs() < 1e-12);
        }
    }

    #[test]
    fn speculative_rows_see_only_their_prefix_and_empty_rows_are_zero() {
        let (hkv, d, hq, len, q_len) = (1, 2, 1, 3, 5);
        let k = vec![vec![0.0; len * hkv * d]];
        let v = vec![vec![1.0, 1.0, 2.0, 2.0, 3.0, 3.0]];
        let q = vec![0.0; q_len * hq * d];
        let r = decode_reference(&q, &k, &v, q_len, hq, hkv, d, 1.0);
        // len 3 with 5 query tokens: token i sees keys j <= i - 2: rows 0, 1 see none
        assert_eq!(r.lse[0], f64::NEG_INFINITY);
        assert_eq!(r.lse[1], f64::NEG_INFINITY);
        assert_eq!(&r.o[..4], &[0.0; 4]);
        assert!((r.o[4] - 1.0).abs() < 1e-12); // row 2 sees key 0
        assert!((r.o[6] - 1.5).abs() < 1e-12); // row 3 sees keys 0, 1
        assert!((r.o[8] - 2.0).abs() < 1e-12); // row 4 sees all
    }

    #[test]
    fn gather_follows_the_block_table_and_applies_fp8_scales() {
        for dtype in [DType::F16, DType::BF16, DType::F8E4M3] {
            let c = cfg(dtype);
            let mut layer = vec![0u8; c.layer_bytes().unwrap()];
            let scales: Vec<f32> = (0..c.num_pages * c.heads_kv * 2)
                .map(|i| 0.5 + i as f32 * 0.25)
                .collect();
            let sc = (dtype == DType::F8E4M3).then_some(scales.as_slice());
            // token t of the sequence gets value t (K) and -t (V) in every dim of head 1
            let table = [3, 1];
            let len = 11;
            let targets: Vec<(Vec<i32>, usize)> = (0..len).map(|t| (table.to_vec(), t)).collect();
            let rows_k: Vec<f32> = (0..len * 2 * 64).map(|i| (i / 128) as f32).collect();
            let rows_v: Vec<f32> = rows_k.iter().map(|x| -x).collect();
            append_reference(&c, &mut layer, sc, &rows_k, &rows_v, &targets);
            let (k, v) = gather_sequence(&c, &layer, sc, &table, len);
            for t in 0..len {
                let x = k[(t * 2 + 1) * 64 + 5];
                // fp8 stores t / scale rounded to e4m3: allow its relative rounding of 2^-4
                assert!((x - t as f64).abs() <= t as f64 * 0.07, "{dtype} t={t}: {x}");
                assert!((v[(t * 2) * 64] + t as f64).abs() <= t as f64 * 0.07);
            }
        }
    }
}
