//! [`Communicator`]: one rank of an NCCL communicator on one [`Context`], through cudarc's
//! `nccl` bindings (loaded at run time: nothing links against NCCL at build time).
//!
//! Every rank (one thread or process per GPU) builds its communicator from the same
//! [`UniqueId`], made once by [`unique_id`] on one rank and handed to the others (a thread
//! shares it; a process sends its 128 bytes, [`UniqueId::as_bytes`] / [`UniqueId::from_bytes`]).
//! [`Communicator::new`] blocks until all `size` ranks have joined, so the ranks must call it
//! concurrently. Collectives are queued on the context's stream, in stream order with the
//! context's kernels and copies.
//!
//! Without NCCL, or without a GPU, every constructor returns an [`Error`] that says what is
//! missing (`runtime::probe::nccl`); nothing panics.

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::runtime::probe;
use crate::runtime::{Context, DeviceBuffer};
use cudarc::nccl::{result as nccl, sys};

use super::collective::Collective;

/// The identity of a communicator being built: NCCL's `ncclUniqueId` (128 opaque bytes). Made
/// by [`unique_id`] on one rank; every rank passes the same one to [`Communicator::new`].
#[derive(Clone, Copy)]
pub struct UniqueId(sys::ncclUniqueId);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UniqueId(..)")
    }
}

impl UniqueId {
    /// The 128 bytes, to send to the other ranks' processes.
    pub fn as_bytes(&self) -> [u8; 128] {
        self.0.internal.map(|c| c as u8)
    }

    /// The id from the bytes that [`as_bytes`](Self::as_bytes) gave on the rank that made it.
    pub fn from_bytes(bytes: [u8; 128]) -> UniqueId {
        UniqueId(sys::ncclUniqueId {
            internal: bytes.map(|b| b as ::core::ffi::c_char),
        })
    }
}

/// A new [`UniqueId`] (`ncclGetUniqueId`; on the rank that creates the communicator, once per
/// communicator). Errors: NCCL not found ([`probe::nccl`] says where it looked), or NCCL failed.
pub fn unique_id() -> Result<UniqueId> {
    probe::nccl()?;
    nccl::get_uniqueid()
        .map(UniqueId)
        .map_err(|e| nccl_error("ncclGetUniqueId", e))
}

/// The storage types NCCL sums: f32 and f64.
fn nccl_type(dtype: DType) -> Result<sys::ncclDataType_t> {
    match dtype {
        DType::F32 => Ok(sys::ncclDataType_t::ncclFloat32),
        DType::F64 => Ok(sys::ncclDataType_t::ncclFloat64),
        other => Err(Error::Unsupported(format!(
            "all_reduce_sum of {other} buffers; supported: fp32, fp64"
        ))),
    }
}

fn nccl_error(call: &'static str, e: nccl::NcclError) -> Error {
    // SAFETY: ncclGetErrorString returns a static NUL-terminated string for every code, and
    // NCCL is loaded (an NcclError comes only from a call that ran).
    let text = unsafe {
        let p = sys::ncclGetErrorString(e.0);
        if p.is_null() {
            String::new()
        } else {
            std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    Error::cuda(call, format!("{:?}: {text}", e.0))
}

/// One rank of an NCCL communicator, bound to a [`Context`] (its device and stream).
///
/// End it with [`finish`](Communicator::finish) on every rank after the last collective
/// (`ncclCommFinalize`, which completes every rank's outstanding communication, then
/// `ncclCommDestroy`). Dropping it without `finish` aborts it (`ncclCommAbort`: local, it does
/// not wait for the other ranks, so a rank that failed does not hang in its destructor; a peer
/// still reading this rank's buffers may then fail).
pub struct Communicator {
    comm: sys::ncclComm_t,
    ctx: Context,
    rank: usize,
    size: usize,
}

// SAFETY: an ncclComm_t may be used from any thread as long as calls on it are not concurrent;
// every use here takes &self on one thread at a time (the type is not Sync), and the context is
// bound to the calling thread before each NCCL call.
unsafe impl Send for Communicator {}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("device", &self.ctx.info().ordinal)
            .finish()
    }
}

impl Communicator {
    /// Rank `rank` of a communicator of `size` ranks identified by `id`, on `ctx`'s device
    /// (`ncclCommInitRank`; blocks until every rank has joined). Each rank uses its own device.
    ///
    /// Errors (before any NCCL call): `size == 0`, `rank >= size`, a size beyond NCCL's
    /// `int`; NCCL not found; then NCCL's own failures.
    pub fn new(ctx: &Context, rank: usize, size: usize, id: &UniqueId) -> Result<Communicator> {
        check_rank(rank, size)?;
        probe::nccl()?;
        ctx.bind()?;
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: comm is an out-parameter; rank < size <= i32::MAX (checked); the id is a
        // value; the context is bound, so NCCL picks up this thread's device.
        unsafe { nccl::comm_init_rank(&mut comm, size as i32, id.0, rank as i32) }
            .map_err(|e| nccl_error("ncclCommInitRank", e))?;
        if comm.is_null() {
            return Err(Error::cuda("ncclCommInitRank", "returned a null communicator"));
        }
        Ok(Communicator {
            comm,
            ctx: ctx.clone(),
            rank,
            size,
        })
    }

    /// A communicator of one rank on `ctx` (a fresh [`unique_id`], rank 0 of 1): the
    /// distributed code path on one GPU, NCCL included.
    pub fn single(ctx: &Context) -> Result<Communicator> {
        Communicator::new(ctx, 0, 1, &unique_id()?)
    }

    /// This rank, `0..size()`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The context the collectives are queued on.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// In place on the device: the first `len` elements of `buf` become their element-wise sum
    /// over the ranks (`ncclAllReduce`, `ncclSum`), queued on the context's stream; no host
    /// synchronisation. Every rank must make the same call with the same `len` (NCCL's rule;
    /// a mismatch is not detectable here). NCCL's ring, tree and NVLS algorithms give every
    /// rank the same bits.
    ///
    /// Errors: `len > buf.len()`; `buf` of another device than the communicator's; `T` other
    /// than f32/f64.
    pub fn all_reduce_sum<T: Element>(&self, buf: &mut DeviceBuffer<T>, len: usize) -> Result<()> {
        let dtype = nccl_type(T::DTYPE)?;
        if len > buf.len() {
            return Err(Error::invalid(
                "len",
                format!("is {len} but the buffer holds {} elements", buf.len()),
            ));
        }
        if !buf.context().same_device(&self.ctx) {
            return Err(Error::invalid(
                "buf",
                "is on another device than the communicator's context",
            ));
        }
        if len == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        let ptr = buf.device_ptr() as *mut ::core::ffi::c_void;
        // SAFETY: ptr addresses len <= buf.len() elements of T (checked) on this communicator's
        // device; in place (send == receive) is allowed by NCCL; the stream is the context's,
        // on which buf's other uses are ordered; the communicator is alive.
        unsafe {
            nccl::all_reduce(
                ptr,
                ptr,
                len,
                dtype,
                sys::ncclRedOp_t::ncclSum,
                self.comm,
                self.ctx.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(|e| nccl_error("ncclAllReduce", e))?;
        Ok(())
    }
}

impl Communicator {
    /// Ends the communicator in order, on every rank after its last collective:
    /// `ncclCommFinalize` (waits until all of this rank's NCCL work, including what peers read
    /// from it, is complete) then `ncclCommDestroy`. On a failure the communicator is aborted
    /// and the error returned.
    pub fn finish(mut self) -> Result<()> {
        let comm = std::mem::replace(&mut self.comm, std::ptr::null_mut());
        self.ctx.bind()?;
        // SAFETY: comm came from ncclCommInitRank and is released exactly once here (self.comm
        // is null now, so Drop does nothing).
        let finalized = unsafe { nccl::comm_finalize(comm) }.map_err(|e| nccl_error("ncclCommFinalize", e));
        if let Err(e) = finalized {
            // SAFETY: as above; abort frees it without waiting.
            let _ = unsafe { nccl::comm_abort(comm) };
            return Err(e);
        }
        // SAFETY: as above.
        unsafe { nccl::comm_destroy(comm) }.map_err(|e| nccl_error("ncclCommDestroy", e))?;
        Ok(())
    }
}

impl Collective for Communicator {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    /// Through the device: upload, [`Communicator::all_reduce_sum`], download (which waits for
    /// the stream).
    fn all_reduce_sum_host(&self, values: &mut [f64]) -> Result<()> {
        if values.is_empty() {
            return Ok(());
        }
        let mut buf = self.ctx.upload(values)?;
        self.all_reduce_sum(&mut buf, values.len())?;
        values.copy_from_slice(&buf.to_host()?);
        Ok(())
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        if self.comm.is_null() {
            return; // finished
        }
        let _ = self.ctx.bind();
        // SAFETY: comm came from a successful ncclCommInitRank and is released once; abort does
        // not wait for other ranks. Its error is ignored: nothing can be done in a destructor.
        let _ = unsafe { nccl::comm_abort(self.comm) };
    }
}

/// The checks of a rank within a group: `size >= 1`, `rank < size`, `size` within NCCL's `int`.
pub(crate) fn check_rank(rank: usize, size: usize) -> Result<()> {
    if size == 0 {
        return Err(Error::invalid("size", "is 0; a communicator has at least one rank"));
    }
    if size > i32::MAX as usize {
        return Err(Error::invalid(
            "size",
            format!("is {size}; NCCL takes at most {}", i32::MAX),
        ));
    }
    if rank >= size {
        return Err(Error::invalid(
            "rank",
            format!("is {rank}; with size {size} it must be below {size}"),
        ));
    }
    Ok(())
}
