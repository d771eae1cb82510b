//! The row-partitioned operator: each rank holds the block `A_i` of rows `r0..r1` of the
//! global `m x n` matrix `A` (and the same rows of `b` and `u`), and every rank holds all `n`
//! columns' vectors (`x`, `v`).
//!
//! * `u_i = A_i x`: a local product (no communication): [`apply_local`](HostDistributedOperator::apply_local).
//! * `A^T u = sum_i A_i^T u_i`: a local product, then one all-reduce of an `n`-vector:
//!   [`apply_transposed`](HostDistributedOperator::apply_transposed).
//! * `||u||^2 = sum_i ||u_i||^2`: a scalar all-reduce: [`norm_sq`](HostDistributedOperator::norm_sq).
//!
//! [`DistributedOperator`] is the device form (a [`LinearOperator`] on the block and a
//! [`Communicator`]); [`HostDistributedOperator`] the host form (a [`HostLinearOperator`] and
//! any [`Collective`]), which the CPU tests and the CPU twin of the solver use.

use std::ops::Range;

use super::collective::Collective;
use super::communicator::Communicator;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::linalg::{HostLinearOperator, LinearOperator};
use crate::runtime::DeviceBuffer;

/// The checks of a block's place: `rows` within `0..m` and as many rows as the block has.
fn check_block(block_rows: usize, rows: &Range<usize>, m: usize) -> Result<()> {
    if rows.start > rows.end || rows.end > m {
        return Err(Error::invalid(
            "rows",
            format!("{}..{} is not a range of the m = {m} rows of A", rows.start, rows.end),
        ));
    }
    if block_rows != rows.len() {
        return Err(Error::invalid(
            "local",
            format!(
                "has {block_rows} rows but its place {}..{} holds {}",
                rows.start,
                rows.end,
                rows.len()
            ),
        ));
    }
    Ok(())
}

/// One rank's block of a row-partitioned matrix on the host (module docs).
pub struct HostDistributedOperator<'a> {
    local: &'a dyn HostLinearOperator,
    rows: Range<usize>,
    m: usize,
    comm: &'a dyn Collective,
}

impl<'a> HostDistributedOperator<'a> {
    /// The block `local` (`rows.len() x n`) at rows `rows` of an `m x n` matrix, summed over
    /// the ranks of `comm`. Errors: `rows` not within `0..m`; `local` of another row count.
    /// (That the ranks' blocks tile `0..m` is checked at the start of a solve, collectively.)
    pub fn new(
        local: &'a dyn HostLinearOperator,
        rows: Range<usize>,
        m: usize,
        comm: &'a dyn Collective,
    ) -> Result<Self> {
        check_block(local.shape().0, &rows, m)?;
        Ok(HostDistributedOperator { local, rows, m, comm })
    }

    /// `(m, n)` of the global matrix.
    pub fn shape(&self) -> (usize, usize) {
        (self.m, self.local.shape().1)
    }

    /// This rank's rows of the global matrix.
    pub fn rows(&self) -> Range<usize> {
        self.rows.clone()
    }

    /// The local block `A_i`.
    pub fn local(&self) -> &dyn HostLinearOperator {
        self.local
    }

    /// The group the products are summed over.
    pub fn collective(&self) -> &dyn Collective {
        self.comm
    }

    /// `u_i = A_i x`: `x` has `n` elements, `u` this rank's `rows().len()`. Local. The block
    /// must be valid (its `check()`, which [`lsmr_distributed_host`](super::lsmr_distributed_host)
    /// makes first): the host products index `x` by the stored columns.
    pub fn apply_local(&self, x: &[f64], u: &mut [f64]) -> Result<()> {
        let (m_i, n) = self.local.shape();
        check_exact("x", x.len(), n)?;
        check_exact("u", u.len(), m_i)?;
        if m_i > 0 {
            self.local.apply(1.0, x, 0.0, u);
        }
        Ok(())
    }

    /// `y = A^T u = sum over ranks of A_i^T u_i` (`u` this rank's rows, `y` all `n`): the local
    /// product, then one all-reduce of `n` values; every rank gets the same `y`.
    pub fn apply_transposed(&self, u: &[f64], y: &mut [f64]) -> Result<()> {
        let (m_i, n) = self.local.shape();
        check_exact("u", u.len(), m_i)?;
        check_exact("y", y.len(), n)?;
        if m_i > 0 {
            self.local.apply_transposed(1.0, u, 0.0, y);
        } else {
            y.fill(0.0);
        }
        self.comm.all_reduce_sum_host(y)
    }

    /// `||u||^2 = sum over ranks of ||u_i||^2` (each a sequential sum of squares).
    pub fn norm_sq(&self, u: &[f64]) -> Result<f64> {
        check_exact("u", u.len(), self.rows.len())?;
        let mut s = [sum_sq(u)];
        self.comm.all_reduce_sum_host(&mut s)?;
        Ok(s[0])
    }
}

/// One rank's block of a row-partitioned matrix on its GPU (module docs): the block as any
/// device [`LinearOperator`] (for example [`sparse_operator`](crate::linalg::sparse_operator)
/// of the block's CSR, [`row_block`](super::row_block)) and the rank's [`Communicator`].
pub struct DistributedOperator<'a, T: Element> {
    local: Box<dyn LinearOperator<T> + 'a>,
    rows: Range<usize>,
    m: usize,
    comm: &'a Communicator,
}

impl<'a, T: Element> DistributedOperator<'a, T> {
    /// The block `local` (`rows.len() x n`, on `comm`'s device) at rows `rows` of an `m x n`
    /// matrix. Errors: `rows` not within `0..m`; `local` of another row count.
    pub fn new(
        local: Box<dyn LinearOperator<T> + 'a>,
        rows: Range<usize>,
        m: usize,
        comm: &'a Communicator,
    ) -> Result<Self> {
        check_block(local.shape().0, &rows, m)?;
        Ok(DistributedOperator { local, rows, m, comm })
    }

    /// `(m, n)` of the global matrix.
    pub fn shape(&self) -> (usize, usize) {
        (self.m, self.local.shape().1)
    }

    /// This rank's rows of the global matrix.
    pub fn rows(&self) -> Range<usize> {
        self.rows.clone()
    }

    /// The local block `A_i`.
    pub fn local(&self) -> &dyn LinearOperator<T> {
        self.local.as_ref()
    }

    /// The rank's communicator.
    pub fn communicator(&self) -> &Communicator {
        self.comm
    }

    /// `u_i = A_i x`, queued on the context's stream. Local.
    pub fn apply_local(&self, x: &DeviceBuffer<T>, u: &mut DeviceBuffer<T>) -> Result<()> {
        let (m_i, n) = self.local.shape();
        check_len("x", x.len(), n)?;
        check_len("u", u.len(), m_i)?;
        if m_i > 0 {
            self.local.apply(1.0, x, 0.0, u)?;
        }
        Ok(())
    }

    /// `y = sum over ranks of A_i^T u_i`, queued: the local product, then one NCCL all-reduce
    /// of the `n` elements of `y`.
    pub fn apply_transposed(&self, u: &DeviceBuffer<T>, y: &mut DeviceBuffer<T>) -> Result<()> {
        let (m_i, n) = self.local.shape();
        check_len("u", u.len(), m_i)?;
        check_len("y", y.len(), n)?;
        if m_i > 0 {
            self.local.apply_transposed(1.0, u, 0.0, y)?;
        } else {
            y.fill_bytes(0)?;
        }
        self.comm.all_reduce_sum(y, n)
    }
}

/// `len >= need` (device buffers may be longer than the vector: a zero-length vector is kept
/// in a one-element buffer), else an error naming `arg`.
fn check_len(arg: &'static str, len: usize, need: usize) -> Result<()> {
    if len < need {
        return Err(Error::invalid(arg, format!("has {len} elements; {need} are needed")));
    }
    Ok(())
}

/// `len == need` (host vectors), else an error naming `arg`.
fn check_exact(arg: &'static str, len: usize, need: usize) -> Result<()> {
    if len != need {
        return Err(Error::invalid(arg, format!("has {len} elements; {need} are needed")));
    }
    Ok(())
}

/// `sum v_i^2`, in order from 0.
pub(crate) fn sum_sq(v: &[f64]) -> f64 {
    v.iter().fold(0.0, |acc, &e| acc + e * e)
}
