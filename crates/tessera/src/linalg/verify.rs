//! `tessera verify lsmr`: the GPU solver against the CPU reference [`lsmr_host`] on the same
//! problems: the 25 SciPy fixture problems (square, tall, wide, rank deficient, inconsistent,
//! ill conditioned with the conlim and the machine-precision stops, zero b with and without x0,
//! an exact x0, damped tall and wide, warm starts, maxiter-limited and maxiter = 0, tight
//! tolerances, SciPy's bidiagonal and Lauchli matrices) and larger seeded random sparse
//! problems (tall, wide, damped, warm-started, maxiter-limited), in fp64 with dual and single
//! storage and in fp32 with dual storage.
//!
//! Each case requires the same `istop` as the reference, `itn` within 1, and `x`, `normr`, `normar`, `norma`,
//! `conda`, `normx` within the case's tolerance; fp64 fixture cases are also held to SciPy's
//! own result (in the fixture file) with the same tolerance. Dual-storage cases are
//! also solved a second time checking the stop flag after every iteration
//! (`check_every = 1`): the result must be bitwise the same (the batched stop is exact and the
//! solver deterministic). One more case checks the solver's argument errors on the device.
//!
//! Tolerances. fp64: the fixtures' own tolerances against SciPy (`fixtures::tolerance`, whose
//! reasons `lsmr_tests.rs` gives; our GPU sums norms in another order than the CPU reference,
//! as SciPy's BLAS does), and for the random problems, which run tens to hundreds of
//! iterations past the loss of orthogonality, the loose class `LONG_RUN`. fp32: the vectors are
//! rounded to f32 (error ~ cond * 6e-8 per step), so only well-conditioned fixtures are used,
//! with `atol`/`btol` raised to at least [`F32_MIN_TOL`] (reachable in f32), compared against
//! the f64 reference on the f32-rounded matrix and `b` with `FP32`.

use serde_json::{json, Value};

use super::dense_operator::{check_dense, stored_index, stored_shape, DenseLayout, DenseOperator};
use super::device_operator::{FnDeviceOperator, LinearOperator, SparseDualOperator, SparseSingleOperator};
use super::fixtures::{compare, fixture_cases, rel_l2, tolerance, Tol};
use super::lsmr::{lsmr_host, LsmrOptions, LsmrResult};
use super::lsmr_device::{lsmr, lsmr_with, LsmrRunOptions};
use super::operator::{DenseHost, HostLinearOperator};
use crate::check::compare as compare_vectors;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::harness::VerifyOutcome;
use crate::runtime::Context;
use crate::sparse::generate::{random_vector, try_generate, MatrixClass};
use crate::sparse::CsrHost;

/// fp32 solves use `atol`, `btol` of at least this (smaller ones are below f32 rounding).
pub const F32_MIN_TOL: f64 = 1e-4;

/// Random problems run long (loss of orthogonality): x to 1e-4, estimates to 1e-2.
const LONG_RUN: Tol = Tol {
    x: 1e-4,
    est: 1e-2,
    floor: 1e-6,
    conda: 1.5,
};

/// fp32 against the f64 reference on the same (rounded) data.
const FP32: Tol = Tol {
    x: 1e-2,
    est: 1e-2,
    floor: 1e-4,
    conda: 1.1,
};

/// fp32 runs of many iterations against the f64 reference: the f32 Golub-Kahan vectors lose
/// orthogonality in their own way, and the recurrence estimates drift further than x does
/// (measured on an H100 over two seeds of the random tall 517 x 129 system, 39-57 iterations:
/// `normr` up to 6.7%, `norma` 1.24e-2 and `conda` 1.31x from the reference while x agreed to
/// 1.7e-3). The estimates' floor is ten times the fp32 stopping tolerance ([`F32_MIN_TOL`]): a
/// consistent column stops with `normr` near `btol ||b||`, where one iteration more or less of
/// convergence moves it by a large fraction of itself (measured: 33% of a `normr` of ~1e-4
/// `||b||`, x within 7.9e-4) — below that scale the estimate is the stopping rule's knife edge.
const FP32_LONG: Tol = Tol {
    x: 1e-2,
    est: 1.5e-1,
    floor: 10.0 * F32_MIN_TOL,
    conda: 2.0,
};

/// The fixtures that are well conditioned (tolerance class WELL): the fp32 cases.
fn well_conditioned(name: &str) -> bool {
    let t = tolerance(name);
    t.x <= Tol::WELL.x
}

/// Where a case's problem comes from.
#[derive(Clone, Debug)]
pub enum Problem {
    /// A SciPy fixture, by name.
    Fixture(String),
    /// A seeded random sparse problem.
    Random {
        label: &'static str,
        rows: usize,
        cols: usize,
        per_row: usize,
        damp: f64,
        x0: bool,
        maxiter: Option<usize>,
    },
}

/// One verification case.
#[derive(Clone, Debug)]
pub struct Case {
    pub problem: Problem,
    pub value: DType,
    /// Dual storage (CSR of A and A^T) or single (A^T x by atomic scatter).
    pub dual: bool,
}

impl Case {
    pub fn name(&self) -> String {
        let what = match &self.problem {
            Problem::Fixture(n) => n.clone(),
            Problem::Random { label, rows, cols, .. } => format!("{label} {rows}x{cols}"),
        };
        format!(
            "lsmr {what} {} {}",
            self.value,
            if self.dual { "dual" } else { "single" }
        )
    }
    pub fn params(&self) -> Value {
        json!({"problem": self.name(), "dtype": self.value.name(), "dual": self.dual})
    }
}

fn random_problems() -> Vec<Problem> {
    let r = |label, rows, cols, per_row, damp, x0, maxiter| Problem::Random {
        label,
        rows,
        cols,
        per_row,
        damp,
        x0,
        maxiter,
    };
    vec![
        r("random tall", 3001, 257, 9, 0.0, false, None),
        r("random wide", 203, 1500, 40, 0.0, false, None),
        r("random tall damped", 2500, 300, 7, 0.7, false, None),
        r("random tall x0", 1999, 211, 8, 0.0, true, None),
        r("random tall maxiter 13", 4000, 500, 6, 0.0, false, Some(13)),
    ]
}

/// The cases (`quick`: a handful of fixtures and one random problem, fp64 dual and fp32).
pub fn cases(quick: bool) -> Vec<Case> {
    let fixtures: Vec<String> = fixture_cases().into_iter().map(|c| c.name).collect();
    let mut out = Vec::new();
    let quick_set = [
        "tall_inconsistent",
        "damped",
        "warm_start_x0",
        "maxiter_limited",
        "zero_rhs",
    ];
    for name in &fixtures {
        if quick && !quick_set.contains(&name.as_str()) {
            continue;
        }
        for dual in [true, false] {
            if quick && !dual {
                continue;
            }
            out.push(Case {
                problem: Problem::Fixture(name.clone()),
                value: DType::F64,
                dual,
            });
        }
        if well_conditioned(name) {
            out.push(Case {
                problem: Problem::Fixture(name.clone()),
                value: DType::F32,
                dual: true,
            });
        }
    }
    for (i, p) in random_problems().into_iter().enumerate() {
        if quick && i > 0 {
            break;
        }
        for dual in [true, false] {
            out.push(Case {
                problem: p.clone(),
                value: DType::F64,
                dual,
            });
        }
    }
    out
}

/// A problem built: the f64 matrix, b, options and the tolerance class.
struct Built {
    a: CsrHost<f64, i32>,
    b: Vec<f64>,
    opts: LsmrOptions,
    tol: Tol,
    /// SciPy's result (fixtures).
    scipy: Option<LsmrResult>,
}

fn build(problem: &Problem, seed: u64) -> Result<Built> {
    match problem {
        Problem::Fixture(name) => {
            let c = fixture_cases()
                .into_iter()
                .find(|c| &c.name == name)
                .ok_or_else(|| Error::invalid("case", format!("no fixture named {name}")))?;
            let tol = tolerance(name);
            Ok(Built {
                a: c.csr,
                b: c.b,
                opts: c.opts,
                tol,
                scipy: Some(c.expected),
            })
        }
        Problem::Random {
            rows,
            cols,
            per_row,
            damp,
            x0,
            maxiter,
            ..
        } => {
            let class = if rows >= cols {
                MatrixClass::TallLeastSquares { per_row: *per_row }
            } else {
                MatrixClass::Uniform { per_row: *per_row }
            };
            let a = try_generate::<f64, i32>(class, *rows, *cols, seed)?;
            let b = random_vector(*rows, seed ^ 0xb);
            let opts = LsmrOptions {
                damp: *damp,
                maxiter: *maxiter,
                x0: x0.then(|| random_vector(*cols, seed ^ 0x70)),
                ..LsmrOptions::default()
            };
            Ok(Built {
                a,
                b,
                opts,
                tol: LONG_RUN,
                scipy: None,
            })
        }
    }
}

/// The reference result to compare the GPU's values with, and the tolerance to compare them
/// within: `want` and `tol` themselves when both stopped at the same iteration. When the GPU
/// stopped one iteration earlier or later (allowed: the stopping tests compare estimates against
/// thresholds, and last-bit differences in the norms can move the crossing by one iteration),
/// the reference re-run to the GPU's iteration (`rerun(itn, perturbation)`, a maxiter stop with
/// the tolerance tests off: with them on, a reference that stopped earlier would stop there
/// again), with `want`'s istop and itn kept so that those are still judged against the real
/// stop. On ill-conditioned problems two iterates one step apart differ far more than rounding,
/// so comparing x across them would test the stopping rule's knife edge, not the solver.
///
/// The fixtures' tolerances are measured at the reference's own stop; an iteration later the
/// iterate of an ill-conditioned problem can be far more sensitive (`ill_conditioned_conlim`:
/// x moves by 1e-7 under one-ulp changes of A at its stop, itn 19, and by up to 1e-1 at itn
/// 20). So at the GPU's iteration the tolerance (x, the estimates and the conda ratio's excess
/// over 1) is widened to 10x the spread of the re-run
/// under [`SPREAD_RUNS`] random one-ulp perturbations of A (seeded `1..=SPREAD_RUNS`), which the
/// note reports.
///
/// `measured_tol` false (the many-right-hand-side cases, whose columns are fresh random
/// right-hand sides with no measured fixture tolerance) measures the spread and widens at the
/// same iteration too: an ill-conditioned random column at ~90 iterations moves x by up to
/// ~1e-4 under one-ulp changes of A, so rounding alone can exceed a fixed fp64 budget.
fn same_iteration(
    got: &LsmrResult,
    want: &LsmrResult,
    tol: Tol,
    measured_tol: bool,
    rerun: impl Fn(usize, u64) -> Result<LsmrResult>,
) -> Result<(LsmrResult, Tol, Option<f64>)> {
    let apart = got.itn.abs_diff(want.itn);
    if apart > 1 || (apart == 0 && measured_tol) {
        return Ok((want.clone(), tol, None));
    }
    let here = rerun(got.itn, 0)?;
    let mut spread = 0.0f64;
    for seed in 1..=SPREAD_RUNS {
        let other = rerun(got.itn, seed)?;
        let rel = |a: f64, b: f64| (a - b).abs() / b.abs().max(f64::MIN_POSITIVE);
        spread = spread
            .max(rel_l2(&other.x, &here.x))
            .max(rel(other.normr, here.normr))
            .max(rel(other.normx, here.normx));
    }
    // conda is a ratio of extreme |rbar| values: it moves at least as much as x does
    let widened = Tol {
        x: tol.x.max(10.0 * spread),
        est: tol.est.max(10.0 * spread),
        conda: tol.conda.max(1.0 + 10.0 * spread),
        ..tol
    };
    Ok((
        LsmrResult {
            istop: want.istop,
            itn: want.itn,
            ..here
        },
        widened,
        Some(spread),
    ))
}

/// Perturbed re-runs of the reference that measure the rounding spread of an iterate.
const SPREAD_RUNS: u64 = 4;

/// `a` with every value moved by one ulp up or down (a random sign per value, from `seed`; the
/// identity for seed 0).
fn perturbed(a: &CsrHost<f64, i32>, seed: u64) -> CsrHost<f64, i32> {
    if seed == 0 {
        return a.clone();
    }
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let values = a
        .values
        .iter()
        .map(|&v| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            if v == 0.0 || !v.is_finite() {
                v
            } else if state & 1 == 0 {
                v * (1.0 + f64::EPSILON)
            } else {
                v * (1.0 - f64::EPSILON / 2.0)
            }
        })
        .collect();
    CsrHost { values, ..a.clone() }
}

pub fn verify_case(ctx: &Context, case: &Case, seed: u64) -> Result<VerifyOutcome> {
    crate::dispatch_float!("lsmr verify"; case.value, [F32, F64], |T| run::<T>(ctx, case, seed))
}

fn run<T: Element>(ctx: &Context, case: &Case, seed: u64) -> Result<VerifyOutcome> {
    let mut built = build(&case.problem, seed)?;
    if T::DTYPE == DType::F32 {
        built.opts.atol = built.opts.atol.max(F32_MIN_TOL);
        built.opts.btol = built.opts.btol.max(F32_MIN_TOL);
        built.tol = FP32;
    }
    // the matrix and b as the device sees them (rounded to T), and the reference on those
    let a_t: CsrHost<T, i32> = CsrHost {
        rows: built.a.rows,
        cols: built.a.cols,
        offsets: built.a.offsets.clone(),
        indices: built.a.indices.clone(),
        values: built.a.values.iter().map(|&v| T::from_f64(v)).collect(),
        sorted: built.a.sorted,
    };
    let a_ref: CsrHost<f64, i32> = CsrHost {
        values: a_t.values.iter().map(|v| v.to_f64()).collect(),
        ..built.a.clone()
    };
    let b_t: Vec<T> = built.b.iter().map(|&v| T::from_f64(v)).collect();
    let b_ref: Vec<f64> = b_t.iter().map(|v| v.to_f64()).collect();
    let want = lsmr_host(&a_ref, &b_ref, &built.opts)?;

    let db = ctx.upload(&b_t)?;
    let op: Box<dyn LinearOperator<T>> = if case.dual {
        Box::new(SparseDualOperator::new(ctx, &a_t)?)
    } else {
        Box::new(SparseSingleOperator::new(ctx, &a_t)?)
    };
    let got = lsmr(ctx, op.as_ref(), &db, &built.opts)?;
    let normb = b_ref.iter().map(|e| e * e).sum::<f64>().sqrt();
    // istop and itn are judged against the reference's stop; the values against its iterate at
    // the iteration the GPU stopped at (the same one, or one apart: see same_iteration)
    let (want_here, tol_here, spread) = same_iteration(&got, &want, built.tol, true, |itn, seed| {
        lsmr_host(
            &perturbed(&a_ref, seed),
            &b_ref,
            &LsmrOptions {
                // every tolerance test off (0 leaves only the machine-precision ones, which
                // did not stop either run before the later of the two stops), so that the
                // reference runs exactly to the GPU's iteration
                atol: 0.0,
                btol: 0.0,
                conlim: 0.0,
                maxiter: Some(itn),
                ..built.opts.clone()
            },
        )
    })?;
    let mut failures = compare(&case.name(), &got, &want_here, normb, tol_here);
    if let (Some(scipy), DType::F64) = (&built.scipy, T::DTYPE) {
        let scipy_here = if got.itn == scipy.itn {
            scipy.clone()
        } else {
            LsmrResult {
                istop: scipy.istop,
                itn: scipy.itn,
                ..want_here.clone()
            }
        };
        failures.extend(compare(
            &format!("{} vs SciPy", case.name()),
            &got,
            &scipy_here,
            normb,
            tol_here,
        ));
    }
    if case.dual {
        // every iteration a batch of its own (a one-iteration graph replayed), and below the
        // default batches replayed as graphs: neither may change a bit of the result
        let mut every = LsmrRunOptions {
            check_every: 1,
            progress: None,
            graph: true,
        };
        let stepwise = lsmr_with(ctx, op.as_ref(), &db, &built.opts, &mut every)?;
        if !bitwise_equal(&stepwise, &got) {
            failures.push(format!(
                "checking the stop flag every iteration gave another result (istop {} itn {} vs istop {} \
                 itn {}, x differs by {:.2e})",
                stepwise.istop,
                stepwise.itn,
                got.istop,
                got.itn,
                rel_l2(&stepwise.x, &got.x)
            ));
        }
        let mut graphs = LsmrRunOptions {
            graph: true,
            ..LsmrRunOptions::default()
        };
        let replayed = lsmr_with(ctx, op.as_ref(), &db, &built.opts, &mut graphs)?;
        if !bitwise_equal(&replayed, &got) {
            failures.push(format!(
                "replaying CUDA graphs gave another result (istop {} itn {} vs istop {} itn {}, \
                 x differs by {:.2e})",
                replayed.istop,
                replayed.itn,
                got.istop,
                got.itn,
                rel_l2(&replayed.x, &got.x)
            ));
        }
    }
    let comparison = compare_vectors(&got.x, &want.x, 0.0, 0.0);
    Ok(VerifyOutcome {
        case: case.name(),
        params: {
            let mut p = case.params();
            p["istop"] = json!(got.istop);
            p["itn"] = json!(got.itn);
            p["ref_itn"] = json!(want.itn);
            p
        },
        path: format!("{} itn {}/{}", op.storage(), got.itn, want.itn),
        comparison,
        budget: tol_here.x,
        passed: failures.is_empty(),
        note: if failures.is_empty() {
            spread.map(|s| {
                format!(
                    "stopped at itn {} (reference {}): compared with the reference re-run to {}, whose \
                     x moves by {s:.1e} under one-ulp changes of A",
                    got.itn, want.itn, got.itn
                )
            })
        } else {
            Some(failures.join("; "))
        },
        skipped: None,
    })
}

/// A case's outcome: passed when `failures` is empty, else the failures as its note.
fn outcome(
    case: String,
    params: Value,
    path: String,
    comparison: crate::check::Comparison,
    budget: f64,
    failures: Vec<String>,
) -> VerifyOutcome {
    VerifyOutcome {
        case,
        params,
        path,
        comparison,
        budget,
        passed: failures.is_empty(),
        note: (!failures.is_empty()).then(|| failures.join("; ")),
        skipped: None,
    }
}

/// The outcome of an argument-error case (`failures`: the calls that did not fail as they
/// should).
fn errors_outcome(case: &str, problem: &str, failures: Vec<String>) -> VerifyOutcome {
    outcome(
        case.into(),
        json!({ "problem": problem }),
        "-".into(),
        compare_vectors(&[], &[], 0.0, 0.0),
        0.0,
        failures,
    )
}

/// Bitwise equality of two results (x and every estimate).
fn bitwise_equal(a: &LsmrResult, b: &LsmrResult) -> bool {
    let bits = |r: &LsmrResult| {
        let mut v: Vec<u64> = r.x.iter().map(|e| e.to_bits()).collect();
        v.extend([r.normr, r.normar, r.norma, r.conda, r.normx].map(f64::to_bits));
        v.extend([r.istop as u64, r.itn as u64]);
        v
    };
    bits(a) == bits(b)
}

/// The argument errors on the device: b of the wrong length, NaN in b, negative damp, column
/// scaling without column norms, NaN in A at construction. Each must be an error naming the
/// argument.
pub fn verify_errors(ctx: &Context, _case: &(), _seed: u64) -> Result<VerifyOutcome> {
    let a = try_generate::<f64, i32>(MatrixClass::TallLeastSquares { per_row: 4 }, 50, 10, 1)?;
    let op = SparseDualOperator::new(ctx, &a)?;
    let mut failures = Vec::new();
    let mut expect = |what: &str, r: Result<LsmrResult>, arg: &str| match r {
        Err(Error::InvalidArgument { arg: got, .. }) if got == arg => {}
        Err(e) => failures.push(format!("{what}: error {e} does not name {arg}")),
        Ok(_) => failures.push(format!("{what}: no error")),
    };
    let short = ctx.upload(&[1.0f64; 49])?;
    expect(
        "b of 49 for 50 rows",
        lsmr(ctx, &op, &short, &LsmrOptions::default()),
        "b",
    );
    let mut nan_b = vec![1.0f64; 50];
    nan_b[17] = f64::NAN;
    let nan_b = ctx.upload(&nan_b)?;
    expect("NaN in b", lsmr(ctx, &op, &nan_b, &LsmrOptions::default()), "b");
    let b = ctx.upload(&[1.0f64; 50])?;
    let neg = LsmrOptions {
        damp: -1.0,
        ..LsmrOptions::default()
    };
    expect("damp -1", lsmr(ctx, &op, &b, &neg), "damp");
    // column scaling needs the operator's column norms: a closure operator without them is
    // refused before any work
    let nothing = FnDeviceOperator::<f64>::new(50, 10, Box::new(|_, _, _, _| Ok(())), Box::new(|_, _, _, _| Ok(())));
    let scaled = LsmrOptions {
        scale_columns: true,
        ..LsmrOptions::default()
    };
    match lsmr(ctx, &nothing, &b, &scaled) {
        Err(Error::Unsupported(msg)) if msg.contains("scale_columns") => {}
        Err(e) => failures.push(format!(
            "scale_columns without norms: error {e} does not name scale_columns"
        )),
        Ok(_) => failures.push("scale_columns without norms: no error".into()),
    }
    let mut bad = a.clone();
    bad.values[3] = f64::INFINITY;
    match SparseDualOperator::new(ctx, &bad) {
        Err(Error::InvalidArgument { arg: "A", .. }) => {}
        Err(e) => failures.push(format!("inf in A: error {e} does not name A")),
        Ok(_) => failures.push("inf in A: no error".into()),
    }
    Ok(errors_outcome("lsmr argument errors", "errors", failures))
}

// ---- the damp list ----

/// One damp-list verification case: a problem solved for several damps in one run.
#[derive(Clone, Debug)]
pub struct DampCase {
    pub problem: Problem,
    pub damps: Vec<f64>,
    pub value: DType,
}

impl DampCase {
    pub fn name(&self) -> String {
        let what = match &self.problem {
            Problem::Fixture(n) => n.clone(),
            Problem::Random { label, rows, cols, .. } => format!("{label} {rows}x{cols}"),
        };
        format!("lsmr damps{} {what} {}", self.damps.len(), self.value)
    }
}

/// A spread of damps that stop at different iterations (and a repeated one).
fn damp_spread(k: usize) -> Vec<f64> {
    let mut d: Vec<f64> = (0..k)
        .map(|j| {
            if j == 0 {
                0.0
            } else {
                1e-3 * 10f64.powf(4.0 * j as f64 / k as f64)
            }
        })
        .collect();
    if k > 2 {
        d[k - 1] = d[1];
    }
    d
}

/// The damp-list cases (`quick`: two).
pub fn damp_cases(quick: bool) -> Vec<DampCase> {
    let fixture = |name: &str, damps: Vec<f64>, value| DampCase {
        problem: Problem::Fixture(name.into()),
        damps,
        value,
    };
    let random = |label, rows, cols, per_row, x0, damps: Vec<f64>, value| DampCase {
        problem: Problem::Random {
            label,
            rows,
            cols,
            per_row,
            damp: 0.0,
            x0,
            maxiter: None,
        },
        damps,
        value,
    };
    let mut out = vec![
        random("random tall", 3001, 257, 9, false, damp_spread(8), DType::F64),
        fixture("tall_inconsistent", vec![0.0, 0.1, 1.0, 10.0], DType::F64),
    ];
    if quick {
        return out;
    }
    out.extend([
        random("random tall", 3001, 257, 9, false, damp_spread(8), DType::F32),
        random("random wide", 203, 1500, 40, false, damp_spread(5), DType::F64),
        random("random tall x0", 1999, 211, 8, true, damp_spread(6), DType::F64),
        // more than MAX_DAMPS: two runs of the solver
        random("random tall", 900, 61, 6, false, damp_spread(70), DType::F64),
        // (damps 0.1 and 0.5 would stop at itn = maxiter = 25, where istop 2 vs 7 is a coin
        // toss between two summation orders; 1 and 2 stop at 22 and 16)
        fixture("warm_start_x0", vec![0.0, 1.0, 2.0], DType::F64),
        fixture("maxiter_limited", vec![0.0, 1e-3, 1.0], DType::F64),
        fixture("zero_rhs", vec![0.0, 1.0], DType::F64),
        fixture("damped", vec![0.0, 0.1, 1.0, 10.0], DType::F64),
    ]);
    out
}

pub fn verify_damp_case(ctx: &Context, case: &DampCase, seed: u64) -> Result<VerifyOutcome> {
    crate::dispatch_float!("lsmr verify damps"; case.value, [F32, F64], |T| run_damps::<T>(ctx, case, seed))
}

/// The damp list on the GPU against (1) separate GPU solves with each damp: bitwise equal
/// (the same kernels on the same bidiagonalisation, dual storage is deterministic), and
/// (2) the f64 CPU reference [`lsmr_host_damps`](super::lsmr_host_damps) on the same
/// (T-rounded) data, within the problem's tolerance (as the single-damp cases).
fn run_damps<T: Element>(ctx: &Context, case: &DampCase, seed: u64) -> Result<VerifyOutcome> {
    let mut built = build(&case.problem, seed)?;
    built.opts.damp = 0.0;
    if T::DTYPE == DType::F32 {
        built.opts.atol = built.opts.atol.max(F32_MIN_TOL);
        built.opts.btol = built.opts.btol.max(F32_MIN_TOL);
        built.tol = FP32;
    }
    let a_t: CsrHost<T, i32> = CsrHost {
        rows: built.a.rows,
        cols: built.a.cols,
        offsets: built.a.offsets.clone(),
        indices: built.a.indices.clone(),
        values: built.a.values.iter().map(|&v| T::from_f64(v)).collect(),
        sorted: built.a.sorted,
    };
    let a_ref: CsrHost<f64, i32> = CsrHost {
        values: a_t.values.iter().map(|v| v.to_f64()).collect(),
        ..built.a.clone()
    };
    let b_t: Vec<T> = built.b.iter().map(|&v| T::from_f64(v)).collect();
    let b_ref: Vec<f64> = b_t.iter().map(|v| v.to_f64()).collect();
    let want = super::lsmr::lsmr_host_damps(&a_ref, &b_ref, &case.damps, &built.opts)?;

    let db = ctx.upload(&b_t)?;
    let op = SparseDualOperator::new(ctx, &a_t)?;
    let got = super::lsmr_device::lsmr_damps(ctx, &op, &db, &case.damps, &built.opts)?;
    let normb = b_ref.iter().map(|e| e * e).sum::<f64>().sqrt();
    let mut failures = Vec::new();
    if got.len() != case.damps.len() {
        failures.push(format!("{} results for {} damps", got.len(), case.damps.len()));
    }
    for (j, ((&damp, g), w)) in case.damps.iter().zip(&got).zip(&want).enumerate() {
        let name = format!("{} damp[{j}] = {damp:.3e}", case.name());
        failures.extend(compare(&name, g, w, normb, built.tol));
        let alone = lsmr(
            ctx,
            &op,
            &db,
            &LsmrOptions {
                damp,
                ..built.opts.clone()
            },
        )?;
        if !bitwise_equal(g, &alone) {
            failures.push(format!(
                "{name}: differs from its own GPU solve (istop {} itn {} vs istop {} itn {}, x by {:.2e})",
                g.istop,
                g.itn,
                alone.istop,
                alone.itn,
                rel_l2(&g.x, &alone.x)
            ));
        }
    }
    let itns: Vec<usize> = got.iter().map(|r| r.itn).collect();
    let x_got: Vec<f64> = got.iter().flat_map(|r| r.x.iter().copied()).collect();
    let x_want: Vec<f64> = want.iter().flat_map(|r| r.x.iter().copied()).collect();
    Ok(outcome(
        case.name(),
        json!({"problem": case.name(), "dtype": case.value.name(), "damps": case.damps, "itn": itns}),
        format!("csr-dual damps {} itn {:?}", case.damps.len(), itns),
        compare_vectors(&x_got, &x_want, 0.0, 0.0),
        built.tol.x,
        failures,
    ))
}

/// The damp list's argument errors on the device: an empty list, a negative and a NaN damp,
/// and `opts.damp` set beside a list, each an error naming the argument.
pub fn verify_damp_errors(ctx: &Context, _case: &(), _seed: u64) -> Result<VerifyOutcome> {
    let a = try_generate::<f64, i32>(MatrixClass::TallLeastSquares { per_row: 4 }, 50, 10, 1)?;
    let op = SparseDualOperator::new(ctx, &a)?;
    let b = ctx.upload(&[1.0f64; 50])?;
    let ok = LsmrOptions::default();
    let mut failures = Vec::new();
    let damped = LsmrOptions {
        damp: 1.0,
        ..LsmrOptions::default()
    };
    let tries: [(&str, Vec<f64>, &LsmrOptions, &str); 4] = [
        ("empty list", vec![], &ok, "damps"),
        ("damp -1 in the list", vec![0.0, -1.0], &ok, "damps"),
        ("NaN in the list", vec![f64::NAN], &ok, "damps"),
        ("opts.damp beside a list", vec![1.0], &damped, "damp"),
    ];
    for (what, damps, opts, arg) in tries {
        match super::lsmr_device::lsmr_damps(ctx, &op, &b, &damps, opts) {
            Err(Error::InvalidArgument { arg: got, .. }) if got == arg => {}
            Err(e) => failures.push(format!("{what}: error {e} does not name {arg}")),
            Ok(_) => failures.push(format!("{what}: no error")),
        }
    }
    Ok(errors_outcome("lsmr damps argument errors", "damp errors", failures))
}

// ---- column scaling ----

/// One column-scaling case: a problem (random ones with columns scaled by 10^(-3 .. 3)) solved
/// with `scale_columns`, against the CPU reference with `scale_columns`.
#[derive(Clone, Debug)]
pub struct ScaleCase {
    pub problem: Problem,
    pub value: DType,
    pub dual: bool,
}

impl ScaleCase {
    pub fn name(&self) -> String {
        let what = match &self.problem {
            Problem::Fixture(n) => n.clone(),
            Problem::Random { label, rows, cols, .. } => format!("{label} {rows}x{cols} badly scaled"),
        };
        format!(
            "lsmr scaled {what} {} {}",
            self.value,
            if self.dual { "dual" } else { "single" }
        )
    }
}

/// The column-scaling cases (`quick`: two).
pub fn scale_cases(quick: bool) -> Vec<ScaleCase> {
    let fixture = |name: &str| ScaleCase {
        problem: Problem::Fixture(name.into()),
        value: DType::F64,
        dual: true,
    };
    let random = |label, rows, cols, per_row, damp, x0, value, dual| ScaleCase {
        problem: Problem::Random {
            label,
            rows,
            cols,
            per_row,
            damp,
            x0,
            maxiter: None,
        },
        value,
        dual,
    };
    let mut out = vec![
        random("random tall", 3001, 257, 9, 0.0, false, DType::F64, true),
        fixture("tall_inconsistent"),
    ];
    if quick {
        return out;
    }
    out.extend([
        random("random tall", 3001, 257, 9, 0.0, false, DType::F64, false),
        random("random tall", 3001, 257, 9, 0.0, false, DType::F32, true),
        random("random tall damped", 2500, 300, 7, 0.7, false, DType::F64, true),
        random("random tall x0", 1999, 211, 8, 0.0, true, DType::F64, true),
        random("random wide", 203, 1500, 40, 0.0, false, DType::F64, true),
        fixture("damped"),
        fixture("tall_consistent"),
        fixture("lower_bidiagonal_tall"),
        fixture("zero_rhs"),
    ]);
    out
}

pub fn verify_scale_case(ctx: &Context, case: &ScaleCase, seed: u64) -> Result<VerifyOutcome> {
    crate::dispatch_float!("lsmr verify scaled"; case.value, [F32, F64], |T| run_scaled::<T>(ctx, case, seed))
}

/// Multiplies column j of `a` by 10^(-3 .. 3) (a fixed spread over the columns).
fn scale_columns_badly(a: &mut CsrHost<f64, i32>) {
    let n = a.cols.max(1);
    for (c, v) in a.indices.iter().zip(a.values.iter_mut()) {
        let j = *c as usize;
        *v *= 10f64.powf(-3.0 + 6.0 * ((j * 7919) % n) as f64 / n as f64);
    }
}

fn run_scaled<T: Element>(ctx: &Context, case: &ScaleCase, seed: u64) -> Result<VerifyOutcome> {
    let mut built = build(&case.problem, seed)?;
    if matches!(case.problem, Problem::Random { .. }) {
        scale_columns_badly(&mut built.a);
    }
    built.opts.scale_columns = true;
    if T::DTYPE == DType::F32 {
        built.opts.atol = built.opts.atol.max(F32_MIN_TOL);
        built.opts.btol = built.opts.btol.max(F32_MIN_TOL);
        built.tol = FP32;
    }
    let a_t: CsrHost<T, i32> = CsrHost {
        rows: built.a.rows,
        cols: built.a.cols,
        offsets: built.a.offsets.clone(),
        indices: built.a.indices.clone(),
        values: built.a.values.iter().map(|&v| T::from_f64(v)).collect(),
        sorted: built.a.sorted,
    };
    let a_ref: CsrHost<f64, i32> = CsrHost {
        values: a_t.values.iter().map(|v| v.to_f64()).collect(),
        ..built.a.clone()
    };
    let b_t: Vec<T> = built.b.iter().map(|&v| T::from_f64(v)).collect();
    let b_ref: Vec<f64> = b_t.iter().map(|v| v.to_f64()).collect();
    let want = lsmr_host(&a_ref, &b_ref, &built.opts)?;
    let db = ctx.upload(&b_t)?;
    let op: Box<dyn LinearOperator<T>> = if case.dual {
        Box::new(SparseDualOperator::new(ctx, &a_t)?)
    } else {
        Box::new(SparseSingleOperator::new(ctx, &a_t)?)
    };
    let got = lsmr(ctx, op.as_ref(), &db, &built.opts)?;
    let normb = b_ref.iter().map(|e| e * e).sum::<f64>().sqrt();
    let mut failures = compare(&case.name(), &got, &want, normb, built.tol);
    // with dual storage, a damp list with scaling gives each damp's scaled solve bit for bit
    if case.dual && built.opts.damp == 0.0 {
        let damps = [0.0, 0.05, 0.5];
        let list = super::lsmr_device::lsmr_damps(ctx, op.as_ref(), &db, &damps, &built.opts)?;
        for (&damp, r) in damps.iter().zip(&list) {
            let alone = lsmr(
                ctx,
                op.as_ref(),
                &db,
                &LsmrOptions {
                    damp,
                    ..built.opts.clone()
                },
            )?;
            if !bitwise_equal(r, &alone) {
                failures.push(format!(
                    "damp {damp} of a scaled damp list differs from its own scaled solve"
                ));
            }
        }
    }
    Ok(outcome(
        case.name(),
        {
            let mut p = json!({"problem": case.name(), "dtype": case.value.name(), "dual": case.dual});
            p["istop"] = json!(got.istop);
            p["itn"] = json!(got.itn);
            p["ref_itn"] = json!(want.itn);
            p
        },
        format!("{} scaled itn {}/{}", op.storage(), got.itn, want.itn),
        compare_vectors(&got.x, &want.x, 0.0, 0.0),
        built.tol.x,
        failures,
    ))
}

// ---- the dense operator ----

/// One dense-operator case: an `rows x cols` matrix stored in `layout` with `pad` elements of
/// padding per line (`ld = line length + pad`), in `value`.
#[derive(Clone, Debug)]
pub struct DenseCase {
    pub rows: usize,
    pub cols: usize,
    pub layout: DenseLayout,
    pub pad: usize,
    pub value: DType,
}

impl DenseCase {
    pub fn name(&self) -> String {
        let layout = match self.layout {
            DenseLayout::RowMajor => "row",
            DenseLayout::ColMajor => "col",
        };
        format!(
            "lsmr dense {}x{} {layout}-major pad {} {}",
            self.rows, self.cols, self.pad, self.value
        )
    }
}

/// The dense cases (`quick`: two).
pub fn dense_cases(quick: bool) -> Vec<DenseCase> {
    let c = |rows, cols, layout, pad, value| DenseCase {
        rows,
        cols,
        layout,
        pad,
        value,
    };
    use DenseLayout::{ColMajor, RowMajor};
    if quick {
        return vec![
            c(517, 129, RowMajor, 0, DType::F64),
            c(517, 129, ColMajor, 3, DType::F64),
        ];
    }
    let mut out = Vec::new();
    for value in [DType::F64, DType::F32] {
        for layout in [RowMajor, ColMajor] {
            for (rows, cols, pad) in [
                (517, 129, 0),
                (517, 129, 3),
                (97, 300, 1),
                (20_000, 37, 0),
                (1, 1, 0),
                (1000, 1, 2),
            ] {
                out.push(c(rows, cols, layout, pad, value));
            }
        }
    }
    out
}

pub fn verify_dense_case(ctx: &Context, case: &DenseCase, seed: u64) -> Result<VerifyOutcome> {
    crate::dispatch_float!("lsmr verify dense"; case.value, [F32, F64], |T| run_dense::<T>(ctx, case, seed))
}

/// The dense operator against [`DenseHost`] on the same (T-rounded) matrix: both products
/// with `beta = 0` into a NaN-poisoned `y` and with `beta != 0`, the column norms; then LSMR
/// on it (with the damp list and column scaling) against the CPU reference.
fn run_dense<T: Element>(ctx: &Context, case: &DenseCase, seed: u64) -> Result<VerifyOutcome> {
    let (m, n) = (case.rows, case.cols);
    let a_t: Vec<T> = random_vector(m * n, seed).into_iter().map(T::from_f64).collect();
    let dense = DenseHost::new(m, n, a_t.iter().map(|v| v.to_f64()).collect())?;
    let (_, len) = stored_shape(m, n, case.layout);
    let ld = len + case.pad;
    let span = check_dense(m, n, case.layout, ld, usize::MAX)?;
    let mut stored = vec![T::from_f64(f64::NAN); span]; // padding must never be read
    for i in 0..m {
        for j in 0..n {
            stored[stored_index(case.layout, ld, i, j)] = a_t[i * n + j];
        }
    }
    let op = DenseOperator::new(ctx, ctx.upload(&stored)?, m, n, case.layout, ld)?;
    let budget = if T::DTYPE == DType::F32 { 1e-6 } else { 1e-13 };
    let mut failures = Vec::new();
    let mut check = |what: &str, got: &[f64], want: &[f64]| {
        let err = rel_l2(got, want);
        if err.is_nan() || err > budget {
            failures.push(format!("{what}: rel_l2 {err:.2e} (budget {budget:.0e})"));
        }
    };

    // the products
    let to_t = |v: &[f64]| -> Vec<T> { v.iter().map(|&e| T::from_f64(e)).collect() };
    let to_f = |v: &[T]| -> Vec<f64> { v.iter().map(|e| e.to_f64()).collect() };
    let x: Vec<f64> = to_f(&to_t(&random_vector(n, seed ^ 1)));
    let u: Vec<f64> = to_f(&to_t(&random_vector(m, seed ^ 2)));
    let y0: Vec<f64> = to_f(&to_t(&random_vector(m, seed ^ 3)));
    let z0: Vec<f64> = to_f(&to_t(&random_vector(n, seed ^ 4)));
    let (dx, du) = (ctx.upload(&to_t(&x))?, ctx.upload(&to_t(&u))?);
    for (alpha, beta) in [(1.0, 0.0), (-0.7, 0.5)] {
        let mut dy = ctx.upload(&to_t(&if beta == 0.0 { vec![f64::NAN; m] } else { y0.clone() }))?;
        op.apply(alpha, &dx, beta, &mut dy)?;
        let mut want = y0.clone();
        dense.apply(alpha, &x, beta, &mut want);
        check(
            &format!("A x (alpha {alpha}, beta {beta})"),
            &to_f(&dy.to_host()?),
            &want,
        );
        let mut dz = ctx.upload(&to_t(&if beta == 0.0 { vec![f64::NAN; n] } else { z0.clone() }))?;
        op.apply_transposed(alpha, &du, beta, &mut dz)?;
        let mut want = z0.clone();
        dense.apply_transposed(alpha, &u, beta, &mut want);
        check(
            &format!("A^T u (alpha {alpha}, beta {beta})"),
            &to_f(&dz.to_host()?),
            &want,
        );
    }
    if let (Some(got), Some(want)) = (op.column_norms(), dense.column_norms()) {
        check("column norms", &got, &want);
    }

    // LSMR on the dense operator against the CPU reference
    let b_t = to_t(&random_vector(m, seed ^ 0xb));
    let b = to_f(&b_t);
    let db = ctx.upload(&b_t)?;
    let mut opts = LsmrOptions::default();
    let mut tol = LONG_RUN;
    if T::DTYPE == DType::F32 {
        opts.atol = F32_MIN_TOL;
        opts.btol = F32_MIN_TOL;
        tol = FP32;
    }
    let normb = b.iter().map(|e| e * e).sum::<f64>().sqrt();
    let got = lsmr(ctx, &op, &db, &opts)?;
    let want = lsmr_host(&dense, &b, &opts)?;
    let mut lsmr_failures = compare(&format!("{} lsmr", case.name()), &got, &want, normb, tol);
    let damps = [0.0, 0.1, 1.0];
    let scaled = LsmrOptions {
        scale_columns: true,
        ..opts.clone()
    };
    let got_list = super::lsmr_device::lsmr_damps(ctx, &op, &db, &damps, &scaled)?;
    let want_list = super::lsmr::lsmr_host_damps(&dense, &b, &damps, &scaled)?;
    for ((&damp, g), w) in damps.iter().zip(&got_list).zip(&want_list) {
        lsmr_failures.extend(compare(
            &format!("{} lsmr scaled damp {damp}", case.name()),
            g,
            w,
            normb,
            tol,
        ));
    }
    failures.extend(lsmr_failures);
    Ok(outcome(
        case.name(),
        json!({
            "rows": m, "cols": n, "layout": format!("{:?}", case.layout), "ld": ld,
            "dtype": case.value.name(), "istop": got.istop, "itn": got.itn, "ref_itn": want.itn,
        }),
        format!("{} itn {}/{}", op.storage(), got.itn, want.itn),
        compare_vectors(&got.x, &want.x, 0.0, 0.0),
        tol.x,
        failures,
    ))
}

/// The dense operator's argument errors on the device: a NaN in the matrix, `ld` below the
/// line length, a short buffer, a short `x`.
pub fn verify_dense_errors(ctx: &Context, _case: &(), _seed: u64) -> Result<VerifyOutcome> {
    let mut failures = Vec::new();
    let mut expect = |what: &str, r: Result<()>, arg: &str| match r {
        Err(Error::InvalidArgument { arg: got, .. }) if got == arg => {}
        Err(e) => failures.push(format!("{what}: error {e} does not name {arg}")),
        Ok(_) => failures.push(format!("{what}: no error")),
    };
    let mut data = random_vector(12 * 5, 1);
    let good = DenseOperator::from_host(ctx, 12, 5, DenseLayout::RowMajor, &data)?;
    data[17] = f64::NAN;
    for layout in [DenseLayout::RowMajor, DenseLayout::ColMajor] {
        expect(
            &format!("NaN in A ({layout:?})"),
            DenseOperator::from_host(ctx, 12, 5, layout, &data).map(|_| ()),
            "A",
        );
    }
    expect(
        "ld 4 < n 5",
        DenseOperator::new(ctx, ctx.upload(&[1.0f64; 60])?, 12, 5, DenseLayout::RowMajor, 4).map(|_| ()),
        "ld",
    );
    expect(
        "59 elements for 12 x 5",
        DenseOperator::new(ctx, ctx.upload(&[1.0f64; 59])?, 12, 5, DenseLayout::RowMajor, 5).map(|_| ()),
        "data",
    );
    let short = ctx.upload(&[1.0f64; 4])?;
    let mut y = ctx.alloc::<f64>(12)?;
    expect("x of 4 for 5 columns", good.apply(1.0, &short, 0.0, &mut y), "x");
    Ok(errors_outcome("lsmr dense argument errors", "dense errors", failures))
}

// ---- many right-hand sides ----

/// The operator of a many-right-hand-sides case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ManyOperator {
    /// [`SparseDualOperator`]: SpMM for both products.
    Dual,
    /// [`SparseSingleOperator`]: SpMM for `A`, a column loop of atomic `A^T x`.
    Single,
    /// [`DenseOperator`] (row-major): the default column loop for both.
    Dense,
}

/// One many-right-hand-sides case: `k` columns (`fixtures::mixed_rhs`:
/// consistent, inconsistent, zero, scaled, ...) on a problem, solved together by
/// [`lsmr_many`](super::lsmr_many).
#[derive(Clone, Debug)]
pub struct ManyCase {
    pub problem: Problem,
    pub k: usize,
    pub value: DType,
    pub operator: ManyOperator,
    /// Initial guesses (`n x k`, random).
    pub x0: bool,
    /// Column scaling.
    pub scale: bool,
    /// `B` uploaded by the caller ([`ManyRhs::Device`](super::ManyRhs)) rather than given on
    /// the host.
    pub device_b: bool,
}

impl ManyCase {
    pub fn name(&self) -> String {
        let what = match &self.problem {
            Problem::Fixture(n) => n.clone(),
            Problem::Random { label, rows, cols, .. } => format!("{label} {rows}x{cols}"),
        };
        let operator = match self.operator {
            ManyOperator::Dual => "dual",
            ManyOperator::Single => "single",
            ManyOperator::Dense => "dense",
        };
        format!(
            "lsmr many{} {what} {} {operator}{}{}{}",
            self.k,
            self.value,
            if self.x0 { " x0" } else { "" },
            if self.scale { " scaled" } else { "" },
            if self.device_b { " device-b" } else { "" }
        )
    }
}

/// The many-right-hand-sides cases (`quick`: two).
pub fn many_cases(quick: bool) -> Vec<ManyCase> {
    let tall = Problem::Random {
        label: "random tall",
        rows: 3001,
        cols: 257,
        per_row: 9,
        damp: 0.0,
        x0: false,
        maxiter: None,
    };
    let c = |problem: &Problem, k, value, operator, x0, scale, device_b| ManyCase {
        problem: problem.clone(),
        k,
        value,
        operator,
        x0,
        scale,
        device_b,
    };
    use ManyOperator::{Dense, Dual, Single};
    let mut out = vec![
        c(&tall, 5, DType::F64, Dual, false, false, true),
        c(&tall, 5, DType::F64, Single, false, false, false),
    ];
    if quick {
        return out;
    }
    for k in [1, 2, 33] {
        out.push(c(&tall, k, DType::F64, Dual, false, false, k != 2));
    }
    let wide = Problem::Random {
        label: "random wide",
        rows: 203,
        cols: 1500,
        per_row: 40,
        damp: 0.0,
        x0: false,
        maxiter: None,
    };
    let damped = Problem::Random {
        label: "random tall damped",
        rows: 2500,
        cols: 300,
        per_row: 7,
        damp: 0.7,
        x0: false,
        maxiter: None,
    };
    let limited = Problem::Random {
        label: "random tall maxiter 13",
        rows: 4000,
        cols: 500,
        per_row: 6,
        damp: 0.0,
        x0: false,
        maxiter: Some(13),
    };
    let small = Problem::Random {
        label: "random tall",
        rows: 517,
        cols: 129,
        per_row: 8,
        damp: 0.0,
        x0: false,
        maxiter: None,
    };
    let fixture = Problem::Fixture("tall_inconsistent".into());
    out.extend([
        c(&tall, 33, DType::F64, Single, false, false, true),
        c(&tall, 5, DType::F64, Dual, true, false, false),
        c(&tall, 5, DType::F64, Dual, false, true, true),
        c(&tall, 5, DType::F32, Dual, false, false, true),
        c(&tall, 2, DType::F32, Single, false, false, false),
        c(&wide, 5, DType::F64, Dual, false, false, true),
        c(&damped, 5, DType::F64, Dual, false, false, true),
        c(&limited, 5, DType::F64, Dual, false, false, false),
        c(&small, 5, DType::F64, Dense, false, false, false),
        c(&small, 33, DType::F64, Dense, true, false, true),
        c(&small, 5, DType::F32, Dense, false, false, true),
        c(&fixture, 5, DType::F64, Dual, false, false, true),
        c(&fixture, 5, DType::F64, Single, false, false, false),
    ]);
    out
}

pub fn verify_many_case(ctx: &Context, case: &ManyCase, seed: u64) -> Result<VerifyOutcome> {
    crate::dispatch_float!("lsmr verify many"; case.value, [F32, F64], |T| run_many::<T>(ctx, case, seed))
}

/// The `k` columns solved together on the GPU against (1) a separate GPU [`lsmr`] of each
/// column on the same operator (same istop, itn within 1, values within the tolerance at the
/// same iteration: the batched products sum in another order than the single ones; one
/// column: bitwise), and (2) the f64 CPU reference [`lsmr_host_many`](super::lsmr_host_many)
/// on the same (T-rounded) data, as the single-solve cases.
fn run_many<T: Element>(ctx: &Context, case: &ManyCase, seed: u64) -> Result<VerifyOutcome> {
    use super::lsmr_device::{lsmr_many, ManyRhs};
    let mut built = build(&case.problem, seed)?;
    if T::DTYPE == DType::F32 {
        built.opts.atol = built.opts.atol.max(F32_MIN_TOL);
        built.opts.btol = built.opts.btol.max(F32_MIN_TOL);
        built.tol = if matches!(case.problem, Problem::Random { .. }) {
            FP32_LONG
        } else {
            FP32
        };
    }
    built.opts.x0 = None;
    built.opts.scale_columns = case.scale;
    let (m, n, k) = (built.a.rows, built.a.cols, case.k);
    let a_t: CsrHost<T, i32> = CsrHost {
        rows: m,
        cols: n,
        offsets: built.a.offsets.clone(),
        indices: built.a.indices.clone(),
        values: built.a.values.iter().map(|&v| T::from_f64(v)).collect(),
        sorted: built.a.sorted,
    };
    let a_ref: CsrHost<f64, i32> = CsrHost {
        values: a_t.values.iter().map(|v| v.to_f64()).collect(),
        ..built.a.clone()
    };
    let mut b = super::fixtures::mixed_rhs(&a_ref, k, seed);
    if let (Problem::Fixture(_), true) = (&case.problem, k > 1) {
        b[m..2 * m].copy_from_slice(&built.b); // the fixture's own b as the inconsistent column
    }
    let b_t: Vec<T> = b.iter().map(|&v| T::from_f64(v)).collect();
    let b_ref: Vec<f64> = b_t.iter().map(|v| v.to_f64()).collect();
    let x0: Option<Vec<f64>> = case.x0.then(|| random_vector(n * k, seed ^ 0x70));
    let want = super::lsmr::lsmr_host_many(&a_ref, &b_ref, k, x0.as_deref(), &built.opts)?;

    let op: Box<dyn LinearOperator<T>> = match case.operator {
        ManyOperator::Dual => Box::new(SparseDualOperator::new(ctx, &a_t)?),
        ManyOperator::Single => Box::new(SparseSingleOperator::new(ctx, &a_t)?),
        ManyOperator::Dense => {
            let mut dense = vec![0.0; m * n];
            for r in 0..m {
                let (cols, vals) = a_ref.row(r);
                for (&c, &v) in cols.iter().zip(vals) {
                    dense[r * n + c as usize] += v;
                }
            }
            Box::new(DenseOperator::new(
                ctx,
                ctx.upload(&dense.iter().map(|&v| T::from_f64(v)).collect::<Vec<T>>())?,
                m,
                n,
                DenseLayout::RowMajor,
                n,
            )?)
        }
    };
    let db = ctx.upload(&b_t)?;
    let rhs = if case.device_b {
        ManyRhs::Device(&db)
    } else {
        ManyRhs::Host(&b_ref)
    };
    let got = lsmr_many(ctx, op.as_ref(), rhs, k, x0.as_deref(), &built.opts)?;
    let mut failures = Vec::new();
    if got.len() != k {
        failures.push(format!("{} results for {k} columns", got.len()));
    }
    // the summary's x comparison: every column against its reference at the GPU's iteration,
    // within the widest of the columns' (spread-widened) x tolerances
    let mut x_want_here = Vec::with_capacity(n * k);
    let mut x_budget = built.tol.x;
    for (j, (g, w)) in got.iter().zip(&want).enumerate() {
        let name = format!("{} column {j}", case.name());
        let bj = &b_ref[j * m..(j + 1) * m];
        let normb = bj.iter().map(|e| e * e).sum::<f64>().sqrt();
        let col_opts = LsmrOptions {
            x0: x0.as_ref().map(|x| x[j * n..(j + 1) * n].to_vec()),
            ..built.opts.clone()
        };
        // the reference at the GPU's iteration (see same_iteration)
        let rerun = |itn: usize| LsmrOptions {
            atol: 0.0,
            btol: 0.0,
            conlim: 0.0,
            maxiter: Some(itn),
            ..col_opts.clone()
        };
        let (want_here, tol_here, _) = same_iteration(g, w, built.tol, false, |itn, seed| {
            lsmr_host(&perturbed(&a_ref, seed), bj, &rerun(itn))
        })?;
        failures.extend(compare(&format!("{name} vs CPU"), g, &want_here, normb, tol_here));
        x_want_here.extend_from_slice(&want_here.x);
        x_budget = x_budget.max(tol_here.x);
        // the same column alone on the GPU (re-run to this column's iteration when one apart,
        // judged within the tolerance the CPU's spread gave)
        let dbj = ctx.upload(&b_t[j * m..(j + 1) * m])?;
        let alone = lsmr(ctx, op.as_ref(), &dbj, &col_opts)?;
        let alone_here = if g.itn.abs_diff(alone.itn) == 1 {
            LsmrResult {
                istop: alone.istop,
                itn: alone.itn,
                ..lsmr(ctx, op.as_ref(), &dbj, &rerun(g.itn))?
            }
        } else {
            alone.clone()
        };
        failures.extend(compare(
            &format!("{name} vs its own GPU solve"),
            g,
            &alone_here,
            normb,
            tol_here,
        ));
        if k == 1 && case.operator != ManyOperator::Single && !bitwise_equal(g, &alone) {
            failures.push(format!(
                "{name}: one column differs from the plain solve (must be bitwise)"
            ));
        }
        // SciPy's b = 0 answer
        if normb == 0.0 && (g.istop != 0 || g.x.iter().any(|&e| e != 0.0)) {
            failures.push(format!("{name}: b = 0 gave istop {} and a nonzero x", g.istop));
        }
    }
    let itns: Vec<usize> = got.iter().map(|r| r.itn).collect();
    let x_got: Vec<f64> = got.iter().flat_map(|r| r.x.iter().copied()).collect();
    Ok(outcome(
        case.name(),
        json!({
            "problem": case.name(), "dtype": case.value.name(), "k": k, "itn": itns,
            "istop": got.iter().map(|r| r.istop).collect::<Vec<_>>(),
            "ref_itn": want.iter().map(|r| r.itn).collect::<Vec<_>>(),
        }),
        format!("{} many {k} itn {:?}", op.storage(), itns),
        compare_vectors(&x_got, &x_want_here, 0.0, 0.0),
        x_budget,
        failures,
    ))
}

/// The argument errors of [`lsmr_many`](super::lsmr_many) on the device: `k = 0`, `b` of the
/// wrong length, NaN in a host `b` and in a device `b` (naming the column), `x0` of the wrong
/// length, `opts.x0` set, too many columns for the device's memory; and the batched products'
/// own checks (`x` too short).
pub fn verify_many_errors(ctx: &Context, _case: &(), _seed: u64) -> Result<VerifyOutcome> {
    use super::lsmr_device::{lsmr_many, ManyRhs};
    let a = try_generate::<f64, i32>(MatrixClass::TallLeastSquares { per_row: 4 }, 50, 10, 1)?;
    let op = SparseDualOperator::new(ctx, &a)?;
    let ok = LsmrOptions::default();
    let mut failures = Vec::new();
    let mut expect = |what: &str, r: Result<Vec<LsmrResult>>, arg: &str| match r {
        Err(Error::InvalidArgument { arg: got, .. }) if got == arg => {}
        Err(e) => failures.push(format!("{what}: error {e} does not name {arg}")),
        Ok(_) => failures.push(format!("{what}: no error")),
    };
    let b = vec![1.0f64; 100];
    expect("k = 0", lsmr_many(ctx, &op, ManyRhs::Host(&b), 0, None, &ok), "k");
    expect(
        "b of 100 for k = 3",
        lsmr_many(ctx, &op, ManyRhs::Host(&b), 3, None, &ok),
        "b",
    );
    let mut nan = b.clone();
    nan[73] = f64::NAN;
    expect(
        "NaN in a host b",
        lsmr_many(ctx, &op, ManyRhs::Host(&nan), 2, None, &ok),
        "b",
    );
    let dnan = ctx.upload(&nan)?;
    expect(
        "NaN in a device b",
        lsmr_many(ctx, &op, ManyRhs::Device(&dnan), 2, None, &ok),
        "b",
    );
    expect(
        "x0 of 19 for 10 x 2",
        lsmr_many(ctx, &op, ManyRhs::Host(&b), 2, Some(&[0.0; 19]), &ok),
        "x0",
    );
    let with_x0 = LsmrOptions {
        x0: Some(vec![0.0; 10]),
        ..LsmrOptions::default()
    };
    expect(
        "opts.x0 set",
        lsmr_many(ctx, &op, ManyRhs::Host(&b), 2, None, &with_x0),
        "x0",
    );
    // 60000 columns of a 1 x 3e6 closure operator: ~8 TB of vectors (6 n per column),
    // refused before any allocation
    let huge = FnDeviceOperator::<f64>::new(
        1,
        3_000_000,
        Box::new(|_, _, _, _| Ok(())),
        Box::new(|_, _, _, _| Ok(())),
    );
    let ones = vec![1.0; 60_000];
    expect(
        "60000 columns of 3e6 unknowns",
        lsmr_many(ctx, &huge, ManyRhs::Host(&ones), 60_000, None, &ok),
        "k",
    );
    // the batched product's operand check
    let x = ctx.alloc::<f64>(10 * 3 - 1)?;
    let mut y = ctx.alloc::<f64>(50 * 3)?;
    match op.apply_many(1.0, &x, 3, 0.0, &mut y) {
        Err(Error::InvalidArgument { arg: "x", .. }) => {}
        Err(e) => failures.push(format!("short x of apply_many: error {e} does not name x")),
        Ok(_) => failures.push("short x of apply_many: no error".into()),
    }
    Ok(errors_outcome("lsmr many argument errors", "many errors", failures))
}

/// The batched products against the single ones on every operator kind: `apply_many` and
/// `apply_transposed_many` of `k` columns (with `beta = 0` into NaN-poisoned outputs and with
/// `beta != 0`) equal `k` single products to rounding (SpMM sums in another order than SpMV;
/// the default column loop bitwise).
pub fn verify_many_products(ctx: &Context, _case: &(), seed: u64) -> Result<VerifyOutcome> {
    let (m, n) = (1031, 77);
    let a = try_generate::<f64, i32>(MatrixClass::TallLeastSquares { per_row: 7 }, m, n, seed)?;
    let dense = {
        let mut d = vec![0.0; m * n];
        for r in 0..m {
            let (cols, vals) = a.row(r);
            for (&c, &v) in cols.iter().zip(vals) {
                d[r * n + c as usize] += v;
            }
        }
        d
    };
    let ops: Vec<Box<dyn LinearOperator<f64>>> = vec![
        Box::new(SparseDualOperator::new(ctx, &a)?),
        Box::new(SparseSingleOperator::new(ctx, &a)?),
        Box::new(DenseOperator::new(
            ctx,
            ctx.upload(&dense)?,
            m,
            n,
            DenseLayout::RowMajor,
            n,
        )?),
    ];
    let mut failures = Vec::new();
    for op in &ops {
        for k in [1usize, 3, 8, 9] {
            for (alpha, beta) in [(1.0, 0.0), (-0.5, 2.0)] {
                for transposed in [false, true] {
                    let (xl, yl) = if transposed { (m, n) } else { (n, m) };
                    let x = random_vector(xl * k, seed ^ k as u64);
                    let y0 = random_vector(yl * k, seed ^ 0x55);
                    let dx = ctx.upload(&x)?;
                    let mut dy = ctx.upload(&if beta == 0.0 {
                        vec![f64::NAN; yl * k]
                    } else {
                        y0.clone()
                    })?;
                    if transposed {
                        op.apply_transposed_many(alpha, &dx, k, beta, &mut dy)?;
                    } else {
                        op.apply_many(alpha, &dx, k, beta, &mut dy)?;
                    }
                    let got = dy.to_host()?;
                    for j in 0..k {
                        let xj = ctx.upload(&x[j * xl..(j + 1) * xl])?;
                        let mut yj = ctx.upload(&y0[j * yl..(j + 1) * yl])?;
                        if transposed {
                            op.apply_transposed(alpha, &xj, beta, &mut yj)?;
                        } else {
                            op.apply(alpha, &xj, beta, &mut yj)?;
                        }
                        let want = yj.to_host()?;
                        let err = rel_l2(&got[j * yl..(j + 1) * yl], &want);
                        if err.is_nan() || err > 1e-13 {
                            failures.push(format!(
                                "{} k {k} column {j} transposed {transposed} beta {beta}: rel_l2 {err:.2e}",
                                op.storage()
                            ));
                        }
                    }
                }
            }
        }
    }
    Ok(outcome(
        "lsmr many batched products".into(),
        json!({"problem": "apply_many", "rows": m, "cols": n}),
        "-".into(),
        compare_vectors(&[], &[], 0.0, 0.0),
        1e-13,
        failures,
    ))
}
