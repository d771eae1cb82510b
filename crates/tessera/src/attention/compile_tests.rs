//! Attention tests that need NVRTC but no GPU: every forward and combine variant the dispatcher
//! can produce compiles for every CI architecture without spills (and, on Hopper, without
//! serialised wgmma instructions), and the device view of
//! `ts::AttentionParams` has the size of its Rust mirror.

use super::plan::PARAMS_BYTES;
use crate::runtime::probe::nvrtc_or_skip;
use crate::runtime::{compile_only, Arch, KernelSpec};

/// A kernel whose compilation fails unless `sizeof(ts::AttentionParams)` is the preamble's
/// `kRustBytes` (= `PARAMS_BYTES`).
const PARAMS_SIZE_CHECK: &str = r#"
#include "tessera/attention_params.cuh"
static_assert(sizeof(ts::AttentionParams) == kRustBytes,
              "ts::AttentionParams and plan.rs AttentionParams differ in size");
extern "C" __global__ void params_size_check(const __grid_constant__ ts::AttentionParams p) {}
"#;

#[test]
fn params_struct_has_the_size_of_its_rust_mirror() {
    if !nvrtc_or_skip("params_struct_has_the_size_of_its_rust_mirror") {
        return;
    }
    let spec = KernelSpec {
        name: "attention_params_size_check".into(),
        file: "params_size_check.cu",
        source: PARAMS_SIZE_CHECK,
        preamble: format!("constexpr unsigned long long kRustBytes = {PARAMS_BYTES};\n"),
        entry: "params_size_check",
        headers: crate::attention::DEVICE_HEADERS,
    };
    if let Err(e) = compile_only(&spec, Arch::SM80) {
        panic!("ts::AttentionParams is not {PARAMS_BYTES} bytes: {e}");
    }
}
