//! Device-library tests that need NVRTC but no GPU: every test kernel of [`super::ci_variants_for`]
//! compiles for every CI architecture (the sm_90a-only ones for sm_90a) without spills and, for
//! the wgmma kernels, without serialised wgmma instructions.

use super::ci_specs_for;
use crate::runtime::probe::nvrtc_or_skip;
use crate::runtime::{compile_only, Arch, KernelSpec};

#[test]
fn test_kernels_compile_for_every_ci_arch_without_spills() {
    if !nvrtc_or_skip("test_kernels_compile_for_every_ci_arch_without_spills") {
        return;
    }
    use rayon::prelude::*;
    let jobs: Vec<(KernelSpec, Arch)> = Arch::CI_TARGETS
        .iter()
        .flat_map(|&a| ci_specs_for(a).into_iter().map(move |s| (s, a)))
        .collect();
    let results: Vec<(String, Arch, crate::Result<crate::runtime::Compiled>)> = jobs
        .par_iter()
        .map(|(s, a)| (s.name.clone(), *a, compile_only(s, *a)))
        .collect();
    let mut failures = Vec::new();
    for (name, arch, r) in &results {
        match r {
            Ok(c) if c.log.contains("wgmma.mma_async instructions are serialized") => failures.push(format!(
                "{name} {arch}: ptxas serialised its wgmma instructions (C7520)"
            )),
            Ok(c) if c.resources.spill_free() => eprintln!(
                "{name} {arch}: {} registers, {} bytes static smem, no spills",
                c.resources.registers, c.resources.shared_bytes
            ),
            Ok(c) => failures.push(format!("{name} {arch}: spills {:?}", c.resources)),
            Err(e) => failures.push(format!("{name} {arch}: {e}")),
        }
    }
    eprintln!("compiled {} device-library test kernels", results.len());
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn hopper_kernels_only_for_sm90a() {
    for arch in Arch::CI_TARGETS {
        let kernels = super::ci_variants_for(arch);
        assert_eq!(kernels.iter().any(|k| k.needs_sm90a()), arch == Arch::SM90, "{arch}");
        assert!(kernels.contains(&super::TestKernel::Convert));
    }
    assert_eq!(super::ci_variants_for(Arch::SM90), super::all_kernels());
}
