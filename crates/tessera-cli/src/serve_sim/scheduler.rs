//! Continuous batching over the block manager, host only: arrivals, first-come-first-served
//! admission under the batch, prefill-token and page limits, preemption of the most recently
//! admitted sequence when pages run out, and finishing (cached pages stay for prefix reuse; the
//! block manager evicts them when it needs pages).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use tessera::kvcache::block_manager::{BlockManager, BlockManagerConfig, PageCopy, SeqId};
use tessera::Error;

use super::workload::{largest_request_pages, Workload};

/// Pages kept free at admission while something runs (vLLM's default watermark), as a share
/// of the pool.
pub const WATERMARK_SHARE: f64 = 0.01;

/// Settings of the [`Scheduler`].
#[derive(Clone, Debug, PartialEq)]
pub struct SchedConfig {
    pub num_pages: usize,
    pub page_size: usize,
    pub max_batch: usize,
    /// Most prompt tokens (cached ones included) admitted in one step, unless the first
    /// admitted prompt alone is longer.
    pub max_prefill_tokens: usize,
    /// Seed of the generated token ids.
    pub seed: u64,
}

/// One request's progress.
#[derive(Clone, Debug)]
struct ReqState {
    /// Prompt and the tokens generated so far (what a re-prefill after preemption computes).
    tokens: Vec<u32>,
    gen_len: usize,
    generated: usize,
    arrival_step: u64,
    finished_step: Option<u64>,
}

/// A sequence in the running batch.
#[derive(Clone, Debug)]
struct Running {
    req: usize,
    seq: SeqId,
    /// Prompt tokens its last allocation found cached.
    cached_tokens: usize,
    /// False in the step it was admitted (it is prefilled then, and decodes from the next).
    prefilled: bool,
}

/// A sequence to prefill this step.
#[derive(Clone, Debug, PartialEq)]
pub struct PrefillItem {
    pub req: usize,
    pub seq: SeqId,
    /// Prompt length (the keys of its prefill).
    pub len: usize,
    /// Leading prompt tokens whose K/V are already in (shared or cached) pages.
    pub cached: usize,
}

impl PrefillItem {
    /// Tokens to compute (queries, and new K/V rows).
    pub fn suffix(&self) -> usize {
        self.len - self.cached
    }
}

/// A sequence decoding one token this step.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodeItem {
    pub req: usize,
    pub seq: SeqId,
    /// Tokens in the cache after this step's token (the decode's key count).
    pub len: usize,
    /// Prompt tokens its allocation found cached (it reads shared pages when > 0).
    pub cached: usize,
}

/// What the decode phase of a step runs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DecodePhase {
    pub items: Vec<DecodeItem>,
    /// Copy-on-write page copies to issue before the appends.
    pub copies: Vec<PageCopy>,
}

/// Counters of the scheduler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SchedStats {
    pub preemptions: u64,
    pub admissions: u64,
    pub finished: u64,
    /// Prompt tokens of all admissions (re-prefills after preemption included).
    pub prompt_tokens: u64,
    /// Of those, tokens computed (not found cached).
    pub prefill_tokens: u64,
    pub generated_tokens: u64,
}

/// Continuous batching over a [`BlockManager`], host only. A step is [`arrive`](Self::arrive),
/// [`admit`](Self::admit) (then prefill those), [`grow`](Self::grow) (then decode those) and
/// [`finish`](Self::finish).
pub struct Scheduler {
    cfg: SchedConfig,
    bm: BlockManager,
    reqs: Vec<ReqState>,
    waiting: VecDeque<usize>,
    /// In admission order: the last is the most recently admitted (the preemption victim).
    running: Vec<Running>,
    next_arrival: usize,
    step: u64,
    rng: StdRng,
    bm_time: Duration,
    stats: SchedStats,
}

impl Scheduler {
    pub fn new(cfg: SchedConfig, workload: &Workload) -> tessera::Result<Scheduler> {
        if cfg.max_batch == 0 {
            return Err(Error::invalid("max_batch", "must be at least 1"));
        }
        let need = largest_request_pages(workload, cfg.page_size);
        if cfg.num_pages < need {
            return Err(Error::invalid(
                "pages",
                format!(
                    "{} pages cannot hold the largest request ({need} pages of {} tokens at its end)",
                    cfg.num_pages, cfg.page_size
                ),
            ));
        }
        let bm = BlockManager::new(BlockManagerConfig {
            num_pages: cfg.num_pages,
            page_size: cfg.page_size,
            prefix_caching: true,
        })?;
        let reqs = workload
            .requests
            .iter()
            .map(|r| ReqState {
                tokens: r.prompt.clone(),
                gen_len: r.gen_len,
                generated: 0,
                arrival_step: r.arrival_step,
                finished_step: None,
            })
            .collect();
        Ok(Scheduler {
            rng: StdRng::seed_from_u64(cfg.seed ^ 0x746f_6b65_6e73),
            cfg,
            bm,
            reqs,
            waiting: VecDeque::new(),
            running: Vec::new(),
            next_arrival: 0,
            step: 0,
            bm_time: Duration::ZERO,
            stats: SchedStats::default(),
        })
    }

    pub fn step(&self) -> u64 {
        self.step
    }
    pub fn block_manager(&self) -> &BlockManager {
        &self.bm
    }
    pub fn stats(&self) -> &SchedStats {
        &self.stats
    }
    pub fn running(&self) -> usize {
        self.running.len()
    }
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }
    /// True when every request has finished.
    pub fn done(&self) -> bool {
        self.stats.finished as usize == self.reqs.len()
    }
    /// The block table of a live sequence.
    pub fn block_table(&self, seq: SeqId) -> tessera::Result<&[u32]> {
        self.bm
            .block_table(seq)
            .ok_or_else(|| Error::invalid("seq", format!("sequence {seq} is not live")))
    }
    /// Host time spent in block-manager calls since the last call.
    pub fn take_bm_time(&mut self) -> Duration {
        std::mem::take(&mut self.bm_time)
    }
    /// Steps from arrival to finish of every finished request.
    pub fn latency_steps(&self) -> Vec<f64> {
        self.reqs
            .iter()
            .filter_map(|r| r.finished_step.map(|f| (f - r.arrival_step) as f64))
            .collect()
    }
    /// The step each request finished at (`None`: not finished).
    #[cfg(test)]
    pub fn finished_steps(&self) -> Vec<Option<u64>> {
        self.reqs.iter().map(|r| r.finished_step).collect()
    }

    fn timed<T>(bm_time: &mut Duration, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let r = f();
        *bm_time += t.elapsed();
        r
    }

    /// Queues the requests that arrived by this step. When nothing runs or waits, skips ahead
    /// to the next arrival (idle steps are not simulated).
    pub fn arrive(&mut self) {
        if self.running.is_empty() && self.waiting.is_empty() {
            if let Some(r) = self.reqs.get(self.next_arrival) {
                self.step = self.step.max(r.arrival_step);
            }
        }
        while let Some(r) = self.reqs.get(self.next_arrival) {
            if r.arrival_step > self.step {
                break;
            }
            self.waiting.push_back(self.next_arrival);
            self.next_arrival += 1;
        }
    }

    /// Admits waiting requests in order (first come, first served: stops at the first that
    /// does not fit) and allocates their pages. Returns what to prefill.
    pub fn admit(&mut self) -> tessera::Result<Vec<PrefillItem>> {
        let mut items = Vec::new();
        let mut budget = 0usize;
        let watermark = (self.cfg.num_pages as f64 * WATERMARK_SHARE).ceil() as usize;
        while let Some(&r) = self.waiting.front() {
            if self.running.len() >= self.cfg.max_batch {
                break;
            }
            let len = self.reqs[r].tokens.len();
            if !items.is_empty() && budget + len > self.cfg.max_prefill_tokens {
                break;
            }
            let (bm, tokens, idle) = (&self.bm, &self.reqs[r].tokens, self.running.is_empty());
            let fits = Self::timed(&mut self.bm_time, || {
                bm.can_allocate(tokens)
                    && (idle || bm.num_free_pages() + bm.num_cached_pages() >= bm.pages_needed_for(len) + watermark)
            });
            if !fits {
                break;
            }
            let seq = r as SeqId;
            let bm = &mut self.bm;
            let tokens = &self.reqs[r].tokens;
            let a = Self::timed(&mut self.bm_time, || bm.allocate(seq, tokens))?;
            self.waiting.pop_front();
            self.running.push(Running {
                req: r,
                seq,
                cached_tokens: a.cached_tokens,
                prefilled: false,
            });
            self.stats.admissions += 1;
            self.stats.prompt_tokens += len as u64;
            self.stats.prefill_tokens += (len - a.cached_tokens) as u64;
            budget += len;
            items.push(PrefillItem {
                req: r,
                seq,
                len,
                cached: a.cached_tokens,
            });
        }
        Ok(items)
    }

    /// Preempts running sequence `idx`: frees it and queues its request first.
    fn preempt(&mut self, idx: usize) -> tessera::Result<()> {
        let victim = self.running.remove(idx);
        let bm = &mut self.bm;
        Self::timed(&mut self.bm_time, || bm.free(victim.seq))?;
        self.waiting.push_front(victim.req);
        self.stats.preemptions += 1;
        Ok(())
    }

    /// Appends one token to every sequence prefilled in an earlier step, preempting the most
    /// recently admitted sequence while the pool has no page for it. Returns what to decode.
    pub fn grow(&mut self) -> tessera::Result<DecodePhase> {
        let mut phase = DecodePhase::default();
        let mut new_tokens = Vec::new();
        let mut i = 0;
        while i < self.running.len() {
            if !self.running[i].prefilled {
                i += 1;
                continue;
            }
            let token: u32 = self.rng.random();
            let seq = self.running[i].seq;
            loop {
                let bm = &mut self.bm;
                match Self::timed(&mut self.bm_time, || bm.append_token(seq, token)) {
                    Ok(copy) => {
                        phase.copies.extend(copy);
                        new_tokens.push((i, token));
                        i += 1;
                        break;
                    }
                    Err(Error::OutOfPages { needed, available }) => {
                        if self.running.len() == 1 {
                            return Err(Error::invalid(
                                "pages",
                                format!(
                                    "a lone sequence needs {needed} more pages but {available} are available: \
                                     the pool is too small"
                                ),
                            ));
                        }
                        // the victim is the last running sequence: this one (then the loop
                        // ends) or one after it, which has not appended yet
                        let victim = self.running.len() - 1;
                        self.preempt(victim)?;
                        if victim == i {
                            break;
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        for (i, token) in new_tokens {
            let r = &self.running[i];
            let req = &mut self.reqs[r.req];
            req.tokens.push(token);
            req.generated += 1;
            self.stats.generated_tokens += 1;
            phase.items.push(DecodeItem {
                req: r.req,
                seq: r.seq,
                len: self.bm.seq_len(r.seq).unwrap_or(0),
                cached: r.cached_tokens,
            });
        }
        Ok(phase)
    }

    /// Frees the sequences that generated all their tokens and ends the step.
    pub fn finish(&mut self) -> tessera::Result<()> {
        let mut i = 0;
        while i < self.running.len() {
            let r = &self.running[i];
            let req = &self.reqs[r.req];
            if r.prefilled && req.generated >= req.gen_len {
                let r = self.running.remove(i);
                let bm = &mut self.bm;
                Self::timed(&mut self.bm_time, || bm.free(r.seq))?;
                self.reqs[r.req].finished_step = Some(self.step);
                self.stats.finished += 1;
            } else {
                i += 1;
            }
        }
        for r in &mut self.running {
            r.prefilled = true;
        }
        self.step += 1;
        Ok(())
    }

    /// A safe upper bound on the steps a run can take (guards against a scheduling bug).
    pub fn step_limit(&self) -> u64 {
        let last = self.reqs.last().map_or(0, |r| r.arrival_step);
        let work: u64 = self.reqs.iter().map(|r| r.gen_len as u64 + 1).sum();
        last + 20 * work + 1000
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve_sim::fixtures::{dry_run, sched_cfg, spec};
    use crate::serve_sim::workload::{generate_workload, largest_request_pages};

    #[test]
    fn dry_run_of_50_requests_keeps_the_invariants() {
        let w = generate_workload(&spec(50, 5)).unwrap();
        let cfg = sched_cfg(&w, 16, None, 5);
        let pages = cfg.num_pages;
        let (s, recs) = dry_run(&w, cfg);
        // every request finished, every generated token counted once
        assert!(s.done());
        assert!(s.finished_steps().iter().all(Option::is_some));
        let gen: usize = w.requests.iter().map(|r| r.gen_len).sum();
        assert_eq!(s.stats().generated_tokens as usize, gen);
        assert_eq!(recs.iter().map(|r| r.decode_seqs).sum::<usize>(), gen);
        // all pages free or cached at the end
        let bm = s.block_manager();
        assert_eq!(bm.num_used_pages(), 0);
        assert_eq!(bm.num_free_pages() + bm.num_cached_pages(), pages);
        assert_eq!(bm.sequences().count(), 0);
        bm.check_invariants().unwrap();
        // the system prompts hit
        let st = bm.stats();
        assert!(st.prefix_hit_tokens > 0 && st.prefix_hit_tokens < st.prefix_lookup_tokens);
        // the batch limit holds, and pages were used
        assert!(recs.iter().all(|r| r.running <= 16 && r.decode_seqs <= 16));
        assert!(recs.iter().any(|r| r.used_pages > pages / 2));
        // a request finishes no earlier than its generation length after arriving
        for (r, f) in w.requests.iter().zip(s.finished_steps()) {
            assert!(f.unwrap() >= r.arrival_step + r.gen_len as u64);
        }
    }

    #[test]
    fn tight_pools_preempt_evict_and_still_finish() {
        let w = generate_workload(&spec(60, 9)).unwrap();
        let tight = largest_request_pages(&w, 16) + 8;
        let (s, _) = dry_run(&w, sched_cfg(&w, 32, Some(tight), 9));
        assert!(s.done());
        assert!(s.stats().preemptions > 0, "{:?}", s.stats());
        assert!(s.block_manager().stats().evictions > 0);
        assert!(s.stats().admissions > 60);
        // a preempted request is prefilled again with its generated tokens: it hits its own
        // cached pages
        assert!(s.block_manager().stats().prefix_hit_tokens > 0);
        assert_eq!(s.block_manager().num_used_pages(), 0);
    }

    #[test]
    fn prefill_budget_and_batch_limit_hold() {
        let mut sp = spec(40, 2);
        sp.arrival_rate = 100.0; // everything arrives at once
        let w = generate_workload(&sp).unwrap();
        let mut cfg = sched_cfg(&w, 8, Some(100_000), 2);
        cfg.max_prefill_tokens = 1500;
        let mut s = Scheduler::new(cfg, &w).unwrap();
        let mut steps = 0;
        while !s.done() {
            s.arrive();
            let items = s.admit().unwrap();
            let keys: usize = items.iter().map(|i| i.len).sum();
            assert!(items.len() <= 1 || keys <= 1500, "{keys} prompt tokens in one step");
            assert!(s.running() <= 8);
            for it in &items {
                assert!(it.cached < it.len && it.cached % 16 == 0);
                assert_eq!(s.block_table(it.seq).unwrap().len(), it.len.div_ceil(16));
            }
            let d = s.grow().unwrap();
            for it in &d.items {
                assert_eq!(s.block_table(it.seq).unwrap().len(), it.len.div_ceil(16));
            }
            assert!(d.copies.is_empty(), "no forks: no copy-on-write");
            s.finish().unwrap();
            steps += 1;
            assert!(steps < 100_000);
        }
        assert_eq!(s.stats().preemptions, 0, "100k pages never run out");
    }

    #[test]
    fn runs_are_deterministic_in_the_seed() {
        let w = generate_workload(&spec(30, 4)).unwrap();
        let run = || {
            let (s, recs) = dry_run(&w, sched_cfg(&w, 8, None, 4));
            let key: Vec<_> = recs
                .iter()
                .map(|r| (r.step, r.prefill_tokens, r.decode_seqs, r.used_pages))
                .collect();
            (*s.stats(), *s.block_manager().stats(), key)
        };
        assert_eq!(run(), run());
    }
}
