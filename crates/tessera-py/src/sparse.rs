//! `tessera.sparse.csr_matrix` and `tessera.lsmr` as Python sees them
//! (`python/tessera/sparse.py` and `_lsmr.py` wrap and document them).
//!
//! [`SparseMatrix`] owns one device [`CsrMatrix`] (values f32, f64, f16 or bf16; indices i32,
//! or i64 when a dimension or nnz does not fit i32), made once: from host CSR arrays (SciPy's
//! `indptr`/`indices`/`data`, validated, columns sorted and duplicates summed by
//! [`CsrHost::new`]) or from COO triplets already on the device (a torch sparse tensor:
//! copied once on the device and converted there by [`CsrMatrix::from_coo`]). The Rust
//! `CsrMatrix` owns its arrays, so neither path is zero-copy.
//!
//! Streams. A `CsrMatrix` and its cached plans queue on the stream of the context they were
//! made with: here the caller's current stream at construction (the matrix's "home" stream,
//! as the KV cache's allocation stream). A product on another stream is ordered with events
//! (no host synchronisation): the home stream first waits for the caller's stream, the
//! product runs there, and the caller's stream then waits for it. The matrix's memory is
//! freed on the home stream when the Python object goes, after all its work.
//!
//! Operands. The sparse kernels take tessera [`DeviceBuffer`]s, not strided views, so a
//! product copies `x` into a buffer of the device's pool and the result out of one (two
//! device-to-device copies on the home stream; the SpMV itself reads nnz values and indices,
//! which dominate for any matrix with more than a few nonzeros per row).
//!
//! LSMR: [`SparseMatrix::lsmr`] runs `tessera::linalg::lsmr` on the home stream with the
//! matrix behind a [`LinearOperator`] (`A^T x` through the cached CSR of `A^T` when it fits
//! the free device memory, else the atomic transposed SpMV; many right-hand sides through
//! the SpMM); [`lsmr_callback`] runs it over a Python callback (a dense torch matrix or a
//! `matvec`/`rmatvec` object) on the caller's stream. Both solve one `b`, the `k` columns of
//! `B` in one run (`lsmr_many`) or one `b` for a list of damps in one run (`lsmr_damps`)
//! ([`Problem`]). `b` and `x0` cross as host f64 bytes and `x` comes back so: the solve
//! synchronises every few iterations anyway.

use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tessera::linalg::device_operator::{self as ops, choose_dual, columnwise, free_device_bytes};
use tessera::linalg::lsmr_device::validate_many;
use tessera::linalg::{
    lsmr_damps_with, lsmr_many_with, lsmr_with, LinearOperator, LsmrOptions, LsmrResult, LsmrRunOptions, ManyRhs,
    Storage, MAX_RHS,
};
use tessera::runtime::{Context, DeviceBuffer};
use tessera::sparse::{CooMatrix, CsrCheck, CsrHost, CsrMatrix, DenseLayout, Duplicates, SparseIndex};
use tessera::{DType, Element};

use crate::cache::{self, StreamId};
use crate::desc::{Desc, RawDesc};
use crate::errors::{invalid, to_py, IntoPy};

type F16 = tessera::dtype::host::F16;
type BF16 = tessera::dtype::host::BF16;

/// A device CSR matrix of one of the supported (value, index) type pairs.
enum AnyCsr {
    F32I32(CsrMatrix<f32, i32>),
    F32I64(CsrMatrix<f32, i64>),
    F64I32(CsrMatrix<f64, i32>),
    F64I64(CsrMatrix<f64, i64>),
    F16I32(CsrMatrix<F16, i32>),
    F16I64(CsrMatrix<F16, i64>),
    BF16I32(CsrMatrix<BF16, i32>),
    BF16I64(CsrMatrix<BF16, i64>),
}

/// Evaluates `$body` with `$a` bound to the `CsrMatrix<$t, _>` inside `$m`.
macro_rules! with_csr {
    ($m:expr, |$a:ident, $t:ident| $body:expr) => {
        match $m {
            AnyCsr::F32I32($a) => {
                #[allow(dead_code)]
                type $t = f32;
                $body
            }
            AnyCsr::F32I64($a) => {
                #[allow(dead_code)]
                type $t = f32;
                $body
            }
            AnyCsr::F64I32($a) => {
                #[allow(dead_code)]
                type $t = f64;
                $body
            }
            AnyCsr::F64I64($a) => {
                #[allow(dead_code)]
                type $t = f64;
                $body
            }
            AnyCsr::F16I32($a) => {
                #[allow(dead_code)]
                type $t = F16;
                $body
            }
            AnyCsr::F16I64($a) => {
                #[allow(dead_code)]
                type $t = F16;
                $body
            }
            AnyCsr::BF16I32($a) => {
                #[allow(dead_code)]
                type $t = BF16;
                $body
            }
            AnyCsr::BF16I64($a) => {
                #[allow(dead_code)]
                type $t = BF16;
                $body
            }
        }
    };
}

/// Wraps a typed matrix in [`AnyCsr`].
trait IntoAny {
    fn into_any(self) -> AnyCsr;
}

macro_rules! into_any {
    ($($t:ty, $i:ty => $v:ident),+ $(,)?) => {
        $(impl IntoAny for CsrMatrix<$t, $i> {
            fn into_any(self) -> AnyCsr {
                AnyCsr::$v(self)
            }
        })+
    };
}

into_any!(
    f32, i32 => F32I32, f32, i64 => F32I64, f64, i32 => F64I32, f64, i64 => F64I64,
    F16, i32 => F16I32, F16, i64 => F16I64, BF16, i32 => BF16I32, BF16, i64 => BF16I64,
);

/// The torch name of a value dtype.
fn torch_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "float32",
        DType::F64 => "float64",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::I32 => "int32",
        DType::I64 => "int64",
        _ => "unknown",
    }
}

/// The value dtype named `name` (torch or NumPy name), for argument `arg`.
fn value_dtype(arg: &'static str, name: &str) -> PyResult<DType> {
    match name {
        "float32" => Ok(DType::F32),
        "float64" => Ok(DType::F64),
        "float16" => Ok(DType::F16),
        "bfloat16" => Ok(DType::BF16),
        _ => Err(to_py(tessera::Error::Unsupported(format!(
            "`{arg}` has dtype {name}; tessera's sparse matrices hold float32, float64, float16 or bfloat16 values"
        )))),
    }
}

/// `bytes` as a vector of `T` (native byte order), for argument `arg`.
fn from_bytes<T: Element>(arg: &'static str, bytes: &[u8]) -> PyResult<Vec<T>> {
    let size = std::mem::size_of::<T>();
    if bytes.len() % size != 0 {
        return Err(invalid(
            arg,
            format!("{} bytes are not a whole number of {size}-byte elements", bytes.len()),
        ));
    }
    let mut v = vec![T::default(); bytes.len() / size];
    // SAFETY: `v` holds exactly bytes.len() bytes; `Element` guarantees `T` has no padding and
    // that every bit pattern is a valid value, so any bytes make valid elements.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.as_mut_ptr() as *mut u8, bytes.len()) };
    Ok(v)
}

/// Whether `rows`, `cols` and `nnz` all fit 32-bit indices.
fn fits_i32(rows: usize, cols: usize, nnz: usize) -> bool {
    let max = i32::MAX as usize;
    rows <= max && cols <= max && nnz <= max
}

/// The validated host matrix (`CsrHost::new`: offsets, column range, sorted columns, summed
/// duplicates) with i64 indices, made from host bytes.
fn host_csr<T: Element>(
    rows: usize,
    cols: usize,
    indptr: &[u8],
    indices: &[u8],
    data: &[u8],
) -> PyResult<CsrHost<T, i64>> {
    let offsets = from_bytes::<i64>("indptr", indptr)?;
    let indices = from_bytes::<i64>("indices", indices)?;
    let values = from_bytes::<T>("data", data)?;
    CsrHost::new(rows, cols, offsets, indices, values, &CsrCheck::default())
        .map_err(scipy_names)
        .py_err()
}

/// tessera's CSR argument names in SciPy's words (`offsets` is `indptr`, `values` is `data`).
fn scipy_names(e: tessera::Error) -> tessera::Error {
    match e {
        tessera::Error::InvalidArgument { arg: "offsets", rule } => tessera::Error::InvalidArgument {
            arg: "indptr",
            rule: rule.replace("offsets", "indptr"),
        },
        tessera::Error::InvalidArgument { arg: "values", rule } => {
            tessera::Error::InvalidArgument { arg: "data", rule }
        }
        e => e,
    }
}

/// Uploads `host` with i32 indices when they fit, else i64.
fn upload<T: Element>(ctx: &Context, host: &CsrHost<T, i64>) -> tessera::Result<AnyCsr>
where
    CsrMatrix<T, i32>: IntoAny,
    CsrMatrix<T, i64>: IntoAny,
{
    if fits_i32(host.rows, host.cols, host.nnz()) {
        Ok(CsrMatrix::from_host(ctx, &host.with_index::<i32>()?)?.into_any())
    } else {
        Ok(CsrMatrix::from_host(ctx, host)?.into_any())
    }
}

/// Validates host CSR arrays without a device (what the constructor checks first): `indptr`
/// and `indices` int64 bytes, `data` bytes of `dtype`. Returns the stored nonzeros after
/// duplicates are summed.
#[pyfunction]
pub fn check_csr(rows: usize, cols: usize, dtype: &str, indptr: &[u8], indices: &[u8], data: &[u8]) -> PyResult<usize> {
    let v = value_dtype("data", dtype)?;
    let nnz = match v {
        DType::F32 => host_csr::<f32>(rows, cols, indptr, indices, data)?.nnz(),
        DType::F64 => host_csr::<f64>(rows, cols, indptr, indices, data)?.nnz(),
        DType::F16 => host_csr::<F16>(rows, cols, indptr, indices, data)?.nnz(),
        _ => host_csr::<BF16>(rows, cols, indptr, indices, data)?.nnz(),
    };
    Ok(nnz)
}

/// The context of `device` queueing on `stream`.
fn on(device: usize, stream: StreamId) -> tessera::Result<Context> {
    // SAFETY: `stream` is the caller's current stream of `device` (torch's, or one the caller
    // named), which outlives the objects made with it (module docs of `cache`).
    unsafe { cache::context_on(device, stream) }
}

/// `len` elements of `T` copied from device address `src` into a new buffer of `ctx`, on its
/// stream.
///
/// # Safety
/// `src` is device memory of `ctx`'s device holding at least `len` elements of `T`, valid
/// until the copy has run on `ctx`'s stream.
unsafe fn copy_in<T: Element>(ctx: &Context, src: u64, len: usize) -> tessera::Result<DeviceBuffer<T>> {
    let buf = ctx.alloc::<T>(len.max(1))?;
    if len > 0 {
        // SAFETY: the caller's promise for `src`; `buf` holds at least len elements; ctx.alloc
        // bound the context to this thread.
        unsafe { memcpy(buf.device_ptr(), src, len * std::mem::size_of::<T>(), ctx) }?;
    }
    Ok(buf)
}

/// `cuMemcpyDtoDAsync` of `bytes` on `ctx`'s stream.
///
/// # Safety
/// Both ranges are device memory of `ctx`'s device holding `bytes` bytes; the context is
/// bound to the thread.
unsafe fn memcpy(dst: u64, src: u64, bytes: usize, ctx: &Context) -> tessera::Result<()> {
    // SAFETY: forwarded to the caller.
    let r = unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, ctx.cu_stream()) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(tessera::Error::cuda("cuMemcpyDtoDAsync", format!("{r:?}")));
    }
    Ok(())
}

/// A 1-D contiguous device array argument (COO triplets): its address, dtype and length.
fn vector(arg: &'static str, raw: RawDesc) -> PyResult<(u64, DType, usize)> {
    let d = Desc::new(arg, raw)?;
    if d.shape.len() != 1 || (d.shape[0] > 1 && d.strides[0] != 1) {
        return Err(invalid(
            arg,
            format!(
                "must be a contiguous 1-D array, got shape {:?} strides {:?}",
                d.shape, d.strides
            ),
        ));
    }
    Ok((d.ptr, d.dtype, d.shape[0]))
}

/// COO triplets on the device into a CSR matrix of `ctx`: copied, indices checked on the
/// device, converted there (duplicates summed).
///
/// # Safety
/// The three addresses hold `nnz` elements of their dtypes on `ctx`'s device, ready on (or
/// ordered before) `ctx`'s stream.
unsafe fn from_coo<T: Element, I: SparseIndex>(
    ctx: &Context,
    rows: usize,
    cols: usize,
    (r, c, v): (u64, u64, u64),
    nnz: usize,
) -> tessera::Result<AnyCsr>
where
    CsrMatrix<T, I>: IntoAny,
{
    let (ri, ci, vals) = if nnz == 0 {
        (ctx.alloc::<I>(0)?, ctx.alloc::<I>(0)?, ctx.alloc::<T>(0)?)
    } else {
        // SAFETY: the caller's promise (nnz elements at each address).
        unsafe {
            (
                copy_in::<I>(ctx, r, nnz)?,
                copy_in::<I>(ctx, c, nnz)?,
                copy_in::<T>(ctx, v, nnz)?,
            )
        }
    };
    let coo = CooMatrix::from_device(ctx, rows, cols, ri, ci, vals)?;
    Ok(CsrMatrix::from_coo(&coo, Duplicates::Sum)?.into_any())
}

/// A CSR matrix on one CUDA device (`tessera.sparse.csr_matrix` holds one).
#[pyclass(module = "tessera._tessera", name = "SparseMatrix")]
pub struct SparseMatrix {
    device: usize,
    /// The stream the matrix and its plans queue on (module docs).
    home: StreamId,
    csr: AnyCsr,
    /// Serialises products: the shared plans and the home stream's order.
    lock: Mutex<()>,
}

impl SparseMatrix {
    fn dims(&self) -> (usize, usize, usize) {
        with_csr!(&self.csr, |a, _T| (a.rows(), a.cols(), a.nnz()))
    }
    fn value(&self) -> DType {
        with_csr!(&self.csr, |_a, T| T::DTYPE)
    }
    fn index(&self) -> DType {
        match &self.csr {
            AnyCsr::F32I32(_) | AnyCsr::F64I32(_) | AnyCsr::F16I32(_) | AnyCsr::BF16I32(_) => DType::I32,
            _ => DType::I64,
        }
    }
}

/// The dense operand of a product with a `rows x cols` matrix of `value` (`transpose`: with
/// its transpose): `x` `[cols]` or `[cols, k]` (row- or column-major, packed), `y` of the
/// result's shape in the same layout. Returns `(k, layout)`; `k` is `None` for a vector.
fn product_operands(
    rows: usize,
    cols: usize,
    value: DType,
    x: &Desc,
    y: &Desc,
    transpose: bool,
) -> PyResult<(Option<usize>, DenseLayout)> {
    let (rows, cols) = if transpose { (cols, rows) } else { (rows, cols) };
    for (arg, d) in [("x", x), ("out", y)] {
        if d.dtype != value {
            return Err(invalid(
                arg,
                format!(
                    "has dtype {}; the matrix holds {} (convert with .to({}))",
                    torch_name(d.dtype),
                    torch_name(value),
                    torch_name(value)
                ),
            ));
        }
    }
    let layout_of = |arg: &'static str, d: &Desc, r: usize| -> PyResult<(Option<usize>, DenseLayout)> {
        match d.shape.len() {
            1 if d.shape[0] == r && (r <= 1 || d.strides[0] == 1) => Ok((None, DenseLayout::RowMajor)),
            2 if d.shape[0] == r => {
                let k = d.shape[1];
                let row = (k <= 1 || d.strides[1] == 1) && (r <= 1 || k == 0 || d.strides[0] == k);
                let col = (r <= 1 || d.strides[0] == 1) && (k <= 1 || d.strides[1] == r);
                if row {
                    Ok((Some(k), DenseLayout::RowMajor))
                } else if col {
                    Ok((Some(k), DenseLayout::ColMajor))
                } else {
                    Err(invalid(
                        arg,
                        format!(
                            "strides {:?} of shape {:?}: a dense operand must be packed row- or column-major",
                            d.strides, d.shape
                        ),
                    ))
                }
            }
            _ => Err(invalid(
                arg,
                format!(
                    "has shape {:?}; a {rows} x {cols} matrix multiplies [{cols}] or [{cols}, k] (and writes [{rows}] or [{rows}, k])",
                    d.shape
                ),
            )),
        }
    };
    let (k, layout) = layout_of("x", x, cols)?;
    let (ky, ly) = layout_of("out", y, rows)?;
    let both = k.unwrap_or(0) > 1 && rows > 1 && cols > 1;
    if ky != k || (both && ly != layout) {
        return Err(invalid(
            "out",
            format!(
                "has shape {:?} strides {:?}; the product of x {:?} is {:?} in x's layout",
                y.shape,
                y.strides,
                x.shape,
                match k {
                    None => vec![rows],
                    Some(k) => vec![rows, k],
                }
            ),
        ));
    }
    if k.unwrap_or(0) > tessera::sparse::spmm::MAX_N {
        return Err(invalid(
            "x",
            format!(
                "has {} columns; at most {}",
                k.unwrap_or(0),
                tessera::sparse::spmm::MAX_N
            ),
        ));
    }
    Ok((k, layout))
}

/// Validates `out = A @ x` (or `A.T @ x`) for an `rows x cols` matrix of `dtype` without a
/// device; returns the columns of x (None for a vector) and its layout (`"row"` / `"col"`).
#[pyfunction]
pub fn check_sparse_product(
    rows: usize,
    cols: usize,
    dtype: &str,
    x: RawDesc,
    out: RawDesc,
    transpose: bool,
) -> PyResult<(Option<usize>, &'static str)> {
    let value = value_dtype("matrix", dtype)?;
    let (k, l) = product_operands(
        rows,
        cols,
        value,
        &Desc::new("x", x)?,
        &Desc::new("out", out)?,
        transpose,
    )?;
    Ok((k, if l == DenseLayout::RowMajor { "row" } else { "col" }))
}

/// `y = A x` or `Y = A X` (of `a` or its cached transpose) on `ctx`'s stream, through buffers.
///
/// # Safety
/// `x` and `y` describe live device memory of the matrix's device (checked by
/// [`product_operands`]), ordered before `ctx`'s stream.
unsafe fn product<T: Element, I: SparseIndex>(
    ctx: &Context,
    a: &CsrMatrix<T, I>,
    transpose: bool,
    x: &Desc,
    y: &Desc,
    (k, layout): (Option<usize>, DenseLayout),
) -> tessera::Result<()> {
    if k == Some(0) {
        return Ok(());
    }
    let transposed;
    let a = if transpose {
        transposed = a.transposed()?;
        &*transposed
    } else {
        a
    };
    let width = k.unwrap_or(1);
    let (len_x, len_y) = (a.cols() * width, a.rows() * width);
    // SAFETY: x holds len_x packed elements (product_operands).
    let xb = unsafe { copy_in::<T>(ctx, x.ptr, len_x) }?;
    let mut yb = ctx.alloc::<T>(len_y.max(1))?;
    match k {
        None => a.spmv(1.0, &xb, 0.0, &mut yb)?,
        Some(k) => a.spmm(1.0, &xb, k, layout, 0.0, &mut yb)?,
    }
    if len_y > 0 {
        // SAFETY: y holds len_y packed elements (product_operands), yb as many.
        unsafe { memcpy(y.ptr, yb.device_ptr(), len_y * std::mem::size_of::<T>(), ctx) }?;
    }
    Ok(())
}

/// The operator of LSMR over a device CSR matrix: `A^T x` through the CSR of `A^T` (cached on
/// the matrix) or, without it, the atomic transposed SpMV. Many right-hand sides: the SpMM of
/// `A` (and of the cached `A^T`), column-major.
struct CsrOperator<'a, T: Element, I: SparseIndex> {
    a: &'a CsrMatrix<T, I>,
    at: Option<Arc<CsrMatrix<T, I>>>,
}

impl<T: Element, I: SparseIndex> LinearOperator<T> for CsrOperator<'_, T, I> {
    fn shape(&self) -> (usize, usize) {
        (self.a.rows(), self.a.cols())
    }
    fn apply(&self, alpha: f64, x: &DeviceBuffer<T>, beta: f64, y: &mut DeviceBuffer<T>) -> tessera::Result<()> {
        self.a.spmv(alpha, x, beta, y)
    }
    fn apply_transposed(
        &self,
        alpha: f64,
        x: &DeviceBuffer<T>,
        beta: f64,
        y: &mut DeviceBuffer<T>,
    ) -> tessera::Result<()> {
        match &self.at {
            Some(at) => at.spmv(alpha, x, beta, y),
            None => self.a.spmv_transposed(alpha, x, beta, y),
        }
    }
    fn storage(&self) -> &'static str {
        if self.at.is_some() {
            "csr-dual"
        } else {
            "csr-single"
        }
    }
    /// The SpMM of `A` (one column: the SpMV, so that it is bitwise `apply`).
    fn apply_many(
        &self,
        alpha: f64,
        x: &DeviceBuffer<T>,
        k: usize,
        beta: f64,
        y: &mut DeviceBuffer<T>,
    ) -> tessera::Result<()> {
        ops::csr_many(self.a, alpha, x, k, beta, y)
    }
    /// The SpMM of the cached `A^T`; without it (there is no transposed SpMM) the atomic
    /// transposed SpMV column by column.
    fn apply_transposed_many(
        &self,
        alpha: f64,
        x: &DeviceBuffer<T>,
        k: usize,
        beta: f64,
        y: &mut DeviceBuffer<T>,
    ) -> tessera::Result<()> {
        let (m, n) = (self.a.rows(), self.a.cols());
        match &self.at {
            Some(at) => ops::csr_many(at, alpha, x, k, beta, y),
            None => columnwise(m, n, alpha, x, k, beta, y, |alpha, x, beta, y| {
                self.apply_transposed(alpha, x, beta, y)
            }),
        }
    }
}

/// SciPy's options from the Python arguments (`x0` as host f64 bytes).
fn lsmr_options(
    damp: f64,
    atol: f64,
    btol: f64,
    conlim: f64,
    maxiter: Option<usize>,
    x0: Option<&[u8]>,
    show: bool,
) -> PyResult<LsmrOptions> {
    Ok(LsmrOptions {
        damp,
        atol,
        btol,
        conlim,
        maxiter,
        x0: x0.map(|b| from_bytes::<f64>("x0", b)).transpose()?,
        show,
        ..Default::default()
    })
}

/// Which LSMR problem a native call solves.
enum Problem {
    /// One right-hand side `b` (`tessera::linalg::lsmr_with`).
    One,
    /// The `k >= 2` columns of `B` (`b` holds `m x k` column-major) with their `k` initial
    /// guesses (`n x k` column-major) if given (`lsmr_many_with`).
    Many { k: usize, x0: Option<Vec<f64>> },
    /// One `b` for each damp of the list (`lsmr_damps_with`).
    Damps(Vec<f64>),
}

impl Problem {
    /// The problem of `k` columns or a damp list (`k == 1` and no list: one `b`). Many
    /// right-hand sides take their initial guesses out of `opts.x0`.
    fn new(k: usize, damps: Option<Vec<f64>>, opts: &mut LsmrOptions) -> PyResult<Problem> {
        match (k, damps) {
            (1, None) => Ok(Problem::One),
            (1, Some(d)) => Ok(Problem::Damps(d)),
            (_, None) => Ok(Problem::Many { k, x0: opts.x0.take() }),
            (_, Some(_)) => Err(invalid(
                "damp",
                format!("a damp list takes one right-hand side; b has {k} columns (solve each damp separately)"),
            )),
        }
    }

    /// Validates the problem without a device (`b` host f64, column-major for many columns).
    fn validate(&self, m: usize, n: usize, b: &[f64], opts: &LsmrOptions) -> PyResult<()> {
        match self {
            Problem::One => tessera::linalg::lsmr::validate_problem(m, n, b.len(), opts).py_err(),
            Problem::Damps(d) => {
                tessera::linalg::lsmr::validate_problem(m, n, b.len(), opts).py_err()?;
                check_damp_list(d, opts.damp)
            }
            Problem::Many { k, x0 } => check_many(m, n, b, *k, x0.as_deref(), opts),
        }
    }
}

/// A damp list's rules (those of `lsmr_damps`, named as Python's `damp`): not empty, every
/// element finite and >= 0, and no scalar damp beside it.
fn check_damp_list(damps: &[f64], damp: f64) -> PyResult<()> {
    if damps.is_empty() {
        return Err(invalid(
            "damp",
            "is an empty list; give a number or at least one damp value",
        ));
    }
    if let Some(j) = damps.iter().position(|d| !(d.is_finite() && *d >= 0.0)) {
        return Err(invalid(
            "damp",
            format!("element {j} is {}; every damp must be finite and >= 0", damps[j]),
        ));
    }
    if damp != 0.0 {
        return Err(invalid(
            "damp",
            format!("is {damp} beside a damp list; give one or the other"),
        ));
    }
    Ok(())
}

/// The checks of `lsmr_many` for `k` columns of `b` (host f64, `m x k` column-major) and `x0`
/// (`n x k`): `k <= MAX_RHS`, the lengths, every element finite (the error names the column
/// and row), the options. Errors about `k` name `b`, whose columns they are.
fn check_many(m: usize, n: usize, b: &[f64], k: usize, x0: Option<&[f64]>, opts: &LsmrOptions) -> PyResult<()> {
    if k > MAX_RHS {
        return Err(invalid(
            "b",
            format!("has {k} columns; at most {MAX_RHS} right-hand sides per call (solve them in chunks)"),
        ));
    }
    validate_many::<f64>(m, n, &ManyRhs::Host(b), k, x0, opts, &LsmrRunOptions::default())
        .map_err(columns_of_b)
        .py_err()
}

/// An error of the many-right-hand-sides solver about `k` (too many columns for the free
/// device memory, an overflow) named after Python's argument: `b`, whose columns they are.
fn columns_of_b(e: tessera::Error) -> tessera::Error {
    match e {
        tessera::Error::InvalidArgument { arg: "k", rule } => tessera::Error::InvalidArgument { arg: "b", rule },
        e => e,
    }
}

/// What Python gets back: x of every result (f64 bytes, `n` per result, one after the other:
/// `n x k` column-major), then per result istop, itn, normr, normar, norma, conda, normx, and
/// the progress lines (when `show`).
pub type LsmrReturn = (
    Py<PyBytes>,
    Vec<u32>,
    Vec<usize>,
    Vec<f64>,
    Vec<f64>,
    Vec<f64>,
    Vec<f64>,
    Vec<f64>,
    Vec<String>,
);

fn lsmr_return(py: Python<'_>, rs: Vec<LsmrResult>, lines: Vec<String>) -> LsmrReturn {
    let bytes: Vec<u8> = rs.iter().flat_map(|r| &r.x).flat_map(|v| v.to_ne_bytes()).collect();
    let each = |f: fn(&LsmrResult) -> f64| rs.iter().map(f).collect::<Vec<f64>>();
    (
        PyBytes::new(py, &bytes).unbind(),
        rs.iter().map(|r| r.istop).collect(),
        rs.iter().map(|r| r.itn).collect(),
        each(|r| r.normr),
        each(|r| r.normar),
        each(|r| r.norma),
        each(|r| r.conda),
        each(|r| r.normx),
        lines,
    )
}

/// The run options: progress lines collected when `show`.
fn run_options<'a>(show: bool, lines: &'a Mutex<Vec<String>>) -> LsmrRunOptions<'a> {
    LsmrRunOptions {
        progress: show.then(|| -> tessera::linalg::lsmr_device::ProgressFn<'a> {
            Box::new(move |itn, normr, normar, secs| {
                lines
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(format!("{itn:6} {normr:12.5e} {normar:12.5e} {secs:9.3} s"))
            })
        }),
        ..Default::default()
    }
}

/// Solves `problem` over `op` on `ctx`'s stream: `b` host f64 (m, or m x k column-major).
fn solve<T: Element>(
    ctx: &Context,
    op: &dyn LinearOperator<T>,
    b: &[f64],
    problem: &Problem,
    opts: &LsmrOptions,
    run: &mut LsmrRunOptions<'_>,
) -> tessera::Result<Vec<LsmrResult>> {
    let upload_b = || {
        let bt: Vec<T> = b.iter().map(|&v| T::from_f64(v)).collect();
        upload_vec(ctx, &bt)
    };
    match problem {
        Problem::One => Ok(vec![lsmr_with(ctx, op, &upload_b()?, opts, run)?]),
        Problem::Damps(damps) => lsmr_damps_with(ctx, op, &upload_b()?, damps, opts, run),
        Problem::Many { k, x0 } => {
            lsmr_many_with(ctx, op, ManyRhs::Host(b), *k, x0.as_deref(), opts, run).map_err(columns_of_b)
        }
    }
}

/// Validates LSMR's arguments without a device (SciPy's rules: `b` of length m, `x0` (host f64
/// bytes) of n finite elements, `damp`, `atol`, `btol`, `conlim` finite and >= 0; a damp list
/// `damps` not empty, each finite and >= 0, with `damp` 0).
#[pyfunction]
#[pyo3(signature = (m, n, b_len, damp, atol, btol, conlim, x0 = None, damps = None))]
#[allow(clippy::too_many_arguments)]
pub fn check_lsmr(
    m: usize,
    n: usize,
    b_len: usize,
    damp: f64,
    atol: f64,
    btol: f64,
    conlim: f64,
    x0: Option<&[u8]>,
    damps: Option<Vec<f64>>,
) -> PyResult<()> {
    let opts = lsmr_options(damp, atol, btol, conlim, None, x0, false)?;
    tessera::linalg::lsmr::validate_problem(m, n, b_len, &opts).py_err()?;
    match damps {
        Some(d) => check_damp_list(&d, damp),
        None => Ok(()),
    }
}

/// Validates LSMR over the `k` columns of `b` (host f64 bytes, `m x k` column-major) without a
/// device: `1 <= k <= MAX_RHS`, every element of b finite (the error names column and row),
/// `x0` (if given) `n x k` finite, and the options as [`check_lsmr`].
#[pyfunction]
#[pyo3(signature = (m, n, k, b, damp, atol, btol, conlim, x0 = None))]
#[allow(clippy::too_many_arguments)]
pub fn check_lsmr_many(
    m: usize,
    n: usize,
    k: usize,
    b: &[u8],
    damp: f64,
    atol: f64,
    btol: f64,
    conlim: f64,
    x0: Option<&[u8]>,
) -> PyResult<()> {
    let b = from_bytes::<f64>("b", b)?;
    let mut opts = lsmr_options(damp, atol, btol, conlim, None, x0, false)?;
    let x0 = opts.x0.take();
    check_many(m, n, &b, k, x0.as_deref(), &opts)
}

#[pymethods]
impl SparseMatrix {
    /// Uploads host CSR arrays (`indptr`, `indices` int64 bytes, `data` bytes of `dtype`) of a
    /// `rows x cols` matrix to `device`, ordered on `stream`: validated, columns sorted,
    /// duplicates summed; i32 indices when everything fits, else i64.
    #[staticmethod]
    #[allow(clippy::too_many_arguments)]
    fn from_csr(
        py: Python<'_>,
        device: usize,
        stream: StreamId,
        rows: usize,
        cols: usize,
        dtype: &str,
        indptr: &[u8],
        indices: &[u8],
        data: &[u8],
    ) -> PyResult<SparseMatrix> {
        let v = value_dtype("data", dtype)?;
        macro_rules! make {
            ($t:ty) => {{
                let host = host_csr::<$t>(rows, cols, indptr, indices, data)?;
                py.detach(|| cache::with_device(device, |_| upload(&on(device, stream)?, &host)))
                    .py_err()?
            }};
        }
        let csr = match v {
            DType::F32 => make!(f32),
            DType::F64 => make!(f64),
            DType::F16 => make!(F16),
            _ => make!(BF16),
        };
        Ok(SparseMatrix {
            device,
            home: stream,
            csr,
            lock: Mutex::new(()),
        })
    }

    /// A `rows x cols` matrix from COO triplets on `device` (1-D contiguous `row`, `col` of
    /// one index dtype, int32 or int64, and `values`), copied and converted on the device
    /// (duplicates summed), ordered on `stream`.
    #[staticmethod]
    #[allow(clippy::too_many_arguments)]
    fn from_coo_device(
        py: Python<'_>,
        device: usize,
        stream: StreamId,
        rows: usize,
        cols: usize,
        row: RawDesc,
        col: RawDesc,
        values: RawDesc,
    ) -> PyResult<SparseMatrix> {
        let (r, ri, rn) = vector("row", row)?;
        let (c, ci, cn) = vector("col", col)?;
        let (v, vd, vn) = vector("values", values)?;
        let vd = value_dtype("values", torch_name(vd))?;
        if ri != ci || !matches!(ri, DType::I32 | DType::I64) {
            return Err(invalid(
                "col",
                format!(
                    "row and col indices must share one dtype, int32 or int64; got {} and {}",
                    torch_name(ri),
                    torch_name(ci)
                ),
            ));
        }
        if cn != rn || vn != rn {
            return Err(invalid(
                "values",
                format!("row, col and values must have one length; got {rn}, {cn} and {vn}"),
            ));
        }
        let ptrs = (r, c, v);
        macro_rules! make {
            ($t:ty, $i:ty) => {
                py.detach(|| {
                    cache::with_device(device, |_| {
                        let ctx = on(device, stream)?;
                        // SAFETY: the Python layer passes the caller's live device arrays on
                        // this device, of rn elements (checked above), queued on `stream`.
                        unsafe { from_coo::<$t, $i>(&ctx, rows, cols, ptrs, rn) }
                    })
                })
                .py_err()?
            };
        }
        let csr = match (vd, ri) {
            (DType::F32, DType::I32) => make!(f32, i32),
            (DType::F32, _) => make!(f32, i64),
            (DType::F64, DType::I32) => make!(f64, i32),
            (DType::F64, _) => make!(f64, i64),
            (DType::F16, DType::I32) => make!(F16, i32),
            (DType::F16, _) => make!(F16, i64),
            (_, DType::I32) => make!(BF16, i32),
            _ => make!(BF16, i64),
        };
        Ok(SparseMatrix {
            device,
            home: stream,
            csr,
            lock: Mutex::new(()),
        })
    }

    /// The CUDA device ordinal.
    #[getter]
    fn device(&self) -> usize {
        self.device
    }

    /// `(rows, cols)`.
    #[getter]
    fn shape(&self) -> (usize, usize) {
        let (r, c, _) = self.dims();
        (r, c)
    }

    /// Stored nonzeros (after duplicates were summed; explicit zeros count).
    #[getter]
    fn nnz(&self) -> usize {
        self.dims().2
    }

    /// The value dtype (torch name).
    #[getter]
    fn dtype(&self) -> &'static str {
        torch_name(self.value())
    }

    /// The index dtype on the device (`"int32"` or `"int64"`).
    #[getter]
    fn index_dtype(&self) -> &'static str {
        torch_name(self.index())
    }

    /// Queues `out = A @ x` (`transpose`: `A^T @ x`, through the CSR of `A^T`, made on first use
    /// and kept) for caller's `stream`: `x` `[cols]` or `[cols, k]` packed row- or column-major,
    /// `out` the result in x's layout.
    fn matmul(&self, py: Python<'_>, stream: StreamId, x: RawDesc, out: RawDesc, transpose: bool) -> PyResult<()> {
        let (x, y) = (Desc::new("x", x)?, Desc::new("out", out)?);
        let (rows, cols, _) = self.dims();
        let shape = product_operands(rows, cols, self.value(), &x, &y, transpose)?;
        let (device, home) = (self.device, self.home);
        py.detach(|| {
            cache::with_device(device, |_| {
                let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
                let (ctx, caller) = (on(device, home)?, on(device, stream)?);
                ctx.wait_for(&caller)?;
                // SAFETY: x and out are the caller's live tensors on this device (the Python
                // layer checked the device), validated by product_operands, ordered before the
                // home stream by the wait above.
                with_csr!(&self.csr, |a, _T| unsafe { product(&ctx, a, transpose, &x, &y, shape) })?;
                caller.wait_for(&ctx)
            })
        })
        .py_err()
    }

    /// LSMR for `min ||[b; 0] - [A; damp I] x||` (SciPy's `lsmr`) on the matrix's device, in its
    /// value dtype (float32 or float64). `b` and `x0` are host f64 bytes; `k >= 2`: b holds the
    /// `k` columns of B (`m x k` column-major) and x0 as many initial guesses (`n x k`), solved
    /// in one run; `damps`: one solve of b per damp, in one run (`damp` 0). Returns the results
    /// ([`LsmrReturn`]: one per column or damp) and the progress lines of `show`.
    #[pyo3(signature = (b, damp, atol, btol, conlim, maxiter, x0, show, k = 1, damps = None))]
    #[allow(clippy::too_many_arguments)]
    fn lsmr(
        &self,
        py: Python<'_>,
        b: &[u8],
        damp: f64,
        atol: f64,
        btol: f64,
        conlim: f64,
        maxiter: Option<usize>,
        x0: Option<&[u8]>,
        show: bool,
        k: usize,
        damps: Option<Vec<f64>>,
    ) -> PyResult<LsmrReturn> {
        let b = from_bytes::<f64>("b", b)?;
        let mut opts = lsmr_options(damp, atol, btol, conlim, maxiter, x0, show)?;
        let problem = Problem::new(k, damps, &mut opts)?;
        let (rows, cols, _) = self.dims();
        problem.validate(rows, cols, &b, &opts)?;
        let (device, home) = (self.device, self.home);
        let lines = Mutex::new(Vec::new());
        let r = py
            .detach(|| {
                cache::with_device(device, |_| {
                    let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
                    let ctx = on(device, home)?;
                    let mut run = run_options(show, &lines);
                    match &self.csr {
                        AnyCsr::F32I32(a) => solve_csr(&ctx, a, &b, &problem, &opts, &mut run),
                        AnyCsr::F32I64(a) => solve_csr(&ctx, a, &b, &problem, &opts, &mut run),
                        AnyCsr::F64I32(a) => solve_csr(&ctx, a, &b, &problem, &opts, &mut run),
                        AnyCsr::F64I64(a) => solve_csr(&ctx, a, &b, &problem, &opts, &mut run),
                        _ => Err(tessera::Error::Unsupported(format!(
                            "LSMR on a {} matrix; supported: float32, float64 (convert the matrix)",
                            torch_name(self.value())
                        ))),
                    }
                })
            })
            .py_err()?;
        Ok(lsmr_return(
            py,
            r,
            lines.into_inner().unwrap_or_else(|e| e.into_inner()),
        ))
    }
}

/// Bytes of the device CSR of `A^T` (values, indices, `cols + 1` offsets).
fn transpose_bytes<T: Element, I: SparseIndex>(a: &CsrMatrix<T, I>) -> usize {
    let (v, i) = (std::mem::size_of::<T>(), std::mem::size_of::<I>());
    a.nnz()
        .saturating_mul(v + i)
        .saturating_add((a.cols() + 1).saturating_mul(i))
}

/// LSMR over `a` on `ctx`'s stream (the matrix's home stream).
fn solve_csr<T: Element, I: SparseIndex>(
    ctx: &Context,
    a: &CsrMatrix<T, I>,
    b: &[f64],
    problem: &Problem,
    opts: &LsmrOptions,
    run: &mut LsmrRunOptions<'_>,
) -> tessera::Result<Vec<LsmrResult>> {
    // dual storage (deterministic A^T x) when the transposed copy fits, as sparse_operator's Auto
    let at = if choose_dual(Storage::Auto, transpose_bytes(a), free_device_bytes(ctx)?) {
        Some(a.transposed()?)
    } else {
        None
    };
    solve(ctx, &CsrOperator { a, at }, b, problem, opts, run)
}

/// `data` on the device (one element allocated for an empty vector).
fn upload_vec<T: Element>(ctx: &Context, data: &[T]) -> tessera::Result<DeviceBuffer<T>> {
    if data.is_empty() {
        let mut b = ctx.alloc::<T>(1)?;
        b.fill_bytes(0)?;
        // a zero-length b: LSMR reads m = 0 elements of it
        Ok(b)
    } else {
        ctx.upload(data)
    }
}

/// LSMR over a Python operator on `stream` of `device`: `apply(transpose, alpha, x_address, k,
/// beta, y_address)` must queue `Y = alpha * op(A) X + beta * Y` (`Y` not read when beta is 0)
/// on that stream for `k >= 1` packed column-major columns of `dtype` (`float32` /
/// `float64`): `X` n x k and `Y` m x k (m x k and n x k for the transpose). Arguments and
/// returns as [`SparseMatrix::lsmr`].
#[pyfunction]
#[pyo3(signature = (device, stream, m, n, dtype, apply, b, damp, atol, btol, conlim, maxiter, x0, show, k = 1, damps = None))]
#[allow(clippy::too_many_arguments)]
pub fn lsmr_callback(
    py: Python<'_>,
    device: usize,
    stream: StreamId,
    m: usize,
    n: usize,
    dtype: &str,
    apply: Py<PyAny>,
    b: &[u8],
    damp: f64,
    atol: f64,
    btol: f64,
    conlim: f64,
    maxiter: Option<usize>,
    x0: Option<&[u8]>,
    show: bool,
    k: usize,
    damps: Option<Vec<f64>>,
) -> PyResult<LsmrReturn> {
    let b = from_bytes::<f64>("b", b)?;
    let mut opts = lsmr_options(damp, atol, btol, conlim, maxiter, x0, show)?;
    let problem = Problem::new(k, damps, &mut opts)?;
    problem.validate(m, n, &b, &opts)?;
    let value = match dtype {
        "float32" => DType::F32,
        "float64" => DType::F64,
        d => {
            return Err(to_py(tessera::Error::Unsupported(format!(
                "LSMR on {d}; supported: float32, float64"
            ))))
        }
    };
    // the first exception a callback raised (the solve then stops with a placeholder error)
    let raised: Mutex<Option<PyErr>> = Mutex::new(None);
    let lines = Mutex::new(Vec::new());
    let r = py.detach(|| {
        cache::with_device(device, |_| {
            let ctx = on(device, stream)?;
            let mut run = run_options(show, &lines);
            if value == DType::F32 {
                let op = PyOperator::<f32>::new(m, n, &apply, &raised);
                solve(&ctx, &op, &b, &problem, &opts, &mut run)
            } else {
                let op = PyOperator::<f64>::new(m, n, &apply, &raised);
                solve(&ctx, &op, &b, &problem, &opts, &mut run)
            }
        })
    });
    if let Some(e) = raised.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    let r = r.py_err()?;
    Ok(lsmr_return(
        py,
        r,
        lines.into_inner().unwrap_or_else(|e| e.into_inner()),
    ))
}

/// A Python callback as LSMR's operator (see [`lsmr_callback`]): every product, single or
/// batched, is one call of `apply`.
struct PyOperator<'a, T: Element> {
    m: usize,
    n: usize,
    apply: &'a Py<PyAny>,
    /// Where the first exception a callback raised is kept (the solve then stops with a
    /// placeholder error and the caller re-raises it).
    raised: &'a Mutex<Option<PyErr>>,
    _t: PhantomData<T>,
}

impl<'a, T: Element> PyOperator<'a, T> {
    fn new(m: usize, n: usize, apply: &'a Py<PyAny>, raised: &'a Mutex<Option<PyErr>>) -> Self {
        PyOperator {
            m,
            n,
            apply,
            raised,
            _t: PhantomData,
        }
    }

    /// `Y = alpha * op(A) X + beta * Y` over `k` columns by the callback.
    fn call(
        &self,
        transpose: bool,
        alpha: f64,
        x: &DeviceBuffer<T>,
        k: usize,
        beta: f64,
        y: &mut DeviceBuffer<T>,
    ) -> tessera::Result<()> {
        let (x_rows, y_rows) = if transpose { (self.m, self.n) } else { (self.n, self.m) };
        ops::check_many(x_rows, y_rows, x, k, y)?;
        let failed = Python::attach(|py| {
            self.apply
                .call1(py, (transpose, alpha, x.device_ptr(), k, beta, y.device_ptr()))
                .err()
        });
        match failed {
            None => Ok(()),
            Some(e) => {
                let mut slot = self.raised.lock().unwrap_or_else(|p| p.into_inner());
                let what = e.to_string();
                slot.get_or_insert(e);
                Err(tessera::Error::invalid(
                    "A",
                    format!(
                        "the operator's {} raised: {what}",
                        if transpose { "rmatvec" } else { "matvec" }
                    ),
                ))
            }
        }
    }
}

impl<T: Element> LinearOperator<T> for PyOperator<'_, T> {
    fn shape(&self) -> (usize, usize) {
        (self.m, self.n)
    }
    fn apply(&self, alpha: f64, x: &DeviceBuffer<T>, beta: f64, y: &mut DeviceBuffer<T>) -> tessera::Result<()> {
        self.call(false, alpha, x, 1, beta, y)
    }
    fn apply_transposed(
        &self,
        alpha: f64,
        x: &DeviceBuffer<T>,
        beta: f64,
        y: &mut DeviceBuffer<T>,
    ) -> tessera::Result<()> {
        self.call(true, alpha, x, 1, beta, y)
    }
    fn storage(&self) -> &'static str {
        "python"
    }
    fn apply_many(
        &self,
        alpha: f64,
        x: &DeviceBuffer<T>,
        k: usize,
        beta: f64,
        y: &mut DeviceBuffer<T>,
    ) -> tessera::Result<()> {
        self.call(false, alpha, x, k, beta, y)
    }
    fn apply_transposed_many(
        &self,
        alpha: f64,
        x: &DeviceBuffer<T>,
        k: usize,
        beta: f64,
        y: &mut DeviceBuffer<T>,
    ) -> tessera::Result<()> {
        self.call(true, alpha, x, k, beta, y)
    }
}
