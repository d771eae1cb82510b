//! The sm_80+ tensor-core kernel (`gemm_sm80.cu`): fp16/bf16, tf32 and int8 inputs (fp8 on
//! sm_89+), ldmatrix + mma.sync + a 3-stage cp.async pipeline, 128 x 128 CTA tiles of 128-byte
//! K rows, fused epilogue.

use crate::dtype::DType;
use crate::runtime::{Arch, KernelKey, KernelSpec, LaunchConfig};

/// Source of the kernel.
pub const SOURCE: &str = include_str!("gemm_sm80.cu");
/// CTA tile (M, N, K) and pipeline depth, as in the kernel.
pub const TILE_M: usize = 128;
pub const TILE_N: usize = 128;
/// K tile in bytes (128 / element size elements).
pub const TILE_K_BYTES: usize = 128;
pub const STAGES: usize = 3;
pub const THREADS: u32 = 256;
/// Dynamic shared memory: STAGES x (A tile + B tile) of 128-byte rows (96 KiB).
pub const SHARED_BYTES: u32 = (STAGES * (TILE_M + TILE_N) * TILE_K_BYTES) as u32;
/// Bytes per cp.async chunk: leading dimensions and batch strides must be multiples.
pub const VEC_BYTES: usize = 16;

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

/// The outputs of each input on this path (the precision contracts; fp16 and bf16 also write
/// each other).
pub fn outputs(input: DType) -> &'static [DType] {
    match input {
        DType::F16 | DType::BF16 => &[DType::F16, DType::BF16, DType::F32],
        DType::F32 => &[DType::F32],
        DType::I8 => &[DType::I32, DType::F16, DType::BF16, DType::F32],
        DType::F8E4M3 | DType::F8E5M2 => &[DType::F16, DType::BF16, DType::F32, DType::F8E4M3, DType::F8E5M2],
        _ => &[],
    }
}

/// Whether `arch` has the mma.sync instruction of `input` (fp8: sm_89+; the rest sm_80+).
pub fn arch_supports(input: DType, arch: Arch) -> bool {
    match input {
        DType::F8E4M3 | DType::F8E5M2 => (arch.major, arch.minor) >= (8, 9),
        _ => arch.major >= 8,
    }
}

/// Every variant for `arch`: the 16-bit inputs (2 inputs x 3 outputs x 2 B layouts x {plain,
/// GLU}), tf32 (1) and int8 (4 outputs) with B [N, K], and on sm_89+ fp8 (2 x 5 outputs).
pub fn variants(arch: Arch) -> Vec<Sm80Variant> {
    let mut v = sixteen_bit_variants();
    for input in [DType::F32, DType::I8, DType::F8E4M3, DType::F8E5M2] {
        if !arch_supports(input, arch) {
            continue;
        }
        for &out in outputs(input) {
            v.push(Sm80Variant {
                input,
                out,
                b_col_major: true,
                glu: false,
            });
        }
    }
    v
}

/// The 16-bit variants (2 inputs x 3 outputs x 2 B layouts x {plain, GLU}).
fn sixteen_bit_variants() -> Vec<Sm80Variant> {
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
