//! Iterative linear algebra: LSMR for sparse (or matrix-free) least squares, on the GPU and,
//! as its reference, on the host.
//!
//! * [`HostLinearOperator`]: a real matrix seen only through `y = alpha A x + beta y` and
//!   `y = alpha A^T x + beta y` in f64, implemented for [`CsrHost`](crate::sparse::CsrHost),
//!   a dense row-major [`DenseHost`] and a closure pair [`FnOperator`] (`operator`).
//! * [`lsmr_host`]: LSMR (Fong and Saunders, 2011) for `min ||[b; 0] - [A; damp I] x||`, with
//!   the options, stopping rules, estimates and return values of SciPy 1.17's
//!   `scipy.sparse.linalg.lsmr` (`lsmr` module docs). The GPU solver is checked against it.
//! * [`LinearOperator`]: the same seam on the device (f32 or f64 [`DeviceBuffer`]s):
//!   [`SparseDualOperator`] (CSR of A and of A^T), [`SparseSingleOperator`] (A^T x without a
//!   copy), [`sparse_operator`] choosing between them from free memory, [`DenseOperator`] (a
//!   dense device matrix, row- or column-major, GEMV kernels in `dense.cu`),
//!   [`FnDeviceOperator`].
//! * [`lsmr()`]: the GPU solver, SciPy's semantics with the iteration on the device
//!   (`lsmr_device` module docs, `lsmr.cu`).
//! * The damp list: [`lsmr_damps`] (GPU) and [`lsmr_host_damps`] (CPU reference) solve for
//!   `k` damping factors in one run, sharing every product of the operator; each result equals
//!   a separate solve with that damp.
//! * Many right-hand sides: [`lsmr_many`] (GPU) and [`lsmr_host_many`] (CPU reference) solve
//!   for the `k` columns of `B` in one run, each column its own solve, sharing the operator's
//!   products as batched ones ([`LinearOperator::apply_many`]: SpMM for sparse matrices).
//!
//! The host half is not behind the `harness` feature: the CLI falls back to it when there is no
//! GPU.
//!
//! [`DeviceBuffer`]: crate::runtime::DeviceBuffer

pub mod dense_operator;
pub mod device_operator;
pub mod lsmr;
pub mod lsmr_device;
pub mod mtx_vector;
pub mod operator;

#[cfg(feature = "harness")]
pub mod bench;
#[cfg(any(test, feature = "harness"))]
pub(crate) mod fixtures;
#[cfg(feature = "harness")]
mod registry_entry;
#[cfg(feature = "harness")]
pub mod verify;

#[cfg(test)]
mod dense_operator_tests;
#[cfg(test)]
mod lsmr_device_tests;
#[cfg(test)]
mod lsmr_tests;
#[cfg(test)]
mod operator_tests;

pub use dense_operator::{DenseLayout, DenseOperator};
pub use device_operator::{
    sparse_operator, sparse_operator_with, FnDeviceOperator, LinearOperator, SparseDualOperator, SparseOperatorOptions,
    SparseSingleOperator, Storage,
};
pub use lsmr::{istop_reason, lsmr_host, lsmr_host_damps, lsmr_host_many, LsmrOptions, LsmrResult};
pub use lsmr_device::{
    lsmr, lsmr_damps, lsmr_damps_with, lsmr_many, lsmr_many_with, lsmr_with, LsmrRunOptions, ManyRhs,
    DEFAULT_CHECK_EVERY, MAX_DAMPS, MAX_RHS,
};
pub use operator::{DenseHost, FnOperator, HostLinearOperator};
#[cfg(feature = "harness")]
pub use registry_entry::OPERATOR;
