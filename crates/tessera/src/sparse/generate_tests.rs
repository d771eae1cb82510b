//! Tests of the random matrix generator: determinism, the structure each class promises, the
//! value range, and chunk seeding that does not depend on the matrix size or the threads.

use super::generate::*;
use super::*;
use crate::error::Error;

const SEED: u64 = 0x05ee_d0f5_a25e;

/// Every class with small parameters, for sweeps.
pub(super) fn all_classes() -> Vec<MatrixClass> {
    vec![
        MatrixClass::Uniform { per_row: 5 },
        MatrixClass::Banded { diagonals: 5 },
        MatrixClass::PowerLaw {
            mean: 4.0,
            exponent: 1.8,
        },
        MatrixClass::EmptyRows {
            fraction: 0.5,
            per_row: 3,
        },
        MatrixClass::OneDenseRow { per_row: 2 },
        MatrixClass::FewLongRows {
            long_rows: 1,
            long_len: 40,
            short_len: 2,
        },
        MatrixClass::TallLeastSquares { per_row: 3 },
    ]
}

/// Checks what every generated matrix promises: valid, sorted, values in range.
fn check_common(a: &CsrHost<f64, i32>) {
    a.validate().unwrap();
    assert!(a.sorted);
    for &v in &a.values {
        assert!((SMALLEST_MAGNITUDE..=1.0).contains(&v.abs()), "value {v}");
    }
}

#[test]
fn names_are_short_and_stable() {
    let names: Vec<String> = [
        MatrixClass::Uniform { per_row: 16 },
        MatrixClass::Banded { diagonals: 9 },
        MatrixClass::PowerLaw {
            mean: 20.0,
            exponent: 2.0,
        },
        MatrixClass::PowerLaw {
            mean: 20.0,
            exponent: 1.5,
        },
        MatrixClass::EmptyRows {
            fraction: 0.5,
            per_row: 16,
        },
        MatrixClass::OneDenseRow { per_row: 16 },
        MatrixClass::FewLongRows {
            long_rows: 4,
            long_len: 100_000,
            short_len: 8,
        },
        MatrixClass::TallLeastSquares { per_row: 12 },
    ]
    .iter()
    .map(MatrixClass::name)
    .collect();
    assert_eq!(
        names,
        [
            "uniform16",
            "banded9",
            "powerlaw20",
            "powerlaw20a1.5",
            "emptyrows50_16",
            "denserow16",
            "longrows4x100000_8",
            "tallls12"
        ]
    );
}

#[test]
fn the_same_seed_gives_the_same_matrix() {
    for class in all_classes() {
        let a = generate::<f64, i32>(class, 300, 200, SEED);
        check_common(&a);
        assert_eq!(a, generate::<f64, i32>(class, 300, 200, SEED), "{}", class.name());
        assert_ne!(a, generate::<f64, i32>(class, 300, 200, SEED + 1), "{}", class.name());
    }
}

#[test]
fn rows_do_not_depend_on_the_matrix_height_or_threads() {
    // 70000 rows run chunks on rayon; its first chunk equals a one-chunk matrix
    let class = MatrixClass::Uniform { per_row: 3 };
    let tall = generate::<f32, i64>(class, 70_000, 50, SEED);
    let short = generate::<f32, i64>(class, CHUNK_ROWS, 50, SEED);
    let prefix = short.nnz();
    assert_eq!(&tall.offsets[..=CHUNK_ROWS], &short.offsets[..]);
    assert_eq!(&tall.indices[..prefix], &short.indices[..]);
    assert_eq!(&tall.values[..prefix], &short.values[..]);
}

#[test]
fn uniform_rows_have_exactly_per_row_entries() {
    for (per_row, cols) in [(5, 100), (60, 100), (100, 100), (7, 3), (0, 10)] {
        let a = generate::<f64, i32>(MatrixClass::Uniform { per_row }, 50, cols, SEED);
        check_common(&a);
        for r in 0..a.rows {
            assert_eq!(a.row_len(r), per_row.min(cols), "per_row {per_row} cols {cols}");
        }
    }
}

#[test]
fn banded_stays_in_its_band_and_fills_it() {
    for diagonals in [1, 4, 9] {
        let (rows, cols) = (40, 30);
        let a = generate::<f64, i32>(MatrixClass::Banded { diagonals }, rows, cols, SEED);
        check_common(&a);
        for r in 0..rows {
            let lo = r as i64 - (diagonals as i64 - 1) / 2;
            let hi = r as i64 + diagonals as i64 / 2;
            let want: Vec<i32> = (lo.max(0)..=hi.min(cols as i64 - 1)).map(|c| c as i32).collect();
            assert_eq!(a.row(r).0, &want[..], "diagonals {diagonals} row {r}");
        }
    }
}

#[test]
fn power_law_rows_have_the_mean_and_a_heavy_tail() {
    let class = MatrixClass::PowerLaw {
        mean: 8.0,
        exponent: 2.5,
    };
    let a = generate::<f64, i32>(class, 20_000, 100_000, SEED);
    check_common(&a);
    let d = SparseDescriptor::of(&a);
    assert!((d.avg_row - 8.0).abs() < 0.5, "{d}");
    assert!(d.max_row > 10 * d.p95_row / 2, "{d}");
    // lengths are capped at the columns
    let capped = generate::<f64, i32>(class, 2000, 12, SEED);
    assert!((0..capped.rows).all(|r| capped.row_len(r) <= 12));
}

#[test]
fn empty_rows_are_about_the_fraction() {
    let a = generate::<f64, i32>(
        MatrixClass::EmptyRows {
            fraction: 0.3,
            per_row: 4,
        },
        10_000,
        64,
        SEED,
    );
    check_common(&a);
    let empty = (0..a.rows).filter(|&r| a.row_len(r) == 0).count();
    assert!((2700..3300).contains(&empty), "{empty} empty rows");
    assert!((0..a.rows).all(|r| [0, 4].contains(&a.row_len(r))));
}

#[test]
fn one_dense_row_and_few_long_rows() {
    let a = generate::<f64, i32>(MatrixClass::OneDenseRow { per_row: 3 }, 500, 1000, SEED);
    check_common(&a);
    let lens: Vec<usize> = (0..a.rows).map(|r| a.row_len(r)).collect();
    assert_eq!(lens.iter().filter(|&&n| n == 1000).count(), 1);
    assert_eq!(lens.iter().filter(|&&n| n == 3).count(), 499);

    let class = MatrixClass::FewLongRows {
        long_rows: 3,
        long_len: 700,
        short_len: 5,
    };
    let b = generate::<f64, i32>(class, 400, 1000, SEED);
    check_common(&b);
    let lens: Vec<usize> = (0..b.rows).map(|r| b.row_len(r)).collect();
    assert_eq!(lens.iter().filter(|&&n| n == 700).count(), 3);
    assert_eq!(lens.iter().filter(|&&n| n == 5).count(), 397);
    // more long rows than rows: every row is long
    let c = generate::<f64, i32>(class, 2, 1000, SEED);
    assert_eq!((c.row_len(0), c.row_len(1)), (700, 700));
}

#[test]
fn tall_least_squares_rows_are_clustered() {
    let per_row = 6;
    let a = generate::<f64, i32>(MatrixClass::TallLeastSquares { per_row }, 5000, 400, SEED);
    check_common(&a);
    for r in 0..a.rows {
        let cols = a.row(r).0;
        assert_eq!(cols.len(), per_row);
        assert!(
            ((cols[per_row - 1] - cols[0]) as usize) < 4 * per_row,
            "row {r}: {cols:?}"
        );
    }
    // the windows move: columns all over the matrix are used
    let used = a.transpose();
    assert!((0..used.rows).filter(|&c| used.row_len(c) > 0).count() > 390);
}

#[test]
fn degenerate_shapes() {
    for class in all_classes() {
        for (rows, cols) in [(0, 0), (0, 5), (5, 0), (1, 1), (1, 37), (37, 1)] {
            let a = generate::<f64, i32>(class, rows, cols, SEED);
            check_common(&a);
            assert_eq!((a.rows, a.cols), (rows, cols));
        }
    }
}

#[test]
fn invalid_classes_are_errors() {
    for (class, rows, needle) in [
        (
            MatrixClass::PowerLaw {
                mean: 4.0,
                exponent: 1.0,
            },
            10,
            "exponent 1 must be finite and > 1",
        ),
        (
            MatrixClass::PowerLaw {
                mean: -1.0,
                exponent: 2.0,
            },
            10,
            "mean -1 must be",
        ),
        (
            MatrixClass::EmptyRows {
                fraction: 1.5,
                per_row: 2,
            },
            10,
            "fraction 1.5",
        ),
    ] {
        match try_generate::<f32, i32>(class, rows, 10, SEED) {
            Err(Error::InvalidArgument { arg: "class", rule }) => assert!(rule.contains(needle), "{rule}"),
            other => panic!("expected an invalid class, got {other:?}"),
        }
    }
}

#[test]
fn random_vectors_are_seeded_and_in_range() {
    let x = random_vector(1000, SEED);
    assert_eq!(x, random_vector(1000, SEED));
    assert_ne!(x, random_vector(1000, SEED + 1));
    assert!(x.iter().all(|v| (-1.0..=1.0).contains(v)));
    assert!(x.iter().any(|&v| v < -0.5) && x.iter().any(|&v| v > 0.5));
}

/// `cargo test --release -p tessera --lib generate_large -- --ignored --nocapture`
#[test]
#[ignore = "timing of a 2M x 2M matrix; run by hand in release"]
fn generate_large_matrix_timing() {
    let start = std::time::Instant::now();
    let a = generate::<f32, i32>(MatrixClass::Uniform { per_row: 16 }, 2_000_000, 2_000_000, SEED);
    let generated = start.elapsed();
    let d = SparseDescriptor::of(&a);
    let described = start.elapsed() - generated;
    println!("generate {generated:?}, descriptor {described:?}: {d}");
    assert_eq!(a.nnz(), 32_000_000);
}
