//! The distributed cases of `tessera verify lsmr` (GPU only): one GPU runs the multi-GPU code
//! path with an NCCL communicator of size 1, so NCCL itself (library found, communicator made,
//! all-reduce on the device) and the distributed solver are exercised on any one-GPU machine.
//!
//! * `lsmr distributed size-1 all-reduce`: [`Communicator::single`], an in-place all-reduce of
//!   f32 and f64 device buffers and of host values: with one rank the values come back
//!   unchanged, bit for bit.
//! * `lsmr distributed size-1 <problem> <dtype>`: [`lsmr_distributed`] on a seeded random
//!   system against the one-GPU [`lsmr`](crate::linalg::lsmr()) on the same device operator
//!   and `b`: the same `istop`; the same `itn` in fp64 (within 1 in fp32, whose iterates the two
//!   solvers round differently: the one-GPU solver keeps `u` and `v` unnormalised); `x` and the
//!   estimates within [`tolerance`] relative.
//!
//! Without NCCL the cases are skipped with the probe's message (which says where NCCL was
//! looked for and how to make it visible), not failed: NCCL is optional at run time.

use serde_json::{json, Value};

use super::collective::Collective;
use super::communicator::Communicator;
use super::lsmr::{lsmr_distributed, DistributedRunOptions};
use super::operator::DistributedOperator;
use crate::check::compare as compare_vectors;
use crate::dtype::{DType, Element};
use crate::error::Result;
use crate::harness::VerifyOutcome;
use crate::linalg::{lsmr, LsmrOptions, LsmrResult, SparseDualOperator};
use crate::runtime::{probe, Context};
use crate::sparse::generate::{random_vector, try_generate, MatrixClass};
use crate::sparse::CsrHost;

/// One distributed case: a seeded random system in `value` storage.
#[derive(Clone, Debug)]
pub struct DistCase {
    pub label: &'static str,
    pub rows: usize,
    pub cols: usize,
    pub per_row: usize,
    pub damp: f64,
    pub x0: bool,
    pub value: DType,
}

impl DistCase {
    pub fn name(&self) -> String {
        format!(
            "lsmr distributed size-1 {} {}x{} {}",
            self.label, self.rows, self.cols, self.value
        )
    }
    pub fn params(&self) -> Value {
        json!({"problem": self.name(), "dtype": self.value.name(), "ranks": 1, "damp": self.damp, "x0": self.x0})
    }
}

/// The cases (`quick`: the tall fp64 one): small, a few milliseconds each.
pub fn cases(quick: bool) -> Vec<DistCase> {
    let c = |label, rows, cols, per_row, damp, x0, value| DistCase {
        label,
        rows,
        cols,
        per_row,
        damp,
        x0,
        value,
    };
    let mut out = vec![c("tall", 3001, 257, 9, 0.0, false, DType::F64)];
    if !quick {
        out.push(c("tall damped x0", 2000, 300, 7, 0.7, true, DType::F64));
        out.push(c("wide", 203, 1500, 40, 0.0, false, DType::F64));
        out.push(c("tall", 3001, 257, 9, 0.0, false, DType::F32));
    }
    out
}

/// Relative budget of `x` and the estimates against the one-GPU solver: fp64 1e-8 (the two
/// solvers round the same recurrences in another order: about 1e-13 on these systems), fp32
/// 1e-3 (f32 storage rounded at other points; the one-GPU solver's own fp32 budget).
pub fn tolerance(value: DType) -> f64 {
    if value == DType::F32 {
        1e-3
    } else {
        1e-8
    }
}

/// The outcome when NCCL cannot be used here: skipped, with the probe's reason.
fn no_nccl(case: String, params: Value) -> Option<VerifyOutcome> {
    probe::nccl()
        .err()
        .map(|e| VerifyOutcome::skipped(case, params, e.to_string()))
}

/// The distributed solver with one rank against the one-GPU solver.
pub fn verify_case(ctx: &Context, case: &DistCase, seed: u64) -> Result<VerifyOutcome> {
    crate::dispatch_float!("lsmr distributed verify"; case.value, [F32, F64], |T| run::<T>(ctx, case, seed))
}

fn run<T: Element>(ctx: &Context, case: &DistCase, seed: u64) -> Result<VerifyOutcome> {
    if let Some(skip) = no_nccl(case.name(), case.params()) {
        return Ok(skip);
    }
    let a: CsrHost<T, i32> = try_generate(
        MatrixClass::TallLeastSquares { per_row: case.per_row },
        case.rows,
        case.cols,
        seed,
    )?;
    let b: Vec<T> = random_vector(case.rows, seed ^ 0xb)
        .into_iter()
        .map(T::from_f64)
        .collect();
    let tol = if T::DTYPE == DType::F32 { 1e-4 } else { 1e-8 };
    let opts = LsmrOptions {
        damp: case.damp,
        atol: tol,
        btol: tol,
        x0: case.x0.then(|| random_vector(case.cols, seed ^ 0x70)),
        ..LsmrOptions::default()
    };
    let db = ctx.upload(&b)?;

    let single = SparseDualOperator::new(ctx, &a)?;
    let want = lsmr(ctx, &single, &db, &opts)?;

    let comm = Communicator::single(ctx)?;
    let op = DistributedOperator::new(
        Box::new(SparseDualOperator::new(ctx, &a)?),
        0..case.rows,
        case.rows,
        &comm,
    )?;
    let got = lsmr_distributed(&op, &db, &opts, &mut DistributedRunOptions::default())?;
    drop(op);
    comm.finish()?;

    let budget = tolerance(T::DTYPE);
    let mut failures = Vec::new();
    if got.istop != want.istop {
        failures.push(format!("istop {} (one-GPU solver: {})", got.istop, want.istop));
    }
    let itn_slack = if T::DTYPE == DType::F32 { 1 } else { 0 };
    if got.itn.abs_diff(want.itn) > itn_slack {
        failures.push(format!("itn {} (one-GPU solver: {})", got.itn, want.itn));
    }
    // each estimate relative to itself; normar (tiny at the stop) relative to ||A|| ||r||
    for (what, g, w, scale) in [
        ("normr", got.normr, want.normr, want.normr),
        ("normar", got.normar, want.normar, want.norma * want.normr),
        ("norma", got.norma, want.norma, want.norma),
        ("normx", got.normx, want.normx, want.normx),
    ] {
        let rel = (g - w).abs() / scale.abs().max(f64::MIN_POSITIVE);
        if rel.is_nan() || rel > budget {
            failures.push(format!("{what} {g:.6e} (one-GPU solver: {w:.6e}, rel {rel:.1e})"));
        }
    }
    let comparison = compare_vectors(&got.x, &want.x, 0.0, budget);
    let x_rel = rel_l2(&got.x, &want.x);
    if x_rel.is_nan() || x_rel > budget {
        failures.push(format!("x rel L2 {x_rel:.1e} > {budget:.0e}"));
    }
    Ok(outcome(case.name(), case.params(), comparison, budget, failures, &got))
}

fn rel_l2(x: &[f64], want: &[f64]) -> f64 {
    let d: f64 = x.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum();
    let w: f64 = want.iter().map(|e| e * e).sum();
    (d / w.max(f64::MIN_POSITIVE)).sqrt()
}

fn outcome(
    case: String,
    params: Value,
    comparison: crate::check::Comparison,
    budget: f64,
    failures: Vec<String>,
    got: &LsmrResult,
) -> VerifyOutcome {
    VerifyOutcome {
        case,
        params,
        path: format!("nccl size 1, istop {} itn {}", got.istop, got.itn),
        comparison,
        budget,
        passed: failures.is_empty(),
        note: (!failures.is_empty()).then(|| failures.join("; ")),
        skipped: None,
    }
}

/// NCCL with one rank: an in-place all-reduce of device buffers (f32, f64, odd lengths) and of
/// host values returns them unchanged, bit for bit; a too-long `len` is an error.
pub fn verify_all_reduce(ctx: &Context, _case: &(), seed: u64) -> Result<VerifyOutcome> {
    let name = "lsmr distributed size-1 all-reduce".to_string();
    let params = json!({"problem": name, "ranks": 1});
    if let Some(skip) = no_nccl(name.clone(), params.clone()) {
        return Ok(skip);
    }
    let comm = Communicator::single(ctx)?;
    let mut failures = Vec::new();
    if (comm.rank(), comm.size()) != (0, 1) {
        failures.push(format!("rank {} size {}", comm.rank(), comm.size()));
    }
    for len in [1usize, 1000, 65_537] {
        let v = random_vector(len, seed ^ len as u64);
        let mut d64 = ctx.upload(&v)?;
        comm.all_reduce_sum(&mut d64, len)?;
        if d64.to_host()?.iter().zip(&v).any(|(a, b)| a.to_bits() != b.to_bits()) {
            failures.push(format!("f64 all-reduce of {len} changed the values"));
        }
        let v32: Vec<f32> = v.iter().map(|&e| e as f32).collect();
        let mut d32 = ctx.upload(&v32)?;
        comm.all_reduce_sum(&mut d32, len)?;
        if d32.to_host()?.iter().zip(&v32).any(|(a, b)| a.to_bits() != b.to_bits()) {
            failures.push(format!("f32 all-reduce of {len} changed the values"));
        }
        if comm.all_reduce_sum(&mut d32, len + 1).is_ok() {
            failures.push(format!("len {} on a buffer of {len} was accepted", len + 1));
        }
    }
    let mut host = vec![1.5, -2.25, 3e300];
    comm.all_reduce_sum_host(&mut host)?;
    if host
        .iter()
        .map(|e| e.to_bits())
        .ne([1.5f64, -2.25, 3e300].iter().map(|e| e.to_bits()))
    {
        failures.push(format!("host all-reduce changed the values: {host:?}"));
    }
    comm.finish()?;
    Ok(VerifyOutcome {
        case: name,
        params,
        path: "nccl size 1".into(),
        comparison: compare_vectors(&[], &[], 0.0, 0.0),
        budget: 0.0,
        passed: failures.is_empty(),
        note: (!failures.is_empty()).then(|| failures.join("; ")),
        skipped: None,
    })
}
