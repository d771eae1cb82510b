//! `tessera serve-sim`: an end-to-end serving simulation of a Llama-3-8B-shaped attention stack
//! (32 layers, Hq = 32, Hkv = 8, D = 128) with continuous batching over the paged KV cache.
//!
//! Requests arrive in a Poisson process (per scheduler step), a share of them starting with one
//! of a few system prompts whose token ids they share exactly, so the block manager's chained
//! page hashes find them. Each step, vLLM-style and simple:
//!
//! 1. **Admit** waiting requests in arrival order while the batch has room, the step's prefill
//!    budget (`--max-prefill-tokens`, counted in prompt tokens) lasts and
//!    [`BlockManager::can_allocate`] says yes (once something runs, the prompt's pages, prefix
//!    hits not deducted, plus a watermark of 1% of the pool must be free or evictable, as in
//!    vLLM). [`BlockManager::allocate`] reports the prefix hits
//!    ([`Allocation::cached_tokens`](tessera::kvcache::block_manager::Allocation)).
//! 2. **Prefill** the admitted requests as one varlen batch per layer: queries are the uncached
//!    suffix of each prompt, keys the whole prompt (causal, bottom-right aligned), through
//!    [`AttentionPlan`]. The attention kernel needs contiguous K/V, so the keys come from a
//!    contiguous staging buffer of the full prompt, as an engine's QKV projection output would
//!    provide (tessera has no paged prefill yet). The suffix's new K/V rows are then written
//!    into the pages with one [`PagedKvCache::append`] per layer for the whole batch.
//! 3. **Decode** every sequence prefilled in an earlier step: [`BlockManager::append_token`]
//!    (copy-on-write copies go to [`PagedKvCache::copy_pages`] first), one [`PagedBatch`]
//!    update, a re-planned [`DecodePlan`], then per layer the append of the new token's K/V
//!    and the paged GQA decode. When the pool runs out of pages, the most recently admitted
//!    sequence is preempted: freed (its full pages stay cached) and put back at the front of
//!    the queue, to be prefilled again later with its prompt and the tokens generated so far.
//! 4. **Finish** the sequences that generated their `--gen-len` tokens: freed, their full
//!    pages stay cached for prefix reuse.
//!
//! Q/K/V are random fp16 values sliced from one fixed device pool (never zeros), at offsets
//! that change per step, layer and tensor. The staging K/V of a prompt and the K/V rows written
//! into its pages are different slices: only the shapes, the traffic and the block tables are
//! real, not the numbers of a model. GPU time is measured with CUDA events around each step's
//! prefill and decode work (one synchronisation each); host block-manager time and host
//! planning time (batch tables, plans, uploads) with `Instant`.
//!
//! The correctness guard compares, at one step (and every `--check N` steps), the layer-0
//! decode output of one running sequence (one with a prefix hit when there is one) with the
//! f64 CPU reference computed from K/V gathered out of the device pages by the block manager's
//! table: it proves the decode ran real attention over the pages the tables name.
//!
//! `--dry-run` runs the scheduler and the block manager alone (no device, no kernels) and
//! checks the block manager's invariants every step.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use tessera::attention::{AttentionOptions, AttentionPlan, AttentionProblem, AttentionTuning, VarlenBatch};
use tessera::check::compare;
use tessera::kvcache::block_manager::{BlockManager, BlockManagerConfig, PageCopy, SeqId};
use tessera::kvcache::decode::{DecodeOptions, DecodePlan};
use tessera::kvcache::reference::{decode_reference, gather_sequence};
use tessera::kvcache::{AppendBatch, KvCacheConfig, PagedBatch, PagedKvCache};
use tessera::runtime::{probe, Context, DeviceBuffer, EventTimer};
use tessera::testdata::{random_matrix, Dist};
use tessera::{DType, Error};

/// Query heads of the simulated model (Llama-3-8B).
pub const HEADS_Q: usize = 32;
/// KV heads.
pub const HEADS_KV: usize = 8;
/// Head dimension.
pub const HEAD_DIM: usize = 128;
/// Share of a full batch's peak page demand the default pool holds (so that pages run out:
/// cached pages are evicted and sequences preempted).
pub const DEFAULT_PAGE_SHARE: f64 = 0.4;
/// The default arrival rate is this factor times the rate that keeps `--max-batch` sequences
/// running (Little's law with the mean generation length as the service time in steps).
pub const DEFAULT_ARRIVAL_FACTOR: f64 = 1.25;
/// Pages kept free at admission while something runs (vLLM's default watermark), as a share
/// of the pool.
pub const WATERMARK_SHARE: f64 = 0.01;

/// An inclusive range of lengths, `LO..HI` on the command line (a single number `N` is `N..N`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LenRange {
    pub lo: usize,
    pub hi: usize,
}

impl std::fmt::Display for LenRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}..{}", self.lo, self.hi)
    }
}

/// Parses `LO..HI` (inclusive; `LO..=HI` is accepted too) or `N`.
pub fn parse_range(s: &str) -> Result<LenRange, String> {
    let num = |x: &str| {
        x.trim()
            .parse::<usize>()
            .map_err(|_| format!("`{x}` is not a length (expected LO..HI, e.g. 128..4096)"))
    };
    let (lo, hi) = match s.split_once("..") {
        Some((a, b)) => (num(a)?, num(b.strip_prefix('=').unwrap_or(b))?),
        None => {
            let n = num(s)?;
            (n, n)
        }
    };
    if lo == 0 || lo > hi {
        return Err(format!("range {s}: needs 1 <= LO <= HI"));
    }
    Ok(LenRange { lo, hi })
}

fn parse_cache_dtype(s: &str) -> Result<DType, String> {
    match s.to_ascii_lowercase().as_str() {
        "fp16" | "f16" => Ok(DType::F16),
        "fp8" | "fp8e4m3" | "e4m3" => Ok(DType::F8E4M3),
        _ => Err(format!("cache dtype `{s}`: fp16 or fp8 (e4m3)")),
    }
}

/// Options of `tessera serve-sim`.
#[derive(clap::Args, Clone, Debug)]
pub struct ServeSimArgs {
    /// Requests to serve.
    #[arg(long, default_value_t = 256)]
    pub requests: usize,
    /// Attention layers (each its own K/V pages; all share the block tables).
    #[arg(long, default_value_t = 32)]
    pub layers: usize,
    /// Most sequences running at once (prefilling or decoding).
    #[arg(long, default_value_t = 64)]
    pub max_batch: usize,
    /// KV cache pages [default: 40% of the pages a full batch of average requests holds at its
    /// peak, at least the largest request's; printed].
    #[arg(long)]
    pub pages: Option<usize>,
    /// Tokens per page.
    #[arg(long, default_value_t = 16)]
    pub page_size: usize,
    /// Prompt lengths, log-uniform in LO..HI (inclusive).
    #[arg(long, default_value = "128..4096", value_parser = parse_range)]
    pub prompt_len: LenRange,
    /// Generated tokens (decode steps) per request, uniform in LO..HI (inclusive).
    #[arg(long, default_value = "32..512", value_parser = parse_range)]
    pub gen_len: LenRange,
    /// Shared system prompts (0: none).
    #[arg(long, default_value_t = 4)]
    pub shared_prefixes: usize,
    /// Tokens of each system prompt.
    #[arg(long, default_value_t = 512)]
    pub prefix_len: usize,
    /// Share of the requests that start with a system prompt.
    #[arg(long, default_value_t = 0.6)]
    pub shared_fraction: f64,
    /// Mean arrivals per step of the Poisson process [default: 1.25 x max-batch / mean
    /// gen-len, so that more requests wait than the batch holds].
    #[arg(long)]
    pub arrival: Option<f64>,
    /// Most prompt tokens (cached prefix included) prefilled in one step; a longer prompt is
    /// prefilled alone.
    #[arg(long, default_value_t = 16384)]
    pub max_prefill_tokens: usize,
    /// Seed of the workload, the generated tokens and the device data (default:
    /// $TESSERA_SEED, else time-based; always printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// KV cache dtype: fp16 or fp8 (e4m3, scale 1; queries and prefill stay fp16).
    #[arg(long, default_value = "fp16", value_parser = parse_cache_dtype)]
    pub dtype: DType,
    /// Check a decode against the CPU reference every N steps (default: once, at the first
    /// decode step from step 64 on).
    #[arg(long, value_name = "N")]
    pub check: Option<u64>,
    /// Skip the correctness check.
    #[arg(long, conflicts_with = "check")]
    pub no_check: bool,
    /// Run only the host-side scheduler and block manager (no GPU, no kernels), checking the
    /// block manager's invariants every step.
    #[arg(long)]
    pub dry_run: bool,
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
}

// ---- workload ------------------------------------------------------------------------------

/// What the workload generator draws from.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadSpec {
    pub requests: usize,
    pub prompt_len: LenRange,
    pub gen_len: LenRange,
    pub shared_prefixes: usize,
    pub prefix_len: usize,
    pub shared_fraction: f64,
    /// Mean arrivals per step.
    pub arrival_rate: f64,
    pub seed: u64,
}

impl WorkloadSpec {
    /// Checks the ranges; errors name the option.
    pub fn validate(&self) -> Result<(), String> {
        if self.requests == 0 {
            return Err("--requests must be at least 1".into());
        }
        for (name, r) in [("--prompt-len", self.prompt_len), ("--gen-len", self.gen_len)] {
            if r.lo == 0 || r.lo > r.hi {
                return Err(format!("{name} {r}: needs 1 <= LO <= HI"));
            }
        }
        if !(0.0..=1.0).contains(&self.shared_fraction) {
            return Err(format!("--shared-fraction {} must be in 0..=1", self.shared_fraction));
        }
        if self.uses_prefixes() && (self.prefix_len == 0 || self.prefix_len >= self.prompt_len.hi) {
            return Err(format!(
                "--prefix-len {} must be in 1..{} (shorter than the longest prompt, {})",
                self.prefix_len, self.prompt_len.hi, self.prompt_len
            ));
        }
        if !(self.arrival_rate.is_finite() && self.arrival_rate > 0.0) {
            return Err(format!("--arrival {} must be finite and > 0", self.arrival_rate));
        }
        Ok(())
    }
    fn uses_prefixes(&self) -> bool {
        self.shared_prefixes > 0 && self.shared_fraction > 0.0
    }
}

/// One request of the workload.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// The step at which it arrives (non-decreasing over the requests).
    pub arrival_step: u64,
    /// Token ids; with a system prompt, its ids come first.
    pub prompt: Vec<u32>,
    /// Tokens to generate (decode steps).
    pub gen_len: usize,
    /// The system prompt it starts with.
    pub prefix: Option<usize>,
}

/// The generated requests and the system prompts they share.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    pub system_prompts: Vec<Vec<u32>>,
    pub requests: Vec<Request>,
}

impl Workload {
    /// Tokens a request holds at its end (prompt + generated).
    pub fn peak_tokens(r: &Request) -> usize {
        r.prompt.len() + r.gen_len
    }
}

/// Log-uniform integer in `lo..=hi`.
fn log_uniform(rng: &mut StdRng, lo: usize, hi: usize) -> usize {
    let (a, b) = ((lo as f64).ln(), ((hi + 1) as f64).ln());
    ((a + rng.random::<f64>() * (b - a)).exp().floor() as usize).clamp(lo, hi)
}

/// Draws the requests: prompt lengths log-uniform in `prompt_len`, generation lengths uniform
/// in `gen_len`, token ids uniform `u32`; with probability `shared_fraction` a prompt starts
/// with one of the `shared_prefixes` system prompts (chosen uniformly; its length is then drawn
/// from `max(lo, prefix_len + 1)..=hi`, so a user part always follows); arrival steps from a
/// Poisson process of `arrival_rate` per step (the first request arrives at step 0).
pub fn generate_workload(spec: &WorkloadSpec) -> Result<Workload, String> {
    spec.validate()?;
    let mut rng = StdRng::seed_from_u64(spec.seed ^ 0x7365_7276_655f_7369);
    let system_prompts: Vec<Vec<u32>> = if spec.uses_prefixes() {
        (0..spec.shared_prefixes)
            .map(|_| (0..spec.prefix_len).map(|_| rng.random()).collect())
            .collect()
    } else {
        Vec::new()
    };
    let mut t = 0.0f64;
    let mut requests = Vec::with_capacity(spec.requests);
    for i in 0..spec.requests {
        if i > 0 {
            // exponential inter-arrival times: a Poisson process of arrival_rate per step
            t += -(1.0 - rng.random::<f64>()).ln() / spec.arrival_rate;
        }
        let prefix = (!system_prompts.is_empty() && rng.random::<f64>() < spec.shared_fraction)
            .then(|| rng.random_range(0..system_prompts.len()));
        let prompt = match prefix {
            Some(p) => {
                let len = log_uniform(
                    &mut rng,
                    spec.prompt_len.lo.max(spec.prefix_len + 1),
                    spec.prompt_len.hi,
                );
                let mut v = system_prompts[p].clone();
                v.extend((spec.prefix_len..len).map(|_| rng.random::<u32>()));
                v
            }
            None => {
                let len = log_uniform(&mut rng, spec.prompt_len.lo, spec.prompt_len.hi);
                (0..len).map(|_| rng.random()).collect()
            }
        };
        let gen_len = rng.random_range(spec.gen_len.lo..=spec.gen_len.hi);
        requests.push(Request {
            arrival_step: t.floor() as u64,
            prompt,
            gen_len,
            prefix,
        });
    }
    Ok(Workload {
        system_prompts,
        requests,
    })
}

/// The default arrival rate for a batch of `max_batch` (see [`DEFAULT_ARRIVAL_FACTOR`]).
pub fn default_arrival_rate(max_batch: usize, gen_len: LenRange) -> f64 {
    let mean_gen = (gen_len.lo + gen_len.hi) as f64 / 2.0;
    DEFAULT_ARRIVAL_FACTOR * max_batch as f64 / mean_gen.max(1.0)
}

/// Pages of the largest request at its end.
pub fn largest_request_pages(w: &Workload, page_size: usize) -> usize {
    w.requests
        .iter()
        .map(|r| Workload::peak_tokens(r).div_ceil(page_size))
        .max()
        .unwrap_or(1)
}

/// The default pool: [`DEFAULT_PAGE_SHARE`] of `min(max_batch, requests)` times the mean
/// pages of a request at its end, and at least the largest request's pages. Returns
/// `(pages, full-batch peak)`.
pub fn default_pages(w: &Workload, max_batch: usize, page_size: usize) -> (usize, usize) {
    let n = w.requests.len().max(1);
    let mean = w
        .requests
        .iter()
        .map(|r| Workload::peak_tokens(r).div_ceil(page_size))
        .sum::<usize>() as f64
        / n as f64;
    let peak = (mean * max_batch.min(n) as f64).ceil() as usize;
    let pages = ((peak as f64 * DEFAULT_PAGE_SHARE).ceil() as usize).max(largest_request_pages(w, page_size));
    (pages, peak)
}

// ---- scheduler -----------------------------------------------------------------------------

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

// ---- driver --------------------------------------------------------------------------------

/// Timing of one phase as an engine ran it.
#[derive(Clone, Copy, Debug, Default)]
pub struct PhaseTiming {
    /// GPU time (CUDA events), `None` without a GPU.
    pub gpu_ms: Option<f64>,
    /// Host time spent planning and uploading (tables, plans, batch descriptions).
    pub plan: Duration,
}

/// What runs the phases of a step: the GPU, or nothing (dry run).
pub trait Engine {
    fn prefill(&mut self, sched: &Scheduler, items: &[PrefillItem]) -> tessera::Result<PhaseTiming>;
    fn decode(&mut self, sched: &Scheduler, phase: &DecodePhase) -> tessera::Result<PhaseTiming>;
}

/// The dry run: no device work.
pub struct DryEngine;

impl Engine for DryEngine {
    fn prefill(&mut self, _: &Scheduler, _: &[PrefillItem]) -> tessera::Result<PhaseTiming> {
        Ok(PhaseTiming::default())
    }
    fn decode(&mut self, _: &Scheduler, _: &DecodePhase) -> tessera::Result<PhaseTiming> {
        Ok(PhaseTiming::default())
    }
}

/// One step's numbers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepRecord {
    pub step: u64,
    pub prefill_seqs: usize,
    /// Tokens computed by the prefill (uncached suffixes).
    pub prefill_tokens: usize,
    pub decode_seqs: usize,
    pub prefill_ms: Option<f64>,
    pub decode_ms: Option<f64>,
    pub bm_us: f64,
    pub plan_us: f64,
    pub used_pages: usize,
    pub running: usize,
    pub waiting: usize,
}

/// Runs the scheduler to the end with `engine`, calling `on_step` after every step. With
/// `check_invariants`, the block manager's invariants are checked after every step.
pub fn simulate(
    sched: &mut Scheduler,
    engine: &mut dyn Engine,
    check_invariants: bool,
    mut on_step: impl FnMut(&Scheduler, &StepRecord),
) -> tessera::Result<Vec<StepRecord>> {
    let limit = sched.step_limit();
    let mut records = Vec::new();
    while !sched.done() {
        if sched.step() > limit {
            return Err(Error::invalid(
                "serve-sim",
                format!("no progress after {limit} steps (a scheduling bug)"),
            ));
        }
        sched.arrive();
        let mut rec = StepRecord {
            step: sched.step(),
            ..Default::default()
        };
        let mut plan = Duration::ZERO;
        let prefill = sched.admit()?;
        if !prefill.is_empty() {
            let t = engine.prefill(sched, &prefill)?;
            rec.prefill_ms = t.gpu_ms;
            plan += t.plan;
        }
        rec.prefill_seqs = prefill.len();
        rec.prefill_tokens = prefill.iter().map(PrefillItem::suffix).sum();
        let decode = sched.grow()?;
        if !decode.items.is_empty() {
            let t = engine.decode(sched, &decode)?;
            rec.decode_ms = t.gpu_ms;
            plan += t.plan;
        }
        rec.decode_seqs = decode.items.len();
        sched.finish()?;
        if check_invariants {
            sched
                .block_manager()
                .check_invariants()
                .map_err(|e| Error::invalid("block manager", format!("after step {}: {e}", rec.step)))?;
        }
        rec.bm_us = sched.take_bm_time().as_secs_f64() * 1e6;
        rec.plan_us = plan.as_secs_f64() * 1e6;
        rec.used_pages = sched.block_manager().num_used_pages();
        rec.running = sched.running();
        rec.waiting = sched.waiting();
        on_step(sched, &rec);
        records.push(rec);
    }
    Ok(records)
}

// ---- GPU engine ----------------------------------------------------------------------------

/// Which slice of the random pool a tensor takes.
#[derive(Clone, Copy)]
enum Slot {
    PrefillQ = 1,
    PrefillK,
    PrefillV,
    PrefillNewK,
    PrefillNewV,
    DecodeQ,
    DecodeNewK,
    DecodeNewV,
}

/// Offset (elements, a multiple of 64: 128-byte aligned) of an `elems`-element slice of a
/// `pool_len`-element pool, varying with (step, layer, slot).
fn pool_offset(seed: u64, pool_len: usize, step: u64, layer: usize, slot: Slot, elems: usize) -> usize {
    let mut h = seed ^ step.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (layer as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= (slot as u64).wrapping_mul(0x94d0_49bb_1331_11eb);
    h = (h ^ (h >> 31)).wrapping_mul(0xd6e8_feb8_6659_fd93);
    h ^= h >> 32;
    let room = (pool_len - elems) / 64;
    (h % (room as u64 + 1)) as usize * 64
}

/// When the correctness check runs.
#[derive(Clone, Copy, Debug)]
pub struct CheckPolicy {
    pub enabled: bool,
    /// The first check runs at the first decode step from this step on.
    pub first: u64,
    /// Then every this many steps.
    pub every: Option<u64>,
}

/// One correctness check.
#[derive(Clone, Debug, Serialize)]
pub struct CheckResult {
    pub step: u64,
    pub request: usize,
    pub seq_len: usize,
    /// Prompt tokens of the sequence that sit in shared (prefix-cached) pages.
    pub cached_prefix: usize,
    pub layer: usize,
    pub rel_l2: f64,
    pub max_abs_err: f64,
    pub nan: usize,
    pub budget: f64,
    pub passed: bool,
}

/// The device side: the paged cache of every layer, the random pool, plans and timers.
pub struct GpuEngine {
    ctx: Context,
    cfg: KvCacheConfig,
    layers: usize,
    max_batch: usize,
    seed: u64,
    cache: PagedKvCache,
    pool: DeviceBuffer<f16>,
    pool_host: Vec<f16>,
    prefill_out: DeviceBuffer<f16>,
    /// `[2][max_batch][Hq][D]`: layer 0 writes the first half (kept for the check), the other
    /// layers the second.
    decode_out: DeviceBuffer<f16>,
    prefill_batch: PagedBatch,
    decode_batch: PagedBatch,
    decode_plan: Option<DecodePlan>,
    decode_append: Option<AppendBatch>,
    timer: EventTimer,
    check: CheckPolicy,
    next_check: Option<u64>,
    pub checks: Vec<CheckResult>,
}

impl GpuEngine {
    /// Allocates the cache, the pool (filled with seeded normal values), the outputs and the
    /// batch tables. `max_prefill_rows`: the most prompt tokens one prefill step can hold.
    pub fn new(
        ctx: &Context,
        cfg: KvCacheConfig,
        max_batch: usize,
        max_seq_tokens: usize,
        max_prefill_rows: usize,
        seed: u64,
        check: CheckPolicy,
    ) -> tessera::Result<GpuEngine> {
        let layers = cfg.num_layers;
        let cache = PagedKvCache::new(ctx, cfg.clone())?;
        // the largest slice is a prefill's queries (keys are Hkv / Hq of that); the pool is
        // twice that, so slices move around
        let max_slice = max_prefill_rows * HEADS_Q * HEAD_DIM;
        let cols = tessera::testdata::BLOCK;
        let rows = (2 * max_slice).div_ceil(cols);
        let pool_host: Vec<f16> = random_matrix(seed, rows, cols, cols, Dist::Normal { std: 1.0 });
        let pool = ctx.upload(&pool_host)?;
        let max_pages = max_batch * cfg.pages_for(max_seq_tokens);
        Ok(GpuEngine {
            prefill_out: ctx.alloc(max_slice)?,
            decode_out: ctx.alloc(2 * max_batch * HEADS_Q * HEAD_DIM)?,
            prefill_batch: PagedBatch::new(ctx, max_batch, max_pages)?,
            decode_batch: PagedBatch::new(ctx, max_batch, max_pages)?,
            decode_plan: None,
            decode_append: None,
            timer: EventTimer::new(ctx)?,
            ctx: ctx.clone(),
            layers,
            max_batch,
            seed,
            cache,
            pool,
            pool_host,
            cfg,
            next_check: check.enabled.then_some(check.first),
            check,
            checks: Vec::new(),
        })
    }

    /// Device bytes of the pool, the outputs and the cache.
    pub fn device_bytes(&self) -> usize {
        self.pool.bytes()
            + self.prefill_out.bytes()
            + self.decode_out.bytes()
            + self.cfg.layer_bytes().unwrap_or(0) * self.layers
    }

    fn offset(&self, step: u64, layer: usize, slot: Slot, elems: usize) -> usize {
        pool_offset(self.seed, self.pool.len(), step, layer, slot, elems)
    }

    /// Compiles and loads every kernel the run uses (attention with and without split-KV,
    /// append, decode), so that the first steps do not time the JIT.
    pub fn warm_up(&mut self) -> tessera::Result<()> {
        let (hq, hkv, d) = (HEADS_Q, HEADS_KV, HEAD_DIM);
        let (nq, nk) = (64usize, 512usize);
        let vb = VarlenBatch::new(&self.ctx, &[0, nq as i32], &[0, nk as i32])?;
        let problem = AttentionProblem::varlen(&vb, hq, hkv, d, DType::F16);
        for splits in [1, 2] {
            let opts = AttentionOptions {
                causal: true,
                tuning: AttentionTuning {
                    num_splits: Some(splits),
                    ..Default::default()
                },
                ..Default::default()
            };
            let plan = AttentionPlan::new(&self.ctx, &problem, &opts)?;
            let q = self.pool.view_at(0, &[nq, hq, d], &[hq * d, d, 1])?;
            let kv = self.pool.view_at(0, &[nk, hkv, d], &[hkv * d, d, 1])?;
            let mut o = self.prefill_out.view_mut(&[nq, hq, d], &[hq * d, d, 1])?;
            plan.run(&q, &kv, &kv, &mut o, None, Some(&vb))?;
        }
        // one row into page 0 of layer 0 (no sequence holds it yet), then a decode over it
        self.decode_batch.update(&self.cfg, &[&[0]], &[1])?;
        let appended = AppendBatch::new(&self.ctx, &[1])?;
        let row = self.pool.view_at(0, &[1, hkv, d], &[hkv * d, d, 1])?;
        self.cache.append(0, &row, &row, &self.decode_batch, &appended)?;
        let plan = DecodePlan::new(&self.ctx, &self.cfg, hq, &[1], &DecodeOptions::default())?;
        let q = self.pool.view_at(0, &[1, 1, hq, d], &[hq * d, hq * d, d, 1])?;
        let mut o = self.decode_out.view_mut(&[1, 1, hq, d], &[hq * d, hq * d, d, 1])?;
        plan.run(&q, &self.cache, 0, &self.decode_batch, &mut o, None)?;
        self.ctx.synchronize()
    }

    fn check_due(&self, step: u64) -> bool {
        self.next_check.is_some_and(|s| step >= s)
    }

    /// Compares this step's layer-0 decode of one sequence with the f64 reference over K/V
    /// gathered from the device pages by the block manager's table.
    fn run_check(&self, sched: &Scheduler, phase: &DecodePhase, q_offset: usize) -> tessera::Result<CheckResult> {
        let step = sched.step();
        let items = &phase.items;
        let mut rng = StdRng::seed_from_u64(self.seed ^ step);
        let hits: Vec<usize> = (0..items.len()).filter(|&i| items[i].cached > 0).collect();
        let idx = if hits.is_empty() {
            rng.random_range(0..items.len())
        } else {
            hits[rng.random_range(0..hits.len())]
        };
        let it = &items[idx];
        let (hq, hkv, d) = (HEADS_Q, HEADS_KV, HEAD_DIM);
        let layer = self.cache.layer(0)?.to_host()?;
        let scales = match self.cfg.dtype {
            DType::F8E4M3 => Some(self.cache.scales(0)?.to_host()?),
            _ => None,
        };
        let table: Vec<i32> = sched.block_table(it.seq)?.iter().map(|&p| p as i32).collect();
        let (k, v) = gather_sequence(&self.cfg, &layer, scales.as_deref(), &table, it.len);
        let q0 = q_offset + idx * hq * d;
        let q: Vec<f64> = self.pool_host[q0..q0 + hq * d].iter().map(|x| x.to_f64()).collect();
        let want = decode_reference(&q, &[k], &[v], 1, hq, hkv, d, 1.0 / (d as f64).sqrt());
        let out = self.decode_out.to_host()?;
        let got: Vec<f64> = out[idx * hq * d..(idx + 1) * hq * d]
            .iter()
            .map(|x| x.to_f64())
            .collect();
        let cmp = compare(&got, &want.o, 1e-2, 1e-2);
        // the reference reads the same (dequantised) cache values, so the query dtype's budget
        let budget = DType::F16.rel_l2_budget();
        Ok(CheckResult {
            step,
            request: it.req,
            seq_len: it.len,
            cached_prefix: it.cached,
            layer: 0,
            rel_l2: cmp.rel_l2,
            max_abs_err: cmp.max_abs_err,
            nan: cmp.nan_count,
            budget,
            passed: cmp.passes(budget),
        })
    }
}

impl Engine for GpuEngine {
    fn prefill(&mut self, sched: &Scheduler, items: &[PrefillItem]) -> tessera::Result<PhaseTiming> {
        let t0 = Instant::now();
        let (hq, hkv, d) = (HEADS_Q, HEADS_KV, HEAD_DIM);
        let step = sched.step();
        let (mut cu_q, mut cu_k) = (vec![0i32], vec![0i32]);
        for it in items {
            cu_q.push(cu_q[cu_q.len() - 1] + it.suffix() as i32);
            cu_k.push(cu_k[cu_k.len() - 1] + it.len as i32);
        }
        let (nq, nk) = (cu_q[items.len()] as usize, cu_k[items.len()] as usize);
        let tables = items
            .iter()
            .map(|it| sched.block_table(it.seq))
            .collect::<tessera::Result<Vec<_>>>()?;
        let lens: Vec<usize> = items.iter().map(|it| it.len).collect();
        self.prefill_batch.update(&self.cfg, &tables, &lens)?;
        let counts: Vec<usize> = items.iter().map(PrefillItem::suffix).collect();
        let appended = AppendBatch::new(&self.ctx, &counts)?;
        let vb = VarlenBatch::new(&self.ctx, &cu_q, &cu_k)?;
        let problem = AttentionProblem::varlen(&vb, hq, hkv, d, DType::F16);
        let opts = AttentionOptions {
            causal: true,
            ..Default::default()
        };
        let plan = AttentionPlan::new(&self.ctx, &problem, &opts)?;
        let offsets: Vec<[usize; 5]> = (0..self.layers)
            .map(|l| {
                [
                    self.offset(step, l, Slot::PrefillQ, nq * hq * d),
                    self.offset(step, l, Slot::PrefillK, nk * hkv * d),
                    self.offset(step, l, Slot::PrefillV, nk * hkv * d),
                    self.offset(step, l, Slot::PrefillNewK, nq * hkv * d),
                    self.offset(step, l, Slot::PrefillNewV, nq * hkv * d),
                ]
            })
            .collect();
        let plan_time = t0.elapsed();

        let (q_st, kv_st) = ([hq * d, d, 1], [hkv * d, d, 1]);
        self.timer.start()?;
        for (l, off) in offsets.iter().enumerate() {
            let q = self.pool.view_at(off[0], &[nq, hq, d], &q_st)?;
            let k = self.pool.view_at(off[1], &[nk, hkv, d], &kv_st)?;
            let v = self.pool.view_at(off[2], &[nk, hkv, d], &kv_st)?;
            let mut o = self.prefill_out.view_mut(&[nq, hq, d], &q_st)?;
            plan.run(&q, &k, &v, &mut o, None, Some(&vb))?;
            let new_k = self.pool.view_at(off[3], &[nq, hkv, d], &kv_st)?;
            let new_v = self.pool.view_at(off[4], &[nq, hkv, d], &kv_st)?;
            self.cache.append(l, &new_k, &new_v, &self.prefill_batch, &appended)?;
        }
        let ms = self.timer.stop_ms()?;
        Ok(PhaseTiming {
            gpu_ms: Some(ms),
            plan: plan_time,
        })
    }

    fn decode(&mut self, sched: &Scheduler, phase: &DecodePhase) -> tessera::Result<PhaseTiming> {
        let t0 = Instant::now();
        let (hq, hkv, d) = (HEADS_Q, HEADS_KV, HEAD_DIM);
        let step = sched.step();
        let items = &phase.items;
        let b = items.len();
        let tables = items
            .iter()
            .map(|it| sched.block_table(it.seq))
            .collect::<tessera::Result<Vec<_>>>()?;
        let lens: Vec<usize> = items.iter().map(|it| it.len).collect();
        self.decode_batch.update(&self.cfg, &tables, &lens)?;
        if let Some(p) = self.decode_plan.as_mut().filter(|p| p.batch() == b) {
            p.update(&lens)?;
        } else {
            self.decode_plan = Some(DecodePlan::new(
                &self.ctx,
                &self.cfg,
                hq,
                &lens,
                &DecodeOptions::default(),
            )?);
        }
        if self.decode_append.as_ref().is_none_or(|a| a.batch() != b) {
            self.decode_append = Some(AppendBatch::new(&self.ctx, &vec![1; b])?);
        }
        let offsets: Vec<[usize; 3]> = (0..self.layers)
            .map(|l| {
                [
                    self.offset(step, l, Slot::DecodeQ, b * hq * d),
                    self.offset(step, l, Slot::DecodeNewK, b * hkv * d),
                    self.offset(step, l, Slot::DecodeNewV, b * hkv * d),
                ]
            })
            .collect();
        let plan_time = t0.elapsed();

        let check = self.check_due(step);
        if check {
            self.decode_out.fill_bytes(0xff)?; // NaN: an unwritten output fails the check
        }
        let (Some(plan), Some(appended)) = (&self.decode_plan, &self.decode_append) else {
            return Err(Error::invalid("decode", "no plan"));
        };
        let shape = [b, 1, hq, d];
        let q_st = [hq * d, hq * d, d, 1];
        let kv_st = [hkv * d, d, 1];
        let half = self.max_batch * hq * d;
        self.timer.start()?;
        if !phase.copies.is_empty() {
            self.cache.copy_pages(&phase.copies)?;
        }
        for (l, off) in offsets.iter().enumerate() {
            let new_k = self.pool.view_at(off[1], &[b, hkv, d], &kv_st)?;
            let new_v = self.pool.view_at(off[2], &[b, hkv, d], &kv_st)?;
            self.cache.append(l, &new_k, &new_v, &self.decode_batch, appended)?;
            let q = self.pool.view_at(off[0], &shape, &q_st)?;
            let mut o = self
                .decode_out
                .view_mut_at(if l == 0 { 0 } else { half }, &shape, &q_st)?;
            plan.run(&q, &self.cache, l, &self.decode_batch, &mut o, None)?;
        }
        let ms = self.timer.stop_ms()?;
        if check {
            let r = self.run_check(sched, phase, offsets[0][0])?;
            self.checks.push(r);
            self.next_check = self.check.every.map(|n| step + n.max(1));
        }
        Ok(PhaseTiming {
            gpu_ms: Some(ms),
            plan: plan_time,
        })
    }
}

// ---- report --------------------------------------------------------------------------------

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

// ---- command -------------------------------------------------------------------------------

/// `tessera serve-sim`. Returns false when a check failed or a request did not finish.
pub fn run(args: &ServeSimArgs, command_line: &str) -> Result<bool, String> {
    if args.layers == 0 {
        return Err("--layers must be at least 1".into());
    }
    if args.max_batch == 0 {
        return Err("--max-batch must be at least 1".into());
    }
    // the GPU first: without one, say so and stop before any work
    let ctx = if args.dry_run {
        None
    } else {
        let no_gpu = match probe::driver() {
            Ok(d) if d.device_count > 0 => None,
            Ok(_) => Some("the CUDA driver reports no device".to_string()),
            Err(e) => Some(e.to_string()),
        };
        if let Some(why) = no_gpu {
            println!("serve-sim: needs a GPU, and none is usable here: {why}");
            println!(
                "serve-sim: `tessera serve-sim --dry-run` runs the scheduler and block manager alone (no kernels)."
            );
            return Ok(true);
        }
        Some(Context::new(args.device).map_err(|e| e.to_string())?)
    };
    let seed = match args.seed {
        Some(s) => s,
        None => tessera::testdata::seed_from_env_or_time().map_err(|e| e.to_string())?,
    };
    let arrival = args
        .arrival
        .unwrap_or_else(|| default_arrival_rate(args.max_batch, args.gen_len));
    let spec = WorkloadSpec {
        requests: args.requests,
        prompt_len: args.prompt_len,
        gen_len: args.gen_len,
        shared_prefixes: args.shared_prefixes,
        prefix_len: args.prefix_len,
        shared_fraction: args.shared_fraction,
        arrival_rate: arrival,
        seed,
    };
    let workload = generate_workload(&spec)?;
    let (auto_pages, peak) = default_pages(&workload, args.max_batch, args.page_size);
    let pages = args.pages.unwrap_or(auto_pages);
    let cfg = KvCacheConfig {
        num_pages: pages,
        page_size: args.page_size,
        heads_kv: HEADS_KV,
        head_dim: HEAD_DIM,
        dtype: args.dtype,
        num_layers: args.layers,
        fp8_scale: 1.0,
    };
    cfg.validate().map_err(|e| e.to_string())?;
    let max_seq = workload.requests.iter().map(Workload::peak_tokens).max().unwrap_or(1);
    let max_prefill_rows = args.max_prefill_tokens.max(max_seq);
    let sched_cfg = SchedConfig {
        num_pages: pages,
        page_size: args.page_size,
        max_batch: args.max_batch,
        max_prefill_tokens: args.max_prefill_tokens,
        seed,
    };
    let mut sched = Scheduler::new(sched_cfg, &workload).map_err(|e| e.to_string())?;

    let dtype_name = if args.dtype == DType::F8E4M3 { "fp8" } else { "fp16" };
    match &ctx {
        Some(c) => println!(
            "serve-sim: device {} ({}), seed {seed} (replay with --seed {seed})",
            c.info().name,
            c.arch()
        ),
        None => println!("serve-sim: dry run (scheduler and block manager only, no kernels), seed {seed}"),
    }
    println!(
        "model: {} layers, Hq {HEADS_Q}, Hkv {HEADS_KV}, D {HEAD_DIM}, {dtype_name} KV cache, pages of {} tokens",
        args.layers, args.page_size
    );
    let shared = workload.requests.iter().filter(|r| r.prefix.is_some()).count();
    println!(
        "workload: {} requests, prompts {} (log-uniform), generation {} (uniform), {} of them after one of {} \
         system prompts of {} tokens, Poisson arrivals {:.3}/step{}",
        args.requests,
        args.prompt_len,
        args.gen_len,
        shared,
        workload.system_prompts.len(),
        args.prefix_len,
        arrival,
        if args.arrival.is_none() { " (auto)" } else { "" }
    );
    let layer_mib = cfg.layer_bytes().unwrap_or(0) as f64 / (1 << 20) as f64;
    println!(
        "KV cache: {pages} pages ({} tokens){}, {:.0} MiB per layer, {:.2} GiB for {} layers; batch <= {}, \
         prefill <= {} prompt tokens per step",
        pages * args.page_size,
        if args.pages.is_none() {
            format!(
                " (auto: {:.0}% of the {peak}-page peak of a full batch of mean requests)",
                DEFAULT_PAGE_SHARE * 100.0
            )
        } else {
            String::new()
        },
        layer_mib,
        layer_mib * args.layers as f64 / 1024.0,
        args.layers,
        args.max_batch,
        args.max_prefill_tokens
    );

    let mut gpu_engine = None;
    let mut jit = None;
    if let Some(c) = &ctx {
        let check = CheckPolicy {
            enabled: !args.no_check,
            first: if args.check.is_some() { 0 } else { 64 },
            every: args.check,
        };
        let mut g = GpuEngine::new(c, cfg.clone(), args.max_batch, max_seq, max_prefill_rows, seed, check)
            .map_err(|e| e.to_string())?;
        println!(
            "device memory: {:.2} GiB (cache, random pool, outputs); compiling/loading kernels...",
            g.device_bytes() as f64 / (1u64 << 30) as f64
        );
        let t = Instant::now();
        g.warm_up().map_err(|e| e.to_string())?;
        jit = Some(t.elapsed());
        gpu_engine = Some(g);
    }
    let mut dry_engine = DryEngine;
    let engine: &mut dyn Engine = match gpu_engine.as_mut() {
        Some(g) => g,
        None => &mut dry_engine,
    };

    let pb = crate::progress(args.requests, "serve-sim");
    let t = Instant::now();
    let records = simulate(&mut sched, engine, ctx.is_none(), |s, r| {
        pb.set_position(s.stats().finished);
        if r.step % 16 == 0 {
            pb.set_message(format!(
                "step {} running {} waiting {} pages {}/{}",
                r.step, r.running, r.waiting, r.used_pages, pages
            ));
        }
    })
    .map_err(|e| {
        pb.abandon();
        e.to_string()
    })?;
    let wall = t.elapsed();
    pb.finish_and_clear();

    let checks = gpu_engine.map(|g| g.checks).unwrap_or_default();
    let settings = SimSettings {
        layers: args.layers,
        heads_q: HEADS_Q,
        heads_kv: HEADS_KV,
        head_dim: HEAD_DIM,
        cache_dtype: dtype_name.into(),
        page_size: args.page_size,
        pages,
        pages_auto: args.pages.is_none(),
        max_batch: args.max_batch,
        max_prefill_tokens: args.max_prefill_tokens,
        requests: args.requests,
        prompt_len: args.prompt_len,
        gen_len: args.gen_len,
        shared_prefixes: workload.system_prompts.len(),
        prefix_len: args.prefix_len,
        shared_fraction: args.shared_fraction,
        arrival_per_step: arrival,
        seed,
    };
    let gpu = ctx.as_ref().map(|c| c.info().name.clone());
    let report = SimReport::new(command_line, gpu, settings, &sched, &records, wall, jit, checks);
    println!(
        "\nserve-sim results{}:",
        if report.dry_run { " (dry run: no GPU times)" } else { "" }
    );
    print!("{}", report.table());
    if ctx.is_some() && !args.no_check && report.checks.is_empty() {
        println!("  check                  none ran (no decode step from step 64 on; use --check N)");
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
        println!("serve-sim: wrote {}", path.display());
    }
    Ok(report.ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(requests: usize, seed: u64) -> WorkloadSpec {
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

    fn sched_cfg(w: &Workload, max_batch: usize, pages: Option<usize>, seed: u64) -> SchedConfig {
        SchedConfig {
            num_pages: pages.unwrap_or_else(|| default_pages(w, max_batch, 16).0),
            page_size: 16,
            max_batch,
            max_prefill_tokens: 4096,
            seed,
        }
    }

    /// Runs a dry simulation with invariant checks every step.
    fn dry_run(w: &Workload, cfg: SchedConfig) -> (Scheduler, Vec<StepRecord>) {
        let mut s = Scheduler::new(cfg, w).unwrap();
        let recs = simulate(&mut s, &mut DryEngine, true, |_, _| {}).unwrap();
        (s, recs)
    }

    #[test]
    fn ranges_parse() {
        assert_eq!(parse_range("128..4096"), Ok(LenRange { lo: 128, hi: 4096 }));
        assert_eq!(parse_range("1..=8"), Ok(LenRange { lo: 1, hi: 8 }));
        assert_eq!(parse_range("64"), Ok(LenRange { lo: 64, hi: 64 }));
        assert!(parse_range("0..8").is_err());
        assert!(parse_range("9..8").is_err());
        assert!(parse_range("a..8").is_err());
        assert_eq!(parse_cache_dtype("fp8"), Ok(DType::F8E4M3));
        assert!(parse_cache_dtype("bf16").is_err());
    }

    #[test]
    fn shared_prefixes_share_token_ids_exactly() {
        let w = generate_workload(&spec(400, 7)).unwrap();
        assert_eq!(w.system_prompts.len(), 3);
        let mut per_prefix = [0usize; 3];
        for r in &w.requests {
            if let Some(p) = r.prefix {
                assert!(r.prompt.len() > 128, "a user part follows the system prompt");
                assert_eq!(&r.prompt[..128], &w.system_prompts[p][..]);
                per_prefix[p] += 1;
            }
        }
        // every system prompt is used, and the shared share is near 60%
        assert!(per_prefix.iter().all(|&n| n > 50), "{per_prefix:?}");
        let shared: usize = per_prefix.iter().sum();
        assert!((200..=280).contains(&shared), "{shared} of 400 shared");
        // distinct system prompts, and unshared prompts do not start with one
        assert_ne!(w.system_prompts[0], w.system_prompts[1]);
        for r in w
            .requests
            .iter()
            .filter(|r| r.prefix.is_none() && r.prompt.len() >= 128)
        {
            assert!(w.system_prompts.iter().all(|s| r.prompt[..128] != s[..]));
        }
    }

    #[test]
    fn lengths_and_arrivals_in_range() {
        let s = spec(500, 11);
        let w = generate_workload(&s).unwrap();
        assert_eq!(w.requests.len(), 500);
        let mut short = 0;
        for r in &w.requests {
            assert!((s.prompt_len.lo..=s.prompt_len.hi).contains(&r.prompt.len()));
            assert!((s.gen_len.lo..=s.gen_len.hi).contains(&r.gen_len));
            short += (r.prompt.len() < 181) as usize; // log-uniform: half the unshared ones
        }
        assert!(short > 60, "log-uniform lengths: {short} short prompts");
        assert_eq!(w.requests[0].arrival_step, 0);
        assert!(w.requests.windows(2).all(|p| p[0].arrival_step <= p[1].arrival_step));
        // 500 arrivals at 1 per step take about 500 steps
        let last = w.requests[499].arrival_step;
        assert!((400..600).contains(&last), "last arrival at step {last}");
        // deterministic in the seed
        assert_eq!(generate_workload(&s).unwrap(), w);
        assert_ne!(generate_workload(&spec(500, 12)).unwrap(), w);
    }

    #[test]
    fn bad_workload_options_are_rejected() {
        let mut s = spec(10, 1);
        s.prefix_len = 1024;
        assert!(generate_workload(&s).unwrap_err().contains("--prefix-len"));
        let mut s = spec(10, 1);
        s.arrival_rate = 0.0;
        assert!(generate_workload(&s).is_err());
        let mut s = spec(0, 1);
        s.requests = 0;
        assert!(generate_workload(&s).is_err());
        // no prefixes: any prefix length goes
        let mut s = spec(10, 1);
        s.shared_prefixes = 0;
        s.prefix_len = 5000;
        let w = generate_workload(&s).unwrap();
        assert!(w.system_prompts.is_empty() && w.requests.iter().all(|r| r.prefix.is_none()));
    }

    #[test]
    fn default_pages_hold_the_largest_request() {
        let w = generate_workload(&spec(50, 3)).unwrap();
        let (pages, peak) = default_pages(&w, 16, 16);
        assert!(pages >= largest_request_pages(&w, 16));
        assert!(pages < peak, "{pages} of {peak}");
        let cfg = SchedConfig {
            num_pages: largest_request_pages(&w, 16) - 1,
            ..sched_cfg(&w, 16, None, 3)
        };
        assert!(Scheduler::new(cfg, &w).is_err());
    }

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

    #[test]
    fn pool_offsets_stay_inside_and_aligned() {
        for step in 0..50 {
            for l in 0..4 {
                let off = pool_offset(1, 10_000, step, l, Slot::DecodeQ, 4096);
                assert!(off % 64 == 0 && off + 4096 <= 10_000);
            }
        }
        assert_eq!(pool_offset(1, 4096, 3, 0, Slot::PrefillK, 4096), 0);
        let a = pool_offset(1, 1 << 20, 3, 0, Slot::PrefillK, 4096);
        let b = pool_offset(1, 1 << 20, 3, 1, Slot::PrefillK, 4096);
        assert_ne!(a, b, "layers read different slices");
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: ServeSimArgs,
    }

    #[test]
    fn options_parse_with_their_defaults() {
        use clap::{CommandFactory, Parser};
        Cli::command().debug_assert();
        let a = Cli::try_parse_from(["serve-sim"]).unwrap().args;
        assert_eq!((a.requests, a.layers, a.max_batch, a.page_size), (256, 32, 64, 16));
        assert_eq!(a.prompt_len, LenRange { lo: 128, hi: 4096 });
        assert_eq!(a.gen_len, LenRange { lo: 32, hi: 512 });
        assert_eq!((a.shared_prefixes, a.prefix_len, a.shared_fraction), (4, 512, 0.6));
        assert_eq!(a.dtype, DType::F16);
        assert!(a.pages.is_none() && a.arrival.is_none() && a.check.is_none() && !a.dry_run);
        let a = Cli::try_parse_from([
            "serve-sim",
            "--dtype",
            "fp8",
            "--prompt-len",
            "64..=128",
            "--check",
            "10",
        ])
        .unwrap()
        .args;
        assert_eq!((a.dtype, a.prompt_len.hi, a.check), (DType::F8E4M3, 128, Some(10)));
        assert!(Cli::try_parse_from(["serve-sim", "--check", "5", "--no-check"]).is_err());
        assert!(Cli::try_parse_from(["serve-sim", "--gen-len", "9..3"]).is_err());
    }

    #[test]
    fn dry_run_command_writes_the_report() {
        use clap::Parser;
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("sim.json");
        let json_arg = json.to_str().unwrap();
        let argv = [
            "serve-sim",
            "--dry-run",
            "--requests",
            "24",
            "--max-batch",
            "8",
            "--prompt-len",
            "64..512",
            "--gen-len",
            "4..32",
            "--prefix-len",
            "64",
            "--seed",
            "3",
            "--json",
            json_arg,
        ];
        let a = Cli::try_parse_from(argv).unwrap().args;
        assert_eq!(run(&a, "test"), Ok(true));
        let j: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(j["finished"], 24);
        assert_eq!(j["dry_run"], true);
        assert_eq!(j["final_pages"]["used"], 0);
        assert!(j["decode_tokens_per_s"].is_null());
        assert!(j["host_block_manager_us"]["mean"].as_f64().unwrap() > 0.0);
        // the same seed, the same schedule
        let b = Cli::try_parse_from(argv).unwrap().args;
        assert_eq!(run(&b, "test"), Ok(true));
        let k: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        for key in ["steps", "prefix_hit_tokens", "evictions", "preemptions", "pages_used"] {
            assert_eq!(j[key], k[key], "{key}");
        }
    }

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
