//! CSR SpMM, `C = alpha * A B + beta * C` with dense B (cols x n) and C (rows x n) in one shared
//! layout (row- or column-major, packed): the plan (kernel shape from n, the layout and the row
//! lengths) and the launch (`spmm_csr.cu`). Deterministic, as SpMV.
//!
//! Shape. Row-major: `vec` columns per lane (1 up to 32 columns, 2 up to 64, else 4) and a group
//! of `lanes` lanes per (row, column tile), the power of two that covers n (at most 32).
//! Column-major: passes of `cols` columns (8, or the power of two covering a smaller n), and
//! lanes per row as SpMV picks them from the mean row length, at least two.

use std::sync::Arc;

use super::device::{check_operand, check_planned, check_scalars, CsrMatrix};
use super::host::DenseLayout;
use super::index::SparseIndex;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::runtime::{Context, DeviceBuffer, Kernel, KernelKey, KernelParams, KernelSpec, LaunchConfig};

/// Source of the SpMM kernel.
pub const SOURCE: &str = include_str!("spmm_csr.cu");
/// Threads per CTA.
pub const BLOCK_THREADS: u32 = 256;
/// Largest n the kernels are planned for (more columns run in several calls' worth of tiles
/// all the same; the limit keeps the grid arithmetic in range).
pub const MAX_N: usize = 1 << 20;

/// One SpMM kernel variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SpmmVariant {
    pub value: DType,
    pub index: DType,
    pub layout: DenseLayout,
    pub lanes: u32,
    /// Row-major: columns per lane.
    pub vec: u32,
    /// Column-major: columns per pass.
    pub cols: u32,
}

impl SpmmVariant {
    pub fn key(&self) -> KernelKey {
        let col_major = self.layout == DenseLayout::ColMajor;
        KernelKey::new("spmm_csr")
            .ty("Val", self.value)
            .ty("Idx", self.index)
            .flag("kColMajor", "colmajor", col_major)
            .int("kLanes", "l", self.lanes)
            .int("kVec", "v", if col_major { 1 } else { self.vec })
            .int("kCols", "c", if col_major { self.cols } else { 1 })
            .int("kBlockThreads", "t", BLOCK_THREADS)
    }
    pub fn spec(&self) -> KernelSpec {
        self.key().spec("spmm_csr.cu", SOURCE, "spmm_csr", &[])
    }
    /// Columns one (row, tile) pair covers.
    fn tile_cols(&self) -> usize {
        match self.layout {
            DenseLayout::RowMajor => (self.lanes * self.vec) as usize,
            DenseLayout::ColMajor => self.cols as usize,
        }
    }
}

/// The variant for `n` columns in `layout`; column-major takes `row_lanes` lanes per row (at least
/// two) from [`CsrMatrix::row_lanes`].
pub fn choose_variant(value: DType, index: DType, n: usize, layout: DenseLayout, row_lanes: u32) -> SpmmVariant {
    match layout {
        DenseLayout::RowMajor => {
            let vec = if n <= 32 {
                1
            } else if n <= 64 {
                2
            } else {
                4
            };
            let lanes = n.div_ceil(vec).next_power_of_two().clamp(1, 32) as u32;
            SpmmVariant {
                value,
                index,
                layout,
                lanes,
                vec: vec as u32,
                cols: 1,
            }
        }
        DenseLayout::ColMajor => {
            SpmmVariant {
                value,
                index,
                layout,
                // one lane per row spilled on sm_90a (fp32, 4 columns); two lose little
                lanes: row_lanes.max(2),
                vec: 1,
                cols: n.next_power_of_two().clamp(1, 8) as u32,
            }
        }
    }
}

/// Every variant the planner can produce, for the compile tests.
pub fn all_variants() -> Vec<SpmmVariant> {
    let mut v = Vec::new();
    for value in super::device::VALUE_DTYPES {
        for index in [DType::I32, DType::I64] {
            for lanes in [1u32, 2, 4, 8, 16, 32] {
                for vec in [1u32, 2, 4] {
                    v.push(SpmmVariant {
                        value,
                        index,
                        layout: DenseLayout::RowMajor,
                        lanes,
                        vec,
                        cols: 1,
                    });
                }
                for cols in [1u32, 2, 4, 8] {
                    if lanes == 1 {
                        continue; // column-major takes at least two lanes per row
                    }
                    v.push(SpmmVariant {
                        value,
                        index,
                        layout: DenseLayout::ColMajor,
                        lanes,
                        vec: 1,
                        cols,
                    });
                }
            }
        }
    }
    v
}

/// `struct SpmmParams` of spmm_csr.cu (88 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct SpmmParams {
    offsets: u64,
    indices: u64,
    values: u64,
    b: u64,
    c: u64,
    rows: i64,
    n: i64,
    ldb: i64,
    ldc: i64,
    alpha: f64,
    beta: f64,
}
const _: () = assert!(std::mem::size_of::<SpmmParams>() == 88);
// SAFETY: #[repr(C)], 11 eight-byte fields in the order and of the types (pointers as u64,
// long long, double) of the kernel's struct.
unsafe impl KernelParams for SpmmParams {}

/// A planned SpMM for one matrix, one n and one layout.
pub struct SpmmPlan {
    ctx: Context,
    variant: SpmmVariant,
    rows: usize,
    cols: usize,
    n: usize,
    kernel: Arc<Kernel>,
}

impl std::fmt::Debug for SpmmPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpmmPlan")
            .field("variant", &self.variant)
            .field("n", &self.n)
            .finish()
    }
}

impl SpmmPlan {
    /// Plans `C = alpha A B + beta C` for `a` with `n` columns in `layout`.
    pub fn new<T: Element, I: SparseIndex>(a: &CsrMatrix<T, I>, n: usize, layout: DenseLayout) -> Result<Self> {
        if n == 0 || n > MAX_N {
            return Err(Error::invalid("n", format!("{n} columns; supported: 1..={MAX_N}")));
        }
        let variant = choose_variant(T::DTYPE, I::DTYPE, n, layout, a.row_lanes());
        let ctx = a.context().clone();
        let kernel = ctx.kernel(&variant.spec())?;
        Ok(SpmmPlan {
            ctx,
            variant,
            rows: a.rows(),
            cols: a.cols(),
            n,
            kernel,
        })
    }

    pub fn variant(&self) -> SpmmVariant {
        self.variant
    }
    /// A short name of the kernel shape (`row-l8v1`, `col-l4c8`).
    pub fn path(&self) -> String {
        let v = &self.variant;
        match v.layout {
            DenseLayout::RowMajor => format!("row-l{}v{}", v.lanes, v.vec),
            DenseLayout::ColMajor => format!("col-l{}c{}", v.lanes, v.cols),
        }
    }

    /// `C = alpha * A B + beta * C`, B and C packed in the plan's layout (`cols x n` and
    /// `rows x n`).
    pub fn run<T: Element, I: SparseIndex>(
        &self,
        a: &CsrMatrix<T, I>,
        alpha: f64,
        b: &DeviceBuffer<T>,
        beta: f64,
        c: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        let v = &self.variant;
        check_planned(a, v.value, v.index, self.rows, self.cols)?;
        check_operand(
            "b",
            b.len(),
            self.cols.saturating_mul(self.n),
            format_args!("B is {} x {}", self.cols, self.n),
        )?;
        check_operand(
            "c",
            c.len(),
            self.rows.saturating_mul(self.n),
            format_args!("C is {} x {}", self.rows, self.n),
        )?;
        check_scalars(alpha, beta)?;
        if self.rows == 0 {
            return Ok(());
        }
        let params = SpmmParams {
            offsets: a.offsets.device_ptr(),
            indices: a.indices.device_ptr(),
            values: a.values.device_ptr(),
            b: b.device_ptr(),
            c: c.device_ptr(),
            rows: self.rows as i64,
            n: self.n as i64,
            ldb: v.layout.leading_dim(self.cols, self.n) as i64,
            ldc: v.layout.leading_dim(self.rows, self.n) as i64,
            alpha,
            beta,
        };
        let pairs = self.rows.saturating_mul(self.n.div_ceil(v.tile_cols()));
        let per_cta = (BLOCK_THREADS / v.lanes) as usize;
        let grid = u32::try_from(pairs.div_ceil(per_cta))
            .map_err(|_| Error::Unsupported(format!("{} x {}: more CTAs than a grid holds", self.rows, self.n)))?;
        // SAFETY: the buffers belong to `a`, which matches the plan (checked above); every index
        // is in 0..cols (validated on construction); B has >= cols * n and C >= rows * n
        // elements, addressed with the packed leading dimensions of the layout; each C element
        // is written by one lane. SpmmParams mirrors the kernel's struct.
        unsafe {
            self.kernel
                .launch(&self.ctx, LaunchConfig::linear(grid, BLOCK_THREADS, 0), &params)
        }
    }
}
