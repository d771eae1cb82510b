//! [`CsrMatrix`]: a CSR matrix on the device, made once from a validated [`CsrHost`], with its
//! [`SparseDescriptor`] and the plans of its operators cached on it.
//!
//! Uploading copies offsets, indices and values to the device (nnz values and indices, rows + 1
//! offsets) and keeps the row lengths on the host, which is what planning reads (which rows are
//! long, lanes per row). A plan is made on the first call and
//! reused; the per-call path validates the vectors and launches, allocating nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::bsr::{BellMatrix, BsrMatrix};
use super::convert::{self, ConversionReport, CooMatrix};
use super::descriptor::SparseDescriptor;
use super::host::{CsrHost, DenseLayout, Duplicates};
use super::index::SparseIndex;
use super::spmm::SpmmPlan;
use super::spmv::{choose_shape, spmv_candidates, SkipIf, SpmvOptions, SpmvPlan, SpmvTuning};
use super::spmv_compact::CompactColumns;
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
    /// Bumped by every in-place change of the values; what the caches below were made from.
    version: u64,
    /// Unique in the process, renewed by every in-place change of the values: plans that copy
    /// the entries (column panels) check they run on the matrix, and the values, they were made
    /// from.
    identity: u64,
    /// Unique in the process for this matrix's sparsity pattern (offsets and indices), which
    /// nothing changes after construction: `update_values` keeps it. What the 16-bit columns
    /// were made from.
    pattern: u64,
    /// How this matrix was made on the device, if it was converted there.
    conversion: Option<ConversionReport>,
    spmv_plan: Mutex<Option<Arc<SpmvPlan>>>,
    spmm_plans: Mutex<HashMap<(usize, DenseLayout), Arc<SpmmPlan>>>,
    transposed_plan: Mutex<Option<Arc<SpmvTransposedPlan>>>,
    /// The CSR of A^T, made on first use by [`transposed`](Self::transposed).
    transposed: Mutex<Option<Arc<CsrMatrix<T, I>>>>,
    /// BSR forms by block size, made on first use by [`bsr`](Self::bsr).
    bsr: Mutex<HashMap<usize, Arc<BsrMatrix<T, I>>>>,
    /// Blocked-ELL forms by block size, made on first use by [`blocked_ell`](Self::blocked_ell).
    bell: Mutex<HashMap<usize, Arc<BellMatrix<T, I>>>>,
    /// The column indices narrowed to 16 bits, made on first use by
    /// [`compact_columns`](Self::compact_columns) (pattern only: kept by `update_values`).
    compact_columns: Mutex<Option<Arc<CompactColumns>>>,
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
        let offsets = ctx.upload(&host.offsets)?;
        let indices = upload_nonempty(ctx, &host.indices)?;
        let values = upload_nonempty(ctx, &host.values)?;
        Ok(Self::assemble(
            ctx,
            host.cols,
            (0..host.rows).map(|r| host.row_len(r)).collect(),
            (offsets, indices, values),
            SparseDescriptor::of(host),
            None,
        ))
    }

    /// A matrix from arrays a device conversion made (`convert.rs`): offsets (`rows + 1`),
    /// indices and values (nnz each, at least one element allocated), valid by construction,
    /// with its row lengths (from the downloaded offsets), the descriptor counted on the device
    /// and the conversion's report.
    pub(crate) fn from_device_parts(
        ctx: &Context,
        cols: usize,
        row_lengths: Vec<usize>,
        arrays: (DeviceBuffer<I>, DeviceBuffer<I>, DeviceBuffer<T>),
        descriptor: SparseDescriptor,
        report: ConversionReport,
    ) -> Self {
        Self::assemble(ctx, cols, row_lengths, arrays, descriptor, Some(report))
    }

    fn assemble(
        ctx: &Context,
        cols: usize,
        row_lengths: Vec<usize>,
        (offsets, indices, values): (DeviceBuffer<I>, DeviceBuffer<I>, DeviceBuffer<T>),
        descriptor: SparseDescriptor,
        conversion: Option<ConversionReport>,
    ) -> Self {
        let (row_lanes, _) = choose_shape(&row_lengths, &all_rows_short());
        CsrMatrix {
            ctx: ctx.clone(),
            rows: row_lengths.len(),
            cols,
            row_lengths,
            row_lanes,
            offsets,
            indices,
            values,
            descriptor,
            version: 0,
            identity: next_identity(),
            pattern: next_identity(),
            conversion,
            spmv_plan: Mutex::new(None),
            spmm_plans: Mutex::new(HashMap::new()),
            transposed_plan: Mutex::new(None),
            transposed: Mutex::new(None),
            bsr: Mutex::new(HashMap::new()),
            bell: Mutex::new(HashMap::new()),
            compact_columns: Mutex::new(None),
        }
    }

    /// Converts triplets on the device to CSR: rows sorted, columns sorted within rows,
    /// duplicates summed in input order (f64, rounded once) or rejected as `duplicates` says;
    /// the same matrix as [`CsrHost::from_coo`] gives. The cost is in
    /// [`conversion`](Self::conversion).
    pub fn from_coo(coo: &CooMatrix<T, I>, duplicates: Duplicates) -> Result<Self> {
        convert::from_coo(coo, duplicates)
    }

    /// The CSR of A^T (`cols x rows`), made on the device: within each of its rows, the entries
    /// in the order of A's rows (deterministic; the same arrays as [`CsrHost::transpose`]).
    /// A new matrix each call; [`transposed`](Self::transposed) makes it once and keeps it.
    pub fn transpose(&self) -> Result<CsrMatrix<T, I>> {
        convert::transpose(self)
    }

    /// The CSR of A^T, made by [`transpose`](Self::transpose) on first use and cached on the
    /// matrix (until [`update_values`](Self::update_values)); its cost is in its
    /// [`conversion`](Self::conversion).
    pub fn transposed(&self) -> Result<Arc<CsrMatrix<T, I>>> {
        let mut slot = self.transposed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = slot.as_ref() {
            return Ok(t.clone());
        }
        let t = Arc::new(self.transpose()?);
        *slot = Some(t.clone());
        Ok(t)
    }

    /// The BSR form with `block x block` blocks (2, 4, 8, 16 or 32; see
    /// [`block`](super::block) for the layout and padding), converted on the device: the same
    /// arrays as [`BsrHost::from_csr`](super::BsrHost::from_csr) (duplicates summed in f64 in
    /// stored order). A new matrix each call; [`bsr`](Self::bsr) makes it once and keeps it.
    /// Its cost is in its [`conversion`](BsrMatrix::conversion).
    pub fn to_bsr(&self, block: usize) -> Result<BsrMatrix<T, I>> {
        convert::csr_to_bsr(self, block)
    }

    /// The BSR form of [`to_bsr`](Self::to_bsr), made on first use per block size and cached
    /// on the matrix until [`update_values`](Self::update_values).
    pub fn bsr(&self, block: usize) -> Result<Arc<BsrMatrix<T, I>>> {
        let mut cache = self.bsr.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = cache.get(&block) {
            return Ok(m.clone());
        }
        let m = Arc::new(self.to_bsr(block)?);
        cache.insert(block, m.clone());
        Ok(m)
    }

    /// The Blocked-ELL form with `block x block` blocks (width: the most blocks of any block
    /// row), converted on the device through BSR (the cached [`bsr`](Self::bsr) form is reused
    /// when present). A new matrix each call; [`blocked_ell`](Self::blocked_ell) keeps one.
    /// Its report covers the BSR -> Blocked-ELL step (and the BSR one's is on the BSR form).
    pub fn to_blocked_ell(&self, block: usize) -> Result<BellMatrix<T, I>> {
        let cached = self.bsr.lock().unwrap_or_else(|e| e.into_inner()).get(&block).cloned();
        match cached {
            Some(b) => b.to_blocked_ell(),
            None => self.to_bsr(block)?.to_blocked_ell(),
        }
    }

    /// The Blocked-ELL form of [`to_blocked_ell`](Self::to_blocked_ell), made on first use per
    /// block size and cached on the matrix until [`update_values`](Self::update_values).
    pub fn blocked_ell(&self, block: usize) -> Result<Arc<BellMatrix<T, I>>> {
        let mut cache = self.bell.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = cache.get(&block) {
            return Ok(m.clone());
        }
        let m = Arc::new(self.to_blocked_ell(block)?);
        cache.insert(block, m.clone());
        Ok(m)
    }

    /// The column indices narrowed to 16 bits (see [`spmv_compact`](super::spmv_compact)): what
    /// the SpMV row kernels read where the rules or
    /// [`SpmvTuning::compact_columns`](super::SpmvTuning::compact_columns) take them. Made on the
    /// device on first use and cached on the matrix (2 bytes per nonzero; the cost is in its
    /// [`report`](CompactColumns::report)); they depend on the pattern only, so
    /// [`update_values`](Self::update_values) keeps them. A matrix of more than 65536 columns
    /// is an `InvalidArgument` error.
    pub fn compact_columns(&self) -> Result<Arc<CompactColumns>> {
        let mut slot = self.compact_columns.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let c = Arc::new(convert::compact_columns(self)?);
        *slot = Some(c.clone());
        Ok(c)
    }

    /// What converting to this matrix on the device cost (`None` for an upload from the host).
    pub fn conversion(&self) -> Option<&ConversionReport> {
        self.conversion.as_ref()
    }

    /// How many times the values were changed in place ([`update_values`](Self::update_values));
    /// 0 after construction.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Unique in the process for this matrix and its current values (see `identity`).
    pub(crate) fn identity(&self) -> u64 {
        self.identity
    }

    /// Unique in the process for this matrix's sparsity pattern (see `pattern`).
    pub(crate) fn pattern(&self) -> u64 {
        self.pattern
    }

    /// Replaces the values in place (same pattern: `values` has one entry per stored nonzero, in
    /// stored order), bumps [`version`](Self::version) and drops every cached plan and
    /// conversion that holds values (the next use makes them again from the new values). The
    /// 16-bit columns ([`compact_columns`](Self::compact_columns)) hold no values and the
    /// offsets and indices never change, so they are kept.
    pub fn update_values(&mut self, values: &[T]) -> Result<()> {
        if values.len() != self.nnz() {
            return Err(Error::invalid(
                "values",
                format!(
                    "has {} entries; the matrix stores {} nonzeros and update_values keeps its pattern",
                    values.len(),
                    self.nnz()
                ),
            ));
        }
        if !values.is_empty() {
            self.values.copy_from_host(values)?;
        }
        self.version += 1;
        self.identity = next_identity();
        *self.spmv_plan.get_mut().unwrap_or_else(|e| e.into_inner()) = None;
        self.spmm_plans.get_mut().unwrap_or_else(|e| e.into_inner()).clear();
        *self.transposed_plan.get_mut().unwrap_or_else(|e| e.into_inner()) = None;
        *self.transposed.get_mut().unwrap_or_else(|e| e.into_inner()) = None;
        self.bsr.get_mut().unwrap_or_else(|e| e.into_inner()).clear();
        self.bell.get_mut().unwrap_or_else(|e| e.into_inner()).clear();
        Ok(())
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

    /// Times up to five SpMV kernel choices on this matrix ([`spmv_candidates`]: the rules'
    /// lanes per row, half and twice as many, and the binned kernel), with CUDA events on a
    /// random `x` (two warm-up calls, then the best of five), and makes the fastest the cached
    /// plan that [`spmv`](Self::spmv) runs from now on. Returns the chosen tuning. Costs a
    /// few milliseconds and two vectors of scratch; call it once, after construction, for a
    /// matrix that will be multiplied many times (an LSMR solve, an iterative method). Every
    /// candidate computes the same deterministic result up to its summation order.
    pub fn autotune_spmv(&self) -> Result<SpmvTuning> {
        let x_host: Vec<T> = (0..self.cols)
            .map(|i| {
                T::from_f64(((i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as f64 / (1u64 << 24) as f64 - 0.5)
            })
            .collect();
        let x = upload_nonempty(&self.ctx, &x_host)?;
        let mut y = self.ctx.alloc::<T>(self.rows.max(1))?;
        let timer = crate::runtime::EventTimer::new(&self.ctx)?;
        let mut best: Option<(f64, SpmvTuning, Arc<SpmvPlan>)> = None;
        for tuning in spmv_candidates(&self.row_lengths, self.descriptor.col_locality, self.cols, T::DTYPE) {
            let plan = Arc::new(SpmvPlan::new(self, &SpmvOptions { tuning })?);
            plan.run(self, 1.0, &x, 0.0, &mut y)?;
            plan.run(self, 1.0, &x, 0.0, &mut y)?;
            let mut ms = f64::INFINITY;
            for _ in 0..5 {
                timer.start()?;
                plan.run(self, 1.0, &x, 0.0, &mut y)?;
                ms = ms.min(timer.stop_ms()?);
            }
            if best.as_ref().is_none_or(|(t, _, _)| ms < *t) {
                best = Some((ms, tuning, plan));
            }
        }
        let Some((_, tuning, plan)) = best else {
            return Ok(SpmvTuning::default());
        };
        *self.spmv_plan.lock().unwrap_or_else(|e| e.into_inner()) = Some(plan);
        Ok(tuning)
    }

    /// `y = alpha * A x + beta * y` with the cached plan (deterministic: bitwise the same
    /// result every call). `x` has `cols` elements, `y` has `rows`; `beta == 0` does not read
    /// `y`.
    pub fn spmv(&self, alpha: f64, x: &DeviceBuffer<T>, beta: f64, y: &mut DeviceBuffer<T>) -> Result<()> {
        self.spmv_plan()?.run(self, alpha, x, beta, y)
    }

    /// [`spmv`](Self::spmv), except that nothing happens (y unchanged) when `skip` is given and
    /// its device flag is not zero at the time the kernels run.
    pub fn spmv_unless(
        &self,
        skip: Option<SkipIf<'_>>,
        alpha: f64,
        x: &DeviceBuffer<T>,
        beta: f64,
        y: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        self.spmv_plan()?.run_unless(skip, self, alpha, x, beta, y)
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

/// Tuning that keeps every row in the row kernel: the lanes per row of kernels without a
/// long-row path.
fn all_rows_short() -> SpmvTuning {
    SpmvTuning {
        long_threshold: Some(usize::MAX),
        ..SpmvTuning::default()
    }
}

/// Checks that `a` is the matrix a plan was made for (value and index types, shape).
/// A process-unique matrix identity (see `CsrMatrix::identity`).
fn next_identity() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

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

/// Checks the operands of `y = alpha * A x + beta * y` for an `rows x cols` matrix: `x` reads
/// `cols` elements, `y` is `rows` long, both scalars finite.
pub(crate) fn check_spmv_operands(
    rows: usize,
    cols: usize,
    x_len: usize,
    y_len: usize,
    alpha: f64,
    beta: f64,
) -> Result<()> {
    check_operand("x", x_len, cols, format_args!("the matrix has {cols} columns"))?;
    check_operand("y", y_len, rows, format_args!("the matrix has {rows} rows"))?;
    check_scalars(alpha, beta)
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
