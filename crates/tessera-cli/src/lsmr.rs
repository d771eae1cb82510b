//! `tessera lsmr A.mtx b.mtx -o x.mtx`: solves `min ||A x - b||^2 + damp^2 ||x||^2` by LSMR
//! with SciPy's options and stopping rules, on the GPU when one is usable, else with the CPU
//! reference (it says which). A progress line every `--progress-every` iterations (on the GPU
//! at the solver's stop-flag checks, every 16 iterations), and the stop reason in words at the
//! end. `x` is written as a Matrix Market `array` file.

use std::path::PathBuf;
use std::time::Instant;

use tessera::linalg::{
    istop_reason, lsmr_host, lsmr_with, mtx_vector, sparse_operator, HostLinearOperator, LsmrOptions, LsmrResult,
    LsmrRunOptions, Storage,
};
use tessera::runtime::Context;
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
    /// The right-hand side b (Matrix Market array file, or a coordinate vector).
    pub b: PathBuf,
    /// Where to write x (Matrix Market array file, n x 1).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Damping: minimise ||A x - b||^2 + damp^2 ||x||^2.
    #[arg(long, default_value_t = 0.0)]
    pub damp: f64,
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
    /// An initial guess x0 (Matrix Market vector of n values).
    #[arg(long)]
    pub x0: Option<PathBuf>,
    /// Storage precision on the GPU (f32: vectors and SpMV in f32, recurrences in f64).
    #[arg(long, value_enum, default_value_t = Precision::F64)]
    pub dtype: Precision,
    /// Keep only A on the GPU (A^T x without a transposed copy) instead of A and A^T.
    #[arg(long)]
    pub single_storage: bool,
    /// Use the CPU reference even when a GPU is present.
    #[arg(long)]
    pub cpu: bool,
    /// A progress line every this many iterations (0: none).
    #[arg(long, default_value_t = 100)]
    pub progress_every: usize,
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
}

pub fn run(args: &LsmrArgs) -> Result<bool, String> {
    let t = Instant::now();
    let a = read_mtx_csr::<f64, i64>(&args.a).map_err(|e| e.to_string())?;
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
    let opts = LsmrOptions {
        damp: args.damp,
        atol: args.atol,
        btol: args.btol,
        conlim: args.conlim,
        maxiter: args.maxiter,
        x0,
        show: false,
        scale_columns: false,
    };
    let t = Instant::now();
    let gpu = if args.cpu {
        Err("--cpu was given".to_string())
    } else {
        Context::new(args.device).map_err(|e| e.to_string())
    };
    let res = match gpu {
        Ok(ctx) => {
            let storage = if args.single_storage {
                Storage::Single
            } else {
                Storage::Auto
            };
            match args.dtype {
                Precision::F64 => solve_gpu::<f64>(&ctx, &a, &b, &opts, storage, args.progress_every),
                Precision::F32 => solve_gpu::<f32>(&ctx, &a, &b, &opts, storage, args.progress_every),
            }
        }
        Err(why) => {
            println!("lsmr: on the CPU (f64 reference solver): no GPU used: {why}");
            solve_cpu(&a, &b, &opts, args.progress_every)
        }
    }
    .map_err(|e| e.to_string())?;
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

fn solve_gpu<T: Element>(
    ctx: &Context,
    a: &CsrHost<f64, i64>,
    b: &[f64],
    opts: &LsmrOptions,
    storage: Storage,
    every: usize,
) -> tessera::Result<LsmrResult> {
    let at = CsrHost::<T, i64> {
        rows: a.rows,
        cols: a.cols,
        offsets: a.offsets.clone(),
        indices: a.indices.clone(),
        values: a.values.iter().map(|&v| T::from_f64(v)).collect(),
        sorted: a.sorted,
    };
    let op = sparse_operator(ctx, &at, storage)?;
    println!(
        "lsmr: on the GPU: {} ({}), {} storage {}",
        ctx.info().name,
        ctx.arch(),
        T::DTYPE,
        op.storage()
    );
    let bt: Vec<T> = b.iter().map(|&v| T::from_f64(v)).collect();
    let db = ctx.upload(&bt)?;
    let mut next = every;
    let mut run = LsmrRunOptions {
        progress: Some(Box::new(move |itn, normr, normar, secs| {
            if every > 0 && itn >= next {
                println!("lsmr: itn {itn:>8}  ||r|| {normr:.6e}  ||A^T r|| {normar:.6e}  {secs:8.3}s");
                next = (itn / every + 1) * every;
            }
        })),
        ..LsmrRunOptions::default()
    };
    lsmr_with(ctx, op.as_ref(), &db, opts, &mut run)
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
            damp: 0.0,
            atol: 1e-6,
            btol: 1e-6,
            conlim: 1e8,
            maxiter: None,
            x0: None,
            dtype: Precision::F64,
            single_storage: false,
            cpu: true,
            progress_every: 1,
            device: 0,
        }
    }

    /// The CPU path end to end: files in, x out, the normal equations hold.
    #[test]
    fn cpu_solve_writes_the_least_squares_solution() {
        let dir = tempfile::tempdir().unwrap();
        // a 4 x 2 inconsistent system: A = [1 0; 1 1; 0 2; 1 -1], b = [1 2 3 0]
        let a = dir.path().join("A.mtx");
        std::fs::write(
            &a,
            "%%MatrixMarket matrix coordinate real general\n4 2 6\n1 1 1\n2 1 1\n2 2 1\n3 2 2\n4 1 1\n4 2 -1\n",
        )
        .unwrap();
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
