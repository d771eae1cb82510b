//! KV cache tests that need NVRTC but no GPU: every append and decode variant the
//! planner can produce compiles for every CI architecture without spills, and the device views
//! of the parameter structs have the sizes of their Rust mirrors.

use super::decode::DecodeParams;
use super::AppendParams;
use crate::runtime::probe::nvrtc_or_skip;
use crate::runtime::{compile_only, Arch, KernelSpec};

const PARAMS_SIZE_CHECK: &str = r#"
#include "tessera/kvcache_params.cuh"
static_assert(sizeof(ts::AppendParams) == kAppendBytes, "ts::AppendParams and its Rust mirror differ in size");
static_assert(sizeof(ts::DecodeParams) == kDecodeBytes, "ts::DecodeParams and its Rust mirror differ in size");
extern "C" __global__ void params_size_check(const __grid_constant__ ts::DecodeParams p) {}
"#;

#[test]
fn params_structs_have_the_sizes_of_their_rust_mirrors() {
    if !nvrtc_or_skip("params_structs_have_the_sizes_of_their_rust_mirrors") {
        return;
    }
    let (a, d) = (std::mem::size_of::<AppendParams>(), std::mem::size_of::<DecodeParams>());
    let spec = KernelSpec {
        name: "kvcache_params_size_check".into(),
        file: "params_size_check.cu",
        source: PARAMS_SIZE_CHECK,
        preamble: format!(
            "constexpr unsigned long long kAppendBytes = {a};\nconstexpr unsigned long long kDecodeBytes = {d};\n"
        ),
        entry: "params_size_check",
        headers: crate::kvcache::DEVICE_HEADERS,
    };
    if let Err(e) = compile_only(&spec, Arch::SM80) {
        panic!("kvcache params differ from their Rust mirrors ({a}, {d} bytes): {e}");
    }
}
