//! `tessera._tessera`: the extension module under the `tessera` Python package.
//!
//! The Python layer (`python/tessera/`) turns torch tensors, `__cuda_array_interface__` objects
//! and DLPack capsules into plain descriptors, allocates outputs with torch and picks the
//! caller's current stream; this module validates the descriptors with tessera's own checks,
//! keeps one [`Context`](tessera::runtime::Context) per device and a bounded cache of plans
//! per (device, stream, problem), and launches on the caller's stream through
//! [`Context::with_stream`](tessera::runtime::Context::with_stream). Nothing here
//! synchronises.
//!
//! Every function is split in two where the Python layer needs it: `check_*` validates with no
//! device (so argument errors are the same on a machine without a GPU), the op itself runs.

mod cache;
mod desc;
mod errors;
mod gemm;
mod kvcache;
mod ops;
mod plan_cache;
mod scaled_mm;
mod sparse;

use pyo3::prelude::*;

#[pymodule]
fn _tessera(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(ops::check_softmax, m)?)?;
    m.add_function(wrap_pyfunction!(ops::softmax, m)?)?;
    m.add_function(wrap_pyfunction!(ops::check_attention, m)?)?;
    m.add_function(wrap_pyfunction!(ops::flash_attention, m)?)?;
    m.add_function(wrap_pyfunction!(ops::validate_cu_seqlens, m)?)?;
    m.add_function(wrap_pyfunction!(gemm::operand_layout, m)?)?;
    m.add_function(wrap_pyfunction!(gemm::check_matmul, m)?)?;
    m.add_function(wrap_pyfunction!(gemm::matmul, m)?)?;
    m.add_function(wrap_pyfunction!(scaled_mm::check_scaled_mm, m)?)?;
    m.add_function(wrap_pyfunction!(scaled_mm::scaled_mm, m)?)?;
    m.add_function(wrap_pyfunction!(scaled_mm::check_int_mm, m)?)?;
    m.add_function(wrap_pyfunction!(scaled_mm::int_mm, m)?)?;
    m.add_function(wrap_pyfunction!(cache::device_info, m)?)?;
    m.add_function(wrap_pyfunction!(cache::pointer_device, m)?)?;
    m.add_function(wrap_pyfunction!(cache::plan_cache_info, m)?)?;
    m.add_function(wrap_pyfunction!(cache::clear_plan_cache, m)?)?;
    m.add("PLAN_CACHE_CAPACITY", cache::CAPACITY)?;
    m.add_function(wrap_pyfunction!(kvcache::check_kv_cache, m)?)?;
    m.add_class::<kvcache::KvCache>()?;
    m.add_class::<kvcache::DecodeWrapper>()?;
    m.add_function(wrap_pyfunction!(sparse::check_csr, m)?)?;
    m.add_function(wrap_pyfunction!(sparse::check_sparse_product, m)?)?;
    m.add_function(wrap_pyfunction!(sparse::check_lsmr, m)?)?;
    m.add_function(wrap_pyfunction!(sparse::check_lsmr_many, m)?)?;
    m.add("LSMR_MAX_RHS", tessera::linalg::MAX_RHS)?;
    m.add("LSMR_MAX_DAMPS", tessera::linalg::MAX_DAMPS)?;
    m.add_function(wrap_pyfunction!(sparse::lsmr_callback, m)?)?;
    m.add_class::<sparse::SparseMatrix>()?;
    Ok(())
}
