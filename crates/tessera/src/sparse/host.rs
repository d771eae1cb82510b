//! Host sparse matrices: CSR ([`CsrHost`]) and COO ([`CooHost`]), their validation at the API
//! boundary, and conversions (transpose, COO <-> CSR, value and index types, dense).
//!
//! A [`CsrHost`] built by [`CsrHost::new`] or [`CsrHost::from_coo`] satisfies, and
//! [`CsrHost::validate`] checks:
//!
//! * `offsets.len() == rows + 1`, `offsets[0] == 0`, offsets nondecreasing,
//!   `offsets[rows] == nnz == indices.len() == values.len()`;
//! * every column index is in `0..cols`;
//! * `rows`, `cols` and `nnz` fit the index type `I` (so every offset and index does);
//! * `sorted` is true exactly when the columns of every row are strictly increasing (sorted,
//!   no duplicate entries).
//!
//! Costs: validation and duplicate merging are O(rows + nnz); sorting columns is
//! O(nnz log(row length)), on several threads (`std::thread::scope`) above a million nonzeros;
//! [`CsrHost::transpose`] and [`CsrHost::from_coo`] are counting sorts, O(nnz + rows + cols)
//! (plus the column sort within rows for unsorted COO input).

use super::row_ranges::{split_rows, thread_count, PARALLEL_MIN_NNZ};
use super::SparseIndex;
use crate::dtype::Element;
use crate::error::{Error, Result};

/// What [`CsrHost::new`] and [`CsrHost::from_coo`] do with entries that share a (row, column).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Duplicates {
    /// Add them into one entry (summed in f64, rounded once to the value type). A sum that is
    /// exactly zero stays as an explicit zero entry. Needs sorted columns to find duplicates:
    /// with [`ColumnOrder::Unsorted`] duplicates are kept as given.
    #[default]
    Sum,
    /// Return an error naming the first duplicate (lowest row, then lowest column).
    Reject,
}

/// How the columns within each row of the input to [`CsrHost::new`] are ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ColumnOrder {
    /// Any order: sort the columns of each row (values move with them; stable, so duplicates
    /// keep their given order).
    #[default]
    Sort,
    /// The caller promises nondecreasing columns within each row; this is checked (O(nnz)) and
    /// a violation is an error.
    Sorted,
    /// Keep the columns as given. `CsrHost::sorted` still reports whether they happen to be
    /// strictly increasing.
    Unsorted,
}

/// The checks and normalisation [`CsrHost::new`] applies; the default sorts columns and sums
/// duplicates.
#[derive(Clone, Copy, Debug, Default)]
pub struct CsrCheck {
    pub order: ColumnOrder,
    pub duplicates: Duplicates,
}

/// The storage order of a dense matrix (the right-hand sides and results of SpMM).
///
/// A `rows x cols` matrix has leading dimension `cols` in [`RowMajor`](Self::RowMajor)
/// (element `(r, c)` at `r * cols + c`) and `rows` in [`ColMajor`](Self::ColMajor)
/// (element `(r, c)` at `c * rows + r`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DenseLayout {
    RowMajor,
    ColMajor,
}

impl DenseLayout {
    /// The distance between consecutive rows (row-major) or columns (col-major) of a dense
    /// `rows x cols` matrix stored without padding.
    pub fn leading_dim(self, rows: usize, cols: usize) -> usize {
        match self {
            DenseLayout::RowMajor => cols,
            DenseLayout::ColMajor => rows,
        }
    }

    /// The position of element `(r, c)` of a dense `rows x cols` matrix stored without padding.
    pub fn offset(self, r: usize, c: usize, rows: usize, cols: usize) -> usize {
        match self {
            DenseLayout::RowMajor => r * cols + c,
            DenseLayout::ColMajor => c * rows + r,
        }
    }
}

/// A sparse matrix in compressed sparse row form on the host.
///
/// Row `r` holds the entries `offsets[r]..offsets[r + 1]` of `indices` (columns) and `values`.
/// The fields are public for reading and for handing the arrays to a device upload; a value
/// whose fields were edited by hand can be re-checked with [`validate`](Self::validate).
#[derive(Clone, Debug, PartialEq)]
pub struct CsrHost<T: Element, I: SparseIndex> {
    pub rows: usize,
    pub cols: usize,
    pub offsets: Vec<I>,
    pub indices: Vec<I>,
    pub values: Vec<T>,
    /// The columns of every row are strictly increasing (sorted and without duplicates).
    pub sorted: bool,
}

/// A sparse matrix as (row, column, value) triplets on the host, in any order, duplicates
/// allowed; 0-based indices.
#[derive(Clone, Debug, PartialEq)]
pub struct CooHost<T: Element, I: SparseIndex> {
    pub rows: usize,
    pub cols: usize,
    pub row_indices: Vec<I>,
    pub col_indices: Vec<I>,
    pub values: Vec<T>,
}

impl<T: Element, I: SparseIndex> CsrHost<T, I> {
    /// Validates a CSR matrix (see the module documentation for the rules), orders its columns
    /// as `check.order` says and treats duplicates as `check.duplicates` says.
    ///
    /// Takes the arrays by value; they are reordered (and shortened by merged duplicates) in
    /// place. An error names the argument, the offending row, position or value, and the rule.
    pub fn new(
        rows: usize,
        cols: usize,
        offsets: Vec<I>,
        indices: Vec<I>,
        values: Vec<T>,
        check: &CsrCheck,
    ) -> Result<Self> {
        check_sizes::<I>(rows, cols, indices.len())?;
        check_values_len(indices.len(), values.len())?;
        check_offsets(rows, &offsets, indices.len())?;
        check_columns(&offsets, &indices, cols)?;
        let mut a = CsrHost {
            rows,
            cols,
            offsets,
            indices,
            values,
            sorted: false,
        };
        match check.order {
            ColumnOrder::Sort => a.sort_columns(),
            ColumnOrder::Sorted => a.check_nondecreasing()?,
            ColumnOrder::Unsorted => {}
        }
        match (check.order, check.duplicates) {
            (ColumnOrder::Unsorted, Duplicates::Sum) => {}
            (ColumnOrder::Unsorted, Duplicates::Reject) => a.reject_unsorted_duplicates()?,
            (_, Duplicates::Reject) => {
                if let Some((row, col)) = a.first_adjacent_duplicate() {
                    return Err(duplicate_error(row, col));
                }
            }
            (_, Duplicates::Sum) => a.sum_adjacent_duplicates(),
        }
        a.sorted = a.rows_strictly_increasing();
        Ok(a)
    }

    /// Checks every invariant listed in the module documentation, including that `sorted` is
    /// true exactly when every row's columns are strictly increasing. For values whose public
    /// fields were changed by hand; the constructors already guarantee it. O(rows + nnz).
    pub fn validate(&self) -> Result<()> {
        check_sizes::<I>(self.rows, self.cols, self.indices.len())?;
        check_values_len(self.indices.len(), self.values.len())?;
        check_offsets(self.rows, &self.offsets, self.indices.len())?;
        check_columns(&self.offsets, &self.indices, self.cols)?;
        let strictly_increasing = self.rows_strictly_increasing();
        if self.sorted != strictly_increasing {
            return Err(Error::invalid(
                "sorted",
                format!(
                    "is {} but the columns of every row are {}strictly increasing",
                    self.sorted,
                    if strictly_increasing { "" } else { "not all " }
                ),
            ));
        }
        Ok(())
    }

    /// The number of stored entries.
    pub fn nnz(&self) -> usize {
        self.indices.len()
    }

    /// The range of row `r` in `indices` and `values`. Panics if `r >= rows`.
    fn row_range(&self, r: usize) -> std::ops::Range<usize> {
        self.offsets[r].to_usize()..self.offsets[r + 1].to_usize()
    }

    /// The columns and values of row `r`. Panics if `r >= rows`, like slice indexing.
    pub fn row(&self, r: usize) -> (&[I], &[T]) {
        let range = self.row_range(r);
        (&self.indices[range.clone()], &self.values[range])
    }

    /// The number of entries of row `r`. Panics if `r >= rows`, like slice indexing.
    pub fn row_len(&self, r: usize) -> usize {
        self.row_range(r).len()
    }

    /// The CSR form of the transpose (`cols x rows`), with sorted columns: a counting sort by
    /// column, O(nnz + rows + cols). Duplicates of `self` stay duplicates (then `sorted` is
    /// false); otherwise the result has `sorted == true`.
    pub fn transpose(&self) -> CsrHost<T, I> {
        let nnz = self.nnz();
        let mut starts = vec![0usize; self.cols + 1];
        for &c in &self.indices {
            starts[c.to_usize() + 1] += 1;
        }
        for c in 0..self.cols {
            starts[c + 1] += starts[c];
        }
        let mut next = starts[..self.cols].to_vec();
        let mut indices = vec![I::ZERO; nnz];
        let mut values = vec![T::default(); nnz];
        for r in 0..self.rows {
            let row_index = I::from_usize_in_range(r);
            for p in self.row_range(r) {
                let c = self.indices[p].to_usize();
                indices[next[c]] = row_index;
                values[next[c]] = self.values[p];
                next[c] += 1;
            }
        }
        let mut t = CsrHost {
            rows: self.cols,
            cols: self.rows,
            offsets: starts.into_iter().map(I::from_usize_in_range).collect(),
            indices,
            values,
            sorted: false,
        };
        t.sorted = t.rows_strictly_increasing();
        t
    }

    /// Builds a CSR matrix from triplets: validates sizes and indices, sorts by row (a stable
    /// counting sort, O(nnz + rows)) then by column within rows, and sums or rejects duplicates.
    /// The result has sorted columns, so with either policy `sorted == true`.
    pub fn from_coo(coo: CooHost<T, I>, duplicates: Duplicates) -> Result<Self> {
        let CooHost {
            rows,
            cols,
            row_indices,
            col_indices,
            values,
        } = coo;
        let nnz = row_indices.len();
        check_sizes::<I>(rows, cols, nnz)?;
        check_triplet_lengths(nnz, col_indices.len(), values.len())?;
        check_triplet_indices("row_indices", &row_indices, rows)?;
        check_triplet_indices("col_indices", &col_indices, cols)?;

        let mut starts = vec![0usize; rows + 1];
        for &r in &row_indices {
            starts[r.to_usize() + 1] += 1;
        }
        for r in 0..rows {
            starts[r + 1] += starts[r];
        }
        let mut next = starts[..rows].to_vec();
        let mut indices = vec![I::ZERO; nnz];
        let mut sorted_values = vec![T::default(); nnz];
        for ((&r, &c), &v) in row_indices.iter().zip(&col_indices).zip(&values) {
            let slot = &mut next[r.to_usize()];
            indices[*slot] = c;
            sorted_values[*slot] = v;
            *slot += 1;
        }
        drop((row_indices, col_indices, values));
        let mut a = CsrHost {
            rows,
            cols,
            offsets: starts.into_iter().map(I::from_usize_in_range).collect(),
            indices,
            values: sorted_values,
            sorted: false,
        };
        a.sort_columns();
        match duplicates {
            Duplicates::Sum => a.sum_adjacent_duplicates(),
            Duplicates::Reject => {
                if let Some((row, col)) = a.first_adjacent_duplicate() {
                    return Err(duplicate_error(row, col));
                }
            }
        }
        a.sorted = true;
        Ok(a)
    }

    /// The entries as triplets, in row order (columns in stored order within a row).
    pub fn to_coo(&self) -> CooHost<T, I> {
        let mut row_indices = Vec::with_capacity(self.nnz());
        for r in 0..self.rows {
            let row_index = I::from_usize_in_range(r);
            row_indices.extend(std::iter::repeat_n(row_index, self.row_len(r)));
        }
        CooHost {
            rows: self.rows,
            cols: self.cols,
            row_indices,
            col_indices: self.indices.clone(),
            values: self.values.clone(),
        }
    }

    /// The same pattern with every value mapped through `f`.
    pub fn map_values<U: Element>(&self, f: impl Fn(T) -> U) -> CsrHost<U, I> {
        CsrHost {
            rows: self.rows,
            cols: self.cols,
            offsets: self.offsets.clone(),
            indices: self.indices.clone(),
            values: self.values.iter().map(|&v| f(v)).collect(),
            sorted: self.sorted,
        }
    }

    /// The same matrix with offsets and indices in the index type `J`; an error if `rows`,
    /// `cols` or `nnz` does not fit `J`.
    pub fn with_index<J: SparseIndex>(&self) -> Result<CsrHost<T, J>> {
        check_sizes::<J>(self.rows, self.cols, self.nnz())?;
        let convert = |v: &I| J::from_usize_in_range(v.to_usize());
        Ok(CsrHost {
            rows: self.rows,
            cols: self.cols,
            offsets: self.offsets.iter().map(convert).collect(),
            indices: self.indices.iter().map(convert).collect(),
            values: self.values.clone(),
            sorted: self.sorted,
        })
    }

    /// The matrix as a dense row-major `rows x cols` array of f64 (duplicates added). For small
    /// matrices in tests: it allocates `rows * cols` values.
    pub fn to_dense_f64(&self) -> Vec<f64> {
        let mut dense = vec![0.0; self.rows * self.cols];
        for r in 0..self.rows {
            let (cols, values) = self.row(r);
            for (&c, &v) in cols.iter().zip(values) {
                dense[r * self.cols + c.to_usize()] += v.to_f64();
            }
        }
        dense
    }

    /// The sparse form of a dense row-major `rows x cols` array, skipping zeros; sorted. For
    /// tests.
    ///
    /// # Panics
    /// If `dense.len() != rows * cols`, or if the sizes do not fit `I`.
    pub fn from_dense(rows: usize, cols: usize, dense: &[f64]) -> Self {
        assert_eq!(
            dense.len(),
            rows * cols,
            "from_dense: a {rows} x {cols} matrix needs {} values",
            rows * cols
        );
        let mut offsets = Vec::with_capacity(rows + 1);
        let mut indices = Vec::new();
        let mut values = Vec::new();
        offsets.push(I::ZERO);
        for r in 0..rows {
            for c in 0..cols {
                let v = dense[r * cols + c];
                if v != 0.0 {
                    indices.push(I::from_usize(c).expect("from_dense: cols fit the index type"));
                    values.push(T::from_f64(v));
                }
            }
            offsets.push(I::from_usize(indices.len()).expect("from_dense: nnz fits the index type"));
        }
        check_sizes::<I>(rows, cols, indices.len()).unwrap_or_else(|e| panic!("from_dense: {e}"));
        CsrHost {
            rows,
            cols,
            offsets,
            indices,
            values,
            sorted: true,
        }
    }

    /// Whether the columns of every row are strictly increasing. O(nnz + rows).
    fn rows_strictly_increasing(&self) -> bool {
        (0..self.rows).all(|r| self.row(r).0.windows(2).all(|w| w[0] < w[1]))
    }

    /// Sorts the columns of every row (stable; values move with them), on several threads for
    /// large matrices.
    fn sort_columns(&mut self) {
        if self.nnz() <= PARALLEL_MIN_NNZ {
            sort_rows(&self.offsets, 0, &mut self.indices, &mut self.values);
            return;
        }
        let ranges = split_rows(&self.offsets, thread_count(), 1);
        let offsets = &self.offsets;
        let (mut indices, mut values) = (&mut self.indices[..], &mut self.values[..]);
        std::thread::scope(|scope| {
            for range in ranges {
                let base = offsets[range.start].to_usize();
                let len = offsets[range.end].to_usize() - base;
                let (range_indices, rest_indices) = std::mem::take(&mut indices).split_at_mut(len);
                let (range_values, rest_values) = std::mem::take(&mut values).split_at_mut(len);
                indices = rest_indices;
                values = rest_values;
                let range_offsets = &offsets[range.start..=range.end];
                scope.spawn(move || sort_rows(range_offsets, base, range_indices, range_values));
            }
        });
    }

    /// Errors at the first row whose columns decrease somewhere ([`ColumnOrder::Sorted`]).
    fn check_nondecreasing(&self) -> Result<()> {
        for r in 0..self.rows {
            let range = self.row_range(r);
            for p in range.start + 1..range.end {
                let (prev, col) = (self.indices[p - 1], self.indices[p]);
                if col < prev {
                    return Err(Error::invalid(
                        "indices",
                        format!(
                            "row {r} is not sorted: column {col:?} at position {p} follows column {prev:?}; \
                             ColumnOrder::Sorted promises nondecreasing columns within each row \
                             (ColumnOrder::Sort sorts them)"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The first (row, column) stored twice in a row, for rows with nondecreasing columns
    /// (where duplicates are adjacent).
    fn first_adjacent_duplicate(&self) -> Option<(usize, usize)> {
        (0..self.rows).find_map(|r| {
            let cols = self.row(r).0;
            cols.windows(2).find(|w| w[0] == w[1]).map(|w| (r, w[0].to_usize()))
        })
    }

    /// Errors at the first row that holds a column twice, for rows in any order; names the
    /// smallest such column of that row. Sorts a copy of each row: O(nnz log(row length)).
    fn reject_unsorted_duplicates(&self) -> Result<()> {
        let mut scratch = Vec::new();
        for r in 0..self.rows {
            scratch.clear();
            scratch.extend_from_slice(self.row(r).0);
            scratch.sort_unstable();
            if let Some(w) = scratch.windows(2).find(|w| w[0] == w[1]) {
                return Err(duplicate_error(r, w[0].to_usize()));
            }
        }
        Ok(())
    }

    /// Merges runs of equal adjacent columns into one entry holding their sum (in f64, rounded
    /// once), compacting the arrays in place. O(nnz + rows); nothing moves without duplicates.
    fn sum_adjacent_duplicates(&mut self) {
        if self.first_adjacent_duplicate().is_none() {
            return;
        }
        let mut write = 0;
        let mut start = 0;
        for r in 0..self.rows {
            let end = self.offsets[r + 1].to_usize();
            let mut p = start;
            while p < end {
                let col = self.indices[p];
                let mut q = p + 1;
                while q < end && self.indices[q] == col {
                    q += 1;
                }
                let value = if q == p + 1 {
                    self.values[p]
                } else {
                    T::from_f64(self.values[p..q].iter().map(|v| v.to_f64()).sum())
                };
                self.indices[write] = col;
                self.values[write] = value;
                write += 1;
                p = q;
            }
            self.offsets[r + 1] = I::from_usize_in_range(write);
            start = end;
        }
        self.indices.truncate(write);
        self.values.truncate(write);
    }
}

impl<T: Element, I: SparseIndex> CooHost<T, I> {
    /// The number of triplets.
    pub fn nnz(&self) -> usize {
        self.values.len()
    }

    /// The same triplets with indices of type `J` (for example the `i64` triplets of
    /// [`read_mtx`](super::read_mtx) as `i32`). An error if `rows`, `cols` or the number of
    /// triplets does not fit `J`, if the index arrays and values differ in length, or if an
    /// index is outside its dimension. O(nnz).
    pub fn with_index<J: SparseIndex>(&self) -> Result<CooHost<T, J>> {
        check_sizes::<J>(self.rows, self.cols, self.row_indices.len())?;
        check_triplet_lengths(self.row_indices.len(), self.col_indices.len(), self.values.len())?;
        check_triplet_indices("row_indices", &self.row_indices, self.rows)?;
        check_triplet_indices("col_indices", &self.col_indices, self.cols)?;
        let convert = |v: &I| J::from_usize_in_range(v.to_usize());
        Ok(CooHost {
            rows: self.rows,
            cols: self.cols,
            row_indices: self.row_indices.iter().map(convert).collect(),
            col_indices: self.col_indices.iter().map(convert).collect(),
            values: self.values.clone(),
        })
    }
}

/// Sorts the columns within each row described by `offsets` (absolute positions; the slices
/// start at position `base`), keeping the given order of equal columns.
fn sort_rows<T: Element, I: SparseIndex>(offsets: &[I], base: usize, indices: &mut [I], values: &mut [T]) {
    let mut pairs: Vec<(I, T)> = Vec::new();
    for w in offsets.windows(2) {
        let (start, end) = (w[0].to_usize() - base, w[1].to_usize() - base);
        let cols = &mut indices[start..end];
        if cols.windows(2).all(|w| w[0] <= w[1]) {
            continue;
        }
        let vals = &mut values[start..end];
        pairs.clear();
        pairs.extend(cols.iter().copied().zip(vals.iter().copied()));
        pairs.sort_by_key(|&(c, _)| c);
        for ((c, v), &(pc, pv)) in cols.iter_mut().zip(vals.iter_mut()).zip(&pairs) {
            *c = pc;
            *v = pv;
        }
    }
}

/// The error for a (row, column) stored more than once under [`Duplicates::Reject`].
pub(crate) fn duplicate_error(row: usize, col: usize) -> Error {
    Error::invalid(
        "indices",
        format!(
            "row {row} holds column {col} more than once; Duplicates::Reject allows each (row, column) \
             once (Duplicates::Sum adds duplicates together)"
        ),
    )
}

/// `rows`, `cols` and `nnz` must fit the index type.
pub(crate) fn check_sizes<I: SparseIndex>(rows: usize, cols: usize, nnz: usize) -> Result<()> {
    for (arg, what, n) in [
        ("rows", "rows", rows),
        ("cols", "columns", cols),
        ("indices", "nonzeros", nnz),
    ] {
        if n > I::MAX_USIZE {
            return Err(Error::invalid(
                arg,
                format!(
                    "{n} {what} do not fit the {} index type (at most {}); use a wider index type",
                    I::DTYPE,
                    I::MAX_USIZE
                ),
            ));
        }
    }
    Ok(())
}

/// There is one value per column index.
fn check_values_len(nnz: usize, values: usize) -> Result<()> {
    if values != nnz {
        return Err(Error::invalid(
            "values",
            format!("has {values} entries but indices has {nnz}; there is one value per column index"),
        ));
    }
    Ok(())
}

/// `rows + 1` offsets, starting at 0, nondecreasing, ending at `nnz`.
fn check_offsets<I: SparseIndex>(rows: usize, offsets: &[I], nnz: usize) -> Result<()> {
    if offsets.len() != rows + 1 {
        return Err(Error::invalid(
            "offsets",
            format!(
                "has {} entries; a CSR matrix with {rows} rows needs rows + 1 = {} offsets",
                offsets.len(),
                rows + 1
            ),
        ));
    }
    if offsets[0] != I::ZERO {
        return Err(Error::invalid(
            "offsets",
            format!("offsets[0] = {:?}; the first offset must be 0", offsets[0]),
        ));
    }
    if let Some(r) = (0..rows).find(|&r| offsets[r + 1] < offsets[r]) {
        return Err(Error::invalid(
            "offsets",
            format!(
                "offsets[{}] = {:?} is less than offsets[{r}] = {:?}; offsets must be nondecreasing \
                 (row {r} would have a negative length)",
                r + 1,
                offsets[r + 1],
                offsets[r]
            ),
        ));
    }
    if offsets[rows].to_usize() != nnz {
        return Err(Error::invalid(
            "offsets",
            format!(
                "offsets[{rows}] = {:?} but indices has {nnz} entries; the last offset must equal the \
                 number of nonzeros",
                offsets[rows]
            ),
        ));
    }
    Ok(())
}

/// Every column index is in `0..cols` (offsets already checked).
fn check_columns<I: SparseIndex>(offsets: &[I], indices: &[I], cols: usize) -> Result<()> {
    for (r, w) in offsets.windows(2).enumerate() {
        let start = w[0].to_usize();
        for (p, &c) in indices[start..w[1].to_usize()].iter().enumerate() {
            let p = start + p;
            if c < I::ZERO || c.to_usize() >= cols {
                return Err(Error::invalid(
                    "indices",
                    format!("indices[{p}] = {c:?} in row {r} is outside the columns 0..{cols}"),
                ));
            }
        }
    }
    Ok(())
}

/// The three triplet arrays have one entry per triplet.
pub(crate) fn check_triplet_lengths(rows: usize, cols: usize, values: usize) -> Result<()> {
    if cols != rows {
        return Err(Error::invalid(
            "col_indices",
            format!("has {cols} entries but row_indices has {rows}; they pair up one to one"),
        ));
    }
    if values != rows {
        return Err(Error::invalid(
            "values",
            format!("has {values} entries but row_indices has {rows}; there is one value per triplet"),
        ));
    }
    Ok(())
}

/// Every triplet index is in `0..bound` (`what` names the argument).
pub(crate) fn check_triplet_indices<I: SparseIndex>(what: &'static str, indices: &[I], bound: usize) -> Result<()> {
    if let Some((k, &v)) = indices
        .iter()
        .enumerate()
        .find(|(_, &v)| v < I::ZERO || v.to_usize() >= bound)
    {
        let dim = if what == "row_indices" { "rows" } else { "columns" };
        return Err(Error::invalid(
            what,
            format!("{what}[{k}] = {v:?} is outside the {dim} 0..{bound}"),
        ));
    }
    Ok(())
}
