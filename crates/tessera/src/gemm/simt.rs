//! The CUDA-core kernel (`gemm_simt.cu`): exact fp32, fp64 before sm_80, and fp16/bf16
//! operands that miss the tensor-core paths' alignment rule. Any layout, any alignment.

use crate::dtype::DType;
use crate::runtime::{KernelKey, KernelSpec, LaunchConfig};

/// Source of the kernel.
pub const SOURCE: &str = include_str!("gemm_simt.cu");
pub const THREADS: u32 = 256;

/// One variant: input and output dtypes (the accumulator is f64 for f64 inputs, else f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SimtVariant {
    pub input: DType,
    pub out: DType,
    /// The GLU epilogue (gemm_simt.cu's kGlu): B has 2N interleaved gate/up columns.
    pub glu: bool,
}

impl SimtVariant {
    /// Rows (and columns) of D per thread: 8 (a 128 x 128 CTA tile), 4 for f64 (64 x 64: the
    /// f64 accumulators take twice the registers).
    pub fn thread_tile(&self) -> usize {
        if self.input == DType::F64 {
            4
        } else {
            8
        }
    }
    pub fn tile(&self) -> usize {
        16 * self.thread_tile()
    }
    pub fn key(&self) -> KernelKey {
        let acc = if self.input == DType::F64 {
            DType::F64
        } else {
            DType::F32
        };
        KernelKey::new("gemm_simt")
            .ty("In", self.input)
            .ty("Out", self.out)
            .ty("Acc", acc)
            .int("kTM", "tm", self.thread_tile() as i64)
            .flag("kGlu", "glu", self.glu)
    }
    pub fn spec(&self) -> KernelSpec {
        self.key()
            .spec("gemm_simt.cu", SOURCE, "gemm_simt", super::DEVICE_HEADERS)
    }
    /// The launch for an M x N problem of `batch` entries (N: B's columns, 2N with a GLU).
    pub fn launch_config(&self, m: usize, n: usize, batch: usize) -> LaunchConfig {
        let t = self.tile();
        LaunchConfig {
            grid: (n.div_ceil(t) as u32, m.div_ceil(t) as u32, batch as u32),
            ..LaunchConfig::linear(1, THREADS, 0)
        }
    }
}

/// Every variant: fp32 -> fp32, fp64 -> fp64, fp16/bf16 -> fp16/bf16/fp32, each plain and GLU.
pub fn all_variants() -> Vec<SimtVariant> {
    let mut v = Vec::new();
    for glu in [false, true] {
        v.push(SimtVariant {
            input: DType::F32,
            out: DType::F32,
            glu,
        });
        v.push(SimtVariant {
            input: DType::F64,
            out: DType::F64,
            glu,
        });
        for input in [DType::F16, DType::BF16] {
            for out in [DType::F16, DType::BF16, DType::F32] {
                v.push(SimtVariant { input, out, glu });
            }
        }
    }
    v
}
