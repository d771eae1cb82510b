//! Iterative linear algebra on the host: the CPU reference of tessera's least-squares solver.
//!
//! * [`HostLinearOperator`]: a real matrix seen only through `y = alpha A x + beta y` and
//!   `y = alpha A^T x + beta y` in f64, implemented for [`CsrHost`](crate::sparse::CsrHost),
//!   a dense row-major [`DenseHost`] and a closure pair [`FnOperator`] (`operator`).
//! * [`lsmr_host`]: LSMR (Fong and Saunders, 2011) for `min ||[b; 0] - [A; damp I] x||`, with
//!   the options, stopping rules, estimates and return values of SciPy 1.17's
//!   `scipy.sparse.linalg.lsmr` (`lsmr`). The GPU solver is checked against it.
//!
//! Not behind the `harness` feature: the CLI falls back to this solver when there is no GPU.

pub mod lsmr;
pub mod operator;

#[cfg(test)]
mod lsmr_tests;
#[cfg(test)]
mod operator_tests;

pub use lsmr::{istop_reason, lsmr_host, LsmrOptions, LsmrResult};
pub use operator::{DenseHost, FnOperator, HostLinearOperator};
