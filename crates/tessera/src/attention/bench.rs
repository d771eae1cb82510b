//! `tessera bench attention`: the issue's shapes, with default dispatch (`tessera`) and the
//! forced Ampere path (`tessera-sm80`). Each case first checks the output of the timed inputs
//! against the f64 reference on a sample of rows (2 heads x 64 rows across the whole sequence,
//! last row included; the full reference at N = 32768 would take minutes) and the whole output
//! for unwritten (NaN) elements, then times with CUDA events. Attention is compute-bound, so
//! inputs are not rotated.
//!
//! TFLOP/s follows the issue's convention: causal `2 * B * H * N^2 * D`, non-causal
//! `4 * B * H * N^2 * D`, varlen the sum over sequences.

use rayon::prelude::*;
use serde_json::json;

use super::reference::{reference_row, RefInputs, RefParams};
use super::{
    AttentionOptions, AttentionPath, AttentionPlan, AttentionProblem, AttentionTuning, QkvLayout, VarlenBatch,
};
use crate::check::compare;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::harness::BenchOutcome;
use crate::runtime::{contiguous_strides, time_median, Context, TimingOptions};
use crate::testdata::{random_matrix, Dist};

/// One benchmark case: `[B, N, H, D]` tensors (varlen: `[total, H, D]`).
#[derive(Clone, Debug, PartialEq)]
pub struct BenchCase {
    pub batch: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    /// Every sequence's length (varlen: the longest).
    pub seqlen: usize,
    pub head_dim: usize,
    pub causal: bool,
    pub dtype: DType,
    /// Per-sequence lengths of a varlen batch (queries = keys).
    pub lengths: Option<Vec<usize>>,
    /// `Auto` (impl `tessera`) or a forced path (`tessera-<path>`).
    pub path: AttentionPath,
}

impl BenchCase {
    /// `causal fp16 B1 H32 N4096 D128`, `gqa ...`, `varlen ...`; the same for every impl so
    /// baseline rows line up.
    pub fn name(&self) -> String {
        let mask = if self.causal { "causal" } else { "non-causal" };
        let heads = if self.heads_q == self.heads_kv {
            format!("H{}", self.heads_q)
        } else {
            format!("H{}/{}", self.heads_q, self.heads_kv)
        };
        match &self.lengths {
            Some(l) => format!(
                "varlen {mask} {} {} seqs {heads} N<={} D{}",
                self.dtype,
                l.len(),
                self.seqlen,
                self.head_dim
            ),
            None => format!(
                "{}{mask} {} B{} {heads} N{} D{}",
                if self.heads_q != self.heads_kv { "gqa " } else { "" },
                self.dtype,
                self.batch,
                self.seqlen,
                self.head_dim
            ),
        }
    }

    /// The JSON params the baselines script reads: exactly `B, Hq, Hkv, N, D, causal, dtype,
    /// varlen` (+ `lengths` for varlen; then `N` is the longest sequence).
    pub fn params(&self) -> serde_json::Value {
        let mut p = json!({
            "B": self.batch, "Hq": self.heads_q, "Hkv": self.heads_kv, "N": self.seqlen,
            "D": self.head_dim, "causal": self.causal, "dtype": self.dtype.name(),
            "varlen": self.lengths.is_some(),
        });
        if let Some(l) = &self.lengths {
            p["lengths"] = json!(l);
        }
        p
    }

    /// `tessera` for default dispatch, `tessera-<path>` when forced.
    pub fn implementation(&self) -> String {
        match self.path {
            AttentionPath::Auto => "tessera".into(),
            p => format!("tessera-{}", p.name()),
        }
    }

    /// Sequence lengths (padded: `batch` times `seqlen`).
    pub fn seq_lengths(&self) -> Vec<usize> {
        self.lengths.clone().unwrap_or_else(|| vec![self.seqlen; self.batch])
    }

    /// FLOPs by the issue's convention: per sequence `4 * H * N^2 * D`, halved when causal.
    pub fn flops(&self) -> f64 {
        let per: f64 = self.seq_lengths().iter().map(|&n| (n as f64) * (n as f64)).sum();
        let f = 4.0 * self.heads_q as f64 * self.head_dim as f64 * per;
        if self.causal {
            f / 2.0
        } else {
            f
        }
    }

    fn options(&self) -> AttentionOptions {
        AttentionOptions {
            layout: QkvLayout::Bnhd,
            causal: self.causal,
            tuning: tuning_from_env(AttentionTuning {
                path: self.path,
                ..AttentionTuning::default()
            }),
            ..AttentionOptions::default()
        }
    }
}

/// The benchmark knobs of the environment applied to `tuning` (read here, by `tessera bench`,
/// never by the library's plans):
/// - `TESSERA_ATTN_HOPPER_PAIRS=1` (or `0`) stands for `hopper_cta_pairs: Some(true)` (or
///   `Some(false)`) where `tuning` leaves it `None`, so that one binary measures both;
/// - `TESSERA_ATTN_HOPPER_SIMPLE=1` sets `hopper_simple_mainloop` (the Hopper kernel without
///   intra-warpgroup pipelining, a debugging aid).
pub fn tuning_from_env(tuning: AttentionTuning) -> AttentionTuning {
    let pairs = match std::env::var("TESSERA_ATTN_HOPPER_PAIRS").ok().as_deref() {
        Some("1") => Some(true),
        Some("0") => Some(false),
        _ => None,
    };
    let simple = std::env::var_os("TESSERA_ATTN_HOPPER_SIMPLE").is_some_and(|v| v == "1");
    AttentionTuning {
        hopper_cta_pairs: tuning.hopper_cta_pairs.or(pairs),
        hopper_simple_mainloop: tuning.hopper_simple_mainloop || simple,
        ..tuning
    }
}

/// Sequence lengths of the causal N sweep (B = 1, H = 32, D = 128, fp16).
pub const CAUSAL_N: [usize; 7] = [512, 1024, 2048, 4096, 8192, 16384, 32768];

/// Seed of the varlen benchmark's lengths (fixed: the shape must not change between runs).
pub const VARLEN_SEED: u64 = 2026;

/// 16 lengths spread log-uniformly over 128..=8192 (both ends included), from [`VARLEN_SEED`].
pub fn varlen_lengths() -> Vec<usize> {
    let (lo, hi) = (128f64, 8192f64);
    let mut state = VARLEN_SEED;
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut l: Vec<usize> = (0..16)
        .map(|_| (lo * (hi / lo).powf(next())).round() as usize)
        .collect();
    l[3] = 128;
    l[11] = 8192;
    l
}

/// The issue's benchmark shapes, each with default dispatch and forced sm80. `quick` keeps
/// N in {1024, 4096} of the causal sweep plus one of each other kind.
pub fn cases(quick: bool) -> Vec<BenchCase> {
    let mut shapes = Vec::new();
    for &n in CAUSAL_N.iter().filter(|&&n| !quick || n == 1024 || n == 4096) {
        shapes.push(BenchCase {
            batch: 1,
            heads_q: 32,
            heads_kv: 32,
            seqlen: n,
            head_dim: 128,
            causal: true,
            dtype: DType::F16,
            lengths: None,
            path: AttentionPath::Auto,
        });
    }
    for d in [64, 128] {
        if quick && d == 64 {
            continue;
        }
        shapes.push(BenchCase {
            batch: 4,
            heads_q: 16,
            heads_kv: 16,
            seqlen: 8192,
            head_dim: d,
            causal: false,
            dtype: DType::BF16,
            lengths: None,
            path: AttentionPath::Auto,
        });
    }
    shapes.push(BenchCase {
        batch: 4,
        heads_q: 32,
        heads_kv: 8,
        seqlen: 4096,
        head_dim: 128,
        causal: true,
        dtype: DType::BF16,
        lengths: None,
        path: AttentionPath::Auto,
    });
    let lengths = varlen_lengths();
    shapes.push(BenchCase {
        batch: lengths.len(),
        heads_q: 32,
        heads_kv: 32,
        seqlen: lengths.iter().copied().max().unwrap_or(0),
        head_dim: 128,
        causal: true,
        dtype: DType::F16,
        lengths: Some(lengths),
        path: AttentionPath::Auto,
    });
    let mut out = Vec::new();
    for s in shapes {
        out.push(BenchCase {
            path: AttentionPath::Sm80,
            ..s.clone()
        });
        out.push(s);
    }
    out
}

/// Heads checked against the reference before timing.
const VERIFIED_HEADS: usize = 2;
/// Rows per checked head (spread over all query rows, the last one included).
const VERIFIED_ROWS: usize = 64;

/// The sampled global query rows: evenly spread over `0..total`, first and last included.
pub fn sample_rows(total: usize, count: usize) -> Vec<usize> {
    if total == 0 {
        return Vec::new();
    }
    let count = count.min(total).max(1);
    let mut rows: Vec<usize> = (0..count)
        .map(|i| {
            if count == 1 {
                total - 1
            } else {
                i * (total - 1) / (count - 1)
            }
        })
        .collect();
    rows.dedup();
    rows
}

/// Verifies and times one case.
pub fn bench_case(ctx: &Context, case: &BenchCase, seed: u64, timing: TimingOptions) -> Result<BenchOutcome> {
    crate::dispatch_float!("attention bench"; case.dtype, [F16, BF16], |T| run::<T>(ctx, case, seed, timing))
}

/// Head `h` of a `[rows, heads, D]` row-major buffer as a canonical `[rows, 1, D]` f64 tensor.
fn one_head<T: Element>(buf: &[T], rows: usize, heads: usize, d: usize, h: usize) -> Vec<f64> {
    let mut out = vec![0.0; rows * d];
    out.par_chunks_mut(d).enumerate().for_each(|(r, dst)| {
        for (o, x) in dst.iter_mut().zip(&buf[(r * heads + h) * d..][..d]) {
            *o = x.to_f64();
        }
    });
    out
}

fn run<T: Element>(ctx: &Context, case: &BenchCase, seed: u64, timing: TimingOptions) -> Result<BenchOutcome> {
    let (hq, hkv, d) = (case.heads_q, case.heads_kv, case.head_dim);
    let lengths = case.seq_lengths();
    let mut cu = vec![0usize];
    for l in &lengths {
        cu.push(cu.last().unwrap() + l);
    }
    let total = *cu.last().unwrap();
    let dist = Dist::Normal { std: 1.0 };
    let q_host: Vec<T> = random_matrix(seed.wrapping_mul(3), total * hq, d, d, dist);
    let k_host: Vec<T> = random_matrix(seed.wrapping_mul(3).wrapping_add(1), total * hkv, d, d, dist);
    let v_host: Vec<T> = random_matrix(seed.wrapping_mul(3).wrapping_add(2), total * hkv, d, d, dist);
    let (q_dev, k_dev, v_dev) = (ctx.upload(&q_host)?, ctx.upload(&k_host)?, ctx.upload(&v_host)?);
    let varlen = match &case.lengths {
        Some(_) => {
            let cu32: Vec<i32> = cu.iter().map(|&x| x as i32).collect();
            Some(VarlenBatch::new(ctx, &cu32, &cu32)?)
        }
        None => None,
    };
    let (shape_q, shape_kv) = match varlen {
        Some(_) => (vec![total, hq, d], vec![total, hkv, d]),
        None => (
            vec![case.batch, case.seqlen, hq, d],
            vec![case.batch, case.seqlen, hkv, d],
        ),
    };
    let q = q_dev.view(&shape_q, &contiguous_strides(&shape_q))?;
    let k = k_dev.view(&shape_kv, &contiguous_strides(&shape_kv))?;
    let v = v_dev.view(&shape_kv, &contiguous_strides(&shape_kv))?;
    let opts = case.options();
    let problem = AttentionProblem::of_views(&q, &k, &v, opts.layout, varlen.as_ref())?;
    let plan = AttentionPlan::new(ctx, &problem, &opts)?;
    let mut out = ctx.alloc::<T>(total * hq * d)?;
    out.fill_bytes(0xff)?; // NaN poison: unwritten outputs fail
                           // Verify the timed kernel on the timed data first.
    {
        let mut o_view = out.view_mut(&shape_q, &contiguous_strides(&shape_q))?;
        plan.run(&q, &k, &v, &mut o_view, None, varlen.as_ref())?;
    }
    let got_all = out.to_host()?;
    if let Some(i) = got_all.iter().position(|x| x.to_f64().is_nan()) {
        return Err(Error::Unsupported(format!(
            "{}: output element {i} is NaN (unwritten poison or a numerical failure)",
            case.name()
        )));
    }
    let rows = sample_rows(total, VERIFIED_ROWS);
    let heads: Vec<usize> = if hq > 1 { vec![0, hq - 1] } else { vec![0] };
    let mut got = Vec::new();
    let mut want = Vec::new();
    for &h in heads.iter().take(VERIFIED_HEADS) {
        let hk = h / (hq / hkv);
        let qh = one_head(&q_host, total, hq, d, h);
        let kh = one_head(&k_host, total, hkv, d, hk);
        let vh = one_head(&v_host, total, hkv, d, hk);
        let x = RefInputs {
            q: &qh,
            k: &kh,
            v: &vh,
            cu_q: &cu,
            cu_k: &cu,
        };
        let (left, right) = opts.effective_window();
        let p = RefParams {
            heads_q: 1,
            heads_kv: 1,
            head_dim: d,
            scale: opts.effective_scale(d) as f64,
            softcap: 0.0,
            window_left: left as i64,
            window_right: right as i64,
        };
        let refs: Vec<Vec<f64>> = rows
            .par_iter()
            .map(|&r| {
                let b = cu.partition_point(|&c| c <= r) - 1;
                reference_row(&x, &p, b, 0, r - cu[b]).0
            })
            .collect();
        for (&r, w) in rows.iter().zip(refs) {
            want.extend(w);
            got.extend(got_all[(r * hq + h) * d..][..d].iter().map(|x| x.to_f64()));
        }
    }
    let cmp = compare(&got, &want, 1e-3, 1e-2);
    if !cmp.passes(case.dtype.rel_l2_budget()) {
        return Err(Error::Unsupported(format!(
            "{}: output failed verification before timing (sampled {} rows x {} heads): {cmp}",
            case.name(),
            rows.len(),
            heads.len()
        )));
    }

    let mut o_view = out.view_mut(&shape_q, &contiguous_strides(&shape_q))?;
    let t = time_median(ctx, timing, |_| {
        plan.run(&q, &k, &v, &mut o_view, None, varlen.as_ref())
    })?;
    Ok(BenchOutcome {
        case: case.name(),
        params: case.params(),
        implementation: case.implementation(),
        ms: t.median_ms,
        gbps: None,
        tflops: Some(case.flops() / (t.median_ms * 1e-3) / 1e12),
        // The plan's split-KV workspace is all the device memory beyond q/k/v/out (a call
        // allocates nothing).
        extra_mib: Some(plan.workspace_bytes() as f64 / (1u64 << 20) as f64),
        max_abs_err: Some(cmp.max_abs_err),
        rel_l2: Some(cmp.rel_l2),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_match_the_issue() {
        let c = cases(false);
        assert_eq!(c.len(), 2 * (CAUSAL_N.len() + 2 + 1 + 1));
        for n in CAUSAL_N {
            for path in [AttentionPath::Auto, AttentionPath::Sm80] {
                assert!(c.iter().any(|k| k.seqlen == n
                    && k.causal
                    && k.dtype == DType::F16
                    && k.batch == 1
                    && k.heads_q == 32
                    && k.head_dim == 128
                    && k.path == path));
            }
        }
        assert!(c
            .iter()
            .any(|k| k.heads_q == 32 && k.heads_kv == 8 && k.batch == 4 && k.dtype == DType::BF16));
        let q = cases(true);
        assert!(!q.is_empty() && q.len() < c.len());
        assert!(q.iter().any(|k| k.implementation() == "tessera-sm80"));
    }

    #[test]
    fn params_have_exactly_the_baseline_keys() {
        for c in cases(false) {
            let p = c.params();
            let obj = p.as_object().unwrap();
            let mut keys: Vec<&str> = obj.keys().map(|k| k.as_str()).collect();
            keys.sort();
            let mut want = vec!["B", "D", "Hkv", "Hq", "N", "causal", "dtype", "varlen"];
            if c.lengths.is_some() {
                want.push("lengths");
            }
            want.sort();
            assert_eq!(keys, want, "{}", c.name());
        }
    }

    #[test]
    fn varlen_lengths_are_fixed_and_spread() {
        let l = varlen_lengths();
        assert_eq!(l, varlen_lengths());
        assert_eq!(l.len(), 16);
        assert!(l.iter().all(|&n| (128..=8192).contains(&n)));
        assert!(l.contains(&128) && l.contains(&8192));
        let mid = l.iter().filter(|&&n| n > 512 && n < 4096).count();
        assert!(mid >= 3, "{l:?}");
    }

    #[test]
    fn flops_follow_the_issue_convention() {
        let c = BenchCase {
            batch: 1,
            heads_q: 32,
            heads_kv: 32,
            seqlen: 8192,
            head_dim: 128,
            causal: true,
            dtype: DType::F16,
            lengths: None,
            path: AttentionPath::Auto,
        };
        assert_eq!(c.flops(), 2.0 * 32.0 * 8192.0 * 8192.0 * 128.0);
        let nc = BenchCase {
            causal: false,
            batch: 4,
            ..c.clone()
        };
        assert_eq!(nc.flops(), 4.0 * 4.0 * 32.0 * 8192.0 * 8192.0 * 128.0);
        let v = BenchCase {
            lengths: Some(vec![100, 200]),
            batch: 2,
            ..c
        };
        assert_eq!(v.flops(), 2.0 * 32.0 * 128.0 * (100.0 * 100.0 + 200.0 * 200.0));
    }

    #[test]
    fn sampled_rows_span_the_sequence() {
        let r = sample_rows(32768, 64);
        assert_eq!(r.len(), 64);
        assert_eq!((r[0], *r.last().unwrap()), (0, 32767));
        assert!(r.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(sample_rows(5, 64), vec![0, 1, 2, 3, 4]);
        assert_eq!(sample_rows(1, 64), vec![0]);
        assert!(sample_rows(0, 64).is_empty());
    }
}
