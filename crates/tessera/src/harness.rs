//! What `tessera verify` and `tessera bench` need from each operator: its cases, a check of one
//! case against the CPU reference, and a timing of one case. Operators implement these in their
//! own folders (`softmax/verify.rs`, `softmax/bench.rs`) and hand them to the CLI as boxed jobs
//! through the [`registry`](crate::registry); the CLI only iterates and reports.

use serde_json::Value;

use crate::check::Comparison;
use crate::error::Result;
use crate::runtime::{Context, TimingOptions};

/// One verified case.
#[derive(Clone, Debug)]
pub struct VerifyOutcome {
    /// Readable case name (`softmax fp16 1000x1025 stride 1032 warp`).
    pub case: String,
    /// The case as numbers and flags (the JSON `params`).
    pub params: Value,
    /// The kernel path or variant that ran.
    pub path: String,
    pub comparison: Comparison,
    /// The rel-L2 budget the case was judged by.
    pub budget: f64,
    pub passed: bool,
    /// Anything else worth printing (a failed check other than the metrics).
    pub note: Option<String>,
    /// `Some(reason)` when the case could not run on this device (e.g. a Hopper-only path on
    /// another GPU): neither passed nor failed.
    pub skipped: Option<String>,
}

impl VerifyOutcome {
    /// A case this device cannot run, with the reason.
    pub fn skipped(case: String, params: Value, reason: String) -> VerifyOutcome {
        VerifyOutcome {
            case,
            params,
            path: "-".into(),
            comparison: crate::check::compare(&[], &[], 0.0, 0.0),
            budget: 0.0,
            passed: false,
            note: None,
            skipped: Some(reason),
        }
    }
}

/// One timed case of ours, verified on the timed inputs first.
#[derive(Clone, Debug)]
pub struct BenchOutcome {
    pub case: String,
    pub params: Value,
    /// `impl` of the JSON rows: `tessera` for default dispatch, `tessera-<path>` when forced.
    pub implementation: String,
    pub ms: f64,
    pub gbps: Option<f64>,
    pub tflops: Option<f64>,
    pub extra_mib: Option<f64>,
    pub max_abs_err: Option<f64>,
    pub rel_l2: Option<f64>,
}

/// Runs one verification case with a seed.
pub type VerifyFn = Box<dyn Fn(&Context, u64) -> Result<VerifyOutcome> + Send + Sync>;
/// Verifies and times one benchmark case.
pub type BenchFn = Box<dyn Fn(&Context, u64, TimingOptions) -> Result<BenchOutcome> + Send + Sync>;

/// A verification case of any operator, boxed so the CLI can iterate them.
pub struct VerifyJob {
    /// The case's name (what `--filter` matches).
    pub name: String,
    pub run: VerifyFn,
}

impl VerifyJob {
    /// A job named `name` that runs `verify(ctx, &case, seed)`.
    pub fn new<C: Send + Sync + 'static>(
        name: String,
        case: C,
        verify: fn(&Context, &C, u64) -> Result<VerifyOutcome>,
    ) -> VerifyJob {
        VerifyJob {
            name,
            run: Box::new(move |ctx, seed| verify(ctx, &case, seed)),
        }
    }
}

/// A benchmark case of ours, with what its baseline runner needs.
pub struct BenchJob {
    /// The case's name and impl (`causal fp16 ... tessera-sm80`), what `--filter` matches.
    pub name: String,
    /// `(case, params)` handed to the operator's baseline runner, for the cases that have
    /// baselines (one per shape: variants forcing a path share their shape's baseline).
    pub baseline: Option<(String, Value)>,
    pub run: BenchFn,
}

impl BenchJob {
    /// A job named `name` that runs `bench(ctx, &case, seed, timing)`.
    pub fn new<C: Send + Sync + 'static>(
        name: String,
        baseline: Option<(String, Value)>,
        case: C,
        bench: fn(&Context, &C, u64, TimingOptions) -> Result<BenchOutcome>,
    ) -> BenchJob {
        BenchJob {
            name,
            baseline,
            run: Box::new(move |ctx, seed, timing| bench(ctx, &case, seed, timing)),
        }
    }
}

/// The baselines an operator's benchmark is compared against.
#[derive(Clone, Copy, Debug)]
pub struct Baselines {
    /// The Python runner in `scripts/baselines/` that times the baselines on the same cases.
    pub script: &'static str,
    /// Every baseline `impl` name the runner (or tessera itself) may produce, in table order.
    pub impls: &'static [&'static str],
    /// The impls of [`Baselines::impls`] that tessera measures in process (not the runner).
    pub in_process: &'static [&'static str],
}

/// How `tessera bench --json` charts an operator's rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Chart {
    /// A grouped bar per case, of the metric the rows carry (TFLOP/s or GB/s).
    #[default]
    Bars,
    /// TFLOP/s against sequence length over the operator's headline sweep (attention's causal
    /// fp16 B=1 H=32 D=128 rows), one line per impl; bars when the run has no such rows.
    TflopsOverN,
}
