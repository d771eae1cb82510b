//! The operators the CLI knows, and how it verifies, benchmarks and demonstrates each. Adding
//! an operator means adding one arm to each function here; the operator's cases, checks and
//! timings live in its own library folder.

use tessera::harness::{BenchOutcome, VerifyOutcome};
use tessera::runtime::{Context, TimingOptions};
use tessera::{attention, kvcache, softmax, Result};

/// Every implemented operator, in dependency order.
pub const ALL: &[&str] = &["softmax", "attention", "kvcache"];

/// Resolves the user's operator list (empty = all); unknown names are an error listing ALL.
pub fn select(requested: &[String]) -> std::result::Result<Vec<&'static str>, String> {
    if requested.is_empty() {
        return Ok(ALL.to_vec());
    }
    requested
        .iter()
        .map(|r| {
            ALL.iter()
                .find(|a| a.eq_ignore_ascii_case(r))
                .copied()
                .ok_or_else(|| format!("unknown operator `{r}`; implemented: {}", ALL.join(", ")))
        })
        .collect()
}

/// Runs one verification case with a seed.
pub type VerifyFn = Box<dyn Fn(&Context, u64) -> Result<VerifyOutcome>>;
/// Verifies and times one benchmark case.
pub type BenchFn = Box<dyn Fn(&Context, u64, TimingOptions) -> Result<BenchOutcome>>;

/// A verification case, boxed so the CLI can iterate cases of any operator.
pub struct VerifyJob {
    pub name: String,
    pub run: VerifyFn,
}

pub fn verify_jobs(op: &str, quick: bool) -> Vec<VerifyJob> {
    match op {
        "softmax" => softmax::verify::cases(quick)
            .into_iter()
            .map(|c| VerifyJob {
                name: c.name(),
                run: Box::new(move |ctx: &Context, seed| softmax::verify::verify_case(ctx, &c, seed)),
            })
            .collect(),
        "attention" => attention::verify::cases(quick)
            .into_iter()
            .map(|c| VerifyJob {
                name: c.name(),
                run: Box::new(move |ctx: &Context, seed| attention::verify::verify_case(ctx, &c, seed)),
            })
            .collect(),
        "kvcache" => kvcache::verify::cases(quick)
            .into_iter()
            .map(|c| VerifyJob {
                name: c.name(),
                run: Box::new(move |ctx: &Context, seed| kvcache::verify::verify_case(ctx, &c, seed)),
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// A benchmark case of ours plus its baseline description.
pub struct BenchJob {
    pub name: String,
    /// `(case, params)` for the baseline runner, when this case has baselines.
    pub baseline: Option<(String, serde_json::Value)>,
    pub run: BenchFn,
}

pub fn bench_jobs(op: &str, quick: bool) -> Vec<BenchJob> {
    match op {
        "softmax" => softmax::bench::cases(quick)
            .into_iter()
            .map(|c| {
                let baseline = (c.path == softmax::SoftmaxPath::Auto).then(|| (c.name(), c.params()));
                BenchJob {
                    // The impl is part of the job name so `--filter tessera-split-row` selects it.
                    name: format!("{} {}", c.name(), c.implementation()),
                    baseline,
                    run: Box::new(move |ctx: &Context, seed, t| softmax::bench::bench_case(ctx, &c, seed, t)),
                }
            })
            .chain(softmax::bench::copy_cases(quick).into_iter().map(|c| BenchJob {
                // `--filter copy` selects them
                name: format!("{} copy", c.name()),
                baseline: None,
                run: Box::new(move |ctx: &Context, seed, t| softmax::bench::bench_copy(ctx, &c, seed, t)),
            }))
            .collect(),
        "attention" => attention::bench::cases(quick)
            .into_iter()
            .map(|c| {
                let baseline = (c.path == attention::AttentionPath::Auto).then(|| (c.name(), c.params()));
                BenchJob {
                    // The impl is part of the job name so `--filter tessera-sm80` selects it.
                    name: format!("{} {}", c.name(), c.implementation()),
                    baseline,
                    run: Box::new(move |ctx: &Context, seed, t| attention::bench::bench_case(ctx, &c, seed, t)),
                }
            })
            .collect(),
        "kvcache" => kvcache::bench::cases(quick)
            .into_iter()
            .map(|c| {
                // one baseline run per shape: the forced variants share their shape's params
                let forced = c.tuning.is_some() || c.layout.is_some() || c.chunk.is_some();
                let baseline = (!forced).then(|| (c.name(), c.params()));
                BenchJob {
                    name: format!("{} {}", c.name(), c.implementation()),
                    baseline,
                    run: Box::new(move |ctx: &Context, seed, t| kvcache::bench::bench_case(ctx, &c, seed, t)),
                }
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// Every kernel variant an operator's dispatcher can produce (what `tessera compile` builds).
pub fn kernel_specs(op: &str, arch: tessera::runtime::Arch) -> Vec<tessera::runtime::KernelSpec> {
    match op {
        "softmax" => softmax::plan::ci_variants_for(arch).iter().map(|v| v.spec()).collect(),
        "attention" => attention::plan::ci_variants_for(arch)
            .iter()
            .map(|v| v.spec())
            .chain(attention::plan::ci_combine_variants().iter().map(|v| v.spec()))
            .collect(),
        "kvcache" => kvcache::decode::ci_variants()
            .iter()
            .map(|v| v.spec())
            .chain(kvcache::ci_append_variants().iter().map(|v| v.spec()))
            .collect(),
        _ => Vec::new(),
    }
}

/// Comparison rows that tessera measures itself (not the Python runners): softmax's same-size
/// device copy.
pub const IN_PROCESS_IMPLS: [&str; 1] = ["copy"];

/// The baseline implementations each operator is compared against (Python runners, plus
/// [`IN_PROCESS_IMPLS`]).
pub fn baseline_impls(op: &str) -> &'static [&'static str] {
    match op {
        // `copy`: a same-size device copy (softmax::bench::bench_copy), ours the same bytes
        "softmax" => &["torch", "copy"],
        "attention" => &[
            "torch-flash",
            "torch-cudnn",
            "torch-efficient",
            "torch-math",
            "flashinfer-fa3",
            "flashinfer-fa2",
        ],
        "kvcache" => &[
            "flashinfer",
            "torch-cudnn-gqa",
            "torch-flash-gqa",
            "torch-flash-expanded",
            "torch-index",
        ],
        _ => &[],
    }
}

/// The Python runner script for an operator's baselines (in `scripts/baselines/`).
pub fn baseline_script(op: &str) -> &'static str {
    match op {
        "attention" => "bench_attention.py", // torch SDPA backends and FlashInfer
        "kvcache" => "bench_kvcache.py",     // FlashInfer paged decode / append, torch SDPA GQA
        _ => "bench_torch.py",
    }
}
