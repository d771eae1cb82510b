//! The decode kernel (`gemm_skinny.cu`): M <= 16 rows times weights stored [N, K], fp16/bf16,
//! bandwidth-bound, split over K when the grid is short, with the deterministic second pass
//! `gemm_splitk.cu`.

use crate::dtype::DType;
use crate::runtime::{KernelKey, KernelSpec, LaunchConfig};

/// Sources of the kernel and of its split-K reduction.
pub const SOURCE: &str = include_str!("gemm_skinny.cu");
pub const REDUCE_SOURCE: &str = include_str!("gemm_splitk.cu");
pub const THREADS: u32 = 256;
/// Most rows of A.
pub const MAX_M: usize = 16;
/// Output columns per CTA (8 warps x 8).
pub const TILE_N: usize = 64;
/// K per shared stage of A; split boundaries are multiples of it.
pub const CHUNK_K: usize = 256;
/// Most K splits.
pub const MAX_SPLITS: usize = 32;
/// CTAs per SM the split count aims at (enough weight loads in flight to cover the latency).
pub const CTAS_PER_SM: usize = 4;

/// One variant of the main kernel: input and output dtypes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SkinnyVariant {
    pub input: DType,
    pub out: DType,
}

impl SkinnyVariant {
    pub fn key(&self) -> KernelKey {
        KernelKey::new("gemm_skinny").ty("Elem", self.input).ty("Out", self.out)
    }
    pub fn spec(&self) -> KernelSpec {
        self.key()
            .spec("gemm_skinny.cu", SOURCE, "gemm_skinny", super::DEVICE_HEADERS)
    }
    /// One CTA per TILE_N columns, split and batch entry; a programmatic dependent launch (the
    /// kernel waits for the previous grid at entry): decode GEMMs are launch-latency bound.
    pub fn launch_config(n: usize, splits: usize, batch: usize) -> LaunchConfig {
        LaunchConfig {
            grid: (n.div_ceil(TILE_N) as u32, splits as u32, batch as u32),
            ..LaunchConfig::linear(1, THREADS, 0).with_dependent_launch()
        }
    }
}

/// The split-K reduction for output dtype `out`.
pub fn reduce_key(out: DType) -> KernelKey {
    KernelKey::new("gemm_splitk_reduce").ty("Out", out)
}
pub fn reduce_spec(out: DType) -> KernelSpec {
    reduce_key(out).spec(
        "gemm_splitk.cu",
        REDUCE_SOURCE,
        "gemm_splitk_reduce",
        super::DEVICE_HEADERS,
    )
}
/// The reduction's launch over `elements` outputs (grid-stride, at most 8 CTAs per SM), a
/// programmatic dependent launch after the products (it waits for them at entry).
pub fn reduce_config(elements: usize, sm_count: u32) -> LaunchConfig {
    let ctas = elements
        .div_ceil(THREADS as usize)
        .clamp(1, 8 * sm_count.max(1) as usize);
    LaunchConfig::linear(ctas as u32, THREADS, 0).with_dependent_launch()
}

/// (splits, k_per_split) for N columns, depth K and `batch` entries on `sm_count` SMs: enough
/// CTAs for [`CTAS_PER_SM`] per SM, each split at least one [`CHUNK_K`] slice and at most
/// [`MAX_SPLITS`]; `forced` overrides the count (still clamped to the slices). k_per_split is
/// a multiple of CHUNK_K and the returned count is the number of non-empty splits.
pub fn choose_splits(n: usize, k: usize, batch: usize, sm_count: u32, forced: Option<u32>) -> (usize, usize) {
    let slices = k.div_ceil(CHUNK_K).max(1);
    let ctas = n.div_ceil(TILE_N) * batch.max(1);
    let want = forced.map_or_else(
        || (CTAS_PER_SM * sm_count.max(1) as usize).div_ceil(ctas.max(1)),
        |s| s as usize,
    );
    let splits = want.clamp(1, MAX_SPLITS).min(slices);
    let per = slices.div_ceil(splits) * CHUNK_K;
    (slices.div_ceil(per / CHUNK_K), per)
}

/// Every variant of the main kernel (2 inputs x 3 outputs).
pub fn all_variants() -> Vec<SkinnyVariant> {
    let mut v = Vec::new();
    for input in [DType::F16, DType::BF16] {
        for out in [DType::F16, DType::BF16, DType::F32] {
            v.push(SkinnyVariant { input, out });
        }
    }
    v
}
