//! [`Context`]: one device, one stream, a stream-ordered memory pool, the kernel cache and
//! lazily created library handles. Cheap to clone.
//!
//! A context made by [`Context::new`] owns its stream. [`Context::with_stream`] gives a context
//! that shares everything of the device (pool, kernels, JIT cache) but queues its work on a
//! stream owned by someone else: how a caller's framework (PyTorch's current stream) orders
//! tessera's kernels with its own work without synchronising.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaStream};

use super::jit::{Arch, JitCache, KernelSpec};
use super::launch::Kernel;
use super::probe;
use crate::error::{Error, Result};

/// Turns a driver status into a `Result`, naming the call.
pub(crate) fn check(call: &'static str, r: sys::CUresult) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut s: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorString writes a pointer to a static string or leaves it null.
    unsafe { sys::cuGetErrorString(r, &mut s) };
    let msg = if s.is_null() {
        format!("{r:?}")
    } else {
        // SAFETY: non-null pointer to a NUL-terminated static string from the driver.
        format!("{r:?}: {}", unsafe { std::ffi::CStr::from_ptr(s) }.to_string_lossy())
    };
    Err(Error::cuda(call, msg))
}

/// What tessera needs to know about a device, read once.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    pub sm_count: u32,
    pub total_memory: usize,
    /// Shared memory a block may use after opting in (`cuFuncSetAttribute`).
    pub max_shared_per_block_optin: u32,
    pub max_shared_per_sm: u32,
    pub max_threads_per_sm: u32,
    pub l2_bytes: u32,
    /// `cuDriverGetVersion` (13000 = CUDA 13.0).
    pub driver_version: i32,
}

impl DeviceInfo {
    /// The architecture kernels are compiled for.
    pub fn arch(&self) -> Arch {
        Arch {
            major: self.compute_capability.0,
            minor: self.compute_capability.1,
        }
    }
}

/// Memory pool statistics in bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct PoolStats {
    /// Memory the pool holds from the driver.
    pub reserved: u64,
    /// Memory handed out and not yet freed.
    pub used: u64,
    /// High-water mark of `used` since the last [`Context::reset_peak`].
    pub used_peak: u64,
}

/// What every context of one device shares.
pub(crate) struct Inner {
    pub(crate) info: DeviceInfo,
    pub(crate) pool: sys::CUmemoryPool,
    pub(crate) kernels: Mutex<HashMap<[u8; 32], Arc<Kernel>>>,
    /// The same kernels by the identity of their spec ([`SpecIdentity`]), so that a repeated
    /// lookup does not hash the source and headers again (a few hundred kB: ~0.1 ms each).
    pub(crate) kernels_by_spec: Mutex<HashMap<SpecIdentity, Arc<Kernel>>>,
    pub(crate) jit: Arc<JitCache>,
    /// The stream [`Context::new`] created (synchronised before the pool is destroyed).
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) cuda: Arc<CudaContext>,
}

/// The stream a context queues work on, and the cuBLAS handle bound to that stream.
pub(crate) struct StreamBinding {
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) blas: OnceLock<std::result::Result<Arc<cudarc::cublas::CudaBlas>, String>>,
}

impl StreamBinding {
    fn new(stream: Arc<CudaStream>) -> Arc<StreamBinding> {
        Arc::new(StreamBinding {
            stream,
            blas: OnceLock::new(),
        })
    }
}

// SAFETY: the raw pool handle is only used through the driver API, which is thread safe once
// the context is bound to the calling thread (every entry point binds it).
unsafe impl Send for Inner {}
// SAFETY: as above; mutable state sits behind Mutex/OnceLock.
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        let _ = self.cuda.bind_to_thread();
        let _ = self.stream.synchronize();
        // unload every module while the context is bound (both maps hold them)
        lock(&self.kernels_by_spec).clear();
        lock(&self.kernels).clear();
        // SAFETY: every buffer from this pool holds an Arc<Inner>, so none is alive now.
        unsafe {
            sys::cuMemPoolDestroy(self.pool);
        }
    }
}

/// A device, its stream and its resources. Clone freely: clones share everything.
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<Inner>,
    pub(crate) on: Arc<StreamBinding>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.inner.info.name)
            .finish()
    }
}

fn attr(dev: sys::CUdevice, a: sys::CUdevice_attribute) -> Result<i32> {
    let mut v = 0;
    // SAFETY: out-parameter, valid device handle.
    check("cuDeviceGetAttribute", unsafe {
        sys::cuDeviceGetAttribute(&mut v, a, dev)
    })?;
    Ok(v)
}

impl Context {
    /// Opens device `ordinal`. Fails with [`Error::NoDriver`], [`Error::NoDevice`] or
    /// [`Error::NoNvrtc`] (never panics) when the machine cannot run kernels.
    pub fn new(ordinal: usize) -> Result<Context> {
        let drv = probe::driver()?;
        probe::nvrtc()?;
        if ordinal >= drv.device_count as usize {
            return Err(Error::NoDevice(format!(
                "device {ordinal} requested but the driver reports {} device(s)",
                drv.device_count
            )));
        }
        let cuda = CudaContext::new(ordinal)?;
        cuda.bind_to_thread()?;
        let stream = cuda.new_stream()?;
        let dev = cuda.cu_device();
        use sys::CUdevice_attribute as A;
        let info = DeviceInfo {
            ordinal,
            name: cuda.name()?,
            compute_capability: (
                attr(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? as u32,
                attr(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)? as u32,
            ),
            sm_count: attr(dev, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
            total_memory: cuda.total_mem()?,
            max_shared_per_block_optin: attr(dev, A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)? as u32,
            max_shared_per_sm: attr(dev, A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)? as u32,
            max_threads_per_sm: attr(dev, A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)? as u32,
            l2_bytes: attr(dev, A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as u32,
            driver_version: drv.version,
        };
        let pool = create_pool(ordinal)?;
        Ok(Context {
            on: StreamBinding::new(stream.clone()),
            inner: Arc::new(Inner {
                info,
                pool,
                kernels: Mutex::new(HashMap::new()),
                kernels_by_spec: Mutex::new(HashMap::new()),
                jit: Arc::new(JitCache::new(super::jit::default_cache_dir())),
                stream,
                cuda,
            }),
        })
    }

    /// A context of the same device that queues all its work (launches, allocations, frees,
    /// copies, cuBLAS calls, event records) on `stream` instead of this context's stream. It
    /// shares the memory pool, the loaded kernels and the JIT cache; it has its own cuBLAS
    /// handle, created on first use and bound to `stream`. Making one allocates one small
    /// object and calls no driver function.
    ///
    /// This is how work is ordered with another library's stream (PyTorch's
    /// `torch.cuda.current_stream().cuda_stream`): tessera queues behind what the caller queued
    /// there, and the caller's later work queues behind tessera's, with no synchronisation.
    ///
    /// # Safety
    /// - `stream` is a stream of this device's primary context (the one the CUDA runtime, and
    ///   so PyTorch and CuPy, use), or a special handle valid there: null (the default stream),
    ///   `CU_STREAM_LEGACY` (0x1) or `CU_STREAM_PER_THREAD` (0x2).
    /// - `stream` stays valid as long as the returned context, its clones and everything made
    ///   with it (buffers, plans, timers) live: buffers free themselves on it when dropped.
    /// - The caller orders this stream with any other stream that touches the same memory;
    ///   tessera orders its work on `stream` only.
    pub unsafe fn with_stream(&self, stream: sys::CUstream) -> Context {
        Context {
            inner: self.inner.clone(),
            // SAFETY: the caller guarantees the stream belongs to this (primary) context and
            // outlives the wrapper; a borrowed wrapper never destroys it.
            on: StreamBinding::new(unsafe { self.inner.cuda.wrap_borrowed_stream(stream) }),
        }
    }

    /// The device's properties.
    pub fn info(&self) -> &DeviceInfo {
        &self.inner.info
    }

    /// The architecture kernels are compiled for.
    pub fn arch(&self) -> Arch {
        self.inner.info.arch()
    }

    /// The raw stream all work of this context is ordered on.
    pub fn cu_stream(&self) -> sys::CUstream {
        self.on.stream.cu_stream()
    }

    /// The kernel cache of this context (its on-disk directory is shared by all contexts).
    pub fn jit(&self) -> &JitCache {
        &self.inner.jit
    }

    /// Binds the context to the calling thread (every public entry point does this).
    pub(crate) fn bind(&self) -> Result<()> {
        self.inner.cuda.bind_to_thread()?;
        Ok(())
    }

    /// Waits for all work queued on the stream.
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: valid stream handle.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.cu_stream())
        })
    }

    /// Whether `other` is a context of the same device and pool (this one, a clone, or a
    /// [`with_stream`](Self::with_stream) of either), whatever its stream.
    pub fn same_device(&self, other: &Context) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Makes this context's stream wait for the work queued so far on `other`'s stream (an
    /// event recorded there and waited for here; no host synchronisation). A no-op when both
    /// queue on the same stream. `other` must be a context of the same device.
    pub fn wait_for(&self, other: &Context) -> Result<()> {
        if !self.same_device(other) {
            return Err(Error::invalid("other", "is a context of another device"));
        }
        if self.cu_stream() == other.cu_stream() {
            return Ok(());
        }
        self.bind()?;
        let mut ev = std::ptr::null_mut();
        // SAFETY: out-parameter; the context is bound.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut ev, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
        })?;
        // SAFETY: a live event and two streams of this context (the callers' guarantee of
        // `with_stream`); destroying an event with a pending wait is allowed (the driver frees it
        // once the wait completes).
        let r = unsafe {
            check("cuEventRecord", sys::cuEventRecord(ev, other.cu_stream()))
                .and_then(|_| check("cuStreamWaitEvent", sys::cuStreamWaitEvent(self.cu_stream(), ev, 0)))
        };
        // SAFETY: the event was created above and is destroyed once.
        unsafe { sys::cuEventDestroy_v2(ev) };
        r
    }

    /// Compiles (or fetches from the cache) and loads a kernel.
    pub fn kernel(&self, spec: &KernelSpec) -> Result<Arc<Kernel>> {
        self.bind()?;
        let identity = SpecIdentity::of(spec);
        if let Some(k) = lock(&self.inner.kernels_by_spec).get(&identity) {
            return Ok(k.clone());
        }
        let key = JitCache::key(spec, self.arch(), &[])?;
        let cached = lock(&self.inner.kernels).get(&key).cloned();
        let kernel = match cached {
            Some(k) => k,
            None => {
                let k = Arc::new(Kernel::load(spec, self.inner.jit.get(spec, self.arch())?)?);
                lock(&self.inner.kernels).insert(key, k.clone());
                k
            }
        };
        lock(&self.inner.kernels_by_spec).insert(identity, kernel.clone());
        Ok(kernel)
    }

    /// Pool statistics (reserved and used bytes).
    pub fn pool_stats(&self) -> Result<PoolStats> {
        self.bind()?;
        let get = |a: sys::CUmemPool_attribute| -> Result<u64> {
            let mut v: u64 = 0;
            // SAFETY: these attributes are 64-bit values.
            check("cuMemPoolGetAttribute", unsafe {
                sys::cuMemPoolGetAttribute(self.inner.pool, a, &mut v as *mut u64 as *mut _)
            })?;
            Ok(v)
        };
        use sys::CUmemPool_attribute as P;
        Ok(PoolStats {
            reserved: get(P::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
            used: get(P::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
            used_peak: get(P::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?,
        })
    }

    /// Resets the pool's high-water mark of used memory to the current use.
    pub fn reset_peak(&self) -> Result<()> {
        self.bind()?;
        let mut zero: u64 = 0;
        // SAFETY: resetting the high-water mark takes a zero 64-bit value.
        check("cuMemPoolSetAttribute", unsafe {
            sys::cuMemPoolSetAttribute(
                self.inner.pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                &mut zero as *mut u64 as *mut _,
            )
        })
    }

    /// Gives memory the pool holds but does not use back to the driver.
    pub fn trim_pool(&self) -> Result<()> {
        self.synchronize()?;
        // SAFETY: valid pool.
        check("cuMemPoolTrimTo", unsafe { sys::cuMemPoolTrimTo(self.inner.pool, 0) })
    }

    /// The cuBLAS handle of this context, created on first use, bound to its stream (a
    /// [`Context::with_stream`] context has its own, bound to the borrowed stream).
    pub fn cublas(&self) -> Result<Arc<cudarc::cublas::CudaBlas>> {
        self.bind()?;
        self.on
            .blas
            .get_or_init(|| {
                probe::cublas().map_err(|e| e.to_string())?;
                cudarc::cublas::CudaBlas::new(self.on.stream.clone())
                    .map(Arc::new)
                    .map_err(|e| format!("{e:?}"))
            })
            .clone()
            .map_err(|e| Error::Unsupported(format!("cuBLAS: {e}")))
    }

    pub(crate) fn pool(&self) -> sys::CUmemoryPool {
        self.inner.pool
    }
}

fn create_pool(ordinal: usize) -> Result<sys::CUmemoryPool> {
    // SAFETY: all-zero is the documented default for the reserved/optional fields.
    let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
    props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
    props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = ordinal as i32;
    let mut pool = std::ptr::null_mut();
    // SAFETY: props is fully initialised; out-parameter.
    check("cuMemPoolCreate", unsafe { sys::cuMemPoolCreate(&mut pool, &props) })?;
    // Keep freed memory in the pool: repeated plans and runs then allocate without the driver.
    let mut threshold: u64 = u64::MAX;
    // SAFETY: the release threshold is a 64-bit value.
    check("cuMemPoolSetAttribute", unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            &mut threshold as *mut u64 as *mut _,
        )
    })?;
    Ok(pool)
}

/// Locks `m`, also after a panic in another holder (the maps it guards stay consistent: each
/// update is one insert or clear).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spec identity (the memo in front of the hashed kernel key) tells apart specs that
    /// differ in any field and matches the same spec built twice.
    #[test]
    fn spec_identity_tells_specs_apart() {
        use crate::linalg::lsmr_device::{all_variants, LsmrVariant};
        let variants: Vec<LsmrVariant> = all_variants();
        let a = variants[0].spec();
        assert!(SpecIdentity::of(&a) == SpecIdentity::of(&variants[0].spec()));
        for other in &variants[1..] {
            assert!(
                SpecIdentity::of(&a) != SpecIdentity::of(&other.spec()),
                "{}",
                other.spec().name
            );
        }
        let changed = |f: &dyn Fn(&mut KernelSpec)| {
            let mut b = a.clone();
            f(&mut b);
            SpecIdentity::of(&a) != SpecIdentity::of(&b)
        };
        assert!(changed(&|b| b.preamble.push(' ')));
        assert!(changed(&|b| b.name.push('x')));
        assert!(changed(&|b| b.entry = "other_entry"));
        assert!(changed(&|b| b.source = &b.source[1..]));
        assert!(changed(&|b| b.file = "other.cu"));
        assert!(changed(&|b| b.headers = &[("extra.cuh", "")]));
    }

    /// On a GPU: a context on a borrowed stream shares the device's pool and kernels, queues on
    /// that stream, and a whole softmax verification passes through it. Skipped without one.
    #[test]
    fn with_stream_queues_on_the_borrowed_stream_when_a_device_is_present() {
        let ctx = match Context::new(0) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("with_stream test: skipped, {e}");
                return;
            }
        };
        let foreign = ctx.inner.cuda.new_stream().unwrap();
        // SAFETY: `foreign` is a stream of the same (primary) context and outlives `on`.
        let on = unsafe { ctx.with_stream(foreign.cu_stream()) };
        assert_eq!(on.cu_stream(), foreign.cu_stream());
        assert_ne!(on.cu_stream(), ctx.cu_stream());
        assert!(Arc::ptr_eq(&on.inner, &ctx.inner));
        let b = on.upload(&[1.0f32, 2.0, 3.0]).unwrap();
        assert_eq!(b.to_host().unwrap(), vec![1.0, 2.0, 3.0]);
        let seed = crate::testdata::seed_from_env_or_time().unwrap();
        let case = &crate::softmax::verify::cases(true)[0];
        let out = crate::softmax::verify::verify_case(&on, case, seed).unwrap();
        assert!(out.passed, "seed {seed} {}: {}", out.case, out.comparison);
        drop(b);
        on.synchronize().unwrap();
    }

    /// On a GPU: `wait_for` orders a copy on one stream after a write queued on another.
    #[test]
    fn wait_for_orders_two_streams_when_a_device_is_present() {
        let ctx = match Context::new(0) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("wait_for test: skipped, {e}");
                return;
            }
        };
        let s2 = ctx.inner.cuda.new_stream().unwrap();
        // SAFETY: `s2` is a stream of the same (primary) context and outlives `other`.
        let other = unsafe { ctx.with_stream(s2.cu_stream()) };
        assert!(other.same_device(&ctx));
        let mut a = ctx.alloc::<f32>(1 << 20).unwrap();
        ctx.synchronize().unwrap();
        a.fill_bytes(0).unwrap();
        let mut b = other.alloc::<f32>(1 << 20).unwrap();
        other.wait_for(&ctx).unwrap();
        b.copy_from(&a).unwrap();
        assert!(b.to_host().unwrap().iter().all(|&x| x == 0.0));
        ctx.wait_for(&ctx).unwrap(); // same stream: a no-op
        drop(b);
        other.synchronize().unwrap();
    }
}

/// What identifies a kernel spec's content without reading it: the generated strings by value,
/// the `&'static` source, headers and names by address and length. Within one process the same
/// address and length of a `'static` string always hold the same bytes, so equal identities
/// mean equal specs (and so equal cache keys: the device, NVRTC and the base options are fixed
/// per context); equal specs behind different addresses only miss this map and take the hashed
/// path.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct SpecIdentity {
    name: String,
    preamble: String,
    statics: [(usize, usize); 4],
}

impl SpecIdentity {
    fn of(spec: &KernelSpec) -> SpecIdentity {
        let at = |s: &str| (s.as_ptr() as usize, s.len());
        SpecIdentity {
            name: spec.name.clone(),
            preamble: spec.preamble.clone(),
            statics: [
                at(spec.file),
                at(spec.source),
                at(spec.entry),
                (spec.headers.as_ptr() as usize, spec.headers.len()),
            ],
        }
    }
}
