//! What the tests of `serve-sim`'s parts share: a small workload spec, a scheduler config for it,
//! and a dry run.

use super::engine::DryEngine;
use super::scheduler::{SchedConfig, Scheduler};
use super::workload::{default_pages, LenRange, Workload, WorkloadSpec};
use super::{simulate, StepRecord};

pub fn spec(requests: usize, seed: u64) -> WorkloadSpec {
    WorkloadSpec {
        requests,
        prompt_len: LenRange { lo: 32, hi: 1024 },
        gen_len: LenRange { lo: 8, hi: 96 },
        shared_prefixes: 3,
        prefix_len: 128,
        shared_fraction: 0.6,
        arrival_rate: 1.0,
        seed,
    }
}

pub fn sched_cfg(w: &Workload, max_batch: usize, pages: Option<usize>, seed: u64) -> SchedConfig {
    SchedConfig {
        num_pages: pages.unwrap_or_else(|| default_pages(w, max_batch, 16).0),
        page_size: 16,
        max_batch,
        max_prefill_tokens: 4096,
        seed,
    }
}

/// Runs a dry simulation with invariant checks every step.
pub fn dry_run(w: &Workload, cfg: SchedConfig) -> (Scheduler, Vec<StepRecord>) {
    let mut s = Scheduler::new(cfg, w).unwrap();
    let recs = simulate(&mut s, &mut DryEngine, true, |_, _| {}).unwrap();
    (s, recs)
}
