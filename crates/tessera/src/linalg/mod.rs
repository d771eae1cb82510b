//! Iterative linear algebra on the host: the CPU reference of tessera's least-squares solver.
//!
//! * [`HostLinearOperator`]: a real matrix seen only through `y = alpha A x + beta y` and
//!   `y = alpha A^T x + beta y` in f64, implemented for [`CsrHost`](crate::sparse::CsrHost),
//!   a dense row-major [`DenseHost`] and a closure pair [`FnOperator`] (`operator`).
//!
//! Not behind the `harness` feature: the CLI falls back to this solver when there is no GPU.

pub mod operator;

#[cfg(test)]
mod operator_tests;

pub use operator::{DenseHost, FnOperator, HostLinearOperator};
