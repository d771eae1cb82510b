//! The cuBLAS bf16 GEMM used as the compute roofline of every benchmark run.

use cudarc::cublas::sys as cb;
use half::bf16;

use super::context::Context;
use super::timing::{time_median, TimingOptions};
use crate::error::{Error, Result};

/// Measures cuBLAS bf16 `n x n x n` GEMM (FP32 accumulate) throughput in TFLOP/s on random
/// (never zero) inputs, timed in the sustained state ([`TimingOptions::default`], 3 calls per
/// group). DESIGN.md uses n = 8192.
pub fn cublas_bf16_tflops(ctx: &Context, n: usize) -> Result<f64> {
    let timing = TimingOptions {
        warmup: 3,
        reps: Some(3),
        ..TimingOptions::default()
    };
    cublas_bf16_tflops_timed(ctx, n, timing)
}

/// [`cublas_bf16_tflops`] under the given timing rules (e.g. [`TimingOptions::burst`]).
pub fn cublas_bf16_tflops_timed(ctx: &Context, n: usize, timing: TimingOptions) -> Result<f64> {
    let blas = ctx.cublas()?;
    let elems = n * n;
    // Random-looking, non-zero data: a cheap hash, so 3 x 128 MiB are made in milliseconds.
    let host: Vec<bf16> = (0..elems)
        .map(|i| {
            let h = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            bf16::from_f32((h as f32 / (1u64 << 24) as f32) - 0.5)
        })
        .collect();
    let a = ctx.upload(&host)?;
    let b = ctx.upload(&host)?;
    let c = ctx.alloc::<bf16>(elems)?;
    let (alpha, beta) = (1.0f32, 0.0f32);
    let ni = i32::try_from(n).map_err(|_| Error::invalid("n", "must fit in i32"))?;
    let t = time_median(ctx, timing, |_| {
        // SAFETY: a, b, c hold n*n bf16 each; the handle is bound to the context's stream.
        let st = unsafe {
            cb::cublasGemmEx(
                *blas.handle(),
                cb::cublasOperation_t::CUBLAS_OP_N,
                cb::cublasOperation_t::CUBLAS_OP_N,
                ni,
                ni,
                ni,
                &alpha as *const f32 as *const _,
                a.device_ptr() as *const _,
                cb::cudaDataType::CUDA_R_16BF,
                ni,
                b.device_ptr() as *const _,
                cb::cudaDataType::CUDA_R_16BF,
                ni,
                &beta as *const f32 as *const _,
                c.device_ptr() as *mut _,
                cb::cudaDataType::CUDA_R_16BF,
                ni,
                cb::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cb::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        if st != cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(Error::cuda("cublasGemmEx", format!("{st:?}")));
        }
        Ok(())
    })?;
    Ok(2.0 * (n as f64).powi(3) / (t.median_ms * 1e-3) / 1e12)
}
