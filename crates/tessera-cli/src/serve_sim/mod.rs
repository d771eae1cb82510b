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
//!
//! [`BlockManager::can_allocate`]: tessera::kvcache::block_manager::BlockManager::can_allocate
//! [`BlockManager::allocate`]: tessera::kvcache::block_manager::BlockManager::allocate
//! [`BlockManager::append_token`]: tessera::kvcache::block_manager::BlockManager::append_token
//! [`AttentionPlan`]: tessera::attention::AttentionPlan
//! [`PagedKvCache::append`]: tessera::kvcache::PagedKvCache::append
//! [`PagedKvCache::copy_pages`]: tessera::kvcache::PagedKvCache::copy_pages
//! [`PagedBatch`]: tessera::kvcache::PagedBatch
//! [`DecodePlan`]: tessera::kvcache::decode::DecodePlan

mod engine;
#[cfg(test)]
mod fixtures;
mod report;
mod scheduler;
mod workload;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tessera::kvcache::KvCacheConfig;
use tessera::runtime::{probe, Context};
use tessera::{DType, Error};

use engine::{CheckPolicy, DryEngine, Engine, GpuEngine};
use report::{SimReport, SimSettings};
use scheduler::{PrefillItem, SchedConfig, Scheduler};
use workload::{
    default_arrival_rate, default_pages, generate_workload, parse_range, LenRange, Workload, WorkloadSpec,
    DEFAULT_PAGE_SHARE,
};

/// Query heads of the simulated model (Llama-3-8B).
pub const HEADS_Q: usize = 32;
/// KV heads.
pub const HEADS_KV: usize = 8;
/// Head dimension.
pub const HEAD_DIM: usize = 128;

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

// ---- driver --------------------------------------------------------------------------------

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
}
