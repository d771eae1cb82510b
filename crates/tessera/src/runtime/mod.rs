//! The runtime every operator stands on: finding the CUDA libraries ([`probe`]), the device
//! [`Context`] with its memory pool, typed buffers and strided views, NVRTC compilation with
//! an on-disk cache ([`jit`]), launching, CUDA-event timing, and building blocks that several
//! operators share: stride helpers ([`tensor`]), TMA tensor maps ([`tma`]) and the work counters
//! of persistent kernels ([`work_counters`]).

pub mod buffer;
pub mod context;
pub mod graph;
pub mod jit;
pub mod kernel_key;
pub mod launch;
pub mod probe;
pub mod roofline;
pub mod tensor;
pub mod timing;
pub mod tma;
pub mod work_counters;

pub use buffer::{DeviceBuffer, TensorView, TensorViewMut};
pub use context::{Context, DeviceInfo, PoolStats};
pub use graph::StreamGraph;
pub use jit::{compile_only, Arch, Compiled, KernelResources, KernelSpec};
pub use kernel_key::KernelKey;
pub use launch::{Kernel, KernelParams, LaunchConfig};
pub use tensor::contiguous_strides;
pub use timing::{time_median, EventTimer, Timing, TimingOptions};
pub use work_counters::WorkCounters;
