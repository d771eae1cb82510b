//! Tensor arguments as the Python layer hands them over: `(data_ptr, dtype, shape, strides)`,
//! strides in elements. The Python layer reads them from torch tensors,
//! `__cuda_array_interface__` or DLPack and has already checked the device.

use tessera::runtime::{TensorView, TensorViewMut};
use tessera::DType;

use crate::errors::{invalid, to_py, IntoPy};
use pyo3::PyResult;

/// What Python passes for one tensor.
pub type RawDesc = (u64, String, Vec<i64>, Vec<i64>);

/// The [`DType`] of a torch dtype name (`"float16"`, `"float8_e4m3fn"`, `"int8"`, ...) or of one
/// of tessera's own names ([`DType::parse`]). torch's fp8 names map onto tessera's fp8 storage
/// types: `float8_e4m3fn` (finite-only e4m3, NaN = 0x7f/0xff, the OCP/NVIDIA format) is
/// [`DType::F8E4M3`], `float8_e5m2` is [`DType::F8E5M2`]. The AMD `*fnuz` formats encode
/// differently and are not accepted.
pub fn parse_dtype(name: &str) -> Option<DType> {
    match name {
        "float8_e4m3fn" => Some(DType::F8E4M3),
        "float8_e5m2" => Some(DType::F8E5M2),
        n if n.ends_with("fnuz") => None,
        n => DType::parse(n),
    }
}

/// A validated tensor argument (no device memory is touched here).
#[derive(Clone, Debug)]
pub struct Desc {
    pub ptr: u64,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
}

impl Desc {
    /// Parses `raw` for argument `arg`: a dtype tessera knows, one non-negative stride per
    /// dimension, non-negative sizes.
    pub fn new(arg: &'static str, raw: RawDesc) -> PyResult<Desc> {
        let (ptr, dtype, shape, strides) = raw;
        let dtype = parse_dtype(&dtype).ok_or_else(|| {
            to_py(tessera::Error::Unsupported(format!(
                "{arg} has dtype {dtype}; tessera takes float32, float16 and bfloat16 tensors (int32 for cu_seqlens; \
                 float64 for the GEMM and sparse; float8_e4m3fn, float8_e5m2 and int8 for scaled_mm / int_mm)"
            )))
        })?;
        if shape.len() != strides.len() {
            return Err(invalid(
                arg,
                format!("{arg} has {} dims but {} strides", shape.len(), strides.len()),
            ));
        }
        if shape.iter().any(|&n| n < 0) {
            return Err(invalid(arg, format!("{arg} has a negative size in {shape:?}")));
        }
        if strides.iter().any(|&s| s < 0) {
            return Err(invalid(
                arg,
                format!("{arg} has a negative stride in {strides:?}; tessera reads forward-strided tensors only"),
            ));
        }
        Ok(Desc {
            ptr,
            dtype,
            shape: shape.iter().map(|&n| n as usize).collect(),
            strides: strides.iter().map(|&s| s as usize).collect(),
        })
    }

    /// Elements from element 0 to one past the last addressed element (0 when empty).
    fn extent(&self) -> usize {
        if self.shape.contains(&0) {
            return 0;
        }
        self.shape
            .iter()
            .zip(&self.strides)
            .fold(1usize, |acc, (&n, &s)| acc.saturating_add((n - 1).saturating_mul(s)))
    }

    /// A read-only view (checked for rank and stride overflow by tessera).
    pub fn view(&self) -> PyResult<TensorView<'static>> {
        // SAFETY: the view only carries the address; it is dereferenced by a launch, whose
        // caller (the op functions) passes addresses of live tensors of the caller's device.
        // The extent is the tensor's own, so the bounds check cannot fail on a real tensor.
        unsafe { TensorView::from_raw(self.ptr, self.dtype, self.extent(), &self.shape, &self.strides) }.py_err()
    }

    /// A writable view (as [`Desc::view`]).
    pub fn view_mut(&self) -> PyResult<TensorViewMut<'static>> {
        // SAFETY: as in `view`; the Python layer allocated or was handed this output.
        unsafe { TensorViewMut::from_raw(self.ptr, self.dtype, self.extent(), &self.shape, &self.strides) }.py_err()
    }
}
