//! [`CsrMatrix`]: a CSR matrix on the device, made once from a validated [`CsrHost`], with its
//! [`SparseDescriptor`] and the plans of its operators cached on it.
//!
//! Uploading copies offsets, indices and values to the device (nnz values and indices, rows + 1
//! offsets) and keeps the row lengths on the host, which is what planning reads (which rows are
//! long, lanes per row). A plan is made on the first call and
//! reused; the per-call path validates the vectors and launches, allocating nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::descriptor::SparseDescriptor;
use super::host::{CsrHost, DenseLayout};
use super::index::SparseIndex;
use super::spmm::SpmmPlan;
use super::spmv::{choose_shape, SpmvOptions, SpmvPlan, SpmvTuning};
use super::spmv_transposed::SpmvTransposedPlan;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::runtime::{Context, DeviceBuffer};

/// A CSR matrix in device memory. Values `T` (f32, f64, f16, bf16), indices `I` (i32, i64).
pub struct CsrMatrix<T: Element, I: SparseIndex> {
    ctx: Context,
    rows: usize,
    cols: usize,
    row_lengths: Vec<usize>,
    /// Lanes per row for kernels without a long-row path (SpMM column-major, A^T x).
    row_lanes: u32,
    pub(crate) offsets: DeviceBuffer<I>,
    pub(crate) indices: DeviceBuffer<I>,
    pub(crate) values: DeviceBuffer<T>,
    descriptor: SparseDescriptor,
    spmv_plan: Mutex<Option<Arc<SpmvPlan>>>,
    spmm_plans: Mutex<HashMap<(usize, DenseLayout), Arc<SpmmPlan>>>,
    transposed_plan: Mutex<Option<Arc<SpmvTransposedPlan>>>,
}

impl<T: Element, I: SparseIndex> std::fmt::Debug for CsrMatrix<T, I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CsrMatrix")
            .field("dtype", &T::DTYPE)
            .field("index", &I::DTYPE)
            .field("descriptor", &self.descriptor)
            .finish()
    }
}

/// The value dtypes the sparse kernels take.
pub const VALUE_DTYPES: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

impl<T: Element, I: SparseIndex> CsrMatrix<T, I> {
    /// Uploads `host` (already validated by its constructor) to the device of `ctx`.
    pub fn from_host(ctx: &Context, host: &CsrHost<T, I>) -> Result<Self> {
        if !VALUE_DTYPES.contains(&T::DTYPE) {
            return Err(Error::Unsupported(format!(
                "sparse values of {}; supported: fp32, fp64, fp16, bf16",
                T::DTYPE
            )));
        }
        host.validate()?;
        let descriptor = SparseDescriptor::of(host);
        let row_lengths: Vec<usize> = (0..host.rows).map(|r| host.row_len(r)).collect();
        let all_rows = SpmvTuning {
            long_threshold: Some(usize::MAX),
            ..SpmvTuning::default()
        };
        let (row_lanes, _) = choose_shape(&row_lengths, &all_rows);
        Ok(CsrMatrix {
            ctx: ctx.clone(),
            rows: host.rows,
            cols: host.cols,
            row_lengths,
            row_lanes,
            offsets: ctx.upload(&host.offsets)?,
            indices: upload_nonempty(ctx, &host.indices)?,
            values: upload_nonempty(ctx, &host.values)?,
            descriptor,
            spmv_plan: Mutex::new(None),
            spmm_plans: Mutex::new(HashMap::new()),
            transposed_plan: Mutex::new(None),
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    pub fn nnz(&self) -> usize {
        self.descriptor.nnz
    }
    pub fn descriptor(&self) -> &SparseDescriptor {
        &self.descriptor
    }
    pub fn context(&self) -> &Context {
        &self.ctx
    }
    /// Nonzeros of each row (what plans choose kernels from), computed once on upload.
    pub fn row_lengths(&self) -> &[usize] {
        &self.row_lengths
    }
    /// Lanes per row [`choose_shape`] gives when no row is treated as long.
    pub fn row_lanes(&self) -> u32 {
        self.row_lanes
    }

    /// The cached SpMV plan with the default options, made on first use.
    pub fn spmv_plan(&self) -> Result<Arc<SpmvPlan>> {
        let mut slot = self.spmv_plan.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = slot.as_ref() {
            return Ok(p.clone());
        }
        let plan = Arc::new(SpmvPlan::new(self, &SpmvOptions::default())?);
        *slot = Some(plan.clone());
        Ok(plan)
    }

    /// `y = alpha * A x + beta * y` with the cached plan (deterministic: bitwise the same
    /// result every call). `x` has `cols` elements, `y` has `rows`; `beta == 0` does not read
    /// `y`.
    pub fn spmv(&self, alpha: f64, x: &DeviceBuffer<T>, beta: f64, y: &mut DeviceBuffer<T>) -> Result<()> {
        self.spmv_plan()?.run(self, alpha, x, beta, y)
    }
}

impl<T: Element, I: SparseIndex> CsrMatrix<T, I> {
    /// `C = alpha * A B + beta * C` for dense B (`cols x n`) and C (`rows x n`), both packed in
    /// `layout` (deterministic). The plan of each (n, layout) is made once and cached.
    pub fn spmm(
        &self,
        alpha: f64,
        b: &DeviceBuffer<T>,
        n: usize,
        layout: DenseLayout,
        beta: f64,
        c: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        let plan = {
            let mut plans = self.spmm_plans.lock().unwrap_or_else(|e| e.into_inner());
            match plans.get(&(n, layout)) {
                Some(p) => p.clone(),
                None => {
                    let p = Arc::new(SpmmPlan::new(self, n, layout)?);
                    plans.insert((n, layout), p.clone());
                    p
                }
            }
        };
        plan.run(self, alpha, b, beta, c)
    }

    /// `y = alpha * A^T x + beta * y` without a transposed copy (fp32/fp64; atomic, so not
    /// bitwise reproducible). The plan is made once and cached.
    pub fn spmv_transposed(&self, alpha: f64, x: &DeviceBuffer<T>, beta: f64, y: &mut DeviceBuffer<T>) -> Result<()> {
        let plan = {
            let mut slot = self.transposed_plan.lock().unwrap_or_else(|e| e.into_inner());
            match slot.as_ref() {
                Some(p) => p.clone(),
                None => {
                    let p = Arc::new(SpmvTransposedPlan::new(self)?);
                    *slot = Some(p.clone());
                    p
                }
            }
        };
        plan.run(self, alpha, x, beta, y)
    }
}

/// Checks that `a` is the matrix a plan was made for (value and index types, shape).
pub(crate) fn check_planned<T: Element, I: SparseIndex>(
    a: &CsrMatrix<T, I>,
    value: DType,
    index: DType,
    rows: usize,
    cols: usize,
) -> Result<()> {
    if T::DTYPE != value || I::DTYPE != index || a.rows() != rows || a.cols() != cols {
        return Err(Error::invalid(
            "matrix",
            format!(
                "a {} x {} {} matrix with {} indices does not match the plan's {rows} x {cols} {value} with \
                 {index} indices",
                a.rows(),
                a.cols(),
                T::DTYPE,
                I::DTYPE,
            ),
        ));
    }
    Ok(())
}

/// Checks a dense operand of `len` elements against the `need` its product reads or writes.
pub(crate) fn check_operand(arg: &'static str, len: usize, need: usize, what: std::fmt::Arguments) -> Result<()> {
    if len < need {
        return Err(Error::invalid(arg, format!("{len} elements; {what}")));
    }
    Ok(())
}

/// Checks the scalars of `alpha * product + beta * output`.
pub(crate) fn check_scalars(alpha: f64, beta: f64) -> Result<()> {
    if !alpha.is_finite() || !beta.is_finite() {
        return Err(Error::invalid(
            "alpha/beta",
            format!("must be finite, got {alpha} and {beta}"),
        ));
    }
    Ok(())
}

/// Uploads `data`, or allocates one element for an empty slice (a valid, unread pointer).
pub(crate) fn upload_nonempty<T: Element>(ctx: &Context, data: &[T]) -> Result<DeviceBuffer<T>> {
    if data.is_empty() {
        ctx.alloc::<T>(1)
    } else {
        ctx.upload(data)
    }
}
