//! tessera: GPU operators for LLM inference and sparse least squares.
//!
//! Kernels are CUDA C++ compiled at run time by NVRTC for the exact GPU (see `runtime::jit`);
//! everything around them (validation, planning, memory, references) is Rust. A machine with
//! no GPU is a normal state: every GPU entry point returns [`Error`] instead of panicking.

pub mod attention;
#[cfg(feature = "harness")]
pub mod check;
pub mod devicelib;
pub mod distributed;
pub mod dtype;
pub mod error;
pub mod gemm;
#[cfg(feature = "harness")]
pub mod harness;
pub mod kvcache;
pub mod linalg;
pub mod numeric;
#[cfg(feature = "harness")]
pub mod registry;
pub mod runtime;
pub mod softmax;
pub mod sparse;
#[cfg(feature = "harness")]
pub mod testdata;

pub use dtype::{DType, Element};
pub use error::{Error, Result};
