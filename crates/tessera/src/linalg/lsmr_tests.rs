//! Tests of [`lsmr_host`]: SciPy fixtures, direct checks of the estimates, damping against
//! the augmented system, argument validation, and the stopping rule's precedence.
//!
//! # The SciPy fixtures
//!
//! `testdata/lsmr_fixtures.json` is written by `scripts/lsmr_fixtures.py` (its docstring says
//! how to regenerate it) with SciPy 1.17's `lsmr` on small problems given as a `csr_array`.
//! Each case's inputs are checked bit for bit (`input_sha256`), solved here with the matrix as
//! a [`CsrHost`] (products in SciPy's CSR order) and compared:
//!
//! * `istop` exactly; `itn` within 1 (a stopping test that lands within rounding of its
//!   threshold may pass one iteration earlier or later; SciPy itself shows this: the
//!   `ill_conditioned_machine` case stops at itn 43 with CSR products and 42 with BLAS ones,
//!   and we stop at 42; every other case matches `itn` exactly);
//! * `x` by relative L2 error and the five estimates as [`Tol`] describes, within the case's
//!   tolerance.
//!
//! Why not exact: NumPy's `norm` is BLAS `ddot` (blocked, several accumulators) where ours sums
//! in order, so `alpha`, `beta` and `||x||` differ in the last bit, and Krylov iterations
//! amplify such differences as they lose orthogonality. How much is a property of the problem,
//! not of the code: the fixture's `spread` records the same comparison between two SciPy runs
//! (CSR products vs BLAS dense products). Each tolerance below is a fixed number stated per
//! case, chosen well above that spread (x: at least 100 times it, and never tighter than
//! [`Tol::WELL`]); [`Tol`] explains how each quantity is measured and [`tolerance`] gives
//! the reason for every case that is not [`Tol::WELL`]. The test prints each error as a
//! fraction of its tolerance (`cargo test ... -- --nocapture`).

use super::fixtures::{compare, fixture_cases, rel, rel_l2, scaled_errors, tolerance, Case};
use super::lsmr::{stop_code, StopTests};
use super::{istop_reason, lsmr_host, DenseHost, FnOperator, HostLinearOperator, LsmrOptions, LsmrResult};
use crate::error::Error;
use crate::sparse::CsrHost;

/// The fixture cases, checked to be bit for bit the inputs SciPy solved.
fn cases() -> Vec<Case> {
    let cases = fixture_cases();
    for c in &cases {
        assert!(c.inputs_match, "{}: inputs differ from SciPy's", c.name);
    }
    cases
}

#[test]
fn matches_scipy_on_every_fixture() {
    let cases = cases();
    assert!(cases.len() >= 20, "the fixture file lists {} cases", cases.len());
    let mut failures = Vec::new();
    for case in &cases {
        let got = lsmr_host(&case.csr, &case.b, &case.opts).unwrap();
        let want = &case.expected;
        let normb = case.b.iter().map(|e| e * e).sum::<f64>().sqrt();
        let tol = tolerance(&case.name);
        let errors = scaled_errors(&got, want, normb, tol);
        let shown: Vec<String> = errors.iter().map(|(what, e)| format!("{what} {e:.0e}")).collect();
        eprintln!(
            "{:26} istop {} itn {:3} (SciPy {:3}) x rel err {:.1e}; errors / tolerance: {}",
            case.name,
            got.istop,
            got.itn,
            want.itn,
            rel_l2(&got.x, &want.x),
            shown.join(" ")
        );
        failures.extend(compare(&case.name, &got, want, normb, tol));
    }
    assert!(failures.is_empty(), "mismatches with SciPy:\n{}", failures.join("\n"));
}

#[test]
fn the_fixtures_cover_every_stop_but_six() {
    let seen: std::collections::BTreeSet<u32> = cases().iter().map(|c| c.expected.istop).collect();
    for istop in [0, 1, 2, 3, 4, 5, 7] {
        assert!(seen.contains(&istop), "no fixture stops with istop {istop}");
    }
}

#[test]
fn dense_and_matrix_free_operators_give_the_csr_result_bit_for_bit() {
    // The three operators sum in the same order, so the solver sees identical numbers.
    for case in cases() {
        let csr = lsmr_host(&case.csr, &case.b, &case.opts).unwrap();
        let dense = lsmr_host(&case.dense, &case.b, &case.opts).unwrap();
        assert_eq!(csr, dense, "{}", case.name);
        let a = &case.csr;
        let op = FnOperator::new(
            a.rows,
            a.cols,
            |alpha, x: &[f64], beta, y: &mut [f64]| a.apply(alpha, x, beta, y),
            |alpha, x: &[f64], beta, y: &mut [f64]| a.apply_transposed(alpha, x, beta, y),
        );
        assert_eq!(csr, lsmr_host(&op, &case.b, &case.opts).unwrap(), "{}", case.name);
    }
}

/// `r = b - A x`, `A^T r`, `||r||`, `||A^T r||` from the dense matrix.
fn residuals(a: &DenseHost, b: &[f64], x: &[f64]) -> (f64, f64) {
    let mut r = b.to_vec();
    a.apply(-1.0, x, 1.0, &mut r);
    let mut atr = vec![0.0; a.cols];
    a.apply_transposed(1.0, &r, 0.0, &mut atr);
    let norm = |v: &[f64]| v.iter().map(|e| e * e).sum::<f64>().sqrt();
    (norm(&r), norm(&atr))
}

#[test]
fn estimates_match_direct_computation() {
    // SciPy's TestLSMRReturns: normr, normar and normx against b - A x computed directly, on
    // every undamped fixture that iterated. The recurrences track the true values up to
    // rounding of the size eps * ||A|| * ||x|| (for normr) and eps * ||A||^2 * ||x|| (normar).
    for case in cases().iter().filter(|c| c.opts.damp == 0.0 && c.expected.itn > 0) {
        let got = lsmr_host(&case.csr, &case.b, &case.opts).unwrap();
        let (normr, normar) = residuals(&case.dense, &case.b, &got.x);
        let normx = got.x.iter().map(|e| e * e).sum::<f64>().sqrt();
        let floor = 1e-12 * (got.norma * normx + got.normr);
        assert!(
            (got.normr - normr).abs() <= 1e-6 * normr + floor,
            "{}: normr {} vs ||b - A x|| {normr}",
            case.name,
            got.normr
        );
        assert!(
            (got.normar - normar).abs() <= 1e-4 * normar + got.norma * floor,
            "{}: normar {} vs ||A^T r|| {normar}",
            case.name,
            got.normar
        );
        assert_eq!(got.normx, normx, "{}", case.name);
    }
}

#[test]
fn damping_equals_the_augmented_undamped_problem() {
    // min ||[b; 0] - [A; damp I] x||: LSMR on the damped problem and on the stacked matrix
    // build the same Krylov subspaces (A^T A + damp^2 I shifts A^T A), so with tight
    // tolerances both reach the same x; normr is the augmented residual in both.
    for case in cases().iter().filter(|c| c.opts.damp > 0.0) {
        let damp = case.opts.damp;
        let (m, n) = case.dense.shape();
        let mut data = case.dense.data.clone();
        data.extend((0..n * n).map(|k| if k / n == k % n { damp } else { 0.0 }));
        let stacked = DenseHost::new(m + n, n, data).unwrap();
        let mut b = case.b.clone();
        b.resize(m + n, 0.0);
        let tight = LsmrOptions {
            atol: 1e-12,
            btol: 1e-12,
            maxiter: Some(10 * n),
            ..LsmrOptions::default()
        };
        let damped = lsmr_host(&case.dense, &case.b, &LsmrOptions { damp, ..tight.clone() }).unwrap();
        let augmented = lsmr_host(&stacked, &b, &tight).unwrap();
        assert_eq!((damped.istop, augmented.istop), (2, 2), "{}", case.name);
        let err = rel_l2(&damped.x, &augmented.x);
        assert!(err <= 1e-10, "{}: damped vs augmented x differ by {err:.2e}", case.name);
        // normr and normar are those of the augmented system: ||[b; 0] - [A; damp I] x|| and
        // ||A^T r - damp^2 x||, computed directly here.
        let (normr_aug, normar_aug) = residuals(&stacked, &b, &damped.x);
        let scale = damped.norma * case.b.iter().map(|e| e * e).sum::<f64>().sqrt();
        assert!(
            (damped.normar - normar_aug).abs() <= 1e-6 * normar_aug + 1e-12 * scale,
            "{}: normar {} vs ||A^T r - damp^2 x|| {normar_aug}",
            case.name,
            damped.normar
        );
        assert!(
            rel(damped.normr, normr_aug) <= 1e-10,
            "{}: normr {} vs {normr_aug}",
            case.name,
            damped.normr
        );
        assert!(rel(damped.normr, augmented.normr) <= 1e-10, "{}", case.name);
        // The fixture's own (default-tolerance) solve also agrees with the augmented one.
        let fixture = lsmr_host(&case.dense, &case.b, &case.opts).unwrap();
        assert!(rel_l2(&fixture.x, &augmented.x) <= 1e-5, "{}", case.name);
    }
}

#[test]
fn show_prints_without_failing() {
    // Output goes to stderr (captured by the test harness); every path must run, including
    // the heading repeats (more than 20 lines) and the early exits.
    for case in cases() {
        let opts = LsmrOptions {
            show: true,
            ..case.opts.clone()
        };
        // Printing must not change the numbers.
        let quiet = lsmr_host(&case.csr, &case.b, &case.opts).unwrap();
        assert_eq!(lsmr_host(&case.csr, &case.b, &opts).unwrap(), quiet, "{}", case.name);
    }
}

#[test]
fn empty_problems_stop_at_once() {
    for (m, n) in [(0, 3), (3, 0), (0, 0)] {
        let a = DenseHost::new(m, n, vec![]).unwrap();
        let b = vec![1.0; m];
        let r = lsmr_host(&a, &b, &LsmrOptions::default()).unwrap();
        assert_eq!((r.istop, r.itn, r.x.len()), (0, 0, n), "{m} x {n}");
    }
}

#[test]
fn x0_is_not_modified_and_zero_x0_is_the_cold_start() {
    let case = cases().into_iter().find(|c| c.name == "tall_consistent").unwrap();
    let cold = lsmr_host(&case.csr, &case.b, &case.opts).unwrap();
    let zero = LsmrOptions {
        x0: Some(vec![0.0; case.csr.cols]),
        ..case.opts.clone()
    };
    let warm = lsmr_host(&case.csr, &case.b, &zero).unwrap();
    assert_eq!(zero.x0.as_deref(), Some(&vec![0.0; case.csr.cols][..]));
    assert_eq!((warm.istop, warm.itn), (cold.istop, cold.itn));
    assert!(rel_l2(&warm.x, &cold.x) <= 1e-14);
}

/// The argument and rule of an `InvalidArgument` error (panics on anything else).
fn invalid(r: crate::Result<LsmrResult>) -> (&'static str, String) {
    match r {
        Err(Error::InvalidArgument { arg, rule }) => (arg, rule),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[test]
fn invalid_arguments_are_errors() {
    let a = DenseHost::new(3, 2, vec![1.0, 0.0, 1.0, 1.0, 0.0, 1.0]).unwrap();
    let b = [1.0, 0.0, -1.0];
    let ok = LsmrOptions::default();
    assert!(lsmr_host(&a, &b, &ok).is_ok());

    let (arg, rule) = invalid(lsmr_host(&a, &b[..2], &ok));
    assert_eq!(arg, "b");
    assert!(rule.contains("has 2 elements") && rule.contains("m = 3"), "{rule}");

    let (arg, rule) = invalid(lsmr_host(&a, &[1.0, f64::NAN, 0.0], &ok));
    assert_eq!(arg, "b");
    assert!(rule.contains("element 1 is NaN"), "{rule}");
    assert_eq!(invalid(lsmr_host(&a, &[1.0, 0.0, f64::NEG_INFINITY], &ok)).0, "b");

    let with_x0 = |x0: Vec<f64>| LsmrOptions {
        x0: Some(x0),
        ..LsmrOptions::default()
    };
    let (arg, rule) = invalid(lsmr_host(&a, &b, &with_x0(vec![0.0; 3])));
    assert_eq!(arg, "x0");
    assert!(rule.contains("n = 2"), "{rule}");
    let (arg, rule) = invalid(lsmr_host(&a, &b, &with_x0(vec![0.0, f64::INFINITY])));
    assert_eq!(arg, "x0");
    assert!(rule.contains("element 1 is inf"), "{rule}");

    type Set = fn(&mut LsmrOptions, f64);
    let setters: [(&str, Set); 4] = [
        ("damp", |o, v| o.damp = v),
        ("atol", |o, v| o.atol = v),
        ("btol", |o, v| o.btol = v),
        ("conlim", |o, v| o.conlim = v),
    ];
    for (name, set) in setters {
        for bad in [-1e-3, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let mut o = LsmrOptions::default();
            set(&mut o, bad);
            let (arg, rule) = invalid(lsmr_host(&a, &b, &o));
            assert_eq!(arg, name, "{name} = {bad}");
            assert!(rule.contains("finite and >= 0"), "{rule}");
        }
        // 0 is allowed for each (conlim 0: no limit).
        let mut o = LsmrOptions::default();
        set(&mut o, 0.0);
        assert!(lsmr_host(&a, &b, &o).is_ok(), "{name} = 0");
    }

    // A CSR matrix whose public fields were edited into an invalid state is caught, not
    // indexed out of bounds.
    let mut csr = CsrHost::<f64, i32>::from_dense(3, 2, &a.data);
    csr.indices[0] = 5;
    assert!(lsmr_host(&csr, &b, &ok).is_err());
    let broken = DenseHost {
        rows: 3,
        cols: 2,
        data: vec![1.0; 5],
    };
    assert_eq!(invalid(lsmr_host(&broken, &b, &ok)).0, "data");
}

#[test]
fn defaults_are_scipys() {
    let o = LsmrOptions::default();
    assert_eq!((o.damp, o.atol, o.btol, o.conlim), (0.0, 1e-6, 1e-6, 1e8));
    assert_eq!((o.maxiter, o.x0, o.show), (None, None, false));
}

#[test]
fn istop_reasons_are_distinct_words() {
    let reasons: Vec<_> = (0..=8).map(istop_reason).collect();
    let unique: std::collections::BTreeSet<_> = reasons.iter().collect();
    assert_eq!(unique.len(), 9);
    assert!(istop_reason(3).contains("conlim") && istop_reason(7).contains("maxiter"));
}

#[test]
fn the_last_stopping_test_that_holds_wins() {
    // Nothing holds: go on.
    let none = StopTests {
        test1: 1.0,
        test2: 1.0,
        test3: 1.0,
        t1: 1.0,
        rtol: 1e-6,
    };
    let (atol, ctol) = (1e-6, 1e-8);
    assert_eq!(stop_code(&none, false, atol, ctol), 0);
    assert_eq!(stop_code(&none, true, atol, ctol), 7);
    // Each machine-precision test overrides maxiter and the ones before it.
    let cond_eps = StopTests { test3: 1e-17, ..none };
    assert_eq!(stop_code(&cond_eps, true, atol, 0.0), 6);
    let ls_eps = StopTests {
        test2: 1e-17,
        ..cond_eps
    };
    assert_eq!(stop_code(&ls_eps, true, 0.0, 0.0), 5);
    let ax_eps = StopTests { t1: 1e-17, ..ls_eps };
    assert_eq!(stop_code(&ax_eps, true, 0.0, 0.0), 4);
    // The user's tolerances override the machine-precision ones.
    assert_eq!(stop_code(&ax_eps, true, 0.0, 1e-16), 3);
    assert_eq!(stop_code(&ax_eps, true, 1e-16, 1e-16), 2);
    let ax = StopTests { test1: 1e-7, ..ax_eps };
    assert_eq!(stop_code(&ax, true, 1e-16, 1e-16), 1);
    // conlim == 0 (ctol 0): only an infinite cond estimate (test3 = 0) stops with 3.
    let cond_inf = StopTests { test3: 0.0, ..none };
    assert_eq!(stop_code(&cond_inf, false, atol, 0.0), 3);
    // test2 = inf (norma * normr == 0) never passes a tolerance.
    let inf = StopTests {
        test2: f64::INFINITY,
        ..none
    };
    assert_eq!(stop_code(&inf, false, atol, ctol), 0);
}

// ---- the damp list (lsmr_host_damps) ----

/// A random tall sparse problem (seeded).
fn random_tall(rows: usize, cols: usize, seed: u64) -> (CsrHost<f64, i32>, Vec<f64>) {
    use crate::sparse::generate::{generate, random_vector, MatrixClass};
    let a = generate(MatrixClass::TallLeastSquares { per_row: 6 }, rows, cols, seed);
    (a, random_vector(rows, seed ^ 0xb))
}

#[test]
fn each_damp_of_a_list_equals_its_own_solve_bit_for_bit() {
    // Every fixture (its options with damp moved into the list), with damps that stop at
    // different iterations: the shared bidiagonalisation must not change any damp's numbers.
    for case in cases() {
        let damps = [case.opts.damp, 0.0, 0.3, 1.0, 10.0, case.opts.damp];
        let opts = LsmrOptions {
            damp: 0.0,
            ..case.opts.clone()
        };
        let got = super::lsmr_host_damps(&case.csr, &case.b, &damps, &opts).unwrap();
        assert_eq!(got.len(), damps.len());
        for (j, (&damp, r)) in damps.iter().zip(&got).enumerate() {
            let alone = lsmr_host(&case.csr, &case.b, &LsmrOptions { damp, ..opts.clone() }).unwrap();
            assert_eq!(r, &alone, "{} damp[{j}] = {damp}", case.name);
        }
    }
}

#[test]
fn a_damp_list_with_mixed_stop_times_keeps_each_iterate() {
    let (a, b) = random_tall(1500, 120, 11);
    let damps = [0.0, 1e-3, 0.5, 2.0, 8.0, 40.0, 0.0];
    for x0 in [false, true] {
        let opts = LsmrOptions {
            atol: 1e-9,
            btol: 1e-9,
            x0: x0.then(|| crate::sparse::generate::random_vector(120, 5)),
            ..LsmrOptions::default()
        };
        let got = super::lsmr_host_damps(&a, &b, &damps, &opts).unwrap();
        let itns: std::collections::BTreeSet<usize> = got.iter().map(|r| r.itn).collect();
        // The test is only meaningful when the damps stop at different iterations.
        assert!(itns.len() >= 4, "stop iterations {itns:?}");
        for (&damp, r) in damps.iter().zip(&got) {
            let alone = lsmr_host(&a, &b, &LsmrOptions { damp, ..opts.clone() }).unwrap();
            assert_eq!(r, &alone, "damp {damp} x0 {x0}");
            assert!(r.istop == 1 || r.istop == 2, "damp {damp}: istop {}", r.istop);
        }
        // A larger damp shrinks x (Tikhonov): ||x|| decreases along the increasing damps.
        for w in got[1..6].windows(2) {
            assert!(w[1].normx < w[0].normx || x0, "{} then {}", w[0].normx, w[1].normx);
        }
    }
}

#[test]
fn a_damp_list_of_one_is_the_plain_solve_and_limits_are_shared() {
    let (a, b) = random_tall(700, 90, 3);
    for damp in [0.0, 0.25] {
        let one = super::lsmr_host_damps(&a, &b, &[damp], &LsmrOptions::default()).unwrap();
        let plain = lsmr_host(
            &a,
            &b,
            &LsmrOptions {
                damp,
                ..LsmrOptions::default()
            },
        )
        .unwrap();
        assert_eq!(one, vec![plain]);
    }
    // maxiter stops every damp with istop 7 at the same itn; maxiter 0 runs nothing.
    let limited = LsmrOptions {
        maxiter: Some(5),
        atol: 0.0,
        btol: 0.0,
        conlim: 0.0,
        ..LsmrOptions::default()
    };
    for r in super::lsmr_host_damps(&a, &b, &[0.0, 1.0, 3.0], &limited).unwrap() {
        assert_eq!((r.istop, r.itn), (7, 5));
    }
    let none = LsmrOptions {
        maxiter: Some(0),
        ..LsmrOptions::default()
    };
    for r in super::lsmr_host_damps(&a, &b, &[0.0, 1.0], &none).unwrap() {
        assert_eq!((r.istop, r.itn), (0, 0));
        assert!(r.x.iter().all(|&e| e == 0.0));
    }
    // the early exit (b = 0) is shared too
    let zero = vec![0.0; b.len()];
    for r in super::lsmr_host_damps(&a, &zero, &[0.0, 1.0], &LsmrOptions::default()).unwrap() {
        assert_eq!((r.istop, r.itn, r.normx), (0, 0, 0.0));
    }
}

#[test]
fn a_bad_damp_list_is_an_error_naming_it() {
    let a = DenseHost::new(3, 2, vec![1.0, 0.0, 1.0, 1.0, 0.0, 1.0]).unwrap();
    let b = [1.0, 0.0, -1.0];
    let ok = LsmrOptions::default();
    let err = |r: crate::Result<Vec<LsmrResult>>| match r {
        Err(Error::InvalidArgument { arg, rule }) => (arg, rule),
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
    let (arg, rule) = err(super::lsmr_host_damps(&a, &b, &[], &ok));
    assert_eq!(arg, "damps");
    assert!(rule.contains("empty"), "{rule}");
    for bad in [-1.0, f64::NAN, f64::INFINITY] {
        let (arg, rule) = err(super::lsmr_host_damps(&a, &b, &[0.0, 1.0, bad], &ok));
        assert_eq!(arg, "damps", "{bad}");
        assert!(rule.contains("element 2"), "{rule}");
    }
    let with_damp = LsmrOptions {
        damp: 0.5,
        ..ok.clone()
    };
    assert_eq!(err(super::lsmr_host_damps(&a, &b, &[1.0], &with_damp)).0, "damp");
    // the checks of a single solve still come first
    assert_eq!(err(super::lsmr_host_damps(&a, &b[..2], &[1.0], &ok)).0, "b");
    // show runs every path of the damp list's output
    let show = LsmrOptions { show: true, ..ok };
    assert_eq!(super::lsmr_host_damps(&a, &b, &[0.0, 2.0], &show).unwrap().len(), 2);
}

// ---- column scaling (LsmrOptions::scale_columns) ----

/// A random tall problem whose column j is multiplied by 10^(-3 .. 3) (badly scaled columns).
fn badly_scaled(rows: usize, cols: usize, seed: u64) -> (CsrHost<f64, i32>, Vec<f64>) {
    let (mut a, b) = random_tall(rows, cols, seed);
    let factor: Vec<f64> = (0..cols)
        .map(|j| 10f64.powf(-3.0 + 6.0 * ((j * 7919) % cols) as f64 / cols as f64))
        .collect();
    for (c, v) in a.indices.iter().zip(a.values.iter_mut()) {
        *v *= factor[*c as usize];
    }
    (a, b)
}

#[test]
fn column_scaling_solves_the_scaled_matrix_and_returns_original_variables() {
    let (a, b) = badly_scaled(1200, 80, 21);
    let norms = a.column_norms().unwrap();
    let d: Vec<f64> = norms.iter().map(|&v| 1.0 / v).collect();
    // A D built explicitly
    let mut ad = a.clone();
    for (c, v) in ad.indices.iter().zip(ad.values.iter_mut()) {
        *v *= d[*c as usize];
    }
    let x0 = crate::sparse::generate::random_vector(80, 9);
    for (damp, warm) in [(0.0, false), (0.3, false), (0.0, true)] {
        let opts = LsmrOptions {
            damp,
            atol: 1e-10,
            btol: 1e-10,
            x0: warm.then(|| x0.clone()),
            scale_columns: true,
            ..LsmrOptions::default()
        };
        let got = lsmr_host(&a, &b, &opts).unwrap();
        let y0 = warm.then(|| x0.iter().zip(&d).map(|(x, d)| x / d).collect::<Vec<_>>());
        let plain = LsmrOptions {
            x0: y0,
            scale_columns: false,
            ..opts.clone()
        };
        let y = lsmr_host(&ad, &b, &plain).unwrap();
        assert_eq!(got.istop, y.istop, "damp {damp} warm {warm}");
        assert!(got.itn.abs_diff(y.itn) <= 1, "itn {} vs {}", got.itn, y.itn);
        let dy: Vec<f64> = y.x.iter().zip(&d).map(|(y, d)| y * d).collect();
        let err = rel_l2(&got.x, &dy);
        assert!(err <= 1e-8, "damp {damp} warm {warm}: x vs D y {err:.2e}");
        // the estimates are those of the scaled problem: normx is ||y||, not ||x||
        assert!(rel(got.normx, y.normx) <= 1e-8, "{} vs {}", got.normx, y.normx);
        assert!(rel(got.norma, y.norma) <= 1e-8);
        let normx: f64 = got.x.iter().map(|e| e * e).sum::<f64>().sqrt();
        assert!(rel(got.normx, normx) > 1e-3, "normx should be ||y||, here ||x||");
    }
}

#[test]
fn column_scaling_converges_much_faster_on_badly_scaled_columns() {
    let (a, b) = badly_scaled(2000, 150, 4);
    let opts = LsmrOptions {
        atol: 1e-10,
        btol: 1e-10,
        maxiter: Some(5000),
        conlim: 0.0,
        ..LsmrOptions::default()
    };
    let plain = lsmr_host(&a, &b, &opts).unwrap();
    let scaled = lsmr_host(
        &a,
        &b,
        &LsmrOptions {
            scale_columns: true,
            ..opts.clone()
        },
    )
    .unwrap();
    assert!(scaled.istop == 1 || scaled.istop == 2, "scaled istop {}", scaled.istop);
    assert!(
        2 * scaled.itn < plain.itn,
        "scaled itn {} vs unscaled {} (istop {})",
        scaled.itn,
        plain.itn,
        plain.istop
    );
    // the scaled solution is the least-squares solution: A^T (b - A x) ~ 0, column by column
    // relative to each column's norm
    let mut r = b.clone();
    a.apply(-1.0, &scaled.x, 1.0, &mut r);
    let mut atr = vec![0.0; 150];
    a.apply_transposed(1.0, &r, 0.0, &mut atr);
    let norms = a.column_norms().unwrap();
    let rn: f64 = r.iter().map(|e| e * e).sum::<f64>().sqrt();
    let worst = atr
        .iter()
        .zip(&norms)
        .map(|(g, n)| g.abs() / (n * rn))
        .fold(0.0, f64::max);
    assert!(worst <= 1e-8, "scaled optimality {worst:.2e}");
}

#[test]
fn column_scaling_leaves_zero_columns_and_composes_with_the_damp_list() {
    // a zero column keeps the factor 1 (no division by zero); its x stays 0
    let a = DenseHost::new(4, 3, vec![1.0, 0.0, 2.0, 0.0, 0.0, 1.0, 3.0, 0.0, 0.0, 1.0, 0.0, 5.0]).unwrap();
    assert_eq!(a.column_norms().unwrap()[1], 0.0);
    let b = [1.0, 2.0, 3.0, 4.0];
    let opts = LsmrOptions {
        scale_columns: true,
        ..LsmrOptions::default()
    };
    let r = lsmr_host(&a, &b, &opts).unwrap();
    assert!(r.x.iter().all(|e| e.is_finite()) && r.x[1] == 0.0, "{:?}", r.x);
    // CSR and dense give the same norms (bit for bit: same order)
    let csr = CsrHost::<f64, i32>::from_dense(4, 3, &a.data);
    assert_eq!(csr.column_norms(), a.column_norms());

    let (a, b) = badly_scaled(600, 50, 8);
    let damps = [0.0, 0.01, 0.1, 1.0];
    let list = super::lsmr_host_damps(&a, &b, &damps, &opts).unwrap();
    for (&damp, r) in damps.iter().zip(&list) {
        assert_eq!(r, &lsmr_host(&a, &b, &LsmrOptions { damp, ..opts.clone() }).unwrap());
    }
}

#[test]
fn column_scaling_needs_valid_column_norms() {
    let a = DenseHost::new(3, 2, vec![1.0, 0.0, 1.0, 1.0, 0.0, 1.0]).unwrap();
    let b = [1.0, 0.0, -1.0];
    let opts = LsmrOptions {
        scale_columns: true,
        ..LsmrOptions::default()
    };
    let op = || {
        FnOperator::new(
            3,
            2,
            |alpha, x: &[f64], beta, y: &mut [f64]| a.apply(alpha, x, beta, y),
            |alpha, x: &[f64], beta, y: &mut [f64]| a.apply_transposed(alpha, x, beta, y),
        )
    };
    match lsmr_host(&op(), &b, &opts) {
        Err(Error::Unsupported(msg)) => assert!(msg.contains("scale_columns"), "{msg}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let given = lsmr_host(&op().with_column_norms(a.column_norms().unwrap()), &b, &opts).unwrap();
    assert_eq!(given, lsmr_host(&a, &b, &opts).unwrap());
    assert_eq!(
        invalid(lsmr_host(&op().with_column_norms(vec![1.0]), &b, &opts)).0,
        "column_norms"
    );
    let (arg, rule) = invalid(lsmr_host(&op().with_column_norms(vec![1.0, -2.0]), &b, &opts));
    assert_eq!(arg, "column_norms");
    assert!(rule.contains("element 1"), "{rule}");
    // off by default
    assert!(!LsmrOptions::default().scale_columns);
}

/// `tessera verify lsmr` compares a GPU run that stopped one iteration past the reference with
/// the reference re-run to that iteration with every tolerance test off: that re-run must reach
/// the requested iteration (a maxiter stop) one past or one before the reference's stop, and
/// its iterate at the reference's own stop must be the original one.
#[test]
fn a_rerun_with_the_tolerance_tests_off_reaches_the_next_iteration() {
    for name in ["ill_conditioned_conlim", "ill_conditioned_machine"] {
        let c = cases().into_iter().find(|c| c.name == name).expect("fixture");
        let want = lsmr_host(&c.csr, &c.b, &c.opts).unwrap();
        let off = |itn| LsmrOptions {
            atol: 0.0,
            btol: 0.0,
            conlim: 0.0,
            maxiter: Some(itn),
            ..c.opts.clone()
        };
        // the GPU overshot the conlim stop (20 vs 19) and undershot the machine-precision one
        // (41 vs 42); the latter's tests stop every run at 42, the former's can go on
        let target = if name == "ill_conditioned_conlim" {
            want.itn + 1
        } else {
            want.itn - 1
        };
        let moved = lsmr_host(&c.csr, &c.b, &off(target)).unwrap();
        assert_eq!((moved.istop, moved.itn), (7, target), "{name}");
        let same = lsmr_host(&c.csr, &c.b, &off(want.itn)).unwrap();
        assert_eq!(same.x, want.x, "{name}: the iterate at the reference's own stop");
    }
}

// ---- many right-hand sides (lsmr_host_many) ----

#[test]
fn each_column_of_many_equals_its_own_solve_bit_for_bit() {
    let (a, _) = random_tall(900, 70, 21);
    let dense = {
        let mut d = vec![0.0; 900 * 70];
        for r in 0..900 {
            let (cols, vals) = a.row(r);
            for (&c, &v) in cols.iter().zip(vals) {
                d[r * 70 + c as usize] += v;
            }
        }
        DenseHost::new(900, 70, d).unwrap()
    };
    for k in [1usize, 2, 5, 33] {
        let b = super::fixtures::mixed_rhs(&a, k, 7);
        for x0 in [false, true] {
            let x0s = x0.then(|| crate::sparse::generate::random_vector(70 * k, 3));
            let opts = LsmrOptions {
                atol: 1e-10,
                btol: 1e-10,
                ..LsmrOptions::default()
            };
            let got = super::lsmr_host_many(&a, &b, k, x0s.as_deref(), &opts).unwrap();
            assert_eq!(got.len(), k);
            for (j, r) in got.iter().enumerate() {
                let col = LsmrOptions {
                    x0: x0s.as_ref().map(|v| v[j * 70..(j + 1) * 70].to_vec()),
                    ..opts.clone()
                };
                let alone = lsmr_host(&a, &b[j * 900..(j + 1) * 900], &col).unwrap();
                assert_eq!(r, &alone, "k {k} column {j} x0 {x0}");
            }
            // the dense operator gives the same (bitwise: same summation order)
            if k == 5 {
                let d = super::lsmr_host_many(&dense, &b, k, x0s.as_deref(), &opts).unwrap();
                assert_eq!(d, got, "dense k {k}");
            }
            if k >= 5 {
                let itns: std::collections::BTreeSet<usize> = got.iter().map(|r| r.itn).collect();
                assert!(itns.len() >= 3, "k {k}: stop iterations {itns:?}");
            }
            // the zero column: SciPy's b = 0 answer
            if k >= 3 {
                assert_eq!(got[2].istop, 0);
                assert!(got[2].x.iter().all(|&e| e == 0.0));
            }
        }
    }
}

#[test]
fn many_right_hand_sides_check_their_arguments() {
    let (a, b) = random_tall(50, 10, 2);
    let ok = LsmrOptions::default();
    let arg = |r: crate::Result<Vec<LsmrResult>>| match r {
        Err(Error::InvalidArgument { arg, .. }) => arg,
        other => panic!("expected an invalid-argument error, got {other:?}"),
    };
    let b2: Vec<f64> = b.iter().chain(&b).copied().collect();
    assert_eq!(arg(super::lsmr_host_many(&a, &b2, 0, None, &ok)), "k");
    assert_eq!(arg(super::lsmr_host_many(&a, &b2, 3, None, &ok)), "b");
    assert_eq!(arg(super::lsmr_host_many(&a, &b2[..99], 2, None, &ok)), "b");
    let mut nan = b2.clone();
    nan[57] = f64::NAN;
    match super::lsmr_host_many(&a, &nan, 2, None, &ok) {
        Err(Error::InvalidArgument { arg: "b", rule }) => assert!(rule.contains("(7, 1)"), "{rule}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(arg(super::lsmr_host_many(&a, &b2, 2, Some(&[0.0; 19]), &ok)), "x0");
    let mut x0 = vec![0.0; 20];
    x0[3] = f64::INFINITY;
    assert_eq!(arg(super::lsmr_host_many(&a, &b2, 2, Some(&x0), &ok)), "x0");
    let with_x0 = LsmrOptions {
        x0: Some(vec![0.0; 10]),
        ..LsmrOptions::default()
    };
    assert_eq!(arg(super::lsmr_host_many(&a, &b2, 2, None, &with_x0)), "x0");
    let neg = LsmrOptions {
        damp: -1.0,
        ..LsmrOptions::default()
    };
    assert_eq!(arg(super::lsmr_host_many(&a, &b2, 2, None, &neg)), "damp");
    // the limits of one GPU run are the same checks
    assert_eq!(
        arg(super::lsmr_device::check_many_problem(50, 10, 50 * 70_000, 70_000, None, &ok).map(|_| vec![])),
        "k"
    );
}

#[test]
fn many_with_damp_and_scaling_is_each_columns_solve() {
    let (a, _) = random_tall(400, 40, 5);
    let b = super::fixtures::mixed_rhs(&a, 4, 1);
    for opts in [
        LsmrOptions {
            damp: 0.3,
            ..LsmrOptions::default()
        },
        LsmrOptions {
            scale_columns: true,
            maxiter: Some(9),
            ..LsmrOptions::default()
        },
    ] {
        let got = super::lsmr_host_many(&a, &b, 4, None, &opts).unwrap();
        for (j, r) in got.iter().enumerate() {
            assert_eq!(
                r,
                &lsmr_host(&a, &b[j * 400..(j + 1) * 400], &opts).unwrap(),
                "column {j}"
            );
        }
    }
}
