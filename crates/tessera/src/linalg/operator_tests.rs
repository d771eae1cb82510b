//! Tests of the host linear operators: every implementation of [`HostLinearOperator`] against a
//! plain dense product, for both products, several (alpha, beta), odd shapes and a NaN-filled
//! `y` with `beta == 0` (which must not be read); the `check` hooks.

use super::operator::{DenseHost, FnOperator, HostLinearOperator};
use crate::error::Error;
use crate::sparse::{CooHost, CsrHost, Duplicates};

/// A deterministic `rows x cols` matrix with about a third zeros, asymmetric values, and an
/// empty row and column when the shape allows.
fn dense_matrix(rows: usize, cols: usize) -> Vec<f64> {
    let mut a = vec![0.0; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            let k = (r * 7 + c * 13 + r * c) % 11;
            if k % 3 != 0 && r != 1 && c != 2 {
                a[r * cols + c] = (k as f64 - 5.0) / 4.0 + 0.125 * r as f64;
            }
        }
    }
    a
}

fn vector(len: usize, salt: usize) -> Vec<f64> {
    (0..len).map(|i| ((i * 5 + salt) % 9) as f64 / 3.0 - 1.25).collect()
}

/// `alpha * A x + beta * y` (or with `A^T`) from the fields of the dense matrix `a` (not its
/// trait implementation): the oracle.
fn dense_product(a: &DenseHost, transposed: bool, alpha: f64, x: &[f64], beta: f64, y: &[f64]) -> Vec<f64> {
    let (rows, cols) = (a.rows, a.cols);
    let (out_len, in_len) = if transposed { (cols, rows) } else { (rows, cols) };
    (0..out_len)
        .map(|i| {
            let dot: f64 = (0..in_len)
                .map(|j| {
                    let e = if transposed {
                        a.data[j * cols + i]
                    } else {
                        a.data[i * cols + j]
                    };
                    e * x[j]
                })
                .sum();
            if beta == 0.0 {
                alpha * dot
            } else {
                alpha * dot + beta * y[i]
            }
        })
        .collect()
}

/// Checks `op` against the dense oracle for both products and several (alpha, beta).
fn check_against_dense(op: &dyn HostLinearOperator, a: &[f64], rows: usize, cols: usize) {
    assert_eq!(op.shape(), (rows, cols));
    let a = DenseHost::new(rows, cols, a.to_vec()).unwrap();
    for (alpha, beta) in [(1.0, 0.0), (-0.5, 0.0), (1.0, 1.0), (2.0, -0.75), (0.0, 3.0)] {
        for transposed in [false, true] {
            let (out_len, in_len) = if transposed { (cols, rows) } else { (rows, cols) };
            let x = vector(in_len, 3);
            // beta == 0: y is NaN and must be overwritten, not read.
            let y0 = if beta == 0.0 {
                vec![f64::NAN; out_len]
            } else {
                vector(out_len, 7)
            };
            let want = dense_product(&a, transposed, alpha, &x, beta, &y0);
            let mut y = y0.clone();
            if transposed {
                op.apply_transposed(alpha, &x, beta, &mut y);
            } else {
                op.apply(alpha, &x, beta, &mut y);
            }
            for (i, (got, want)) in y.iter().zip(&want).enumerate() {
                assert!(
                    (got - want).abs() <= 1e-13 * (1.0 + want.abs()),
                    "{rows} x {cols} transposed {transposed} alpha {alpha} beta {beta}: y[{i}] = {got}, want {want}"
                );
            }
        }
    }
}

const SHAPES: [(usize, usize); 6] = [(1, 1), (5, 3), (3, 5), (17, 9), (8, 31), (0, 4)];

#[test]
fn csr_products_match_the_dense_product() {
    for (rows, cols) in SHAPES {
        let a = dense_matrix(rows, cols);
        check_against_dense(&CsrHost::<f64, i32>::from_dense(rows, cols, &a), &a, rows, cols);
        check_against_dense(&CsrHost::<f64, i64>::from_dense(rows, cols, &a), &a, rows, cols);
    }
}

#[test]
fn csr_of_f32_values_converts_each_value_exactly() {
    // Values exact in f32, so the f32 matrix is the same matrix.
    let (rows, cols) = (17, 9);
    let a = dense_matrix(rows, cols);
    let csr = CsrHost::<f32, i32>::from_dense(rows, cols, &a);
    check_against_dense(&csr, &a, rows, cols);
}

#[test]
fn unsorted_csr_with_duplicates_sums_them() {
    // Row 0 holds column 1 twice (1 + 2) and column 0 after it; the products see A = [3 4; 0 5]
    // padded by a third column of zeros.
    let coo = CooHost::<f64, i32> {
        rows: 2,
        cols: 3,
        row_indices: vec![0, 0, 0, 1],
        col_indices: vec![1, 0, 1, 1],
        values: vec![1.0, 4.0, 2.0, 5.0],
    };
    let csr = CsrHost::from_coo(coo, Duplicates::Sum).unwrap();
    let a = [4.0, 3.0, 0.0, 0.0, 5.0, 0.0];
    check_against_dense(&csr, &a, 2, 3);
}

#[test]
fn dense_products_match_the_dense_product() {
    for (rows, cols) in SHAPES {
        let a = dense_matrix(rows, cols);
        let op = DenseHost::new(rows, cols, a.clone()).unwrap();
        check_against_dense(&op, &a, rows, cols);
    }
}

#[test]
fn dense_and_csr_products_are_bitwise_equal() {
    // Both sum in the same order (zeros add nothing), which the LSMR fixture tests rely on.
    let (rows, cols) = (17, 9);
    let a = dense_matrix(rows, cols);
    let dense = DenseHost::new(rows, cols, a.clone()).unwrap();
    let csr = CsrHost::<f64, i32>::from_dense(rows, cols, &a);
    let x = vector(cols, 1);
    let (mut y1, mut y2) = (vector(rows, 2), vector(rows, 2));
    dense.apply(1.5, &x, -0.25, &mut y1);
    csr.apply(1.5, &x, -0.25, &mut y2);
    assert_eq!(y1, y2);
    let u = vector(rows, 4);
    let (mut v1, mut v2) = (vec![f64::NAN; cols], vec![f64::NAN; cols]);
    dense.apply_transposed(1.0, &u, 0.0, &mut v1);
    csr.apply_transposed(1.0, &u, 0.0, &mut v2);
    assert_eq!(v1, v2);
}

#[test]
fn fn_operator_calls_its_closures() {
    let (rows, cols) = (8, 31);
    let a = dense_matrix(rows, cols);
    let inner = DenseHost::new(rows, cols, a.clone()).unwrap();
    let op = FnOperator::new(
        rows,
        cols,
        |alpha, x: &[f64], beta, y: &mut [f64]| inner.apply(alpha, x, beta, y),
        |alpha, x: &[f64], beta, y: &mut [f64]| inner.apply_transposed(alpha, x, beta, y),
    );
    check_against_dense(&op, &a, rows, cols);
    assert!(op.check().is_ok());
    assert!(format!("{op:?}").contains("rows: 8"));
}

#[test]
fn dense_host_checks_its_length() {
    match DenseHost::new(3, 4, vec![0.0; 11]) {
        Err(Error::InvalidArgument { arg: "data", rule }) => assert!(rule.contains("needs 12"), "{rule}"),
        other => panic!("expected an error on data, got {other:?}"),
    }
    let edited = DenseHost {
        rows: 2,
        cols: 2,
        data: vec![1.0; 3],
    };
    assert!(matches!(
        edited.check(),
        Err(Error::InvalidArgument { arg: "data", .. })
    ));
    let huge = DenseHost {
        rows: usize::MAX,
        cols: 2,
        data: vec![],
    };
    assert!(matches!(huge.check(), Err(Error::InvalidArgument { arg: "rows", .. })));
}

#[test]
fn csr_check_is_csr_validate() {
    let mut a = CsrHost::<f64, i32>::from_dense(3, 3, &dense_matrix(3, 3));
    assert!(HostLinearOperator::check(&a).is_ok());
    a.indices[0] = 7; // out of range: the products would index out of bounds
    assert!(HostLinearOperator::check(&a).is_err());
}

#[test]
#[should_panic(expected = "x has 2 elements, expected 3")]
fn a_wrong_length_is_a_caller_bug_with_a_message() {
    let op = DenseHost::new(2, 3, vec![1.0; 6]).unwrap();
    let mut y = vec![0.0; 2];
    op.apply(1.0, &[1.0, 2.0], 0.0, &mut y);
}
