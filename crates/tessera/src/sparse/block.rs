//! Host block-sparse matrices: BSR ([`BsrHost`], block compressed sparse row with square
//! `b x b` blocks) and Blocked-ELL ([`BellHost`], a fixed number of blocks per block row), their
//! validation, and the conversions CSR -> BSR -> Blocked-ELL that the device conversions
//! (`convert.cu`) must reproduce bit for bit.
//!
//! # Block sizes
//! `b` is one of [`BLOCK_SIZES`] (2, 4, 8, 16, 32); anything else is an error naming the list.
//! The kernels specialise on `b` at compile time, and the tensor-core SpMM needs `b` a multiple
//! of 16 (`bsr.rs` says which path each (dtype, b) takes).
//!
//! # Dimensions: padded, not required to be multiples of `b`
//! A `rows x cols` matrix has `ceil(rows / b)` block rows and `ceil(cols / b)` block columns.
//! The last block row and block column may reach past the matrix; those entries (the padding)
//! are stored and must be zero ([`BsrHost::validate`] checks it, the conversions write zeros).
//! Kernels never read `x` / `B` past `cols` nor write `y` / `C` past `rows`, so the operands keep
//! their unpadded sizes, as with CSR. (Requiring multiples of `b` would push the padding onto
//! every caller's vectors instead.)
//!
//! # BSR layout (as cuSPARSE's BSR with `CUSPARSE_DIRECTION_ROW` and torch's `sparse_bsr`)
//! * `block_offsets` (`block_rows + 1`): block row `br` holds blocks
//!   `block_offsets[br]..block_offsets[br + 1]`, starting at 0, nondecreasing;
//! * `block_indices` (one per block): its block column, in `0..block_cols`, strictly increasing
//!   within a block row (sorted, no block stored twice);
//! * `values` (`b * b` per block): each block row-major, element `(i, j)` of block `k` (matrix
//!   entry `(br * b + i, block_indices[k] * b + j)`) at `k * b * b + i * b + j`.
//! * `rows`, `cols` and the number of blocks fit the index type `I` (value positions are
//!   computed in 64 bits by the kernels).
//!
//! # Blocked-ELL layout
//! Every block row holds `width` block slots (the most blocks of any block row): slot `s` of
//! block row `br` is block `br * width + s`, with its block column in `block_indices` or
//! `I::MINUS_ONE` (-1) for a padding slot, and its `b * b` values row-major as in BSR (a padding
//! slot's values are zero). Real slots come first in each block row, block columns strictly
//! increasing. This is cuSPARSE's Blocked-ELL (`ellColInd`, -1 padding) except that cuSPARSE
//! stores the values as one dense `rows x (width * b)` matrix; here each block is contiguous, so
//! one kernel serves BSR and Blocked-ELL.
//!
//! # CSR -> BSR
//! [`BsrHost::from_csr`]: the blocks of a block row are its distinct block columns in
//! increasing order. Entries stored more than once at one (row, column) are added in stored
//! order in f64 and rounded once to `T` (as [`Duplicates::Sum`](super::Duplicates::Sum)); a
//! single entry is copied unchanged (bitwise). O(nnz log(block-row nnz) + blocks * b * b).

use super::host::{check_sizes, CsrHost};
use super::SparseIndex;
use crate::dtype::Element;
use crate::error::{Error, Result};

/// The square block sizes BSR and Blocked-ELL take.
pub const BLOCK_SIZES: [usize; 5] = [2, 4, 8, 16, 32];

/// Checks that `block` is one of [`BLOCK_SIZES`].
pub fn check_block_size(block: usize) -> Result<()> {
    if !BLOCK_SIZES.contains(&block) {
        return Err(Error::invalid(
            "block",
            format!("{block}; block sizes of BSR and Blocked-ELL are 2, 4, 8, 16 or 32 (square blocks)"),
        ));
    }
    Ok(())
}

/// A matrix in block compressed sparse row form on the host (see the module documentation).
#[derive(Clone, Debug, PartialEq)]
pub struct BsrHost<T: Element, I: SparseIndex> {
    pub rows: usize,
    pub cols: usize,
    /// The side `b` of the square blocks.
    pub block: usize,
    pub block_offsets: Vec<I>,
    pub block_indices: Vec<I>,
    pub values: Vec<T>,
}

/// A matrix in Blocked-ELL form on the host (see the module documentation).
#[derive(Clone, Debug, PartialEq)]
pub struct BellHost<T: Element, I: SparseIndex> {
    pub rows: usize,
    pub cols: usize,
    /// The side `b` of the square blocks.
    pub block: usize,
    /// Block slots per block row.
    pub width: usize,
    /// `block_rows * width` block columns, `I::MINUS_ONE` for padding slots.
    pub block_indices: Vec<I>,
    /// `block_rows * width * b * b` values.
    pub values: Vec<T>,
}

/// `ceil(n / b)`.
fn blocks_of(n: usize, b: usize) -> usize {
    n.div_ceil(b)
}

impl<T: Element, I: SparseIndex> BsrHost<T, I> {
    /// A validated BSR matrix from its arrays (see the module documentation for the rules; an
    /// error names the argument, the position and the rule).
    pub fn new(
        rows: usize,
        cols: usize,
        block: usize,
        block_offsets: Vec<I>,
        block_indices: Vec<I>,
        values: Vec<T>,
    ) -> Result<Self> {
        let a = BsrHost {
            rows,
            cols,
            block,
            block_offsets,
            block_indices,
            values,
        };
        a.validate()?;
        Ok(a)
    }

    /// Checks every rule of the module documentation. O(blocks * b * b).
    pub fn validate(&self) -> Result<()> {
        check_block_size(self.block)?;
        let b = self.block;
        let nnzb = self.block_indices.len();
        check_sizes::<I>(self.rows, self.cols, nnzb)?;
        let (block_rows, block_cols) = (self.block_rows(), self.block_cols());
        if self.block_offsets.len() != block_rows + 1 {
            return Err(Error::invalid(
                "block_offsets",
                format!(
                    "has {} entries; a {} x {} matrix of {b} x {b} blocks has {block_rows} block rows and needs \
                     block_rows + 1 = {} offsets",
                    self.block_offsets.len(),
                    self.rows,
                    self.cols,
                    block_rows + 1
                ),
            ));
        }
        if self.block_offsets[0] != I::ZERO {
            return Err(Error::invalid(
                "block_offsets",
                format!(
                    "block_offsets[0] = {:?}; the first offset must be 0",
                    self.block_offsets[0]
                ),
            ));
        }
        if let Some(r) = (0..block_rows).find(|&r| self.block_offsets[r + 1] < self.block_offsets[r]) {
            return Err(Error::invalid(
                "block_offsets",
                format!(
                    "block_offsets[{}] = {:?} is less than block_offsets[{r}] = {:?}; offsets must be nondecreasing",
                    r + 1,
                    self.block_offsets[r + 1],
                    self.block_offsets[r]
                ),
            ));
        }
        if self.block_offsets[block_rows].to_usize() != nnzb {
            return Err(Error::invalid(
                "block_offsets",
                format!(
                    "block_offsets[{block_rows}] = {:?} but block_indices has {nnzb} entries; the last offset \
                     must equal the number of blocks",
                    self.block_offsets[block_rows]
                ),
            ));
        }
        if self.values.len() != nnzb * b * b {
            return Err(Error::invalid(
                "values",
                format!(
                    "has {} entries; {nnzb} blocks of {b} x {b} need {}",
                    self.values.len(),
                    nnzb * b * b
                ),
            ));
        }
        for br in 0..block_rows {
            let range = self.block_range(br);
            for k in range.clone() {
                let c = self.block_indices[k];
                if c < I::ZERO || c.to_usize() >= block_cols {
                    return Err(Error::invalid(
                        "block_indices",
                        format!(
                            "block_indices[{k}] = {c:?} in block row {br} is outside the block columns 0..{block_cols}"
                        ),
                    ));
                }
                if k > range.start && self.block_indices[k - 1] >= c {
                    return Err(Error::invalid(
                        "block_indices",
                        format!(
                            "block row {br} is not strictly increasing: block column {c:?} at position {k} follows \
                             {:?}; each block row lists its blocks once, in increasing order",
                            self.block_indices[k - 1]
                        ),
                    ));
                }
            }
        }
        check_padding_zero(self.rows, self.cols, b, &self.values, |k| {
            let br = self.block_offsets.partition_point(|&o| o.to_usize() <= k) - 1;
            Some((br, self.block_indices[k].to_usize()))
        })
    }

    pub fn block_rows(&self) -> usize {
        blocks_of(self.rows, self.block)
    }
    pub fn block_cols(&self) -> usize {
        blocks_of(self.cols, self.block)
    }
    /// The number of stored blocks.
    pub fn nnzb(&self) -> usize {
        self.block_indices.len()
    }
    /// Blocks of block row `br` (positions in `block_indices`). Panics if `br >= block_rows`.
    pub fn block_range(&self, br: usize) -> std::ops::Range<usize> {
        self.block_offsets[br].to_usize()..self.block_offsets[br + 1].to_usize()
    }
    /// Stored blocks / all `block_rows * block_cols` blocks (0 for an empty shape).
    pub fn block_density(&self) -> f64 {
        let all = self.block_rows() * self.block_cols();
        if all == 0 {
            0.0
        } else {
            self.nnzb() as f64 / all as f64
        }
    }

    /// The BSR form of `a` with `block x block` blocks (see the module documentation); an
    /// error for an unsupported block size or more blocks than `I` holds.
    pub fn from_csr(a: &CsrHost<T, I>, block: usize) -> Result<Self> {
        check_block_size(block)?;
        let b = block;
        let block_rows = blocks_of(a.rows, b);
        let mut block_offsets = Vec::with_capacity(block_rows + 1);
        let mut block_indices: Vec<I> = Vec::new();
        let mut values: Vec<T> = Vec::new();
        block_offsets.push(I::ZERO);
        // (column, row within the block, position) of a block row's entries, in row order then
        // stored order; a stable sort by column keeps that order among equal columns
        let mut entries: Vec<(usize, usize, usize)> = Vec::new();
        for br in 0..block_rows {
            entries.clear();
            for r in br * b..((br + 1) * b).min(a.rows) {
                let range = a.offsets[r].to_usize()..a.offsets[r + 1].to_usize();
                entries.extend(range.map(|k| (a.indices[k].to_usize(), r - br * b, k)));
            }
            entries.sort_by_key(|e| e.0);
            let mut p = 0;
            while p < entries.len() {
                let (c, i, k) = entries[p];
                let mut q = p + 1;
                while q < entries.len() && entries[q].0 == c && entries[q].1 == i {
                    q += 1;
                }
                let value = if q == p + 1 {
                    a.values[k]
                } else {
                    T::from_f64(entries[p..q].iter().map(|e| a.values[e.2].to_f64()).sum())
                };
                let bc = c / b;
                if block_indices.len() == block_offsets[br].to_usize()
                    || block_indices.last().map(|x: &I| x.to_usize()) != Some(bc)
                {
                    block_indices.push(I::from_usize_in_range(bc));
                    values.extend(std::iter::repeat_n(T::default(), b * b));
                }
                let base = (block_indices.len() - 1) * b * b;
                values[base + i * b + c % b] = value;
                p = q;
            }
            check_sizes::<I>(a.rows, a.cols, block_indices.len())?;
            block_offsets.push(I::from_usize_in_range(block_indices.len()));
        }
        Ok(BsrHost {
            rows: a.rows,
            cols: a.cols,
            block,
            block_offsets,
            block_indices,
            values,
        })
    }

    /// The CSR form: every stored block entry (zeros inside stored blocks included, padding
    /// excluded), columns strictly increasing within rows. For tests and references.
    pub fn to_csr(&self) -> CsrHost<T, I> {
        let b = self.block;
        let mut offsets = vec![I::ZERO];
        let mut indices = Vec::new();
        let mut values = Vec::new();
        for r in 0..self.rows {
            let (br, i) = (r / b, r % b);
            for k in self.block_range(br) {
                let c0 = self.block_indices[k].to_usize() * b;
                for j in 0..b.min(self.cols - c0) {
                    indices.push(I::from_usize_in_range(c0 + j));
                    values.push(self.values[k * b * b + i * b + j]);
                }
            }
            offsets.push(I::from_usize_in_range(indices.len()));
        }
        CsrHost {
            rows: self.rows,
            cols: self.cols,
            offsets,
            indices,
            values,
            sorted: true,
        }
    }

    /// The matrix as a dense row-major `rows x cols` array of f64. For small matrices in tests.
    pub fn to_dense_f64(&self) -> Vec<f64> {
        self.to_csr().to_dense_f64()
    }
}

impl<T: Element, I: SparseIndex> BellHost<T, I> {
    /// A validated Blocked-ELL matrix from its arrays (see the module documentation).
    pub fn new(
        rows: usize,
        cols: usize,
        block: usize,
        width: usize,
        block_indices: Vec<I>,
        values: Vec<T>,
    ) -> Result<Self> {
        let a = BellHost {
            rows,
            cols,
            block,
            width,
            block_indices,
            values,
        };
        a.validate()?;
        Ok(a)
    }

    pub fn block_rows(&self) -> usize {
        blocks_of(self.rows, self.block)
    }
    pub fn block_cols(&self) -> usize {
        blocks_of(self.cols, self.block)
    }

    /// Checks the rules of the module documentation. O(slots * b * b).
    pub fn validate(&self) -> Result<()> {
        check_block_size(self.block)?;
        let b = self.block;
        let (block_rows, block_cols) = (self.block_rows(), self.block_cols());
        let slots = block_rows.checked_mul(self.width).ok_or_else(|| {
            Error::invalid(
                "width",
                format!(
                    "{} block slots per block row overflow with {block_rows} block rows",
                    self.width
                ),
            )
        })?;
        check_sizes::<I>(self.rows, self.cols, slots)?;
        if self.block_indices.len() != slots {
            return Err(Error::invalid(
                "block_indices",
                format!(
                    "has {} entries; {block_rows} block rows of width {} need {slots}",
                    self.block_indices.len(),
                    self.width
                ),
            ));
        }
        if self.values.len() != slots * b * b {
            return Err(Error::invalid(
                "values",
                format!(
                    "has {} entries; {slots} block slots of {b} x {b} need {}",
                    self.values.len(),
                    slots * b * b
                ),
            ));
        }
        for br in 0..block_rows {
            let row = &self.block_indices[br * self.width..(br + 1) * self.width];
            let mut padding = false;
            for (s, &c) in row.iter().enumerate() {
                let k = br * self.width + s;
                if c == I::MINUS_ONE {
                    padding = true;
                    if self.values[k * b * b..(k + 1) * b * b]
                        .iter()
                        .any(|v| v.to_f64() != 0.0)
                    {
                        return Err(Error::invalid(
                            "values",
                            format!("padding slot {s} of block row {br} holds a nonzero value; padding slots are zero"),
                        ));
                    }
                    continue;
                }
                if padding {
                    return Err(Error::invalid(
                        "block_indices",
                        format!("block row {br}: slot {s} holds a block after a padding slot (-1); padding comes last"),
                    ));
                }
                if c < I::ZERO || c.to_usize() >= block_cols {
                    return Err(Error::invalid(
                        "block_indices",
                        format!(
                            "block_indices[{k}] = {c:?} in block row {br} is outside the block columns 0..{block_cols} \
                             (or -1 for padding)"
                        ),
                    ));
                }
                if s > 0 && row[s - 1] >= c {
                    return Err(Error::invalid(
                        "block_indices",
                        format!("block row {br} is not strictly increasing at slot {s}"),
                    ));
                }
            }
        }
        check_padding_zero(self.rows, self.cols, b, &self.values, |k| {
            let c = self.block_indices[k];
            (c != I::MINUS_ONE).then(|| (k / self.width.max(1), c.to_usize()))
        })
    }

    /// The Blocked-ELL form of `a`: `width` = the most blocks of any block row (0 without
    /// blocks), real blocks first in each block row.
    pub fn from_bsr(a: &BsrHost<T, I>) -> Result<Self> {
        let b = a.block;
        let block_rows = a.block_rows();
        let width = (0..block_rows).map(|br| a.block_range(br).len()).max().unwrap_or(0);
        let slots = block_rows * width;
        check_sizes::<I>(a.rows, a.cols, slots)?;
        let mut block_indices = vec![I::MINUS_ONE; slots];
        let mut values = vec![T::default(); slots * b * b];
        for br in 0..block_rows {
            for (s, k) in a.block_range(br).enumerate() {
                let slot = br * width + s;
                block_indices[slot] = a.block_indices[k];
                values[slot * b * b..(slot + 1) * b * b].copy_from_slice(&a.values[k * b * b..(k + 1) * b * b]);
            }
        }
        Ok(BellHost {
            rows: a.rows,
            cols: a.cols,
            block: b,
            width,
            block_indices,
            values,
        })
    }

    /// The BSR form (padding slots dropped).
    pub fn to_bsr(&self) -> BsrHost<T, I> {
        let b = self.block;
        let mut block_offsets = vec![I::ZERO];
        let mut block_indices = Vec::new();
        let mut values = Vec::new();
        for br in 0..self.block_rows() {
            for s in 0..self.width {
                let k = br * self.width + s;
                let c = self.block_indices[k];
                if c != I::MINUS_ONE {
                    block_indices.push(c);
                    values.extend_from_slice(&self.values[k * b * b..(k + 1) * b * b]);
                }
            }
            block_offsets.push(I::from_usize_in_range(block_indices.len()));
        }
        BsrHost {
            rows: self.rows,
            cols: self.cols,
            block: b,
            block_offsets,
            block_indices,
            values,
        }
    }
}

/// Every stored entry outside the `rows x cols` matrix is zero; `block_of(k)` gives block `k`'s
/// (block row, block column), `None` for a slot to skip.
fn check_padding_zero<T: Element>(
    rows: usize,
    cols: usize,
    b: usize,
    values: &[T],
    block_of: impl Fn(usize) -> Option<(usize, usize)>,
) -> Result<()> {
    if rows % b == 0 && cols % b == 0 {
        return Ok(());
    }
    for k in 0..values.len() / (b * b) {
        let Some((br, bc)) = block_of(k) else { continue };
        if (br + 1) * b <= rows && (bc + 1) * b <= cols {
            continue;
        }
        for i in 0..b {
            for j in 0..b {
                let (r, c) = (br * b + i, bc * b + j);
                if (r >= rows || c >= cols) && values[k * b * b + i * b + j].to_f64() != 0.0 {
                    return Err(Error::invalid(
                        "values",
                        format!(
                            "block {k} holds a nonzero at ({r}, {c}), outside the {rows} x {cols} matrix; the padding \
                             of the last block row and column must be zero"
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}
