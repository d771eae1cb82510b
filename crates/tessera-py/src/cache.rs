//! Process-wide state of the extension: one [`Context`] per device (made on first use) and
//! bounded caches of plans, so a repeated call with the same shapes on the same stream costs a
//! hash lookup instead of planning.
//!
//! A plan is made for the caller's stream ([`Context::with_stream`]) and cached under it: a
//! plan's split-KV workspace is then only ever used in the order of one stream, so calls on
//! different streams never race on it, and it is freed in that stream's order when the plan is
//! evicted. (The streams of torch are never destroyed; a caller that destroys a stream it used
//! with tessera should call `tessera.clear_plan_cache()` first.)

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, MutexGuard};

use cudarc::driver::sys::{self, CUstream};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tessera::attention::{AttentionPlan, AttentionPlanKey};
use tessera::gemm::GemmPlan;
use tessera::runtime::Context;
use tessera::softmax::{SoftmaxPlan, SoftmaxPlanKey};

use crate::errors::IntoPy;
pub use crate::plan_cache::StreamId;
use crate::plan_cache::{AnyPlanCache, PlanCache};

/// Plans kept per kind (softmax, attention, gemm); the least recently used one goes first.
pub const CAPACITY: usize = 64;

static DEVICES: LazyLock<Mutex<HashMap<usize, Context>>> = LazyLock::new(Default::default);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The context of device `ordinal`, made on first use. Fails with `NoDriver`, `NoDevice` or
/// `NoNvrtc` (Python: `NoGpuError`) on a machine that cannot run kernels.
pub fn context(ordinal: usize) -> tessera::Result<Context> {
    let mut devices = lock(&DEVICES);
    if let Some(c) = devices.get(&ordinal) {
        return Ok(c.clone());
    }
    let c = Context::new(ordinal)?;
    devices.insert(ordinal, c.clone());
    Ok(c)
}

/// Runs `f` with the context of device `ordinal` and puts the thread's previously current CUDA
/// context back afterwards ([`KeepCurrentContext`]).
pub fn with_device<T>(ordinal: usize, f: impl FnOnce(&Context) -> tessera::Result<T>) -> tessera::Result<T> {
    tessera::runtime::probe::driver()?;
    let _keep = KeepCurrentContext::save();
    f(&context(ordinal)?)
}

/// The context of `ordinal` queueing on `stream`.
///
/// # Safety
/// As [`Context::with_stream`]: `stream` is a live stream of the device's primary context (or
/// 0 / 1 / 2, the default, legacy and per-thread streams) that outlives what is made with it.
pub unsafe fn context_on(ordinal: usize, stream: StreamId) -> tessera::Result<Context> {
    // SAFETY: forwarded to the caller.
    Ok(unsafe { context(ordinal)?.with_stream(stream as usize as CUstream) })
}

/// Puts back the thread's current CUDA context when dropped. tessera binds the primary context
/// of the device it runs on; the CUDA runtime (torch) reads its current device from the same
/// binding, so without this a call on `cuda:1` would switch torch's current device.
pub struct KeepCurrentContext(sys::CUcontext);

impl KeepCurrentContext {
    /// Saves the current context. Call only once the driver is loaded (`probe::driver()`).
    pub fn save() -> KeepCurrentContext {
        let mut c = std::ptr::null_mut();
        // SAFETY: out-parameter; the driver is loaded (a context exists).
        unsafe { sys::cuCtxGetCurrent(&mut c) };
        KeepCurrentContext(c)
    }
}

impl Drop for KeepCurrentContext {
    fn drop(&mut self) {
        let mut now = std::ptr::null_mut();
        // SAFETY: as in `save`; restoring a context that was current before (or none).
        unsafe {
            sys::cuCtxGetCurrent(&mut now);
            if now != self.0 {
                sys::cuCtxSetCurrent(self.0);
            }
        }
    }
}

/// The device ordinal of a device pointer (for `__cuda_array_interface__` objects, which do
/// not say). Raises `NoGpuError` without a GPU, `InvalidArgumentError` for non-device memory.
#[pyfunction]
pub fn pointer_device(py: Python<'_>, ptr: u64) -> PyResult<usize> {
    py.detach(|| with_device(0, |_| pointer_ordinal(ptr))).py_err()
}

fn pointer_ordinal(ptr: u64) -> tessera::Result<usize> {
    let mut ordinal: i32 = -1;
    // SAFETY: out-parameter of the attribute's type (int); any address may be asked about.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            &mut ordinal as *mut i32 as *mut std::ffi::c_void,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS || ordinal < 0 {
        return Err(tessera::Error::invalid(
            "tensor",
            format!("address {ptr:#x} is not CUDA device memory ({r:?})"),
        ));
    }
    Ok(ordinal as usize)
}

/// Softmax plans by their key (shape, kind, scale, tuning) per (device, stream).
pub type SoftmaxKey = SoftmaxPlanKey;
pub static SOFTMAX_PLANS: PlanCache<SoftmaxKey, SoftmaxPlan> = PlanCache::new("softmax", CAPACITY);

/// Attention plans by their key (problem, options, tuning, device and arch) per stream.
pub type AttentionKey = AttentionPlanKey;
pub static ATTENTION_PLANS: PlanCache<AttentionKey, AttentionPlan> = PlanCache::new("attention", CAPACITY);

/// GEMM plans by their problem (shapes, layouts, strides, precision, epilogue) and options,
/// per (device, stream).
pub static GEMM_PLANS: PlanCache<crate::gemm::GemmKey, GemmPlan> = PlanCache::new("gemm", CAPACITY);

/// Every plan cache, for [`plan_cache_info`] and [`clear_plan_cache`]: a new plan type is one
/// `PlanCache` static and one entry here.
static PLAN_CACHES: [&dyn AnyPlanCache; 3] = [&SOFTMAX_PLANS, &ATTENTION_PLANS, &GEMM_PLANS];

/// Properties of CUDA device `device` as tessera sees it. Raises `NoGpuError` when there is
/// no driver, no such device or no NVRTC.
#[pyfunction]
#[pyo3(signature = (device = 0))]
pub fn device_info(py: Python<'_>, device: usize) -> PyResult<Bound<'_, PyDict>> {
    let ctx = py.detach(|| with_device(device, |c| Ok(c.clone()))).py_err()?;
    let i = ctx.info();
    let d = PyDict::new(py);
    d.set_item("ordinal", i.ordinal)?;
    d.set_item("name", &i.name)?;
    d.set_item("compute_capability", i.compute_capability)?;
    d.set_item("arch", ctx.arch().to_string())?;
    d.set_item("sm_count", i.sm_count)?;
    d.set_item("total_memory", i.total_memory)?;
    d.set_item("driver_version", i.driver_version)?;
    let nvrtc = tessera::runtime::probe::nvrtc().py_err()?;
    d.set_item("nvrtc_version", nvrtc.version)?;
    d.set_item("nvrtc_library", &nvrtc.library.path)?;
    Ok(d)
}

/// Sizes and hit counts of the plan caches: `<name>`, `<name>_hits` and `<name>_misses` per
/// cache (`softmax`, `attention`, `gemm`), and `capacity` (of each).
#[pyfunction]
pub fn plan_cache_info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    for cache in PLAN_CACHES {
        let (name, s) = (cache.name(), cache.stats());
        d.set_item(name, s.len)?;
        d.set_item(format!("{name}_hits"), s.hits)?;
        d.set_item(format!("{name}_misses"), s.misses)?;
    }
    d.set_item("capacity", CAPACITY)?;
    Ok(d)
}

/// Drops every cached plan (their workspaces are freed in their streams' order).
#[pyfunction]
pub fn clear_plan_cache(py: Python<'_>) {
    py.detach(|| {
        // freeing a workspace binds its device's context: put the caller's back afterwards
        let _keep = tessera::runtime::probe::driver()
            .ok()
            .map(|_| KeepCurrentContext::save());
        PLAN_CACHES.iter().for_each(|c| c.clear());
    })
}
