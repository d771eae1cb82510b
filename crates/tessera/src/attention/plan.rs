//! Attention dispatch: which kernel (path, tiles, head-dim specialisation, mask and softcap
//! compiled in or not), how many KV splits, and the launch itself.
//!
//! Paths:
//! - [`AttentionPath::Hopper`] (`sm_90a` only): TMA + mbarrier pipeline, wgmma, warp-specialised
//!   producer/consumer warpgroups (`flash_sm90.cu`).
//! - [`AttentionPath::Sm80`] (any `sm_80+`): ldmatrix + mma.sync with cp.async double buffering,
//!   FlashAttention-2 partitioning (`flash_sm80.cu`).
//!
//! Grid of the Ampere kernel: `(B * Hq, q_tiles, splits)`, blocks launched in x-fastest order;
//! the kernel maps each block's linear index to a (batch-head, query tile) pair in sections of
//! [`sm80_head_group`] batch-heads, each section's query tiles longest first (causal) with its
//! heads interleaved: the CTAs resident at once share the K/V of few heads in L2, and the
//! longest tiles still start early. The Hopper kernel is persistent instead: a 1-D grid
//! of at most one CTA per SM walking a static list of (query tile, split, batch-head) items,
//! longest first (see [`super::hopper`]). With `splits > 1` each split writes normalised
//! partial outputs and LSEs to a workspace that `combine.cu` merges with the online-softmax rule.
//! A Hopper plan whose equal items leave a short last wave runs those items in a second,
//! split-KV launch with its own small workspace and merge (the tail split, `TailSplit`).

use std::sync::Arc;

use super::hopper::{self, HopperParams, QkvMapShape};
use super::{
    strides_bnh, AttentionOptions, AttentionProblem, AttentionTuning, QkvLayout, VarlenBatch, DEVICE_HEADERS,
    PARAMS_HEADER,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::runtime::tma::{TensorMap, TmaError};
use crate::runtime::{
    contiguous_strides, Arch, Context, DeviceBuffer, Kernel, KernelKey, KernelParams, KernelSpec, LaunchConfig,
    TensorView, TensorViewMut, WorkCounters,
};

const SM80_SOURCE: &str = include_str!("flash_sm80.cu");
const COMBINE_SOURCE: &str = include_str!("combine.cu");
const SM90_SOURCE: &str = include_str!("flash_sm90.cu");

/// Largest grid y (query tiles per sequence on the Ampere path).
const MAX_GRID_Y: usize = 65535;

/// Most KV splits a plan uses.
pub const MAX_SPLITS: usize = 64;

/// Which forward kernel family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttentionPath {
    /// Hopper where available, else the Ampere kernel.
    Auto,
    /// TMA + wgmma warp-specialised kernel (`sm_90a`).
    Hopper,
    /// ldmatrix + mma.sync kernel (`sm_80` and newer).
    Sm80,
}

impl AttentionPath {
    pub fn name(self) -> &'static str {
        match self {
            AttentionPath::Auto => "auto",
            AttentionPath::Hopper => "hopper",
            AttentionPath::Sm80 => "sm80",
        }
    }
}

/// The launch parameters, mirrored from `ts::AttentionParams` in `attention_params.cuh`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AttentionParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub lse: u64,
    pub cu_seqlens_q: u64,
    pub cu_seqlens_k: u64,
    pub o_partial: u64,
    pub lse_partial: u64,
    pub q_stride_b: i64,
    pub q_stride_n: i64,
    pub q_stride_h: i64,
    pub k_stride_b: i64,
    pub k_stride_n: i64,
    pub k_stride_h: i64,
    pub v_stride_b: i64,
    pub v_stride_n: i64,
    pub v_stride_h: i64,
    pub o_stride_b: i64,
    pub o_stride_n: i64,
    pub o_stride_h: i64,
    pub lse_stride_b: i64,
    pub lse_stride_h: i64,
    pub partial_rows: i64,
    pub batch: i32,
    pub heads_q: i32,
    pub heads_kv: i32,
    pub seqlen_q: i32,
    pub seqlen_k: i32,
    pub head_dim: i32,
    pub window_left: i32,
    pub window_right: i32,
    pub scale_log2: f32,
    pub softcap_scale: f32,
    pub softcap_log2: f32,
    pub num_splits: i32,
    pub q_tiles: i32,
    pub head_group: i32,
    /// Hopper tail launch: `{b, h, i}` per partial row (see `TailSplit`); 0 otherwise.
    pub tail_meta: u64,
}

// SAFETY: plain data matching the C layout of ts::AttentionParams (checked by a test that
// compiles `sizeof` into a kernel and by the field list above).
unsafe impl KernelParams for AttentionParams {}

/// Size of `ts::AttentionParams` in bytes.
pub const PARAMS_BYTES: usize = std::mem::size_of::<AttentionParams>();

/// Compile-time specialisation of one forward kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Variant {
    /// Resolved path: `Hopper` or `Sm80`.
    pub path: AttentionPath,
    pub dtype: DType,
    /// Compiled head dim: 64, 128 or 256 (or the padded generic sizes 32..256 step 32).
    pub head_dim: u32,
    pub block_m: u32,
    pub block_n: u32,
    /// Threads per CTA.
    pub threads: u32,
    /// K/V pipeline depth.
    pub stages: u32,
    /// A window or causal mask is compiled in.
    pub masked: bool,
    pub softcap: bool,
    /// Writes split-KV partials instead of the output.
    pub split: bool,
    /// Hopper: clusters of two CTAs on neighbouring query tiles that share each K/V tile's load
    /// (TMA multicast, [`hopper::use_cta_pairs`]).
    pub pair: bool,
    /// Hopper: built without intra-warpgroup pipelining, one key tile at a time
    /// (`TS_ATTN_SIMPLE_MAINLOOP`; [`AttentionTuning::hopper_simple_mainloop`], a debugging aid).
    pub simple_mainloop: bool,
}

impl Variant {
    /// The specialisation of this variant: its name, preamble and cache hash.
    pub fn key(&self) -> KernelKey {
        let family = match self.path {
            AttentionPath::Hopper => "flash_fwd_hopper",
            _ => "flash_fwd_sm80",
        };
        KernelKey::new(family)
            .ty("Elem", self.dtype)
            .int("kHeadDim", "d", self.head_dim)
            .int("kBlockM", "m", self.block_m)
            .int("kBlockN", "n", self.block_n)
            .int("kThreads", "t", self.threads)
            .int("kStages", "s", self.stages)
            .flag("kMasked", "mask", self.masked)
            .flag("kSoftcap", "softcap", self.softcap)
            .flag("kSplit", "split", self.split)
            .flag("kPair", "pair", self.pair)
            .define(
                "TS_ATTN_SIMPLE_MAINLOOP",
                "simple",
                self.path == AttentionPath::Hopper && self.simple_mainloop,
            )
    }

    /// The kernel spec of this variant.
    pub fn spec(&self) -> KernelSpec {
        match self.path {
            AttentionPath::Hopper => self
                .key()
                .spec("flash_sm90.cu", SM90_SOURCE, "flash_fwd_sm90", DEVICE_HEADERS),
            _ => self
                .key()
                .spec("flash_sm80.cu", SM80_SOURCE, "flash_fwd_sm80", DEVICE_HEADERS),
        }
    }

    /// Dynamic shared memory of a CTA. Ampere: the Q tile plus `stages` K and V tiles of 2-byte
    /// elements, each row padded to a multiple of 64 elements (128 bytes) so that the XOR
    /// swizzle of 16-byte chunks stays inside the row (flash_sm80.cu `kRowElems`). Hopper: the
    /// same tiles (its head dim is already a multiple of 64) plus mbarriers and alignment slack.
    pub fn shared_bytes(&self) -> u32 {
        match self.path {
            AttentionPath::Hopper => hopper::shared_bytes(self.block_m, self.block_n, self.stages, self.head_dim),
            _ => {
                let row = self.head_dim.div_ceil(64) * 64;
                (self.block_m + 2 * self.stages * self.block_n) * row * 2
            }
        }
    }
}

/// The combine kernel merging split-KV partials into the output and LSE.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CombineVariant {
    pub dtype: DType,
    pub head_dim: u32,
}

impl CombineVariant {
    /// Threads per CTA of the combine kernel: one warp per (row, head), 4 warps.
    pub const THREADS: u32 = 128;
    pub fn key(&self) -> KernelKey {
        KernelKey::new("flash_combine")
            .ty("Elem", self.dtype)
            .int("kHeadDim", "d", self.head_dim)
            .int("kThreads", "t", Self::THREADS)
    }

    pub fn spec(&self) -> KernelSpec {
        self.key()
            .spec("combine.cu", COMBINE_SOURCE, "flash_combine", DEVICE_HEADERS)
    }
}

/// Head dim the kernels are compiled for: 64, 128, 256 exactly, others rounded up to a
/// multiple of 32 (zero-padded on load, masked on store).
pub fn compiled_head_dim(d: usize) -> u32 {
    match d {
        64 | 128 | 256 => d as u32,
        _ => d.div_ceil(32) as u32 * 32,
    }
}

/// Tiles of the Ampere kernel for a compiled head dim: `(block_m, block_n, threads, stages)`.
/// Each warp owns `block_m / (threads / 32)` query rows (whole m16 blocks; flash_sm80.cu).
/// - D <= 64: FlashAttention-2's 4 warps of 32 rows (every K/V fragment feeds two row blocks:
///   half the ldmatrix traffic per MMA), 64 keys per tile, 3 stages (64 KiB), Q re-read from
///   shared memory: 236-242 registers, two CTAs per SM. (8 warps of 16 rows over 128 x 128
///   tiles took 174 registers, so one CTA per SM.)
/// - D <= 128: the same 4 warps of 32 rows. Where two such CTAs of 96 KiB fit an SM
///   (`shared_per_sm`, the device's shared memory per multiprocessor: Hopper's 228 KiB), 64 keys
///   per tile and 2 stages: the 2 x (D / 2) accumulator and the 2 x 32 scores fit in 255
///   registers with lazy rescaling (flash_sm80.cu, tuning steps 3-4: H200 up to 18% faster than
///   32-key tiles, bench/NOTES.md runs 25-26 and 32).
///   Otherwise (A100's 164 KiB would hold one such CTA, sm_86 / sm_89 hold one of either), and
///   with a softcap (its tanh needs more registers), 32 keys per tile and 3 stages (80 KiB).
/// - larger D: 64 x 32 over 4 warps, 16 rows each, Q re-read from shared memory.
///
/// Every choice keeps the shared memory within 96 KiB, so it also fits sm_86 / sm_89 (99 KiB).
pub fn sm80_tiles(head_dim: u32, softcap: bool, shared_per_sm: u32) -> (u32, u32, u32, u32) {
    sm80_tiles_keyed(head_dim, softcap, shared_per_sm >= SM80_WIDE_TILE_MIN_SHARED_PER_SM)
}

/// As [`sm80_tiles`], with the 64-key D <= 128 tile taken when `wide` (no softcap) instead of
/// by the shared memory: what `AttentionTuning::sm80_block_n` forces.
pub fn sm80_tiles_keyed(head_dim: u32, softcap: bool, wide: bool) -> (u32, u32, u32, u32) {
    match head_dim {
        0..=64 => (128, 64, 128, 3),
        65..=128 if !softcap && wide => (128, 64, 128, 2),
        65..=128 => (128, 32, 128, 3),
        _ => (64, 32, 128, 2),
    }
}

/// Shared memory per SM that holds two CTAs of the Ampere kernel's 64-key D <= 128 tile (96 KiB
/// each plus the 1 KiB the driver reserves per CTA).
pub const SM80_WIDE_TILE_MIN_SHARED_PER_SM: u32 = 2 * (96 * 1024 + 1024);

/// The shared memory per SM of the GPUs of `arch` (CUDA C++ Programming Guide, table of
/// compute capabilities): 164 KiB on sm_80 / sm_87, 228 KiB on sm_90 and sm_100, 100 KiB on
/// sm_86 / sm_89; None for an architecture not listed. It decides the Ampere kernel's tiling
/// ([`sm80_tiles`]), so CI compiles for each arch the tilings its GPUs can get.
pub fn shared_per_sm_of(arch: Arch) -> Option<u32> {
    match (arch.major, arch.minor) {
        (8, 0) | (8, 7) => Some(164 * 1024),
        (8, 6) | (8, 9) => Some(100 * 1024),
        (9, 0) | (10, 0) => Some(228 * 1024),
        _ => None,
    }
}

/// Waves of resident CTAs one section of a work order aims to fill (both kernels).
pub const SECTION_WAVES: usize = 4;

/// The fewest batch-heads of `items_per_head` work items each that fill [`SECTION_WAVES`] waves
/// of `resident_ctas`, between 1 and `max_heads`.
pub fn heads_for_waves(resident_ctas: usize, items_per_head: usize, max_heads: usize) -> usize {
    (SECTION_WAVES * resident_ctas.max(1))
        .div_ceil(items_per_head.max(1))
        .clamp(1, max_heads.max(1))
}

/// Waves of resident CTAs an Ampere section aims for where the heads' K/V together exceed L2 but
/// one head's does not (see [`sm80_head_group`]).
pub const SM80_SECTION_WAVES: f64 = 2.0;

/// Batch-heads per section of the Ampere kernel's work order (flash_sm80.cu, `work_tile`), for
/// `batch_heads` query heads of `q_tiles` query tiles each, `kv_group` query heads per K/V head,
/// `kv_bytes_per_head` bytes of K and V per K/V head and `resident_ctas` CTAs on the GPU at once.
/// - One head's K/V over a quarter of L2: the CTAs that run every head's same query tile
///   together drift apart along their heads' keys faster than L2 keeps them, so sections of the
///   fewest heads that hold [`SECTION_WAVES`] (4) waves: within a section the longest causal
///   tiles start first and the next section fills in behind them, while the CTAs running
///   together read the K/V of few heads and L2 serves it to many of them.
/// - Else, where all heads' K/V exceed L2: sections of the divisor of `batch_heads` nearest (by
///   ratio) to [`SM80_SECTION_WAVES`] (2) waves, between half and twice that, whose K/V fit L2.
///   Only divisors: the kernel's last section takes the remainder, and a short last section
///   leaves the launch's tail to a fraction of a wave (9-head sections of 32 heads lost 4.5-8%
///   at causal N = 4096 and 8192). No such divisor: one section.
/// - Else one section: every head's same query tile together, globally longest first.
///
/// H200 (132 SMs x 2 CTAs, 60 MiB L2), bench/NOTES.md runs 118-119, one binary, three rounds,
/// sections of this rule against one section: causal fp16 B=1 H=32 D=128 N = 4096 (16 heads)
/// 1.015x, 8192 (8) 1.005x, 16384 (4) 1.021x; non-causal bf16 B=4 H=16 N=8192 (8) D64 1.044x,
/// D128 1.048x; GQA B=4 32/8 N=4096 (16) 1.010x; varlen (8) 1.051x; N = 2048 and below (K/V in
/// L2) one section as before. Run 33: N = 32768 (16 MiB of K/V per head) 23.5-23.9 ms with
/// sections of 4-8 heads against 24.3-24.4 with one (L2 hits 96% against 63%). Sections of less
/// than a wave lose up to 40% at N = 2048.
pub fn sm80_head_group(
    batch_heads: usize,
    q_tiles: usize,
    resident_ctas: usize,
    kv_group: usize,
    kv_bytes_per_head: usize,
    l2_bytes: usize,
) -> usize {
    let heads = batch_heads.max(1);
    let group = kv_group.clamp(1, heads);
    if kv_bytes_per_head.saturating_mul(4) > l2_bytes {
        return heads_for_waves(resident_ctas, q_tiles, heads);
    }
    let kv_bytes_of = |h: usize| h.div_ceil(group).saturating_mul(kv_bytes_per_head);
    if kv_bytes_of(heads) <= l2_bytes {
        return heads;
    }
    let ideal = SM80_SECTION_WAVES * resident_ctas.max(1) as f64 / q_tiles.max(1) as f64;
    (1..heads)
        .filter(|&h| heads % h == 0 && kv_bytes_of(h) <= l2_bytes)
        .filter(|&h| (h as f64) >= ideal / 2.0 && (h as f64) <= ideal * 2.0)
        .min_by(|&a, &b| {
            let off = |h: usize| (h as f64 / ideal).ln().abs();
            off(a).total_cmp(&off(b))
        })
        .unwrap_or(heads)
}

/// The Hopper kernel's persistent launch, fixed by the problem (computed once by the plan).
struct HopperLaunch {
    /// Persistent CTAs ([`hopper_grid`]; with CTA pairs two per cluster).
    grid: u32,
    /// Work items of the whole problem: `q_tiles * splits * B * Hq`, with CTA pairs
    /// `ceil(q_tiles / 2) * B * Hq` (the tail split, if any, takes the last ones).
    work_items: usize,
    /// Batch-heads per L2 section ([`hopper::l2_section_heads`]); the tail launch decodes its
    /// items in this launch's order, so it passes the same value.
    l2_heads: i32,
    /// The scheduler state ([`hopper::scheduler_len`]): the tile counter (zeroed by the plan;
    /// every launch leaves it at zero) and the CTAs' work slots. Launches of one plan are
    /// ordered on its context's stream.
    scheduler: WorkCounters,
}

/// The second launch of a Hopper plan whose work items leave a short last wave
/// ([`hopper::tail_split`]): the split-KV variant of the plan's kernel runs the last `items`
/// items of the first launch's order, `splits` ways each, into its own workspace, and the
/// combine kernel merges them through `meta` (flash_sm90.cu, combine.cu).
struct TailSplit {
    items: usize,
    splits: usize,
    kernel: Arc<Kernel>,
    combine: Arc<Kernel>,
    /// `splits * rows * (head_dim + 1)` f32: partial outputs, then LSEs (rows = items * block_m).
    workspace: DeviceBuffer<f32>,
    /// `{b, h, i}` per partial row, written by the tail launch (b = -1 until then).
    meta: DeviceBuffer<i32>,
    /// Its own scheduler state: the first launch's last draw resets that one's counter.
    scheduler: WorkCounters,
    /// Its persistent CTAs ([`hopper_grid`] of `items * splits`).
    grid: u32,
}

/// A plan: the kernels, the split count and the workspace for one problem.
pub struct AttentionPlan {
    ctx: Context,
    problem: AttentionProblem,
    options: AttentionOptions,
    variant: Variant,
    kernel: Arc<Kernel>,
    combine: Option<Arc<Kernel>>,
    splits: usize,
    q_tiles: usize,
    /// The Ampere kernel's work-order section ([`sm80_head_group`]).
    head_group: usize,
    /// Split-KV workspace: partial outputs then partial LSEs (f32).
    workspace: Option<DeviceBuffer<f32>>,
    /// Hopper path: the persistent launch's shape and scheduler state.
    hopper: Option<HopperLaunch>,
    /// Hopper path: the tail split ([`hopper::tail_split`]), when the plan takes it.
    tail: Option<TailSplit>,
    /// Under `Auto` on Hopper: the Ampere plan used for views that TMA cannot describe
    /// (misaligned base or strides), built on first need.
    fallback: std::sync::OnceLock<Box<AttentionPlan>>,
}

impl std::fmt::Debug for AttentionPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttentionPlan")
            .field("problem", &self.problem)
            .field("variant", &self.variant)
            .field("splits", &self.splits)
            .finish()
    }
}

/// Validates the options for a head dim (pure: no device needed).
pub fn validate_options(o: &AttentionOptions, d: usize) -> Result<()> {
    if let Some(s) = o.scale {
        if !(s.is_finite() && s > 0.0) {
            return Err(Error::invalid(
                "scale",
                format!("softmax scale must be finite and > 0, got {s}"),
            ));
        }
    }
    if !(o.softcap.is_finite() && o.softcap >= 0.0) {
        return Err(Error::invalid(
            "softcap",
            format!("softcap must be finite and >= 0 (0 = off), got {}", o.softcap),
        ));
    }
    if o.window.0 < -1 || o.window.1 < -1 {
        return Err(Error::invalid(
            "window",
            format!("window sizes must be >= -1 (-1 = unbounded), got {:?}", o.window),
        ));
    }
    if let Some(s) = o.tuning.num_splits {
        if s == 0 || s > MAX_SPLITS {
            return Err(Error::invalid(
                "num_splits",
                format!("num_splits must be 1..={MAX_SPLITS}, got {s}"),
            ));
        }
    }
    if let Some(n) = o.tuning.hopper_block_n {
        // Only head dims that have the long tiling have a choice to force.
        let choices = hopper::block_n_choices(hopper::head_dim(d));
        if !choices.contains(&hopper::LONG_BLOCK_N) || !choices.contains(&n) {
            return Err(Error::invalid(
                "hopper_block_n",
                format!(
                    "hopper_block_n must be 128 or {} and applies to head dims 65..=128, got {n} at D = {d}",
                    hopper::LONG_BLOCK_N
                ),
            ));
        }
    }
    if o.tuning.sm80_heads_per_section == Some(0) {
        return Err(Error::invalid(
            "sm80_heads_per_section",
            "sm80_heads_per_section must be >= 1, got 0",
        ));
    }
    if o.tuning.hopper_max_ctas == Some(0) {
        return Err(Error::invalid("hopper_max_ctas", "hopper_max_ctas must be >= 1, got 0"));
    }
    if let Some(n) = o.tuning.sm80_block_n {
        if n != 32 && n != 64 {
            return Err(Error::invalid(
                "sm80_block_n",
                format!("sm80_block_n must be 32 or 64, got {n}"),
            ));
        }
        if o.softcap > 0.0 || !(65..=128).contains(&d) {
            return Err(Error::invalid(
                "sm80_block_n",
                format!(
                    "sm80_block_n applies to head dims 65..=128 without softcap, got D = {d}, softcap {}",
                    o.softcap
                ),
            ));
        }
    }
    Ok(())
}

/// The Hopper kernel's persistent grid: [`hopper::grid`], capped by
/// `AttentionTuning::hopper_max_ctas`.
fn hopper_grid(work_items: usize, sm_count: u32, max_ctas: Option<usize>) -> u32 {
    let g = hopper::grid(work_items, sm_count);
    max_ctas.map_or(g, |m| g.min(m.clamp(1, u32::MAX as usize) as u32))
}

/// Device addresses of a split-KV workspace's partial outputs and of its LSEs, which follow
/// `o_len` output floats.
fn partial_ptrs(workspace: &DeviceBuffer<f32>, o_len: usize) -> (u64, u64) {
    (workspace.device_ptr(), workspace.device_ptr() + (o_len * 4) as u64)
}

/// Device addresses of a Hopper scheduler buffer's tile counter and work slots
/// ([`hopper::scheduler_len`]).
fn scheduler_ptrs(scheduler: &WorkCounters) -> (u64, u64) {
    (scheduler.ptr(), scheduler.ptr_at(hopper::SCHEDULER_SLOTS_OFFSET))
}

/// The combine kernel's launch: one warp per partial row (and head) of `warp_items`.
fn combine_config(warp_items: usize) -> LaunchConfig {
    let warps = (CombineVariant::THREADS / 32) as usize;
    LaunchConfig::linear(warp_items.div_ceil(warps) as u32, CombineVariant::THREADS, 0)
}

/// FlashAttention-2's rule: split only while the CTAs do not fill the GPU, choosing the
/// smallest split count whose wave efficiency is within 85% of the best.
pub fn choose_splits(ctas: usize, sms: usize, k_tiles: usize) -> usize {
    if ctas == 0 || ctas * 5 >= sms * 4 || k_tiles < 2 {
        return 1;
    }
    let max = MAX_SPLITS.min(sms).min(k_tiles);
    let eff = |s: usize| {
        let n = (ctas * s) as f64 / sms as f64;
        n / n.ceil()
    };
    let best = (1..=max).map(eff).fold(0.0f64, f64::max);
    (1..=max).find(|&s| eff(s) >= 0.85 * best).unwrap_or(1)
}

impl AttentionPlan {
    /// Chooses the kernel and split count, compiles (or loads) the kernels and allocates the
    /// split workspace.
    pub fn new(ctx: &Context, problem: &AttentionProblem, options: &AttentionOptions) -> Result<AttentionPlan> {
        problem.validate()?;
        validate_options(options, problem.head_dim)?;
        let arch = ctx.arch();
        let path = resolve_path(options.tuning.path, arch)?;
        let (head_dim, (block_m, block_n, threads, stages)) = match path {
            AttentionPath::Hopper => {
                let d = hopper::head_dim(problem.head_dim);
                let block_n = options.tuning.hopper_block_n.unwrap_or_else(|| {
                    hopper::choose_block_n(
                        d,
                        problem.seqlen_q,
                        problem.seqlen_k,
                        options.window_for(problem.seqlen_q, problem.seqlen_k),
                        problem.varlen.is_some(),
                    )
                });
                (d, hopper::tiles(d, block_n)?)
            }
            _ => {
                let d = compiled_head_dim(problem.head_dim);
                let softcap = options.softcap > 0.0;
                let tiles = match options.tuning.sm80_block_n {
                    Some(n) => sm80_tiles_keyed(d, softcap, n == 64),
                    None => sm80_tiles(d, softcap, ctx.info().max_shared_per_sm),
                };
                (d, tiles)
            }
        };
        let q_tiles = problem.seqlen_q.div_ceil(block_m as usize).max(1);
        if path != AttentionPath::Hopper && q_tiles > MAX_GRID_Y {
            // The Ampere grid puts query tiles on y (at most 65535 blocks).
            return Err(Error::Unsupported(format!(
                "{} queries per sequence need {q_tiles} query tiles of {block_m} on the {} path, more \
                 than its {MAX_GRID_Y}; split the sequence",
                problem.seqlen_q,
                path.name()
            )));
        }
        let k_tiles = problem.seqlen_k.div_ceil(block_n as usize);
        let splits = match options.tuning.num_splits {
            Some(s) => s.min(k_tiles.max(1)),
            // (the Hopper grid cap stands for a smaller GPU here too)
            None => choose_splits(
                problem.batch.saturating_mul(problem.heads_q).saturating_mul(q_tiles),
                match (path, options.tuning.hopper_max_ctas) {
                    (AttentionPath::Hopper, Some(m)) => m.min(ctx.info().sm_count as usize),
                    _ => ctx.info().sm_count as usize,
                },
                k_tiles,
            ),
        };
        // Work items (Hopper's persistent loop) and B * Hq (Ampere grid x) are 32-bit on the
        // device, with room for one more grid stride.
        let work = q_tiles
            .checked_mul(splits)
            .and_then(|w| w.checked_mul(problem.batch))
            .and_then(|w| w.checked_mul(problem.heads_q));
        let limit = i32::MAX as usize - 4096;
        if work.is_none_or(|w| w > limit) {
            return Err(Error::Unsupported(format!(
                "attention over {} sequences x {} heads x {q_tiles} query tiles x {splits} splits exceeds the \
                 32-bit work-item range ({limit}); run fewer sequences per call",
                problem.batch, problem.heads_q
            )));
        }
        if options.softcap > 0.0 {
            let q = options.effective_scale(problem.head_dim) / options.softcap;
            if !(q.is_finite() && q > 0.0) {
                return Err(Error::invalid(
                    "softcap",
                    format!(
                        "scale / softcap must be a finite positive f32, got {} / {}",
                        options.effective_scale(problem.head_dim),
                        options.softcap
                    ),
                ));
            }
        }
        let variant = Variant {
            path,
            dtype: problem.dtype,
            head_dim,
            block_m,
            block_n,
            threads,
            stages,
            masked: options.window_for(problem.seqlen_q, problem.seqlen_k) != (-1, -1),
            softcap: options.softcap > 0.0,
            split: splits > 1,
            pair: path == AttentionPath::Hopper
                && hopper::use_cta_pairs(
                    options.tuning.hopper_cta_pairs,
                    block_m,
                    splits,
                    problem.varlen.is_some(),
                    problem.seqlen_q,
                    problem.seqlen_k,
                ),
            simple_mainloop: path == AttentionPath::Hopper && options.tuning.hopper_simple_mainloop,
        };
        let kernel = ctx.kernel(&variant.spec())?;
        let (combine, workspace) = if splits > 1 {
            let c = ctx.kernel(
                &CombineVariant {
                    dtype: problem.dtype,
                    head_dim,
                }
                .spec(),
            )?;
            let rows = partial_rows(problem);
            let len = splits * problem.heads_q * rows * (head_dim as usize + 1);
            (Some(c), Some(ctx.alloc::<f32>(len)?))
        } else {
            (None, None)
        };
        let bh = problem.batch * problem.heads_q;
        let head_group = match path {
            AttentionPath::Hopper => bh.max(1),
            _ => {
                let resident = kernel.max_active_blocks_per_sm(ctx, threads, variant.shared_bytes())? as usize
                    * ctx.info().sm_count as usize;
                let kv_bytes = 2 * problem.seqlen_k * problem.head_dim * problem.dtype.size();
                let kv_group = problem.heads_q / problem.heads_kv.max(1);
                match options.tuning.sm80_heads_per_section {
                    Some(n) => n.min(bh.max(1)),
                    None => sm80_head_group(bh, q_tiles, resident, kv_group, kv_bytes, ctx.info().l2_bytes as usize),
                }
            }
        };
        let sms = ctx.info().sm_count;
        let hopper = match path {
            AttentionPath::Hopper => {
                // With CTA pairs a work item is a pair of query tiles and the grid counts CTAs,
                // two per cluster, as many clusters as fit at once.
                let units = if variant.pair { q_tiles.div_ceil(2) } else { q_tiles };
                let work_items = units * splits * bh;
                let grid = if variant.pair {
                    let resident = kernel
                        .max_active_clusters(ctx, LaunchConfig::clustered(2, threads, variant.shared_bytes(), 2))?
                        as usize;
                    let cap = options.tuning.hopper_max_ctas.map_or(usize::MAX, |m| (m / 2).max(1));
                    2 * work_items.min(resident).min(cap).max(1) as u32
                } else {
                    hopper_grid(work_items, sms, options.tuning.hopper_max_ctas)
                };
                // stream-ordered, before any launch of this plan
                let scheduler = WorkCounters::new(ctx, hopper::scheduler_len(sms))?;
                Some(HopperLaunch {
                    grid,
                    work_items,
                    l2_heads: hopper::l2_section_heads(
                        ctx.info().l2_bytes,
                        problem.seqlen_k,
                        problem.head_dim,
                        problem.group(),
                        bh,
                        units * splits,
                        if variant.pair { grid as usize / 2 } else { grid as usize },
                    ),
                    scheduler,
                })
            }
            _ => None,
        };
        // The tail split: Hopper, equal items (no mask, no varlen), and no split-KV, neither the
        // plan's own nor forced (num_splits: Some(1) disables split-KV, the tail's included).
        let tail = match &hopper {
            Some(launch)
                if options.tuning.hopper_tail_split
                    && options.tuning.num_splits.is_none()
                    && splits == 1
                    && !variant.pair
                    && !variant.masked
                    && problem.varlen.is_none() =>
            {
                match hopper::tail_split(launch.work_items, launch.grid as usize, k_tiles, MAX_SPLITS) {
                    Some((items, tail_splits)) => {
                        let kernel = ctx.kernel(&Variant { split: true, ..variant }.spec())?;
                        let combine = ctx.kernel(
                            &CombineVariant {
                                dtype: problem.dtype,
                                head_dim,
                            }
                            .spec(),
                        )?;
                        let rows = items * block_m as usize;
                        let workspace = ctx.alloc::<f32>(tail_splits * rows * (head_dim as usize + 1))?;
                        let mut meta = ctx.alloc::<i32>(3 * rows)?;
                        meta.fill_bytes(0xff)?; // b = -1: rows no item writes stay skipped
                        let scheduler = WorkCounters::new(ctx, hopper::scheduler_len(sms))?;
                        Some(TailSplit {
                            items,
                            splits: tail_splits,
                            kernel,
                            combine,
                            workspace,
                            meta,
                            scheduler,
                            grid: hopper_grid(items * tail_splits, sms, options.tuning.hopper_max_ctas),
                        })
                    }
                    None => None,
                }
            }
            _ => None,
        };
        Ok(AttentionPlan {
            ctx: ctx.clone(),
            problem: *problem,
            options: *options,
            variant,
            kernel,
            combine,
            splits,
            q_tiles,
            head_group,
            workspace,
            hopper,
            tail,
            fallback: std::sync::OnceLock::new(),
        })
    }

    pub fn problem(&self) -> &AttentionProblem {
        &self.problem
    }
    pub fn variant(&self) -> &Variant {
        &self.variant
    }
    pub fn splits(&self) -> usize {
        self.splits
    }
    /// Bytes of device memory the plan holds besides the caller's tensors.
    pub fn workspace_bytes(&self) -> usize {
        self.workspace.as_ref().map_or(0, |w| w.bytes())
            + self.hopper.as_ref().map_or(0, |h| h.scheduler.bytes())
            + self
                .tail
                .as_ref()
                .map_or(0, |t| t.workspace.bytes() + t.meta.bytes() + t.scheduler.bytes())
    }
    /// A readable description (`sm80 d128 m128 n64 splits 1`, `... tail 4x12` with a tail split,
    /// `... pairs grid 132` with CTA pairs).
    pub fn describe(&self) -> String {
        let mut s = format!(
            "{} d{} m{} n{} splits {}",
            self.variant.path.name(),
            self.variant.head_dim,
            self.variant.block_m,
            self.variant.block_n,
            self.splits
        );
        if let Some(t) = &self.tail {
            s += &format!(" tail {}x{}", t.items, t.splits);
        }
        if self.variant.pair {
            s += &format!(" pairs grid {}", self.hopper.as_ref().map_or(0, |h| h.grid));
        }
        s
    }

    /// The tail split this plan runs, `(items, splits)` ([`hopper::tail_split`]), if any.
    pub fn tail_split(&self) -> Option<(usize, usize)> {
        self.tail.as_ref().map(|t| (t.items, t.splits))
    }

    /// The LSE shape this plan writes: `[B, Hq, Nq]`, or `[Hq, total_q]` for varlen.
    pub fn lse_shape(&self) -> Vec<usize> {
        match self.problem.varlen {
            Some((total_q, _)) => vec![self.problem.heads_q, total_q],
            None => vec![self.problem.batch, self.problem.heads_q, self.problem.seqlen_q],
        }
    }

    /// A contiguous LSE view of `buf` in [`AttentionPlan::lse_shape`].
    pub fn lse_view_mut<'a>(&self, buf: &'a mut DeviceBuffer<f32>) -> Result<TensorViewMut<'a>> {
        let shape = self.lse_shape();
        let strides = contiguous_strides(&shape);
        buf.view_mut(&shape, &strides)
    }

    /// Runs the plan: `out` must have q's shape (any strides, last dim contiguous) and dtype;
    /// `lse`, when given, must be f32 in [`AttentionPlan::lse_shape`] (any strides, last dim
    /// contiguous). `varlen` must be given iff the plan was made for a varlen batch and must
    /// match it.
    pub fn run(
        &self,
        q: &TensorView,
        k: &TensorView,
        v: &TensorView,
        out: &mut TensorViewMut,
        lse: Option<&mut TensorViewMut>,
        varlen: Option<&VarlenBatch>,
    ) -> Result<()> {
        let layout = self.options.layout;
        let p = AttentionProblem::of_views(q, k, v, layout, varlen)?;
        if p != self.problem {
            return Err(Error::invalid(
                "attention",
                format!("attention plan was made for {:?}, called with {:?}", self.problem, p),
            ));
        }
        if out.shape() != q.shape() || out.dtype() != q.dtype() {
            return Err(Error::invalid(
                "out",
                format!(
                    "out must have q's shape {:?} and dtype {}, got {:?} {}",
                    q.shape(),
                    q.dtype(),
                    out.shape(),
                    out.dtype()
                ),
            ));
        }
        if *out.strides().last().unwrap_or(&1) != 1 {
            return Err(Error::invalid(
                "out",
                "its last dimension must be contiguous (stride 1)",
            ));
        }
        let is_varlen = varlen.is_some();
        let (qb, qn, qh) = strides_bnh(q, layout, is_varlen);
        let (kb, kn, kh) = strides_bnh(k, layout, is_varlen);
        let (vb, vn, vh) = strides_bnh(v, layout, is_varlen);
        let (ob, on, oh) = strides_bnh(&out.as_view(), layout, is_varlen);
        check_vector_aligned("q", q.device_ptr(), [qb, qn, qh])?;
        check_vector_aligned("k", k.device_ptr(), [kb, kn, kh])?;
        check_vector_aligned("v", v.device_ptr(), [vb, vn, vh])?;
        check_vector_aligned("out", out.device_ptr(), [ob, on, oh])?;
        // TMA can still refuse a view the alignment rule accepts (a zero stride broadcasting K/V,
        // a stride of 2^40 bytes or more): Auto then runs the Ampere kernel.
        let maps = if self.variant.path == AttentionPath::Hopper {
            match self.tensor_maps(q, k, v, layout, is_varlen) {
                Ok(m) => Some(m),
                Err(TmaError::Misaligned(why)) if self.options.tuning.path == AttentionPath::Auto => {
                    let _ = why;
                    return self.fallback_plan()?.run(q, k, v, out, lse, varlen);
                }
                Err(TmaError::Misaligned(why)) => {
                    return Err(Error::Unsupported(format!(
                        "the Hopper attention path cannot describe these views with TMA tensor maps: \
                         {why}; use AttentionPath::Auto or Sm80"
                    )))
                }
                Err(TmaError::Driver(e) | TmaError::Invalid(e)) => return Err(e),
            }
        } else {
            None
        };
        let (lse_ptr, lse_stride_b, lse_stride_h) = match lse {
            Some(l) => {
                let want = self.lse_shape();
                if l.shape() != want.as_slice() || l.dtype() != DType::F32 || *l.strides().last().unwrap() != 1 {
                    return Err(Error::invalid(
                        "lse",
                        format!(
                            "lse must be f32 of shape {want:?} with a contiguous last dim, got {} {:?} strides {:?}",
                            l.dtype(),
                            l.shape(),
                            l.strides()
                        ),
                    ));
                }
                let s = l.strides();
                if is_varlen {
                    (l.device_ptr(), 0i64, s[0] as i64)
                } else {
                    (l.device_ptr(), s[0] as i64, s[1] as i64)
                }
            }
            None => (0, 0, 0),
        };
        let (cu_q, cu_k) = varlen.map_or((0, 0), |vb| vb.device_ptrs());
        let d = self.problem.head_dim;
        let scale = self.options.effective_scale(d);
        let (left, right) = self.options.window_for(self.problem.seqlen_q, self.problem.seqlen_k);
        let rows = partial_rows(&self.problem);
        let (o_partial, lse_partial) = match &self.workspace {
            Some(w) => partial_ptrs(
                w,
                self.splits * self.problem.heads_q * rows * self.variant.head_dim as usize,
            ),
            None => (0, 0),
        };
        let softcap = self.options.softcap;
        let params = AttentionParams {
            q: q.device_ptr(),
            k: k.device_ptr(),
            v: v.device_ptr(),
            o: out.device_ptr(),
            lse: lse_ptr,
            cu_seqlens_q: cu_q,
            cu_seqlens_k: cu_k,
            o_partial,
            lse_partial,
            q_stride_b: qb,
            q_stride_n: qn,
            q_stride_h: qh,
            k_stride_b: kb,
            k_stride_n: kn,
            k_stride_h: kh,
            v_stride_b: vb,
            v_stride_n: vn,
            v_stride_h: vh,
            o_stride_b: ob,
            o_stride_n: on,
            o_stride_h: oh,
            lse_stride_b,
            lse_stride_h,
            partial_rows: rows as i64,
            batch: self.problem.batch as i32,
            heads_q: self.problem.heads_q as i32,
            heads_kv: self.problem.heads_kv as i32,
            seqlen_q: self.problem.seqlen_q as i32,
            seqlen_k: self.problem.seqlen_k as i32,
            head_dim: d as i32,
            window_left: left,
            window_right: right,
            scale_log2: scale * std::f32::consts::LOG2_E,
            softcap_scale: if softcap > 0.0 { scale / softcap } else { 0.0 },
            softcap_log2: softcap * std::f32::consts::LOG2_E,
            num_splits: self.splits as i32,
            q_tiles: self.q_tiles as i32,
            head_group: self.head_group as i32,
            tail_meta: 0,
        };
        if self.problem.batch == 0 || rows == 0 {
            return Ok(());
        }
        if let Some((q_map, k_map, v_map)) = maps {
            let launch = self
                .hopper
                .as_ref()
                .ok_or_else(|| Error::Unsupported("internal: a Hopper plan without its launch state".into()))?;
            let (tile_counter, work_slots) = scheduler_ptrs(&launch.scheduler);
            let work = launch.work_items;
            let tail_items = self.tail.as_ref().map_or(0, |t| t.items);
            let hp = HopperParams {
                p: params,
                q_map,
                k_map,
                v_map,
                work_items: (work - tail_items) as i32,
                l2_heads: launch.l2_heads,
                tile_counter,
                work_slots,
                tail_first: -1,
                pad_: [0; 9],
            };
            let cfg = if self.variant.pair {
                LaunchConfig::clustered(launch.grid, self.variant.threads, self.variant.shared_bytes(), 2)
            } else {
                LaunchConfig::linear(launch.grid, self.variant.threads, self.variant.shared_bytes())
            };
            // SAFETY: `hp` mirrors HopperParams of flash_sm90.cu; the tensor maps describe the
            // validated q/k/v views (TMA clips every box to their extents; with pairs the K/V
            // boxes are the half tiles the kernel loads) and every other pointer is as for the
            // Ampere launch below. A pair kernel is launched in clusters of two, as its
            // multicast copies and remote barrier arrivals require.
            unsafe { self.kernel.launch(&self.ctx, cfg, &hp)? };
            if let Some(t) = &self.tail {
                let rows = t.items * self.variant.block_m as usize;
                let (o_partial, lse_partial) =
                    partial_ptrs(&t.workspace, t.splits * rows * self.variant.head_dim as usize);
                let (tile_counter, work_slots) = scheduler_ptrs(&t.scheduler);
                let tp = AttentionParams {
                    o_partial,
                    lse_partial,
                    partial_rows: rows as i64,
                    num_splits: t.splits as i32,
                    tail_meta: t.meta.device_ptr(),
                    ..params
                };
                let thp = HopperParams {
                    p: tp,
                    work_items: (t.items * t.splits) as i32,
                    tile_counter,
                    work_slots,
                    tail_first: (work - t.items) as i32,
                    ..hp
                };
                let cfg = LaunchConfig::linear(t.grid, self.variant.threads, self.variant.shared_bytes());
                // SAFETY: as above; the split variant writes only the tail workspace and meta
                // rows (sized for items * block_m rows and splits) and reads what the first
                // launch reads. Stream order puts it after the first launch.
                unsafe { t.kernel.launch(&self.ctx, cfg, &thp)? };
                // SAFETY: the combine reads the tail workspace and meta the launch before wrote
                // (same stream) and writes out/lse rows of the validated views that meta names.
                unsafe { t.combine.launch(&self.ctx, combine_config(rows), &tp)? };
            }
        } else {
            let cfg = LaunchConfig {
                grid: (
                    (self.problem.batch * self.problem.heads_q) as u32,
                    self.q_tiles as u32,
                    self.splits as u32,
                ),
                block: (self.variant.threads, 1, 1),
                shared_bytes: self.variant.shared_bytes(),
                cluster_x: 1,
                dependent_launch: false,
                cooperative: false,
            };
            // SAFETY: `params` mirrors ts::AttentionParams; every pointer is a live device
            // allocation of the size the validated views and this plan's problem imply
            // (q/k/v/out and lse were checked against the problem above, the workspace was
            // sized for it), and the kernel reads and writes only inside those extents.
            unsafe { self.kernel.launch(&self.ctx, cfg, &params)? };
        }
        if let Some(combine) = &self.combine {
            // SAFETY: as above; the combine kernel reads the workspace the forward kernel just
            // wrote (same stream) and writes out/lse within their validated extents.
            unsafe { combine.launch(&self.ctx, combine_config(rows * self.problem.heads_q), &params)? };
        }
        Ok(())
    }
}

impl AttentionPlan {
    /// The Ampere plan for the same problem and options (Hopper plans under `Auto`, for views
    /// TMA cannot describe).
    fn fallback_plan(&self) -> Result<&AttentionPlan> {
        if let Some(p) = self.fallback.get() {
            return Ok(p);
        }
        let options = AttentionOptions {
            tuning: AttentionTuning {
                path: AttentionPath::Sm80,
                ..self.options.tuning
            },
            ..self.options
        };
        let plan = AttentionPlan::new(&self.ctx, &self.problem, &options)?;
        Ok(self.fallback.get_or_init(|| Box::new(plan)))
    }

    /// The Q, K and V tensor maps of the Hopper kernel (views already checked by
    /// `check_vector_aligned`).
    fn tensor_maps(
        &self,
        q: &TensorView,
        k: &TensorView,
        v: &TensorView,
        layout: QkvLayout,
        varlen: bool,
    ) -> std::result::Result<(TensorMap, TensorMap, TensorMap), TmaError> {
        let p = &self.problem;
        if p.batch == 0 || partial_rows(p) == 0 {
            let z = TensorMap::default();
            return Ok((z, z, z)); // nothing is launched
        }
        let (rows_q, rows_k, batch) = match p.varlen {
            Some((tq, tk)) => (tq, tk, 1),
            None => (p.seqlen_q, p.seqlen_k, p.batch),
        };
        let shape = |t: &TensorView, rows: usize, heads: usize, box_rows: u32| {
            let (sb, sn, sh) = strides_bnh(t, layout, varlen);
            QkvMapShape {
                ptr: t.device_ptr(),
                dtype: p.dtype,
                cols: p.head_dim,
                rows,
                heads,
                batch,
                stride_n: sn,
                stride_h: sh,
                stride_b: sb,
                box_rows,
            }
        };
        let bm = self.variant.block_m;
        // CTA pairs load half of each key tile each (multicast to both).
        let bn = if self.variant.pair {
            self.variant.block_n / 2
        } else {
            self.variant.block_n
        };
        Ok((
            shape(q, rows_q, p.heads_q, bm).encode()?,
            shape(k, rows_k, p.heads_kv, bn).encode()?,
            shape(v, rows_k, p.heads_kv, bn).encode()?,
        ))
    }
}

/// The kernels move rows in 16-byte chunks (cp.async loads, vector stores): a tensor's base
/// address must be 16-byte aligned and its batch, row and head strides multiples of 8 elements.
fn check_vector_aligned(name: &str, ptr: u64, strides: [i64; 3]) -> Result<()> {
    if ptr % 16 != 0 || strides.iter().any(|s| s % 8 != 0) {
        return Err(Error::Unsupported(format!(
            "attention {name}: the kernels need a 16-byte aligned base address and batch/row/head \
             strides that are multiples of 8 elements, got address {ptr:#x} and strides (b, n, h) {strides:?}"
        )));
    }
    Ok(())
}

/// Rows of the split-KV workspace per (split, head).
fn partial_rows(p: &AttentionProblem) -> usize {
    p.varlen.map_or(p.batch * p.seqlen_q, |(t, _)| t)
}

/// Resolves `Auto` and checks the device supports the requested path.
pub fn resolve_path(path: AttentionPath, arch: Arch) -> Result<AttentionPath> {
    if arch.major < 8 {
        return Err(Error::Unsupported(format!(
            "attention needs compute capability 8.0 or newer, this GPU is {arch}"
        )));
    }
    let hopper = arch.major == 9 && arch.minor == 0;
    match path {
        AttentionPath::Auto if hopper => Ok(AttentionPath::Hopper),
        AttentionPath::Auto | AttentionPath::Sm80 => Ok(AttentionPath::Sm80),
        AttentionPath::Hopper if hopper => Ok(AttentionPath::Hopper),
        AttentionPath::Hopper => Err(Error::Unsupported(format!(
            "the Hopper attention path needs an sm_90 GPU (wgmma, TMA), this GPU is {arch}; use \
             AttentionPath::Auto or Sm80"
        ))),
    }
}

/// Every variant the dispatcher can produce for `arch` (what CI compiles).
pub fn ci_variants_for(arch: Arch) -> Vec<Variant> {
    let mut out = Vec::new();
    if arch.major < 8 {
        return out;
    }
    // Every (masked, softcap, split) combination the plan can produce.
    let flags = [
        (false, false, false),
        (true, false, false),
        (false, true, false),
        (true, true, false),
        (false, false, true),
        (true, false, true),
        (false, true, true),
        (true, true, true),
    ];
    // `tiles(softcap)` lists the tilings a variant may get. The Ampere kernel's depend on the
    // GPU's shared memory per SM: the one the arch's GPUs take (both for an arch not listed in
    // shared_per_sm_of), plus the 32-key tiling that AttentionTuning::sm80_block_n can force
    // on any GPU (tests and benchmarks of the smaller GPUs' tiling on a Hopper). The Hopper
    // kernel's: every key tile of hopper::block_n_choices (128 and 176 at D = 128).
    let mut push = |path, dtype, head_dim, tiles: &dyn Fn(bool) -> Vec<(u32, u32, u32, u32)>| {
        for (masked, softcap, split) in flags {
            for (block_m, block_n, threads, stages) in tiles(softcap) {
                let v = Variant {
                    path,
                    dtype,
                    head_dim,
                    block_m,
                    block_n,
                    threads,
                    stages,
                    masked,
                    softcap,
                    split,
                    pair: false,
                    simple_mainloop: false,
                };
                if !out.contains(&v) {
                    out.push(v);
                }
                // Hopper's non-split variants of two consumers also run as CTA pairs.
                if path == AttentionPath::Hopper && !split && hopper::kernel_has_pairs(block_m, 1) {
                    let v = Variant { pair: true, ..v };
                    if !out.contains(&v) {
                        out.push(v);
                    }
                }
            }
        }
    };
    for dtype in [DType::F16, DType::BF16] {
        for head_dim in (32..=256).step_by(32) {
            push(AttentionPath::Sm80, dtype, head_dim, &|softcap| {
                vec![
                    sm80_tiles_keyed(head_dim, softcap, false),
                    shared_per_sm_of(arch).map_or(sm80_tiles_keyed(head_dim, softcap, true), |shared| {
                        sm80_tiles(head_dim, softcap, shared)
                    }),
                ]
            });
        }
        if arch.major == 9 && arch.minor == 0 {
            for head_dim in (64..=256).step_by(64) {
                push(AttentionPath::Hopper, dtype, head_dim, &|_| {
                    hopper::block_n_choices(head_dim)
                        .iter()
                        .filter_map(|&n| hopper::tiles(head_dim, n).ok())
                        .collect()
                });
            }
        }
    }
    out
}

/// Every combine variant (what CI compiles).
pub fn ci_combine_variants() -> Vec<CombineVariant> {
    let mut out = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        for head_dim in (32..=256).step_by(32) {
            out.push(CombineVariant { dtype, head_dim });
        }
    }
    out
}

/// The attention params header source (for tests that need it).
pub fn params_header() -> &'static str {
    PARAMS_HEADER
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sections of the Ampere work order: four waves where one head's K/V exceed a quarter of
    /// L2; else, where all heads' K/V exceed L2, the divisor of the heads nearest two waves.
    #[test]
    fn sm80_head_group_sizes_sections_by_waves() {
        // H200: 132 SMs x 2 CTAs, 60 MiB of L2; D = 128, fp16
        let l2 = 60 << 20;
        let kv = |n: usize| 2 * n * 128 * 2;
        // One head over L2 / 4: four waves.
        assert_eq!(sm80_head_group(32, 256, 264, 1, kv(32768), l2), 5); // 5 x 256 tiles >= 4 x 264
        assert_eq!(sm80_head_group(32, 32, 264, 1, kv(65536), l2), 32); // few query tiles: one section
        assert_eq!(sm80_head_group(128, 32, 264, 1, kv(65536), l2), 33); // 33 + 33 + 33 + 29
        assert_eq!(sm80_head_group(32, 128, 264, 1, kv(16384), 30 << 20), 9); // a smaller L2

        // All heads over L2: the divisor nearest two waves (run 118's measured sizes).
        assert_eq!(sm80_head_group(32, 128, 264, 1, kv(16384), l2), 4); // ideal 4.1
        assert_eq!(sm80_head_group(32, 64, 264, 1, kv(8192), l2), 8); // ideal 8.25
        assert_eq!(sm80_head_group(32, 32, 264, 1, kv(4096), l2), 16); // ideal 16.5
        assert_eq!(sm80_head_group(64, 64, 264, 1, kv(8192), l2), 8); // non-causal B4 H16
        assert_eq!(sm80_head_group(128, 32, 264, 4, kv(4096), l2), 16); // GQA 32/8: 4 K/V heads

        // K/V within L2: one section.
        assert_eq!(sm80_head_group(32, 16, 264, 1, kv(2048), l2), 32);
        assert_eq!(sm80_head_group(32, 32, 264, 4, kv(4096), l2), 32); // GQA: 8 K/V heads, 16 MiB

        // No divisor between half and twice the ideal (31 heads, ideal 4.1): one section.
        assert_eq!(sm80_head_group(31, 128, 264, 1, kv(16384), l2), 31);
        // The divisor nearest the ideal would not fit L2 (ideal 16.5: 16 x 8 MiB): one section.
        assert_eq!(sm80_head_group(32, 32, 264, 1, kv(16384), l2), 32);

        // Degenerate inputs.
        assert_eq!(sm80_head_group(0, 1, 0, 1, 1 << 40, l2), 1);
        assert_eq!(sm80_head_group(7, 1_000_000, 264, 1, 1 << 40, l2), 1);
        assert_eq!(sm80_head_group(7, 0, 0, 0, 0, 0), 7);
    }

    /// A mirror of flash_sm80.cu's `work_tile`: every (batch-head, tile) pair exactly once, each
    /// section tile-major.
    #[test]
    fn sm80_work_order_visits_every_tile_once() {
        let work_tile = |l: usize, heads: usize, tiles: usize, group: usize| {
            let first = l / (group * tiles) * group;
            let size = group.min(heads - first);
            let i = l - first * tiles;
            (first + i % size, i / size)
        };
        for (heads, tiles) in [(1, 1), (32, 256), (128, 32), (7, 5), (96, 16)] {
            for group in [1, 2, 5, 33, heads] {
                let mut seen = vec![false; heads * tiles];
                let mut last_tile = vec![None; heads];
                for l in 0..heads * tiles {
                    let (bh, t) = work_tile(l, heads, tiles, group.min(heads));
                    assert!(
                        bh < heads && t < tiles && !seen[bh * tiles + t],
                        "{heads} {tiles} {group} {l}"
                    );
                    seen[bh * tiles + t] = true;
                    assert!(last_tile[bh].is_none_or(|p| p < t), "tiles of a head in order");
                    last_tile[bh] = Some(t);
                }
            }
        }
    }

    /// CI compiles every Hopper tiling the plan can choose or be forced to, for every flag set.
    #[test]
    fn ci_variants_cover_every_hopper_tiling() {
        let vs = ci_variants_for(Arch::SM90);
        for d in [64, 128, 192, 256] {
            for &n in hopper::block_n_choices(d) {
                let count = |pair| {
                    vs.iter()
                        .filter(|v| v.path == AttentionPath::Hopper && v.head_dim == d && v.block_n == n)
                        .filter(|v| v.pair == pair)
                        .count()
                };
                // 2 dtypes x 8 (masked, softcap, split) flag sets, and the CTA pairs of the
                // non-split ones where two consumer warpgroups run (hopper::use_cta_pairs).
                assert_eq!(count(false), 16, "d {d} n {n}");
                assert_eq!(count(true), if d == 64 { 0 } else { 8 }, "d {d} n {n} pairs");
            }
        }
        assert!(vs
            .iter()
            .any(|v| v.block_n == hopper::LONG_BLOCK_N && v.split && v.softcap));
        assert!(vs.iter().filter(|v| v.pair).all(|v| !v.split && v.block_m == 128));
    }

    /// Every Ampere tiling fits the 99 KiB opt-in shared memory of sm_86 / sm_89, and the
    /// 64-key D <= 128 tile goes only where two of its CTAs fit an SM.
    #[test]
    fn sm80_tiles_fit_in_shared_memory() {
        for arch in [Arch::CI_TARGETS.as_slice(), &[Arch { major: 12, minor: 0 }]].concat() {
            for v in ci_variants_for(arch).iter().filter(|v| v.path == AttentionPath::Sm80) {
                assert!(v.shared_bytes() <= 99 * 1024, "{v:?}: {} bytes", v.shared_bytes());
                if v.block_n == 64 && v.head_dim > 64 {
                    assert!(shared_per_sm_of(arch).is_none_or(|s| s >= SM80_WIDE_TILE_MIN_SHARED_PER_SM));
                }
            }
        }
        // The 64-key D <= 128 tile is compiled in CI for Hopper, where the plan takes it; the
        // 32-key one for every arch (sm80_block_n forces it on Hopper).
        let tile_on = |arch, block_n| {
            ci_variants_for(arch)
                .iter()
                .any(|v| v.path == AttentionPath::Sm80 && v.block_n == block_n && v.head_dim == 128 && !v.softcap)
        };
        assert!(tile_on(Arch::SM90, 64) && !tile_on(Arch::SM80, 64) && !tile_on(Arch::SM86, 64));
        assert!(Arch::CI_TARGETS.iter().all(|&a| tile_on(a, 32)));
        let wide = Variant {
            path: AttentionPath::Sm80,
            dtype: DType::F16,
            head_dim: 128,
            block_m: 128,
            block_n: 64,
            threads: 128,
            stages: 2,
            masked: false,
            softcap: false,
            split: false,
            pair: false,
            simple_mainloop: false,
        };
        assert_eq!(2 * (wide.shared_bytes() + 1024), SM80_WIDE_TILE_MIN_SHARED_PER_SM);
        // H100 / H200: 228 KiB per SM; A100: 164 KiB; sm_86 / sm_89: 100 KiB.
        assert_eq!(sm80_tiles(128, false, 228 * 1024), (128, 64, 128, 2));
        assert_eq!(sm80_tiles(96, false, 228 * 1024), (128, 64, 128, 2));
        assert_eq!(sm80_tiles(128, true, 228 * 1024), (128, 32, 128, 3));
        assert_eq!(sm80_tiles(128, false, 164 * 1024), (128, 32, 128, 3));
        assert_eq!(sm80_tiles(128, false, 100 * 1024), (128, 32, 128, 3));
        assert_eq!(sm80_tiles(64, false, 228 * 1024), (128, 64, 128, 3));
    }
}
