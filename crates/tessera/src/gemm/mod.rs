//! Dense GEMM with a fused epilogue: `D = act(alpha * op(A) @ op(B) + beta * C + bias) + R`.
//!
//! Shapes (per batch entry): A is `[M, K]`, B is `[K, N]`, C, R (residual) and D are `[M, N]`,
//! bias is `[N]` (one value per output column, shared by the batch). Storage:
//! - A row-major (`A[m, k]` at `m * lda + k`, `lda >= K`) or column-major (`A[m, k]` at
//!   `k * lda + m`, `lda >= M`, i.e. a row-major `[K, M]` array);
//! - B row-major `[K, N]` (`B[k, n]` at `k * ldb + n`, `ldb >= N`) or column-major, which is the
//!   `[N, K]` row-major layout LLM weights are stored in (`B[k, n]` at `n * ldb + k`, `ldb >= K`);
//! - C, R and D row-major with their own leading dimensions (`>= N`);
//! - batched with element strides between the batch entries (`batch_stride_*`; 0 shares one
//!   operand across the batch, e.g. one weight matrix). C may be D itself ([`COperand::D`]):
//!   every element of C is read by the thread that then writes it.
//!
//! The epilogue order is cuBLASLt's (`gemm/epilogue.cuh` is the device side, shared by every
//! kernel): the bias is added before the activation, the residual after it; a term that is not
//! requested is absent, not added as zero.
//!
//! Precision contracts ([`Precision`]): fp16 and bf16 inputs accumulate in f32 and write fp16,
//! bf16 or fp32 ([`GemmProblem::out`]); fp32 is exact fp32 on CUDA cores (never tf32); fp64 uses
//! the DMMA tensor cores (`mma.sync` f64: m16n8k16 on sm_90, m8n8k4 on sm_80+) or CUDA cores. C,
//! bias and R have D's dtype. tf32, fp8 and int8 are named but not yet implemented: planning
//! them returns [`Error::Unsupported`].
//!
//! Dispatch ([`plan`]): fp16/bf16 with M <= 16 and B as `[N, K]` take the skinny (decode) path,
//! bandwidth-bound and split over K; other fp16/bf16 problems the sm_80 tensor-core kernel
//! (ldmatrix + mma.sync + cp.async pipeline) when the operands meet its 16-byte alignment rule,
//! else the SIMT kernel (slower; [`GemmPlan::path`] says which ran). [`GemmTuning::path`] forces
//! a path for benchmarks and tests.
//!
//! GLU epilogues ([`Glu`]: SwiGLU, GeGLU): `D = act(X Wg^T) * (X Wu^T)` as one GEMM over a B of
//! `2N` interleaved gate/up columns (layout and the one-time [`GluInterleave`] in [`glu`]); the
//! Hopper, sm80 and SIMT paths run them.
//!
//! Plan once, run many: [`GemmPlan::new`] validates the problem, chooses and compiles the
//! kernel and allocates any workspace; [`GemmPlan::run`] checks the operands against the plan
//! and launches, allocating nothing.
//!
//! ```no_run
//! # fn main() -> tessera::Result<()> {
//! use tessera::gemm::{Activation, COperand, GemmOperands, GemmOptions, GemmPlan, GemmProblem, Layout, Precision};
//! use tessera::runtime::Context;
//! use tessera::DType;
//! let ctx = Context::new(0)?;
//! let (m, n, k) = (128, 4096, 4096);
//! // y = gelu(x W^T + b), W stored [N, K] as in a checkpoint
//! let problem = GemmProblem::new(Precision::BF16, DType::BF16, m, n, k)
//!     .b_layout(Layout::ColMajor)
//!     .bias(true)
//!     .activation(Activation::GeluErf);
//! let plan = GemmPlan::new(&ctx, &problem, &GemmOptions::default())?;
//! let x = ctx.alloc::<half::bf16>(m * k)?;
//! let w = ctx.alloc::<half::bf16>(n * k)?;
//! let b = ctx.alloc::<half::bf16>(n)?;
//! let mut y = ctx.alloc::<half::bf16>(m * n)?;
//! let ops = GemmOperands {
//!     a: x.matrix(m, k, k)?,
//!     b: w.matrix(n, k, k)?,
//!     c: COperand::None,
//!     bias: Some(b.view(&[n], &[1])?),
//!     residual: None,
//! };
//! plan.run(1.0, 0.0, &ops, &mut y.matrix_mut(m, n, n)?)?;
//! # Ok(()) }
//! ```

pub mod autotune;
#[cfg(feature = "harness")]
pub mod bench;
pub mod dmma;
pub mod glu;
pub(crate) mod hopper;
#[cfg(test)]
mod hopper_tests;
#[cfg(feature = "harness")]
mod operator;
pub mod plan;
pub mod problem;
#[cfg(feature = "harness")]
pub mod reference;
pub mod simt;
pub mod skinny;
pub mod sm80;
#[cfg(test)]
mod tests;
#[cfg(feature = "harness")]
pub mod verify;

pub use glu::GluInterleave;
#[cfg(feature = "harness")]
pub use operator::OPERATOR;
pub use plan::{GemmOptions, GemmPath, GemmPlan, GemmTuning};
pub use problem::{
    Activation, COperand, GemmEpilogue, GemmOperands, GemmProblem, GemmScaleOperands, GemmScales, Glu, Layout,
    Precision,
};

use crate::error::Error;

/// Device source of the shared epilogue (`tessera/gemm_epilogue.cuh`): the contract every GEMM
/// kernel (ours and the Hopper one) computes its output with.
pub const EPILOGUE_HEADER: &str = include_str!("epilogue.cuh");
/// Device source of the launch parameters of the non-Hopper kernels (`tessera/gemm_params.cuh`).
pub const PARAMS_HEADER: &str = include_str!("params.cuh");
/// The GEMM operator's own device headers, handed to NVRTC beside `src/cuda/`.
pub const DEVICE_HEADERS: &[(&str, &str)] = &[
    ("tessera/gemm_epilogue.cuh", EPILOGUE_HEADER),
    ("tessera/gemm_params.cuh", PARAMS_HEADER),
];

/// `v` as an `i32` kernel index, or an error naming `arg` and the 32-bit rule.
pub(crate) fn fits_i32(arg: &'static str, v: usize) -> Result<i32, Error> {
    i32::try_from(v).map_err(|_| {
        Error::invalid(
            arg,
            format!("{v} exceeds 2^31 - 1: the kernels index rows, columns and K with 32-bit ints"),
        )
    })
}
