//! The operator seam: every operator is one folder plus one line in [`OPERATORS`]. The CLI
//! (`verify`, `bench`, `compile`, the CPU main job, charts and baseline runners) and the
//! per-arch NVRTC compile tests iterate this list; none of them names an operator.
//!
//! An operator implements [`Operator`] in its own folder (`softmax/operator.rs`): its verify
//! and bench cases as boxed jobs, every kernel variant its dispatcher can produce for an
//! architecture, its own device headers, its baselines, its chart and a CPU demonstration.

use crate::error::Result;
use crate::harness::{Baselines, BenchJob, Chart, VerifyJob};
use crate::runtime::{Arch, KernelSpec};

/// What the harness needs from one operator.
pub trait Operator: Sync {
    /// The name on the command line and of its result files (`softmax`).
    fn name(&self) -> &'static str;
    /// Verification cases against the CPU reference; `quick` is a small set for sanitizers.
    fn verify_jobs(&self, quick: bool) -> Vec<VerifyJob>;
    /// Benchmark cases; `quick` is a small set.
    fn bench_jobs(&self, quick: bool) -> Vec<BenchJob>;
    /// Every kernel variant the dispatcher can produce for `arch` (what CI compiles).
    fn kernel_specs(&self, arch: Arch) -> Vec<KernelSpec>;
    /// The operator's own device headers (beside the shared `src/cuda` library).
    fn device_headers(&self) -> &'static [(&'static str, &'static str)] {
        &[]
    }
    /// The baselines its benchmark is compared against, if any.
    fn baselines(&self) -> Option<Baselines> {
        None
    }
    /// How its benchmark rows are charted.
    fn chart(&self) -> Chart {
        Chart::Bars
    }
    /// The CPU main job's part: runs the CPU reference on small shapes, prints what it checked
    /// and returns whether every check held.
    fn cpu_demo(&self, seed: u64) -> Result<bool>;
}

/// Every operator, in dependency order. Adding an operator adds one line here.
pub static OPERATORS: &[&dyn Operator] = &[
    &crate::devicelib::OPERATOR,
    &crate::softmax::OPERATOR,
    &crate::attention::OPERATOR,
    &crate::kvcache::OPERATOR,
    &crate::sparse::OPERATOR,
    &crate::linalg::OPERATOR,
    &crate::gemm::OPERATOR,
];

/// The operator called `name` (ignoring case).
pub fn find(name: &str) -> Option<&'static dyn Operator> {
    OPERATORS.iter().copied().find(|o| o.name().eq_ignore_ascii_case(name))
}

/// Resolves a list of operator names (empty = all); an unknown name is an error listing the
/// registered ones.
pub fn select(requested: &[String]) -> std::result::Result<Vec<&'static dyn Operator>, String> {
    if requested.is_empty() {
        return Ok(OPERATORS.to_vec());
    }
    requested
        .iter()
        .map(|r| {
            find(r).ok_or_else(|| {
                let names: Vec<_> = OPERATORS.iter().map(|o| o.name()).collect();
                format!("unknown operator `{r}`; implemented: {}", names.join(", "))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::KernelSpec;

    #[test]
    fn names_are_unique_and_selectable() {
        let mut names: Vec<_> = OPERATORS.iter().map(|o| o.name()).collect();
        names.sort();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "duplicate operator names");
        for name in &names {
            assert_eq!(find(&name.to_uppercase()).map(|o| o.name()), Some(*name));
        }
        assert_eq!(select(&[]).unwrap().len(), OPERATORS.len());
        let err = select(&["nope".into()]).err().unwrap();
        assert!(err.contains("nope") && err.contains("softmax"), "{err}");
    }

    #[test]
    fn every_operator_has_cases_and_kernels() {
        for op in OPERATORS {
            assert!(!op.verify_jobs(true).is_empty(), "{}: no quick verify cases", op.name());
            assert!(!op.verify_jobs(false).is_empty(), "{}: no verify cases", op.name());
            for arch in Arch::CI_TARGETS {
                assert!(!op.kernel_specs(arch).is_empty(), "{} {arch}: no kernels", op.name());
            }
            let mut names: Vec<_> = op.kernel_specs(Arch::SM90).into_iter().map(|s| s.name).collect();
            let n = names.len();
            names.sort();
            names.dedup();
            assert_eq!(names.len(), n, "{}: two kernel variants share a name", op.name());
        }
    }

    /// The CI check of DESIGN.md: every kernel variant of every operator compiles with NVRTC
    /// for sm_80, sm_86, sm_89 and sm_90a (Hopper-only kernels for sm_90a), spilling nothing
    /// and, on Hopper, without ptxas serialising wgmma (C7520: correct but far slower).
    #[test]
    fn every_kernel_compiles_for_every_ci_arch_without_spills() {
        if !crate::runtime::probe::nvrtc_or_skip("every_kernel_compiles_for_every_ci_arch_without_spills") {
            return;
        }
        use rayon::prelude::*;
        let jobs: Vec<(&str, KernelSpec, Arch)> = OPERATORS
            .iter()
            .flat_map(|op| {
                Arch::CI_TARGETS
                    .iter()
                    .flat_map(move |&a| op.kernel_specs(a).into_iter().map(move |s| (op.name(), s, a)))
            })
            .collect();
        let results: Vec<_> = jobs
            .par_iter()
            .map(|(op, s, a)| (*op, s.name.clone(), *a, crate::runtime::compile_only(s, *a)))
            .collect();
        let mut failures = Vec::new();
        for op in OPERATORS {
            let mine: Vec<_> = results.iter().filter(|r| r.0 == op.name()).collect();
            let mut max_regs = 0;
            for (_, name, arch, r) in &mine {
                match r {
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
            eprintln!(
                "{}: compiled {} kernels; max registers {max_regs}",
                op.name(),
                mine.len()
            );
        }
        assert!(
            failures.is_empty(),
            "{} failures:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }

    #[test]
    fn cpu_demos_pass() {
        for op in OPERATORS {
            assert!(op.cpu_demo(7).unwrap(), "{}: CPU demo check failed", op.name());
        }
    }
}
