//! `tessera verify attention`: both kernel paths against the f64 reference over the issue's
//! matrix (sequence lengths with tails, `Nq != Nk` both ways, specialised and generic head dims,
//! GQA/MQA, varlen batches with empty sequences, causal / window / none, softcap, fp16 and bf16,
//! both layouts, strided views, forced and automatic split-KV, LSE on and off).
//!
//! Every case draws fresh seeded normal inputs (Q with a larger spread, for a peaked softmax);
//! padding between heads holds NaN (a kernel that reads past `D` fails); the output and LSE are
//! poisoned with NaN before the run; padding of a strided output must come back untouched; a
//! fully masked row must be exactly 0 with LSE `-inf`. The output is judged by the dtype's
//! rel-L2 budget (DESIGN.md), the LSE within [`LSE_ATOL`] absolute (`-inf` exactly).
//!
//! Cases forced onto [`AttentionPath::Hopper`] on a GPU that is not `sm_90` are reported as
//! skipped with the reason, neither passed nor failed.

use serde_json::json;

use super::reference::{attention_reference, RefInputs, RefOutput, RefParams};
use super::{
    AttentionOptions, AttentionPath, AttentionPlan, AttentionProblem, AttentionTuning, QkvLayout, VarlenBatch,
};
use crate::check::{compare, Comparison};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::harness::VerifyOutcome;
use crate::runtime::{Arch, Context, DeviceBuffer, TensorView};
use crate::testdata::{random_matrix, Dist};

/// Standard deviation of Q (K and V: 1). With the default scale the scores are then about
/// N(0, 4): a peaked softmax whose running maximum keeps moving, so rescaling errors show.
pub const Q_STD: f64 = 2.0;

/// Largest allowed absolute LSE error.
pub const LSE_ATOL: f64 = 1e-3;

/// Elements of padding after each head's `D` values in [`Storage::PaddedHeads`] and in a
/// padded output (8 keeps every row 16-byte aligned).
pub const HEAD_PAD: usize = 8;

/// How Q/K/V sit in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    /// Three contiguous tensors in the case's layout.
    Contiguous,
    /// Three tensors whose head stride is `D + HEAD_PAD` (NaN in the gaps).
    PaddedHeads,
    /// Slices of one packed `[B, N, 3, H, D]` (varlen: `[total, 3, H, D]`) buffer, as a fused
    /// QKV projection writes them. Needs `Hq == Hkv`, equal q/k lengths and `[B, N, H, D]`.
    PackedQkv,
}

impl Storage {
    fn name(self) -> &'static str {
        match self {
            Storage::Contiguous => "contiguous",
            Storage::PaddedHeads => "padded-heads",
            Storage::PackedQkv => "packed-qkv",
        }
    }
}

/// One verification case.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    pub path: AttentionPath,
    pub dtype: DType,
    /// Sequences (varlen: the number of length pairs).
    pub batch: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    /// Padded batch: every sequence's length (varlen: ignored, see `lengths`).
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub head_dim: usize,
    /// `Some((len_q, len_k) per sequence)` for a packed variable-length batch.
    pub lengths: Option<Vec<(usize, usize)>>,
    pub layout: QkvLayout,
    pub storage: Storage,
    /// Output with head stride `D + HEAD_PAD`; the padding must stay untouched.
    pub out_padded: bool,
    pub causal: bool,
    pub window: (i32, i32),
    pub softcap: f32,
    pub scale: Option<f32>,
    pub num_splits: Option<usize>,
    /// The Ampere kernel's forced key tile (AttentionTuning::sm80_block_n).
    pub sm80_block_n: Option<u32>,
    /// The Ampere kernel's forced work-order sections (AttentionTuning::sm80_heads_per_section).
    pub sm80_heads_per_section: Option<usize>,
    /// The Hopper kernel's forced key tile (AttentionTuning::hopper_block_n).
    pub hopper_block_n: Option<u32>,
    /// The Hopper kernel's capped persistent grid (AttentionTuning::hopper_max_ctas).
    pub hopper_max_ctas: Option<usize>,
    /// The Hopper kernel's CTA pairs (AttentionTuning::hopper_cta_pairs).
    pub hopper_cta_pairs: Option<bool>,
    pub return_lse: bool,
}

impl Default for Case {
    fn default() -> Self {
        Case {
            path: AttentionPath::Sm80,
            dtype: DType::F16,
            batch: 2,
            heads_q: 4,
            heads_kv: 4,
            seqlen_q: 128,
            seqlen_k: 128,
            head_dim: 64,
            lengths: None,
            layout: QkvLayout::Bnhd,
            storage: Storage::Contiguous,
            out_padded: false,
            causal: false,
            window: (-1, -1),
            softcap: 0.0,
            scale: None,
            num_splits: None,
            sm80_block_n: None,
            sm80_heads_per_section: None,
            hopper_block_n: None,
            hopper_max_ctas: None,
            hopper_cta_pairs: None,
            return_lse: true,
        }
    }
}

impl Case {
    /// `sm80 fp16 bnhd B2 H4/4 N128x128 D64 causal lse ...`: path first, then the key
    /// parameters (what `--filter` matches).
    pub fn name(&self) -> String {
        let mut s = format!(
            "{} {} {}",
            self.path.name(),
            self.dtype,
            match (self.lengths.is_some(), self.layout) {
                (true, _) => "varlen",
                (false, QkvLayout::Bnhd) => "bnhd",
                (false, QkvLayout::Bhnd) => "bhnd",
            }
        );
        match &self.lengths {
            Some(l) => {
                let (mq, mk) = max_lengths(l);
                let zeros = l.iter().filter(|&&(q, k)| q == 0 || k == 0).count();
                s += &format!(
                    " B{} H{}/{} maxN{mq}x{mk} zeros{zeros}",
                    l.len(),
                    self.heads_q,
                    self.heads_kv
                );
            }
            None => {
                s += &format!(
                    " B{} H{}/{} N{}x{}",
                    self.batch, self.heads_q, self.heads_kv, self.seqlen_q, self.seqlen_k
                )
            }
        }
        s += &format!(" D{}", self.head_dim);
        if self.causal {
            s += " causal";
        }
        if self.window != (-1, -1) {
            s += &format!(" window({},{})", self.window.0, self.window.1);
        }
        if self.softcap > 0.0 {
            s += &format!(" softcap{}", self.softcap);
        }
        if let Some(sc) = self.scale {
            s += &format!(" scale{sc}");
        }
        match self.num_splits {
            Some(n) => s += &format!(" splits{n}"),
            None => s += " splits-auto",
        }
        if let Some(n) = self.sm80_block_n.or(self.hopper_block_n) {
            s += &format!(" keys{n}");
        }
        if let Some(n) = self.sm80_heads_per_section {
            s += &format!(" sections{n}");
        }
        if let Some(n) = self.hopper_max_ctas {
            s += &format!(" ctas{n}");
        }
        match self.hopper_cta_pairs {
            Some(true) => s += " pairs",
            Some(false) => s += " no-pairs",
            None => {}
        }
        if self.return_lse {
            s += " lse";
        }
        if self.storage != Storage::Contiguous {
            s += &format!(" {}", self.storage.name());
        }
        if self.out_padded {
            s += " out-padded";
        }
        s
    }

    /// The case as JSON numbers and flags.
    pub fn params(&self) -> serde_json::Value {
        json!({
            "path": self.path.name(), "dtype": self.dtype.name(), "B": self.batch_size(),
            "Hq": self.heads_q, "Hkv": self.heads_kv, "Nq": self.seqlen_q, "Nk": self.seqlen_k,
            "D": self.head_dim, "lengths": self.lengths, "layout": format!("{:?}", self.layout),
            "storage": self.storage.name(), "out_padded": self.out_padded, "causal": self.causal,
            "window": [self.window.0, self.window.1], "softcap": self.softcap, "scale": self.scale,
            "num_splits": self.num_splits, "sm80_block_n": self.sm80_block_n,
            "sm80_heads_per_section": self.sm80_heads_per_section,
            "hopper_block_n": self.hopper_block_n,
            "hopper_max_ctas": self.hopper_max_ctas,
            "hopper_cta_pairs": self.hopper_cta_pairs,
            "return_lse": self.return_lse,
        })
    }

    /// The plan options of this case.
    pub fn options(&self) -> AttentionOptions {
        AttentionOptions {
            layout: self.layout,
            causal: self.causal,
            window: self.window,
            scale: self.scale,
            softcap: self.softcap,
            return_lse: self.return_lse,
            tuning: AttentionTuning {
                path: self.path,
                num_splits: self.num_splits,
                sm80_block_n: self.sm80_block_n,
                sm80_heads_per_section: self.sm80_heads_per_section,
                hopper_block_n: self.hopper_block_n,
                hopper_max_ctas: self.hopper_max_ctas,
                hopper_cta_pairs: self.hopper_cta_pairs,
                ..AttentionTuning::default()
            },
        }
    }

    fn batch_size(&self) -> usize {
        self.lengths.as_ref().map_or(self.batch, |l| l.len())
    }

    /// Query and key row boundaries in the canonical packed order (padded: `b * N`).
    pub fn cu_seqlens(&self) -> (Vec<usize>, Vec<usize>) {
        match &self.lengths {
            Some(l) => {
                let mut q = vec![0];
                let mut k = vec![0];
                for &(a, b) in l {
                    q.push(q.last().unwrap() + a);
                    k.push(k.last().unwrap() + b);
                }
                (q, k)
            }
            None => (
                super::reference::padded_cu_seqlens(self.batch, self.seqlen_q),
                super::reference::padded_cu_seqlens(self.batch, self.seqlen_k),
            ),
        }
    }
}

fn max_lengths(l: &[(usize, usize)]) -> (usize, usize) {
    (
        l.iter().map(|x| x.0).max().unwrap_or(0),
        l.iter().map(|x| x.1).max().unwrap_or(0),
    )
}

/// Deterministic pseudo-random lengths for the case list (names must not change per run).
struct Lengths(u64);

impl Lengths {
    fn next(&mut self, max: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % (max + 1)
    }
    /// `n` pairs with lengths in `0..=max`, the `k` length equal to `q` when `same`, at least
    /// one zero-length sequence when `n >= 3`.
    fn pairs(&mut self, n: usize, max_q: usize, max_k: usize, same: bool) -> Vec<(usize, usize)> {
        let mut v: Vec<(usize, usize)> = (0..n)
            .map(|_| {
                let q = self.next(max_q);
                (q, if same { q } else { self.next(max_k) })
            })
            .collect();
        if n >= 3 {
            v[1] = (0, if same { 0 } else { self.next(max_k) });
            v[n - 1].0 = max_q;
            if same {
                v[n - 1].1 = max_q;
            } else {
                v[n - 2].1 = 0;
            }
        }
        v
    }
}

/// The verification matrix: ~100 cases per forced path plus a few with automatic dispatch.
/// `quick` keeps ~20 small representative cases (for compute-sanitizer).
pub fn cases(quick: bool) -> Vec<Case> {
    let mut out = Vec::new();
    for path in [AttentionPath::Sm80, AttentionPath::Hopper] {
        for (c, in_quick) in path_cases(path) {
            if !quick || in_quick {
                // The Hopper kernel's CTA pairs, forced (the plan takes them on long padded
                // batches only) on every case that can run them: head dims 65..=256 without
                // split-KV (forced off: the case's split is covered by the case itself).
                if c.hopper_cta_pairs.is_none() && pairs_apply(&c) {
                    out.push(Case {
                        hopper_cta_pairs: Some(true),
                        num_splits: Some(1),
                        ..c.clone()
                    });
                }
                out.push(c);
            }
        }
    }
    if !quick {
        // Automatic dispatch (and split choice) on a few shapes.
        for (i, (n, d, causal)) in [(1000, 128, true), (4096, 128, true), (255, 64, false), (17, 256, false)]
            .into_iter()
            .enumerate()
        {
            out.push(Case {
                path: AttentionPath::Auto,
                dtype: if i % 2 == 0 { DType::F16 } else { DType::BF16 },
                batch: 1,
                heads_q: if n >= 4096 { 2 } else { 4 },
                heads_kv: if n >= 4096 { 2 } else { 4 },
                seqlen_q: n,
                seqlen_k: n,
                head_dim: d,
                causal,
                ..Case::default()
            });
        }
        // Hopper's work order in several L2 sections with a remainder section first: 4 MiB of
        // K/V per head, so 9 heads make 2 + 7 on a 60 MiB L2 (3 + 6 on 50 MiB).
        out.push(Case {
            path: AttentionPath::Auto,
            dtype: DType::F16,
            batch: 1,
            heads_q: 9,
            heads_kv: 9,
            seqlen_q: 4096,
            seqlen_k: 4096,
            head_dim: 256,
            causal: true,
            ..Case::default()
        });
    }
    out
}

const DTYPES: [DType; 2] = [DType::F16, DType::BF16];

/// Whether the Hopper kernel has CTA pairs for a case run without split-KV: the plan's own
/// rule ([`super::hopper::use_cta_pairs`], forced on) for the case's query tile.
fn pairs_apply(c: &Case) -> bool {
    use super::hopper;
    let d = hopper::head_dim(c.head_dim);
    let block_m = hopper::tiles(d, hopper::block_n_choices(d)[0]).map_or(0, |t| t.0);
    c.path == AttentionPath::Hopper
        && c.num_splits.is_none_or(|n| n == 1)
        && hopper::use_cta_pairs(Some(true), block_m, 1, c.lengths.is_some(), c.seqlen_q, c.seqlen_k)
}

/// Batch and heads that keep a case with `n` keys cheap for the f64 reference.
fn small_bh(n: usize) -> (usize, usize) {
    match n {
        0..=300 => (2, 4),
        301..=1000 => (1, 4),
        _ => (1, 2),
    }
}

/// The cases of one path, each with whether it belongs to the quick subset.
fn path_cases(path: AttentionPath) -> Vec<(Case, bool)> {
    let base = Case {
        path,
        ..Case::default()
    };
    let mut v: Vec<(Case, bool)> = Vec::new();
    let mut toggle = 0usize;
    let mut next = || {
        toggle += 1;
        toggle
    };

    // Sequence lengths (with tails), no mask and causal, cycling D, dtype and layout.
    for (i, n) in [1usize, 17, 128, 255, 1000, 4096].into_iter().enumerate() {
        for (m, causal) in [false, true].into_iter().enumerate() {
            let t = next();
            let (b, h) = small_bh(n);
            v.push((
                Case {
                    dtype: DTYPES[(i + m) % 2],
                    batch: b,
                    heads_q: h,
                    heads_kv: h,
                    seqlen_q: n,
                    seqlen_k: n,
                    head_dim: [64, 80, 128, 256][(2 * i + m) % 4],
                    layout: if i % 2 == 0 { QkvLayout::Bnhd } else { QkvLayout::Bhnd },
                    causal,
                    return_lse: t % 3 != 0,
                    ..base.clone()
                },
                n == 17 && causal,
            ));
        }
    }

    // Nq != Nk both ways, under no mask, causal (bottom-right: Nq > Nk leaves rows fully
    // masked) and a left window.
    for (i, (nq, nk)) in [
        (1, 4096),
        (17, 1000),
        (128, 255),
        (255, 128),
        (1000, 17),
        (4096, 128),
        (128, 4096),
    ]
    .into_iter()
    .enumerate()
    {
        for (m, (causal, window)) in [(false, (-1, -1)), (true, (-1, -1)), (false, (64, 0))]
            .into_iter()
            .enumerate()
        {
            let t = next();
            let (b, h) = small_bh(nq.max(nk));
            v.push((
                Case {
                    dtype: DTYPES[t % 2],
                    batch: b,
                    heads_q: h,
                    heads_kv: h,
                    seqlen_q: nq,
                    seqlen_k: nk,
                    head_dim: [64, 128, 80][(i + m) % 3],
                    layout: if t % 4 == 0 { QkvLayout::Bhnd } else { QkvLayout::Bnhd },
                    causal,
                    window,
                    return_lse: t % 2 == 0 || causal,
                    ..base.clone()
                },
                (nq, nk) == (255, 128) && causal,
            ));
        }
    }

    // Head dims: the specialised 64/128/256, and the generic path (80, 32, 96, 160, 200, 8).
    for (i, d) in [64usize, 80, 128, 256, 32, 96, 160, 200, 8].into_iter().enumerate() {
        for (j, dtype) in DTYPES.into_iter().enumerate() {
            let t = next();
            v.push((
                Case {
                    dtype,
                    seqlen_q: if j == 0 { 255 } else { 200 },
                    seqlen_k: 255,
                    head_dim: d,
                    layout: if t % 3 == 0 { QkvLayout::Bhnd } else { QkvLayout::Bnhd },
                    causal: (i + j) % 2 == 1,
                    return_lse: t % 2 == 1,
                    ..base.clone()
                },
                (d == 80 && j == 1) || (d == 8 && j == 0),
            ));
        }
    }

    // GQA ratios 4 and 8 and MQA.
    for (i, (hq, hkv)) in [(8usize, 2usize), (16, 2), (8, 1)].into_iter().enumerate() {
        for (m, causal) in [false, true].into_iter().enumerate() {
            v.push((
                Case {
                    dtype: DTYPES[(i + m) % 2],
                    batch: if m == 0 { 2 } else { 1 },
                    heads_q: hq,
                    heads_kv: hkv,
                    seqlen_q: if m == 0 { 255 } else { 1000 },
                    seqlen_k: if m == 0 { 255 } else { 1000 },
                    head_dim: if i == 1 { 64 } else { 128 },
                    layout: if i == 2 { QkvLayout::Bhnd } else { QkvLayout::Bnhd },
                    causal,
                    ..base.clone()
                },
                false,
            ));
        }
    }
    v.push((
        Case {
            heads_q: 4,
            heads_kv: 1,
            seqlen_q: 200,
            seqlen_k: 300,
            head_dim: 64,
            layout: QkvLayout::Bhnd,
            window: (32, 8),
            ..base.clone()
        },
        false,
    ));

    // Varlen batches with random lengths, zero-length sequences included.
    let mut rng = Lengths(0x5eed_0000 + path as u64);
    let varlen = |lengths: Vec<(usize, usize)>, hq: usize, hkv: usize, d: usize| Case {
        batch: lengths.len(),
        lengths: Some(lengths),
        heads_q: hq,
        heads_kv: hkv,
        head_dim: d,
        ..base.clone()
    };
    v.push((varlen(rng.pairs(5, 300, 300, true), 4, 4, 64), false));
    v.push((
        Case {
            causal: true,
            dtype: DType::BF16,
            ..varlen(rng.pairs(8, 1000, 1000, true), 8, 2, 128)
        },
        false,
    ));
    // Prefill on a cache: keys >= queries per sequence.
    let mut with_cache = rng.pairs(6, 200, 0, true);
    for (q, k) in with_cache.iter_mut() {
        *k = *q + rng.next(300);
    }
    v.push((
        Case {
            causal: true,
            ..varlen(with_cache, 4, 4, 128)
        },
        false,
    ));
    // Unrelated q/k lengths (some q > k: fully masked rows under causal).
    v.push((
        Case {
            causal: true,
            dtype: DType::BF16,
            ..varlen(rng.pairs(6, 150, 150, false), 4, 2, 64)
        },
        true,
    ));
    v.push((
        Case {
            window: (32, 0),
            ..varlen(rng.pairs(4, 500, 500, true), 2, 2, 80)
        },
        false,
    ));
    v.push((varlen(vec![(0, 0), (0, 0), (0, 0)], 4, 4, 64), true));
    v.push((
        Case {
            causal: true,
            storage: Storage::PackedQkv,
            ..varlen(rng.pairs(5, 255, 255, true), 4, 4, 128)
        },
        false,
    ));
    v.push((
        Case {
            storage: Storage::PaddedHeads,
            out_padded: true,
            dtype: DType::BF16,
            ..varlen(rng.pairs(5, 255, 255, true), 8, 2, 96)
        },
        false,
    ));
    v.push((
        Case {
            causal: true,
            num_splits: Some(3),
            ..varlen(rng.pairs(4, 700, 700, true), 4, 4, 128)
        },
        false,
    ));
    v.push((
        Case {
            softcap: 30.0,
            dtype: DType::BF16,
            return_lse: false,
            ..varlen(rng.pairs(5, 200, 200, true), 4, 4, 256)
        },
        false,
    ));

    // Sliding windows, equal and unequal lengths; `causal` with a window forces right = 0.
    for (i, (nq, nk, causal, window)) in [
        (1000, 1000, false, (-1, 0)),
        (1000, 1000, false, (128, 0)),
        (1000, 1000, false, (100, 100)),
        (1000, 1000, false, (0, 0)),
        (1000, 1000, false, (-1, 50)),
        (1000, 1000, false, (50, -1)),
        (255, 1000, false, (64, 0)),
        (255, 1000, false, (16, 16)),
        (1000, 255, true, (64, 7)),
    ]
    .into_iter()
    .enumerate()
    {
        v.push((
            Case {
                dtype: DTYPES[i % 2],
                batch: 1,
                seqlen_q: nq,
                seqlen_k: nk,
                head_dim: if i % 3 == 2 { 64 } else { 128 },
                causal,
                window,
                return_lse: i % 2 == 0,
                ..base.clone()
            },
            false,
        ));
    }
    v.push((
        Case {
            seqlen_q: 100,
            seqlen_k: 200,
            window: (48, 0),
            ..base.clone()
        },
        true,
    ));

    // Softcap and explicit scales.
    for (i, (softcap, scale, causal, window, d)) in [
        (30.0, None, false, (-1, -1), 128),
        (30.0, None, true, (-1, -1), 64),
        (5.0, None, false, (64, 0), 128),
        (10.0, Some(0.3), false, (-1, -1), 80),
        (0.0, Some(0.5), true, (-1, -1), 128),
        // Large scales spread the scores (std ~11-23 instead of ~2): a later key tile then often
        // raises a row's max by more than 2^8, which takes the rescale branch of the kernels'
        // lazy rescaling (ts::LazyStep), in both dtypes.
        (0.0, Some(0.5), true, (-1, -1), 128),
        (0.0, Some(1.0), true, (-1, -1), 128),
        (0.0, Some(1.0), false, (64, 0), 96),
    ]
    .into_iter()
    .enumerate()
    {
        v.push((
            Case {
                dtype: DTYPES[i % 2],
                seqlen_q: 255,
                seqlen_k: 255,
                head_dim: d,
                softcap,
                scale,
                causal,
                window,
                ..base.clone()
            },
            i == 1,
        ));
    }

    // The Ampere kernel's work order in sections of batch-heads (forced: the plan takes them only
    // where the heads' K/V exceed L2, sizes that divide the heads), with a shorter last section,
    // a split grid and varlen sequences (the Hopper kernel ignores the option).
    v.push((
        Case {
            batch: 3,
            heads_q: 16,
            heads_kv: 4,
            seqlen_q: 1000,
            seqlen_k: 1000,
            head_dim: 128,
            causal: true,
            sm80_heads_per_section: Some(5),
            ..base.clone()
        },
        false,
    ));
    v.push((
        Case {
            dtype: DType::BF16,
            batch: 2,
            heads_q: 8,
            heads_kv: 8,
            seqlen_q: 200,
            seqlen_k: 700,
            head_dim: 96,
            window: (100, 0),
            num_splits: Some(2),
            sm80_heads_per_section: Some(3),
            ..base.clone()
        },
        false,
    ));
    v.push((
        Case {
            batch: 5,
            lengths: Some(vec![(300, 300), (0, 0), (129, 260), (17, 17), (256, 300)]),
            heads_q: 8,
            heads_kv: 2,
            head_dim: 128,
            causal: true,
            sm80_heads_per_section: Some(3),
            ..base.clone()
        },
        true,
    ));

    // The Ampere kernel's 32-key tiling for 64 < D <= 128 (what GPUs with less shared memory
    // per SM than Hopper run, e.g. A100, sm_86, sm_89), forced on this GPU: lazy rescaling with
    // and without a mask, large scales (late max moves), GQA, splits, varlen.
    if path == AttentionPath::Sm80 {
        let keys32 = Case {
            sm80_block_n: Some(32),
            head_dim: 128,
            ..base.clone()
        };
        for (i, c) in [
            Case {
                heads_q: 8,
                heads_kv: 2,
                seqlen_q: 1000,
                seqlen_k: 1000,
                causal: true,
                ..keys32.clone()
            },
            Case {
                dtype: DType::BF16,
                head_dim: 80,
                seqlen_q: 255,
                seqlen_k: 700,
                window: (64, 0),
                num_splits: Some(3),
                ..keys32.clone()
            },
            Case {
                seqlen_q: 255,
                seqlen_k: 255,
                causal: true,
                scale: Some(1.0),
                ..keys32.clone()
            },
            Case {
                dtype: DType::BF16,
                batch: 4,
                lengths: Some(vec![(300, 300), (0, 5), (17, 400), (128, 128)]),
                causal: true,
                ..keys32.clone()
            },
        ]
        .into_iter()
        .enumerate()
        {
            v.push((c, i == 2));
        }
    }

    // The Hopper kernel's 176-key tiles for 64 < D <= 128 (what the plan picks for long
    // sequences, forced here on short ones): key counts off the tile (tails inside and past the
    // last tile), causal with Nq < Nk and with Nq > Nk (all-masked rows), a sliding window, GQA,
    // forced splits, softcap, varlen with empty sequences, both dtypes.
    if path == AttentionPath::Hopper {
        let keys176 = Case {
            hopper_block_n: Some(super::hopper::LONG_BLOCK_N),
            head_dim: 128,
            ..base.clone()
        };
        for (i, c) in [
            Case {
                heads_q: 8,
                heads_kv: 2,
                seqlen_q: 1000,
                seqlen_k: 1000,
                causal: true,
                ..keys176.clone()
            },
            Case {
                dtype: DType::BF16,
                seqlen_q: 255,
                seqlen_k: 700,
                causal: true,
                ..keys176.clone()
            },
            Case {
                head_dim: 80,
                seqlen_q: 300,
                seqlen_k: 177,
                causal: true,
                ..keys176.clone()
            },
            Case {
                dtype: DType::BF16,
                seqlen_q: 600,
                seqlen_k: 600,
                window: (10, 3),
                ..keys176.clone()
            },
            Case {
                seqlen_q: 17,
                seqlen_k: 2000,
                num_splits: Some(3),
                scale: Some(1.0),
                ..keys176.clone()
            },
            Case {
                dtype: DType::BF16,
                seqlen_q: 300,
                seqlen_k: 700,
                softcap: 20.0,
                causal: true,
                ..keys176.clone()
            },
            Case {
                batch: 4,
                lengths: Some(vec![(300, 300), (0, 5), (17, 400), (176, 352)]),
                causal: true,
                ..keys176.clone()
            },
        ]
        .into_iter()
        .enumerate()
        {
            v.push((c, i == 2));
        }
        // The plan's own choice of 176 (hopper::choose_block_n: 2112 = 12 x 176 keys pad to
        // 17 x 128 = 2176 with the 128-key tiles).
        v.push((
            Case {
                dtype: DType::BF16,
                batch: 1,
                heads_q: 2,
                heads_kv: 2,
                seqlen_q: 2112,
                seqlen_k: 2112,
                head_dim: 128,
                ..base.clone()
            },
            false,
        ));
        // The tail split (hopper::tail_split): a capped grid leaves a short last wave, whose
        // items a second launch runs split along the keys and the combine merges. The plans
        // (grid cap, tail items x splits; hopper.rs tests check these numbers, and the run
        // fails a case whose plan takes no tail split):
        // 27 items on 12 CTAs, 3 x 3; one query tile of 100 rows, 13 items on 12, 1 x 2 (rows
        // past the sequence in the tail item); D64 (192-row tiles) 36 items on 16, 4 x 2, the
        // tail across two sequences; D256 softcap 30 items on 14, 2 x 3; GQA 56 items on 18,
        // 2 x 2.
        // (None is quick: a split of at least TAIL_MIN_TILES_PER_SPLIT tiles needs more keys
        // than the quick set's 300; `verify attention --filter ctas` selects them.)
        for c in [
            Case {
                batch: 1,
                heads_q: 3,
                heads_kv: 3,
                seqlen_q: 1100,
                seqlen_k: 1100,
                head_dim: 128,
                hopper_max_ctas: Some(12),
                ..base.clone()
            },
            Case {
                dtype: DType::BF16,
                batch: 1,
                heads_q: 13,
                heads_kv: 13,
                seqlen_q: 100,
                seqlen_k: 1000,
                head_dim: 128,
                hopper_max_ctas: Some(12),
                ..base.clone()
            },
            Case {
                batch: 2,
                heads_q: 3,
                heads_kv: 3,
                seqlen_q: 1000,
                seqlen_k: 1000,
                head_dim: 64,
                layout: QkvLayout::Bhnd,
                hopper_max_ctas: Some(16),
                ..base.clone()
            },
            Case {
                dtype: DType::BF16,
                batch: 1,
                heads_q: 5,
                heads_kv: 5,
                seqlen_q: 700,
                seqlen_k: 700,
                head_dim: 256,
                softcap: 30.0,
                hopper_max_ctas: Some(14),
                ..base.clone()
            },
            Case {
                dtype: DType::BF16,
                batch: 1,
                heads_q: 8,
                heads_kv: 2,
                seqlen_q: 800,
                seqlen_k: 800,
                head_dim: 128,
                hopper_max_ctas: Some(18),
                return_lse: false,
                ..base.clone()
            },
        ] {
            v.push((c, false));
        }
    }

    // Softcap with a mask and no split (a distinct compiled variant: the cases above let the
    // plan split these small problems), and softcap with splits but no mask.
    for (i, (causal, window, splits)) in [(true, (-1, -1), 1), (false, (100, 3), 1), (false, (-1, -1), 3)]
        .into_iter()
        .enumerate()
    {
        v.push((
            Case {
                dtype: DTYPES[i % 2],
                seqlen_q: 300,
                seqlen_k: 700,
                head_dim: 128,
                softcap: 20.0,
                causal,
                window,
                num_splits: Some(splits),
                ..base.clone()
            },
            false,
        ));
    }

    // Layouts and strided views.
    for (i, (layout, storage, out_padded, n, causal)) in [
        (QkvLayout::Bhnd, Storage::Contiguous, false, 1000, true),
        (QkvLayout::Bnhd, Storage::PackedQkv, false, 255, false),
        (QkvLayout::Bnhd, Storage::PackedQkv, true, 1000, true),
        (QkvLayout::Bnhd, Storage::PaddedHeads, false, 255, true),
        (QkvLayout::Bhnd, Storage::PaddedHeads, true, 255, false),
        (QkvLayout::Bhnd, Storage::Contiguous, true, 128, true),
        (QkvLayout::Bnhd, Storage::Contiguous, true, 17, false),
    ]
    .into_iter()
    .enumerate()
    {
        let (b, h) = small_bh(n);
        v.push((
            Case {
                dtype: DTYPES[i % 2],
                batch: b,
                heads_q: h,
                heads_kv: h,
                seqlen_q: n,
                seqlen_k: n,
                head_dim: if i % 2 == 0 { 128 } else { 64 },
                layout,
                storage,
                out_padded,
                causal,
                ..base.clone()
            },
            n == 255,
        ));
    }

    // Forced split-KV (7 splits of few key tiles is clamped by the plan) and decode-like rows.
    for (i, (nq, nk, causal, window)) in [
        (1000, 1000, false, (-1, -1)),
        (4096, 4096, true, (-1, -1)),
        (17, 4096, false, (256, 0)),
    ]
    .into_iter()
    .enumerate()
    {
        for (j, splits) in [2usize, 3, 7].into_iter().enumerate() {
            let (b, h) = small_bh(nq.max(nk));
            v.push((
                Case {
                    dtype: DTYPES[(i + j) % 2],
                    batch: b,
                    heads_q: h,
                    heads_kv: h,
                    seqlen_q: nq,
                    seqlen_k: nk,
                    head_dim: [128, 64, 256][(i + j) % 3],
                    causal,
                    window,
                    num_splits: Some(splits),
                    return_lse: j != 1,
                    ..base.clone()
                },
                false,
            ));
        }
    }
    for (nq, nk, splits, quick) in [(1, 1000, 7, false), (17, 255, 3, true), (200, 64, 7, false)] {
        v.push((
            Case {
                heads_q: 8,
                heads_kv: 2,
                seqlen_q: nq,
                seqlen_k: nk,
                head_dim: 128,
                causal: true,
                num_splits: Some(splits),
                ..base.clone()
            },
            quick,
        ));
    }
    v
}

/// Runs one case on the GPU and compares it with the f64 reference.
pub fn verify_case(ctx: &Context, case: &Case, seed: u64) -> Result<VerifyOutcome> {
    if case.path == AttentionPath::Hopper && ctx.arch() != Arch::SM90 {
        return Ok(VerifyOutcome::skipped(
            case.name(),
            case.params(),
            format!("the Hopper path needs sm_90a; this GPU is {}", ctx.arch()),
        ));
    }
    crate::dispatch_float!("attention verify"; case.dtype, [F16, BF16], |T| run::<T>(ctx, case, seed))
}

/// Where one tensor's elements are: `offset + b * stride_b + n * stride_n + h * stride_h + d`
/// (varlen: `n` is the global row and `stride_b` is 0), plus the view's shape and strides.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    pub offset: usize,
    pub stride_b: usize,
    pub stride_n: usize,
    pub stride_h: usize,
    /// Rows per sequence of a padded batch; `None` for varlen.
    pub per_seq: Option<usize>,
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
}

impl Placement {
    /// Element offset of `(global row, head, 0)`.
    pub fn at(&self, row: usize, h: usize) -> usize {
        let (b, n) = match self.per_seq {
            Some(p) if p > 0 => (row / p, row % p),
            _ => (0, row),
        };
        self.offset + b * self.stride_b + n * self.stride_n + h * self.stride_h
    }
}

/// The placement of a `[rows, heads, D]` tensor with `pitch` elements per head in the case's
/// layout (contiguous apart from the pitch).
fn placement(case: &Case, rows_per_seq: usize, total_rows: usize, heads: usize, pitch: usize) -> Placement {
    let d = case.head_dim;
    if case.lengths.is_some() {
        return Placement {
            offset: 0,
            stride_b: 0,
            stride_n: heads * pitch,
            stride_h: pitch,
            per_seq: None,
            shape: vec![total_rows, heads, d],
            strides: vec![heads * pitch, pitch, 1],
        };
    }
    let b = case.batch;
    match case.layout {
        QkvLayout::Bnhd => Placement {
            offset: 0,
            stride_b: rows_per_seq * heads * pitch,
            stride_n: heads * pitch,
            stride_h: pitch,
            per_seq: Some(rows_per_seq),
            shape: vec![b, rows_per_seq, heads, d],
            strides: vec![rows_per_seq * heads * pitch, heads * pitch, pitch, 1],
        },
        QkvLayout::Bhnd => Placement {
            offset: 0,
            stride_b: heads * rows_per_seq * pitch,
            stride_n: pitch,
            stride_h: rows_per_seq * pitch,
            per_seq: Some(rows_per_seq),
            shape: vec![b, heads, rows_per_seq, d],
            strides: vec![heads * rows_per_seq * pitch, rows_per_seq * pitch, pitch, 1],
        },
    }
}

/// Host buffers and placements of Q, K and V (K and V share a buffer when packed).
pub struct Inputs<T> {
    pub q: Vec<T>,
    pub kv: Option<Vec<T>>,
    pub k: Vec<T>,
    pub v: Vec<T>,
    pub q_at: Placement,
    pub k_at: Placement,
    pub v_at: Placement,
}

/// Draws the inputs of a case: normal values (Q with [`Q_STD`]), NaN in every gap between heads.
pub fn case_inputs<T: Element>(case: &Case, seed: u64) -> Result<Inputs<T>> {
    let d = case.head_dim;
    let (cu_q, cu_k) = case.cu_seqlens();
    let (tq, tk) = (*cu_q.last().unwrap_or(&0), *cu_k.last().unwrap_or(&0));
    let (nq, nk) = (case.seqlen_q, case.seqlen_k);
    let fill = |s: u64, len: usize, pitch: usize, std: f64| -> Vec<T> {
        random_matrix(s, len / pitch, d, pitch, Dist::Normal { std })
    };
    match case.storage {
        Storage::PackedQkv => {
            if case.heads_q != case.heads_kv || cu_q != cu_k || case.layout != QkvLayout::Bnhd {
                return Err(Error::invalid(
                    "case",
                    "packed QKV needs Hq == Hkv, equal q/k lengths and the [B, N, H, D] layout",
                ));
            }
            let h = case.heads_q;
            // One [rows, 3, H, D] buffer: q, k, v are heads 0..H, H..2H, 2H..3H of 3H.
            let mut at = placement(case, nq, tq, 3 * h, d);
            let heads_dim = at.shape.len() - 2;
            at.shape[heads_dim] = h;
            let mut buf = fill(seed, tq * 3 * h * d, d, 1.0);
            // Q's heads of every row scaled to Q_STD (a power of two: exact in fp16/bf16).
            for row in buf.chunks_mut(3 * h * d) {
                for x in &mut row[..h * d] {
                    *x = T::from_f64(x.to_f64() * Q_STD);
                }
            }
            let with = |o: usize| Placement {
                offset: o,
                ..at.clone()
            };
            Ok(Inputs {
                q: Vec::new(),
                kv: Some(buf),
                k: Vec::new(),
                v: Vec::new(),
                q_at: with(0),
                k_at: with(h * d),
                v_at: with(2 * h * d),
            })
        }
        Storage::Contiguous | Storage::PaddedHeads => {
            let pitch = if case.storage == Storage::PaddedHeads {
                d + HEAD_PAD
            } else {
                d
            };
            let q_at = placement(case, nq, tq, case.heads_q, pitch);
            let k_at = placement(case, nk, tk, case.heads_kv, pitch);
            Ok(Inputs {
                q: fill(seed.wrapping_mul(3), tq * case.heads_q * pitch, pitch, Q_STD),
                kv: None,
                k: fill(
                    seed.wrapping_mul(3).wrapping_add(1),
                    tk * case.heads_kv * pitch,
                    pitch,
                    1.0,
                ),
                v: fill(
                    seed.wrapping_mul(3).wrapping_add(2),
                    tk * case.heads_kv * pitch,
                    pitch,
                    1.0,
                ),
                v_at: k_at.clone(),
                q_at,
                k_at,
            })
        }
    }
}

impl<T: Element> Inputs<T> {
    fn q_buf(&self) -> &[T] {
        self.kv.as_deref().unwrap_or(&self.q)
    }
    fn k_buf(&self) -> &[T] {
        self.kv.as_deref().unwrap_or(&self.k)
    }
    fn v_buf(&self) -> &[T] {
        self.kv.as_deref().unwrap_or(&self.v)
    }
}

/// Gathers a placed tensor into the canonical `[rows, heads, D]` f64 order.
pub fn gather<T: Element>(buf: &[T], at: &Placement, rows: usize, heads: usize, d: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(rows * heads * d);
    for r in 0..rows {
        for h in 0..heads {
            let o = at.at(r, h);
            out.extend(buf[o..o + d].iter().map(|x| x.to_f64()));
        }
    }
    out
}

/// The reference parameters of a case.
pub fn ref_params(case: &Case) -> RefParams {
    let opts = case.options();
    let (left, right) = opts.effective_window();
    RefParams {
        heads_q: case.heads_q,
        heads_kv: case.heads_kv,
        head_dim: case.head_dim,
        // The kernels receive the f32 scale; the reference uses exactly that value.
        scale: opts.effective_scale(case.head_dim) as f64,
        softcap: case.softcap as f64,
        window_left: left as i64,
        window_right: right as i64,
    }
}

/// A tensor's own buffer, else the shared packed one.
fn pick<'a, T: Element>(
    own: &'a Option<DeviceBuffer<T>>,
    shared: &'a Option<DeviceBuffer<T>>,
) -> Result<&'a DeviceBuffer<T>> {
    own.as_ref()
        .or(shared.as_ref())
        .ok_or_else(|| Error::invalid("case", "no input buffer"))
}

/// The f64 reference of a case on exactly the values of its inputs.
pub fn reference_of<T: Element>(case: &Case, inputs: &Inputs<T>) -> RefOutput {
    let (cu_q, cu_k) = case.cu_seqlens();
    let (tq, tk) = (*cu_q.last().unwrap_or(&0), *cu_k.last().unwrap_or(&0));
    let (hq, hkv, d) = (case.heads_q, case.heads_kv, case.head_dim);
    attention_reference(
        &RefInputs {
            q: &gather(inputs.q_buf(), &inputs.q_at, tq, hq, d),
            k: &gather(inputs.k_buf(), &inputs.k_at, tk, hkv, d),
            v: &gather(inputs.v_buf(), &inputs.v_at, tk, hkv, d),
            cu_q: &cu_q,
            cu_k: &cu_k,
        },
        &ref_params(case),
    )
}

/// A device view of `buf` starting `at.offset` elements in.
fn view_at<'a, T: Element>(buf: &'a DeviceBuffer<T>, at: &Placement) -> Result<TensorView<'a>> {
    if at.offset == 0 {
        return buf.view(&at.shape, &at.strides);
    }
    let len = buf.len().saturating_sub(at.offset);
    // SAFETY: the address lies `offset` elements into `buf`, which stays borrowed for 'a; the
    // view constructor checks that every addressed element is within the remaining `len`.
    unsafe {
        TensorView::from_raw(
            buf.device_ptr() + (at.offset * T::DTYPE.size()) as u64,
            T::DTYPE,
            len,
            &at.shape,
            &at.strides,
        )
    }
}

fn run<T: Element>(ctx: &Context, case: &Case, seed: u64) -> Result<VerifyOutcome> {
    let (hq, d) = (case.heads_q, case.head_dim);
    let (cu_q, cu_k) = case.cu_seqlens();
    let tq = *cu_q.last().unwrap_or(&0);
    let inputs = case_inputs::<T>(case, seed)?;
    let opts = case.options();

    let to_i32 = |c: &[usize]| c.iter().map(|&x| x as i32).collect::<Vec<i32>>();
    let varlen = match &case.lengths {
        Some(_) => Some(VarlenBatch::new(ctx, &to_i32(&cu_q), &to_i32(&cu_k))?),
        None => None,
    };
    let (q_dev, k_dev, v_dev, kv_dev) = match &inputs.kv {
        Some(buf) => (None, None, None, Some(ctx.upload(buf)?)),
        None => (
            Some(ctx.upload(&inputs.q)?),
            Some(ctx.upload(&inputs.k)?),
            Some(ctx.upload(&inputs.v)?),
            None,
        ),
    };
    let q = view_at(pick(&q_dev, &kv_dev)?, &inputs.q_at)?;
    let k = view_at(pick(&k_dev, &kv_dev)?, &inputs.k_at)?;
    let v = view_at(pick(&v_dev, &kv_dev)?, &inputs.v_at)?;

    let problem = AttentionProblem::of_views(&q, &k, &v, case.layout, varlen.as_ref())?;
    let plan = AttentionPlan::new(ctx, &problem, &opts)?;
    // A case that forces CTA pairs where the kernel has them must run them.
    if case.hopper_cta_pairs == Some(true) && pairs_apply(case) && !plan.variant().pair {
        return Err(crate::Error::Unsupported(format!(
            "verify: this case forces CTA pairs, the plan is {}",
            plan.describe()
        )));
    }
    // The capped-grid cases exist to reach the Hopper tail split; a plan without one would
    // pass while testing the plain path.
    if case.path == AttentionPath::Hopper
        && case.hopper_max_ctas.is_some()
        && !plan.variant().pair
        && plan.tail_split().is_none()
    {
        return Err(crate::Error::Unsupported(format!(
            "verify: this case should plan a tail split (hopper::tail_split), the plan is {}",
            plan.describe()
        )));
    }

    let out_pitch = if case.out_padded { d + HEAD_PAD } else { d };
    let o_at = placement(case, case.seqlen_q, tq, hq, out_pitch);
    let out_len = tq * hq * out_pitch;
    let mut out = ctx.alloc::<T>(out_len)?;
    out.fill_bytes(0xff)?; // NaN poison in f16 and bf16
    let lse_len = tq * hq;
    let mut lse = ctx.alloc::<f32>(lse_len)?;
    lse.fill_bytes(0xff)?;
    {
        let mut o_view = out.view_mut(&o_at.shape, &o_at.strides)?;
        let mut lse_view = if case.return_lse {
            Some(plan.lse_view_mut(&mut lse)?)
        } else {
            None
        };
        plan.run(&q, &k, &v, &mut o_view, lse_view.as_mut(), varlen.as_ref())?;
    }
    ctx.synchronize()?;
    let out_host = out.to_host()?;
    let lse_host = lse.to_host()?;

    let want = reference_of(case, &inputs);
    let Judgement {
        comparison,
        notes,
        lse_err,
    } = judge(case, &o_at, out_pitch, &out_host, &lse_host, &want);
    let budget = case.dtype.rel_l2_budget();
    let passed = comparison.passes(budget) && notes.is_empty();
    Ok(VerifyOutcome {
        case: case.name(),
        params: case.params(),
        path: match lse_err {
            Some(e) => format!("{} lse {e:.1e}", plan.describe()),
            None => plan.describe(),
        },
        comparison,
        budget,
        passed,
        note: (!notes.is_empty()).then(|| notes.join("\n     ")),
        skipped: None,
    })
}

/// The verdict inputs of one run: the output's comparison with the reference, every failed
/// check other than the metrics, and the largest LSE error (when LSE was requested).
pub struct Judgement {
    pub comparison: Comparison,
    pub notes: Vec<String>,
    pub lse_err: Option<f64>,
}

/// Index of `(global row r, head h)` in the LSE the plan writes: `[B, Hq, Nq]` for a padded
/// batch, `[Hq, total_q]` for varlen.
pub fn lse_index(case: &Case, total_q: usize, r: usize, h: usize) -> usize {
    if case.lengths.is_some() {
        h * total_q + r
    } else {
        let (b, n) = (r / case.seqlen_q, r % case.seqlen_q);
        (b * case.heads_q + h) * case.seqlen_q + n
    }
}

/// Judges the downloaded output (`out` with head pitch `out_pitch`, placed as `o_at`) and LSE
/// against the reference: rel-L2 of the output, fully masked rows exactly 0, output padding
/// still NaN, LSE within [`LSE_ATOL`] (-inf exactly).
pub fn judge<T: Element>(
    case: &Case,
    o_at: &Placement,
    out_pitch: usize,
    out: &[T],
    lse: &[f32],
    want: &RefOutput,
) -> Judgement {
    let (hq, d) = (case.heads_q, case.head_dim);
    let tq = want.lse.len() / hq.max(1);
    let got = gather(out, o_at, tq, hq, d);
    let comparison = compare(&got, &want.o, 1e-3, 1e-2);
    let mut notes: Vec<String> = Vec::new();
    // Fully masked rows: exactly zero.
    if let Some(r) =
        (0..tq * hq).find(|&r| want.lse[r] == f64::NEG_INFINITY && got[r * d..(r + 1) * d].iter().any(|&x| x != 0.0))
    {
        notes.push(format!(
            "row {} head {} sees no key but its output is not exactly 0 (first value {})",
            r / hq,
            r % hq,
            got[r * d..(r + 1) * d].iter().find(|&&x| x != 0.0).unwrap_or(&f64::NAN)
        ));
    }
    // Output padding untouched (still the NaN poison).
    if let Some(i) = (0..out.len()).find(|&i| i % out_pitch >= d && !out[i].to_f64().is_nan()) {
        notes.push(format!("output padding element {i} was overwritten"));
    }
    let mut lse_err = None;
    if case.return_lse {
        let got_lse: Vec<f64> = (0..tq)
            .flat_map(|r| (0..hq).map(move |h| (r, h)))
            .map(|(r, h)| lse[lse_index(case, tq, r, h)] as f64)
            .collect();
        let c = compare(&got_lse, &want.lse, LSE_ATOL, 0.0);
        if c.nan_count > 0 || c.special_mismatches > 0 || c.max_abs_err > LSE_ATOL {
            notes.push(format!("LSE (atol {LSE_ATOL:e}): {c}"));
        }
        lse_err = Some(c.max_abs_err);
    }
    Judgement {
        comparison,
        notes,
        lse_err,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_matrix_covers_the_issue() {
        let all = cases(false);
        assert!((150..=330).contains(&all.len()), "{} cases", all.len());
        let q = cases(true);
        assert!((15..=40).contains(&q.len()), "{} quick cases", q.len());
        for path in [AttentionPath::Sm80, AttentionPath::Hopper] {
            let p: Vec<&Case> = all.iter().filter(|c| c.path == path).collect();
            for n in [1, 17, 128, 255, 1000, 4096] {
                assert!(p.iter().any(|c| c.seqlen_q == n && c.seqlen_k == n), "N {n}");
            }
            assert!(p.iter().any(|c| c.lengths.is_none() && c.seqlen_q < c.seqlen_k));
            assert!(p
                .iter()
                .any(|c| c.lengths.is_none() && c.seqlen_q > c.seqlen_k && c.causal));
            for d in [64, 80, 128, 256, 32, 96, 160, 200, 8] {
                for dt in DTYPES {
                    assert!(p.iter().any(|c| c.head_dim == d && c.dtype == dt), "D {d} {dt}");
                }
            }
            for g in [1, 4, 8] {
                assert!(
                    p.iter().any(|c| c.heads_q / c.heads_kv == g && c.heads_kv > 1),
                    "group {g}"
                );
            }
            assert!(p.iter().any(|c| c.heads_kv == 1 && c.heads_q > 1), "MQA");
            assert!(p.iter().any(|c| c
                .lengths
                .as_ref()
                .is_some_and(|l| l.iter().any(|&(a, _)| a == 0) && l.iter().any(|&(a, _)| a > 0))));
            assert!(p.iter().any(|c| c
                .lengths
                .as_ref()
                .is_some_and(|l| l.iter().all(|&(a, b)| a == 0 && b == 0))));
            for w in [(-1, 0), (128, 0), (100, 100), (0, 0)] {
                assert!(p.iter().any(|c| c.window == w), "window {w:?}");
            }
            assert!(p.iter().any(|c| c.softcap > 0.0));
            assert!(p.iter().any(|c| c.scale.is_some()));
            for l in [QkvLayout::Bnhd, QkvLayout::Bhnd] {
                assert!(p.iter().any(|c| c.layout == l && c.lengths.is_none()));
            }
            for s in [Storage::PackedQkv, Storage::PaddedHeads] {
                assert!(p.iter().any(|c| c.storage == s));
            }
            assert!(p.iter().any(|c| c.out_padded));
            for s in [Some(2), Some(3), Some(7), None] {
                assert!(p.iter().any(|c| c.num_splits == s), "splits {s:?}");
            }
            assert!(p.iter().any(|c| c.return_lse) && p.iter().any(|c| !c.return_lse));
            assert!(q.iter().any(|c| c.path == path));
        }
        assert!(all.iter().any(|c| c.path == AttentionPath::Auto));
        // CTA pairs, forced: causal with all-masked rows, a window, an odd query-tile count,
        // capped grids (several items per cluster), both key tilings of D = 128, D = 256, varlen.
        let pairs: Vec<&Case> = all.iter().filter(|c| c.hopper_cta_pairs == Some(true)).collect();
        assert!(pairs.iter().any(|c| c.causal && c.seqlen_q > c.seqlen_k));
        assert!(pairs.iter().any(|c| c.window != (-1, -1) && !c.causal));
        assert!(pairs.iter().any(|c| c.seqlen_q.div_ceil(128) % 2 == 1));
        assert!(pairs.iter().any(|c| c.hopper_max_ctas.is_some()));
        assert!(pairs
            .iter()
            .any(|c| c.hopper_block_n == Some(super::super::hopper::LONG_BLOCK_N)));
        assert!(pairs.iter().any(|c| c.head_dim == 256));
        // Varlen with pairs: items in which neither CTA of a pair has rows (a sequence at least
        // two query tiles shorter than the longest), skipped by rank 0's producer.
        assert!(pairs.iter().any(|c| c.lengths.as_ref().is_some_and(|l| {
            let longest = l.iter().map(|&(q, _)| q).max().unwrap_or(0);
            l.iter().any(|&(q, _)| q + 256 <= longest)
        })));
        assert!(q.iter().any(|c| c.hopper_cta_pairs == Some(true)));
        // Names are unique (the CLI filters and reports by name) and carry the path.
        let mut names: Vec<String> = all.iter().map(|c| c.name()).collect();
        assert!(names
            .iter()
            .all(|n| n.starts_with("sm80 ") || n.starts_with("hopper ") || n.starts_with("auto ")));
        names.sort();
        let len = names.len();
        names.dedup();
        assert_eq!(names.len(), len, "duplicate case names");
        // Quick cases stay small for compute-sanitizer.
        assert!(q.iter().all(|c| c.seqlen_q.max(c.seqlen_k) <= 300));
        // Every case is a valid problem.
        for c in &all {
            let (cu_q, cu_k) = c.cu_seqlens();
            let p = AttentionProblem {
                batch: c.batch_size(),
                heads_q: c.heads_q,
                heads_kv: c.heads_kv,
                seqlen_q: c.lengths.as_ref().map_or(c.seqlen_q, |l| max_lengths(l).0),
                seqlen_k: c.lengths.as_ref().map_or(c.seqlen_k, |l| max_lengths(l).1),
                head_dim: c.head_dim,
                dtype: c.dtype,
                varlen: c
                    .lengths
                    .as_ref()
                    .map(|_| (*cu_q.last().unwrap(), *cu_k.last().unwrap())),
            };
            p.validate().unwrap_or_else(|e| panic!("{}: {e}", c.name()));
        }
    }

    #[test]
    fn varlen_lengths_are_deterministic() {
        assert_eq!(cases(false), cases(false));
    }

    #[test]
    fn inputs_place_heads_and_gaps() {
        for (layout, storage) in [
            (QkvLayout::Bnhd, Storage::Contiguous),
            (QkvLayout::Bhnd, Storage::PaddedHeads),
            (QkvLayout::Bnhd, Storage::PackedQkv),
        ] {
            let c = Case {
                batch: 2,
                heads_q: 3,
                heads_kv: 3,
                seqlen_q: 5,
                seqlen_k: 5,
                head_dim: 8,
                layout,
                storage,
                ..Case::default()
            };
            let x = case_inputs::<f32>(&c, 3).unwrap();
            let q = gather(x.q_buf(), &x.q_at, 10, 3, 8);
            let k = gather(x.k_buf(), &x.k_at, 10, 3, 8);
            let v = gather(x.v_buf(), &x.v_at, 10, 3, 8);
            for t in [&q, &k, &v] {
                assert!(t.iter().all(|x| x.is_finite() && *x != 0.0), "{storage:?}");
            }
            assert_ne!(q, k);
            assert_ne!(k, v);
            // Every logical element is distinct memory: gathered positions do not overlap.
            let mut pos: Vec<usize> = Vec::new();
            for at in [&x.q_at, &x.k_at, &x.v_at] {
                for r in 0..10 {
                    for h in 0..3 {
                        pos.extend(at.at(r, h)..at.at(r, h) + 8);
                    }
                }
            }
            let n = pos.len();
            if storage == Storage::PackedQkv {
                pos.sort();
                pos.dedup();
                assert_eq!(pos.len(), n);
                assert_eq!(x.kv.as_ref().unwrap().len(), n);
            }
            if storage == Storage::PaddedHeads {
                assert!(x.q[8..8 + HEAD_PAD].iter().all(|v| v.is_nan()));
            }
        }
    }

    #[test]
    fn bhnd_placement_matches_strides() {
        let c = Case {
            batch: 2,
            heads_q: 3,
            seqlen_q: 5,
            head_dim: 8,
            layout: QkvLayout::Bhnd,
            ..Case::default()
        };
        let at = placement(&c, 5, 10, 3, 8);
        assert_eq!(at.shape, vec![2, 3, 5, 8]);
        // Row 7 = (b 1, n 2), head 2.
        assert_eq!(at.at(7, 2), 3 * 5 * 8 + 2 * 5 * 8 + 2 * 8);
        assert_eq!(at.at(7, 2), at.strides[0] + 2 * at.strides[1] + 2 * at.strides[2]);
    }

    #[test]
    fn names_mention_path_and_parameters() {
        let c = Case {
            path: AttentionPath::Hopper,
            causal: true,
            softcap: 30.0,
            num_splits: Some(3),
            storage: Storage::PackedQkv,
            ..Case::default()
        };
        let n = c.name();
        for part in [
            "hopper",
            "fp16",
            "bnhd",
            "N128x128",
            "D64",
            "causal",
            "softcap30",
            "splits3",
            "packed-qkv",
        ] {
            assert!(n.contains(part), "{part} missing in {n}");
        }
    }

    /// What a correct kernel would leave in memory: the reference rounded to `T` in the
    /// output placement (padding still poisoned) and the LSE in the plan's layout.
    fn ideal_outputs(case: &Case, want: &RefOutput, o_at: &Placement, pitch: usize) -> (Vec<f32>, Vec<f32>) {
        let (hq, d) = (case.heads_q, case.head_dim);
        let tq = want.lse.len() / hq;
        let mut out = vec![f32::NAN; tq * hq * pitch];
        let mut lse = vec![f32::NAN; tq * hq];
        for r in 0..tq {
            for h in 0..hq {
                let o = o_at.at(r, h);
                for c in 0..d {
                    out[o + c] = want.o[(r * hq + h) * d + c] as f32;
                }
                lse[lse_index(case, tq, r, h)] = want.lse[r * hq + h] as f32;
            }
        }
        (out, lse)
    }

    #[test]
    fn judge_accepts_ideal_output_and_catches_faults() {
        let mut rng = Lengths(9);
        let lengths = rng.pairs(4, 9, 9, false);
        for case in [
            Case {
                batch: 2,
                heads_q: 4,
                heads_kv: 2,
                seqlen_q: 7,
                seqlen_k: 5,
                head_dim: 8,
                causal: true,
                out_padded: true,
                ..Case::default()
            },
            Case {
                batch: 2,
                heads_q: 3,
                heads_kv: 3,
                seqlen_q: 6,
                seqlen_k: 4,
                head_dim: 16,
                window: (1, 0),
                layout: QkvLayout::Bhnd,
                storage: Storage::PaddedHeads,
                out_padded: true,
                ..Case::default()
            },
            Case {
                batch: lengths.len(),
                lengths: Some(lengths.clone()),
                heads_q: 2,
                heads_kv: 1,
                head_dim: 8,
                causal: true,
                ..Case::default()
            },
        ] {
            let tq = *case.cu_seqlens().0.last().unwrap();
            let (hq, d) = (case.heads_q, case.head_dim);
            let want = reference_of(&case, &case_inputs::<f32>(&case, 5).unwrap());
            assert!(
                want.lse.contains(&f64::NEG_INFINITY),
                "{}: has masked rows",
                case.name()
            );
            let pitch = if case.out_padded { d + HEAD_PAD } else { d };
            let o_at = placement(&case, case.seqlen_q, tq, hq, pitch);
            let (out, lse) = ideal_outputs(&case, &want, &o_at, pitch);
            let j = judge(&case, &o_at, pitch, &out, &lse, &want);
            assert!(
                j.comparison.passes(1e-6) && j.notes.is_empty(),
                "{}: {:?}",
                case.name(),
                j.notes
            );
            assert!(j.lse_err.unwrap() < 1e-5);

            // An unwritten element fails.
            let mut bad = out.clone();
            let masked_row = (0..tq * hq).find(|&r| want.lse[r] == f64::NEG_INFINITY).unwrap();
            let live_row = (0..tq * hq).find(|&r| want.lse[r].is_finite()).unwrap();
            bad[o_at.at(live_row / hq, live_row % hq)] = f32::NAN;
            assert!(!judge(&case, &o_at, pitch, &bad, &lse, &want).comparison.passes(1.0));
            // A fully masked row that is not exactly 0 fails.
            let mut bad = out.clone();
            bad[o_at.at(masked_row / hq, masked_row % hq)] = 1e-30;
            let j = judge(&case, &o_at, pitch, &bad, &lse, &want);
            assert!(j.notes.iter().any(|n| n.contains("sees no key")), "{:?}", j.notes);
            // Written padding fails.
            if case.out_padded {
                let mut bad = out.clone();
                bad[d] = 0.0;
                let j = judge(&case, &o_at, pitch, &bad, &lse, &want);
                assert!(j.notes.iter().any(|n| n.contains("padding")), "{:?}", j.notes);
            }
            // A finite LSE where the row is masked, or an LSE off by 2e-3, fails.
            let mut bad = lse.clone();
            bad[lse_index(&case, tq, masked_row / hq, masked_row % hq)] = -1e30;
            assert!(!judge(&case, &o_at, pitch, &out, &bad, &want).notes.is_empty());
            let mut bad = lse.clone();
            bad[lse_index(&case, tq, live_row / hq, live_row % hq)] += 2e-3;
            assert!(!judge(&case, &o_at, pitch, &out, &bad, &want).notes.is_empty());
            // LSE not requested: not checked.
            let no_lse = Case {
                return_lse: false,
                ..case.clone()
            };
            assert!(judge(&no_lse, &o_at, pitch, &out, &bad, &want).notes.is_empty());
        }
    }
}
