//! The fp64 tensor-core kernel (`gemm_dmma.cu`, mma.sync m8n8k4 f64, sm_80+): 64 x 64 x 16
//! CTA tiles, any layout and alignment, epilogue in f64.

use crate::runtime::{KernelKey, KernelSpec, LaunchConfig};

/// Source of the kernel.
pub const SOURCE: &str = include_str!("gemm_dmma.cu");
pub const TILE: usize = 64;
pub const THREADS: u32 = 128;

/// The one variant (f64 in and out).
pub fn key() -> KernelKey {
    KernelKey::new("gemm_dmma")
}
pub fn spec() -> KernelSpec {
    key().spec("gemm_dmma.cu", SOURCE, "gemm_dmma", super::DEVICE_HEADERS)
}
pub fn launch_config(m: usize, n: usize, batch: usize) -> LaunchConfig {
    LaunchConfig {
        grid: (n.div_ceil(TILE) as u32, m.div_ceil(TILE) as u32, batch as u32),
        ..LaunchConfig::linear(1, THREADS, 0)
    }
}
