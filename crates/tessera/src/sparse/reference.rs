//! The f64 CPU oracles for sparse products, written to be obviously right rather than fast:
//!
//! ```text
//! spmv             y = alpha * A   * x + beta * y
//! spmv_transposed  y = alpha * A^T * x + beta * y      (A^T is never formed)
//! spmm             C = alpha * A   * B + beta * C      (B: cols x n, C: rows x n, dense)
//! spmv_bsr         spmv for a BSR matrix, block by block
//! spmm_bsr         spmm for a BSR matrix, block by block
//! ```
//!
//! (The CSR -> BSR -> Blocked-ELL reference conversions are [`BsrHost::from_csr`] and
//! [`BellHost::from_bsr`](super::BellHost::from_bsr).)
//!
//! Products accumulate in f64 from the stored values (converted exactly from `T`). As in BLAS,
//! `beta == 0` means the old `y` / `C` is not read, so NaN there is overwritten rather than
//! propagated. Every entry is visited once: O(nnz) for SpMV, O(nnz * n) for SpMM. Rows run in
//! parallel with rayon (results do not depend on the thread count: each output element is
//! summed in stored order by one thread); the transposed product scatters on one thread.
//!
//! These are harness code: mismatched slice lengths are caller bugs and panic with a message.

use rayon::prelude::*;

use super::{BsrHost, CsrHost, DenseLayout, SparseIndex};
use crate::dtype::Element;

/// `alpha * product + beta * old`, not reading `old` when `beta == 0` (BLAS semantics).
fn blend(alpha: f64, product: f64, beta: f64, old: f64) -> f64 {
    if beta == 0.0 {
        alpha * product
    } else {
        alpha * product + beta * old
    }
}

/// The dot product of row `r` of `a` with `x`, in f64.
fn row_dot<T: Element, I: SparseIndex>(a: &CsrHost<T, I>, r: usize, x: &[f64]) -> f64 {
    let (cols, values) = a.row(r);
    cols.iter()
        .zip(values)
        .map(|(&c, &v)| v.to_f64() * x[c.to_usize()])
        .sum()
}

/// `y = alpha * A x + beta * y`.
///
/// # Panics
/// If `x.len() != a.cols` or `y.len() != a.rows`.
pub fn spmv<T: Element, I: SparseIndex>(a: &CsrHost<T, I>, alpha: f64, x: &[f64], beta: f64, y: &mut [f64]) {
    assert_eq!(
        x.len(),
        a.cols,
        "spmv: x has {} elements, A has {} columns",
        x.len(),
        a.cols
    );
    assert_eq!(
        y.len(),
        a.rows,
        "spmv: y has {} elements, A has {} rows",
        y.len(),
        a.rows
    );
    y.par_iter_mut()
        .enumerate()
        .for_each(|(r, yr)| *yr = blend(alpha, row_dot(a, r, x), beta, *yr));
}

/// `y = alpha * A^T x + beta * y`, scattering each row of `A` into `y` (A^T is not built).
///
/// # Panics
/// If `x.len() != a.rows` or `y.len() != a.cols`.
pub fn spmv_transposed<T: Element, I: SparseIndex>(a: &CsrHost<T, I>, alpha: f64, x: &[f64], beta: f64, y: &mut [f64]) {
    assert_eq!(
        x.len(),
        a.rows,
        "spmv_transposed: x has {} elements, A has {} rows",
        x.len(),
        a.rows
    );
    assert_eq!(
        y.len(),
        a.cols,
        "spmv_transposed: y has {} elements, A has {} columns",
        y.len(),
        a.cols
    );
    let mut product = vec![0.0; a.cols];
    for (r, &xr) in x.iter().enumerate() {
        let (cols, values) = a.row(r);
        for (&c, &v) in cols.iter().zip(values) {
            product[c.to_usize()] += v.to_f64() * xr;
        }
    }
    for (yc, &pc) in y.iter_mut().zip(&product) {
        *yc = blend(alpha, pc, beta, *yc);
    }
}

/// `C = alpha * A B + beta * C` with dense `B` (`a.cols x n`, layout `b_layout`) and dense `C`
/// (`a.rows x n`, layout `c_layout`), both without padding: the leading dimension is `n` for
/// row-major and the number of rows (`a.cols` for B, `a.rows` for C) for column-major.
///
/// # Panics
/// If `b.len() != a.cols * n` or `c.len() != a.rows * n`.
#[allow(clippy::too_many_arguments)] // the BLAS argument list, one name per operand
pub fn spmm<T: Element, I: SparseIndex>(
    a: &CsrHost<T, I>,
    alpha: f64,
    b: &[f64],
    n: usize,
    b_layout: DenseLayout,
    beta: f64,
    c: &mut [f64],
    c_layout: DenseLayout,
) {
    assert_eq!(
        b.len(),
        a.cols * n,
        "spmm: B has {} elements, a {} x {n} B needs {}",
        b.len(),
        a.cols,
        a.cols * n
    );
    assert_eq!(
        c.len(),
        a.rows * n,
        "spmm: C has {} elements, a {} x {n} C needs {}",
        c.len(),
        a.rows,
        a.rows * n
    );
    // the product A B, row-major, one row per task
    let mut product = vec![0.0; a.rows * n];
    product.par_chunks_mut(n.max(1)).enumerate().for_each(|(r, out)| {
        let (cols, values) = a.row(r);
        for (j, out_j) in out.iter_mut().enumerate() {
            *out_j = cols
                .iter()
                .zip(values)
                .map(|(&k, &v)| v.to_f64() * b[b_layout.offset(k.to_usize(), j, a.cols, n)])
                .sum();
        }
    });
    for r in 0..a.rows {
        for j in 0..n {
            let at = c_layout.offset(r, j, a.rows, n);
            c[at] = blend(alpha, product[r * n + j], beta, c[at]);
        }
    }
}

/// `y = alpha * A x + beta * y` for a BSR matrix, block by block (padding entries, zero by
/// the format's rules, are skipped: `x` has `a.cols` elements and `y` `a.rows`).
///
/// # Panics
/// If `x.len() != a.cols` or `y.len() != a.rows`.
pub fn spmv_bsr<T: Element, I: SparseIndex>(a: &BsrHost<T, I>, alpha: f64, x: &[f64], beta: f64, y: &mut [f64]) {
    assert_eq!(
        x.len(),
        a.cols,
        "spmv_bsr: x has {} elements, A has {} columns",
        x.len(),
        a.cols
    );
    assert_eq!(
        y.len(),
        a.rows,
        "spmv_bsr: y has {} elements, A has {} rows",
        y.len(),
        a.rows
    );
    let b = a.block;
    y.par_iter_mut().enumerate().for_each(|(r, yr)| {
        let (br, i) = (r / b, r % b);
        let mut sum = 0.0;
        for k in a.block_range(br) {
            let c0 = a.block_indices[k].to_usize() * b;
            for j in 0..b.min(a.cols - c0) {
                sum += a.values[k * b * b + i * b + j].to_f64() * x[c0 + j];
            }
        }
        *yr = blend(alpha, sum, beta, *yr);
    });
}

/// `C = alpha * A B + beta * C` for a BSR matrix, B (`a.cols x n`) and C (`a.rows x n`) dense,
/// packed in their layouts (as [`spmm`]).
///
/// # Panics
/// If `b.len() != a.cols * n` or `c.len() != a.rows * n`.
#[allow(clippy::too_many_arguments)] // the BLAS argument list, one name per operand
pub fn spmm_bsr<T: Element, I: SparseIndex>(
    a: &BsrHost<T, I>,
    alpha: f64,
    b: &[f64],
    n: usize,
    b_layout: DenseLayout,
    beta: f64,
    c: &mut [f64],
    c_layout: DenseLayout,
) {
    assert_eq!(
        b.len(),
        a.cols * n,
        "spmm_bsr: B has {} elements, needs {} x {n}",
        b.len(),
        a.cols
    );
    assert_eq!(
        c.len(),
        a.rows * n,
        "spmm_bsr: C has {} elements, needs {} x {n}",
        c.len(),
        a.rows
    );
    let bs = a.block;
    let mut product = vec![0.0; a.rows * n];
    product.par_chunks_mut(n.max(1)).enumerate().for_each(|(r, out)| {
        let (br, i) = (r / bs, r % bs);
        for k in a.block_range(br) {
            let c0 = a.block_indices[k].to_usize() * bs;
            for jj in 0..bs.min(a.cols - c0) {
                let v = a.values[k * bs * bs + i * bs + jj].to_f64();
                for (j, out_j) in out.iter_mut().enumerate() {
                    *out_j += v * b[b_layout.offset(c0 + jj, j, a.cols, n)];
                }
            }
        }
    });
    for r in 0..a.rows {
        for j in 0..n {
            let at = c_layout.offset(r, j, a.rows, n);
            c[at] = blend(alpha, product[r * n + j], beta, c[at]);
        }
    }
}
