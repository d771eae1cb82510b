//! Typed device memory ([`DeviceBuffer`]) and strided views of it ([`TensorView`],
//! [`TensorViewMut`]) that every operator takes.

use std::marker::PhantomData;

use cudarc::driver::sys;

use super::context::{check, Context};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};

/// `len` elements of `T` in device memory, allocated from the context's stream-ordered pool
/// and freed in stream order on drop.
pub struct DeviceBuffer<T: Element> {
    ptr: sys::CUdeviceptr,
    len: usize,
    ctx: Context,
    _t: PhantomData<T>,
}

impl<T: Element> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer<{}>[{}] at {:#x}", T::DTYPE, self.len, self.ptr)
    }
}

impl<T: Element> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if self.ptr != 0 && self.ctx.bind().is_ok() {
            // SAFETY: allocated from this context's pool on its stream; freed once.
            unsafe {
                sys::cuMemFreeAsync(self.ptr, self.ctx.cu_stream());
            }
        }
    }
}

impl Context {
    /// Allocates `len` elements. The contents are unspecified (poison them before use in tests).
    pub fn alloc<T: Element>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        self.bind()?;
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| Error::invalid("len", format!("{len} elements of {} overflow usize", T::DTYPE)))?;
        let mut ptr = 0;
        if bytes > 0 {
            // SAFETY: out-parameter; pool and stream belong to this context.
            check("cuMemAllocFromPoolAsync", unsafe {
                sys::cuMemAllocFromPoolAsync(&mut ptr, bytes, self.pool(), self.cu_stream())
            })
            .map_err(|e| match e {
                Error::Cuda { call, message } => Error::Cuda {
                    call,
                    message: format!("{message} (allocating {bytes} bytes)"),
                },
                e => e,
            })?;
        }
        Ok(DeviceBuffer {
            ptr,
            len,
            ctx: self.clone(),
            _t: PhantomData,
        })
    }

    /// Allocates and copies `data` to the device.
    pub fn upload<T: Element>(&self, data: &[T]) -> Result<DeviceBuffer<T>> {
        let mut b = self.alloc::<T>(data.len())?;
        b.copy_from_host(data)?;
        Ok(b)
    }
}

impl<T: Element> DeviceBuffer<T> {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }
    /// The raw device address.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Copies `data` (same length) into the buffer, ordered on the stream.
    pub fn copy_from_host(&mut self, data: &[T]) -> Result<()> {
        if data.len() != self.len {
            return Err(Error::invalid(
                "data",
                format!("has {} elements, buffer has {}", data.len(), self.len),
            ));
        }
        if self.len == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: both regions hold `bytes()` bytes; from pageable memory the call returns
        // only once the source has been staged, so `data` may be dropped afterwards.
        check("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(self.ptr, data.as_ptr() as *const _, self.bytes(), self.ctx.cu_stream())
        })?;
        self.ctx.synchronize()
    }

    /// Copies `data` into elements `offset .. offset + data.len()` (a buffer used below its
    /// capacity, such as block tables), ordered on the stream; returns once `data` may be reused.
    pub fn copy_from_host_at(&mut self, offset: usize, data: &[T]) -> Result<()> {
        offset
            .checked_add(data.len())
            .filter(|&e| e <= self.len)
            .ok_or_else(|| {
                Error::invalid(
                    "data",
                    format!(
                        "{} elements at offset {offset} overrun a {}-element buffer",
                        data.len(),
                        self.len
                    ),
                )
            })?;
        if data.is_empty() {
            return Ok(());
        }
        self.ctx.bind()?;
        let dst = self.ptr + (offset * std::mem::size_of::<T>()) as u64;
        // SAFETY: the destination range lies inside the allocation (checked above) and the
        // source holds data.len() elements; a pageable source is staged before the call returns.
        check("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                dst,
                data.as_ptr() as *const _,
                std::mem::size_of_val(data),
                self.ctx.cu_stream(),
            )
        })
    }

    /// Copies the buffer to the host, waiting for all queued work first.
    pub fn to_host(&self) -> Result<Vec<T>> {
        let mut out = vec![T::default(); self.len];
        if self.len == 0 {
            return Ok(out);
        }
        self.ctx.bind()?;
        // SAFETY: `out` holds `bytes()` bytes; `Element` guarantees any bit pattern is valid.
        check("cuMemcpyDtoHAsync", unsafe {
            sys::cuMemcpyDtoHAsync_v2(out.as_mut_ptr() as *mut _, self.ptr, self.bytes(), self.ctx.cu_stream())
        })?;
        self.ctx.synchronize()?;
        Ok(out)
    }

    /// Fills every byte with `byte` (0xff gives NaN in f32/f16/bf16: the poison for outputs).
    pub fn fill_bytes(&mut self, byte: u8) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: writes exactly the buffer's bytes.
        check("cuMemsetD8Async", unsafe {
            sys::cuMemsetD8Async(self.ptr, byte, self.bytes(), self.ctx.cu_stream())
        })
    }

    /// Device-to-device copy of `other` (same length) into `self`, ordered on the stream.
    pub fn copy_from(&mut self, other: &DeviceBuffer<T>) -> Result<()> {
        if other.len != self.len {
            return Err(Error::invalid(
                "other",
                format!("has {} elements, buffer has {}", other.len, self.len),
            ));
        }
        self.ctx.bind()?;
        // SAFETY: both allocations hold `bytes()` bytes.
        check("cuMemcpyDtoDAsync", unsafe {
            sys::cuMemcpyDtoDAsync_v2(self.ptr, other.ptr, self.bytes(), self.ctx.cu_stream())
        })
    }

    /// A 2-D row-major view `rows x cols` with row stride `row_stride` elements.
    pub fn matrix(&self, rows: usize, cols: usize, row_stride: usize) -> Result<TensorView<'_>> {
        TensorView::new(self.ptr, T::DTYPE, self.len, &[rows, cols], &[row_stride, 1])
    }

    /// A mutable 2-D row-major view.
    pub fn matrix_mut(&mut self, rows: usize, cols: usize, row_stride: usize) -> Result<TensorViewMut<'_>> {
        let v = TensorView::new(self.ptr, T::DTYPE, self.len, &[rows, cols], &[row_stride, 1])?;
        Ok(TensorViewMut { view: v })
    }

    /// An N-D view with explicit strides (elements).
    pub fn view(&self, shape: &[usize], strides: &[usize]) -> Result<TensorView<'_>> {
        TensorView::new(self.ptr, T::DTYPE, self.len, shape, strides)
    }

    /// A mutable N-D view with explicit strides (elements).
    pub fn view_mut(&mut self, shape: &[usize], strides: &[usize]) -> Result<TensorViewMut<'_>> {
        Ok(TensorViewMut {
            view: TensorView::new(self.ptr, T::DTYPE, self.len, shape, strides)?,
        })
    }

    /// An N-D view whose element 0 is element `offset` of the buffer (a slice of a larger
    /// buffer, such as one of many inputs packed in a pool); bounds checked like [`view`](Self::view).
    pub fn view_at(&self, offset: usize, shape: &[usize], strides: &[usize]) -> Result<TensorView<'_>> {
        let (ptr, len) = self.offset_ptr(offset)?;
        TensorView::new(ptr, T::DTYPE, len, shape, strides)
    }

    /// A mutable [`view_at`](Self::view_at).
    pub fn view_mut_at(&mut self, offset: usize, shape: &[usize], strides: &[usize]) -> Result<TensorViewMut<'_>> {
        let (ptr, len) = self.offset_ptr(offset)?;
        Ok(TensorViewMut {
            view: TensorView::new(ptr, T::DTYPE, len, shape, strides)?,
        })
    }

    /// The address of element `offset` and the elements from there to the end.
    fn offset_ptr(&self, offset: usize) -> Result<(u64, usize)> {
        if offset > self.len {
            return Err(Error::invalid(
                "offset",
                format!("{offset} is past the end of a {}-element buffer", self.len),
            ));
        }
        Ok((self.ptr + (offset * std::mem::size_of::<T>()) as u64, self.len - offset))
    }
}

impl DeviceBuffer<u8> {
    /// A view of these bytes as elements of `dtype` (fp8 and int8 tensors, which have no host
    /// element type, live in byte buffers); bounds checked like [`view`](Self::view).
    pub fn view_as(&self, dtype: DType, shape: &[usize], strides: &[usize]) -> Result<TensorView<'_>> {
        TensorView::new(self.ptr, dtype, self.len / dtype.size(), shape, strides)
    }

    /// A mutable [`view_as`](Self::view_as).
    pub fn view_mut_as(&mut self, dtype: DType, shape: &[usize], strides: &[usize]) -> Result<TensorViewMut<'_>> {
        Ok(TensorViewMut {
            view: TensorView::new(self.ptr, dtype, self.len / dtype.size(), shape, strides)?,
        })
    }
}

/// Maximum rank of a view.
pub const MAX_RANK: usize = 6;

/// A read-only strided view of device memory: shape, strides (in elements) and dtype. The
/// constructor checks that every addressed element lies inside the allocation.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    ptr: u64,
    dtype: DType,
    rank: usize,
    shape: [usize; MAX_RANK],
    strides: [usize; MAX_RANK],
    _borrow: PhantomData<&'a ()>,
}

/// A writable strided view. Holding one borrows its buffer mutably.
#[derive(Debug)]
pub struct TensorViewMut<'a> {
    view: TensorView<'a>,
}

impl<'a> TensorView<'a> {
    fn new(ptr: u64, dtype: DType, len: usize, shape: &[usize], strides: &[usize]) -> Result<Self> {
        if shape.len() != strides.len() || shape.is_empty() || shape.len() > MAX_RANK {
            return Err(Error::invalid(
                "shape",
                format!(
                    "rank {} with {} strides; ranks 1..={MAX_RANK} with one stride per dim",
                    shape.len(),
                    strides.len()
                ),
            ));
        }
        let mut last = 0usize; // largest element offset addressed
        let mut empty = false;
        for (&n, &s) in shape.iter().zip(strides) {
            if n == 0 {
                empty = true;
            } else {
                last = (n - 1)
                    .checked_mul(s)
                    .and_then(|x| x.checked_add(last))
                    .ok_or_else(|| Error::invalid("strides", "the view's extent overflows usize"))?;
            }
        }
        if !empty && last >= len {
            return Err(Error::invalid(
                "shape",
                format!("view {shape:?} with strides {strides:?} reaches element {last} of a {len}-element buffer"),
            ));
        }
        let mut v = TensorView {
            ptr,
            dtype,
            rank: shape.len(),
            shape: [0; MAX_RANK],
            strides: [0; MAX_RANK],
            _borrow: PhantomData,
        };
        v.shape[..shape.len()].copy_from_slice(shape);
        v.strides[..shape.len()].copy_from_slice(strides);
        Ok(v)
    }

    /// A view of memory tessera did not allocate (another library's tensor).
    ///
    /// # Safety
    /// `ptr` must be a device address in the current context's device, valid for `len`
    /// elements of `dtype` for the lifetime `'a`, and not written by anyone else meanwhile.
    pub unsafe fn from_raw(ptr: u64, dtype: DType, len: usize, shape: &[usize], strides: &[usize]) -> Result<Self> {
        Self::new(ptr, dtype, len, shape, strides)
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn shape(&self) -> &[usize] {
        &self.shape[..self.rank]
    }
    pub fn strides(&self) -> &[usize] {
        &self.strides[..self.rank]
    }
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// The device address of element 0.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }
    /// Number of elements addressed.
    pub fn numel(&self) -> usize {
        self.shape().iter().product()
    }
}

impl<'a> TensorViewMut<'a> {
    /// A writable view of memory tessera did not allocate.
    ///
    /// # Safety
    /// As [`TensorView::from_raw`], and nothing else may read or write the memory meanwhile.
    pub unsafe fn from_raw(ptr: u64, dtype: DType, len: usize, shape: &[usize], strides: &[usize]) -> Result<Self> {
        Ok(TensorViewMut {
            view: TensorView::new(ptr, dtype, len, shape, strides)?,
        })
    }
    /// A read-only copy of this view (for in-place operators that read what they write).
    pub fn as_view(&self) -> TensorView<'_> {
        self.view
    }
    pub fn dtype(&self) -> DType {
        self.view.dtype
    }
    pub fn shape(&self) -> &[usize] {
        self.view.shape()
    }
    pub fn strides(&self) -> &[usize] {
        self.view.strides()
    }
    pub fn device_ptr(&self) -> u64 {
        self.view.ptr
    }
}
