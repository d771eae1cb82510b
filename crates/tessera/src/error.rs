//! The one error type of tessera. Every public entry point returns [`Result`].

use std::fmt;

/// Everything that can go wrong in tessera, by cause.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The CUDA driver library (`libcuda.so`) could not be loaded.
    #[error("CUDA driver library not found: {0}")]
    NoDriver(String),
    /// NVRTC (`libnvrtc.so.13`) could not be loaded.
    #[error("NVRTC library not found: {0}")]
    NoNvrtc(String),
    /// The driver loaded but reported no usable device.
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    /// A CUDA driver or library call failed.
    #[error("CUDA call {call} failed: {message}")]
    Cuda { call: &'static str, message: String },
    /// NVRTC rejected a kernel. Carries everything needed to reproduce it.
    #[error("NVRTC failed to compile kernel `{kernel}` for {arch} with options {options:?}:\n{log}")]
    Compile {
        kernel: String,
        arch: String,
        options: Vec<String>,
        log: String,
    },
    /// An argument broke a documented rule.
    #[error("invalid argument `{arg}`: {rule}")]
    InvalidArgument { arg: &'static str, rule: String },
    /// A valid but unsupported combination; the message says what is supported.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The paged KV cache has too few free or evictable pages for the call; nothing was changed.
    /// The caller preempts (frees or swaps out) a sequence and retries.
    #[error("KV cache out of pages: needed {needed}, {available} free or evictable; preempt a sequence or free pages")]
    OutOfPages {
        /// Pages the call needed.
        needed: usize,
        /// Pages that were free or held only by the prefix cache (evictable) for this call.
        available: usize,
    },
    /// File-system or other I/O failure.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(arg: &'static str, rule: impl fmt::Display) -> Self {
        Error::InvalidArgument {
            arg,
            rule: rule.to_string(),
        }
    }
    /// Shorthand for [`Error::Cuda`].
    pub fn cuda(call: &'static str, message: impl fmt::Display) -> Self {
        Error::Cuda {
            call,
            message: message.to_string(),
        }
    }
}

impl From<cudarc::driver::DriverError> for Error {
    fn from(e: cudarc::driver::DriverError) -> Self {
        Error::Cuda {
            call: "driver",
            message: format!("{e:?}"),
        }
    }
}
