//! `tessera bench lsmr`: GPU LSMR solves on the tall tomography-shaped systems
//! (synthetic stand-ins from sparse's generator: 306136 x 6177 with 18 nonzeros per row,
//! ~5.5M nnz, and 936063 x 23394 with 21, ~19.7M nnz), fp32 and fp64, with a fixed iteration
//! budget (`maxiter` [`BENCH_MAXITER`], `atol = btol = conlim = 0`, so only maxiter or a
//! machine-precision test stops it, and CuPy runs the same iterations), plus one small case
//! that SciPy also solves on the CPU.
//!
//! Real tomography ([`Problem::Tomography`]): the exact 2-D parallel-beam system matrix of
//! sparse's `parallel_beam_projector` with `b = A x_phantom` (the modified Shepp-Logan phantom,
//! computed in f64 and rounded to the value type), solved with damp 0 and with
//! [`TOMO_DAMP`]; `params.x_err_phantom` is `||x - x_phantom|| / ||x_phantom||` after the
//! iteration budget (the systems are square-ish and underdetermined at the image corners, so
//! it measures reconstruction, not solver accuracy).
//!
//! Each row: `ms` is the median wall time of a whole solve (setup, iterations, the stop-flag
//! checks, x back to the host); `params` carry `itn`, `istop`, `ms_per_iter`, the two-SpMV
//! floor (`floor_ms_per_iter`: one `A v` plus one `A^T u` timed alone) and their ratio, and
//! the relative residual; `one_iteration_ms` is a whole solve stopped by `maxiter = 1` (the
//! fixed cost: set-up, one iteration, the checks, x back), and `loop_ms_per_iter` the rest over
//! the other iterations (with `loop_over_floor`, its ratio to the floor). GB/s count the bytes
//! of `itn` iterations (two SpMVs' matrix, vector and output traffic plus the solver's vector
//! passes, lsmr.cu's roofline). Before timing, the solve is checked: its `normr` estimate must
//! match `||b - A x||` recomputed on the host.
//!
//! The damp list ([`damp_cases`]): 8 damps (0 and 1e-2 .. 1e2 times a typical column norm)
//! on the 8kv-shaped system in fp32, timed as one [`lsmr_damps`] run and as 8 separate
//! solves; `params.over_one_solve` is each time over one plain solve (the target: the
//! list in at most 2x one solve). The list is checked against the separate solves first.
//!
//! Many right-hand sides ([`many_cases`]): 8 random columns on the 8kv-shaped system (fp32,
//! and fp64), timed as one [`lsmr_many`] run (SpMM products) and as 8 separate solves;
//! `params` carry `ms_per_iter` (wall time over the most iterations of any column), one plain
//! solve's `one_solve_ms` and `one_solve_ms_per_iter`, and `over_one_solve`. Each column is
//! checked against its own solve first.
//!
//! The matrix is written to `$TMPDIR/tessera-lsmr/<case>.{offsets,indices,values,b}` (raw
//! little-endian; tomography cases also `<case>.phantom`, f64) for the baseline runner (scripts/baselines/bench_torch.py --op lsmr:
//! `cupyx.scipy.sparse.linalg.lsmr` with the same options, and SciPy on the CPU when the
//! case's `scipy` flag is set), which solves the very same system.

use serde_json::{json, Value};

use super::device_operator::{sparse_operator, sparse_operator_with, SparseOperatorOptions, Storage};
use super::lsmr::LsmrOptions;
use super::lsmr_device::{lsmr, lsmr_damps, lsmr_many, lsmr_with, LsmrRunOptions, ManyRhs};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::harness::BenchOutcome;
use crate::runtime::{time_median, Context, DeviceBuffer, TimingOptions};
use crate::sparse::bench::{TOMO_LARGE, TOMO_SMALL};
use crate::sparse::generate::{
    parallel_beam_projector, random_vector, shepp_logan, try_generate, MatrixClass, ParallelBeam,
};
use crate::sparse::CsrHost;

/// The iteration budget of every case.
pub const BENCH_MAXITER: usize = 200;

/// The damp of the damped tomography case: about a thirteenth of a typical column norm of the
/// 256 x 256, 180-angle system (`||A||_F / sqrt(n)` = 13.05; column norms grow with the
/// number of angles), so it regularises the directions of small singular values only (CPU
/// reference, 200 iterations: relres 8.1e-3 and `x_err_phantom` 0.113 against 1.7e-4 and
/// 0.107 undamped).
pub const TOMO_DAMP: f64 = 1.0;

/// What a benchmark case solves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Problem {
    /// sparse's `TallLeastSquares` random matrix with `per_row` nonzeros per row and a random
    /// `b` (the stand-ins).
    TallLs { per_row: usize },
    /// The parallel-beam system matrix of the geometry and `b = A x_phantom`.
    Tomography(ParallelBeam),
}

/// One benchmark case.
#[derive(Clone, Debug)]
pub struct BenchCase {
    pub problem: Problem,
    pub rows: usize,
    pub cols: usize,
    pub value: DType,
    pub storage: Storage,
    /// Also solve with SciPy on the CPU (small cases only).
    pub scipy: bool,
    /// Replay batches of iterations as CUDA graphs; false (the default) launches directly.
    pub graph: bool,
    /// LSMR's damp (0 for the plain least-squares problem).
    pub damp: f64,
    /// The operator's SpMV plans autotuned at construction
    /// ([`SparseOperatorOptions::autotune_spmv`](super::SparseOperatorOptions)); impl
    /// `tessera-autotuned` beside the rules' row of the same case.
    pub autotune: bool,
}

impl BenchCase {
    pub fn name(&self) -> String {
        let storage = match self.storage {
            Storage::Single => " single",
            _ => "",
        };
        let problem = match self.problem {
            Problem::TallLs { per_row } => format!("tallls{per_row}"),
            Problem::Tomography(g) => g.name(),
        };
        let damp = if self.damp != 0.0 {
            format!(" damp{}", self.damp)
        } else {
            String::new()
        };
        format!(
            "lsmr {problem} {}x{} {}{storage}{damp}{}",
            self.rows,
            self.cols,
            self.value,
            if self.graph { " graph" } else { "" }
        )
    }
    /// The file stem the system is written to for the baseline runner.
    pub fn matrix_stem(&self) -> String {
        let dir = std::env::temp_dir().join("tessera-lsmr");
        dir.join(self.name().replace(' ', "_")).to_string_lossy().into_owned()
    }
    pub fn params(&self) -> Value {
        let mut p = json!({
            "rows": self.rows, "cols": self.cols,
            "dtype": self.value.name(), "index": "i32", "maxiter": BENCH_MAXITER,
            "atol": 0.0, "btol": 0.0, "conlim": 0.0, "damp": self.damp,
            "storage": format!("{:?}", self.storage).to_lowercase(),
            "matrix": self.matrix_stem(), "scipy": self.scipy, "graph": self.graph,
        });
        match self.problem {
            Problem::TallLs { per_row } => p["per_row"] = json!(per_row),
            Problem::Tomography(g) => {
                p["class"] = json!(g.name());
                p["b"] = json!("A x_phantom");
            }
        }
        p
    }
}

/// The cases (`quick`: the two small ones, the second a 64 x 64 tomography that SciPy also
/// solves). Tomography: 256^2 (180 x 363) fp32 and fp64 with damp 0, fp32 with [`TOMO_DAMP`],
/// and 512^2 (360 x 725, ~120M nnz) fp32 with damp 0.
pub fn cases(quick: bool) -> Vec<BenchCase> {
    let c = |rows, cols, per_row, value, storage, scipy| BenchCase {
        problem: Problem::TallLs { per_row },
        rows,
        cols,
        value,
        storage,
        scipy,
        graph: false,
        damp: 0.0,
        autotune: false,
    };
    let tomo = |g: ParallelBeam, value, damp, scipy| BenchCase {
        problem: Problem::Tomography(g),
        rows: g.rows(),
        cols: g.cols(),
        value,
        storage: Storage::Dual,
        scipy,
        damp,
        graph: false,
        autotune: false,
    };
    let small = c(30_000, 617, 18, DType::F64, Storage::Dual, true);
    let small_tomo = tomo(ParallelBeam::new(64, 45, 91), DType::F64, 0.0, true);
    if quick {
        return vec![small, small_tomo];
    }
    let mut out = vec![small, small_tomo];
    for value in [DType::F32, DType::F64] {
        out.push(c(306_136, 6_177, 18, value, Storage::Dual, false));
        out.push(c(936_063, 23_394, 21, value, Storage::Dual, false));
    }
    // the SpMV plans autotuned (16-bit columns, panels and lanes timed per matrix), fp32
    for (rows, cols, per_row) in [(306_136, 6_177, 18), (936_063, 23_394, 21)] {
        out.push(BenchCase {
            autotune: true,
            ..c(rows, cols, per_row, DType::F32, Storage::Dual, false)
        });
    }
    out.push(c(306_136, 6_177, 18, DType::F32, Storage::Single, false));
    // batches of iterations replayed as CUDA graphs (LsmrRunOptions::graph)
    out.push(BenchCase {
        graph: true,
        ..c(306_136, 6_177, 18, DType::F32, Storage::Dual, false)
    });
    out.push(tomo(TOMO_SMALL, DType::F32, 0.0, false));
    out.push(tomo(TOMO_SMALL, DType::F64, 0.0, false));
    out.push(tomo(TOMO_SMALL, DType::F32, TOMO_DAMP, false));
    out.push(tomo(TOMO_LARGE, DType::F32, 0.0, false));
    out
}

pub fn bench_case(ctx: &Context, case: &BenchCase, seed: u64, timing: TimingOptions) -> Result<BenchOutcome> {
    crate::dispatch_float!("lsmr bench"; case.value, [F32, F64], |T| run::<T>(ctx, case, seed, timing))
}

/// Bytes one iteration moves at least: two SpMVs (A and A^T) and lsmr.cu's vector passes.
pub fn bytes_per_iteration<T: Element>(a: &CsrHost<T, i32>) -> usize {
    let s = T::DTYPE.size();
    let spmv = crate::sparse::bench::bytes(a);
    let spmv_t = a.nnz() * (s + 4) + (a.cols + 1) * 4 + a.rows * s + a.cols * s;
    spmv + spmv_t + (3 * a.rows + 11 * a.cols) * s
}

/// The matrix, `b`, and the phantom `b` was made from (tomography only).
type System<T> = (CsrHost<T, i32>, Vec<T>, Option<Vec<f64>>);

fn system<T: Element>(case: &BenchCase, seed: u64) -> Result<System<T>> {
    match case.problem {
        Problem::TallLs { per_row } => {
            let a = try_generate::<T, i32>(MatrixClass::TallLeastSquares { per_row }, case.rows, case.cols, seed)?;
            let b = random_vector(case.rows, seed ^ 0xb)
                .into_iter()
                .map(T::from_f64)
                .collect();
            Ok((a, b, None))
        }
        Problem::Tomography(g) => {
            let a = parallel_beam_projector::<T, i32>(&g)?;
            let phantom = shepp_logan(g.n);
            let mut b = vec![0.0; a.rows];
            crate::sparse::reference::spmv(&a, 1.0, &phantom, 0.0, &mut b);
            Ok((a, b.into_iter().map(T::from_f64).collect(), Some(phantom)))
        }
    }
}

fn run<T: Element>(ctx: &Context, case: &BenchCase, seed: u64, timing: TimingOptions) -> Result<BenchOutcome> {
    let (a, b, phantom) = system::<T>(case, seed)?;
    let stem = case.matrix_stem();
    crate::sparse::bench::write_matrix(&a, &stem)?;
    write_raw(&format!("{stem}.b"), &b)?;
    if let Some(ph) = &phantom {
        write_raw(&format!("{stem}.phantom"), ph)?;
    }

    let op = sparse_operator_with(
        ctx,
        &a,
        &SparseOperatorOptions {
            storage: case.storage,
            autotune_spmv: case.autotune,
        },
    )?;
    let db = ctx.upload(&b)?;
    let opts = LsmrOptions {
        atol: 0.0,
        btol: 0.0,
        conlim: 0.0,
        maxiter: Some(BENCH_MAXITER),
        damp: case.damp,
        ..LsmrOptions::default()
    };
    let solve_with = |opts: &LsmrOptions| {
        let mut run = LsmrRunOptions {
            graph: case.graph,
            ..LsmrRunOptions::default()
        };
        lsmr_with(ctx, op.as_ref(), &db, opts, &mut run)
    };
    let solve = || solve_with(&opts);
    let res = solve()?;

    // check: the normr estimate against ||[b; 0] - [A; damp I] x|| on the host
    let mut r: Vec<f64> = b.iter().map(|v| v.to_f64()).collect();
    for (row, ri) in r.iter_mut().enumerate() {
        let (cols, vals) = a.row(row);
        let ax: f64 = cols
            .iter()
            .zip(vals)
            .map(|(&c, v)| v.to_f64() * res.x[c as usize])
            .sum();
        *ri -= ax;
    }
    let normx2 = res.x.iter().map(|e| e * e).sum::<f64>();
    let true_normr = (r.iter().map(|e| e * e).sum::<f64>() + case.damp * case.damp * normx2).sqrt();
    let normb = b.iter().map(|v| v.to_f64().powi(2)).sum::<f64>().sqrt();
    let est_err = (res.normr - true_normr).abs() / normb;
    let budget = if T::DTYPE == DType::F32 { 1e-3 } else { 1e-8 };
    if est_err.is_nan() || est_err > budget {
        return Err(Error::Unsupported(format!(
            "{}: the normr estimate {:.6e} differs from ||[b; 0] - [A; damp I] x|| = {:.6e} by {est_err:.2e} ||b|| (budget \
             {budget:.0e}) before timing",
            case.name(),
            res.normr,
            true_normr
        )));
    }

    // the whole solve, wall time (one solve per group: it holds its own synchronisations)
    let solve_timing = whole_solve_timing(timing);
    let t = time_median(ctx, solve_timing, |_| solve().map(|_| ()))?;
    // the fixed cost of a solve (set-up, one iteration, the checks, x back), so that the
    // loop's own cost per iteration can be told from it
    let one_iteration = LsmrOptions {
        maxiter: Some(1),
        ..opts.clone()
    };
    let t_one = time_median(ctx, solve_timing, |_| solve_with(&one_iteration).map(|_| ()))?;
    // the floor: one A v and one A^T u alone
    let dv = ctx.upload(
        &random_vector(case.cols, seed ^ 0x7)
            .into_iter()
            .map(T::from_f64)
            .collect::<Vec<T>>(),
    )?;
    let mut av = ctx.alloc::<T>(case.rows)?;
    let mut atu = ctx.alloc::<T>(case.cols)?;
    let floor = time_median(ctx, timing, |_| {
        op.apply(1.0, &dv, 0.0, &mut av)?;
        op.apply_transposed(1.0, &db, 0.0, &mut atu)
    })?;
    let itn = res.itn.max(1);
    let ms_per_iter = t.median_ms / itn as f64;
    Ok(BenchOutcome {
        case: case.name(),
        params: {
            let mut p = case.params();
            p["itn"] = json!(res.itn);
            p["istop"] = json!(res.istop);
            p["ms_per_iter"] = json!(ms_per_iter);
            p["floor_ms_per_iter"] = json!(floor.median_ms);
            p["per_iter_over_floor"] = json!(ms_per_iter / floor.median_ms);
            p["one_iteration_ms"] = json!(t_one.median_ms);
            if itn > 1 {
                let loop_ms = (t.median_ms - t_one.median_ms) / (itn - 1) as f64;
                p["loop_ms_per_iter"] = json!(loop_ms);
                p["loop_over_floor"] = json!(loop_ms / floor.median_ms);
            }
            p["relres"] = json!(res.normr / normb);
            p["storage_used"] = json!(op.storage());
            p["nnz"] = json!(a.nnz());
            if let Some(ph) = &phantom {
                let err = ph.iter().zip(&res.x).map(|(p, x)| (x - p).powi(2)).sum::<f64>().sqrt();
                p["x_err_phantom"] = json!(err / ph.iter().map(|p| p * p).sum::<f64>().sqrt());
            }
            p
        },
        implementation: match (case.storage, case.graph, case.autotune) {
            (Storage::Single, _, _) => "tessera-single".into(),
            (_, true, _) => "tessera-graph".into(),
            (_, _, true) => "tessera-autotuned".into(),
            _ => "tessera".into(),
        },
        ms: t.median_ms,
        gbps: Some(bytes_per_iteration(&a) as f64 * itn as f64 / (t.median_ms * 1e-3) / 1e9),
        tflops: None,
        extra_mib: None,
        max_abs_err: None,
        rel_l2: Some(est_err),
    })
}

/// Timing of whole solves: one solve per group (it holds its own synchronisations), one
/// warm-up solve, five groups.
fn whole_solve_timing(timing: TimingOptions) -> TimingOptions {
    TimingOptions {
        warmup: 1,
        warmup_ms: 0.0,
        groups: 5,
        reps: Some(1),
        ..timing
    }
}

/// Writes `xs` as raw little-endian values.
fn write_raw<T: Element>(path: &str, xs: &[T]) -> Result<()> {
    // SAFETY: Element types are plain data without padding (dtype.rs); the byte view has
    // exactly the slice's size and lifetime.
    let bytes = unsafe { std::slice::from_raw_parts(xs.as_ptr() as *const u8, std::mem::size_of_val(xs)) };
    std::fs::write(path, bytes).map_err(|e| Error::Io {
        context: format!("writing the benchmark vector {path}"),
        source: e,
    })
}

// ---- the damp list ----

/// The damps of the damp-list benchmark: 0 and seven values from 1e-2 to 1e2 times
/// `||A||_F / sqrt(n)` (a typical column norm), so they span weak to strong regularisation.
pub fn bench_damps(typical: f64) -> Vec<f64> {
    let mut d = vec![0.0];
    d.extend((0..7).map(|j| typical * 10f64.powf(-2.0 + 4.0 * j as f64 / 6.0)));
    d
}

/// One damp-list benchmark row: 8 damps on the 8kv-shaped system, solved as one damp list
/// (`separate = false`) or as 8 separate solves (`separate = true`), with the fixed
/// iteration budget of the other cases.
#[derive(Clone, Debug)]
pub struct DampBenchCase {
    pub rows: usize,
    pub cols: usize,
    pub per_row: usize,
    pub value: DType,
    pub separate: bool,
}

impl DampBenchCase {
    pub fn name(&self) -> String {
        format!(
            "lsmr damps8 tallls{} {}x{} {}{}",
            self.per_row,
            self.rows,
            self.cols,
            self.value,
            if self.separate { " separate" } else { "" }
        )
    }
}

/// The damp-list cases: the 8kv shape in fp32, as a list and as separate solves (`quick`: a
/// small shape).
pub fn damp_cases(quick: bool) -> Vec<DampBenchCase> {
    let (rows, cols) = if quick { (30_000, 617) } else { (306_136, 6_177) };
    [false, true]
        .into_iter()
        .map(|separate| DampBenchCase {
            rows,
            cols,
            per_row: 18,
            value: DType::F32,
            separate,
        })
        .collect()
}

pub fn bench_damp_case(ctx: &Context, case: &DampBenchCase, seed: u64, timing: TimingOptions) -> Result<BenchOutcome> {
    crate::dispatch_float!("lsmr bench damps"; case.value, [F32, F64], |T| run_damps::<T>(ctx, case, seed, timing))
}

/// Times the 8 damps as one damp list or as 8 solves, and one plain solve (damp 0) for the
/// ratio the issue targets (the list in at most 2x one solve). Before timing, the list's
/// results are checked against the separate solves (bitwise: same kernels, dual storage).
fn run_damps<T: Element>(
    ctx: &Context,
    case: &DampBenchCase,
    seed: u64,
    timing: TimingOptions,
) -> Result<BenchOutcome> {
    let a = try_generate::<T, i32>(
        MatrixClass::TallLeastSquares { per_row: case.per_row },
        case.rows,
        case.cols,
        seed,
    )?;
    let b: Vec<T> = random_vector(case.rows, seed ^ 0xb)
        .into_iter()
        .map(T::from_f64)
        .collect();
    let frob = a.values.iter().map(|v| v.to_f64().powi(2)).sum::<f64>().sqrt();
    let damps = bench_damps(frob / (case.cols as f64).sqrt());
    let op = sparse_operator(ctx, &a, Storage::Dual)?;
    let db = ctx.upload(&b)?;
    let opts = LsmrOptions {
        atol: 0.0,
        btol: 0.0,
        conlim: 0.0,
        maxiter: Some(BENCH_MAXITER),
        ..LsmrOptions::default()
    };
    let list = lsmr_damps(ctx, op.as_ref(), &db, &damps, &opts)?;
    let mut itns = Vec::new();
    for (&damp, r) in damps.iter().zip(&list) {
        let alone = lsmr(ctx, op.as_ref(), &db, &LsmrOptions { damp, ..opts.clone() })?;
        if alone.x != r.x || alone.itn != r.itn || alone.istop != r.istop {
            return Err(Error::Unsupported(format!(
                "{}: damp {damp:.3e} of the list differs from its own solve (itn {} vs {}) before timing",
                case.name(),
                r.itn,
                alone.itn
            )));
        }
        itns.push(r.itn);
    }

    let solve_timing = whole_solve_timing(timing);
    let t = if case.separate {
        time_median(ctx, solve_timing, |_| {
            for &damp in &damps {
                lsmr(ctx, op.as_ref(), &db, &LsmrOptions { damp, ..opts.clone() })?;
            }
            Ok(())
        })?
    } else {
        time_median(ctx, solve_timing, |_| {
            lsmr_damps(ctx, op.as_ref(), &db, &damps, &opts).map(|_| ())
        })?
    };
    let one = time_median(ctx, solve_timing, |_| lsmr(ctx, op.as_ref(), &db, &opts).map(|_| ()))?;
    let itn = itns.iter().copied().max().unwrap_or(0).max(1);
    // bytes: one iteration's products and shared vector work, plus 6 n per damp (h, hbar, x)
    let s = T::DTYPE.size();
    let per_iter = bytes_per_iteration(&a) + 6 * case.cols * s * (damps.len() - 1);
    let bytes = if case.separate {
        bytes_per_iteration(&a) * itns.iter().sum::<usize>()
    } else {
        per_iter * itn
    };
    Ok(BenchOutcome {
        case: case.name(),
        params: json!({
            "rows": case.rows, "cols": case.cols, "per_row": case.per_row, "nnz": a.nnz(),
            "dtype": case.value.name(), "index": "i32", "maxiter": BENCH_MAXITER,
            "atol": 0.0, "btol": 0.0, "conlim": 0.0, "damps": damps, "itn": itns,
            "istop": list.iter().map(|r| r.istop).collect::<Vec<_>>(),
            "separate": case.separate,
            "one_solve_ms": one.median_ms,
            "over_one_solve": t.median_ms / one.median_ms,
        }),
        implementation: if case.separate {
            "tessera-separate".into()
        } else {
            "tessera".into()
        },
        ms: t.median_ms,
        gbps: Some(bytes as f64 / (t.median_ms * 1e-3) / 1e9),
        tflops: None,
        extra_mib: None,
        max_abs_err: None,
        rel_l2: None,
    })
}

// ---- many right-hand sides ----

/// Iterations a column of the batched solve may stop apart from its own solve before timing (or
/// a tenth of its iterations, if more): the benchmark's stops are machine-precision tests
/// (atol = btol = 0), whose crossing moves by a few iterations with the last bits of the
/// products (SpMM and SpMV sum in other orders; measured in fp32: 104 against 102, 103 against
/// 107, 90 against 95).
const ITN_SLACK: usize = 3;

/// Right-hand sides of the many-right-hand-sides benchmark.
pub const BENCH_RHS: usize = 8;

/// One many-right-hand-sides benchmark row: [`BENCH_RHS`] random columns on the 8kv-shaped
/// system, solved together by [`lsmr_many`] (`separate = false`: SpMM products) or as
/// separate [`lsmr`] solves (`separate = true`), with the fixed iteration budget of the
/// other cases.
#[derive(Clone, Debug)]
pub struct ManyBenchCase {
    pub rows: usize,
    pub cols: usize,
    pub per_row: usize,
    pub value: DType,
    pub separate: bool,
}

impl ManyBenchCase {
    pub fn name(&self) -> String {
        format!(
            "lsmr many{BENCH_RHS} tallls{} {}x{} {}{}",
            self.per_row,
            self.rows,
            self.cols,
            self.value,
            if self.separate { " separate" } else { "" }
        )
    }
}

/// The many-right-hand-sides cases: the 8kv shape in fp32 together and separately, and in
/// fp64 together (`quick`: a small shape, fp32).
pub fn many_cases(quick: bool) -> Vec<ManyBenchCase> {
    let (rows, cols) = if quick { (30_000, 617) } else { (306_136, 6_177) };
    let c = |value, separate| ManyBenchCase {
        rows,
        cols,
        per_row: 18,
        value,
        separate,
    };
    let mut out = vec![c(DType::F32, false), c(DType::F32, true)];
    if !quick {
        out.push(c(DType::F64, false));
    }
    out
}

pub fn bench_many_case(ctx: &Context, case: &ManyBenchCase, seed: u64, timing: TimingOptions) -> Result<BenchOutcome> {
    crate::dispatch_float!("lsmr bench many"; case.value, [F32, F64], |T| run_many::<T>(ctx, case, seed, timing))
}

/// Times the [`BENCH_RHS`] columns solved together or separately, and one plain solve (the
/// first column) for the ratios (`over_one_solve`: the whole run over one solve; the ideal of
/// shared products is well under `BENCH_RHS`). Before timing, each column of the run is
/// checked against its own solve: same istop, itn within [`ITN_SLACK`] (or a tenth), normr within 1e-3 (fp32: 1e-2)
/// relative (the SpMM sums in another order than the SpMV).
fn run_many<T: Element>(ctx: &Context, case: &ManyBenchCase, seed: u64, timing: TimingOptions) -> Result<BenchOutcome> {
    let a = try_generate::<T, i32>(
        MatrixClass::TallLeastSquares { per_row: case.per_row },
        case.rows,
        case.cols,
        seed,
    )?;
    let (m, k) = (case.rows, BENCH_RHS);
    let b: Vec<T> = (0..k)
        .flat_map(|j| random_vector(m, seed ^ 0xb ^ ((j as u64) << 20)))
        .map(T::from_f64)
        .collect();
    let op = sparse_operator(ctx, &a, Storage::Dual)?;
    let db = ctx.upload(&b)?;
    let columns: Vec<DeviceBuffer<T>> = (0..k)
        .map(|j| ctx.upload(&b[j * m..(j + 1) * m]))
        .collect::<Result<_>>()?;
    let opts = LsmrOptions {
        atol: 0.0,
        btol: 0.0,
        conlim: 0.0,
        maxiter: Some(BENCH_MAXITER),
        ..LsmrOptions::default()
    };
    let many = lsmr_many(ctx, op.as_ref(), ManyRhs::Device(&db), k, None, &opts)?;
    let budget = if T::DTYPE == DType::F32 { 1e-2 } else { 1e-3 };
    let mut itns = Vec::new();
    for (j, r) in many.iter().enumerate() {
        let alone = lsmr(ctx, op.as_ref(), &columns[j], &opts)?;
        let err = (r.normr - alone.normr).abs() / alone.normr.abs().max(f64::MIN_POSITIVE);
        if r.istop != alone.istop
            || r.itn.abs_diff(alone.itn) > ITN_SLACK.max(r.itn.max(alone.itn) / 10)
            || err.is_nan()
            || err > budget
        {
            return Err(Error::Unsupported(format!(
                "{}: column {j} differs from its own solve (istop {} vs {}, itn {} vs {}, normr by {err:.2e}) \
                 before timing",
                case.name(),
                r.istop,
                alone.istop,
                r.itn,
                alone.itn
            )));
        }
        itns.push(r.itn);
    }

    let solve_timing = whole_solve_timing(timing);
    let t = if case.separate {
        time_median(ctx, solve_timing, |_| {
            for col in &columns {
                lsmr(ctx, op.as_ref(), col, &opts)?;
            }
            Ok(())
        })?
    } else {
        time_median(ctx, solve_timing, |_| {
            lsmr_many(ctx, op.as_ref(), ManyRhs::Device(&db), k, None, &opts).map(|_| ())
        })?
    };
    let one = time_median(ctx, solve_timing, |_| {
        lsmr(ctx, op.as_ref(), &columns[0], &opts).map(|_| ())
    })?;
    let itn = itns.iter().copied().max().unwrap_or(0).max(1);
    // bytes: k times one iteration's vector work and products' vectors; the matrix bytes of
    // the SpMM are counted once per pass of 8 columns (a lower bound: the SpMM gathers B rows)
    let bytes = bytes_per_iteration(&a)
        * if case.separate {
            itns.iter().sum::<usize>()
        } else {
            k * itn
        };
    Ok(BenchOutcome {
        case: case.name(),
        params: json!({
            "rows": case.rows, "cols": case.cols, "per_row": case.per_row, "nnz": a.nnz(),
            "dtype": case.value.name(), "index": "i32", "maxiter": BENCH_MAXITER,
            "atol": 0.0, "btol": 0.0, "conlim": 0.0, "rhs": k, "itn": itns,
            "istop": many.iter().map(|r| r.istop).collect::<Vec<_>>(),
            "separate": case.separate,
            "ms_per_iter": t.median_ms / itn as f64,
            "one_solve_ms": one.median_ms,
            "one_solve_ms_per_iter": one.median_ms / itns[0].max(1) as f64,
            "over_one_solve": t.median_ms / one.median_ms,
        }),
        implementation: if case.separate {
            "tessera-separate".into()
        } else {
            "tessera".into()
        },
        ms: t.median_ms,
        // the traffic of k separate solves (what the shared products save shows as GB/s
        // above the separate row's)
        gbps: Some(bytes as f64 / (t.median_ms * 1e-3) / 1e9),
        tflops: None,
        extra_mib: None,
        max_abs_err: None,
        rel_l2: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linalg::lsmr::lsmr_host;

    #[test]
    fn case_names_and_params() {
        let all = cases(false);
        let names: std::collections::HashSet<String> = all.iter().map(BenchCase::name).collect();
        let tuned: Vec<_> = all.iter().filter(|c| c.autotune).collect();
        assert_eq!(
            names.len() + tuned.len(),
            all.len(),
            "names are unique but for the autotuned rows"
        );
        // each autotuned row shares its case with a rules' row (the same baselines)
        assert_eq!(tuned.len(), 2);
        for c in tuned {
            assert!(all.iter().any(|r| !r.autotune && r.name() == c.name()), "{}", c.name());
        }
        assert!(names.contains("lsmr tomo256_180x363 65340x65536 fp32"));
        assert!(names.contains("lsmr tomo256_180x363 65340x65536 fp32 damp1"));
        assert!(names.contains("lsmr tomo512_360x725 261000x262144 fp32"));
        assert!(names.contains("lsmr tallls18 306136x6177 fp32 single"));
        let damped = all.iter().find(|c| c.damp > 0.0).unwrap();
        assert_eq!(damped.params()["damp"], json!(TOMO_DAMP));
        assert_eq!(all[0].params()["per_row"], json!(18));
        assert_eq!(cases(true).len(), 2);
    }

    /// The quick tomography system: b = A phantom, and a CPU solve with the bench's options
    /// approaches the phantom (reported in the bench's `x_err_phantom`).
    #[test]
    fn tomography_system_is_consistent() {
        let case = &cases(true)[1];
        let (a, b, phantom) = system::<f64>(case, 1).unwrap();
        let phantom = phantom.unwrap();
        assert_eq!((a.rows, a.cols, b.len()), (case.rows, case.cols, case.rows));
        let mut r = b.clone();
        crate::sparse::reference::spmv(&a, -1.0, &phantom, 1.0, &mut r);
        assert!(r.iter().all(|e| e.abs() < 1e-12));
        let norm = |v: &[f64]| v.iter().map(|e| e * e).sum::<f64>().sqrt();
        for damp in [0.0, TOMO_DAMP] {
            let opts = LsmrOptions {
                atol: 0.0,
                btol: 0.0,
                conlim: 0.0,
                maxiter: Some(BENCH_MAXITER),
                damp,
                ..LsmrOptions::default()
            };
            let res = lsmr_host(&a, &b, &opts).unwrap();
            let diff: Vec<f64> = res.x.iter().zip(&phantom).map(|(x, p)| x - p).collect();
            let err = norm(&diff) / norm(&phantom);
            println!("64^2 tomography, damp {damp}: itn {} x_err_phantom {err:.3}", res.itn);
            assert!(err < 0.5, "damp {damp}: x_err_phantom {err}");
        }
    }
}
