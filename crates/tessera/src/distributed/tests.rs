//! CPU tests of the distributed module: the in-process collective, row partitioning, the
//! distributed host LSMR against `lsmr_host` over 1 to 4 ranks (threads), the collective
//! validation, and a communicator without NCCL.
//!
//! Tolerance of the distributed solves: with one rank the host solver is bit for bit
//! `lsmr_host` (same products, same sums). With 2 to 4 ranks the products `A^T u` and the norm
//! `||u||^2` are summed per block and then over the ranks, so the iterates differ in the last
//! bits, and LSMR carries such differences on. On these well-conditioned random systems, which
//! stop by `atol`/`btol` (or `maxiter`) away from a threshold, the distributed solve must give
//! the same `istop` and `itn`, and:
//!
//! * `x` and `||x||` within [`X_TOL`] = 1e-8 relative (measured: at most 2e-9);
//! * `normr` within [`RES_TOL`] = 1e-10 of `||b||` and `normar` within it of `norma * ||b||`
//!   (the scales they are measured against, `||r|| <= ||b||`; relative to themselves both are
//!   rounding noise at a tight stop, e.g. `normar` of a consistent wide system: measured up to
//!   5e-5 of itself, 1e-15 of `norma * ||b||`);
//! * `norma` and `conda` within [`EST_TOL`] = 1e-2 relative: they are running estimates built
//!   from every `alpha` and `beta`, which after the Lanczos vectors lose orthogonality (tens of
//!   iterations here) carry rounding differences of 1e-6 to 3e-3 (measured at most 3.2e-3) while
//!   `x` is settled.

use std::time::Duration;

use super::collective::{Collective, LocalGroup};
use super::communicator::check_rank;
use super::lsmr::{lsmr_distributed_host, lsmr_host_in_threads};
use super::operator::HostDistributedOperator;
use super::partition::{row_block, RowPartition};
use crate::error::Error;
use crate::linalg::{lsmr_host, HostLinearOperator, LsmrOptions, LsmrResult};
use crate::sparse::generate::{generate, random_vector, MatrixClass};
use crate::sparse::CsrHost;

/// Budgets of 2 to 4 ranks against `lsmr_host` (module docs).
const X_TOL: f64 = 1e-8;
const RES_TOL: f64 = 1e-10;
const EST_TOL: f64 = 1e-2;

/// Runs `f(rank, member)` on one thread per member of a fresh group of `size`, returning the
/// results in rank order.
fn on_ranks<R: Send>(size: usize, f: impl Fn(usize, &super::LocalCollective) -> R + Sync) -> Vec<R> {
    let group = LocalGroup::with_timeout(size, Duration::from_secs(20)).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = group
            .into_iter()
            .enumerate()
            .map(|(r, c)| {
                let f = &f;
                s.spawn(move || f(r, &c))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn local_group_sums_in_rank_order_and_gives_every_rank_the_same_bits() {
    // values chosen so that the order of the sum matters in f64
    let contribution = |r: usize| vec![[1e16, 1.0, -1e16, 3.0][r], r as f64 * 0.1, -0.0];
    let got = on_ranks(4, |r, c| {
        assert_eq!((c.rank(), c.size()), (r, 4));
        let mut v = contribution(r);
        c.all_reduce_sum_host(&mut v).unwrap();
        v
    });
    let mut want = contribution(0);
    for r in 1..4 {
        want.iter_mut().zip(contribution(r)).for_each(|(w, x)| *w += x);
    }
    for g in &got {
        let bits = |v: &[f64]| v.iter().map(|e| e.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(g), bits(&want));
    }
    // one rank: its own values, bit for bit (-0.0 stays -0.0)
    let one = on_ranks(1, |_, c| {
        let mut v = vec![-0.0, 1.5];
        c.all_reduce_sum_host(&mut v).unwrap();
        v
    });
    assert_eq!(one[0][0].to_bits(), (-0.0f64).to_bits());
}

#[test]
fn local_group_reports_mismatches_and_departures_instead_of_hanging() {
    assert!(matches!(
        LocalGroup::new(0),
        Err(Error::InvalidArgument { arg: "size", .. })
    ));
    // different lengths: an error on every rank
    let got = on_ranks(3, |r, c| c.all_reduce_sum_host(&mut vec![1.0; 2 + (r == 1) as usize]));
    for r in &got {
        assert!(matches!(r, Err(Error::InvalidArgument { arg: "values", .. })), "{r:?}");
    }
    // a rank that leaves: the others fail instead of waiting for it
    let got = on_ranks(3, |r, c| {
        if r == 2 {
            return Ok(());
        }
        c.all_reduce_sum_host(&mut [1.0])
    });
    assert!(got[0].is_err() && got[1].is_err() && got[2].is_ok(), "{got:?}");
}

#[test]
fn communicator_rank_checks_name_the_argument() {
    assert!(check_rank(0, 1).is_ok() && check_rank(3, 4).is_ok());
    assert!(matches!(
        check_rank(0, 0),
        Err(Error::InvalidArgument { arg: "size", .. })
    ));
    assert!(matches!(
        check_rank(4, 4),
        Err(Error::InvalidArgument { arg: "rank", .. })
    ));
    assert!(matches!(
        check_rank(0, i32::MAX as usize + 1),
        Err(Error::InvalidArgument { arg: "size", .. })
    ));
}

#[test]
fn a_unique_id_round_trips_through_its_bytes() {
    let bytes: [u8; 128] = std::array::from_fn(|i| (i * 37 + 11) as u8);
    assert_eq!(super::UniqueId::from_bytes(bytes).as_bytes(), bytes);
}

/// Without libnccl (this CI machine), asking for a unique id is an error that says NCCL is
/// missing, not a panic. Where NCCL is installed (and linked as `libnccl.so`), NCCL itself
/// answers instead: a unique id (it needs no GPU), whose bytes are not all zero.
#[test]
fn without_nccl_a_unique_id_is_an_error() {
    if let Ok(info) = crate::runtime::probe::nccl() {
        eprintln!("without_nccl_a_unique_id_is_an_error: NCCL {} is present", info.version);
        match super::unique_id() {
            Ok(id) => assert!(id.as_bytes().iter().any(|&b| b != 0)),
            Err(e) => eprintln!("ncclGetUniqueId failed here (no network?): {e}"),
        }
        return;
    }
    let e = super::unique_id().unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, Error::Unsupported(_)), "{e:?}");
    assert!(text.contains("NCCL") && text.contains("libnccl"), "{text}");
    // and the same again (the probe's answer is kept, nothing is retried into a panic)
    assert!(super::unique_id().is_err());
}

// ---------------------------------------------------------------------------------------------
// Partitioning

/// The cost of rows `0..r` under the partition rule: nonzeros + rows.
fn cost(offsets: &[usize], r: usize) -> usize {
    offsets[r] + r
}

#[test]
fn partition_by_nonzeros_follows_its_rule() {
    for (class, m, seed) in [
        (
            MatrixClass::PowerLaw {
                mean: 8.0,
                exponent: 1.5,
            },
            997,
            1,
        ),
        (
            MatrixClass::EmptyRows {
                fraction: 0.5,
                per_row: 5,
            },
            300,
            2,
        ),
        (MatrixClass::OneDenseRow { per_row: 2 }, 101, 3),
        (MatrixClass::Uniform { per_row: 3 }, 10, 4),
    ] {
        let a: CsrHost<f64, i32> = generate(class, m, 200, seed);
        let offsets: Vec<usize> = a.offsets.iter().map(|&o| o as usize).collect();
        let max_row = (0..m).map(|r| offsets[r + 1] - offsets[r] + 1).max().unwrap();
        let total = cost(&offsets, m);
        for parts in 1..=7 {
            let p = RowPartition::by_nonzeros(&a, parts).unwrap();
            let b = p.bounds();
            assert_eq!((p.parts(), b[0], b[parts], p.rows_total()), (parts, 0, m, m));
            assert!(b.windows(2).all(|w| w[0] <= w[1]), "{b:?}");
            for g in 1..parts {
                // the first row boundary where the running cost reaches g / parts of the total
                assert!(cost(&offsets, b[g]) * parts >= g * total, "{class:?} {parts}: {b:?}");
                assert!(b[g] == 0 || cost(&offsets, b[g] - 1) * parts < g * total, "{b:?}");
            }
            for g in 0..parts {
                let c = cost(&offsets, b[g + 1]) - cost(&offsets, b[g]);
                assert!(c <= total / parts + max_row, "block {g} costs {c} of {total}");
            }
        }
    }
}

#[test]
fn partition_edge_cases() {
    // more parts than rows: empty blocks, still tiling 0..m
    let p = RowPartition::from_offsets(&[0, 1, 2], 4).unwrap();
    assert_eq!(p.bounds(), &[0, 1, 1, 2, 2]);
    assert_eq!(p.rows(1).unwrap(), 1..1);
    // no rows at all
    assert_eq!(RowPartition::from_offsets(&[0], 3).unwrap().bounds(), &[0, 0, 0, 0]);
    // a heavy first row: it reaches the first two shares, so block 1 is empty and block 2
    // takes the light rows
    let p = RowPartition::from_offsets(&[0, 100, 101, 102], 3).unwrap();
    assert_eq!(p.bounds(), &[0, 1, 1, 3]);
    // errors
    assert!(matches!(
        RowPartition::from_offsets(&[0, 1], 0),
        Err(Error::InvalidArgument { arg: "parts", .. })
    ));
    assert!(matches!(
        RowPartition::from_offsets(&[1, 2], 2),
        Err(Error::InvalidArgument { arg: "offsets", .. })
    ));
    assert!(matches!(
        RowPartition::from_offsets(&[0, 3, 2], 2),
        Err(Error::InvalidArgument { arg: "offsets", .. })
    ));
    assert!(matches!(
        RowPartition::from_bounds(vec![0, 3, 2]),
        Err(Error::InvalidArgument { arg: "bounds", .. })
    ));
    assert!(matches!(
        RowPartition::from_bounds(vec![1, 3]),
        Err(Error::InvalidArgument { arg: "bounds", .. })
    ));
    assert!(matches!(
        RowPartition::from_bounds(vec![0]),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(p.rows(3), Err(Error::InvalidArgument { arg: "rank", .. })));
}

#[test]
fn row_blocks_stack_back_into_the_matrix() {
    let a: CsrHost<f64, i32> = generate(
        MatrixClass::EmptyRows {
            fraction: 0.3,
            per_row: 4,
        },
        157,
        41,
        7,
    );
    let x = random_vector(41, 8);
    let mut want = vec![0.0; 157];
    a.apply(1.0, &x, 0.0, &mut want);
    let p = RowPartition::by_nonzeros(&a, 5).unwrap();
    let mut got = Vec::new();
    for g in 0..5 {
        let block = row_block(&a, p.rows(g).unwrap()).unwrap();
        block.validate().unwrap();
        assert_eq!(block.cols, 41);
        let mut y = vec![0.0; block.rows];
        block.apply(1.0, &x, 0.0, &mut y);
        got.extend(y);
    }
    assert_eq!(got, want);
    assert!(row_block(&a, 5..200).is_err());
    #[allow(clippy::reversed_empty_ranges)]
    let reversed = 9..3;
    assert!(matches!(
        row_block(&a, reversed),
        Err(Error::InvalidArgument { arg: "rows", .. })
    ));
    // a block of an unsorted matrix says whether its own rows are sorted
    let mut u = CsrHost::<f64, i32> {
        rows: 2,
        cols: 3,
        offsets: vec![0, 2, 4],
        indices: vec![0, 2, 2, 1],
        values: vec![1.0; 4],
        sorted: false,
    };
    u.validate().unwrap();
    assert!(row_block(&u, 0..1).unwrap().sorted);
    assert!(!row_block(&u, 1..2).unwrap().sorted);
    u.sorted = true;
    assert!(u.validate().is_err());
}

// ---------------------------------------------------------------------------------------------
// Distributed LSMR on the host against lsmr_host

struct Problem {
    name: &'static str,
    a: CsrHost<f64, i32>,
    b: Vec<f64>,
    opts: LsmrOptions,
}

fn problems() -> Vec<Problem> {
    let tall: CsrHost<f64, i32> = generate(MatrixClass::TallLeastSquares { per_row: 6 }, 600, 90, 11);
    let square: CsrHost<f64, i32> = generate(MatrixClass::Uniform { per_row: 5 }, 150, 150, 12);
    let wide: CsrHost<f64, i32> = generate(MatrixClass::Uniform { per_row: 8 }, 70, 230, 13);
    let ragged: CsrHost<f64, i32> = generate(
        MatrixClass::PowerLaw {
            mean: 6.0,
            exponent: 2.0,
        },
        400,
        60,
        15,
    );
    let tol = LsmrOptions {
        atol: 1e-10,
        btol: 1e-10,
        ..LsmrOptions::default()
    };
    vec![
        Problem {
            name: "tall",
            b: random_vector(600, 21),
            a: tall.clone(),
            opts: tol.clone(),
        },
        Problem {
            name: "tall damp 0.7 x0",
            b: random_vector(600, 22),
            opts: LsmrOptions {
                damp: 0.7,
                x0: Some(random_vector(90, 23)),
                ..tol.clone()
            },
            a: tall,
        },
        Problem {
            name: "square",
            b: random_vector(150, 24),
            a: square.clone(),
            opts: LsmrOptions {
                maxiter: Some(40),
                ..tol.clone()
            },
        },
        Problem {
            name: "square damp 0.3 x0 default tol",
            b: random_vector(150, 25),
            opts: LsmrOptions {
                damp: 0.3,
                x0: Some(random_vector(150, 26)),
                ..LsmrOptions::default()
            },
            a: square,
        },
        Problem {
            name: "wide",
            b: random_vector(70, 27),
            a: wide.clone(),
            opts: tol.clone(),
        },
        Problem {
            name: "wide damp 0.1",
            b: random_vector(70, 28),
            opts: LsmrOptions {
                damp: 0.1,
                ..tol.clone()
            },
            a: wide,
        },
        Problem {
            name: "ragged rows",
            b: random_vector(400, 29),
            a: ragged,
            opts: tol,
        },
    ]
}

fn rel(a: f64, b: f64) -> f64 {
    if a == b {
        0.0
    } else {
        (a - b).abs() / a.abs().max(b.abs())
    }
}

fn rel_l2(x: &[f64], want: &[f64]) -> f64 {
    let d: f64 = x.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum();
    let w: f64 = want.iter().map(|e| e * e).sum();
    (d / w.max(f64::MIN_POSITIVE)).sqrt()
}

fn bits(r: &LsmrResult) -> Vec<u64> {
    let mut v: Vec<u64> = r.x.iter().map(|e| e.to_bits()).collect();
    v.extend([r.normr, r.normar, r.norma, r.conda, r.normx].map(f64::to_bits));
    v.extend([r.istop as u64, r.itn as u64]);
    v
}

/// The differences of `got` from `want`, each with its budget (module docs).
fn diffs(got: &LsmrResult, want: &LsmrResult, normb: f64) -> [(&'static str, f64, f64); 6] {
    let abs_over = |g: f64, w: f64, scale: f64| (g - w).abs() / scale.max(f64::MIN_POSITIVE);
    [
        ("x", rel_l2(&got.x, &want.x), X_TOL),
        ("normx", rel(got.normx, want.normx), X_TOL),
        ("normr", abs_over(got.normr, want.normr, normb), RES_TOL),
        ("normar", abs_over(got.normar, want.normar, want.norma * normb), RES_TOL),
        ("norma", rel(got.norma, want.norma), EST_TOL),
        ("conda", rel(got.conda, want.conda), EST_TOL),
    ]
}

/// The worst difference as a fraction of its budget (<= 1 passes).
fn worst(got: &LsmrResult, want: &LsmrResult, normb: f64) -> f64 {
    diffs(got, want, normb).iter().map(|d| d.1 / d.2).fold(0.0, f64::max)
}

#[test]
fn distributed_host_lsmr_matches_lsmr_host_over_1_to_4_ranks() {
    let mut failures = Vec::new();
    for p in problems() {
        let want = lsmr_host(&p.a, &p.b, &p.opts).unwrap();
        assert!(want.itn >= 5, "{}: too easy ({} iterations)", p.name, want.itn);
        for parts in 1..=4 {
            let partition = RowPartition::by_nonzeros(&p.a, parts).unwrap();
            let results = lsmr_host_in_threads(&p.a, &p.b, &partition, &p.opts).unwrap();
            assert_eq!(results.len(), parts);
            // every rank returns the same result, bit for bit
            for r in &results[1..] {
                assert_eq!(bits(r), bits(&results[0]), "{} G={parts}: ranks disagree", p.name);
            }
            let got = &results[0];
            if parts == 1 {
                assert_eq!(bits(got), bits(&want), "{} G=1: not bitwise lsmr_host", p.name);
            }
            if (got.istop, got.itn) != (want.istop, want.itn) {
                failures.push(format!(
                    "{} G={parts}: istop {} itn {}, lsmr_host {} {}",
                    p.name, got.istop, got.itn, want.istop, want.itn
                ));
            }
            let normb = p.b.iter().map(|e| e * e).sum::<f64>().sqrt();
            let err = worst(got, &want, normb);
            let each: Vec<String> = diffs(got, &want, normb)
                .iter()
                .map(|(w, d, _)| format!("{w} {d:.1e}"))
                .collect();
            eprintln!(
                "{:30} G={parts} istop {} itn {:3} diff {}",
                p.name,
                got.istop,
                got.itn,
                each.join(" ")
            );
            if err > 1.0 {
                failures.push(format!("{} G={parts}: {err:.1} times the budget", p.name));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn one_rank_is_bitwise_lsmr_host_on_the_scipy_fixtures() {
    for case in crate::linalg::fixtures::fixture_cases() {
        let want = lsmr_host(&case.csr, &case.b, &case.opts).unwrap();
        if case.opts.scale_columns {
            continue;
        }
        let partition = RowPartition::by_nonzeros(&case.csr, 1).unwrap();
        let got = lsmr_host_in_threads(&case.csr, &case.b, &partition, &case.opts).unwrap();
        assert_eq!(bits(&got[0]), bits(&want), "{}", case.name);
    }
}

#[test]
fn empty_blocks_take_part_without_changing_the_result() {
    let a: CsrHost<f64, i32> = generate(MatrixClass::Uniform { per_row: 2 }, 3, 2, 31);
    let b = random_vector(3, 32);
    let opts = LsmrOptions::default();
    let want = lsmr_host(&a, &b, &opts).unwrap();
    let partition = RowPartition::by_nonzeros(&a, 6).unwrap();
    assert!((0..6).any(|g| partition.rows(g).unwrap().is_empty()));
    let got = lsmr_host_in_threads(&a, &b, &partition, &opts).unwrap();
    assert_eq!((got[5].istop, got[5].itn), (want.istop, want.itn));
    let normb = b.iter().map(|e| e * e).sum::<f64>().sqrt();
    assert!(worst(&got[5], &want, normb) <= 1.0);
    // and the early exits: b = 0, and b = A x0
    let zero = lsmr_host_in_threads(&a, &[0.0; 3], &partition, &opts).unwrap();
    assert_eq!(bits(&zero[0]), bits(&lsmr_host(&a, &[0.0; 3], &opts).unwrap()));
}

#[test]
fn show_prints_on_rank_0_without_failing() {
    let a: CsrHost<f64, i32> = generate(MatrixClass::Uniform { per_row: 3 }, 60, 20, 41);
    let b = random_vector(60, 42);
    let opts = LsmrOptions {
        show: true,
        ..LsmrOptions::default()
    };
    let p = RowPartition::by_nonzeros(&a, 2).unwrap();
    let got = lsmr_host_in_threads(&a, &b, &p, &opts).unwrap();
    let want = lsmr_host(&a, &b, &LsmrOptions::default()).unwrap();
    assert_eq!((got[0].istop, got[0].itn), (want.istop, want.itn));
}

// ---------------------------------------------------------------------------------------------
// Validation: every rank fails alike, nobody hangs

/// Each rank solves its block of `a` with `b_of(rank)` and `opts_of(rank)`, over `bounds`.
fn solve_each(
    a: &CsrHost<f64, i32>,
    bounds: &[usize],
    b_of: impl Fn(usize) -> Vec<f64> + Sync,
    opts_of: impl Fn(usize) -> LsmrOptions + Sync,
) -> Vec<crate::error::Result<LsmrResult>> {
    let parts = bounds.len() - 1;
    on_ranks(parts, |r, c| {
        let rows = bounds[r]..bounds[r + 1];
        let block = row_block(a, rows.clone()).unwrap();
        let op = HostDistributedOperator::new(&block, rows, a.rows, c)?;
        lsmr_distributed_host(&op, &b_of(r), &opts_of(r))
    })
}

#[test]
fn bad_input_on_one_rank_is_an_error_on_every_rank() {
    let a: CsrHost<f64, i32> = generate(MatrixClass::Uniform { per_row: 3 }, 40, 12, 51);
    let b = random_vector(40, 52);
    let bounds = [0, 15, 28, 40];
    let part = |r: usize| b[bounds[r]..bounds[r + 1]].to_vec();
    let arg_of = |e: &Error| match e {
        Error::InvalidArgument { arg, .. } => *arg,
        Error::Unsupported(_) => "unsupported",
        _ => "other",
    };
    let check = |what: &str, got: Vec<crate::error::Result<LsmrResult>>, bad_rank: Option<usize>, arg: &str| {
        for (r, g) in got.iter().enumerate() {
            let e = g.as_ref().err().unwrap_or_else(|| panic!("{what}: rank {r} solved"));
            let want = if bad_rank.is_some_and(|b| b != r) { "rank" } else { arg };
            assert_eq!(arg_of(e), want, "{what}: rank {r}: {e}");
        }
    };
    // b of the wrong length on rank 1
    check(
        "short b",
        solve_each(
            &a,
            &bounds,
            |r| if r == 1 { vec![1.0; 3] } else { part(r) },
            |_| LsmrOptions::default(),
        ),
        Some(1),
        "b",
    );
    // NaN in b on rank 2
    check(
        "NaN b",
        solve_each(
            &a,
            &bounds,
            |r| {
                let mut p = part(r);
                if r == 2 {
                    p[4] = f64::NAN;
                }
                p
            },
            |_| LsmrOptions::default(),
        ),
        Some(2),
        "b",
    );
    // a negative damp on rank 0
    check(
        "negative damp",
        solve_each(&a, &bounds, part, |r| LsmrOptions {
            damp: if r == 0 { -1.0 } else { 0.0 },
            ..LsmrOptions::default()
        }),
        Some(0),
        "damp",
    );
    // options that differ between ranks (each valid)
    check(
        "different atol",
        solve_each(&a, &bounds, part, |r| LsmrOptions {
            atol: 1e-6 * (r + 1) as f64,
            ..LsmrOptions::default()
        }),
        None,
        "atol",
    );
    // x0 that differs between ranks
    check(
        "different x0",
        solve_each(&a, &bounds, part, |r| LsmrOptions {
            x0: Some(vec![r as f64; 12]),
            ..LsmrOptions::default()
        }),
        None,
        "x0",
    );
    // column scaling: not supported, on every rank
    check(
        "scale_columns",
        solve_each(&a, &bounds, part, |_| LsmrOptions {
            scale_columns: true,
            ..LsmrOptions::default()
        }),
        None,
        "unsupported",
    );
    // blocks that do not tile 0..m (a gap: rows 15..20 belong to nobody)
    let gappy = on_ranks(2, |r, c| {
        let rows = [0..15, 20..40][r].clone();
        let block = row_block(&a, rows.clone()).unwrap();
        let op = HostDistributedOperator::new(&block, rows.clone(), 40, c)?;
        lsmr_distributed_host(&op, &b[rows], &LsmrOptions::default())
    });
    check("gap", gappy, None, "rows");
}

#[test]
fn operator_and_threaded_solver_check_their_arguments() {
    let a: CsrHost<f64, i32> = generate(MatrixClass::Uniform { per_row: 3 }, 40, 12, 61);
    let group = LocalGroup::new(1).unwrap();
    let block = row_block(&a, 0..10).unwrap();
    // the block's row count must match its place, and the place must lie within 0..m
    assert!(matches!(
        HostDistributedOperator::new(&block, 0..11, 40, &group[0]),
        Err(Error::InvalidArgument { arg: "local", .. })
    ));
    assert!(matches!(
        HostDistributedOperator::new(&block, 35..45, 40, &group[0]),
        Err(Error::InvalidArgument { arg: "rows", .. })
    ));
    let op = HostDistributedOperator::new(&block, 0..10, 40, &group[0]).unwrap();
    assert_eq!(op.shape(), (40, 12));
    assert!(matches!(
        op.apply_local(&[0.0; 11], &mut [0.0; 10]),
        Err(Error::InvalidArgument { arg: "x", .. })
    ));
    assert!(matches!(
        op.apply_transposed(&[0.0; 9], &mut [0.0; 12]),
        Err(Error::InvalidArgument { arg: "u", .. })
    ));
    // the threaded solver: a partition of another matrix, a b of another length
    let b = random_vector(40, 62);
    let p = RowPartition::by_nonzeros(&a, 2).unwrap();
    let other = RowPartition::from_offsets(&[0, 1, 2], 2).unwrap();
    assert!(matches!(
        lsmr_host_in_threads(&a, &b, &other, &LsmrOptions::default()),
        Err(Error::InvalidArgument { arg: "partition", .. })
    ));
    assert!(matches!(
        lsmr_host_in_threads(&a, &b[..39], &p, &LsmrOptions::default()),
        Err(Error::InvalidArgument { arg: "b", .. })
    ));
}
