//! The sm_80+ tensor-core kernel (`gemm_sm80.cu`): fp16/bf16 inputs, ldmatrix + mma.sync +
//! a 3-stage cp.async pipeline, 128 x 128 x 64 CTA tiles, fused epilogue.

use crate::dtype::DType;
use crate::runtime::{KernelKey, KernelSpec, LaunchConfig};

/// Source of the kernel.
pub const SOURCE: &str = include_str!("gemm_sm80.cu");
/// CTA tile (M, N, K) and pipeline depth, as in the kernel.
pub const TILE_M: usize = 128;
pub const TILE_N: usize = 128;
pub const TILE_K: usize = 64;
pub const STAGES: usize = 3;
pub const THREADS: u32 = 256;
/// Dynamic shared memory: STAGES x (A tile + B tile) of 2-byte elements (96 KiB).
pub const SHARED_BYTES: u32 = (STAGES * (TILE_M + TILE_N) * TILE_K * 2) as u32;
/// Elements per 16-byte cp.async chunk: leading dimensions and batch strides must be multiples.
pub const VEC: usize = 8;

/// One variant: input and output dtypes and B's layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Sm80Variant {
    pub input: DType,
    pub out: DType,
    /// B stored [N, K].
    pub b_col_major: bool,
    /// The GLU epilogue (gemm_sm80.cu's kGlu): B has 2N interleaved gate/up columns.
    pub glu: bool,
}

impl Sm80Variant {
    pub fn key(&self) -> KernelKey {
        KernelKey::new("gemm_sm80")
            .ty("Elem", self.input)
            .ty("Out", self.out)
            .flag("kBColMajor", "nk", self.b_col_major)
            .flag("kGlu", "glu", self.glu)
    }
    pub fn spec(&self) -> KernelSpec {
        self.key()
            .spec("gemm_sm80.cu", SOURCE, "gemm_sm80", super::DEVICE_HEADERS)
    }
    /// The launch for an M x N problem of `batch` entries (N: B's columns, 2N with a GLU).
    pub fn launch_config(m: usize, n: usize, batch: usize) -> LaunchConfig {
        LaunchConfig {
            grid: (n.div_ceil(TILE_N) as u32, m.div_ceil(TILE_M) as u32, batch as u32),
            ..LaunchConfig::linear(1, THREADS, SHARED_BYTES)
        }
    }
}

/// Every variant (2 inputs x 3 outputs x 2 B layouts x {plain, GLU}).
pub fn all_variants() -> Vec<Sm80Variant> {
    let mut v = Vec::new();
    for glu in [false, true] {
        for input in [DType::F16, DType::BF16] {
            for out in [DType::F16, DType::BF16, DType::F32] {
                for b_col_major in [false, true] {
                    v.push(Sm80Variant {
                        input,
                        out,
                        b_col_major,
                        glu,
                    });
                }
            }
        }
    }
    v
}
