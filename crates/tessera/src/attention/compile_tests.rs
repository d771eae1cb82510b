//! Attention tests that need NVRTC but no GPU: every forward and combine variant the dispatcher
//! can produce compiles for every CI architecture without spills (and, on Hopper, without
//! serialised wgmma instructions), and the device view of
//! `ts::AttentionParams` has the size of its Rust mirror.

use super::plan::{ci_combine_variants, ci_variants_for, PARAMS_BYTES};
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

/// The CI check of DESIGN.md: every attention kernel the dispatcher can produce compiles for
/// sm_80, sm_86, sm_89 and sm_90a with NVRTC, spilling nothing.
#[test]
fn kernels_compile_for_every_ci_arch_without_spills() {
    if !nvrtc_or_skip("kernels_compile_for_every_ci_arch_without_spills") {
        return;
    }
    use rayon::prelude::*;
    let jobs: Vec<(KernelSpec, Arch)> = Arch::CI_TARGETS
        .iter()
        .flat_map(|&a| {
            ci_variants_for(a)
                .into_iter()
                .map(|v| v.spec())
                .chain(ci_combine_variants().into_iter().map(|c| c.spec()))
                .map(move |s| (s, a))
        })
        .collect();
    let results: Vec<(String, Arch, crate::Result<crate::runtime::Compiled>)> = jobs
        .par_iter()
        .map(|(s, a)| (s.name.clone(), *a, compile_only(s, *a)))
        .collect();
    let mut failures = Vec::new();
    let mut max_regs = 0;
    for (name, arch, r) in &results {
        match r {
            // ptxas C7520: the wgmmas of a Hopper kernel were serialised (a wait or branch inside
            // their in-flight window); correct but far slower, so CI refuses it.
            Ok(c) if c.log.contains("wgmma.mma_async instructions are serialized") => failures.push(format!(
                "{name} {arch}: ptxas serialised its wgmma instructions (C7520)"
            )),
            Ok(c) if c.resources.spill_free() && c.resources.registers <= 255 => {
                max_regs = max_regs.max(c.resources.registers)
            }
            Ok(c) => failures.push(format!("{name} {arch}: spills {:?}", c.resources)),
            Err(e) => failures.push(format!("{name} {arch}: {e}")),
        }
    }
    eprintln!("compiled {} attention kernels; max registers {max_regs}", results.len());
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
