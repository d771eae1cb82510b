//! `tessera lsmr A.mtx b.mtx -o x.mtx`: solves `min ||A x - b||^2 + damp^2 ||x||^2` by LSMR
//! with SciPy's options and stopping rules, on the GPU when one is usable, else with the CPU
//! reference (it says which). A progress line every `--progress-every` iterations (on the GPU
//! at the solver's stop-flag checks, every 16 iterations), and the stop reason in words at the
//! end. `x` is written as a Matrix Market `array` file.
//!
//! Several right-hand sides: a `b` file with `k > 1` columns (an `m x k` array or coordinate
//! file) solves every column together (`lsmr_many` on the GPU: the operator's products shared
//! as SpMM; `lsmr_host_many` on the CPU), each column its own solve with its own stop, and
//! writes `X` as an `n x k` array file, with a summary line per column. `--x0` is then an
//! `n x k` file.
//!
//! A damp list: `--damp 0,0.1,1` solves one `b` for each damp in one run (`lsmr_damps` on the
//! GPU: every product with A shared; `lsmr_host_damps` on the CPU), each damp its own solve
//! with its own stop, and writes `X` as an `n x d` array file (column j for damp j).
//!
//! Several GPUs: `--gpus G` splits the rows of A (and b) into G blocks balanced by nonzeros
//! (`RowPartition::by_nonzeros`), one thread per GPU (devices `--device` .. `--device + G - 1`),
//! each with its own context and its block, the NCCL communicator made from one unique id, and
//! runs distributed LSMR (`lsmr_distributed`: local SpMVs, one all-reduce of an n-vector per
//! iteration); x, the same on every rank, is written from rank 0. One right-hand side and one
//! damp; `--cpu` with `--gpus` is an error (the CPU reference runs on one thread). Not yet run
//! on GPUs.

use std::path::PathBuf;
use std::time::Instant;

use tessera::distributed::{
    lsmr_distributed, row_block, unique_id, Communicator, DistributedOperator, DistributedRunOptions, RowPartition,
};
use tessera::linalg::{
    istop_reason, lsmr_damps_with, lsmr_host, lsmr_host_damps, lsmr_host_many, lsmr_many_with, lsmr_with, mtx_vector,
    sparse_operator, sparse_operator_with, FnDeviceOperator, HostLinearOperator, LinearOperator, LsmrOptions,
    LsmrResult, LsmrRunOptions, ManyRhs, SparseOperatorOptions, Storage,
};
use tessera::runtime::{Context, DeviceBuffer};
use tessera::sparse::{read_mtx_csr, CsrHost};
use tessera::Element;

/// Storage precision of the GPU solve.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Precision {
    F32,
    F64,
}

#[derive(clap::Args, Debug)]
pub struct LsmrArgs {
    /// The matrix A (Matrix Market coordinate file).
    pub a: PathBuf,
    /// The right-hand side b (Matrix Market array file, or a coordinate vector); an m x k file
    /// (k > 1) solves its k columns together.
    pub b: PathBuf,
    /// Where to write x (Matrix Market array file, n x 1; n x k for k right-hand sides).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Damping: minimise ||A x - b||^2 + damp^2 ||x||^2. A comma-separated list (0,0.1,1)
    /// solves b once per damp in one run and writes x as n x d, column j for damp j.
    #[arg(long, value_delimiter = ',', num_args = 1, default_value = "0")]
    pub damp: Vec<f64>,
    /// Relative error in A (stopping tolerance).
    #[arg(long, default_value_t = 1e-6)]
    pub atol: f64,
    /// Relative error in b (stopping tolerance).
    #[arg(long, default_value_t = 1e-6)]
    pub btol: f64,
    /// Stop when the estimate of cond(A) exceeds this (0: no limit).
    #[arg(long, default_value_t = 1e8)]
    pub conlim: f64,
    /// The most iterations (default min(m, n)).
    #[arg(long)]
    pub maxiter: Option<usize>,
    /// An initial guess x0 (Matrix Market vector of n values; n x k for k right-hand sides).
    #[arg(long)]
    pub x0: Option<PathBuf>,
    /// Storage precision on the GPU (f32: vectors and SpMV in f32, recurrences in f64).
    #[arg(long, value_enum, default_value_t = Precision::F64)]
    pub dtype: Precision,
    /// Keep only A on the GPU (A^T x without a transposed copy) instead of A and A^T.
    #[arg(long)]
    pub single_storage: bool,
    /// Time the SpMV kernel choices of A and A^T once before the solve and keep the fastest
    /// (a few milliseconds; pays on solves of many iterations).
    #[arg(long)]
    pub autotune_spmv: bool,
    /// Use the CPU reference even when a GPU is present.
    #[arg(long)]
    pub cpu: bool,
    /// A progress line every this many iterations (0: none).
    #[arg(long, default_value_t = 100)]
    pub progress_every: usize,
    /// GPU ordinal (with --gpus: the first of the G devices).
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Solve on G GPUs over NCCL: the rows of A split into G blocks balanced by nonzeros, one
    /// thread per GPU (one right-hand side and one damp; not with --cpu).
    #[arg(long)]
    pub gpus: Option<usize>,
}

pub fn run(args: &LsmrArgs) -> Result<bool, String> {
    check_gpus(args)?;
    let t = Instant::now();
    let a = read_mtx_csr::<f64, i64>(&args.a).map_err(|e| e.to_string())?;
    let (b_rows, b_cols, b_many) = mtx_vector::read_mtx_columns(&args.b).map_err(|e| e.to_string())?;
    if let (Some(g), true) = (args.gpus, b_rows > 1 && b_cols > 1) {
        return Err(format!(
            "--gpus {g}: one right-hand side; {} has {b_cols} columns (solve them without --gpus)",
            args.b.display()
        ));
    }
    if b_rows > 1 && b_cols > 1 {
        if args.damp.len() > 1 {
            return Err(format!(
                "--damp: a list of {} damps takes one right-hand side; {} has {b_cols} columns",
                args.damp.len(),
                args.b.display()
            ));
        }
        return run_many(args, &a, b_cols, &b_many, t);
    }
    drop(b_many);
    let b = mtx_vector::read_mtx_vector(&args.b).map_err(|e| e.to_string())?;
    let x0 = match &args.x0 {
        Some(p) => Some(mtx_vector::read_mtx_vector(p).map_err(|e| e.to_string())?),
        None => None,
    };
    println!(
        "lsmr: A {} x {} with {} nonzeros, b of {} ({:.2}s to read)",
        a.rows,
        a.cols,
        a.nnz(),
        b.len(),
        t.elapsed().as_secs_f64()
    );
    let opts = LsmrOptions { x0, ..options(args) };
    if args.damp.len() > 1 {
        return run_damps(args, &a, &b, &opts);
    }
    let t = Instant::now();
    let res = if let Some(g) = args.gpus {
        match args.dtype {
            Precision::F64 => solve_gpus::<f64>(args, g, &a, &b, &opts),
            Precision::F32 => solve_gpus::<f32>(args, g, &a, &b, &opts),
        }?
    } else {
        match gpu_choice(args) {
            Ok((ctx, operator)) => match args.dtype {
                Precision::F64 => solve_gpu::<f64>(&ctx, &a, &b, &opts, operator, args.progress_every),
                Precision::F32 => solve_gpu::<f32>(&ctx, &a, &b, &opts, operator, args.progress_every),
            },
            Err(why) => {
                println!("lsmr: on the CPU (f64 reference solver): no GPU used: {why}");
                solve_cpu(&a, &b, &opts, args.progress_every)
            }
        }
        .map_err(|e| e.to_string())?
    };
    let secs = t.elapsed().as_secs_f64();
    mtx_vector::write_mtx_vector(&args.output, &res.x).map_err(|e| e.to_string())?;
    println!("lsmr: stopped with istop {}: {}", res.istop, istop_reason(res.istop));
    println!(
        "lsmr: itn {}  ||r|| {:.6e}  ||A^T r|| {:.6e}  ||A|| {:.6e}  cond(A) {:.6e}  ||x|| {:.6e}  ({secs:.3}s)",
        res.itn, res.normr, res.normar, res.norma, res.conda, res.normx
    );
    println!("lsmr: wrote x ({} values) to {}", res.x.len(), args.output.display());
    Ok(true)
}

/// The GPU context and the sparse operator's options (storage, SpMV autotune) for the solve, or
/// why the CPU reference runs instead.
fn gpu_choice(args: &LsmrArgs) -> Result<(Context, SparseOperatorOptions), String> {
    if args.cpu {
        return Err("--cpu was given".into());
    }
    let ctx = Context::new(args.device).map_err(|e| e.to_string())?;
    let storage = if args.single_storage {
        Storage::Single
    } else {
        Storage::Auto
    };
    Ok((
        ctx,
        SparseOperatorOptions {
            storage,
            autotune_spmv: args.autotune_spmv,
        },
    ))
}

/// The options of the command line (without x0; the first damp of a list).
fn options(args: &LsmrArgs) -> LsmrOptions {
    LsmrOptions {
        damp: args.damp.first().copied().unwrap_or(0.0),
        atol: args.atol,
        btol: args.btol,
        conlim: args.conlim,
        maxiter: args.maxiter,
        x0: None,
        show: false,
        scale_columns: false,
    }
}

/// `k > 1` right-hand sides: every column of `b` (`m x k`, column-major) solved together.
fn run_many(args: &LsmrArgs, a: &CsrHost<f64, i64>, k: usize, b: &[f64], t: Instant) -> Result<bool, String> {
    let n = a.cols;
    let x0 = match &args.x0 {
        Some(p) => {
            let (r, c, x0) = mtx_vector::read_mtx_columns(p).map_err(|e| e.to_string())?;
            if (r, c) != (n, k) {
                return Err(format!(
                    "x0: {} is {r} x {c}; with {k} right-hand sides it must be n x k = {n} x {k}",
                    p.display()
                ));
            }
            Some(x0)
        }
        None => None,
    };
    println!(
        "lsmr: A {} x {} with {} nonzeros, B of {} x {k} ({k} right-hand sides, {:.2}s to read)",
        a.rows,
        a.cols,
        a.nnz(),
        b.len() / k,
        t.elapsed().as_secs_f64()
    );
    let opts = options(args);
    let t = Instant::now();
    let x0 = x0.as_deref();
    let results = match gpu_choice(args) {
        Ok((ctx, operator)) => match args.dtype {
            Precision::F64 => solve_gpu_many::<f64>(&ctx, a, b, k, x0, &opts, operator, args.progress_every),
            Precision::F32 => solve_gpu_many::<f32>(&ctx, a, b, k, x0, &opts, operator, args.progress_every),
        },
        Err(why) => {
            println!("lsmr: on the CPU (f64 reference solver): no GPU used: {why}");
            lsmr_host_many(a, b, k, x0, &opts)
        }
    }
    .map_err(|e| e.to_string())?;
    let secs = t.elapsed().as_secs_f64();
    let xs: Vec<f64> = results.iter().flat_map(|r| r.x.iter().copied()).collect();
    mtx_vector::write_mtx_columns(&args.output, n, k, &xs).map_err(|e| e.to_string())?;
    for (j, r) in results.iter().enumerate() {
        println!(
            "lsmr: column {j:>4}: istop {}  itn {}  ||r|| {:.6e}  ||A^T r|| {:.6e}  ||A|| {:.6e}  cond(A) {:.6e}  ||x|| {:.6e}",
            r.istop, r.itn, r.normr, r.normar, r.norma, r.conda, r.normx
        );
    }
    let mut codes: Vec<u32> = results.iter().map(|r| r.istop).collect();
    codes.sort_unstable();
    codes.dedup();
    for code in codes {
        let count = results.iter().filter(|r| r.istop == code).count();
        println!("lsmr: istop {code} ({count} of {k} columns): {}", istop_reason(code));
    }
    println!("lsmr: {k} right-hand sides in {secs:.3}s");
    println!("lsmr: wrote X ({n} x {k}) to {}", args.output.display());
    Ok(true)
}

/// A damp list: one `b` solved for every damp in one run; X is `n x d`.
fn run_damps(args: &LsmrArgs, a: &CsrHost<f64, i64>, b: &[f64], opts: &LsmrOptions) -> Result<bool, String> {
    let (n, d) = (a.cols, args.damp.len());
    let t = Instant::now();
    let results = match gpu_choice(args) {
        Ok((ctx, operator)) => match args.dtype {
            Precision::F64 => solve_gpu_damps::<f64>(&ctx, a, b, &args.damp, opts, operator, args.progress_every),
            Precision::F32 => solve_gpu_damps::<f32>(&ctx, a, b, &args.damp, opts, operator, args.progress_every),
        },
        Err(why) => {
            println!("lsmr: on the CPU (f64 reference solver): no GPU used: {why}");
            lsmr_host_damps(a, b, &args.damp, opts)
        }
    }
    .map_err(|e| e.to_string())?;
    let secs = t.elapsed().as_secs_f64();
    let xs: Vec<f64> = results.iter().flat_map(|r| r.x.iter().copied()).collect();
    mtx_vector::write_mtx_columns(&args.output, n, d, &xs).map_err(|e| e.to_string())?;
    for (damp, r) in args.damp.iter().zip(&results) {
        println!(
            "lsmr: damp {damp:<10}: istop {} ({})  itn {}  ||r|| {:.6e}  ||A^T r|| {:.6e}  cond(A) {:.6e}  ||x|| {:.6e}",
            r.istop,
            istop_reason(r.istop),
            r.itn,
            r.normr,
            r.normar,
            r.conda,
            r.normx
        );
    }
    println!("lsmr: {d} damps in {secs:.3}s");
    println!(
        "lsmr: wrote X ({n} x {d}, column j for damp j) to {}",
        args.output.display()
    );
    Ok(true)
}

/// The device operator of `a` in `T` with `operator`'s options, and the line saying where the solve runs
/// (`what` appended: how many right-hand sides or damps).
fn gpu_operator<T: Element>(
    ctx: &Context,
    a: &CsrHost<f64, i64>,
    operator: SparseOperatorOptions,
    what: &str,
) -> tessera::Result<Box<dyn LinearOperator<T>>> {
    let at = CsrHost::<T, i64> {
        rows: a.rows,
        cols: a.cols,
        offsets: a.offsets.clone(),
        indices: a.indices.clone(),
        values: a.values.iter().map(|&v| T::from_f64(v)).collect(),
        sorted: a.sorted,
    };
    let op = sparse_operator_with(ctx, &at, &operator)?;
    println!(
        "lsmr: on the GPU: {} ({}), {} storage {}{what}",
        ctx.info().name,
        ctx.arch(),
        T::DTYPE,
        op.storage()
    );
    Ok(op)
}

/// Run options with a progress line every `every` iterations (0: none): `itn`, the norms
/// (`norms` before them: "max " over several right-hand sides), time, then `tail`.
fn progress(every: usize, norms: &'static str, tail: &'static str) -> LsmrRunOptions<'static> {
    let mut next = every;
    LsmrRunOptions {
        progress: Some(Box::new(move |itn, normr, normar, secs| {
            if every > 0 && itn >= next {
                println!(
                    "lsmr: itn {itn:>8}  {norms}||r|| {normr:.6e}  {norms}||A^T r|| {normar:.6e}  {secs:8.3}s{tail}"
                );
                next = (itn / every + 1) * every;
            }
        })),
        ..LsmrRunOptions::default()
    }
}

fn solve_gpu_damps<T: Element>(
    ctx: &Context,
    a: &CsrHost<f64, i64>,
    b: &[f64],
    damps: &[f64],
    opts: &LsmrOptions,
    operator: SparseOperatorOptions,
    every: usize,
) -> tessera::Result<Vec<LsmrResult>> {
    let op = gpu_operator::<T>(ctx, a, operator, &format!(", {} damps together", damps.len()))?;
    let db = ctx.upload(&b.iter().map(|&v| T::from_f64(v)).collect::<Vec<T>>())?;
    let mut run = progress(every, "", " (first damp)");
    lsmr_damps_with(ctx, op.as_ref(), &db, damps, opts, &mut run)
}

#[allow(clippy::too_many_arguments)] // the problem, the options and the run's settings
fn solve_gpu_many<T: Element>(
    ctx: &Context,
    a: &CsrHost<f64, i64>,
    b: &[f64],
    k: usize,
    x0: Option<&[f64]>,
    opts: &LsmrOptions,
    operator: SparseOperatorOptions,
    every: usize,
) -> tessera::Result<Vec<LsmrResult>> {
    let op = gpu_operator::<T>(ctx, a, operator, &format!(", {k} right-hand sides together"))?;
    let mut run = progress(every, "max ", "");
    lsmr_many_with(ctx, op.as_ref(), ManyRhs::Host(b), k, x0, opts, &mut run)
}

fn solve_gpu<T: Element>(
    ctx: &Context,
    a: &CsrHost<f64, i64>,
    b: &[f64],
    opts: &LsmrOptions,
    operator: SparseOperatorOptions,
    every: usize,
) -> tessera::Result<LsmrResult> {
    let op = gpu_operator::<T>(ctx, a, operator, "")?;
    let bt: Vec<T> = b.iter().map(|&v| T::from_f64(v)).collect();
    let db = ctx.upload(&bt)?;
    let mut run = progress(every, "", "");
    lsmr_with(ctx, op.as_ref(), &db, opts, &mut run)
}

/// The checks of `--gpus` that need no file and no device: at least one GPU, not with
/// `--cpu`, one damp (several right-hand sides are refused once b is read).
fn check_gpus(args: &LsmrArgs) -> Result<(), String> {
    let Some(g) = args.gpus else {
        return Ok(());
    };
    if g == 0 {
        return Err("--gpus 0: give the number of GPUs to solve on (1 or more)".into());
    }
    if args.cpu {
        return Err(format!(
            "--cpu with --gpus {g}: the CPU reference runs on one thread; give one of the two"
        ));
    }
    if args.damp.len() > 1 {
        return Err(format!(
            "--gpus {g} with a list of {} damps: the distributed solver takes one damp (solve the list without --gpus)",
            args.damp.len()
        ));
    }
    Ok(())
}

/// `--gpus G`: A split by rows over G GPUs (devices `args.device ..`), one thread per GPU,
/// NCCL for the sums; the result of rank 0 (every rank has the same).
fn solve_gpus<T: Element>(
    args: &LsmrArgs,
    g: usize,
    a: &CsrHost<f64, i64>,
    b: &[f64],
    opts: &LsmrOptions,
) -> Result<LsmrResult, String> {
    let count = tessera::runtime::probe::driver()
        .map_err(|e| format!("--gpus {g}: no GPU to run on: {e}"))?
        .device_count as usize;
    if args.device + g > count {
        return Err(format!(
            "--gpus {g} from device {}: the machine has {count} GPU(s) (devices 0..{})",
            args.device,
            count.saturating_sub(1)
        ));
    }
    let nccl = tessera::runtime::probe::nccl().map_err(|e| format!("--gpus {g}: {e}"))?;
    let partition = RowPartition::by_nonzeros(a, g).map_err(|e| e.to_string())?;
    // Every context first, on this thread: a device that cannot be opened fails here, before
    // any rank waits for the others in NCCL.
    let contexts = (0..g)
        .map(|r| Context::new(args.device + r))
        .collect::<tessera::Result<Vec<Context>>>()
        .map_err(|e| e.to_string())?;
    let id = unique_id().map_err(|e| e.to_string())?;
    let (v0, v1, v2) = (nccl.version / 10000, nccl.version / 100 % 100, nccl.version % 100);
    println!(
        "lsmr: on {g} GPUs ({} x{g}, devices {}..{}), NCCL {v0}.{v1}.{v2}, {} storage, rows split by nonzeros at {:?}",
        contexts[0].info().name,
        args.device,
        args.device + g - 1,
        T::DTYPE,
        partition.bounds()
    );
    let storage = if args.single_storage {
        Storage::Single
    } else {
        Storage::Auto
    };
    let (tx, rx) = std::sync::mpsc::channel();
    for (rank, ctx) in contexts.into_iter().enumerate() {
        let rows = partition.rows(rank).map_err(|e| e.to_string())?;
        let block = row_block(a, rows.clone()).map_err(|e| e.to_string())?;
        let b_i: Vec<T> = b[rows.clone()].iter().map(|&v| T::from_f64(v)).collect();
        let (m, every, opts, tx) = (a.rows, args.progress_every, opts.clone(), tx.clone());
        std::thread::spawn(move || {
            let result = (|| -> tessera::Result<LsmrResult> {
                let comm = Communicator::new(&ctx, rank, g, &id)?;
                let local = block_operator::<T>(&ctx, &block, storage)?;
                let op = DistributedOperator::new(local, rows, m, &comm)?;
                let db = ctx.upload(&b_i)?;
                let mut run = DistributedRunOptions {
                    progress: (rank == 0).then(|| distributed_progress(every)),
                };
                let res = lsmr_distributed(&op, &db, &opts, &mut run)?;
                drop(op);
                // every rank ends its communicator in order (a failed rank skips this: the run
                // ends with its error)
                comm.finish()?;
                Ok(res)
            })();
            // the receiver may be gone (another rank failed first): nothing left to report to
            let _ = tx.send((rank, result));
        });
    }
    drop(tx);
    let mut rank0 = None;
    for (rank, result) in rx.iter() {
        match result {
            // a failed rank ends the run at once: the others may be waiting for it in NCCL,
            // and returning ends the process with them
            Err(e) => return Err(format!("--gpus {g}: rank {rank} (device {}): {e}", args.device + rank)),
            Ok(r) if rank == 0 => rank0 = Some(r),
            Ok(_) => {}
        }
    }
    rank0.ok_or_else(|| format!("--gpus {g}: rank 0 returned no result"))
}

/// The device operator of one rank's block (`T` values; an empty block gets an operator of 0
/// rows that is never applied).
fn block_operator<T: Element>(
    ctx: &Context,
    block: &CsrHost<f64, i64>,
    storage: Storage,
) -> tessera::Result<Box<dyn LinearOperator<T> + 'static>> {
    if block.rows == 0 {
        let none = || -> tessera::linalg::device_operator::DeviceApplyFn<'static, T> {
            Box::new(|_: f64, _: &DeviceBuffer<T>, _: f64, _: &mut DeviceBuffer<T>| Ok(()))
        };
        return Ok(Box::new(FnDeviceOperator::new(0, block.cols, none(), none())));
    }
    let bt = CsrHost::<T, i64> {
        rows: block.rows,
        cols: block.cols,
        offsets: block.offsets.clone(),
        indices: block.indices.clone(),
        values: block.values.iter().map(|&v| T::from_f64(v)).collect(),
        sorted: block.sorted,
    };
    sparse_operator(ctx, &bt, storage)
}

/// Rank 0's progress: a line every `every` iterations (0: none), as the one-GPU path.
fn distributed_progress(every: usize) -> tessera::linalg::lsmr_device::ProgressFn<'static> {
    let mut next = every;
    Box::new(move |itn, normr, normar, secs| {
        if every > 0 && itn >= next {
            println!("lsmr: itn {itn:>8}  ||r|| {normr:.6e}  ||A^T r|| {normar:.6e}  {secs:8.3}s");
            next = (itn / every + 1) * every;
        }
    })
}

/// The CPU solve, with a progress line (iterations and time: the CPU reference reports its
/// estimates only at the end) every `every` iterations, counted from the A^T products.
fn solve_cpu(a: &CsrHost<f64, i64>, b: &[f64], opts: &LsmrOptions, every: usize) -> tessera::Result<LsmrResult> {
    struct Counting<'a> {
        a: &'a CsrHost<f64, i64>,
        products: std::cell::Cell<usize>,
        every: usize,
        start: Instant,
    }
    impl HostLinearOperator for Counting<'_> {
        fn shape(&self) -> (usize, usize) {
            self.a.shape()
        }
        fn apply(&self, alpha: f64, x: &[f64], beta: f64, y: &mut [f64]) {
            self.a.apply(alpha, x, beta, y)
        }
        fn apply_transposed(&self, alpha: f64, x: &[f64], beta: f64, y: &mut [f64]) {
            self.a.apply_transposed(alpha, x, beta, y);
            // the setup makes one A^T product, then one per iteration
            let itn = self.products.get();
            self.products.set(itn + 1);
            if self.every > 0 && itn > 0 && itn % self.every == 0 {
                println!("lsmr: itn {itn:>8}  {:8.3}s", self.start.elapsed().as_secs_f64());
            }
        }
        fn check(&self) -> tessera::Result<()> {
            self.a.check()
        }
    }
    let op = Counting {
        a,
        products: std::cell::Cell::new(0),
        every,
        start: Instant::now(),
    };
    lsmr_host(&op, b, opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CPU-path arguments with SciPy's defaults.
    fn cpu_args(a: PathBuf, b: PathBuf, output: PathBuf) -> LsmrArgs {
        LsmrArgs {
            a,
            b,
            output,
            damp: vec![0.0],
            atol: 1e-6,
            btol: 1e-6,
            conlim: 1e8,
            maxiter: None,
            x0: None,
            dtype: Precision::F64,
            single_storage: false,
            autotune_spmv: false,
            cpu: true,
            progress_every: 1,
            device: 0,
            gpus: None,
        }
    }

    /// Writes the 4 x 2 inconsistent system A = [1 0; 1 1; 0 2; 1 -1] (A^T A = diag(3, 6)) into
    /// `dir`/A.mtx and returns its path.
    fn small_system(dir: &std::path::Path) -> PathBuf {
        let a = dir.join("A.mtx");
        std::fs::write(
            &a,
            "%%MatrixMarket matrix coordinate real general\n4 2 6\n1 1 1\n2 1 1\n2 2 1\n3 2 2\n4 1 1\n4 2 -1\n",
        )
        .unwrap();
        a
    }

    /// The CPU path end to end: files in, x out, the normal equations hold.
    #[test]
    fn cpu_solve_writes_the_least_squares_solution() {
        let dir = tempfile::tempdir().unwrap();
        // a 4 x 2 inconsistent system: A = [1 0; 1 1; 0 2; 1 -1], b = [1 2 3 0]
        let a = small_system(dir.path());
        let b = dir.path().join("b.mtx");
        std::fs::write(&b, "%%MatrixMarket matrix array real general\n4 1\n1\n2\n3\n0\n").unwrap();
        let out = dir.path().join("x.mtx");
        let args = LsmrArgs {
            atol: 1e-10,
            btol: 1e-10,
            ..cpu_args(a, b, out.clone())
        };
        assert!(run(&args).unwrap());
        let x = mtx_vector::read_mtx_vector(&out).unwrap();
        // normal equations: A^T A = [3 0; 0 6], A^T b = [3, 8]
        assert!((x[0] - 1.0).abs() < 1e-9 && (x[1] - 8.0 / 6.0).abs() < 1e-9, "{x:?}");
    }

    /// Several right-hand sides on the CPU path: X n x k, each column the least-squares
    /// solution of its column (a zero column gives x = 0, a doubled column 2 x).
    #[test]
    fn cpu_solve_of_several_columns_writes_x_as_n_by_k() {
        let dir = tempfile::tempdir().unwrap();
        let a = small_system(dir.path());
        let b = dir.path().join("B.mtx");
        std::fs::write(
            &b,
            "%%MatrixMarket matrix array real general\n4 3\n1\n2\n3\n0\n0\n0\n0\n0\n2\n4\n6\n0\n",
        )
        .unwrap();
        let out = dir.path().join("X.mtx");
        let args = LsmrArgs {
            atol: 1e-10,
            btol: 1e-10,
            ..cpu_args(a, b, out.clone())
        };
        assert!(run(&args).unwrap());
        let (rows, cols, x) = mtx_vector::read_mtx_columns(&out).unwrap();
        assert_eq!((rows, cols), (2, 3));
        let want = [1.0, 8.0 / 6.0, 0.0, 0.0, 2.0, 16.0 / 6.0];
        for (g, w) in x.iter().zip(want) {
            assert!((g - w).abs() < 1e-9, "{x:?}");
        }
        // an x0 of the wrong shape is an error, and nothing is written
        let x0 = dir.path().join("x0.mtx");
        std::fs::write(&x0, "%%MatrixMarket matrix array real general\n2 1\n0\n0\n").unwrap();
        let bad = LsmrArgs {
            x0: Some(x0),
            output: dir.path().join("none.mtx"),
            ..args
        };
        assert!(run(&bad).is_err());
        assert!(!dir.path().join("none.mtx").exists());
    }

    /// A damp list on the CPU path: X n x d, each column the damped least-squares solution
    /// (A^T A + damp^2 I) x = A^T b of its damp; with several right-hand sides it is an error.
    #[test]
    fn cpu_damp_list_writes_one_column_per_damp() {
        let dir = tempfile::tempdir().unwrap();
        let a = small_system(dir.path());
        let b = dir.path().join("b.mtx");
        std::fs::write(&b, "%%MatrixMarket matrix array real general\n4 1\n1\n2\n3\n0\n").unwrap();
        let out = dir.path().join("X.mtx");
        let damps = vec![0.0, 0.5, 2.0];
        let args = LsmrArgs {
            atol: 1e-12,
            btol: 1e-12,
            damp: damps.clone(),
            ..cpu_args(a.clone(), b, out.clone())
        };
        assert!(run(&args).unwrap());
        let (rows, cols, x) = mtx_vector::read_mtx_columns(&out).unwrap();
        assert_eq!((rows, cols), (2, 3));
        // A^T A = diag(3, 6), A^T b = [3, 8]: x = [3 / (3 + d^2), 8 / (6 + d^2)]
        for (j, d) in damps.iter().enumerate() {
            let want = [3.0 / (3.0 + d * d), 8.0 / (6.0 + d * d)];
            for (g, w) in x[2 * j..2 * j + 2].iter().zip(want) {
                assert!((g - w).abs() < 1e-9, "damp {d}: {x:?}");
            }
        }
        // a damp list with an m x k B, and a negative damp: errors, nothing written
        let bb = dir.path().join("B.mtx");
        std::fs::write(
            &bb,
            "%%MatrixMarket matrix array real general\n4 2\n1\n2\n3\n0\n0\n0\n0\n1\n",
        )
        .unwrap();
        for bad in [
            LsmrArgs {
                damp: damps.clone(),
                ..cpu_args(a.clone(), bb, dir.path().join("none.mtx"))
            },
            LsmrArgs {
                damp: vec![0.1, -1.0],
                ..cpu_args(a.clone(), dir.path().join("b.mtx"), dir.path().join("none.mtx"))
            },
        ] {
            assert!(run(&bad).is_err());
            assert!(!dir.path().join("none.mtx").exists());
        }
    }

    /// `--gpus` refuses what it does not support before any file or device is touched (0 GPUs,
    /// `--cpu`, a damp list), several right-hand sides once b is read, and without a GPU says
    /// so; nothing is written.
    #[test]
    fn gpus_argument_checks() {
        let dir = tempfile::tempdir().unwrap();
        let a = small_system(dir.path());
        let b = dir.path().join("b.mtx");
        std::fs::write(&b, "%%MatrixMarket matrix array real general\n4 1\n1\n2\n3\n0\n").unwrap();
        let bb = dir.path().join("B.mtx");
        std::fs::write(
            &bb,
            "%%MatrixMarket matrix array real general\n4 2\n1\n2\n3\n0\n0\n0\n0\n1\n",
        )
        .unwrap();
        let out = dir.path().join("x.mtx");
        let gpu = |gpus: usize, b: &PathBuf| LsmrArgs {
            cpu: false,
            gpus: Some(gpus),
            ..cpu_args(a.clone(), b.clone(), out.clone())
        };
        let expect = |args: LsmrArgs, words: &[&str]| {
            let e = run(&args).unwrap_err();
            for w in words {
                assert!(e.contains(w), "{w:?} not in {e:?}");
            }
            assert!(!out.exists());
        };
        expect(gpu(0, &b), &["--gpus 0"]);
        expect(
            LsmrArgs {
                cpu: true,
                ..gpu(2, &b)
            },
            &["--cpu", "--gpus 2"],
        );
        expect(
            LsmrArgs {
                damp: vec![0.0, 1.0],
                ..gpu(2, &b)
            },
            &["--gpus 2", "2 damps"],
        );
        // the checks above come before reading: a missing A does not mask them
        expect(
            LsmrArgs {
                a: dir.path().join("none.mtx"),
                ..gpu(0, &b)
            },
            &["--gpus 0"],
        );
        expect(gpu(2, &bb), &["--gpus 2", "2 columns"]);
        // no GPU on this machine (CI): a clear error, not a CPU fallback; on a GPU machine,
        // more GPUs than it has
        if tessera::runtime::probe::driver().is_err() {
            expect(gpu(1, &b), &["--gpus 1", "no GPU"]);
        } else {
            expect(gpu(4096, &b), &["--gpus 4096", "GPU(s)"]);
        }
    }

    #[test]
    fn a_missing_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let args = cpu_args(
            dir.path().join("none.mtx"),
            dir.path().join("none_b.mtx"),
            dir.path().join("x.mtx"),
        );
        assert!(run(&args).is_err());
        assert!(!dir.path().join("x.mtx").exists());
    }
}
