//! Device-library tests that need no GPU. (Every test kernel is compiled for every CI
//! architecture by the registry's compile test, `registry::tests`.)

use crate::runtime::Arch;

#[test]
fn hopper_kernels_only_for_sm90a() {
    for arch in Arch::CI_TARGETS {
        let kernels = super::ci_variants_for(arch);
        assert_eq!(kernels.iter().any(|k| k.needs_sm90a()), arch == Arch::SM90, "{arch}");
        assert!(kernels.contains(&super::TestKernel::Convert));
    }
    assert_eq!(super::ci_variants_for(Arch::SM90), super::all_kernels());
}
