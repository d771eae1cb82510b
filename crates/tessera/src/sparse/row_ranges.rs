//! Splits the rows of a CSR matrix into contiguous ranges of about equal work, for the
//! row-parallel host passes (column sorting, descriptors) run with `std::thread::scope`.
//!
//! The work of a row is `1 + its length`, so both many short rows and a few long rows are
//! balanced. Splitting is O(parts * log rows) (binary searches over the offsets).

use std::ops::Range;

use super::SparseIndex;

/// Nonzeros above which the row-parallel host passes use several threads.
pub(crate) const PARALLEL_MIN_NNZ: usize = 1 << 20;

/// The number of threads the row-parallel host passes use: the available parallelism.
pub(crate) fn thread_count() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Splits rows `0..offsets.len() - 1` into at most `parts` nonempty contiguous ranges of about
/// equal work. Every boundary except the final `rows` is a multiple of `align` (so that blocks
/// of `align` rows never straddle two ranges). No rows gives no ranges.
pub(crate) fn split_rows<I: SparseIndex>(offsets: &[I], parts: usize, align: usize) -> Vec<Range<usize>> {
    let rows = offsets.len().saturating_sub(1);
    let align = align.max(1);
    let work_before = |r: usize| r + offsets[r].to_usize();
    let total = work_before(rows);
    let parts = parts.max(1);
    let mut ranges = Vec::with_capacity(parts);
    let mut start = 0;
    for k in 1..=parts {
        let end = if k == parts {
            rows
        } else {
            let target = (total as u128 * k as u128 / parts as u128) as usize;
            let r = partition_point(rows, |r| work_before(r) < target);
            (r / align * align).min(rows)
        };
        if end > start {
            ranges.push(start..end);
            start = end;
        }
    }
    ranges
}

/// The first `r` in `0..=rows` for which `before(r)` is false (`before` is monotone).
fn partition_point(rows: usize, before: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0, rows);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if before(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_all_rows_aligned_and_balanced() {
        // 100 rows of length 1, then one row of length 1000
        let mut offsets: Vec<i32> = (0..=100).collect();
        offsets.push(1100);
        let ranges = split_rows(&offsets, 4, 32);
        assert_eq!(ranges.first().unwrap().start, 0);
        assert_eq!(ranges.last().unwrap().end, 101);
        for w in ranges.windows(2) {
            assert_eq!(w[0].end, w[1].start);
            assert_eq!(w[0].end % 32, 0);
        }
        assert!(split_rows::<i32>(&[0], 4, 32).is_empty());
        assert_eq!(split_rows::<i64>(&[0, 3, 5], 8, 1), vec![0..1, 1..2]);
    }
}
