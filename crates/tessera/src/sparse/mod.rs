//! Sparse matrices and the operators on them (SpMV, SpMM) for sparse least squares.
//!
//! The host side lives here: index types ([`SparseIndex`]), host CSR/COO matrices with their
//! validation and conversions ([`CsrHost`], [`CooHost`]), a structural summary used to choose
//! kernels ([`SparseDescriptor`]), and Matrix Market I/O ([`read_mtx`], [`write_mtx`]). With
//! the `harness` feature: f64 references (`reference`) and seeded random matrices of typical
//! structures (`generate`).

pub mod descriptor;
#[cfg(feature = "harness")]
pub mod generate;
pub mod host;
pub mod index;
pub mod mtx;
#[cfg(feature = "harness")]
pub mod reference;
mod row_ranges;

#[cfg(test)]
mod descriptor_tests;
#[cfg(test)]
mod generate_tests;
#[cfg(test)]
mod host_tests;
#[cfg(test)]
mod mtx_tests;
#[cfg(test)]
mod reference_tests;

pub use descriptor::SparseDescriptor;
pub use host::{ColumnOrder, CooHost, CsrCheck, CsrHost, DenseLayout, Duplicates};
pub use index::SparseIndex;
pub use mtx::{parse_mtx, read_mtx, read_mtx_csr, write_mtx, MtxField, MtxHeader, MtxSymmetry};
