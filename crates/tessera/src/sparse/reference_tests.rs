//! Tests of the f64 sparse references against dense products of `to_dense_f64`, on random
//! matrices of every class and degenerate shape (1 x n, n x 1, no entries), and of SpMM in
//! both layouts against SpMV column by column.

use super::generate::{generate, random_vector, MatrixClass};
use super::generate_tests::all_classes;
use super::reference::{spmm, spmv, spmv_transposed};
use super::*;

const SEED: u64 = 0x0005_bead;

const SHAPES: [(usize, usize); 7] = [(1, 1), (1, 23), (23, 1), (17, 29), (64, 31), (0, 5), (5, 0)];

/// `alpha * dense(a) x + beta * y` (or with `a` transposed), straight from the definition.
fn dense_spmv(a: &CsrHost<f64, i32>, transposed: bool, alpha: f64, x: &[f64], beta: f64, y: &[f64]) -> Vec<f64> {
    let dense = a.to_dense_f64();
    let (out_len, in_len) = if transposed { (a.cols, a.rows) } else { (a.rows, a.cols) };
    (0..out_len)
        .map(|i| {
            let dot: f64 = (0..in_len)
                .map(|k| {
                    let entry = if transposed {
                        dense[k * a.cols + i]
                    } else {
                        dense[i * a.cols + k]
                    };
                    entry * x[k]
                })
                .sum();
            alpha * dot + if beta == 0.0 { 0.0 } else { beta * y[i] }
        })
        .collect()
}

fn assert_close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-12 * (1.0 + w.abs()), "{what}: [{i}] {g} vs {w}");
    }
}

#[test]
fn spmv_matches_the_dense_product_for_every_class_and_shape() {
    for (k, class) in all_classes().into_iter().enumerate() {
        for (s, &(rows, cols)) in SHAPES.iter().enumerate() {
            let seed = SEED + (k * 100 + s) as u64;
            let a = generate::<f64, i32>(class, rows, cols, seed);
            let what = format!("{} {rows}x{cols} seed {seed}", class.name());
            for (alpha, beta) in [(1.0, 0.0), (-0.5, 2.0), (0.0, 1.0)] {
                let x = random_vector(cols, seed + 1);
                let y0 = random_vector(rows, seed + 2);
                let mut y = y0.clone();
                spmv(&a, alpha, &x, beta, &mut y);
                assert_close(&y, &dense_spmv(&a, false, alpha, &x, beta, &y0), &what);

                let xt = random_vector(rows, seed + 3);
                let yt0 = random_vector(cols, seed + 4);
                let mut yt = yt0.clone();
                spmv_transposed(&a, alpha, &xt, beta, &mut yt);
                assert_close(&yt, &dense_spmv(&a, true, alpha, &xt, beta, &yt0), &what);
            }
        }
    }
}

#[test]
fn beta_zero_overwrites_nan() {
    let a = generate::<f64, i32>(MatrixClass::Uniform { per_row: 3 }, 9, 7, SEED);
    let x = random_vector(7, SEED);
    let mut y = vec![f64::NAN; 9];
    spmv(&a, 1.0, &x, 0.0, &mut y);
    assert!(y.iter().all(|v| v.is_finite()));
    let mut yt = vec![f64::NAN; 7];
    spmv_transposed(&a, 1.0, &random_vector(9, SEED), 0.0, &mut yt);
    assert!(yt.iter().all(|v| v.is_finite()));
    let mut c = vec![f64::NAN; 9 * 2];
    spmm(
        &a,
        1.0,
        &random_vector(7 * 2, SEED),
        2,
        DenseLayout::RowMajor,
        0.0,
        &mut c,
        DenseLayout::ColMajor,
    );
    assert!(c.iter().all(|v| v.is_finite()));
    // with beta != 0, NaN propagates
    let mut y = vec![f64::NAN; 9];
    spmv(&a, 1.0, &x, 1.0, &mut y);
    assert!(y.iter().all(|v| v.is_nan()));
}

#[test]
fn transposed_spmv_equals_spmv_of_the_transpose() {
    let a = generate::<f32, i64>(
        MatrixClass::PowerLaw {
            mean: 6.0,
            exponent: 1.7,
        },
        200,
        90,
        SEED,
    );
    let x = random_vector(200, SEED);
    let (mut y1, mut y2) = (random_vector(90, SEED + 1), random_vector(90, SEED + 1));
    spmv_transposed(&a, 0.75, &x, -1.25, &mut y1);
    spmv(&a.transpose(), 0.75, &x, -1.25, &mut y2);
    assert_close(&y1, &y2, "A^T x");
}

#[test]
fn spmm_in_every_layout_matches_spmv_per_column() {
    let layouts = [DenseLayout::RowMajor, DenseLayout::ColMajor];
    for (k, class) in all_classes().into_iter().enumerate() {
        for &(rows, cols) in &SHAPES {
            for n in [1, 3, 8] {
                let seed = SEED + k as u64;
                let a = generate::<f64, i32>(class, rows, cols, seed);
                let (alpha, beta) = (1.5, -0.25);
                // B and C as column-major columns; each layout is a relabelling of them
                let b_cols: Vec<Vec<f64>> = (0..n).map(|j| random_vector(cols, seed + 10 + j as u64)).collect();
                let c_cols: Vec<Vec<f64>> = (0..n).map(|j| random_vector(rows, seed + 20 + j as u64)).collect();
                let want: Vec<Vec<f64>> = (0..n)
                    .map(|j| {
                        let mut y = c_cols[j].clone();
                        spmv(&a, alpha, &b_cols[j], beta, &mut y);
                        y
                    })
                    .collect();
                for b_layout in layouts {
                    for c_layout in layouts {
                        let mut b = vec![0.0; cols * n];
                        let mut c = vec![0.0; rows * n];
                        for j in 0..n {
                            for i in 0..cols {
                                b[b_layout.offset(i, j, cols, n)] = b_cols[j][i];
                            }
                            for i in 0..rows {
                                c[c_layout.offset(i, j, rows, n)] = c_cols[j][i];
                            }
                        }
                        spmm(&a, alpha, &b, n, b_layout, beta, &mut c, c_layout);
                        for j in 0..n {
                            let got: Vec<f64> = (0..rows).map(|i| c[c_layout.offset(i, j, rows, n)]).collect();
                            let what = format!("{} {rows}x{cols} n {n} {b_layout:?} {c_layout:?}", class.name());
                            assert_close(&got, &want[j], &what);
                        }
                    }
                }
            }
        }
    }
}
