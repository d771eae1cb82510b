//! What `tessera verify` and `tessera bench` need from each operator: its cases, a check of one
//! case against the CPU reference, and a timing of one case. Operators implement these in their
//! own folders (`softmax/verify.rs`, `softmax/bench.rs`); the CLI only iterates and reports.

use serde_json::Value;

use crate::check::Comparison;

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
