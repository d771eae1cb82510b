//! [`DenseOperator`]: a dense device matrix as a [`LinearOperator`], row- or column-major, with
//! bandwidth-oriented GEMV kernels (dense.cu) for `A x` and `A^T u`.
//!
//! # Layout
//!
//! An `m x n` matrix in a [`DeviceBuffer<T>`] (f32 or f64) with a leading dimension `ld`:
//! row-major ([`DenseLayout::RowMajor`]): element `(i, j)` at `i * ld + j`, `ld >= n`;
//! column-major ([`DenseLayout::ColMajor`], BLAS / Fortran / cuBLAS): element `(i, j)` at
//! `j * ld + i`, `ld >= m`. The kernels see the storage as `lines` lines of `len` elements
//! (row-major: `m` lines of `n`; column-major: `n` lines of `m`) and have one kernel per
//! direction: a warp per line for the products along lines (row-major `A x`, column-major
//! `A^T u`) and a thread per column with the lines split over a grid dimension for the
//! products across lines (row-major `A^T u`, column-major `A x`), whose per-split partials are
//! added in a fixed order by a finishing kernel. Both are deterministic.
//!
//! # Precision
//!
//! Every product and sum is accumulated in f64, for f32 storage as well (elements and `x`
//! widened, the result rounded once to `T`): an f32 product carries one rounding. The GEMVs
//! are bandwidth bound, so the f64 arithmetic costs nothing on data-centre GPUs; on GPUs with
//! 1/64-rate f64 it may approach the bandwidth limit for f32.
//!
//! # Checks
//!
//! At construction: `T` is f32 or f64, the buffer holds the matrix (`(lines - 1) * ld + len`
//! elements), `ld` is at least the line length, and every value is finite: the column norms are
//! computed on the device (one pass over the matrix; kept for
//! [`column_norms`](LinearOperator::column_norms), i.e. column scaling) and a NaN, an infinity
//! or an overflowing sum of squares is an error naming the column. Products check `x` and `y`
//! (at least `n` / `m` elements as the direction needs) and that `alpha`, `beta` are finite.

use std::sync::Arc;

use super::device_operator::LinearOperator;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::runtime::{Context, DeviceBuffer, Kernel, KernelKey, KernelParams, KernelSpec, LaunchConfig};

/// Source of the dense GEMV kernels.
pub const SOURCE: &str = include_str!("dense.cu");
/// Threads per CTA of every dense kernel.
pub const BLOCK_THREADS: u32 = 256;
/// The most line splits of the across-lines product.
pub const MAX_SPLITS: usize = 64;

/// How a dense matrix is stored: sparse's [`DenseLayout`](crate::sparse::DenseLayout) (the
/// layout of SpMM's dense operands), with a leading dimension `ld` here: `RowMajor` puts
/// element `(i, j)` at `i * ld + j`, `ColMajor` (Fortran / BLAS order) at `j * ld + i`.
pub use crate::sparse::DenseLayout;

/// The kernels of dense.cu.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DenseKernel {
    /// A warp per stored line: `S x`.
    Lines,
    /// A thread per column, lines split over `gridDim.y`: `S^T x`.
    Cols,
    /// The fixed-order sum of [`DenseKernel::Cols`]' split partials.
    Finish,
}

impl DenseKernel {
    pub const ALL: [DenseKernel; 3] = [DenseKernel::Lines, DenseKernel::Cols, DenseKernel::Finish];
    fn entry(self) -> &'static str {
        match self {
            DenseKernel::Lines => "dense_gemv_lines",
            DenseKernel::Cols => "dense_gemv_cols",
            DenseKernel::Finish => "dense_gemv_finish",
        }
    }
}

/// One dense kernel variant: which kernel and the storage type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DenseVariant {
    pub kernel: DenseKernel,
    pub value: DType,
}

impl DenseVariant {
    pub fn key(&self) -> KernelKey {
        KernelKey::new(self.kernel.entry())
            .ty("Val", self.value)
            .int("kBlockThreads", "t", BLOCK_THREADS)
    }
    pub fn spec(&self) -> KernelSpec {
        self.key().spec("dense.cu", SOURCE, self.kernel.entry(), &[])
    }
}

/// Every dense variant (what CI compiles): three kernels for f32 and f64.
pub fn all_variants() -> Vec<DenseVariant> {
    [DType::F32, DType::F64]
        .into_iter()
        .flat_map(|value| {
            DenseKernel::ALL
                .into_iter()
                .map(move |kernel| DenseVariant { kernel, value })
        })
        .collect()
}

/// `struct GemvParams` of dense.cu (80 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct GemvParams {
    a: u64,
    x: u64,
    y: u64,
    partials: u64,
    lines: i64,
    len: i64,
    ld: i64,
    alpha: f64,
    beta: f64,
    splits: i32,
    square: i32,
}
const _: () = assert!(std::mem::size_of::<GemvParams>() == 80);
// SAFETY: #[repr(C)]: four pointers as u64, three i64, two f64, two i32, in the order and of
// the types of the kernel's struct (pointers, long long, double, int).
unsafe impl KernelParams for GemvParams {}

/// The stored shape of an `rows x cols` matrix in `layout`: `(lines, len)`.
pub fn stored_shape(rows: usize, cols: usize, layout: DenseLayout) -> (usize, usize) {
    match layout {
        DenseLayout::RowMajor => (rows, cols),
        DenseLayout::ColMajor => (cols, rows),
    }
}

/// The position of element `(i, j)` in the buffer.
pub fn stored_index(layout: DenseLayout, ld: usize, i: usize, j: usize) -> usize {
    match layout {
        DenseLayout::RowMajor => i * ld + j,
        DenseLayout::ColMajor => j * ld + i,
    }
}

/// Checks the description of a dense matrix: `ld` at least the line length, the buffer of
/// `data_len` elements holding every element, sizes without overflow. Returns the elements
/// the matrix spans.
pub fn check_dense(rows: usize, cols: usize, layout: DenseLayout, ld: usize, data_len: usize) -> Result<usize> {
    let (lines, len) = stored_shape(rows, cols, layout);
    let what = match layout {
        DenseLayout::RowMajor => "n (row-major)",
        DenseLayout::ColMajor => "m (column-major)",
    };
    if ld < len {
        return Err(Error::invalid(
            "ld",
            format!("is {ld}; must be at least {what} = {len} for a {rows} x {cols} matrix"),
        ));
    }
    if lines == 0 || len == 0 {
        return Ok(0);
    }
    let span = (lines - 1)
        .checked_mul(ld)
        .and_then(|v| v.checked_add(len))
        .ok_or_else(|| Error::invalid("ld", format!("{rows} x {cols} with ld {ld} overflows usize")))?;
    if i64::try_from(span).is_err() {
        return Err(Error::invalid(
            "data",
            format!("spans {span} elements, more than i64 indexing"),
        ));
    }
    if data_len < span {
        return Err(Error::invalid(
            "data",
            format!("has {data_len} elements; a {rows} x {cols} matrix with ld {ld} needs {span}"),
        ));
    }
    Ok(span)
}

/// Line splits of the across-lines product: enough CTAs to fill the device (4 per SM) when the
/// columns alone give fewer, but at least 64 lines per split (so the partials stay small next
/// to the matrix) and at most [`MAX_SPLITS`].
pub fn cols_splits(lines: usize, len: usize, sm_count: usize) -> usize {
    let blocks = len.div_ceil(BLOCK_THREADS as usize).max(1);
    let want = (4 * sm_count.max(1)).div_ceil(blocks);
    want.min(lines / 64).clamp(1, MAX_SPLITS)
}

/// A dense matrix on the device as a [`LinearOperator`] (module docs).
pub struct DenseOperator<T: Element> {
    ctx: Context,
    data: DeviceBuffer<T>,
    rows: usize,
    cols: usize,
    layout: DenseLayout,
    ld: usize,
    splits: usize,
    lines_kernel: Arc<Kernel>,
    cols_kernel: Arc<Kernel>,
    finish_kernel: Arc<Kernel>,
    /// `splits * len` doubles (at least `max(lines, len)` for the construction's norms).
    partials: DeviceBuffer<f64>,
    column_norms: Vec<f64>,
}

impl<T: Element> DenseOperator<T> {
    /// Uploads a dense `rows x cols` matrix stored in `layout` with no padding
    /// (`ld` = the line length).
    pub fn from_host(ctx: &Context, rows: usize, cols: usize, layout: DenseLayout, data: &[T]) -> Result<Self> {
        let ld = stored_shape(rows, cols, layout).1;
        check_dense(rows, cols, layout, ld, data.len())?;
        let buf = if data.is_empty() {
            ctx.alloc::<T>(1)?
        } else {
            ctx.upload(data)?
        };
        Self::new(ctx, buf, rows, cols, layout, ld)
    }

    /// Takes a device buffer holding a dense `rows x cols` matrix in `layout` with leading
    /// dimension `ld`. Checks the description and every value (module docs).
    pub fn new(
        ctx: &Context,
        data: DeviceBuffer<T>,
        rows: usize,
        cols: usize,
        layout: DenseLayout,
        ld: usize,
    ) -> Result<Self> {
        if !matches!(T::DTYPE, DType::F32 | DType::F64) {
            return Err(Error::Unsupported(format!(
                "a dense LSMR operator on {} values; supported: fp32, fp64",
                T::DTYPE
            )));
        }
        check_dense(rows, cols, layout, ld, data.len())?;
        let (lines, len) = stored_shape(rows, cols, layout);
        let kernel = |k| {
            ctx.kernel(
                &DenseVariant {
                    kernel: k,
                    value: T::DTYPE,
                }
                .spec(),
            )
        };
        let splits = cols_splits(lines, len, ctx.info().sm_count as usize);
        let partials = ctx.alloc::<f64>((splits * len).max(lines).max(len).max(1))?;
        let mut op = DenseOperator {
            ctx: ctx.clone(),
            data,
            rows,
            cols,
            layout,
            ld,
            splits,
            lines_kernel: kernel(DenseKernel::Lines)?,
            cols_kernel: kernel(DenseKernel::Cols)?,
            finish_kernel: kernel(DenseKernel::Finish)?,
            partials,
            column_norms: Vec::new(),
        };
        op.column_norms = op.compute_column_norms()?;
        Ok(op)
    }

    pub fn layout(&self) -> DenseLayout {
        self.layout
    }
    pub fn ld(&self) -> usize {
        self.ld
    }

    fn params(&self, x: u64, y: u64, alpha: f64, beta: f64, splits: usize, square: bool) -> GemvParams {
        let (lines, len) = stored_shape(self.rows, self.cols, self.layout);
        GemvParams {
            a: self.data.device_ptr(),
            x,
            y,
            partials: self.partials.device_ptr(),
            lines: lines as i64,
            len: len as i64,
            ld: self.ld as i64,
            alpha,
            beta,
            splits: splits as i32,
            square: square as i32,
        }
    }

    /// `S x` (a warp per line) into `y` (or the squares' sums into the partials).
    fn along_lines(&self, p: &GemvParams) -> Result<()> {
        if p.lines == 0 {
            return Ok(());
        }
        let warps = (BLOCK_THREADS / 32) as usize;
        let grid = (p.lines as usize).div_ceil(warps) as u32;
        // SAFETY: check_dense (construction) proved the buffer holds every (line, j) with
        // line < lines, j < len at line * ld + j; the callers checked x holds len and y lines
        // elements (square: partials holds >= lines doubles, x, y unread). One warp per line;
        // each y element written by one lane. GemvParams mirrors the kernel's struct.
        unsafe {
            self.lines_kernel
                .launch(&self.ctx, LaunchConfig::linear(grid, BLOCK_THREADS, 0), p)
        }
    }

    /// `S^T x` (a thread per column, `p.splits` line ranges) into `y` (or the squares' sums).
    fn across_lines(&self, p: &GemvParams) -> Result<()> {
        if p.len == 0 {
            return Ok(());
        }
        let grid = (p.len as usize).div_ceil(BLOCK_THREADS as usize) as u32;
        let mut cfg = LaunchConfig::linear(grid, BLOCK_THREADS, 0);
        cfg.grid.1 = p.splits as u32;
        // SAFETY: as along_lines for the matrix; x holds lines and y len elements (checked by
        // the callers; square: x, y unread); partials holds splits * len doubles (allocated
        // at construction with this operator's splits, and square runs with one split into
        // >= len doubles). Each output element is written by one thread.
        unsafe { self.cols_kernel.launch(&self.ctx, cfg, p)? };
        if p.splits > 1 && p.square == 0 {
            // SAFETY: reads splits * len partials written above (same stream), writes y (len).
            unsafe {
                self.finish_kernel
                    .launch(&self.ctx, LaunchConfig::linear(grid, BLOCK_THREADS, 0), p)?
            };
        }
        Ok(())
    }

    /// The column norms of `A` from one pass over the matrix; an error naming the first column
    /// with a NaN or infinity (or whose sum of squares overflows).
    fn compute_column_norms(&self) -> Result<Vec<f64>> {
        let n = self.cols;
        if n == 0 {
            return Ok(Vec::new());
        }
        if self.rows == 0 {
            return Ok(vec![0.0; n]);
        }
        let p = self.params(0, 0, 1.0, 0.0, 1, true);
        match self.layout {
            // the columns of A are the columns of S
            DenseLayout::RowMajor => self.across_lines(&p)?,
            // the columns of A are the lines of S
            DenseLayout::ColMajor => self.along_lines(&p)?,
        }
        let sq = self.partials.to_host()?;
        if let Some(j) = sq[..n].iter().position(|v| !v.is_finite()) {
            return Err(Error::invalid(
                "A",
                format!(
                    "column {j} holds a NaN or an infinity (or its sum of squares overflows: {}); every \
                     value must be finite",
                    sq[j]
                ),
            ));
        }
        Ok(sq[..n].iter().map(|v| v.sqrt()).collect())
    }

    fn check_operands(
        &self,
        x_len: usize,
        x_need: usize,
        y_len: usize,
        y_need: usize,
        alpha: f64,
        beta: f64,
    ) -> Result<()> {
        if x_len < x_need {
            return Err(Error::invalid(
                "x",
                format!("{x_len} elements; the product reads {x_need}"),
            ));
        }
        if y_len < y_need {
            return Err(Error::invalid(
                "y",
                format!("{y_len} elements; the product writes {y_need}"),
            ));
        }
        if !alpha.is_finite() || !beta.is_finite() {
            return Err(Error::invalid(
                "alpha/beta",
                format!("must be finite, got {alpha} and {beta}"),
            ));
        }
        Ok(())
    }
}

impl<T: Element> LinearOperator<T> for DenseOperator<T> {
    fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }
    fn apply(&self, alpha: f64, x: &DeviceBuffer<T>, beta: f64, y: &mut DeviceBuffer<T>) -> Result<()> {
        self.check_operands(x.len(), self.cols, y.len(), self.rows, alpha, beta)?;
        match self.layout {
            DenseLayout::RowMajor => {
                let p = self.params(x.device_ptr(), y.device_ptr(), alpha, beta, 1, false);
                self.along_lines(&p)
            }
            DenseLayout::ColMajor => {
                let p = self.params(x.device_ptr(), y.device_ptr(), alpha, beta, self.splits, false);
                self.across_lines(&p)
            }
        }
    }
    fn apply_transposed(&self, alpha: f64, x: &DeviceBuffer<T>, beta: f64, y: &mut DeviceBuffer<T>) -> Result<()> {
        self.check_operands(x.len(), self.rows, y.len(), self.cols, alpha, beta)?;
        match self.layout {
            DenseLayout::RowMajor => {
                let p = self.params(x.device_ptr(), y.device_ptr(), alpha, beta, self.splits, false);
                self.across_lines(&p)
            }
            DenseLayout::ColMajor => {
                let p = self.params(x.device_ptr(), y.device_ptr(), alpha, beta, 1, false);
                self.along_lines(&p)
            }
        }
    }
    fn graph_capturable(&self) -> bool {
        // products along or across lines: launches into buffers made at construction
        true
    }
    fn storage(&self) -> &'static str {
        match self.layout {
            DenseLayout::RowMajor => "dense-row",
            DenseLayout::ColMajor => "dense-col",
        }
    }
    fn column_norms(&self) -> Option<Vec<f64>> {
        Some(self.column_norms.clone())
    }
}
