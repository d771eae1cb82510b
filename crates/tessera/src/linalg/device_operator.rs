//! Linear operators on the device: the seam between the GPU LSMR solver and matrix storage.
//!
//! [`LinearOperator`] is [`HostLinearOperator`](super::HostLinearOperator)'s device twin: a real
//! `m x n` matrix seen only through `y = alpha A x + beta y` and `y = alpha A^T x + beta y` on
//! [`DeviceBuffer`]s of the storage type `T` (f32 or f64), queued on the context's stream. The
//! solver knows nothing else. Implementations:
//!
//! * [`SparseDualOperator`]: the CSR of `A` and the CSR of `A^T` (built once at construction,
//!   from the host transpose), so both products are deterministic row-major SpMVs. Twice the
//!   matrix memory; the fastest.
//! * [`SparseSingleOperator`]: only the CSR of `A`; `A^T x` scatters with atomics
//!   ([`CsrMatrix::spmv_transposed`]), so it is not bitwise reproducible. For matrices whose
//!   second copy does not fit.
//! * [`sparse_operator`] picks one of the two by [`Storage`]: `Auto` takes dual storage when
//!   the copy of `A^T` plus a margin fits the device's free memory, else single.
//! * [`FnDeviceOperator`]: a pair of closures (matrix-free operators, other libraries' kernels).
//!
//! Batched products ([`LinearOperator::apply_many`], [`LinearOperator::apply_transposed_many`],
//! for many right-hand sides): `k` column vectors at once, stored column-major and packed
//! (`n x k` with leading dimension `n`, `m x k` with `m`). The default runs the single-vector
//! product column by column (through one-column work buffers), so every operator supports
//! them; the sparse operators override them with the sparse module's deterministic
//! [`CsrMatrix::spmm`] in its column-major layout (dual storage: both products; single storage:
//! `A` only, `A^T` loops over the columns, as there is no transposed SpMM).
//!
//! Matrices are checked at construction: the CSR structure (by the upload) and every value
//! finite (NaN or infinity in `A` is an error naming the first bad entry).

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::runtime::{Context, DeviceBuffer};
use crate::sparse::{CsrHost, CsrMatrix, SkipIf, SparseIndex};

/// A real `m x n` matrix on the device, seen only through its two products.
///
/// Both products are queued on the context's stream and must not synchronise with the host
/// (the solver queues many iterations before it looks at a result), read only `x` and write
/// only `y` (its first `m` or `n` elements). With `beta == 0` the old `y` is not read.
pub trait LinearOperator<T: Element> {
    /// `(m, n)`: rows and columns of `A`.
    fn shape(&self) -> (usize, usize);
    /// `y = alpha * A x + beta * y`: `x` has `n` elements, `y` has `m`.
    fn apply(&self, alpha: f64, x: &DeviceBuffer<T>, beta: f64, y: &mut DeviceBuffer<T>) -> Result<()>;
    /// `y = alpha * A^T x + beta * y`: `x` has `m` elements, `y` has `n`.
    fn apply_transposed(&self, alpha: f64, x: &DeviceBuffer<T>, beta: f64, y: &mut DeviceBuffer<T>) -> Result<()>;
    /// [`apply`](Self::apply), which may be skipped on the device: when `skip`'s flag is not
    /// zero as the product runs, an implementation may do nothing (y is then unspecified). The
    /// solver passes its stop flag so that the products it queued past the stop cost a launch,
    /// not a pass over `A`. The default ignores the flag (always correct, only slower).
    fn apply_unless(
        &self,
        skip: SkipIf<'_>,
        alpha: f64,
        x: &DeviceBuffer<T>,
        beta: f64,
        y: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        let _ = skip;
        self.apply(alpha, x, beta, y)
    }
    /// [`apply_transposed`](Self::apply_transposed), which may be skipped on the device as
    /// [`apply_unless`](Self::apply_unless). The default ignores the flag.
    fn apply_transposed_unless(
        &self,
        skip: SkipIf<'_>,
        alpha: f64,
        x: &DeviceBuffer<T>,
        beta: f64,
        y: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        let _ = skip;
        self.apply_transposed(alpha, x, beta, y)
    }
    /// A short name of the storage, for reports (`csr-dual`, `csr-single`, `dense`, `fn`).
    fn storage(&self) -> &'static str;
    /// `Y = alpha * A X + beta * Y` for `k >= 1` columns: `X` is `n x k` and `Y` is `m x k`,
    /// column-major with leading dimensions `n` and `m` (column `j` of `X` at `j * n`). The
    /// default applies [`apply`](Self::apply) to each column (with `k == 1` directly on the
    /// buffers, else through one-column work buffers); with `k == 1` an override must give
    /// what `apply` gives, bit for bit.
    fn apply_many(&self, alpha: f64, x: &DeviceBuffer<T>, k: usize, beta: f64, y: &mut DeviceBuffer<T>) -> Result<()> {
        let (m, n) = self.shape();
        columnwise(n, m, alpha, x, k, beta, y, |alpha, x, beta, y| {
            self.apply(alpha, x, beta, y)
        })
    }
    /// `Y = alpha * A^T X + beta * Y` for `k >= 1` columns: `X` is `m x k`, `Y` is `n x k`,
    /// column-major with leading dimensions `m` and `n`. Default: column by column, as
    /// [`apply_many`](Self::apply_many).
    fn apply_transposed_many(
        &self,
        alpha: f64,
        x: &DeviceBuffer<T>,
        k: usize,
        beta: f64,
        y: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        let (m, n) = self.shape();
        columnwise(m, n, alpha, x, k, beta, y, |alpha, x, beta, y| {
            self.apply_transposed(alpha, x, beta, y)
        })
    }
    /// The Euclidean norm of each column of `A` (`n` values, on the host), for column scaling
    /// ([`LsmrOptions::scale_columns`](super::LsmrOptions::scale_columns)); `None` when the
    /// operator cannot give them (the default).
    fn column_norms(&self) -> Option<Vec<f64>> {
        None
    }
    /// Whether `apply` and `apply_transposed`, once each has run, only queue kernels, memsets
    /// and device copies on the context's stream with no host synchronisation or allocation
    /// outside the pool, so that the solver may record them in a CUDA graph and replay them
    /// with the same buffers. Default false (a closure operator may do anything).
    fn graph_capturable(&self) -> bool {
        false
    }
}

/// Checks the operands of a batched product: `k >= 1`, `x` holds `x_len * k` elements and `y`
/// `y_len * k`.
pub fn check_many<T: Element>(
    x_len: usize,
    y_len: usize,
    x: &DeviceBuffer<T>,
    k: usize,
    y: &DeviceBuffer<T>,
) -> Result<()> {
    if k == 0 {
        return Err(Error::invalid("k", "is 0; a batched product needs at least one column"));
    }
    for (arg, len, rows) in [("x", x.len(), x_len), ("y", y.len(), y_len)] {
        match rows.checked_mul(k) {
            Some(need) if len >= need => {}
            Some(need) => {
                return Err(Error::invalid(
                    arg,
                    format!("has {len} elements; {rows} x {k} column-major needs {need}"),
                ))
            }
            None => return Err(Error::invalid("k", format!("{rows} x {k} overflows usize"))),
        }
    }
    Ok(())
}

/// The default batched product: `product` on each column of `x` (`x_len` rows) into the same
/// column of `y` (`y_len` rows), through one-column work buffers (stream-ordered pool
/// allocations, freed in stream order), or directly when `k == 1`.
#[allow(clippy::too_many_arguments)] // the product's operands plus the shapes
pub fn columnwise<T: Element>(
    x_len: usize,
    y_len: usize,
    alpha: f64,
    x: &DeviceBuffer<T>,
    k: usize,
    beta: f64,
    y: &mut DeviceBuffer<T>,
    product: impl Fn(f64, &DeviceBuffer<T>, f64, &mut DeviceBuffer<T>) -> Result<()>,
) -> Result<()> {
    check_many(x_len, y_len, x, k, y)?;
    if k == 1 {
        return product(alpha, x, beta, y);
    }
    let ctx = x.context();
    let mut xc = ctx.alloc::<T>(x_len.max(1))?;
    let mut yc = ctx.alloc::<T>(y_len.max(1))?;
    for j in 0..k {
        copy_elements(&mut xc, 0, x, j * x_len, x_len)?;
        if beta != 0.0 {
            copy_elements(&mut yc, 0, y, j * y_len, y_len)?;
        }
        product(alpha, &xc, beta, &mut yc)?;
        copy_elements(y, j * y_len, &yc, 0, y_len)?;
    }
    Ok(())
}

/// `dst[dst_at .. dst_at + len] = src[src_at .. src_at + len]`, queued on the stream.
pub(crate) fn copy_elements<T: Element>(
    dst: &mut DeviceBuffer<T>,
    dst_at: usize,
    src: &DeviceBuffer<T>,
    src_at: usize,
    len: usize,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let fits = |at: usize, buf_len: usize| at.checked_add(len).is_some_and(|end| end <= buf_len);
    if !fits(dst_at, dst.len()) || !fits(src_at, src.len()) {
        return Err(Error::invalid(
            "len",
            format!(
                "copy of {len} elements from {src_at} of {} to {dst_at} of {} is out of bounds",
                src.len(),
                dst.len()
            ),
        ));
    }
    let s = std::mem::size_of::<T>();
    src.context().bind()?;
    // SAFETY: both ranges lie inside their allocations (checked above); the copy is ordered on
    // the context's stream like every kernel that reads or writes these buffers.
    crate::runtime::context::check("cuMemcpyDtoDAsync", unsafe {
        cudarc::driver::sys::cuMemcpyDtoDAsync_v2(
            dst.device_ptr() + (dst_at * s) as u64,
            src.device_ptr() + (src_at * s) as u64,
            len * s,
            src.context().cu_stream(),
        )
    })
}

/// `C = alpha * A B + beta * C` for `k` packed column-major columns by the deterministic SpMM
/// (`k == 1`: the SpMV, so that one column gives bitwise the single-vector product).
pub fn csr_many<T: Element, I: SparseIndex>(
    a: &CsrMatrix<T, I>,
    alpha: f64,
    x: &DeviceBuffer<T>,
    k: usize,
    beta: f64,
    y: &mut DeviceBuffer<T>,
) -> Result<()> {
    check_many(a.cols(), a.rows(), x, k, y)?;
    if k == 1 {
        return a.spmv(alpha, x, beta, y);
    }
    a.spmm(alpha, x, k, crate::sparse::DenseLayout::ColMajor, beta, y)
}

/// How a sparse matrix is stored for the solver.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Storage {
    /// Dual when the transposed copy fits in free device memory (with a margin), else single.
    #[default]
    Auto,
    /// The CSR of `A` and of `A^T` ([`SparseDualOperator`]).
    Dual,
    /// Only the CSR of `A` ([`SparseSingleOperator`]).
    Single,
}

/// Checks that every stored value of `a` is finite (NaN or infinity in `A` poisons every
/// iterate, so it is refused up front).
pub fn check_finite_values<T: Element, I: SparseIndex>(a: &CsrHost<T, I>) -> Result<()> {
    match a.values.iter().position(|v| !v.to_f64().is_finite()) {
        None => Ok(()),
        Some(k) => {
            let row = a.offsets.partition_point(|o| o.to_usize() <= k) - 1;
            Err(Error::invalid(
                "A",
                format!(
                    "entry ({row}, {}) is {}; every value must be finite",
                    a.indices[k].to_usize(),
                    a.values[k].to_f64()
                ),
            ))
        }
    }
}

fn check_value_type<T: Element>() -> Result<()> {
    if !matches!(T::DTYPE, DType::F32 | DType::F64) {
        return Err(Error::Unsupported(format!(
            "LSMR on {} values; supported: fp32, fp64",
            T::DTYPE
        )));
    }
    Ok(())
}

/// `A` and `A^T` as two device CSR matrices: both products are deterministic SpMVs.
pub struct SparseDualOperator<T: Element, I: SparseIndex> {
    a: CsrMatrix<T, I>,
    at: CsrMatrix<T, I>,
    column_norms: Vec<f64>,
}

impl<T: Element, I: SparseIndex> SparseDualOperator<T, I> {
    /// Checks `a` (structure, finite values), transposes it on the host and uploads both.
    pub fn new(ctx: &Context, a: &CsrHost<T, I>) -> Result<Self> {
        check_value_type::<T>()?;
        a.validate()?;
        check_finite_values(a)?;
        Ok(SparseDualOperator {
            a: CsrMatrix::from_host(ctx, a)?,
            at: CsrMatrix::from_host(ctx, &a.transpose())?,
            column_norms: host_column_norms(a),
        })
    }
    pub fn matrix(&self) -> &CsrMatrix<T, I> {
        &self.a
    }
}

impl<T: Element, I: SparseIndex> LinearOperator<T> for SparseDualOperator<T, I> {
    fn shape(&self) -> (usize, usize) {
        (self.a.rows(), self.a.cols())
    }
    fn apply(&self, alpha: f64, x: &DeviceBuffer<T>, beta: f64, y: &mut DeviceBuffer<T>) -> Result<()> {
        self.a.spmv(alpha, x, beta, y)
    }
    fn apply_transposed(&self, alpha: f64, x: &DeviceBuffer<T>, beta: f64, y: &mut DeviceBuffer<T>) -> Result<()> {
        self.at.spmv(alpha, x, beta, y)
    }
    fn apply_unless(
        &self,
        skip: SkipIf<'_>,
        alpha: f64,
        x: &DeviceBuffer<T>,
        beta: f64,
        y: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        self.a.spmv_unless(Some(skip), alpha, x, beta, y)
    }
    fn apply_transposed_unless(
        &self,
        skip: SkipIf<'_>,
        alpha: f64,
        x: &DeviceBuffer<T>,
        beta: f64,
        y: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        self.at.spmv_unless(Some(skip), alpha, x, beta, y)
    }
    /// The SpMM of `A` (column-major; one column: the SpMV).
    fn apply_many(&self, alpha: f64, x: &DeviceBuffer<T>, k: usize, beta: f64, y: &mut DeviceBuffer<T>) -> Result<()> {
        csr_many(&self.a, alpha, x, k, beta, y)
    }
    /// The SpMM of the stored `A^T` (column-major; one column: the SpMV).
    fn apply_transposed_many(
        &self,
        alpha: f64,
        x: &DeviceBuffer<T>,
        k: usize,
        beta: f64,
        y: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        csr_many(&self.at, alpha, x, k, beta, y)
    }
    fn storage(&self) -> &'static str {
        "csr-dual"
    }
    fn graph_capturable(&self) -> bool {
        true
    }
    fn column_norms(&self) -> Option<Vec<f64>> {
        Some(self.column_norms.clone())
    }
}

/// Only the CSR of `A`; `A^T x` without a transposed copy (atomic scatter: not bitwise
/// reproducible).
pub struct SparseSingleOperator<T: Element, I: SparseIndex> {
    a: CsrMatrix<T, I>,
    column_norms: Vec<f64>,
}

impl<T: Element, I: SparseIndex> SparseSingleOperator<T, I> {
    /// Checks `a` (structure, finite values) and uploads it.
    pub fn new(ctx: &Context, a: &CsrHost<T, I>) -> Result<Self> {
        check_value_type::<T>()?;
        a.validate()?;
        check_finite_values(a)?;
        Ok(SparseSingleOperator {
            a: CsrMatrix::from_host(ctx, a)?,
            column_norms: host_column_norms(a),
        })
    }
    pub fn matrix(&self) -> &CsrMatrix<T, I> {
        &self.a
    }
}

impl<T: Element, I: SparseIndex> LinearOperator<T> for SparseSingleOperator<T, I> {
    fn shape(&self) -> (usize, usize) {
        (self.a.rows(), self.a.cols())
    }
    fn apply(&self, alpha: f64, x: &DeviceBuffer<T>, beta: f64, y: &mut DeviceBuffer<T>) -> Result<()> {
        self.a.spmv(alpha, x, beta, y)
    }
    fn apply_transposed(&self, alpha: f64, x: &DeviceBuffer<T>, beta: f64, y: &mut DeviceBuffer<T>) -> Result<()> {
        self.a.spmv_transposed(alpha, x, beta, y)
    }
    /// The SpMV of `A`, skipped on the flag (`A^T x`, atomic, keeps the default: always runs).
    fn apply_unless(
        &self,
        skip: SkipIf<'_>,
        alpha: f64,
        x: &DeviceBuffer<T>,
        beta: f64,
        y: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        self.a.spmv_unless(Some(skip), alpha, x, beta, y)
    }
    /// The SpMM of `A` (column-major; one column: the SpMV). `A^T X` keeps the default
    /// column loop (atomic transposed SpMV per column: there is no transposed SpMM).
    fn apply_many(&self, alpha: f64, x: &DeviceBuffer<T>, k: usize, beta: f64, y: &mut DeviceBuffer<T>) -> Result<()> {
        csr_many(&self.a, alpha, x, k, beta, y)
    }
    fn storage(&self) -> &'static str {
        "csr-single"
    }
    fn graph_capturable(&self) -> bool {
        true
    }
    fn column_norms(&self) -> Option<Vec<f64>> {
        Some(self.column_norms.clone())
    }
}

/// The column norms of `a`, in f64 (what the sparse operators keep for column scaling).
fn host_column_norms<T: Element, I: SparseIndex>(a: &CsrHost<T, I>) -> Vec<f64> {
    super::HostLinearOperator::column_norms(a).unwrap_or_default()
}

/// Bytes of the device CSR of `A^T` for `a` (values, indices, `cols + 1` offsets).
pub fn transpose_bytes<T: Element, I: SparseIndex>(a: &CsrHost<T, I>) -> usize {
    let (v, i) = (T::DTYPE.size(), I::DTYPE.size());
    a.nnz()
        .saturating_mul(v + i)
        .saturating_add((a.cols + 1).saturating_mul(i))
}

/// Dual storage fits when the transposed copy takes at most this fraction of free memory
/// (the rest covers the solver's vectors, the SpMV plans and other users of the device).
pub const DUAL_FREE_FRACTION: f64 = 0.8;

/// Whether `storage` means dual storage for a transposed copy of `copy_bytes`, with
/// `free_bytes` of device memory free (after `A` itself was uploaded).
pub fn choose_dual(storage: Storage, copy_bytes: usize, free_bytes: usize) -> bool {
    match storage {
        Storage::Dual => true,
        Storage::Single => false,
        Storage::Auto => (copy_bytes as f64) <= DUAL_FREE_FRACTION * free_bytes as f64,
    }
}

/// Options of [`sparse_operator_with`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SparseOperatorOptions {
    /// How `A^T` is stored. Default [`Storage::Auto`].
    pub storage: Storage,
    /// Time the SpMV kernel choices of `A` (and of the `A^T` copy with dual storage) once, at
    /// construction ([`CsrMatrix::autotune_spmv`]: a few milliseconds and two scratch vectors
    /// per matrix), and keep the fastest: for solves of many iterations on one matrix. The
    /// choices include 16-bit columns and column panels where they could pay. Default false:
    /// the rules' plans (construction times nothing).
    pub autotune_spmv: bool,
}

/// A sparse operator for `a` with the chosen [`Storage`] (`Auto`: dual when the transposed
/// copy fits the device's free memory, else single, so a large matrix degrades to the slower
/// storage instead of failing). [`sparse_operator_with`] with the default options otherwise.
pub fn sparse_operator<T: Element, I: SparseIndex>(
    ctx: &Context,
    a: &CsrHost<T, I>,
    storage: Storage,
) -> Result<Box<dyn LinearOperator<T>>> {
    sparse_operator_with(
        ctx,
        a,
        &SparseOperatorOptions {
            storage,
            ..SparseOperatorOptions::default()
        },
    )
}

/// A sparse operator for `a` with `options` (storage, SpMV autotune).
pub fn sparse_operator_with<T: Element, I: SparseIndex>(
    ctx: &Context,
    a: &CsrHost<T, I>,
    options: &SparseOperatorOptions,
) -> Result<Box<dyn LinearOperator<T>>> {
    check_value_type::<T>()?;
    a.validate()?;
    check_finite_values(a)?;
    let matrix = CsrMatrix::from_host(ctx, a)?;
    // storage is chosen before any autotune scratch exists (free memory as the matrix alone
    // leaves it); each stored matrix is then tuned once
    let free = if options.storage == Storage::Auto {
        free_device_bytes(ctx)?
    } else {
        0
    };
    let at = if choose_dual(options.storage, transpose_bytes(a), free) {
        Some(CsrMatrix::from_host(ctx, &a.transpose())?)
    } else {
        None
    };
    if options.autotune_spmv {
        for m in std::iter::once(&matrix).chain(at.as_ref()) {
            m.autotune_spmv()?;
        }
    }
    let column_norms = host_column_norms(a);
    Ok(match at {
        Some(at) => Box::new(SparseDualOperator {
            a: matrix,
            at,
            column_norms,
        }),
        None => Box::new(SparseSingleOperator {
            a: matrix,
            column_norms,
        }),
    })
}

/// Free device memory in bytes (`cuMemGetInfo`).
pub fn free_device_bytes(ctx: &Context) -> Result<usize> {
    ctx.bind()?;
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: two out-parameters; the context is bound.
    crate::runtime::context::check("cuMemGetInfo", unsafe {
        cudarc::driver::sys::cuMemGetInfo_v2(&mut free, &mut total)
    })?;
    Ok(free)
}

/// The closure signature of [`FnDeviceOperator`]: `(alpha, x, beta, y)`.
pub type DeviceApplyFn<'a, T> = Box<dyn Fn(f64, &DeviceBuffer<T>, f64, &mut DeviceBuffer<T>) -> Result<()> + 'a>;

/// A matrix-free operator: a shape and two closures computing `y = alpha A x + beta y` and
/// `y = alpha A^T x + beta y` on the context's stream (they must honour `beta == 0` and must
/// not synchronise with the host).
pub struct FnDeviceOperator<'a, T: Element> {
    rows: usize,
    cols: usize,
    apply: DeviceApplyFn<'a, T>,
    apply_transposed: DeviceApplyFn<'a, T>,
    column_norms: Option<Vec<f64>>,
}

impl<'a, T: Element> FnDeviceOperator<'a, T> {
    pub fn new(rows: usize, cols: usize, apply: DeviceApplyFn<'a, T>, apply_transposed: DeviceApplyFn<'a, T>) -> Self {
        FnDeviceOperator {
            rows,
            cols,
            apply,
            apply_transposed,
            column_norms: None,
        }
    }

    /// The operator with its column norms (for column scaling; checked by the solver).
    pub fn with_column_norms(mut self, norms: Vec<f64>) -> Self {
        self.column_norms = Some(norms);
        self
    }
}

impl<T: Element> LinearOperator<T> for FnDeviceOperator<'_, T> {
    fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }
    fn apply(&self, alpha: f64, x: &DeviceBuffer<T>, beta: f64, y: &mut DeviceBuffer<T>) -> Result<()> {
        (self.apply)(alpha, x, beta, y)
    }
    fn apply_transposed(&self, alpha: f64, x: &DeviceBuffer<T>, beta: f64, y: &mut DeviceBuffer<T>) -> Result<()> {
        (self.apply_transposed)(alpha, x, beta, y)
    }
    fn storage(&self) -> &'static str {
        "fn"
    }
    fn column_norms(&self) -> Option<Vec<f64>> {
        self.column_norms.clone()
    }
}
