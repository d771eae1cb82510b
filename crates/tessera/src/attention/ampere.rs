//! Host side of the Ampere attention path (`flash_sm80.cu`, any `sm_80+`): tile choice, the
//! work-order sections, and the launch.
//!
//! Grid: `(B * Hq, q_tiles, splits)`, blocks launched in x-fastest order; the kernel maps each
//! block's linear index to a (batch-head, query tile) pair in sections of [`sm80_head_group`]
//! batch-heads, each section's query tiles longest first (causal) with its heads interleaved:
//! the CTAs resident at once share the K/V of few heads in L2, and the longest tiles still start
//! early. With `splits > 1` each split writes normalised partial outputs and LSEs to the plan's
//! workspace, merged by `combine.cu` ([`super::plan`]).

use super::plan::{heads_for_waves, AttentionParams, Tiles, Variant};
use super::{AttentionOptions, AttentionProblem};
use crate::error::{Error, Result};
use crate::runtime::{Arch, Context, Kernel, LaunchConfig};

/// Largest grid y (query tiles per sequence on the Ampere path).
pub const MAX_GRID_Y: usize = 65535;

/// The compiled head dim and tiles `(block_m, block_n, threads, stages)` of a problem:
/// [`sm80_tiles`] by the GPU's shared memory per SM, or the key tile forced by
/// [`super::AttentionTuning::sm80_block_n`].
pub fn tiles(ctx: &Context, problem: &AttentionProblem, options: &AttentionOptions) -> (u32, Tiles) {
    let d = super::plan::compiled_head_dim(problem.head_dim);
    let softcap = options.softcap > 0.0;
    let tiles = match options.tuning.sm80_block_n {
        Some(n) => sm80_tiles_keyed(d, softcap, n == 64),
        None => sm80_tiles(d, softcap, ctx.info().max_shared_per_sm),
    };
    (d, tiles)
}

/// The grid puts query tiles on y (at most [`MAX_GRID_Y`] blocks): an error for longer sequences.
pub fn check_query_tiles(problem: &AttentionProblem, q_tiles: usize, block_m: u32) -> Result<()> {
    if q_tiles > MAX_GRID_Y {
        return Err(Error::Unsupported(format!(
            "{} queries per sequence need {q_tiles} query tiles of {block_m} on the {} path, more \
             than its {MAX_GRID_Y}; split the sequence",
            problem.seqlen_q,
            super::AttentionPath::Sm80.name()
        )));
    }
    Ok(())
}

/// The Ampere part of a plan: the grid and the work order's section size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AmperePlan {
    /// `(B * Hq, q_tiles, splits)`.
    pub grid: (u32, u32, u32),
    /// Batch-heads per work-order section ([`sm80_head_group`], or
    /// [`super::AttentionTuning::sm80_heads_per_section`]).
    pub head_group: usize,
}

impl AmperePlan {
    /// Sizes the grid and the work-order sections for `kernel` (the plan's compiled variant)
    /// on `ctx`'s GPU.
    pub fn new(
        ctx: &Context,
        problem: &AttentionProblem,
        options: &AttentionOptions,
        variant: &Variant,
        kernel: &Kernel,
        q_tiles: usize,
        splits: usize,
    ) -> Result<AmperePlan> {
        let bh = problem.batch * problem.heads_q;
        let resident = kernel.max_active_blocks_per_sm(ctx, variant.threads, variant.shared_bytes())? as usize
            * ctx.info().sm_count as usize;
        let kv_bytes = 2 * problem.seqlen_k * problem.head_dim * problem.dtype.size();
        let kv_group = problem.heads_q / problem.heads_kv.max(1);
        let head_group = match options.tuning.sm80_heads_per_section {
            Some(n) => n.min(bh.max(1)),
            None => sm80_head_group(bh, q_tiles, resident, kv_group, kv_bytes, ctx.info().l2_bytes as usize),
        };
        Ok(AmperePlan {
            grid: (bh as u32, q_tiles as u32, splits as u32),
            head_group,
        })
    }

    /// Launches `kernel` (the plan's `variant`) over the grid.
    pub fn launch(&self, ctx: &Context, kernel: &Kernel, variant: &Variant, params: &AttentionParams) -> Result<()> {
        let cfg = LaunchConfig {
            grid: self.grid,
            block: (variant.threads, 1, 1),
            shared_bytes: variant.shared_bytes(),
            cluster_x: 1,
            dependent_launch: false,
            cooperative: false,
        };
        // SAFETY: `params` mirrors ts::AttentionParams; every pointer is a live device
        // allocation of the size the validated views and this plan's problem imply
        // (q/k/v/out and lse were checked against the problem by AttentionPlan::run, the
        // workspace was sized for it), and the kernel reads and writes only inside those
        // extents.
        unsafe { kernel.launch(ctx, cfg, params) }
    }
}

/// Tiles of the Ampere kernel for a compiled head dim: `(block_m, block_n, threads, stages)`.
/// Each warp owns `block_m / (threads / 32)` query rows (whole m16 blocks; flash_sm80.cu).
/// - D <= 64: FlashAttention-2's 4 warps of 32 rows (every K/V fragment feeds two row blocks:
///   half the ldmatrix traffic per MMA), 64 keys per tile, 3 stages (64 KiB), Q re-read from
///   shared memory: two CTAs per SM (8 warps of 16 rows over 128 x 128 tiles needed too many
///   registers for two).
/// - D <= 128: the same 4 warps of 32 rows. Where two such CTAs of 96 KiB fit an SM
///   (`shared_per_sm`, the device's shared memory per multiprocessor: Hopper's 228 KiB), 64 keys
///   per tile and 2 stages: the 2 x (D / 2) accumulator and the 2 x 32 scores fit in 255
///   registers with lazy rescaling (flash_sm80.cu, tuning steps 3-4; measured in NOTES.md).
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

/// Waves of resident CTAs an Ampere section aims for where the heads' K/V together exceed L2 but
/// one head's does not (see [`sm80_head_group`]).
pub const SM80_SECTION_WAVES: f64 = 2.0;

/// Batch-heads per section of the Ampere kernel's work order (flash_sm80.cu, `work_tile`), for
/// `batch_heads` query heads of `q_tiles` query tiles each, `kv_group` query heads per K/V head,
/// `kv_bytes_per_head` bytes of K and V per K/V head and `resident_ctas` CTAs on the GPU at once.
/// - One head's K/V over a quarter of L2: the CTAs that run every head's same query tile
///   together drift apart along their heads' keys faster than L2 keeps them, so sections of the
///   fewest heads that hold [`super::plan::SECTION_WAVES`] (4) waves: within a section the longest causal
///   tiles start first and the next section fills in behind them, while the CTAs running
///   together read the K/V of few heads and L2 serves it to many of them.
/// - Else, where all heads' K/V exceed L2: sections of the divisor of `batch_heads` nearest (by
///   ratio) to [`SM80_SECTION_WAVES`] (2) waves, between half and twice that, whose K/V fit L2.
///   Only divisors: the kernel's last section takes the remainder, and a short last section
///   leaves the launch's tail to a fraction of a wave. No such divisor: one section.
/// - Else one section: every head's same query tile together, globally longest first.
///
/// The measurements behind the rule (sections against one section, N = 2048 to 32768) are in
/// NOTES.md.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::plan::{ci_variants_for, AttentionPath};
    use crate::dtype::DType;

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

        // All heads over L2: the divisor nearest two waves.
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
