//! Linear operators on the host: the seam between iterative solvers and matrix storage.
//!
//! An iterative least-squares solver such as [LSMR](mod@super::lsmr) touches its matrix only
//! through two products, `y = alpha * A x + beta * y` and `y = alpha * A^T x + beta * y`
//! (SciPy's `matvec` / `rmatvec`). [`HostLinearOperator`] is that seam on the CPU, in f64.
//! It is implemented here for
//!
//! * [`CsrHost`] (any value type `T: Element`, any index type `I: SparseIndex`): `A x` as one
//!   dot product per row, `A^T x` by scattering each row into `y` (`A^T` is never formed).
//!   O(nnz) per product, no allocation.
//! * [`DenseHost`], a row-major dense matrix: O(rows * cols) per product, summed in the same
//!   order as the CSR products (row by row, columns in increasing order), so a dense matrix
//!   and its CSR form give bitwise equal results.
//! * [`FnOperator`], a pair of closures, for matrix-free operators.
//!
//! As in BLAS, `beta == 0` means the old `y` is not read (NaN there is overwritten, not
//! propagated).

use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::sparse::{CsrHost, SparseIndex};

/// A real `m x n` matrix `A` seen only through its products, in f64.
///
/// Implementors may assume the slice lengths below; passing other lengths is a caller bug and
/// the implementations in this module panic with a message saying which length was wrong.
/// Solvers check a user's vectors against [`shape`](Self::shape) before the first product and
/// call [`check`](Self::check) once, so user input never reaches these panics.
pub trait HostLinearOperator {
    /// `(m, n)`: the number of rows and of columns of `A`.
    fn shape(&self) -> (usize, usize);

    /// `y = alpha * A x + beta * y`, with `x.len() == n` and `y.len() == m`. With
    /// `beta == 0` the old `y` is not read.
    fn apply(&self, alpha: f64, x: &[f64], beta: f64, y: &mut [f64]);

    /// `y = alpha * A^T x + beta * y`, with `x.len() == m` and `y.len() == n`. With
    /// `beta == 0` the old `y` is not read.
    fn apply_transposed(&self, alpha: f64, x: &[f64], beta: f64, y: &mut [f64]);

    /// The Euclidean norm of each column of `A` (`n` values), for column scaling
    /// ([`LsmrOptions::scale_columns`](super::LsmrOptions::scale_columns)); `None` when the
    /// operator cannot give them (the default: a matrix-free operator).
    fn column_norms(&self) -> Option<Vec<f64>> {
        None
    }

    /// Checks the operator's own invariants (for storage with public fields that may have been
    /// edited by hand), so that the products cannot index out of bounds. Solvers call it once
    /// at their API boundary. The default accepts everything.
    fn check(&self) -> Result<()> {
        Ok(())
    }
}

/// Panics unless `x` and `y` have the lengths a product of `what` with shape `(x_len, y_len)`
/// needs: a caller bug, never user input (see [`HostLinearOperator`]).
fn assert_lengths(what: &str, x: &[f64], x_len: usize, y: &[f64], y_len: usize) {
    assert_eq!(x.len(), x_len, "{what}: x has {} elements, expected {x_len}", x.len());
    assert_eq!(y.len(), y_len, "{what}: y has {} elements, expected {y_len}", y.len());
}

/// `y = beta * y`, writing zeros (not reading `y`) when `beta == 0`.
fn scale_or_clear(beta: f64, y: &mut [f64]) {
    if beta == 0.0 {
        y.fill(0.0);
    } else if beta != 1.0 {
        y.iter_mut().for_each(|v| *v *= beta);
    }
}

/// `alpha * product + beta * old`, not reading `old` when `beta == 0` (BLAS semantics).
fn blend(alpha: f64, product: f64, beta: f64, old: f64) -> f64 {
    if beta == 0.0 {
        alpha * product
    } else {
        alpha * product + beta * old
    }
}

impl<T: Element, I: SparseIndex> HostLinearOperator for CsrHost<T, I> {
    fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// One sequential dot product per row, in stored order, from 0.
    fn apply(&self, alpha: f64, x: &[f64], beta: f64, y: &mut [f64]) {
        assert_lengths("CsrHost::apply", x, self.cols, y, self.rows);
        for (r, yr) in y.iter_mut().enumerate() {
            let (cols, values) = self.row(r);
            let dot: f64 = cols
                .iter()
                .zip(values)
                .fold(0.0, |acc, (&c, &v)| acc + v.to_f64() * x[c.to_usize()]);
            *yr = blend(alpha, dot, beta, *yr);
        }
    }

    /// Scales `y` by `beta`, then adds `v * (alpha * x[r])` for every entry `(r, c, v)`, rows
    /// in order: `A^T` is never built.
    fn apply_transposed(&self, alpha: f64, x: &[f64], beta: f64, y: &mut [f64]) {
        assert_lengths("CsrHost::apply_transposed", x, self.rows, y, self.cols);
        scale_or_clear(beta, y);
        for (r, &xr) in x.iter().enumerate() {
            let axr = alpha * xr;
            let (cols, values) = self.row(r);
            for (&c, &v) in cols.iter().zip(values) {
                y[c.to_usize()] += v.to_f64() * axr;
            }
        }
    }

    /// [`CsrHost::validate`]: offsets and column indices in range, so products stay in bounds.
    fn check(&self) -> Result<()> {
        self.validate()
    }

    /// Summed in f64 from the stored values (duplicates count as stored).
    fn column_norms(&self) -> Option<Vec<f64>> {
        let mut sq = vec![0.0; self.cols];
        for (c, v) in self.indices.iter().zip(&self.values) {
            sq[c.to_usize()] += v.to_f64() * v.to_f64();
        }
        Some(sq.into_iter().map(f64::sqrt).collect())
    }
}

/// A dense `rows x cols` matrix in row-major order: element `(r, c)` is `data[r * cols + c]`.
#[derive(Clone, Debug, PartialEq)]
pub struct DenseHost {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f64>,
}

impl DenseHost {
    /// A dense matrix, checking `data.len() == rows * cols`.
    pub fn new(rows: usize, cols: usize, data: Vec<f64>) -> Result<Self> {
        let a = DenseHost { rows, cols, data };
        a.check_len()?;
        Ok(a)
    }

    fn check_len(&self) -> Result<()> {
        match self.rows.checked_mul(self.cols) {
            Some(len) if len == self.data.len() => Ok(()),
            Some(len) => Err(Error::invalid(
                "data",
                format!(
                    "has {} elements, a {} x {} matrix needs {len}",
                    self.data.len(),
                    self.rows,
                    self.cols
                ),
            )),
            None => Err(Error::invalid(
                "rows",
                format!("{} x {} overflows usize", self.rows, self.cols),
            )),
        }
    }

    /// Row `r` (panics if `r >= rows`).
    fn row(&self, r: usize) -> &[f64] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

impl HostLinearOperator for DenseHost {
    fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    fn apply(&self, alpha: f64, x: &[f64], beta: f64, y: &mut [f64]) {
        assert_lengths("DenseHost::apply", x, self.cols, y, self.rows);
        for (r, yr) in y.iter_mut().enumerate() {
            let dot = self.row(r).iter().zip(x).fold(0.0, |acc, (&a, &xc)| acc + a * xc);
            *yr = blend(alpha, dot, beta, *yr);
        }
    }

    fn apply_transposed(&self, alpha: f64, x: &[f64], beta: f64, y: &mut [f64]) {
        assert_lengths("DenseHost::apply_transposed", x, self.rows, y, self.cols);
        scale_or_clear(beta, y);
        for (r, &xr) in x.iter().enumerate() {
            let axr = alpha * xr;
            for (yc, &a) in y.iter_mut().zip(self.row(r)) {
                *yc += a * axr;
            }
        }
    }

    /// `data.len() == rows * cols`.
    fn check(&self) -> Result<()> {
        self.check_len()
    }

    fn column_norms(&self) -> Option<Vec<f64>> {
        let mut sq = vec![0.0; self.cols];
        for r in 0..self.rows {
            sq.iter_mut().zip(self.row(r)).for_each(|(s, a)| *s += a * a);
        }
        Some(sq.into_iter().map(f64::sqrt).collect())
    }
}

/// A matrix-free operator: a shape and two closures with the signatures of
/// [`HostLinearOperator::apply`] and [`HostLinearOperator::apply_transposed`]
/// (`(alpha, x, beta, y)`). The closures must honour `beta == 0` (not read `y`) themselves.
pub struct FnOperator<F, G>
where
    F: Fn(f64, &[f64], f64, &mut [f64]),
    G: Fn(f64, &[f64], f64, &mut [f64]),
{
    rows: usize,
    cols: usize,
    apply: F,
    apply_transposed: G,
    column_norms: Option<Vec<f64>>,
}

impl<F, G> FnOperator<F, G>
where
    F: Fn(f64, &[f64], f64, &mut [f64]),
    G: Fn(f64, &[f64], f64, &mut [f64]),
{
    /// An `rows x cols` operator with `y = alpha A x + beta y` computed by `apply` and
    /// `y = alpha A^T x + beta y` by `apply_transposed`.
    pub fn new(rows: usize, cols: usize, apply: F, apply_transposed: G) -> Self {
        FnOperator {
            rows,
            cols,
            apply,
            apply_transposed,
            column_norms: None,
        }
    }

    /// The operator with its column norms (for column scaling; checked by the solver).
    pub fn with_column_norms(mut self, norms: Vec<f64>) -> Self {
        self.column_norms = Some(norms);
        self
    }
}

impl<F, G> HostLinearOperator for FnOperator<F, G>
where
    F: Fn(f64, &[f64], f64, &mut [f64]),
    G: Fn(f64, &[f64], f64, &mut [f64]),
{
    fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    fn apply(&self, alpha: f64, x: &[f64], beta: f64, y: &mut [f64]) {
        assert_lengths("FnOperator::apply", x, self.cols, y, self.rows);
        (self.apply)(alpha, x, beta, y)
    }

    fn apply_transposed(&self, alpha: f64, x: &[f64], beta: f64, y: &mut [f64]) {
        assert_lengths("FnOperator::apply_transposed", x, self.rows, y, self.cols);
        (self.apply_transposed)(alpha, x, beta, y)
    }

    fn column_norms(&self) -> Option<Vec<f64>> {
        self.column_norms.clone()
    }
}

impl<F, G> std::fmt::Debug for FnOperator<F, G>
where
    F: Fn(f64, &[f64], f64, &mut [f64]),
    G: Fn(f64, &[f64], f64, &mut [f64]),
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FnOperator")
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish_non_exhaustive()
    }
}
