//! FlashAttention forward: exact scaled dot-product attention with online softmax.
//!
//! `O = softmax(Q K^T * scale + M) V` for fp16 or bf16 Q/K/V/O, accumulated in f32, tiled so the
//! `N x N` score matrix never reaches device memory. Optionally writes the f32 log-sum-exp
//! (natural log) of every query row, `-inf` for a row that sees no key (its output is zeros).
//! Non-finite inputs propagate: a NaN score or a `+inf` score (inf in Q or K) makes its row's
//! output NaN, as `torch.softmax` would.
//!
//! - Layouts ([`QkvLayout`]): `[B, N, H, D]` (FlashAttention's) or `[B, H, N, D]`, any strides
//!   with a contiguous last dimension; or packed variable-length batches `[total, H, D]` with
//!   `cu_seqlens` ([`VarlenBatch`]), as `flash_attn_varlen_func`.
//! - GQA/MQA: `heads_q` a multiple of `heads_kv`; query head `h` reads KV head
//!   `h / (heads_q / heads_kv)`. K/V are never copied or expanded.
//! - Masks: none, causal (bottom-right aligned when `Nq != Nk`, as FlashAttention >= 2.1),
//!   sliding window `(left, right)`; scale (default `1/sqrt(D)`); logit softcap.
//! - Head dims 64, 128 and 256 are specialised; any other `D <= 256` that is a multiple of 8
//!   runs zero-padded to the next specialisation.
//!
//! Kernels: a Hopper path (`sm_90a`: TMA, mbarriers, wgmma, warp specialisation) and an Ampere
//! path (`sm_80+`: ldmatrix, mma.sync, cp.async), both with split-KV for few long rows merged by
//! the shared online-softmax rule. [`AttentionPlan`] picks path, tiles and splits once; run it
//! many times.
//!
//! ```no_run
//! # fn main() -> tessera::Result<()> {
//! use half::f16;
//! use tessera::attention::{flash_forward, AttentionOptions};
//! use tessera::runtime::Context;
//! let ctx = Context::new(0)?;
//! let (b, n, h, d) = (1, 1024, 8, 128);
//! let x = ctx.upload(&vec![f16::from_f32(0.1); b * n * h * d])?;
//! let view = x.view(&[b, n, h, d], &[n * h * d, h * d, d, 1])?;
//! let opts = AttentionOptions { causal: true, return_lse: true, ..Default::default() };
//! let (out, lse) = flash_forward::<f16>(&ctx, &view, &view, &view, None, &opts)?;
//! # Ok(()) }
//! ```

pub mod ampere;
#[cfg(feature = "harness")]
pub mod bench;
pub mod hopper;
#[cfg(feature = "harness")]
mod operator;
pub mod plan;
#[cfg(feature = "harness")]
pub mod reference;
#[cfg(test)]
mod tests;
pub mod tuning;
#[cfg(feature = "harness")]
pub mod verify;

#[cfg(test)]
mod compile_tests;

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::runtime::{contiguous_strides, Context, DeviceBuffer, TensorView};

#[cfg(feature = "harness")]
pub use operator::OPERATOR;
pub use plan::{AttentionPath, AttentionPlan, AttentionPlanKey};
pub use tuning::AttentionTuning;

/// Device source of the shared parameter header (`tessera/attention_params.cuh`).
pub const PARAMS_HEADER: &str = include_str!("attention_params.cuh");

/// The attention kernels' own device headers, handed to NVRTC beside the shared library.
pub const DEVICE_HEADERS: &[(&str, &str)] = &[("tessera/attention_params.cuh", PARAMS_HEADER)];

/// Largest supported head dimension.
pub const MAX_HEAD_DIM: usize = 256;

/// Memory layout of padded-batch Q/K/V/O (varlen batches are always `[total, H, D]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum QkvLayout {
    /// `[B, N, H, D]`: FlashAttention's layout. Default.
    #[default]
    Bnhd,
    /// `[B, H, N, D]`: torch SDPA's layout.
    Bhnd,
}

/// Options of an attention plan: what attention computes. Defaults: no mask,
/// `scale = 1/sqrt(D)`, no softcap, no LSE, and the dispatcher's choice of kernel
/// ([`AttentionTuning::default`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionOptions {
    /// Layout of padded-batch tensors. Default [`QkvLayout::Bnhd`].
    pub layout: QkvLayout,
    /// Causal mask, aligned to the bottom-right corner when `Nq != Nk`. Default false.
    pub causal: bool,
    /// Sliding window `(left, right)` as `flash_attn`'s `window_size`: query `i` sees keys
    /// `j` with `i + Nk - Nq - left <= j <= i + Nk - Nq + right`; `-1` is unbounded. With
    /// `causal`, `right` is forced to 0. Default `(-1, -1)`.
    pub window: (i32, i32),
    /// Softmax scale; `None` = `1/sqrt(D)`. Must be finite and positive.
    pub scale: Option<f32>,
    /// Logit softcap: scores become `softcap * tanh(score / softcap)`; 0 = off. Must be finite
    /// and >= 0.
    pub softcap: f32,
    /// Also compute the f32 log-sum-exp. Default false.
    pub return_lse: bool,
    /// Kernel choices forced for benchmarks and experiments. Default: the dispatcher's.
    pub tuning: AttentionTuning,
}

impl Default for AttentionOptions {
    fn default() -> Self {
        AttentionOptions {
            layout: QkvLayout::Bnhd,
            causal: false,
            window: (-1, -1),
            scale: None,
            softcap: 0.0,
            return_lse: false,
            tuning: AttentionTuning::default(),
        }
    }
}

impl AttentionOptions {
    /// The effective `(left, right)` window with causal folded in (`-1` = unbounded).
    pub fn effective_window(&self) -> (i32, i32) {
        let (l, r) = self.window;
        (l.max(-1), if self.causal { 0 } else { r.max(-1) })
    }
    /// True when some key can be masked for some query (besides the sequence ends).
    pub fn is_masked(&self) -> bool {
        self.effective_window() != (-1, -1)
    }
    /// The effective window for sequences of at most `max_q` queries and `max_k` keys: a side
    /// that cannot mask anything there (`left >= max_k`, `right >= max_q`) becomes unbounded
    /// (-1). Exact under the bottom-right rule, and keeps the kernels' 32-bit mask arithmetic
    /// (`i + Nk - Nq + right + 1`) far from overflow for windows near `i32::MAX`.
    pub fn window_for(&self, max_q: usize, max_k: usize) -> (i32, i32) {
        let (l, r) = self.effective_window();
        let l = if l >= 0 && l as usize >= max_k { -1 } else { l };
        let r = if r >= 0 && r as usize >= max_q { -1 } else { r };
        (l, r)
    }
    /// The effective softmax scale for head dimension `d`.
    pub fn effective_scale(&self, d: usize) -> f32 {
        self.scale.unwrap_or(1.0 / (d as f32).sqrt())
    }
}

/// Checks `cu_seqlens_q/k` of a varlen batch: the same number of entries (batch + 1 >= 2),
/// each starting at 0 and non-decreasing (zero-length sequences are allowed). Returns the
/// longest query and key sequence.
pub fn validate_cu_seqlens(cu_seqlens_q: &[i32], cu_seqlens_k: &[i32]) -> Result<(usize, usize)> {
    fn check(name: &str, cu: &[i32]) -> Result<usize> {
        if cu.len() < 2 {
            return Err(Error::invalid(
                "cu_seqlens",
                format!("{name} must have batch + 1 >= 2 entries, got {}", cu.len()),
            ));
        }
        if cu[0] != 0 {
            return Err(Error::invalid(
                "cu_seqlens",
                format!("{name}[0] must be 0, got {}", cu[0]),
            ));
        }
        let mut max = 0usize;
        for (b, w) in cu.windows(2).enumerate() {
            if w[1] < w[0] {
                return Err(Error::invalid(
                    "cu_seqlens",
                    format!(
                        "{name} must be non-decreasing: {name}[{}] = {} < {name}[{b}] = {}",
                        b + 1,
                        w[1],
                        w[0]
                    ),
                ));
            }
            max = max.max((w[1] - w[0]) as usize);
        }
        Ok(max)
    }
    let max_q = check("cu_seqlens_q", cu_seqlens_q)?;
    let max_k = check("cu_seqlens_k", cu_seqlens_k)?;
    if cu_seqlens_q.len() != cu_seqlens_k.len() {
        return Err(Error::invalid(
            "cu_seqlens",
            format!(
                "cu_seqlens_q has {} entries but cu_seqlens_k has {} (both must be batch + 1)",
                cu_seqlens_q.len(),
                cu_seqlens_k.len()
            ),
        ));
    }
    Ok((max_q, max_k))
}

/// The sizes of a packed variable-length batch: what validation and planning need from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VarlenShape {
    /// Number of sequences (`cu_seqlens` has `batch + 1` entries).
    pub batch: usize,
    /// Rows of the packed query tensor (`[total_q, Hq, D]`).
    pub total_q: usize,
    /// Rows of the packed key/value tensors.
    pub total_k: usize,
    /// Longest query sequence.
    pub max_seqlen_q: usize,
    /// Longest key sequence.
    pub max_seqlen_k: usize,
}

impl VarlenShape {
    /// The shape of host `cu_seqlens_q/k`, checked by [`validate_cu_seqlens`]; the totals are
    /// their last entries.
    pub fn of_cu_seqlens(cu_seqlens_q: &[i32], cu_seqlens_k: &[i32]) -> Result<VarlenShape> {
        let (max_q, max_k) = validate_cu_seqlens(cu_seqlens_q, cu_seqlens_k)?;
        Ok(VarlenShape {
            batch: cu_seqlens_q.len() - 1,
            total_q: *cu_seqlens_q.last().unwrap_or(&0) as usize,
            total_k: *cu_seqlens_k.last().unwrap_or(&0) as usize,
            max_seqlen_q: max_q,
            max_seqlen_k: max_k,
        })
    }

    /// Checks what can be checked without the offsets: at least one sequence, the maxima within
    /// the totals, and every count within the kernels' 32-bit offsets.
    pub fn validate(&self) -> Result<()> {
        if self.batch == 0 {
            return Err(Error::invalid(
                "cu_seqlens",
                "must have batch + 1 >= 2 entries, got batch 0",
            ));
        }
        for (name, max, total) in [
            ("max_seqlen_q", self.max_seqlen_q, self.total_q),
            ("max_seqlen_k", self.max_seqlen_k, self.total_k),
        ] {
            if max > total {
                return Err(Error::invalid(
                    name,
                    format!("{name} = {max} exceeds the {total} packed rows"),
                ));
            }
        }
        let limit = i32::MAX as usize;
        if self.total_q > limit || self.total_k > limit || self.batch >= limit {
            return Err(Error::invalid(
                "cu_seqlens",
                format!(
                    "batch {} with {} query and {} key rows exceeds the 32-bit offsets of cu_seqlens",
                    self.batch, self.total_q, self.total_k
                ),
            ));
        }
        Ok(())
    }
}

/// A packed variable-length batch: sequence `b` owns rows `cu_seqlens[b] .. cu_seqlens[b + 1]`
/// of the `[total, H, D]` tensors. Built once (validated on the host, uploaded), used by many
/// runs; or, with [`VarlenBatch::from_device`], described by offsets already on the device.
#[derive(Debug)]
pub struct VarlenBatch {
    /// Host copies of `cu_seqlens_q/k` (`None` for a batch made with `from_device`).
    host: Option<(Vec<i32>, Vec<i32>)>,
    /// The uploaded offsets this batch owns (`None` when it borrows them).
    _owned: Option<(DeviceBuffer<i32>, DeviceBuffer<i32>)>,
    /// Device addresses of `cu_seqlens_q/k`.
    ptrs: (u64, u64),
    shape: VarlenShape,
}

impl VarlenBatch {
    /// Validates `cu_seqlens_q/k` (same length >= 2, start at 0, non-decreasing, within i32) and
    /// uploads them. Zero-length sequences are allowed.
    pub fn new(ctx: &Context, cu_seqlens_q: &[i32], cu_seqlens_k: &[i32]) -> Result<VarlenBatch> {
        let shape = VarlenShape::of_cu_seqlens(cu_seqlens_q, cu_seqlens_k)?;
        let (cu_q, cu_k) = (ctx.upload(cu_seqlens_q)?, ctx.upload(cu_seqlens_k)?);
        Ok(VarlenBatch {
            host: Some((cu_seqlens_q.to_vec(), cu_seqlens_k.to_vec())),
            ptrs: (cu_q.device_ptr(), cu_k.device_ptr()),
            _owned: Some((cu_q, cu_k)),
            shape,
        })
    }

    /// A batch whose `cu_seqlens_q/k` (i32, `shape.batch + 1` entries each) already live in
    /// device memory owned by someone else (another library's tensors), as `flash_attn`
    /// takes them: nothing is copied or read on the host, so nothing synchronises. Only
    /// `shape` is validated ([`VarlenShape::validate`]).
    ///
    /// # Safety
    /// For as long as runs using this batch may execute on the device:
    /// - `cu_seqlens_q` and `cu_seqlens_k` are device addresses of this context's device, each
    ///   valid for `shape.batch + 1` i32 values and 4-byte aligned;
    /// - their contents follow [`validate_cu_seqlens`]'s rules (start at 0, non-decreasing),
    ///   end at most at `shape.total_q` / `shape.total_k`, and no sequence is longer than
    ///   `shape.max_seqlen_q` / `shape.max_seqlen_k`.
    ///
    /// Offsets past the totals make the kernels read and write outside the tensors; longer
    /// sequences than the maxima leave query rows unwritten.
    pub unsafe fn from_device(cu_seqlens_q: u64, cu_seqlens_k: u64, shape: VarlenShape) -> Result<VarlenBatch> {
        shape.validate()?;
        for (name, p) in [("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)] {
            if p == 0 || p % 4 != 0 {
                return Err(Error::invalid(
                    name,
                    format!("{name} device address {p:#x} is null or not 4-byte aligned"),
                ));
            }
        }
        Ok(VarlenBatch {
            host: None,
            _owned: None,
            ptrs: (cu_seqlens_q, cu_seqlens_k),
            shape,
        })
    }

    pub fn batch(&self) -> usize {
        self.shape.batch
    }
    pub fn total_q(&self) -> usize {
        self.shape.total_q
    }
    pub fn total_k(&self) -> usize {
        self.shape.total_k
    }
    pub fn max_seqlen_q(&self) -> usize {
        self.shape.max_seqlen_q
    }
    pub fn max_seqlen_k(&self) -> usize {
        self.shape.max_seqlen_k
    }
    /// The sizes of the batch.
    pub fn shape(&self) -> VarlenShape {
        self.shape
    }
    /// The host copy of `cu_seqlens_q` (`None` for a batch made with [`VarlenBatch::from_device`]).
    pub fn cu_seqlens_q(&self) -> Option<&[i32]> {
        self.host.as_ref().map(|h| h.0.as_slice())
    }
    /// The host copy of `cu_seqlens_k` (`None` for a batch made with [`VarlenBatch::from_device`]).
    pub fn cu_seqlens_k(&self) -> Option<&[i32]> {
        self.host.as_ref().map(|h| h.1.as_slice())
    }
    pub(crate) fn device_ptrs(&self) -> (u64, u64) {
        self.ptrs
    }
}

/// The sizes of one attention problem (what a plan is built for).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionProblem {
    pub batch: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    /// Queries per sequence (varlen: the maximum).
    pub seqlen_q: usize,
    /// Keys per sequence (varlen: the maximum).
    pub seqlen_k: usize,
    pub head_dim: usize,
    pub dtype: DType,
    /// `Some((total_q, total_k))` for a packed variable-length batch.
    pub varlen: Option<(usize, usize)>,
}

impl AttentionProblem {
    /// A padded batch.
    pub fn padded(
        batch: usize,
        heads_q: usize,
        heads_kv: usize,
        seqlen_q: usize,
        seqlen_k: usize,
        head_dim: usize,
        dtype: DType,
    ) -> AttentionProblem {
        AttentionProblem {
            batch,
            heads_q,
            heads_kv,
            seqlen_q,
            seqlen_k,
            head_dim,
            dtype,
            varlen: None,
        }
    }

    /// A packed variable-length batch.
    pub fn varlen(batch: &VarlenBatch, heads_q: usize, heads_kv: usize, head_dim: usize, dtype: DType) -> Self {
        AttentionProblem {
            batch: batch.batch(),
            heads_q,
            heads_kv,
            seqlen_q: batch.max_seqlen_q(),
            seqlen_k: batch.max_seqlen_k(),
            head_dim,
            dtype,
            varlen: Some((batch.total_q(), batch.total_k())),
        }
    }

    /// Reads the problem off Q/K/V views: rank 4 in `layout` for a padded batch, rank 3
    /// `[total, H, D]` with `varlen`.
    pub fn of_views(
        q: &TensorView,
        k: &TensorView,
        v: &TensorView,
        layout: QkvLayout,
        varlen: Option<&VarlenBatch>,
    ) -> Result<AttentionProblem> {
        Self::of_descs_shape(
            &TensorDesc::of(q),
            &TensorDesc::of(k),
            &TensorDesc::of(v),
            layout,
            varlen.map(VarlenBatch::shape),
        )
    }

    /// [`AttentionProblem::of_views`] on shapes, strides and dtypes alone (no device memory):
    /// `varlen` is `(cu_seqlens_q, cu_seqlens_k)`, checked by [`validate_cu_seqlens`].
    pub fn of_descs(
        q: &TensorDesc,
        k: &TensorDesc,
        v: &TensorDesc,
        layout: QkvLayout,
        varlen: Option<(&[i32], &[i32])>,
    ) -> Result<AttentionProblem> {
        Self::of_descs_with(q, k, v, layout, varlen.map(|(cq, ck)| Varlen::Host(cq, ck)))
    }

    /// [`AttentionProblem::of_descs`] for a varlen batch known by its [`VarlenShape`] alone (its
    /// offsets on the device, as [`VarlenBatch::from_device`]): the packed row counts must be
    /// the shape's totals.
    pub fn of_descs_shape(
        q: &TensorDesc,
        k: &TensorDesc,
        v: &TensorDesc,
        layout: QkvLayout,
        varlen: Option<VarlenShape>,
    ) -> Result<AttentionProblem> {
        Self::of_descs_with(q, k, v, layout, varlen.map(Varlen::Shape))
    }

    fn of_descs_with(
        q: &TensorDesc,
        k: &TensorDesc,
        v: &TensorDesc,
        layout: QkvLayout,
        varlen: Option<Varlen>,
    ) -> Result<AttentionProblem> {
        let dq = dims(q, "q", layout, varlen.is_some())?;
        let dk = dims(k, "k", layout, varlen.is_some())?;
        let dv = dims(v, "v", layout, varlen.is_some())?;
        if q.dtype != k.dtype || q.dtype != v.dtype {
            return Err(Error::invalid(
                "q/k/v",
                format!(
                    "q, k and v must share a dtype, got {}, {} and {}",
                    q.dtype, k.dtype, v.dtype
                ),
            ));
        }
        if dk != dv {
            return Err(Error::invalid(
                "k/v",
                format!("k and v must have the same shape, got {:?} and {:?}", k.shape, v.shape),
            ));
        }
        if dq.0 != dk.0 || dq.3 != dk.3 {
            return Err(Error::invalid(
                "q/k/v",
                format!(
                    "q and k must agree in batch and head dim, got q {:?} and k {:?}",
                    q.shape, k.shape
                ),
            ));
        }
        let p = match varlen {
            Some(vl) => {
                let (shape, host) = match vl {
                    Varlen::Host(cu_q, cu_k) => (VarlenShape::of_cu_seqlens(cu_q, cu_k)?, true),
                    Varlen::Shape(s) => {
                        s.validate()?;
                        (s, false)
                    }
                };
                let (total_q, total_k) = (shape.total_q, shape.total_k);
                if dq.1 != total_q || dk.1 != total_k {
                    let rule = if host {
                        format!(
                            "varlen q has {} rows and k {} rows, but cu_seqlens_q ends at {total_q} and \
                             cu_seqlens_k at {total_k} (they must end at the packed lengths)",
                            dq.1, dk.1
                        )
                    } else {
                        format!(
                            "varlen q has {} rows and k {} rows, but the batch was described with \
                             total_q = {total_q} and total_k = {total_k}",
                            dq.1, dk.1
                        )
                    };
                    return Err(Error::invalid("cu_seqlens", rule));
                }
                AttentionProblem {
                    batch: shape.batch,
                    heads_q: dq.2,
                    heads_kv: dk.2,
                    seqlen_q: shape.max_seqlen_q,
                    seqlen_k: shape.max_seqlen_k,
                    head_dim: dq.3,
                    dtype: q.dtype,
                    varlen: Some((total_q, total_k)),
                }
            }
            None => AttentionProblem::padded(dq.0, dq.2, dk.2, dq.1, dk.1, dq.3, q.dtype),
        };
        p.validate()?;
        Ok(p)
    }

    /// Checks the sizes against what the kernels support.
    pub fn validate(&self) -> Result<()> {
        if !matches!(self.dtype, DType::F16 | DType::BF16) {
            return Err(Error::Unsupported(format!(
                "attention dtype {}: supported are fp16 and bf16",
                self.dtype
            )));
        }
        if self.head_dim == 0 || self.head_dim > MAX_HEAD_DIM || self.head_dim % 8 != 0 {
            return Err(Error::Unsupported(format!(
                "attention head dim {}: supported are multiples of 8 up to {MAX_HEAD_DIM}",
                self.head_dim
            )));
        }
        if self.heads_q == 0 || self.heads_kv == 0 || self.heads_q % self.heads_kv != 0 {
            return Err(Error::invalid(
                "heads_q",
                format!(
                    "heads_q ({}) must be a positive multiple of heads_kv ({})",
                    self.heads_q, self.heads_kv
                ),
            ));
        }
        let rows_q = self.varlen.map_or(self.batch.saturating_mul(self.seqlen_q), |(t, _)| t);
        let rows_k = self.varlen.map_or(self.batch.saturating_mul(self.seqlen_k), |(_, t)| t);
        // Row indices (and row * heads for LSE / partials) are 32-bit in places on the device.
        let limit = i32::MAX as usize - 1024; // headroom for tile-end arithmetic (n0 + kBlockN)
        if rows_q.saturating_mul(self.heads_q) > limit || rows_k.saturating_mul(self.heads_kv) > limit {
            return Err(Error::Unsupported(format!(
                "attention with {rows_q} query rows x {} heads (or {rows_k} key rows x {} heads) exceeds \
                 the 32-bit row index range ({limit})",
                self.heads_q, self.heads_kv
            )));
        }
        Ok(())
    }

    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.heads_q / self.heads_kv
    }

    /// Exact FLOPs of the two GEMMs with a mask applied (causal ~ half), for TFLOP/s reports:
    /// `4 * D * (visible (query, key) pairs)` summed over heads. For varlen pass the lengths.
    pub fn flops(&self, opts: &AttentionOptions, lengths: &[(usize, usize)]) -> f64 {
        let (left, right) = opts.effective_window();
        let pairs: f64 = lengths
            .iter()
            .map(|&(nq, nk)| visible_pairs(nq, nk, left, right) as f64)
            .sum();
        4.0 * self.head_dim as f64 * self.heads_q as f64 * pairs
    }
}

/// Number of (query, key) pairs visible under the bottom-right aligned window.
pub fn visible_pairs(nq: usize, nk: usize, left: i32, right: i32) -> u64 {
    (0..nq as i64)
        .map(|i| {
            let (lo, hi) = visible_keys(i, nq, nk, left, right);
            (hi - lo).max(0) as u64
        })
        .sum()
}

/// The keys `[lo, hi)` query `i` of `nq` sees among `nk` under the bottom-right aligned window
/// (`left` / `right` of `-1` unbounded; as ts::AttnMask's first_key / end_key); none when
/// `hi <= lo`.
pub(crate) fn visible_keys(i: i64, nq: usize, nk: usize, left: i32, right: i32) -> (i64, i64) {
    let d = i + nk as i64 - nq as i64;
    let lo = if left < 0 { 0 } else { (d - left as i64).max(0) };
    let hi = if right < 0 {
        nk as i64
    } else {
        (d + right as i64 + 1).clamp(0, nk as i64)
    };
    (lo, hi)
}

/// How a varlen batch is known to validation: by its host offsets or by its sizes alone.
#[derive(Clone, Copy)]
enum Varlen<'a> {
    Host(&'a [i32], &'a [i32]),
    Shape(VarlenShape),
}

/// Shape, strides (elements) and dtype of a tensor argument: what validation needs, without
/// device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorDesc<'a> {
    pub shape: &'a [usize],
    pub strides: &'a [usize],
    pub dtype: DType,
}

impl<'a> TensorDesc<'a> {
    /// The description of a view.
    pub fn of(v: &'a TensorView) -> TensorDesc<'a> {
        TensorDesc {
            shape: v.shape(),
            strides: v.strides(),
            dtype: v.dtype(),
        }
    }
}

/// `(batch, rows, heads, head_dim)` of a Q/K/V view (batch = 1 for varlen).
fn dims(t: &TensorDesc, name: &'static str, layout: QkvLayout, varlen: bool) -> Result<(usize, usize, usize, usize)> {
    let s = t.shape;
    let want = if varlen { 3 } else { 4 };
    if t.strides.len() != s.len() {
        return Err(Error::invalid(
            name,
            format!(
                "{name} has shape {s:?} but strides {:?} (one stride per dim)",
                t.strides
            ),
        ));
    }
    if s.len() != want {
        return Err(Error::invalid(
            name,
            format!(
                "{name} must be rank {want} ({}), got shape {s:?}",
                if varlen {
                    "[total, H, D] for a varlen batch"
                } else if layout == QkvLayout::Bnhd {
                    "[B, N, H, D]"
                } else {
                    "[B, H, N, D]"
                }
            ),
        ));
    }
    if t.strides[want - 1] != 1 {
        return Err(Error::invalid(
            name,
            format!(
                "{name}'s last dimension must be contiguous (stride 1), got strides {:?}",
                t.strides
            ),
        ));
    }
    Ok(if varlen {
        (1, s[0], s[1], s[2])
    } else if layout == QkvLayout::Bnhd {
        (s[0], s[1], s[2], s[3])
    } else {
        (s[0], s[2], s[1], s[3])
    })
}

/// `(stride_b, stride_n, stride_h)` in elements of a view in `layout` (varlen: stride_b = 0).
pub(crate) fn strides_bnh(t: &TensorView, layout: QkvLayout, varlen: bool) -> (i64, i64, i64) {
    let s = t.strides();
    if varlen {
        (0, s[0] as i64, s[1] as i64)
    } else if layout == QkvLayout::Bnhd {
        (s[0] as i64, s[1] as i64, s[2] as i64)
    } else {
        (s[0] as i64, s[2] as i64, s[1] as i64)
    }
}

/// One-shot attention: plans, allocates a contiguous output in q's layout (`[B, Nq, Hq, D]`,
/// `[B, Hq, Nq, D]` or `[total_q, Hq, D]`) and, with `return_lse`, an LSE of `[B, Hq, Nq]` (or
/// `[Hq, total_q]` for varlen), runs, and returns both.
pub fn flash_forward<T: Element>(
    ctx: &Context,
    q: &TensorView,
    k: &TensorView,
    v: &TensorView,
    varlen: Option<&VarlenBatch>,
    options: &AttentionOptions,
) -> Result<(DeviceBuffer<T>, Option<DeviceBuffer<f32>>)> {
    if q.dtype() != T::DTYPE {
        return Err(Error::invalid(
            "q",
            format!("flash_forward::<{}> called with q of dtype {}", T::DTYPE, q.dtype()),
        ));
    }
    let problem = AttentionProblem::of_views(q, k, v, options.layout, varlen)?;
    let plan = AttentionPlan::new(ctx, &problem, options)?;
    let mut out = ctx.alloc::<T>(q.numel())?;
    let shape = q.shape().to_vec();
    let strides = contiguous_strides(&shape);
    let mut lse = if options.return_lse {
        Some(ctx.alloc::<f32>(problem.heads_q * problem.varlen.map_or(problem.batch * problem.seqlen_q, |v| v.0))?)
    } else {
        None
    };
    {
        let mut o = out.view_mut(&shape, &strides)?;
        let mut lse_view = match lse.as_mut() {
            Some(l) => Some(plan.lse_view_mut(l)?),
            None => None,
        };
        plan.run(q, k, v, &mut o, lse_view.as_mut(), varlen)?;
    }
    Ok((out, lse))
}
