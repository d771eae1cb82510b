//! What `serve-sim` reports: summaries of the steps and requests, the table printed at the end
//! and the JSON.

use std::time::Duration;

use serde::Serialize;

use super::engine::CheckResult;
use super::scheduler::Scheduler;
use super::workload::LenRange;
use super::StepRecord;

/// Mean, median and 99th percentile.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

/// Nearest-rank summary of `xs` (zeros when empty).
pub fn summarize(xs: &[f64]) -> Summary {
    if xs.is_empty() {
        return Summary::default();
    }
    let mut s = xs.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let rank = |p: f64| s[((p * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1];
    Summary {
        mean: s.iter().sum::<f64>() / s.len() as f64,
        p50: rank(0.5),
        p99: rank(0.99),
        max: s[s.len() - 1],
    }
}

/// Model and workload settings, as run.
#[derive(Clone, Debug, Serialize)]
pub struct SimSettings {
    pub layers: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub head_dim: usize,
    pub cache_dtype: String,
    pub page_size: usize,
    pub pages: usize,
    pub pages_auto: bool,
    pub max_batch: usize,
    pub max_prefill_tokens: usize,
    pub requests: usize,
    pub prompt_len: LenRange,
    pub gen_len: LenRange,
    pub shared_prefixes: usize,
    pub prefix_len: usize,
    pub shared_fraction: f64,
    pub arrival_per_step: f64,
    pub seed: u64,
}

/// Final page counts.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct FinalPages {
    pub used: usize,
    pub cached: usize,
    pub free: usize,
}

/// Everything `serve-sim` reports (the table and the JSON).
#[derive(Clone, Debug, Serialize)]
pub struct SimReport {
    pub command: String,
    pub gpu: Option<String>,
    pub dry_run: bool,
    pub settings: SimSettings,
    pub steps: usize,
    pub finished: u64,
    pub admissions: u64,
    pub prompt_tokens: u64,
    /// Prompt tokens computed by prefills (not found cached).
    pub prefill_tokens: u64,
    pub generated_tokens: u64,
    pub prefix_lookup_tokens: u64,
    pub prefix_hit_tokens: u64,
    /// prefix_hit_tokens / prefix_lookup_tokens (block manager statistics).
    pub prefix_hit_rate: f64,
    pub evictions: u64,
    pub cow_copies: u64,
    pub preemptions: u64,
    /// Generated tokens / decode GPU time (all layers).
    pub decode_tokens_per_s: Option<f64>,
    /// Prefill tokens / prefill GPU time (all layers).
    pub prefill_tokens_per_s: Option<f64>,
    pub decode_gpu_s: Option<f64>,
    pub prefill_gpu_s: Option<f64>,
    /// GPU time of the decode phase of the steps that decode.
    pub decode_step_ms: Option<Summary>,
    pub prefill_step_ms: Option<Summary>,
    pub decode_batch: Summary,
    /// Steps from a request's arrival to its last token.
    pub latency_steps: Summary,
    pub pages_used: Summary,
    pub final_pages: FinalPages,
    /// Host time in block-manager calls per step, microseconds.
    pub host_block_manager_us: Summary,
    /// Host planning time per step (tables, plans, uploads), microseconds.
    pub host_planning_us: Option<Summary>,
    pub wall_s: f64,
    pub jit_warmup_s: Option<f64>,
    pub checks: Vec<CheckResult>,
}

impl SimReport {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        command: &str,
        gpu: Option<String>,
        settings: SimSettings,
        sched: &Scheduler,
        records: &[StepRecord],
        wall: Duration,
        jit_warmup: Option<Duration>,
        checks: Vec<CheckResult>,
    ) -> SimReport {
        let bm = sched.block_manager();
        let bs = bm.stats();
        let st = sched.stats();
        let decode_ms: Vec<f64> = records.iter().filter_map(|r| r.decode_ms).collect();
        let prefill_ms: Vec<f64> = records.iter().filter_map(|r| r.prefill_ms).collect();
        let dry = gpu.is_none();
        let decode_s = (!dry).then(|| decode_ms.iter().sum::<f64>() / 1e3);
        let prefill_s = (!dry).then(|| prefill_ms.iter().sum::<f64>() / 1e3);
        let rate = |n: u64, s: Option<f64>| s.filter(|&s| s > 0.0).map(|s| n as f64 / s);
        let col = |f: fn(&StepRecord) -> f64| records.iter().map(f).collect::<Vec<f64>>();
        SimReport {
            command: command.to_string(),
            dry_run: dry,
            gpu,
            settings,
            steps: records.len(),
            finished: st.finished,
            admissions: st.admissions,
            prompt_tokens: st.prompt_tokens,
            prefill_tokens: st.prefill_tokens,
            generated_tokens: st.generated_tokens,
            prefix_lookup_tokens: bs.prefix_lookup_tokens,
            prefix_hit_tokens: bs.prefix_hit_tokens,
            prefix_hit_rate: bs.prefix_hit_tokens as f64 / (bs.prefix_lookup_tokens.max(1)) as f64,
            evictions: bs.evictions,
            cow_copies: bs.cow_copies,
            preemptions: st.preemptions,
            decode_tokens_per_s: rate(st.generated_tokens, decode_s),
            prefill_tokens_per_s: rate(st.prefill_tokens, prefill_s),
            decode_gpu_s: decode_s,
            prefill_gpu_s: prefill_s,
            decode_step_ms: (!dry).then(|| summarize(&decode_ms)),
            prefill_step_ms: (!dry).then(|| summarize(&prefill_ms)),
            decode_batch: summarize(
                &records
                    .iter()
                    .filter(|r| r.decode_seqs > 0)
                    .map(|r| r.decode_seqs as f64)
                    .collect::<Vec<_>>(),
            ),
            latency_steps: summarize(&sched.latency_steps()),
            pages_used: summarize(&col(|r| r.used_pages as f64)),
            final_pages: FinalPages {
                used: bm.num_used_pages(),
                cached: bm.num_cached_pages(),
                free: bm.num_free_pages(),
            },
            host_block_manager_us: summarize(&col(|r| r.bm_us)),
            host_planning_us: (!dry).then(|| summarize(&col(|r| r.plan_us))),
            wall_s: wall.as_secs_f64(),
            jit_warmup_s: jit_warmup.map(|d| d.as_secs_f64()),
            checks,
        }
    }

    /// True when every check passed (and the run finished every request).
    pub fn ok(&self) -> bool {
        self.finished as usize == self.settings.requests && self.checks.iter().all(|c| c.passed)
    }

    /// The table printed at the end.
    pub fn table(&self) -> String {
        let s = &self.settings;
        let mut out = String::new();
        let mut line = |k: &str, v: String| out.push_str(&format!("  {k:<22} {v}\n"));
        let ms = |x: &Summary| {
            format!(
                "mean {:.3} ms, p50 {:.3}, p99 {:.3}, max {:.3}",
                x.mean, x.p50, x.p99, x.max
            )
        };
        let us = |x: &Summary| format!("mean {:.1} us, p99 {:.1}, max {:.1}", x.mean, x.p99, x.max);
        line(
            "requests",
            format!(
                "{} of {} finished in {} steps ({} admissions, {} preemptions), wall {:.1} s{}",
                self.finished,
                s.requests,
                self.steps,
                self.admissions,
                self.preemptions,
                self.wall_s,
                self.jit_warmup_s
                    .map(|j| format!(" + JIT warm-up {j:.1} s"))
                    .unwrap_or_default()
            ),
        );
        line(
            "tokens",
            format!(
                "prompt {} (prefilled {}), generated {}",
                self.prompt_tokens, self.prefill_tokens, self.generated_tokens
            ),
        );
        line(
            "prefix hit rate",
            format!(
                "{:.1}% ({} of {} prompt tokens found cached; re-prefills after preemption included)",
                100.0 * self.prefix_hit_rate,
                self.prefix_hit_tokens,
                self.prefix_lookup_tokens
            ),
        );
        if let (Some(tps), Some(gs), Some(st)) = (self.decode_tokens_per_s, self.decode_gpu_s, &self.decode_step_ms) {
            line(
                "decode attention",
                format!(
                    "{:.0} tokens/s ({} layers, GPU {:.2} s); step {}",
                    tps,
                    s.layers,
                    gs,
                    ms(st)
                ),
            );
        }
        if let (Some(tps), Some(gs), Some(st)) = (self.prefill_tokens_per_s, self.prefill_gpu_s, &self.prefill_step_ms)
        {
            line(
                "prefill attention",
                format!("{:.0} tokens/s (GPU {:.2} s); step {}", tps, gs, ms(st)),
            );
        }
        line(
            "decode batch",
            format!(
                "mean {:.1} sequences, max {:.0} (limit {})",
                self.decode_batch.mean, self.decode_batch.max, s.max_batch
            ),
        );
        line(
            "request latency",
            format!(
                "{:.0} steps mean, p50 {:.0}, p99 {:.0} (arrival to last token)",
                self.latency_steps.mean, self.latency_steps.p50, self.latency_steps.p99
            ),
        );
        line(
            "pages in use",
            format!(
                "mean {:.0}, max {:.0} of {}; final used {}, cached {}, free {}",
                self.pages_used.mean,
                self.pages_used.max,
                s.pages,
                self.final_pages.used,
                self.final_pages.cached,
                self.final_pages.free
            ),
        );
        line(
            "evictions / CoW",
            format!(
                "{} cached pages evicted, {} copy-on-write copies",
                self.evictions, self.cow_copies
            ),
        );
        line(
            "host block manager",
            format!("per step {}", us(&self.host_block_manager_us)),
        );
        if let Some(p) = &self.host_planning_us {
            line("host planning", format!("per step {}", us(p)));
        }
        for c in &self.checks {
            line(
                "check",
                format!(
                    "step {} request {} ({} tokens, {} in shared prefix pages) layer {}: rel_l2 {:.2e} \
                     (budget {:.0e}) max_abs {:.2e} nan {}: {}",
                    c.step,
                    c.request,
                    c.seq_len,
                    c.cached_prefix,
                    c.layer,
                    c.rel_l2,
                    c.budget,
                    c.max_abs_err,
                    c.nan,
                    if c.passed { "ok" } else { "FAIL" }
                ),
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve_sim::fixtures::{dry_run, sched_cfg, spec};
    use crate::serve_sim::workload::generate_workload;
    use crate::serve_sim::{HEADS_KV, HEADS_Q, HEAD_DIM};

    #[test]
    fn summaries() {
        let s = summarize(&[4.0, 1.0, 3.0, 2.0]);
        assert_eq!((s.mean, s.p50, s.p99, s.max), (2.5, 2.0, 4.0, 4.0));
        assert_eq!(summarize(&[]), Summary::default());
    }

    #[test]
    fn dry_report_has_no_gpu_numbers() {
        let w = generate_workload(&spec(20, 8)).unwrap();
        let (s, recs) = dry_run(&w, sched_cfg(&w, 8, None, 8));
        let settings = SimSettings {
            layers: 32,
            heads_q: HEADS_Q,
            heads_kv: HEADS_KV,
            head_dim: HEAD_DIM,
            cache_dtype: "fp16".into(),
            page_size: 16,
            pages: 1,
            pages_auto: true,
            max_batch: 8,
            max_prefill_tokens: 4096,
            requests: 20,
            prompt_len: LenRange { lo: 32, hi: 1024 },
            gen_len: LenRange { lo: 8, hi: 96 },
            shared_prefixes: 3,
            prefix_len: 128,
            shared_fraction: 0.6,
            arrival_per_step: 1.0,
            seed: 8,
        };
        let r = SimReport::new("t", None, settings, &s, &recs, Duration::from_secs(1), None, Vec::new());
        assert!(r.ok() && r.dry_run);
        assert!(r.decode_tokens_per_s.is_none() && r.host_planning_us.is_none());
        let j = serde_json::to_value(&r).unwrap();
        assert_eq!(j["finished"], 20);
        assert!(j["prefix_hit_rate"].as_f64().unwrap() > 0.0);
        assert!(r.table().contains("prefix hit rate"));
    }
}
