//! Host side of the Hopper attention path (`flash_sm90.cu`): tile choice, the TMA tensor maps,
//! the kernel parameter struct, the persistent grid, and the Hopper part of a plan
//! ([`HopperPlan`]: the launch's shape, its scheduler state and the tail split).
//!
//! Grid convention of this path (differs from the `(B * Hq, q_tiles, splits)` grid of the
//! others; with CTA pairs ([`use_cta_pairs`]) an item is a pair of query tiles and the grid is
//! `2 * min(pair items, resident clusters)` CTAs in clusters of two, whose clusters play the
//! part the CTAs play below): a persistent 1-D grid of `min(work, SMs)` CTAs (capped by
//! `AttentionTuning::hopper_max_ctas`), `work = q_tiles * splits * B * Hq`; with a tail split
//! ([`tail_split`]) the first launch runs `work - tail` of them on that grid and the second
//! `tail * tail_splits` split items. The batch-heads are cut into L2 sections of `S` ([`l2_section_heads`]:
//! enough heads for four waves of the grid, as long as their K and V fit the L2). The first
//! section holds the `B * Hq % S` remainder heads (when not 0), every later one `S`: the launch
//! then ends on a full section, whose short causal tiles fill the tail (a small last section
//! would start its longest tiles when the other CTAs run out of work). Inside a section the
//! order is query tile descending (longest causal tiles first), then split, then batch-head.
//! Without sections the CTAs running together would each stream a different head's K/V from HBM.
//!
//! Scheduling: CTA `c` starts with item `c`; every later item comes from one `atomicAdd` on the
//! plan's tile counter (items `grid, grid + 1, ...` in draw order), so CTAs that drew short
//! causal tiles take more of them, and the CTAs running together stay on neighbouring items
//! (which share K/V in L2). A launch makes exactly `work_items` draws; the last one resets the
//! counter to 0. The producer hands each item to its consumers through a per-CTA slot in global
//! memory ([`SCHEDULER_SLOTS_OFFSET`]), ordered by the Q tile's mbarrier.
//!
//! Tensor maps: 4-D `(D, rows, heads, batch)` with byte strides, which covers `[B, N, H, D]`,
//! `[B, H, N, D]` and varlen `[total, H, D]` (as `(D, total, H, 1)`); boxes of 64 columns
//! (128 bytes, 128-byte swizzle) by a tile of rows. Columns past the real D and rows past the
//! tensor read as zeros. TMA needs 16-byte aligned base addresses and strides; a view that
//! breaks this cannot take this path ([`TmaError::Misaligned`]; the encoding is
//! [`crate::runtime::tma`]'s).

use std::sync::Arc;

use super::plan::{
    combine_config, partial_ptrs, partial_rows, AttentionParams, CombineVariant, Tiles, Variant, MAX_SPLITS,
};
use super::{strides_bnh, AttentionOptions, AttentionProblem, QkvLayout};
use crate::dtype::DType;
use crate::error::Error;
use crate::runtime::tma::{self, L2Promotion, OobFill, Swizzle, TensorMap, TiledMap, TmaError};
use crate::runtime::{Context, DeviceBuffer, Kernel, KernelParams, LaunchConfig, TensorView, WorkCounters};

/// Query rows per consumer warpgroup.
pub const ROWS_PER_CONSUMER: u32 = 64;

/// Threads per CTA for a query tile of `block_m` rows: one producer warpgroup and one consumer
/// warpgroup per 64 rows.
pub const fn threads(block_m: u32) -> u32 {
    128 * (1 + block_m / ROWS_PER_CONSUMER)
}

/// Head dim the Hopper kernel is compiled for: the real D rounded up to a multiple of 64
/// (the tensor maps zero-fill the padding columns).
pub fn head_dim(d: usize) -> u32 {
    (d.max(1).div_ceil(64) * 64) as u32
}

/// Keys per tile of the long-key tiling of compiled head dim 128 (FlashAttention-3's
/// non-causal D = 128 tile): fewer softmax steps and turn hand-overs per key than 128.
pub const LONG_BLOCK_N: u32 = 176;

/// Key tiles (`block_n`) the Hopper kernel has for a compiled head dim: 128 or
/// [`LONG_BLOCK_N`] at D = 128 ([`choose_block_n`] picks), one elsewhere.
pub fn block_n_choices(head_dim: u32) -> &'static [u32] {
    match head_dim {
        0..=64 => &[128],
        65..=128 => &[128, LONG_BLOCK_N],
        _ => &[64],
    }
}

/// Tiles for a compiled head dim and one of its [`block_n_choices`]: `(block_m, block_n,
/// threads, stages)`.
///
/// D = 64 runs three consumer warpgroups (192-row query tiles, 160 registers each): with half
/// the GEMM work of D = 128 per key tile, the exponentials dominate and a third warpgroup's
/// softmax fills the tensor cores' idle time. Larger D need the registers of two. The 176-key
/// tiles of D = 128 keep two K/V stages (208 KiB of shared memory). An error for a `block_n`
/// that is not one of the head dim's choices.
pub fn tiles(head_dim: u32, block_n: u32) -> Result<(u32, u32, u32, u32), Error> {
    let choices = block_n_choices(head_dim);
    if !choices.contains(&block_n) {
        return Err(Error::Unsupported(format!(
            "the Hopper attention kernel has no tiling of {block_n} keys at compiled head dim {head_dim} \
             (it has {choices:?})"
        )));
    }
    Ok(match head_dim {
        0..=64 => (192, 128, threads(192), 3),
        65..=128 => (128, block_n, threads(128), 2),
        _ => (128, 64, threads(128), 2),
    })
}

/// Per-key time of the 176-key tiling relative to 128 where both process the same keys: as
/// measured on the H200 on rows whose padding is negligible (non-causal N = 8192, causal
/// N = 32768; see this folder's NOTES.md).
const LONG_TILE_KEY_COST: f64 = 0.97;

/// Fewest queries per sequence for which the plan considers [`LONG_BLOCK_N`]: the per-key gain
/// was measured on long compute-bound sequences (N >= 8192); shorter query ranges (decode-like
/// rows, split-KV) keep the 128-key tile, whose behaviour there is the measured one.
pub const LONG_TILE_MIN_QUERIES: usize = 2048;

/// The key tile for a problem of compiled head dim `head_dim`: at D = 128 with at least
/// [`LONG_TILE_MIN_QUERIES`] queries per sequence, [`LONG_BLOCK_N`] where the keys it processes
/// (each query tile's visible key range rounded out to whole key tiles, summed over the query
/// tiles of a sequence) cost at most 98.5% of what the 128-key tiles process, at 0.97 of their
/// cost per key; 128 otherwise. The wider tile pads more at the causal diagonal and at the
/// sequence end: square causal sequences take 176 from N = 10241 on (some N in 9985 .. 10240
/// already do, as the padding moves with N mod 128 and mod 176), non-causal ones wherever N's
/// padding to 176 stays within ~1.5% of its padding to 128 (N = 5632 = 32 x 176 exactly, 4097;
/// not 4096), so the choice alternates with N mod 176 at moderate N. On the H200 176 won on the
/// long causal rows and non-causal N = 8192 and lost at causal N <= 4096 (see this folder's
/// NOTES.md). Variable-length batches keep 128 (the plan knows only their longest sequence, and
/// the mixed-length row lost with 176). `window` is [`super::AttentionOptions::window_for`]'s
/// (`-1` = unbounded).
pub fn choose_block_n(head_dim: u32, seqlen_q: usize, seqlen_k: usize, window: (i32, i32), varlen: bool) -> u32 {
    let choices = block_n_choices(head_dim);
    if varlen || seqlen_q < LONG_TILE_MIN_QUERIES || !choices.contains(&LONG_BLOCK_N) {
        return choices[0];
    }
    // Every head dim's query tile is the same for each of its key tiles.
    let Ok((block_m, ..)) = tiles(head_dim, choices[0]) else {
        return choices[0];
    };
    let long = padded_keys(seqlen_q, seqlen_k, window, block_m as usize, LONG_BLOCK_N as usize);
    let short = padded_keys(seqlen_q, seqlen_k, window, block_m as usize, choices[0] as usize);
    if short > 0 && LONG_TILE_KEY_COST * long as f64 <= 0.985 * short as f64 {
        LONG_BLOCK_N
    } else {
        choices[0]
    }
}

/// Keys the kernel processes for one sequence: per query tile of `block_m` rows, its visible
/// keys (as flash_sm90.cu's key_tiles) rounded out to key tiles of `block_n`.
fn padded_keys(seqlen_q: usize, seqlen_k: usize, window: (i32, i32), block_m: usize, block_n: usize) -> u64 {
    if window == (-1, -1) {
        // Every query tile sees every key (the loop below in closed form).
        return seqlen_q.div_ceil(block_m) as u64 * seqlen_k.div_ceil(block_n) as u64 * block_n as u64;
    }
    let (left, right) = window;
    let mut keys = 0u64;
    for m0 in (0..seqlen_q).step_by(block_m) {
        let last = (m0 + block_m).min(seqlen_q) as i64 - 1;
        // the tile's first row sees the lowest keys, its last row the highest (key_tiles)
        let (lo, _) = super::visible_keys(m0 as i64, seqlen_q, seqlen_k, left, right);
        let (_, hi) = super::visible_keys(last, seqlen_q, seqlen_k, left, right);
        if hi > lo {
            let b = block_n as i64;
            keys += ((hi + b - 1) / b - lo / b) as u64 * block_n as u64;
        }
    }
    keys
}

/// Dynamic shared memory: Q, `stages` K and V tiles, the mbarriers, the CTA pair's mailbox (8
/// bytes), one f32 per consumer thread (`Smem::sink`: two per query row), and 1024 bytes of slack
/// for aligning the base to the 128-byte swizzle's 1024-byte period.
pub fn shared_bytes(block_m: u32, block_n: u32, stages: u32, head_dim: u32) -> u32 {
    (block_m + 2 * stages * block_n) * head_dim * 2 + 8 * (4 + 4 * stages) + 8 + 8 * block_m + 1024
}

/// Fewest queries and keys per sequence for which the plan runs CTA pairs by default
/// ([`use_cta_pairs`]).
pub const PAIR_MIN_SEQLEN: usize = 4096;

/// Whether flash_sm90.cu has a CTA-pair variant (`kPair`) for a query tile of `block_m` rows and
/// `splits` KV splits: two consumer warpgroups (the three of D = 64 leave the producer too few
/// registers) and the non-split launch.
pub fn kernel_has_pairs(block_m: u32, splits: usize) -> bool {
    block_m == 2 * ROWS_PER_CONSUMER && splits == 1
}

/// Whether a Hopper plan runs CTA pairs (flash_sm90.cu `kPair`): clusters of two CTAs on
/// neighbouring query tiles of one head, each loading half of every K/V tile into both by TMA
/// multicast, where the kernel has them ([`kernel_has_pairs`]: head dims 65..=256, no split-KV).
/// `option` ([`super::AttentionTuning::hopper_cta_pairs`]) decides where they apply; by default padded batches whose sequences have at least [`PAIR_MIN_SEQLEN`] queries and
/// keys take them, and varlen batches take them only when forced.
///
/// Long rows gain (each K/V tile is read from L2 once per pair); short causal rows lose, as the
/// first CTA of a pair idles while the second one's extra causal tile loads, which is a large
/// share of a short row (measurements in NOTES.md, CTA pairs). The plan sees only the longest and
/// the total length of a varlen batch, and a batch of many short sequences would leave the second
/// CTA of most pairs without rows while it still loads its half of every tile, so varlen stays
/// opt-in.
pub fn use_cta_pairs(
    option: Option<bool>,
    block_m: u32,
    splits: usize,
    varlen: bool,
    seqlen_q: usize,
    seqlen_k: usize,
) -> bool {
    if !kernel_has_pairs(block_m, splits) || (varlen && option != Some(true)) {
        return false;
    }
    option.unwrap_or(seqlen_q >= PAIR_MIN_SEQLEN && seqlen_k >= PAIR_MIN_SEQLEN)
}

/// The kernel parameter of `flash_fwd_sm90`, mirrored by `HopperParams` in `flash_sm90.cu`.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub struct HopperParams {
    pub p: AttentionParams,
    pub q_map: TensorMap,
    pub k_map: TensorMap,
    pub v_map: TensorMap,
    pub work_items: i32,
    /// Batch-heads per L2 section of the work order ([`l2_section_heads`]).
    pub l2_heads: i32,
    /// Device address of the dynamic scheduler's `u32` counter: 0 before a launch, and the
    /// kernel leaves it at 0 (the plan owns it; launches of one plan must be stream-ordered).
    pub tile_counter: u64,
    /// Device address of `grid` `i32` slots: the item each CTA's producer hands its consumers.
    pub work_slots: u64,
    /// The tail launch (the split-KV variant after a non-split launch that left out its last
    /// items): the first of those items in the non-split launch's order; -1 otherwise.
    pub tail_first: i32,
    pub pad_: [i32; 9],
}

// SAFETY: plain data with the C layout of `HopperParams` in flash_sm90.cu (the kernel
// static_asserts its size, 704 bytes, and the size test below checks this side).
unsafe impl KernelParams for HopperParams {}

/// One Q, K or V tensor's geometry for its tensor map: element strides of rows, heads and
/// batches.
#[derive(Clone, Copy, Debug)]
pub struct QkvMapShape {
    pub ptr: u64,
    pub dtype: DType,
    /// The real head dim (columns).
    pub cols: usize,
    pub rows: usize,
    pub heads: usize,
    pub batch: usize,
    pub stride_n: i64,
    pub stride_h: i64,
    pub stride_b: i64,
    /// Rows of one box (the kernel's tile height).
    pub box_rows: u32,
}

impl QkvMapShape {
    /// The 4-D tensor map `(cols, rows, heads, batch)` with 64-column boxes (128 bytes),
    /// 128-byte swizzle, 256-byte L2 promotion and zeros out of bounds.
    pub fn encode(&self) -> Result<TensorMap, TmaError> {
        let s = self;
        let es = s.dtype.size() as i64;
        // A size-1 dimension may carry any stride: give it a valid one.
        let fix = |stride: i64, extent: usize, fallback: i64| if extent <= 1 { fallback } else { stride };
        let row_bytes = s.stride_n * es;
        let head_bytes = fix(s.stride_h, s.heads, s.stride_n * s.rows.max(1) as i64) * es;
        let batch_bytes = fix(s.stride_b, s.batch, head_bytes / es * s.heads.max(1) as i64) * es;
        // (the views' strides are never negative: usize)
        let dims: [u64; 4] = [
            s.cols as u64,
            s.rows.max(1) as u64,
            s.heads.max(1) as u64,
            s.batch.max(1) as u64,
        ];
        let strides: [u64; 3] = [row_bytes as u64, head_bytes as u64, batch_bytes as u64];
        tma::encode_tiled(&TiledMap {
            ptr: s.ptr,
            dtype: s.dtype,
            dims: &dims,
            byte_strides: &strides,
            stride_names: &["row", "head", "batch"],
            box_dims: &[64, s.box_rows, 1, 1],
            element_strides: &[1, 1, 1, 1],
            swizzle: Swizzle::B128,
            l2_promotion: L2Promotion::B256,
            oob_fill: OobFill::Zeros,
        })
    }
}

/// Batch-heads per L2 section: enough heads for [`super::plan::SECTION_WAVES`] waves of the
/// `grid` CTAs (`items_per_head` work items each; [`super::plan::heads_for_waves`]), as long as
/// their K and V (GQA groups share them) fit the L2; at least 1. Against the earlier rule (as
/// many heads as fit half the L2) it measured faster on causal N = 32768 (3 heads of 16 MiB
/// instead of 1: one head's 256 query tiles are two waves, so the CTAs of a section's last wave
/// straggle across into the next head), N = 8192 (9 heads instead of 6) and GQA 4 x 32/8
/// N = 4096 (17 heads instead of 50), and level on the other shapes (see this folder's
/// NOTES.md).
pub fn l2_section_heads(
    l2_bytes: u32,
    seqlen_k: usize,
    head_dim: usize,
    group: usize,
    batch_heads: usize,
    items_per_head: usize,
    grid: usize,
) -> i32 {
    let kv_per_head = (2 * 2 * seqlen_k.max(1) * head_dim.max(1)) / group.max(1);
    let fit = (l2_bytes as usize / kv_per_head.max(1)).max(1);
    super::plan::heads_for_waves(grid, items_per_head, fit.min(batch_heads.max(1))) as i32
}

/// The scheduler buffer of a Hopper plan (a [`crate::runtime::WorkCounters`] of `i32`s): the tile
/// counter at 0 (the kernel re-arms it), the CTAs' work slots from this offset on (128 bytes
/// later, off the counter's cache line).
pub const SCHEDULER_SLOTS_OFFSET: usize = 32;

/// `i32`s of the scheduler buffer for a grid of at most `sm_count` CTAs.
pub fn scheduler_len(sm_count: u32) -> usize {
    SCHEDULER_SLOTS_OFFSET + sm_count.max(1) as usize
}

/// Persistent grid size: one CTA per SM, never more than the work items.
pub fn grid(work_items: usize, sm_count: u32) -> u32 {
    work_items.min(sm_count.max(1) as usize).max(1) as u32
}

/// The tail split's longest last wave, as a fraction of the grid: 1 / TAIL_MAX_WAVE_DIV.
pub const TAIL_MAX_WAVE_DIV: usize = 4;

/// Key tiles each split of the tail launch gets at least.
pub const TAIL_MIN_TILES_PER_SPLIT: usize = 3;

/// The tail split of `work_items` equal items on a persistent grid of `grid` CTAs, `key_tiles`
/// key tiles each: `Some((tail_items, splits))` where the items leave a last wave of
/// `tail_items = work_items % grid` CTAs, at most `grid / TAIL_MAX_WAVE_DIV`, while the others
/// idle for a whole item time. The plan then runs the other items as usual and these in a
/// second launch after it, each split along its keys `splits` ways (as many as the grid holds,
/// with at least [`TAIL_MIN_TILES_PER_SPLIT`] key tiles each, at most `max_splits`; then the
/// fewest splits that give each split the same ceil(key_tiles / splits) tiles, so that none is
/// left empty by the kernel's partition), and merges them: the last wave then takes about
/// `1 / splits` of an item time plus a launch and the merge.
/// On the H200 non-causal B4 H16 N8192 D128 (4096 items on 132 CTAs: 31.03 waves) ran slower
/// per FLOP than N8448 (32.0 waves); the split (4 items x 12) takes that row faster, and neither
/// drawing the pieces in the same launch nor starting the second launch early gained more (see
/// this folder's NOTES.md). `None` where there is no short last wave or too few key tiles to
/// split.
pub fn tail_split(work_items: usize, grid: usize, key_tiles: usize, max_splits: usize) -> Option<(usize, usize)> {
    if grid == 0 || work_items <= grid {
        return None;
    }
    let tail = work_items % grid;
    if tail == 0 || tail * TAIL_MAX_WAVE_DIV > grid {
        return None;
    }
    let splits = (grid / tail).min(key_tiles / TAIL_MIN_TILES_PER_SPLIT).min(max_splits);
    if splits < 2 {
        return None;
    }
    // key_tiles (flash_sm90.cu) gives split s tiles [s * per, (s + 1) * per), per =
    // ceil(key_tiles / splits): more splits than ceil(key_tiles / per) would be empty.
    let splits = key_tiles.div_ceil(key_tiles.div_ceil(splits));
    (splits >= 2).then_some((tail, splits))
}

/// The compiled head dim and tiles `(block_m, block_n, threads, stages)` of a problem on this
/// path: [`choose_block_n`]'s key tile, or the one forced by
/// [`super::AttentionTuning::hopper_block_n`].
pub fn plan_tiles(problem: &AttentionProblem, options: &AttentionOptions) -> Result<(u32, Tiles), Error> {
    let d = head_dim(problem.head_dim);
    let block_n = options.tuning.hopper_block_n.unwrap_or_else(|| {
        choose_block_n(
            d,
            problem.seqlen_q,
            problem.seqlen_k,
            options.window_for(problem.seqlen_q, problem.seqlen_k),
            problem.varlen.is_some(),
        )
    });
    Ok((d, tiles(d, block_n)?))
}

/// Whether a plan of `block_m`-row query tiles and `splits` KV splits runs CTA pairs:
/// [`use_cta_pairs`] with [`super::AttentionTuning::hopper_cta_pairs`].
pub fn plan_pairs(problem: &AttentionProblem, options: &AttentionOptions, block_m: u32, splits: usize) -> bool {
    use_cta_pairs(
        options.tuning.hopper_cta_pairs,
        block_m,
        splits,
        problem.varlen.is_some(),
        problem.seqlen_q,
        problem.seqlen_k,
    )
}

/// The persistent grid: [`grid`], capped by [`super::AttentionTuning::hopper_max_ctas`].
fn capped_grid(work_items: usize, sm_count: u32, max_ctas: Option<usize>) -> u32 {
    let g = grid(work_items, sm_count);
    max_ctas.map_or(g, |m| g.min(m.clamp(1, u32::MAX as usize) as u32))
}

/// Device addresses of a scheduler buffer's tile counter and work slots ([`scheduler_len`]).
fn scheduler_ptrs(scheduler: &WorkCounters) -> (u64, u64) {
    (scheduler.ptr(), scheduler.ptr_at(SCHEDULER_SLOTS_OFFSET))
}

/// The persistent launch, fixed by the problem (computed once by the plan).
struct HopperLaunch {
    /// Persistent CTAs ([`capped_grid`]; with CTA pairs two per cluster).
    grid: u32,
    /// Work items of the whole problem: `q_tiles * splits * B * Hq`, with CTA pairs
    /// `ceil(q_tiles / 2) * B * Hq` (the tail split, if any, takes the last ones).
    work_items: usize,
    /// Batch-heads per L2 section ([`l2_section_heads`]); the tail launch decodes its items in
    /// this launch's order, so it passes the same value.
    l2_heads: i32,
    /// The scheduler state ([`scheduler_len`]): the tile counter (zeroed by the plan; every
    /// launch leaves it at zero) and the CTAs' work slots. Launches of one plan are ordered on
    /// its context's stream.
    scheduler: WorkCounters,
}

/// The second launch of a plan whose work items leave a short last wave ([`tail_split`]): the
/// split-KV variant of the plan's kernel runs the last `items` items of the first launch's
/// order, `splits` ways each, into its own workspace, and the combine kernel merges them through
/// `meta` (flash_sm90.cu, combine.cu).
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
    /// Its persistent CTAs ([`capped_grid`] of `items * splits`).
    grid: u32,
}

/// The Hopper part of a plan: the persistent launch's shape and scheduler state, and the tail
/// split when the plan takes it.
pub struct HopperPlan {
    launch: HopperLaunch,
    tail: Option<TailSplit>,
}

impl HopperPlan {
    /// Sizes the persistent launch of `kernel` (the plan's compiled `variant`, `splits` KV
    /// splits of `k_tiles` key tiles, `q_tiles` query tiles per sequence) on `ctx`'s GPU, and
    /// plans the tail split.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        ctx: &Context,
        problem: &AttentionProblem,
        options: &AttentionOptions,
        variant: &Variant,
        kernel: &Kernel,
        q_tiles: usize,
        k_tiles: usize,
        splits: usize,
    ) -> Result<HopperPlan, Error> {
        let bh = problem.batch * problem.heads_q;
        let sms = ctx.info().sm_count;
        // With CTA pairs a work item is a pair of query tiles and the grid counts CTAs, two per
        // cluster, as many clusters as fit at once.
        let units = if variant.pair { q_tiles.div_ceil(2) } else { q_tiles };
        let work_items = units * splits * bh;
        let grid = if variant.pair {
            let resident = kernel.max_active_clusters(
                ctx,
                LaunchConfig::clustered(2, variant.threads, variant.shared_bytes(), 2),
            )? as usize;
            let cap = options.tuning.hopper_max_ctas.map_or(usize::MAX, |m| (m / 2).max(1));
            2 * work_items.min(resident).min(cap).max(1) as u32
        } else {
            capped_grid(work_items, sms, options.tuning.hopper_max_ctas)
        };
        // stream-ordered, before any launch of this plan
        let scheduler = WorkCounters::new(ctx, scheduler_len(sms))?;
        let launch = HopperLaunch {
            grid,
            work_items,
            l2_heads: l2_section_heads(
                ctx.info().l2_bytes,
                problem.seqlen_k,
                problem.head_dim,
                problem.group(),
                bh,
                units * splits,
                if variant.pair { grid as usize / 2 } else { grid as usize },
            ),
            scheduler,
        };
        // The tail split: equal items (no mask, no varlen), and no split-KV, neither the plan's
        // own nor forced (num_splits: Some(1) disables split-KV, the tail's included).
        let tail = if options.tuning.hopper_tail_split
            && options.tuning.num_splits.is_none()
            && splits == 1
            && !variant.pair
            && !variant.masked
            && problem.varlen.is_none()
        {
            match tail_split(launch.work_items, launch.grid as usize, k_tiles, MAX_SPLITS) {
                Some((items, tail_splits)) => {
                    let kernel = ctx.kernel(
                        &Variant {
                            split: true,
                            ..*variant
                        }
                        .spec(),
                    )?;
                    let combine = ctx.kernel(
                        &CombineVariant {
                            dtype: problem.dtype,
                            head_dim: variant.head_dim,
                        }
                        .spec(),
                    )?;
                    let rows = items * variant.block_m as usize;
                    let workspace = ctx.alloc::<f32>(tail_splits * rows * (variant.head_dim as usize + 1))?;
                    let mut meta = ctx.alloc::<i32>(3 * rows)?;
                    meta.fill_bytes(0xff)?; // b = -1: rows no item writes stay skipped
                    let scheduler = WorkCounters::new(ctx, scheduler_len(sms))?;
                    Some(TailSplit {
                        items,
                        splits: tail_splits,
                        kernel,
                        combine,
                        workspace,
                        meta,
                        scheduler,
                        grid: capped_grid(items * tail_splits, sms, options.tuning.hopper_max_ctas),
                    })
                }
                None => None,
            }
        } else {
            None
        };
        Ok(HopperPlan { launch, tail })
    }

    /// Persistent CTAs of the first launch (with CTA pairs two per cluster).
    pub fn grid(&self) -> u32 {
        self.launch.grid
    }

    /// The tail split this plan runs, `(items, splits)` ([`tail_split`]), if any.
    pub fn tail_split(&self) -> Option<(usize, usize)> {
        self.tail.as_ref().map(|t| (t.items, t.splits))
    }

    /// Bytes of device memory this part holds (scheduler state, the tail's workspace and meta).
    pub fn workspace_bytes(&self) -> usize {
        self.launch.scheduler.bytes()
            + self
                .tail
                .as_ref()
                .map_or(0, |t| t.workspace.bytes() + t.meta.bytes() + t.scheduler.bytes())
    }

    /// Launches `kernel` (the plan's `variant`) on the persistent grid with the Q, K and V
    /// tensor maps ([`tensor_maps`]), then the tail split's launch and merge, if any.
    pub fn launch(
        &self,
        ctx: &Context,
        kernel: &Kernel,
        variant: &Variant,
        params: &AttentionParams,
        (q_map, k_map, v_map): (TensorMap, TensorMap, TensorMap),
    ) -> Result<(), Error> {
        let launch = &self.launch;
        let (tile_counter, work_slots) = scheduler_ptrs(&launch.scheduler);
        let work = launch.work_items;
        let tail_items = self.tail.as_ref().map_or(0, |t| t.items);
        let hp = HopperParams {
            p: *params,
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
        let cfg = if variant.pair {
            LaunchConfig::clustered(launch.grid, variant.threads, variant.shared_bytes(), 2)
        } else {
            LaunchConfig::linear(launch.grid, variant.threads, variant.shared_bytes())
        };
        // SAFETY: `hp` mirrors HopperParams of flash_sm90.cu; the tensor maps describe the
        // validated q/k/v views (TMA clips every box to their extents; with pairs the K/V
        // boxes are the half tiles the kernel loads) and every other pointer is as for the
        // Ampere launch (AttentionPlan::run validated the views against the problem). A pair
        // kernel is launched in clusters of two, as its multicast copies and remote barrier
        // arrivals require.
        unsafe { kernel.launch(ctx, cfg, &hp)? };
        if let Some(t) = &self.tail {
            let rows = t.items * variant.block_m as usize;
            let (o_partial, lse_partial) = partial_ptrs(&t.workspace, t.splits * rows * variant.head_dim as usize);
            let (tile_counter, work_slots) = scheduler_ptrs(&t.scheduler);
            let tp = AttentionParams {
                o_partial,
                lse_partial,
                partial_rows: rows as i64,
                num_splits: t.splits as i32,
                tail_meta: t.meta.device_ptr(),
                ..*params
            };
            let thp = HopperParams {
                p: tp,
                work_items: (t.items * t.splits) as i32,
                tile_counter,
                work_slots,
                tail_first: (work - t.items) as i32,
                ..hp
            };
            let cfg = LaunchConfig::linear(t.grid, variant.threads, variant.shared_bytes());
            // SAFETY: as above; the split variant writes only the tail workspace and meta
            // rows (sized for items * block_m rows and splits) and reads what the first
            // launch reads. Stream order puts it after the first launch.
            unsafe { t.kernel.launch(ctx, cfg, &thp)? };
            // SAFETY: the combine reads the tail workspace and meta the launch before wrote
            // (same stream) and writes out/lse rows of the validated views that meta names.
            unsafe { t.combine.launch(ctx, combine_config(rows), &tp)? };
        }
        Ok(())
    }
}

/// The Q, K and V tensor maps of the kernel for the plan's `problem` and `variant` (views
/// already checked by the plan's alignment rule; all zero when nothing is launched).
pub fn tensor_maps(
    problem: &AttentionProblem,
    variant: &Variant,
    q: &TensorView,
    k: &TensorView,
    v: &TensorView,
    layout: QkvLayout,
    varlen: bool,
) -> Result<(TensorMap, TensorMap, TensorMap), TmaError> {
    let p = problem;
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
    let bm = variant.block_m;
    // CTA pairs load half of each key tile each (multicast to both).
    let bn = if variant.pair {
        variant.block_n / 2
    } else {
        variant.block_n
    };
    Ok((
        shape(q, rows_q, p.heads_q, bm).encode()?,
        shape(k, rows_k, p.heads_kv, bn).encode()?,
        shape(v, rows_k, p.heads_kv, bn).encode()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_layout_matches_the_kernel() {
        assert_eq!(std::mem::size_of::<AttentionParams>(), 256);
        assert_eq!(std::mem::size_of::<TensorMap>(), 128);
        assert_eq!(std::mem::size_of::<HopperParams>(), 704);
        assert_eq!(std::mem::offset_of!(HopperParams, q_map), 256);
        assert_eq!(std::mem::offset_of!(HopperParams, work_items), 640);
        assert_eq!(std::mem::offset_of!(HopperParams, l2_heads), 644);
        assert_eq!(std::mem::offset_of!(HopperParams, tile_counter), 648);
        assert_eq!(std::mem::offset_of!(HopperParams, work_slots), 656);
        assert_eq!(std::mem::offset_of!(HopperParams, tail_first), 664);
    }

    /// The tail split's rule, and the plans of verify.rs's tail cases (work items, capped grid,
    /// key tiles).
    #[test]
    fn tail_split_takes_short_last_waves_only() {
        let max = crate::attention::plan::MAX_SPLITS;
        // H200's non-causal B4 H16 N8192 D128 (176-key tiles): 4096 items on 132 CTAs
        // (15 splits of ceil(47 / 15) = 4 tiles would leave 3 empty: 12)
        assert_eq!(tail_split(4096, 132, 47, max), Some((4, 12)));
        // whole waves, a long last wave, one wave, no grid: none
        assert_eq!(tail_split(4224, 132, 47, max), None);
        assert_eq!(tail_split(2048, 132, 64, max), None); // 68 of 132 in the last wave
        assert_eq!(tail_split(100, 132, 64, max), None);
        assert_eq!(tail_split(100, 0, 64, max), None);
        // too few key tiles to split
        assert_eq!(tail_split(133, 132, 5, max), None);
        assert_eq!(tail_split(133, 132, 6, max), Some((1, 2)));
        // splits capped by max_splits
        assert_eq!(tail_split(133, 132, 1000, 64), Some((1, 63))); // 16 tiles each

        // verify.rs's tail cases
        assert_eq!(tail_split(27, 12, 9, max), Some((3, 3))); // B1 H3 N1100 D128
        assert_eq!(tail_split(13, 12, 8, max), Some((1, 2))); // B1 H13 Nq100 Nk1000 D128
        assert_eq!(tail_split(36, 16, 8, max), Some((4, 2))); // B2 H3 N1000 D64 (192 rows)
        assert_eq!(tail_split(30, 14, 11, max), Some((2, 3))); // B1 H5 N700 D256 (64 keys)
        assert_eq!(tail_split(56, 18, 7, max), Some((2, 2))); // B1 H8/2 N800 D128
        for (n, d, q_tiles) in [
            (1100usize, 128usize, 9usize),
            (100, 128, 1),
            (1000, 64, 6),
            (700, 256, 6),
            (800, 128, 7),
        ] {
            let (block_m, _, _, _) = tiles(head_dim(d), block_n_choices(head_dim(d))[0]).unwrap();
            assert_eq!(n.div_ceil(block_m as usize), q_tiles, "N {n} D {d}");
        }
    }

    /// A mirror of flash_sm90.cu's `decode_order`: item `w` of `bh` batch-heads with `q_tiles`
    /// query tiles and `splits` splits each, in L2 sections of `l2_heads` (the remainder first).
    /// Returns (batch-head, query tile, split).
    fn decode_order(w: usize, bh: usize, q_tiles: usize, splits: usize, l2_heads: usize) -> (usize, usize, usize) {
        let head_items = q_tiles * splits;
        let rem = bh % l2_heads;
        let (first, heads, r) = if w < rem * head_items {
            (0, rem, w)
        } else {
            let w2 = w - rem * head_items;
            (
                rem + w2 / (l2_heads * head_items) * l2_heads,
                l2_heads,
                w2 % (l2_heads * head_items),
            )
        };
        let per_tile = heads * splits;
        (first + r % heads, q_tiles - 1 - r / per_tile, r % per_tile / heads)
    }

    /// The first launch (work - tail items in its order) and the tail launch (the rest, each
    /// split tail_splits ways, decoded as flash_sm90.cu's `decode_work` does) cover every
    /// (batch-head, query tile) and every key tile of it exactly once, with no split left empty.
    #[test]
    fn tail_split_covers_every_item_and_key_once() {
        let mut seen_tail = 0;
        for bh in [1usize, 3, 5, 13, 32, 64] {
            for q_tiles in [1usize, 2, 7, 64] {
                for grid in [4usize, 12, 18, 132] {
                    for key_tiles in [6usize, 7, 11, 47] {
                        let work = bh * q_tiles;
                        let Some((tail, splits)) = tail_split(work, grid, key_tiles, 64) else {
                            continue;
                        };
                        seen_tail += 1;
                        assert!(tail * splits <= grid && work - tail >= grid);
                        for l2_heads in [1usize, 2, 5, bh] {
                            let l2_heads = l2_heads.clamp(1, bh);
                            let mut items = vec![0u32; work];
                            for w in 0..work - tail {
                                let (b, q, s) = decode_order(w, bh, q_tiles, 1, l2_heads);
                                assert_eq!(s, 0);
                                items[b * q_tiles + q] += 1;
                            }
                            let mut tiles = vec![vec![0u32; key_tiles]; work];
                            for w in 0..tail * splits {
                                let (b, q, _) = decode_order(work - tail + w / splits, bh, q_tiles, 1, l2_heads);
                                let split = w % splits;
                                if split == 0 {
                                    items[b * q_tiles + q] += 1;
                                }
                                // key_tiles with kSplit and no mask
                                let per = key_tiles.div_ceil(splits);
                                let t0 = split * per;
                                let t1 = key_tiles.min(t0 + per);
                                assert!(t0 < t1, "empty split {split} of {splits} over {key_tiles} tiles");
                                for t in tiles[b * q_tiles + q].iter_mut().take(t1).skip(t0) {
                                    *t += 1;
                                }
                            }
                            assert!(items.iter().all(|&n| n == 1), "bh {bh} q_tiles {q_tiles} grid {grid}");
                            for (i, t) in tiles.iter().enumerate() {
                                let in_tail = t.iter().any(|&n| n > 0);
                                if in_tail {
                                    assert!(t.iter().all(|&n| n == 1), "item {i}: key tiles {t:?}");
                                }
                            }
                            assert_eq!(tiles.iter().filter(|t| t[0] > 0).count(), tail);
                        }
                    }
                }
            }
        }
        assert!(seen_tail > 20, "the sweep reaches the tail split ({seen_tail} plans)");
    }

    #[test]
    fn cta_pairs_where_they_pay_and_the_kernel_has_them() {
        // Measured rule: long sequences by default, shorter ones only when forced.
        assert!(use_cta_pairs(None, 128, 1, false, 32768, 32768));
        assert!(use_cta_pairs(None, 128, 1, false, 4096, 4096));
        assert!(!use_cta_pairs(None, 128, 1, false, 2048, 2048));
        assert!(!use_cta_pairs(None, 128, 1, false, 4096, 1000));
        assert!(use_cta_pairs(Some(true), 128, 1, false, 100, 100));
        assert!(!use_cta_pairs(Some(false), 128, 1, false, 32768, 32768));
        // Never: three consumers (D = 64), split-KV, varlen.
        for forced in [None, Some(true)] {
            assert!(!use_cta_pairs(forced, 192, 1, false, 32768, 32768));
            assert!(!use_cta_pairs(forced, 128, 2, false, 32768, 32768));
        }
        assert!(!use_cta_pairs(None, 128, 1, true, 32768, 32768));
        assert!(use_cta_pairs(Some(true), 128, 1, true, 32768, 32768));
    }

    #[test]
    fn tiles_fit_in_shared_memory() {
        for d in [64, 128, 192, 256] {
            for &n in block_n_choices(d) {
                let (m, n, _, s) = tiles(d, n).unwrap();
                assert!(shared_bytes(m, n, s, d) <= 227 * 1024, "d {d} n {n}");
            }
        }
        assert!(matches!(tiles(128, 64), Err(Error::Unsupported(_))));
        assert!(matches!(tiles(64, 176), Err(Error::Unsupported(_))));
        assert_eq!(head_dim(80), 128);
        assert_eq!(head_dim(64), 64);
        assert_eq!(head_dim(200), 256);
    }

    #[test]
    fn long_key_tiles_where_they_pay() {
        let causal = (-1, 0);
        let full = (-1, -1);
        // The measured shapes (see NOTES.md): long causal and non-causal sequences take 176 ...
        assert_eq!(choose_block_n(128, 16384, 16384, causal, false), LONG_BLOCK_N);
        assert_eq!(choose_block_n(128, 32768, 32768, causal, false), LONG_BLOCK_N);
        assert_eq!(choose_block_n(128, 8192, 8192, full, false), LONG_BLOCK_N);
        // ... short causal ones, varlen batches and the other head dims keep their tile.
        for n in [512, 1024, 2048, 4096, 8192] {
            assert_eq!(choose_block_n(128, n, n, causal, false), 128, "n {n}");
        }
        assert_eq!(choose_block_n(128, 8192, 8192, causal, true), 128);
        assert_eq!(choose_block_n(64, 32768, 32768, causal, false), 128);
        assert_eq!(choose_block_n(256, 32768, 32768, causal, false), 64);
        // Around the causal switch-over (documented on choose_block_n).
        assert_eq!(choose_block_n(128, 9216, 9216, causal, false), 128);
        assert_eq!(choose_block_n(128, 12288, 12288, causal, false), LONG_BLOCK_N);
        // Padding decides: 4096 keys pad 3% to 4224 (33 tiles of 128 hold 4097 .. 4224 keys
        // as 24 of 176 do), 5632 = 32 x 176 not at all.
        assert_eq!(choose_block_n(128, 4096, 4096, full, false), 128);
        assert_eq!(choose_block_n(128, 4097, 4097, full, false), LONG_BLOCK_N);
        assert_eq!(choose_block_n(128, 5632, 5632, full, false), LONG_BLOCK_N);
        assert_eq!(choose_block_n(128, 2112, 2112, full, false), LONG_BLOCK_N);
        // A narrow sliding window pads every query tile.
        assert_eq!(choose_block_n(128, 32768, 32768, (256, 0), false), 128);
        // Fewer queries than LONG_TILE_MIN_QUERIES (decode-like rows) keep 128.
        assert_eq!(choose_block_n(128, 1, 32768, full, false), 128);
        assert_eq!(choose_block_n(128, 2047, 32768, full, false), 128);
        assert_eq!(choose_block_n(128, 0, 0, full, false), 128);
    }

    /// padded_keys against a row-by-row construction from the mask's definition (query i sees
    /// keys j with i + Nk - Nq - left <= j <= i + Nk - Nq + right, within 0..Nk).
    #[test]
    fn padded_keys_match_a_row_by_row_count() {
        let reference = |nq: usize, nk: usize, (left, right): (i32, i32), bm: usize, bn: usize| -> u64 {
            let mut keys = 0u64;
            for m0 in (0..nq).step_by(bm) {
                let (mut lo, mut hi) = (i64::MAX, i64::MIN);
                for i in m0..(m0 + bm).min(nq) {
                    let d = i as i64 + nk as i64 - nq as i64;
                    let first = if left < 0 { 0 } else { (d - left as i64).max(0) };
                    let end = if right < 0 {
                        nk as i64
                    } else {
                        (d + right as i64 + 1).min(nk as i64)
                    };
                    if end > first {
                        lo = lo.min(first);
                        hi = hi.max(end);
                    }
                }
                if hi > lo {
                    let b = bn as i64;
                    keys += ((hi + b - 1) / b - lo / b) as u64 * bn as u64;
                }
            }
            keys
        };
        let sizes = [1, 17, 127, 128, 129, 176, 300, 1000];
        let windows = [
            (-1, -1),
            (-1, 0),
            (0, 0),
            (100, 0),
            (10, 3),
            (-1, 5),
            (3, -1),
            (500, 200),
        ];
        for &nq in &sizes {
            for &nk in &sizes {
                for &w in &windows {
                    for (bm, bn) in [(128, 128), (128, 176), (192, 128)] {
                        assert_eq!(
                            padded_keys(nq, nk, w, bm, bn),
                            reference(nq, nk, w, bm, bn),
                            "nq {nq} nk {nk} window {w:?} tiles {bm} x {bn}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn padded_keys_follow_the_mask() {
        // Causal 256 x 256, query tiles of 128: keys 0..128 and 0..256.
        assert_eq!(padded_keys(256, 256, (-1, 0), 128, 128), 128 + 256);
        assert_eq!(padded_keys(256, 256, (-1, 0), 128, 176), 176 + 352);
        // Bottom-right alignment: 128 queries over 1000 keys see all 1000 (8 tiles of 128).
        assert_eq!(padded_keys(128, 1000, (-1, 0), 128, 128), 1024);
        // Window (100, 0) at 256 x 256: tile 1 (rows 128..255) sees keys 28..255; at 1000 x
        // 1000 the left edge drops whole key tiles (tile 7, rows 896..999, sees 796..999).
        assert_eq!(padded_keys(256, 256, (100, 0), 128, 128), 128 + 256);
        assert_eq!(padded_keys(1000, 1000, (100, 0), 128, 128), 128 + 7 * 256);
        // Causal 1000 queries over 100 keys (bottom-right): rows < 900 see nothing, so only
        // the query tiles from 896 on count.
        assert_eq!(padded_keys(1000, 100, (-1, 0), 128, 128), 128);
        // Window (10, 0) at 1000 x 1000: one key tile for the first query tile, two for the rest.
        assert_eq!(padded_keys(1000, 1000, (10, 0), 128, 128), 15 * 128);
    }

    #[test]
    fn l2_sections() {
        let l2 = 50 << 20;
        // Causal N = 32768, D = 128 on 132 CTAs: 256 query tiles per head, 16 MiB of K/V: four
        // waves want 3 heads, which fit the L2 (48 MiB).
        assert_eq!(l2_section_heads(l2, 32768, 128, 1, 32, 256, 132), 3);
        // N = 8192: 64 tiles, 4 MiB per head: 9 heads.
        assert_eq!(l2_section_heads(l2, 8192, 128, 1, 32, 64, 132), 9);
        // GQA 32/8 at N = 4096: 32 tiles, 0.5 MiB of K/V per query head: 17 heads.
        assert_eq!(l2_section_heads(l2, 4096, 128, 4, 128, 32, 132), 17);
        // The L2 caps a section (1 MiB-key heads: 1 GiB of K/V each) and so do the heads.
        assert_eq!(l2_section_heads(l2, 1 << 20, 256, 1, 32, 8192, 132), 1);
        assert_eq!(l2_section_heads(l2, 1 << 17, 128, 1, 32, 1, 132), 1);
        assert_eq!(l2_section_heads(l2, 128, 64, 1, 8, 1, 132), 8);
    }
}
