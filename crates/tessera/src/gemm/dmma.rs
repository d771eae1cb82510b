//! The fp64 tensor-core kernel (`gemm_dmma.cu`, sm_80+): 128 x 128 x 16 CTA tiles, 8 warps,
//! a 3-stage cp.async pipeline, mma.sync m16n8k8 f64 on sm_90 (four m8n8k4 before), any layout
//! and alignment, epilogue in f64.

use crate::runtime::{KernelKey, KernelSpec, LaunchConfig};

/// Source of the kernel.
pub const SOURCE: &str = include_str!("gemm_dmma.cu");
/// CTA tile (M, N, K) and pipeline depth, as in the kernel.
pub const TILE_M: usize = 128;
pub const TILE_N: usize = 128;
pub const TILE_K: usize = 16;
pub const STAGES: usize = 3;
pub const THREADS: u32 = 256;
/// Dynamic shared memory: STAGES x (A tile + B tile) of doubles (96 KiB; the launch opts in
/// above 48 KiB, and it fits the 99 KiB of sm_86/89).
pub const SHARED_BYTES: u32 = (STAGES * (TILE_M + TILE_N) * TILE_K * 8) as u32;

/// The one variant (f64 in and out).
pub fn key() -> KernelKey {
    KernelKey::new("gemm_dmma")
}
pub fn spec() -> KernelSpec {
    key().spec("gemm_dmma.cu", SOURCE, "gemm_dmma", super::DEVICE_HEADERS)
}
/// The launch for an M x N problem of `batch` entries: grid (N tiles, M tiles, batch).
pub fn launch_config(m: usize, n: usize, batch: usize) -> LaunchConfig {
    LaunchConfig {
        grid: (n.div_ceil(TILE_N) as u32, m.div_ceil(TILE_M) as u32, batch as u32),
        ..LaunchConfig::linear(1, THREADS, SHARED_BYTES)
    }
}
