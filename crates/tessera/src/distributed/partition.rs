//! Splitting the rows of `A` (and `b`) into one contiguous block per rank.
//!
//! # The rule ([`RowPartition::by_nonzeros`])
//!
//! Row `r` costs `nnz(r) + 1` (its products' work, plus one for its entries of `u` and `b`, so
//! that empty rows count too). With `C(r)` the cost of rows `0..r` and `C = C(m)` the total,
//! block `g` of `G` is the rows `bounds[g] .. bounds[g + 1]`, where `bounds[0] = 0`,
//! `bounds[G] = m` and, for `0 < g < G`, `bounds[g]` is the smallest `r` with
//! `C(r) * G >= g * C` (exact integer arithmetic). So every block but the last ends at the
//! first row boundary where the running cost reaches its share, each block costs at most
//! `C / G` plus the cost of its last row, and the bounds never decrease.
//!
//! # Empty blocks
//!
//! Allowed: with `G > m` (or a row heavier than several shares) some blocks have no rows. A
//! rank with an empty block still takes part in every collective of the solve (its `A_i^T u_i`
//! is zero and its `||u_i||^2` is 0), so the results do not change; it only idles. `G == 0` is
//! an error.

use std::ops::Range;

use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::sparse::{CsrHost, SparseIndex};

/// Contiguous row blocks of an `m`-row matrix, one per rank: block `g` is
/// `bounds[g] .. bounds[g + 1]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowPartition {
    bounds: Vec<usize>,
}

impl RowPartition {
    /// Blocks balanced by nonzeros (module docs: row cost `nnz + 1`, block `g` ends at the first
    /// row where the running cost reaches `g / parts` of the total) of the CSR matrix `a`.
    ///
    /// Errors: `parts == 0`; `a`'s offsets are not a valid CSR offset array of `a.rows` rows.
    pub fn by_nonzeros<T: Element, I: SparseIndex>(a: &CsrHost<T, I>, parts: usize) -> Result<RowPartition> {
        check_offsets_len(a)?;
        let offsets: Vec<usize> = a.offsets.iter().map(|o| o.to_usize()).collect();
        RowPartition::from_offsets(&offsets, parts)
    }

    /// [`by_nonzeros`](Self::by_nonzeros) from a CSR offset array alone (`m + 1` entries, from
    /// 0, nondecreasing).
    pub fn from_offsets(offsets: &[usize], parts: usize) -> Result<RowPartition> {
        if parts == 0 {
            return Err(Error::invalid("parts", "is 0; at least one block is needed"));
        }
        if offsets.first() != Some(&0) {
            return Err(Error::invalid("offsets", "must start with 0 (m + 1 entries)"));
        }
        if let Some(r) = offsets.windows(2).position(|w| w[1] < w[0]) {
            return Err(Error::invalid(
                "offsets",
                format!("decrease at row {r} ({} then {})", offsets[r], offsets[r + 1]),
            ));
        }
        let m = offsets.len() - 1;
        // C(r) = offsets[r] + r; u128 so that C * parts cannot overflow.
        let cost = |r: usize| offsets[r] as u128 + r as u128;
        let total = cost(m);
        let g_parts = parts as u128;
        let mut bounds = Vec::with_capacity(parts + 1);
        bounds.push(0);
        let mut r = 0usize;
        for g in 1..parts {
            let target = g as u128 * total;
            // C is nondecreasing and the targets increase: continue from the last bound.
            while r < m && cost(r) * g_parts < target {
                r += 1;
            }
            bounds.push(r);
        }
        bounds.push(m);
        Ok(RowPartition { bounds })
    }

    /// A partition from its bounds: `parts + 1` nondecreasing values from 0 to `m`.
    pub fn from_bounds(bounds: Vec<usize>) -> Result<RowPartition> {
        if bounds.len() < 2 {
            return Err(Error::invalid(
                "bounds",
                format!("has {} values; parts + 1 >= 2 are needed", bounds.len()),
            ));
        }
        if bounds[0] != 0 {
            return Err(Error::invalid(
                "bounds",
                format!("starts at {}; it must start at 0", bounds[0]),
            ));
        }
        if let Some(g) = bounds.windows(2).position(|w| w[1] < w[0]) {
            return Err(Error::invalid(
                "bounds",
                format!("decrease at block {g} ({} then {})", bounds[g], bounds[g + 1]),
            ));
        }
        Ok(RowPartition { bounds })
    }

    /// The number of blocks (ranks).
    pub fn parts(&self) -> usize {
        self.bounds.len() - 1
    }

    /// The rows of the whole matrix.
    pub fn rows_total(&self) -> usize {
        self.bounds[self.parts()]
    }

    /// The rows of block `g`. Errors: `g >= parts()`.
    pub fn rows(&self, g: usize) -> Result<Range<usize>> {
        if g >= self.parts() {
            return Err(Error::invalid(
                "rank",
                format!("is {g}; the partition has {} blocks", self.parts()),
            ));
        }
        Ok(self.bounds[g]..self.bounds[g + 1])
    }

    /// The bounds: `parts() + 1` values, block `g` is `bounds[g] .. bounds[g + 1]`.
    pub fn bounds(&self) -> &[usize] {
        &self.bounds
    }
}

/// `a.offsets` holds `a.rows + 1` entries (what both entry points index by before anything else).
fn check_offsets_len<T: Element, I: SparseIndex>(a: &CsrHost<T, I>) -> Result<()> {
    if a.offsets.len() != a.rows + 1 {
        return Err(Error::invalid(
            "a",
            format!(
                "has {} offsets for {} rows; CSR needs rows + 1",
                a.offsets.len(),
                a.rows
            ),
        ));
    }
    Ok(())
}

/// Rows `rows` of `a` as a matrix of their own (`rows.len() x a.cols`, the same columns):
/// the local block `A_i` of a rank. O(rows + their nonzeros).
///
/// Errors: `rows` outside `0..a.rows` or reversed; `a`'s offsets not `a.rows + 1` long.
pub fn row_block<T: Element, I: SparseIndex>(a: &CsrHost<T, I>, rows: Range<usize>) -> Result<CsrHost<T, I>> {
    check_offsets_len(a)?;
    if rows.start > rows.end || rows.end > a.rows {
        return Err(Error::invalid(
            "rows",
            format!(
                "{}..{} is not a range of the {} rows of A",
                rows.start, rows.end, a.rows
            ),
        ));
    }
    let offsets = &a.offsets[rows.start..=rows.end];
    if let Some(r) = offsets.windows(2).position(|w| w[1] < w[0]) {
        return Err(Error::invalid(
            "a",
            format!("offsets decrease at row {}", rows.start + r),
        ));
    }
    let (p0, p1) = (offsets[0].to_usize(), offsets[offsets.len() - 1].to_usize());
    if p1 > a.indices.len() || p1 > a.values.len() {
        return Err(Error::invalid("a", "offsets out of range of indices / values"));
    }
    let offsets: Vec<I> = offsets
        .iter()
        .map(|o| I::from_usize_in_range(o.to_usize() - p0))
        .collect();
    let indices = a.indices[p0..p1].to_vec();
    // `sorted` must say exactly whether every row's columns strictly increase: a block of a
    // sorted matrix is sorted; a block of an unsorted one may be.
    let sorted = a.sorted
        || offsets.windows(2).all(|w| {
            indices[w[0].to_usize()..w[1].to_usize()]
                .windows(2)
                .all(|c| c[0] < c[1])
        });
    Ok(CsrHost {
        rows: rows.len(),
        cols: a.cols,
        offsets,
        indices,
        values: a.values[p0..p1].to_vec(),
        sorted,
    })
}
