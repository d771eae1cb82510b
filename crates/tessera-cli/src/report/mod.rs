//! Benchmark results: the JSON model of DESIGN.md ("Verification and benchmarks"), the console
//! table, the PNG chart, and the protocol with the Python baseline runners in
//! `scripts/baselines/` (`bench_torch.py` / `bench_attention.py --op OP --cases IN.json
//! --out OUT.json`, see `scripts/baselines/bench_common.py`).
//!
//! - [`json`]: the report model (`BenchReport`, `BenchRow`), its JSON, the merge of rounds;
//! - [`table`]: the console table;
//! - [`chart`]: the PNG charts (`plot_op` and its `PlotStyle`);
//! - [`baselines`]: running the Python baseline scripts.

mod baselines;
mod chart;
#[cfg(test)]
mod fixtures;
mod json;
mod table;

pub use baselines::{baseline_script, run_python_baseline, BaselineOutcome};
pub use chart::{plot_op, PlotStyle};
pub use json::{describe_timing, merge_reports, merge_rounds, BenchReport, BenchRow, TIMING_BURST, TIMING_SUSTAINED};
pub use table::print_table;
