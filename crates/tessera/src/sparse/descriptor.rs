//! A structural summary of a CSR matrix ([`SparseDescriptor`]): the row-length distribution,
//! how clustered the columns of a row are, and how densely the nonzeros fill small square
//! blocks. SpMV/SpMM planning chooses kernels from it, and benchmarks print it beside timings.
//!
//! Cost: O(rows + nnz) for the row statistics and locality, plus a sort of the column-block
//! ids of each block-row for the block fills (O(nnz log(block-row nnz)) in all). Above a
//! million nonzeros the nonzero passes run on several threads (`std::thread::scope`) over
//! row ranges of about equal work.

use std::fmt;
use std::ops::Range;

use super::row_ranges::{split_rows, thread_count, PARALLEL_MIN_NNZ};
use super::{CsrHost, SparseIndex};
use crate::dtype::Element;

/// The square block sizes of [`SparseDescriptor::block_fill`], in order.
pub const BLOCK_SIZES: [usize; 5] = [2, 4, 8, 16, 32];

/// Columns of a 4-byte vector `x` that share one 128-byte cache line.
const COLUMNS_PER_LINE: usize = 32;

/// The structure of a sparse matrix, for choosing kernels and for reports.
#[derive(Clone, Debug, PartialEq)]
pub struct SparseDescriptor {
    pub rows: usize,
    pub cols: usize,
    pub nnz: usize,
    /// Mean row length, `nnz / rows` (0 without rows).
    pub avg_row: f64,
    /// 95th percentile of the row lengths (nearest rank: the smallest length that at least 95%
    /// of the rows do not exceed).
    pub p95_row: usize,
    /// Longest row.
    pub max_row: usize,
    /// Coefficient of variation of the row lengths: population standard deviation / mean, 0
    /// when the mean is 0.
    pub row_cv: f64,
    /// Rows without entries.
    pub empty_rows: usize,
    /// Of the pairs of consecutive entries within a row (in stored order), the fraction whose
    /// columns fall in the same 128-byte line of a 4-byte `x` (`c1 / 32 == c0 / 32`); 0 when
    /// no row has two entries.
    pub col_locality: f64,
    /// For each block size `b` of [`BLOCK_SIZES`]: `nnz / (blocks * b * b)`, where `blocks`
    /// counts the distinct aligned `b x b` blocks holding at least one entry (0 without
    /// entries). 1 means the nonzeros tile `b x b` blocks exactly.
    pub block_fill: [f64; 5],
}

/// The nonzero-pass counts of one row range.
#[derive(Default)]
struct RangeCounts {
    /// Consecutive entry pairs within rows.
    pairs: usize,
    /// Of those, pairs in the same cache line of `x`.
    local_pairs: usize,
    /// Distinct nonempty blocks for each of [`BLOCK_SIZES`].
    blocks: [usize; 5],
}

impl SparseDescriptor {
    /// Summarises `a` (see the module documentation for the cost).
    pub fn of<T: Element, I: SparseIndex>(a: &CsrHost<T, I>) -> Self {
        let rows = a.rows;
        let lengths: Vec<usize> = (0..rows).map(|r| a.row_len(r)).collect();
        let counts = if a.nnz() > PARALLEL_MIN_NNZ {
            let ranges = split_rows(&a.offsets, thread_count(), BLOCK_SIZES[4]);
            std::thread::scope(|scope| {
                let handles: Vec<_> = ranges
                    .into_iter()
                    .map(|range| scope.spawn(move || count_range(a, range)))
                    .collect();
                let mut total = RangeCounts::default();
                for handle in handles {
                    let part = handle.join().expect("descriptor worker thread panicked");
                    total.pairs += part.pairs;
                    total.local_pairs += part.local_pairs;
                    for (t, p) in total.blocks.iter_mut().zip(part.blocks) {
                        *t += p;
                    }
                }
                total
            })
        } else {
            count_range(a, 0..rows)
        };
        Self::from_counts(a.cols, lengths, counts.pairs, counts.local_pairs, counts.blocks)
    }

    /// The descriptor of a `lengths.len() x cols` matrix with rows of `lengths` nonzeros, given
    /// its nonzero-pass counts: `pairs` consecutive entry pairs within rows, `local_pairs` of
    /// them within one 32-column line, and `blocks[s]` distinct nonempty aligned blocks of side
    /// `BLOCK_SIZES[s]` (what [`of`](Self::of) counts on the host and the device conversions
    /// count on the device).
    pub fn from_counts(cols: usize, lengths: Vec<usize>, pairs: usize, local_pairs: usize, blocks: [usize; 5]) -> Self {
        let rows = lengths.len();
        let nnz: usize = lengths.iter().sum();
        let avg_row = if rows == 0 { 0.0 } else { nnz as f64 / rows as f64 };
        let max_row = lengths.iter().copied().max().unwrap_or(0);
        let empty_rows = lengths.iter().filter(|&&n| n == 0).count();
        let row_cv = if avg_row == 0.0 {
            0.0
        } else {
            let variance = lengths.iter().map(|&n| (n as f64 - avg_row).powi(2)).sum::<f64>() / rows as f64;
            variance.sqrt() / avg_row
        };
        let p95_row = percentile_95(lengths);
        let col_locality = if pairs == 0 {
            0.0
        } else {
            local_pairs as f64 / pairs as f64
        };
        let mut block_fill = [0.0; 5];
        for ((fill, &count), b) in block_fill.iter_mut().zip(&blocks).zip(BLOCK_SIZES) {
            if count > 0 {
                *fill = nnz as f64 / (count as f64 * (b * b) as f64);
            }
        }
        SparseDescriptor {
            rows,
            cols,
            nnz,
            avg_row,
            p95_row,
            max_row,
            row_cv,
            empty_rows,
            col_locality,
            block_fill,
        }
    }

    /// The block fill for block size `b`, or `None` if `b` is not one of [`BLOCK_SIZES`].
    pub fn fill_at(&self, b: usize) -> Option<f64> {
        BLOCK_SIZES.iter().position(|&s| s == b).map(|k| self.block_fill[k])
    }
}

/// The nearest-rank 95th percentile of `lengths` (0 when empty). O(len).
fn percentile_95(mut lengths: Vec<usize>) -> usize {
    if lengths.is_empty() {
        return 0;
    }
    let rank = (lengths.len() * 95).div_ceil(100).max(1);
    *lengths.select_nth_unstable(rank - 1).1
}

/// Locality and block counts of rows `range`, whose start is a multiple of every block size.
fn count_range<T: Element, I: SparseIndex>(a: &CsrHost<T, I>, range: Range<usize>) -> RangeCounts {
    let mut counts = RangeCounts::default();
    for r in range.clone() {
        let cols = a.row(r).0;
        counts.pairs += cols.len().saturating_sub(1);
        counts.local_pairs += cols
            .windows(2)
            .filter(|w| w[0].to_usize() / COLUMNS_PER_LINE == w[1].to_usize() / COLUMNS_PER_LINE)
            .count();
    }
    let mut block_cols = Vec::new();
    for (count, b) in counts.blocks.iter_mut().zip(BLOCK_SIZES) {
        for block_start in range.clone().step_by(b) {
            block_cols.clear();
            for r in block_start..(block_start + b).min(range.end) {
                for &c in a.row(r).0 {
                    let block_col = c.to_usize() / b;
                    // skipping runs keeps the sort short for rows with sorted columns
                    if block_cols.last() != Some(&block_col) {
                        block_cols.push(block_col);
                    }
                }
            }
            block_cols.sort_unstable();
            block_cols.dedup();
            *count += block_cols.len();
        }
    }
    counts
}

impl fmt::Display for SparseDescriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}x{} nnz {} row avg {:.1} p95 {} max {} cv {:.2} empty {} locality {:.2} fill@16 {:.3}",
            self.rows,
            self.cols,
            self.nnz,
            self.avg_row,
            self.p95_row,
            self.max_row,
            self.row_cv,
            self.empty_rows,
            self.col_locality,
            self.block_fill[3]
        )
    }
}
