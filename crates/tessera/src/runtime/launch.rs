//! Loaded kernels and launching them with one `#[repr(C)]` parameter struct.

use std::sync::atomic::{AtomicU32, Ordering};

use cudarc::driver::sys;

use super::context::{check, Context};
use super::jit::{Compiled, KernelResources, KernelSpec};
use crate::error::{Error, Result};

/// A kernel parameter struct, passed by value as the kernel's single
/// `const __grid_constant__` argument.
///
/// # Safety
/// The type must be `#[repr(C)]` and have exactly the size, alignment and field layout of the
/// struct the kernel declares, and contain only plain data (device pointers as `u64`).
pub unsafe trait KernelParams: Copy {}

/// Grid, block and dynamic shared memory of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub shared_bytes: u32,
    /// CTAs per thread-block cluster along x (Hopper and newer); 1 = no clusters. `grid.0`
    /// must be a multiple of it.
    pub cluster_x: u32,
    /// Programmatic dependent launch: the kernel may be scheduled while the previous kernel on
    /// the stream is still finishing, once that kernel allows it (`ts::allow_dependent_grids`),
    /// instead of after the whole grid and a launch gap. Only for kernels that call
    /// `ts::wait_prior_grids()` before their first global memory access (common.cuh). Applied
    /// on sm_90+ unless `TESSERA_PDL=0` ([`pdl_enabled`]); ignored elsewhere.
    pub dependent_launch: bool,
    /// Cooperative launch: the driver guarantees that every CTA of the grid is resident at once,
    /// or fails the launch (`CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE`) instead of letting CTAs
    /// that wait for each other hang. For kernels whose CTAs exchange data through global memory.
    pub cooperative: bool,
}

/// Whether launches that allow it use programmatic dependent launch on a device of compute
/// capability `cc`: sm_90 and newer, unless the environment sets `TESSERA_PDL=0` (read once).
pub fn pdl_enabled(cc: (u32, u32)) -> bool {
    static ENV_OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    cc.0 >= 9 && !*ENV_OFF.get_or_init(|| std::env::var("TESSERA_PDL").is_ok_and(|v| v.trim() == "0"))
}

impl LaunchConfig {
    /// A 1-D launch.
    pub fn linear(grid: u32, block: u32, shared_bytes: u32) -> Self {
        LaunchConfig {
            grid: (grid, 1, 1),
            block: (block, 1, 1),
            shared_bytes,
            cluster_x: 1,
            dependent_launch: false,
            cooperative: false,
        }
    }

    /// The same launch with programmatic dependent launch allowed (see `dependent_launch`).
    pub fn with_dependent_launch(self) -> Self {
        LaunchConfig {
            dependent_launch: true,
            ..self
        }
    }

    /// The same launch, cooperative (see `cooperative`).
    pub fn with_cooperative(self) -> Self {
        LaunchConfig {
            cooperative: true,
            ..self
        }
    }

    /// A 1-D launch of clusters of `cluster_x` CTAs; `grid` counts CTAs.
    pub fn clustered(grid: u32, block: u32, shared_bytes: u32, cluster_x: u32) -> Self {
        LaunchConfig {
            grid: (grid, 1, 1),
            block: (block, 1, 1),
            shared_bytes,
            cluster_x,
            dependent_launch: false,
            cooperative: false,
        }
    }

    /// The launch attributes of this config: the cluster dimension when `cluster_x > 1`,
    /// programmatic stream serialization when `pdl`, cooperative when `cooperative`; the first
    /// `n` entries are set.
    fn attributes(&self, pdl: bool) -> ([sys::CUlaunchAttribute; 3], u32) {
        // SAFETY: all-zero is a valid (empty) attribute value.
        let mut attrs: [sys::CUlaunchAttribute; 3] = unsafe { std::mem::zeroed() };
        let mut n = 0;
        if self.cluster_x > 1 {
            attrs[n].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
            attrs[n].value.clusterDim.x = self.cluster_x;
            attrs[n].value.clusterDim.y = 1;
            attrs[n].value.clusterDim.z = 1;
            n += 1;
        }
        if pdl {
            attrs[n].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attrs[n].value.programmaticStreamSerializationAllowed = 1;
            n += 1;
        }
        if self.cooperative {
            attrs[n].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
            attrs[n].value.cooperative = 1;
            n += 1;
        }
        (attrs, n as u32)
    }

    /// The driver's extended launch config over `n` attributes starting at `attrs`.
    fn with_attrs(&self, stream: sys::CUstream, attrs: *mut sys::CUlaunchAttribute, n: u32) -> sys::CUlaunchConfig {
        sys::CUlaunchConfig {
            gridDimX: self.grid.0,
            gridDimY: self.grid.1,
            gridDimZ: self.grid.2,
            blockDimX: self.block.0,
            blockDimY: self.block.1,
            blockDimZ: self.block.2,
            sharedMemBytes: self.shared_bytes,
            hStream: stream,
            attrs,
            numAttrs: n,
        }
    }
}

/// A compiled kernel loaded into a context.
pub struct Kernel {
    pub name: String,
    module: sys::CUmodule,
    function: sys::CUfunction,
    pub resources: KernelResources,
    /// The dynamic shared-memory limit currently set on the function.
    dynamic_limit: AtomicU32,
}

// SAFETY: module/function handles are usable from any thread with the context bound.
unsafe impl Send for Kernel {}
// SAFETY: as above; the only mutable state is atomic.
unsafe impl Sync for Kernel {}

impl Drop for Kernel {
    fn drop(&mut self) {
        // SAFETY: the module was loaded by `load` and is unloaded once; the owning context
        // is still alive (kernels are dropped before the context's fields).
        unsafe {
            sys::cuModuleUnload(self.module);
        }
    }
}

impl Kernel {
    /// Loads CUBIN into the current context. The caller has bound the context.
    pub(crate) fn load(spec: &KernelSpec, compiled: Compiled) -> Result<Kernel> {
        let mut module = std::ptr::null_mut();
        // SAFETY: the image is a complete CUBIN produced by NVRTC for this device's arch.
        check("cuModuleLoadData", unsafe {
            sys::cuModuleLoadData(&mut module, compiled.cubin.as_ptr() as *const _)
        })?;
        let entry = std::ffi::CString::new(spec.entry).map_err(|_| Error::invalid("entry", "contains NUL"))?;
        let mut function = std::ptr::null_mut();
        // SAFETY: valid module and NUL-terminated name.
        if let Err(e) = check("cuModuleGetFunction", unsafe {
            sys::cuModuleGetFunction(&mut function, module, entry.as_ptr())
        }) {
            // SAFETY: loaded just above and not shared.
            unsafe { sys::cuModuleUnload(module) };
            return Err(e);
        }
        Ok(Kernel {
            name: spec.name.clone(),
            module,
            function,
            resources: compiled.resources,
            dynamic_limit: AtomicU32::new(48 * 1024),
        })
    }

    /// Resident CTAs per SM for this block size and dynamic shared memory.
    pub fn max_active_blocks_per_sm(&self, ctx: &Context, block: u32, shared_bytes: u32) -> Result<u32> {
        ctx.bind()?;
        self.allow_shared(shared_bytes)?;
        let mut n = 0;
        // SAFETY: valid function, out-parameter.
        check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut n, self.function, block as i32, shared_bytes as usize)
        })?;
        Ok(n as u32)
    }

    /// Clusters of `cfg.cluster_x` CTAs that can be resident on the whole device at once.
    pub fn max_active_clusters(&self, ctx: &Context, cfg: LaunchConfig) -> Result<u32> {
        ctx.bind()?;
        self.allow_shared(cfg.shared_bytes)?;
        let (mut attrs, n_attrs) = cfg.attributes(false);
        let config = cfg.with_attrs(ctx.cu_stream(), attrs.as_mut_ptr(), n_attrs);
        let mut n = 0;
        // SAFETY: valid function and config; `attrs` outlives the call.
        check("cuOccupancyMaxActiveClusters", unsafe {
            sys::cuOccupancyMaxActiveClusters(&mut n, self.function, &config)
        })?;
        Ok(n as u32)
    }

    /// Raises the function's dynamic shared-memory limit when a launch needs more than 48 KB.
    fn allow_shared(&self, bytes: u32) -> Result<()> {
        if bytes <= self.dynamic_limit.load(Ordering::Relaxed) {
            return Ok(());
        }
        // SAFETY: valid function; the driver rejects values above the device's opt-in limit.
        check("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)", unsafe {
            sys::cuFuncSetAttribute(
                self.function,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
        })?;
        self.dynamic_limit.fetch_max(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// Launches the kernel on the context's stream with `params` as its only argument.
    ///
    /// # Safety
    /// `P` must match the kernel's parameter struct ([`KernelParams`]), every device pointer in
    /// `params` must point to live allocations large enough for everything the kernel reads and
    /// writes under `cfg`, and nothing else may access written memory concurrently.
    pub unsafe fn launch<P: KernelParams>(&self, ctx: &Context, cfg: LaunchConfig, params: &P) -> Result<()> {
        ctx.bind()?;
        if cfg.grid.0 == 0 || cfg.grid.1 == 0 || cfg.grid.2 == 0 {
            return Ok(()); // nothing to do; a zero grid is a launch error in CUDA
        }
        self.allow_shared(cfg.shared_bytes)?;
        let mut args = [params as *const P as *mut std::ffi::c_void];
        let pdl = cfg.dependent_launch && pdl_enabled(ctx.info().compute_capability);
        if cfg.cluster_x > 1 || pdl {
            let (mut attrs, n) = cfg.attributes(pdl);
            let config = cfg.with_attrs(ctx.cu_stream(), attrs.as_mut_ptr(), n);
            return check(
                "cuLaunchKernelEx",
                sys::cuLaunchKernelEx(&config, self.function, args.as_mut_ptr(), std::ptr::null_mut()),
            );
        }
        check(
            "cuLaunchKernel",
            sys::cuLaunchKernel(
                self.function,
                cfg.grid.0,
                cfg.grid.1,
                cfg.grid.2,
                cfg.block.0,
                cfg.block.1,
                cfg.block.2,
                cfg.shared_bytes,
                ctx.cu_stream(),
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            ),
        )
    }
}
