//! `y = alpha * A^T x + beta * y` on the CSR of A, without a transposed copy
//! (`spmv_transposed.cu`): for matrices whose second copy does not fit. Atomic scatter, so NOT
//! bitwise reproducible; fp32 and fp64 values only (atomic adds on the value type). Where
//! memory allows, an explicit transpose ([`CsrHost::transpose`](super::CsrHost::transpose))
//! with [`SpmvPlan`](super::SpmvPlan) is deterministic and faster.

use std::sync::Arc;

use super::device::{check_operand, check_planned, check_scalars, CsrMatrix};
use super::index::SparseIndex;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::runtime::{Context, DeviceBuffer, Kernel, KernelKey, KernelParams, KernelSpec, LaunchConfig};

/// Source of the transposed SpMV kernels.
pub const SOURCE: &str = include_str!("spmv_transposed.cu");
/// Threads per CTA.
pub const BLOCK_THREADS: u32 = 256;

/// One variant: value and index types, lanes per row; `scale` the `y *= beta` kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SpmvTransposedVariant {
    pub value: DType,
    pub index: DType,
    pub lanes: u32,
    pub scale: bool,
}

impl SpmvTransposedVariant {
    pub fn key(&self) -> KernelKey {
        KernelKey::new(if self.scale { "spmv_t_scale" } else { "spmv_t_scatter" })
            .ty("Val", self.value)
            .ty("Idx", self.index)
            .int("kLanes", "l", if self.scale { 1 } else { self.lanes })
            .int("kBlockThreads", "t", BLOCK_THREADS)
    }
    pub fn spec(&self) -> KernelSpec {
        let entry = if self.scale { "spmv_t_scale" } else { "spmv_t_scatter" };
        self.key().spec("spmv_transposed.cu", SOURCE, entry, &[])
    }
}

/// Every variant, for the compile tests.
pub fn all_variants() -> Vec<SpmvTransposedVariant> {
    let mut v = Vec::new();
    for value in [DType::F32, DType::F64] {
        for index in [DType::I32, DType::I64] {
            v.push(SpmvTransposedVariant {
                value,
                index,
                lanes: 1,
                scale: true,
            });
            for lanes in [1, 2, 4, 8, 16, 32] {
                v.push(SpmvTransposedVariant {
                    value,
                    index,
                    lanes,
                    scale: false,
                });
            }
        }
    }
    v
}

/// `struct SpmvTParams` of spmv_transposed.cu (72 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct SpmvTParams {
    offsets: u64,
    indices: u64,
    values: u64,
    x: u64,
    y: u64,
    rows: i64,
    cols: i64,
    alpha: f64,
    beta: f64,
}
const _: () = assert!(std::mem::size_of::<SpmvTParams>() == 72);
// SAFETY: #[repr(C)], nine eight-byte fields in the order and of the types (pointers as u64,
// long long, double) of the kernel's struct.
unsafe impl KernelParams for SpmvTParams {}

/// A planned transposed SpMV for one matrix.
pub struct SpmvTransposedPlan {
    ctx: Context,
    value: DType,
    index: DType,
    rows: usize,
    cols: usize,
    lanes: u32,
    scale: Arc<Kernel>,
    scatter: Arc<Kernel>,
}

impl SpmvTransposedPlan {
    /// Plans `y = alpha A^T x + beta y` for `a` (fp32 or fp64 values).
    pub fn new<T: Element, I: SparseIndex>(a: &CsrMatrix<T, I>) -> Result<Self> {
        if !matches!(T::DTYPE, DType::F32 | DType::F64) {
            return Err(Error::Unsupported(format!(
                "A^T x without a transposed copy for {} values; supported: fp32, fp64 (or transpose \
                 the matrix once and use SpMV)",
                T::DTYPE
            )));
        }
        let lanes = a.row_lanes();
        let ctx = a.context().clone();
        let v = SpmvTransposedVariant {
            value: T::DTYPE,
            index: I::DTYPE,
            lanes,
            scale: false,
        };
        Ok(SpmvTransposedPlan {
            scale: ctx.kernel(
                &SpmvTransposedVariant {
                    scale: true,
                    lanes: 1,
                    ..v
                }
                .spec(),
            )?,
            scatter: ctx.kernel(&v.spec())?,
            ctx,
            value: T::DTYPE,
            index: I::DTYPE,
            rows: a.rows(),
            cols: a.cols(),
            lanes,
        })
    }

    /// `y = alpha * A^T x + beta * y`: `x` has `rows` elements, `y` `cols`.
    pub fn run<T: Element, I: SparseIndex>(
        &self,
        a: &CsrMatrix<T, I>,
        alpha: f64,
        x: &DeviceBuffer<T>,
        beta: f64,
        y: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        check_planned(a, self.value, self.index, self.rows, self.cols)?;
        check_operand(
            "x",
            x.len(),
            self.rows,
            format_args!("A^T x needs the matrix's {} rows", self.rows),
        )?;
        check_operand(
            "y",
            y.len(),
            self.cols,
            format_args!("A^T x has the matrix's {} columns", self.cols),
        )?;
        check_scalars(alpha, beta)?;
        let params = SpmvTParams {
            offsets: a.offsets.device_ptr(),
            indices: a.indices.device_ptr(),
            values: a.values.device_ptr(),
            x: x.device_ptr(),
            y: y.device_ptr(),
            rows: self.rows as i64,
            cols: self.cols as i64,
            alpha,
            beta,
        };
        let scale_grid = self.cols.div_ceil(BLOCK_THREADS as usize).clamp(1, 65535) as u32;
        // SAFETY: y has >= cols elements (checked); the kernel grid-strides over them.
        unsafe {
            self.scale
                .launch(&self.ctx, LaunchConfig::linear(scale_grid, BLOCK_THREADS, 0), &params)?
        };
        if self.rows == 0 {
            return Ok(());
        }
        let per_cta = (BLOCK_THREADS / self.lanes) as usize;
        let grid = u32::try_from(self.rows.div_ceil(per_cta))
            .map_err(|_| Error::Unsupported(format!("{} rows: more CTAs than a grid holds", self.rows)))?;
        // SAFETY: the buffers belong to `a` (matching the plan); x has >= rows elements; every
        // index is in 0..cols (validated on construction) and y has >= cols; the adds are
        // atomic. SpmvTParams mirrors the kernel's struct.
        unsafe {
            self.scatter
                .launch(&self.ctx, LaunchConfig::linear(grid, BLOCK_THREADS, 0), &params)
        }
    }
}
