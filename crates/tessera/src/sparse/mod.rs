//! Sparse matrices and the operators on them (SpMV, SpMM) for sparse least squares.
//!
//! On the device: [`CsrMatrix`] (uploaded once from a [`CsrHost`]) and its SpMV
//! (`y = alpha A x + beta y`, [`SpmvPlan`], deterministic; `spmv_csr.cu`, opt-in merge path
//! `spmv_merge.cu`) and SpMM; the
//! block-sparse formats BSR ([`BsrMatrix`]) and Blocked-ELL ([`BellMatrix`]) with square blocks
//! of 2..32, converted from CSR on the device (`csr.to_bsr(16)`, cached by `csr.bsr(16)`), whose
//! SpMM runs on tensor cores for fp16/bf16 with 16 x 16 and 32 x 32 blocks ([`bsr`]). The host side:
//! index types ([`SparseIndex`]), host CSR/COO matrices with their validation and conversions ([`CsrHost`], [`CooHost`]), a structural summary used to choose
//! kernels ([`SparseDescriptor`]), and Matrix Market I/O ([`read_mtx`], [`write_mtx`]). With
//! the `harness` feature: f64 references (`reference`) and seeded random matrices of typical
//! structures (`generate`).

#[cfg(feature = "harness")]
pub mod bench;
pub mod block;
pub mod bsr;
pub mod convert;
pub mod descriptor;
pub mod device;
#[cfg(feature = "harness")]
pub mod generate;
pub mod host;
pub mod index;
pub mod mtx;
#[cfg(feature = "harness")]
mod operator;
#[cfg(feature = "harness")]
pub mod reference;
mod row_ranges;
pub mod sell;
pub mod spmm;
pub mod spmv;
pub mod spmv_compact;
pub mod spmv_merge;
pub mod spmv_panels;
pub mod spmv_transposed;
#[cfg(feature = "harness")]
pub mod verify;
#[cfg(feature = "harness")]
pub mod verify_block;
#[cfg(feature = "harness")]
pub mod verify_convert;

#[cfg(test)]
mod block_tests;
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
#[cfg(test)]
mod spmv_merge_tests;

pub use block::{BellHost, BsrHost, BLOCK_SIZES};
pub use bsr::{block_format_advised, BellMatrix, BlockPath, BsrMatrix};
pub use convert::{ConversionReport, CooMatrix};
pub use descriptor::SparseDescriptor;
pub use device::CsrMatrix;
pub use host::{ColumnOrder, CooHost, CsrCheck, CsrHost, DenseLayout, Duplicates};
pub use index::SparseIndex;
pub use mtx::{parse_mtx, read_mtx, read_mtx_csr, write_mtx, MtxField, MtxHeader, MtxSymmetry};
#[cfg(feature = "harness")]
pub use operator::OPERATOR;
pub use sell::{prefers_sell, SellMatrix, SellOptions};
pub use spmm::SpmmPlan;
pub use spmv::{SkipIf, SpmvOptions, SpmvPlan, SpmvTuning};
pub use spmv_compact::CompactColumns;
pub use spmv_transposed::SpmvTransposedPlan;
