//! `tessera`: verify and benchmark tessera's GPU operators, or, without a GPU, run the CPU
//! reference path and say what is missing.

mod cpu;
mod lsmr;
mod report;
mod serve_sim;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use tessera::harness::Chart;
use tessera::registry;
use tessera::runtime::{probe, timing, Context, TimingOptions};

use report::{BenchReport, BenchRow};

#[derive(Parser)]
#[command(
    name = "tessera",
    version,
    about = "GPU operators for LLM inference: verify, benchmark, inspect."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Driver, CUDA, device and NVRTC versions, and the kernel cache directory.
    Info,
    /// Checks operators against their f64 CPU references on fresh random inputs.
    Verify {
        /// Operators (default: all).
        ops: Vec<String>,
        /// A small case set (for compute-sanitizer).
        #[arg(long)]
        quick: bool,
        /// Only cases whose name contains this text, case-insensitive (e.g. "sm80 bf16"); a
        /// trailing `$` anchors it at the end of the name.
        #[arg(long)]
        filter: Option<String>,
        /// Seed for the random inputs (default: $TESSERA_SEED, else time-based; always printed).
        #[arg(long)]
        seed: Option<u64>,
        /// GPU ordinal.
        #[arg(long, default_value_t = 0)]
        device: usize,
    },
    /// Compiles every kernel variant of the operators with NVRTC for the given architectures
    /// (no GPU needed) into the kernel cache, and reports registers and spills.
    Compile {
        /// Operators (default: all).
        ops: Vec<String>,
        /// Target architectures, comma separated (default: sm_80,sm_86,sm_89,sm_90a).
        #[arg(long, value_delimiter = ',')]
        arch: Vec<String>,
        /// Print every variant, not just the summary.
        #[arg(long)]
        verbose: bool,
        /// Compile only kernels whose name contains every given text, case-insensitive (e.g.
        /// `--filter hopper --filter d128`); a trailing `$` anchors one at the end of the name.
        #[arg(long)]
        filter: Vec<String>,
    },
    /// Times operators against their baselines (CUDA events, median of 7 groups; with --rounds,
    /// the median of several passes).
    Bench {
        /// Operators (default: all).
        ops: Vec<String>,
        /// Fewer shapes and a smaller copy roofline.
        #[arg(long)]
        quick: bool,
        /// Write <DIR>/<op>.json and <DIR>/<op>.png.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Also run the Python baselines (torch, ...) on the same shapes in this run.
        #[arg(long)]
        baselines: bool,
        /// Only cases whose name contains this text, case-insensitive (e.g. "fp16 32768x128"); a
        /// trailing `$` anchors it at the end of the name ("D128 tessera$": not tessera-sm80).
        #[arg(long)]
        filter: Option<String>,
        #[arg(long)]
        seed: Option<u64>,
        /// Repeat ours and the baselines this many times, in turn, and report each row's median
        /// round (every round's time goes into the JSON as `rounds_ms`): one pass can catch a
        /// baseline in a slow or fast spell of the board's power management.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
        rounds: u32,
        /// A Matrix Market file (`.mtx`) for the operators that take a matrix (sparse): they
        /// benchmark it (and its transpose) instead of their synthetic matrices. Passed to them
        /// as TESSERA_BENCH_MATRIX.
        #[arg(long)]
        matrix: Option<PathBuf>,
        /// Time short bursts from a rested board (a 2 s idle, 20 ms of warm-up, 7 groups of
        /// ~2 ms), as triton's do_bench and most published numbers do, instead of the default
        /// sustained state (500 ms of warm-up first, so the board's power cap has acted). Ours
        /// and the baselines are timed alike either way; the rooflines too.
        #[arg(long)]
        burst: bool,
        #[arg(long, default_value_t = 0)]
        device: usize,
    },
    /// Merges bench reports of one operator (the parts of a run done in filtered steps) into
    /// <OUT>/<op>.json and <OUT>/<op>.png and prints the table; no GPU needed. A later file's
    /// row replaces an earlier one of the same case and impl; reports of different GPUs or
    /// timing modes are refused.
    Report {
        /// `tessera bench --json` files of one operator, in order.
        #[arg(required = true)]
        reports: Vec<PathBuf>,
        /// Folder of the merged `<op>.json` and `<op>.png`.
        #[arg(long)]
        out: PathBuf,
        /// The operator (its chart style and file names; default: the first file's stem).
        #[arg(long)]
        op: Option<String>,
    },
    /// End-to-end serving simulation: a 32-layer Llama-3-8B-shaped attention stack with
    /// continuous batching over the paged KV cache (prefix sharing, eviction, preemption).
    ServeSim(serve_sim::ServeSimArgs),
    /// Solves min ||A x - b||^2 + damp^2 ||x||^2 by LSMR (SciPy's options and stopping rules)
    /// for Matrix Market A and b, on the GPU when present, else on the CPU; writes x.
    Lsmr(lsmr::LsmrArgs),
}

/// Restores the default action of SIGPIPE (Rust's runtime ignores it), so that output piped into
/// a reader that exits early (`tessera bench | head`) ends the process quietly, as other
/// command-line tools do, instead of a panic on the next `println!`.
fn restore_default_sigpipe() {
    #[cfg(unix)]
    // SAFETY: called first in main, before any other thread exists; SIG_DFL is a valid action
    // for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    restore_default_sigpipe();
    let cli = Cli::parse();
    let command_line = std::env::args().collect::<Vec<_>>().join(" ");
    let result = match cli.command {
        None => main_job(&command_line),
        Some(Command::Info) => info(),
        Some(Command::Verify {
            ops,
            quick,
            filter,
            seed,
            device,
        }) => with_device(device)
            .and_then(|ctx| verify(&ctx, &ops, quick, filter.as_deref(), seed).map(|failed| failed == 0)),
        Some(Command::Compile {
            ops,
            arch,
            verbose,
            filter,
        }) => compile(&ops, &arch, verbose, &filter),
        Some(Command::ServeSim(args)) => serve_sim::run(&args, &command_line),
        Some(Command::Lsmr(args)) => lsmr::run(&args),
        Some(Command::Report { reports, out, op }) => merge_report_files(&reports, &out, op.as_deref()),
        Some(Command::Bench {
            ops,
            quick,
            json,
            baselines,
            filter,
            seed,
            rounds,
            burst,
            matrix,
            device,
        }) => {
            if let Some(m) = &matrix {
                if !m.is_file() {
                    eprintln!("tessera: --matrix {}: no such file", m.display());
                    std::process::exit(2);
                }
                // read by the operators' bench cases (crates/tessera/src/sparse/bench.rs)
                std::env::set_var("TESSERA_BENCH_MATRIX", m);
            }
            let args = BenchArgs {
                ops,
                quick,
                json,
                baselines,
                filter,
                seed,
                rounds: rounds as usize,
                burst,
            };
            with_device(device).and_then(|ctx| bench(&ctx, &args, &command_line))
        }
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("tessera: error: {e}");
            ExitCode::from(2)
        }
    }
}

type CliResult<T> = std::result::Result<T, String>;

/// `tessera report`: merges bench JSON files of one operator, writes its JSON and chart, prints
/// the table.
fn merge_report_files(files: &[PathBuf], out: &std::path::Path, op: Option<&str>) -> CliResult<bool> {
    let stem = |f: &PathBuf| f.file_stem().map(|s| s.to_string_lossy().into_owned());
    let op = match op {
        Some(op) => op.to_string(),
        None => {
            let op = files.first().and_then(stem).ok_or("no report files given")?;
            if let Some(other) = files.iter().find(|f| stem(f).as_deref() != Some(op.as_str())) {
                return Err(format!(
                    "{} is not a {op}.json: merge one operator's reports (or name it with --op)",
                    other.display()
                ));
            }
            op
        }
    };
    let operator = registry::find(&op).ok_or_else(|| format!("unknown operator {op:?} (name it with --op)"))?;
    let parts = files
        .iter()
        .map(|f| BenchReport::read_json(f))
        .collect::<CliResult<Vec<_>>>()?;
    let merged = report::merge_reports(parts)?;
    let impls = operator.baselines().map_or(&[][..], |b| b.impls);
    println!(
        "{op} on {}, {} timing, merged from {} reports",
        merged.gpu,
        merged.timing,
        files.len()
    );
    report::print_table(&merged, impls);
    let (jp, pp) = (out.join(format!("{op}.json")), out.join(format!("{op}.png")));
    merged.write_json(&jp)?;
    let style = match operator.chart() {
        Chart::Bars => report::PlotStyle::Bars,
        Chart::TflopsOverN => report::PlotStyle::TflopsVsN,
    };
    report::plot_op(style, &merged, &pp, &format!("{op} on {}", merged.gpu))?;
    println!("report: wrote {} and {}", jp.display(), pp.display());
    Ok(true)
}

fn with_device(ordinal: usize) -> CliResult<Context> {
    Context::new(ordinal).map_err(|e| format!("{e}\n(run `tessera info` to see what this machine has)"))
}

fn seed_or_default(seed: Option<u64>) -> CliResult<u64> {
    match seed {
        Some(s) => Ok(s),
        None => tessera::testdata::seed_from_env_or_time().map_err(|e| e.to_string()),
    }
}

/// The main job: on a GPU, verify and benchmark everything (with baselines when Python has
/// them); without one, the CPU reference path on small shapes.
fn main_job(command_line: &str) -> CliResult<bool> {
    match Context::new(0) {
        Ok(ctx) => {
            println!(
                "tessera: GPU found: {} ({}). Verifying, then benchmarking every operator.",
                ctx.info().name,
                ctx.arch()
            );
            let failed = verify(&ctx, &[], false, None, None)?;
            let args = BenchArgs {
                json: Some(PathBuf::from("bench-out")),
                baselines: true,
                ..Default::default()
            };
            let ok = bench(&ctx, &args, command_line)?;
            Ok(failed == 0 && ok)
        }
        Err(e) => {
            println!("tessera: no GPU run possible here: {e}");
            println!("tessera: running the CPU reference path on small shapes instead (no kernel runs).\n");
            cpu::run()
        }
    }
}

fn info() -> CliResult<bool> {
    println!("tessera {}", env!("CARGO_PKG_VERSION"));
    match probe::nvrtc() {
        Ok(n) => println!("NVRTC:        {}.{} from {}", n.version.0, n.version.1, n.library.path),
        Err(e) => println!("NVRTC:        missing: {e}"),
    }
    match tessera::runtime::jit::default_cache_dir() {
        Some(d) => println!("kernel cache: {}", d.display()),
        None => println!("kernel cache: memory only (no $TESSERA_CACHE_DIR, $XDG_CACHE_HOME or $HOME)"),
    }
    match probe::driver() {
        Ok(d) => {
            println!(
                "driver:       CUDA {}.{} ({}), {} device(s)",
                d.version / 1000,
                d.version % 1000 / 10,
                d.library.path,
                d.device_count
            );
            for i in 0..d.device_count as usize {
                match Context::new(i) {
                    Ok(ctx) => {
                        let inf = ctx.info();
                        println!(
                            "device {i}:     {}, compute capability {}.{} (kernels built for {}), {} SMs, {:.1} GiB, \
                             L2 {} MiB, {} KiB shared memory per block (opt-in)",
                            inf.name,
                            inf.compute_capability.0,
                            inf.compute_capability.1,
                            ctx.arch(),
                            inf.sm_count,
                            inf.total_memory as f64 / (1u64 << 30) as f64,
                            inf.l2_bytes >> 20,
                            inf.max_shared_per_block_optin >> 10
                        );
                    }
                    Err(e) => println!("device {i}:     cannot open: {e}"),
                }
            }
        }
        Err(e) => println!("driver:       {e}\nGPU:          none usable; `tessera` runs the CPU reference path"),
    }
    match probe::cublas() {
        Ok(l) => println!("cuBLAS:       {} (roofline GEMM)", l.path),
        Err(e) => println!("cuBLAS:       {e}"),
    }
    match probe::nccl() {
        Ok(n) => println!(
            "NCCL:         {}.{}.{} (lsmr --gpus, the distributed verify cases)",
            n.version / 10000,
            n.version / 100 % 100,
            n.version % 100
        ),
        Err(e) => println!("NCCL:         {e}"),
    }
    Ok(true)
}

fn compile(ops: &[String], arch: &[String], verbose: bool, filter: &[String]) -> CliResult<bool> {
    use rayon::prelude::*;
    use tessera::runtime::{compile_only, Arch};
    let ops = registry::select(ops)?;
    let archs: Vec<Arch> = if arch.is_empty() {
        Arch::CI_TARGETS.to_vec()
    } else {
        arch.iter()
            .map(|a| Arch::parse(a).ok_or_else(|| format!("unknown architecture `{a}` (e.g. sm_90a, sm_80)")))
            .collect::<CliResult<_>>()?
    };
    let nv = probe::nvrtc().map_err(|e| e.to_string())?;
    println!(
        "compile: NVRTC {}.{} ({}), cache {:?}",
        nv.version.0,
        nv.version.1,
        nv.library.path,
        tessera::runtime::jit::default_cache_dir()
    );
    let mut ok = true;
    let mut compiled = 0usize;
    for operator in ops {
        let op = operator.name();
        let jobs: Vec<_> = archs
            .iter()
            .flat_map(|&a| operator.kernel_specs(a).into_iter().map(move |s| (s, a)))
            .filter(|(s, _)| filter.iter().all(|f| matches_filter(&s.name, Some(f))))
            .collect();
        if jobs.is_empty() {
            continue;
        }
        compiled += jobs.len();
        let pb = progress(jobs.len(), &format!("compile {op}"));
        let t = Instant::now();
        let results: Vec<_> = jobs
            .par_iter()
            .map(|(s, a)| {
                let r = compile_only(s, *a);
                pb.inc(1);
                (s.name.clone(), *a, r)
            })
            .collect();
        pb.finish_and_clear();
        let (mut max_regs, mut spilled, mut failed) = (0, 0, 0);
        for (name, a, r) in &results {
            match r {
                Ok(c) => {
                    max_regs = max_regs.max(c.resources.registers);
                    if !c.resources.spill_free() {
                        spilled += 1;
                        println!("SPILL {name} {a}: {:?}", c.resources);
                    } else if verbose {
                        println!(
                            "ok    {name:<72} {a:<7} {:>3} regs {:>6} B smem",
                            c.resources.registers, c.resources.shared_bytes
                        );
                    }
                }
                Err(e) => {
                    failed += 1;
                    println!("FAIL  {name} {a}: {e}");
                }
            }
        }
        println!(
            "compile {op}: {} kernels ({} archs) in {:.1}s: {} failed, {} spilled, max {} registers",
            jobs.len(),
            archs.len(),
            t.elapsed().as_secs_f64(),
            failed,
            spilled,
            max_regs
        );
        ok &= failed == 0 && spilled == 0;
    }
    if compiled == 0 {
        return Err(format!("compile: no kernel name matches the filter {filter:?}"));
    }
    Ok(ok)
}

fn progress(n: usize, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(n as u64);
    pb.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {elapsed} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_prefix(what.to_string());
    pb
}

/// True when `name` contains `filter`, ignoring case (no filter matches everything); a filter
/// ending in `$` must match the end of the name.
fn matches_filter(name: &str, filter: Option<&str>) -> bool {
    let Some(f) = filter else { return true };
    let (name, f) = (name.to_lowercase(), f.to_lowercase());
    match f.strip_suffix('$') {
        Some(tail) => name.ends_with(tail),
        None => name.contains(&f),
    }
}

/// Returns the number of failed cases (skipped cases are neither passed nor failed).
fn verify(ctx: &Context, ops: &[String], quick: bool, filter: Option<&str>, seed: Option<u64>) -> CliResult<usize> {
    let ops = registry::select(ops)?;
    let seed = seed_or_default(seed)?;
    println!(
        "verify: device {} ({}), seed {seed} (replay with --seed {seed})",
        ctx.info().name,
        ctx.arch()
    );
    let mut failed = 0;
    let mut total = 0;
    let mut skipped: Vec<String> = Vec::new();
    for operator in ops {
        let op = operator.name();
        let jobs: Vec<_> = operator
            .verify_jobs(quick)
            .into_iter()
            .filter(|j| matches_filter(&j.name, filter))
            .collect();
        let pb = progress(jobs.len(), &format!("verify {op}"));
        let mut lines = Vec::new();
        for (i, job) in jobs.iter().enumerate() {
            pb.set_message(job.name.clone());
            let t = Instant::now();
            let case_seed = seed.wrapping_add(i as u64);
            let line = match (job.run)(ctx, case_seed) {
                Ok(o) if o.skipped.is_some() => {
                    let why = o.skipped.unwrap_or_default();
                    skipped.push(why.clone());
                    format!("skip {:<64} {why}", o.case)
                }
                Ok(o) => {
                    if !o.passed {
                        failed += 1;
                    }
                    let status = if o.passed { "ok  " } else { "FAIL" };
                    let mut s = format!(
                        "{status} {:<64} rel_l2 {:>9.2e} (budget {:.0e}) max_abs {:>9.2e}  {:<22} {:>6.2}s",
                        o.case,
                        o.comparison.rel_l2,
                        o.budget,
                        o.comparison.max_abs_err,
                        o.path,
                        t.elapsed().as_secs_f64()
                    );
                    if !o.passed {
                        s += &format!("\n     seed {case_seed}: {}", o.comparison);
                    }
                    // a passing case's note is its report (e.g. the Hopper GEMM's timings)
                    if let Some(n) = &o.note {
                        s += &format!("\n     {}", n.trim_end().replace('\n', "\n     "));
                    }
                    s
                }
                Err(e) => {
                    failed += 1;
                    format!("FAIL {:<64} error: {e} (seed {case_seed})", job.name)
                }
            };
            total += 1;
            pb.suspend(|| println!("{line}"));
            lines.push(line);
            pb.inc(1);
        }
        pb.finish_and_clear();
    }
    println!(
        "verify: {} passed, {} failed, {} skipped",
        total - failed - skipped.len(),
        failed,
        skipped.len()
    );
    skipped.sort();
    skipped.dedup();
    for why in skipped {
        println!("verify: skipped because {why}");
    }
    Ok(failed)
}

/// What `tessera bench` was asked for.
#[derive(Default)]
struct BenchArgs {
    ops: Vec<String>,
    quick: bool,
    json: Option<PathBuf>,
    baselines: bool,
    filter: Option<String>,
    seed: Option<u64>,
    /// Passes of ours and the baselines (at least 1), merged by report::merge_rounds.
    rounds: usize,
    /// Time bursts from a rested board ([`TimingOptions::burst`]) instead of the sustained state.
    burst: bool,
}

fn bench(ctx: &Context, args: &BenchArgs, command_line: &str) -> CliResult<bool> {
    let BenchArgs {
        ops,
        quick,
        json,
        baselines,
        filter,
        seed,
        rounds,
        burst,
    } = args;
    let (quick, baselines, rounds) = (*quick, *baselines, (*rounds).max(1));
    let ops = registry::select(ops)?;
    let seed = seed_or_default(*seed)?;
    let (timing, timing_name) = if *burst {
        (TimingOptions::burst(), report::TIMING_BURST)
    } else {
        (TimingOptions::default(), report::TIMING_SUSTAINED)
    };
    println!(
        "bench: device {} ({}), seed {seed}, timing: {}",
        ctx.info().name,
        ctx.arch(),
        report::describe_timing(timing_name)
    );
    let copy_bytes = if quick { 256 << 20 } else { 1 << 30 };
    let copy = timing::copy_bandwidth_gbps(ctx, copy_bytes).map_err(|e| e.to_string())?;
    let gemm = if *burst {
        tessera::runtime::roofline::cublas_bf16_tflops_timed(ctx, 8192, timing)
    } else {
        tessera::runtime::roofline::cublas_bf16_tflops(ctx, 8192)
    };
    let gemm = match gemm {
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!("bench: cuBLAS roofline unavailable: {e}");
            None
        }
    };
    let _ = ctx.trim_pool();
    println!(
        "roofline: device copy {:.0} GB/s ({} MiB, read + write); cuBLAS bf16 8192^3 {}",
        copy,
        copy_bytes >> 20,
        gemm.map(|t| format!("{t:.0} TFLOP/s"))
            .unwrap_or_else(|| "unavailable".into())
    );
    let mut all_ok = true;
    for operator in ops {
        let op = operator.name();
        let jobs: Vec<_> = operator
            .bench_jobs(quick)
            .into_iter()
            .filter(|j| matches_filter(&j.name, filter.as_deref()))
            .collect();
        if jobs.is_empty() {
            continue;
        }
        let mut report = BenchReport::new(ctx.info().name.clone(), command_line);
        report.timing = timing_name.to_string();
        report.roofline.copy_gbps = Some(copy);
        report.roofline.bf16_tflops = gemm;
        let known = operator.baselines();
        let impls: &[&str] = known.map_or(&[], |b| b.impls);
        // one baseline run per case, also where several of our jobs (forced paths) share it
        let mut baseline_cases: Vec<(String, serde_json::Value)> = Vec::new();
        for b in jobs.iter().filter_map(|j| j.baseline.clone()) {
            if !baseline_cases.contains(&b) {
                baseline_cases.push(b);
            }
        }
        let mut round_rows = Vec::with_capacity(rounds);
        for round in 0..rounds {
            let mut rows = Vec::new();
            let what = if rounds > 1 {
                format!("bench {op} round {}/{rounds}", round + 1)
            } else {
                format!("bench {op}")
            };
            let pb = progress(jobs.len(), &what);
            for (i, job) in jobs.iter().enumerate() {
                pb.set_message(job.name.clone());
                match (job.run)(ctx, seed.wrapping_add(i as u64), timing) {
                    Ok(o) => {
                        report.verify.passed += 1;
                        let mut row = BenchRow::new(o.case, o.params, o.implementation);
                        row.ms = Some(o.ms);
                        row.gbps = o.gbps;
                        row.tflops = o.tflops;
                        row.extra_mib = o.extra_mib;
                        row.max_abs_err = o.max_abs_err;
                        row.rel_l2 = o.rel_l2;
                        rows.push(row);
                    }
                    Err(e) => {
                        all_ok = false;
                        report.verify.failed += 1;
                        pb.suspend(|| eprintln!("bench: {}: {e}", job.name));
                    }
                }
                let _ = ctx.trim_pool();
                pb.inc(1);
            }
            pb.finish_and_clear();
            if let (true, Some(b)) = (baselines, known) {
                let script = report::baseline_script(b.script);
                let python: Vec<&str> = b.impls.iter().copied().filter(|i| !b.in_process.contains(i)).collect();
                println!("bench: running baselines {python:?} for {op} with {}", script.display());
                match report::run_python_baseline(&script, op, &baseline_cases, timing_name) {
                    report::BaselineOutcome::Rows(r) => rows.extend(r),
                    report::BaselineOutcome::Missing(why) => println!("bench: baselines for {op} missing: {why}"),
                }
            }
            round_rows.push(rows);
        }
        report.rows = report::merge_rounds(round_rows);
        println!(
            "\n{op} on {}, {} timing (ratio = baseline ms / ours ms; > 1 means tessera is faster)",
            ctx.info().name,
            timing_name
        );
        report::print_table(&report, impls);
        if let Some(dir) = &json {
            let jp = dir.join(format!("{op}.json"));
            let pp = dir.join(format!("{op}.png"));
            report.write_json(&jp)?;
            let style = match operator.chart() {
                Chart::Bars => report::PlotStyle::Bars,
                Chart::TflopsOverN => report::PlotStyle::TflopsVsN,
            };
            if let Err(e) = report::plot_op(style, &report, &pp, &format!("{op} on {}", ctx.info().name)) {
                eprintln!("bench: plot {}: {e}", pp.display());
            }
            println!("bench: wrote {} and {}", jp.display(), pp.display());
        }
    }
    Ok(all_ok)
}

#[cfg(test)]
mod tests {
    use super::matches_filter;

    #[test]
    fn filters_match_substrings_and_anchor_with_a_trailing_dollar() {
        let name = "causal fp16 B1 H32 N32768 D128 tessera";
        assert!(matches_filter(name, None));
        assert!(matches_filter(name, Some("n32768 d128")));
        assert!(matches_filter(name, Some("D128 tessera$")));
        assert!(!matches_filter(
            "causal fp16 B1 H32 N32768 D128 tessera-sm80",
            Some("D128 tessera$")
        ));
        assert!(matches_filter(
            "causal fp16 B1 H32 N32768 D128 tessera-sm80",
            Some("D128 tessera")
        ));
        assert!(!matches_filter(name, Some("N16384")));
    }
}
