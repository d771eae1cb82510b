//! KV cache tests that need NVRTC but no GPU: every append and decode variant the
//! planner can produce compiles for every CI architecture without spills, and the device views
//! of the parameter structs have the sizes of their Rust mirrors.

use super::decode::{ci_variants, DecodeParams};
use super::{ci_append_variants, AppendParams};
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

/// Every KV cache kernel compiles for sm_80, sm_86, sm_89 and sm_90a, spilling nothing.
#[test]
fn kernels_compile_for_every_ci_arch_without_spills() {
    if !nvrtc_or_skip("kvcache kernels_compile_for_every_ci_arch_without_spills") {
        return;
    }
    use rayon::prelude::*;
    let specs: Vec<KernelSpec> = ci_variants()
        .into_iter()
        .map(|v| v.spec())
        .chain(ci_append_variants().into_iter().map(|a| a.spec()))
        .collect();
    let jobs: Vec<(KernelSpec, Arch)> = Arch::CI_TARGETS
        .iter()
        .flat_map(|&a| specs.iter().map(move |s| (s.clone(), a)))
        .collect();
    let results: Vec<(String, Arch, crate::Result<crate::runtime::Compiled>)> = jobs
        .par_iter()
        .map(|(s, a)| (s.name.clone(), *a, compile_only(s, *a)))
        .collect();
    let mut failures = Vec::new();
    let mut max_regs = 0;
    for (name, arch, r) in &results {
        match r {
            Ok(c) if c.resources.spill_free() && c.resources.registers <= 255 => {
                max_regs = max_regs.max(c.resources.registers)
            }
            Ok(c) => failures.push(format!("{name} {arch}: spills {:?}", c.resources)),
            Err(e) => failures.push(format!("{name} {arch}: {e}")),
        }
    }
    eprintln!("compiled {} kvcache kernels; max registers {max_regs}", results.len());
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
