//! The integer types a sparse matrix stores its row offsets and column indices in: `i32` (the
//! default of cuSPARSE and of most kernels, half the index traffic) and `i64` (matrices with
//! more than `i32::MAX` nonzeros, rows or columns).
//!
//! Conversions to and from `usize` are O(1); the range checks live in the constructors of
//! [`CsrHost`](super::CsrHost), which reject matrices whose sizes do not fit the index type.

use crate::dtype::Element;

/// An index type of a sparse matrix (offsets and column indices).
///
/// Values stored in a validated matrix are never negative, so [`to_usize`](Self::to_usize)
/// is exact there; sizes above [`MAX_USIZE`](Self::MAX_USIZE) do not fit.
pub trait SparseIndex: Element + Copy + Ord + Send + Sync + std::fmt::Debug + 'static {
    /// The largest value of the type, as a `usize`.
    const MAX_USIZE: usize;
    /// Zero, to test indices for being negative.
    const ZERO: Self;
    /// Minus one: the block index of a padding block in Blocked-ELL (as cuSPARSE's).
    const MINUS_ONE: Self;
    /// The value as a `usize`. The caller guarantees `self >= 0` (checked in debug builds).
    fn to_usize(self) -> usize;
    /// `v` in this type, or `None` when `v > MAX_USIZE`.
    fn from_usize(v: usize) -> Option<Self>;
    /// `v` in this type where the caller has already checked `v <= MAX_USIZE` (checked in
    /// debug builds; a larger value would wrap, never cause undefined behaviour).
    fn from_usize_in_range(v: usize) -> Self;
}

impl SparseIndex for i32 {
    const MAX_USIZE: usize = i32::MAX as usize;
    const ZERO: Self = 0;
    const MINUS_ONE: Self = -1;
    fn to_usize(self) -> usize {
        debug_assert!(self >= 0, "negative sparse index {self}");
        self as usize
    }
    fn from_usize(v: usize) -> Option<Self> {
        i32::try_from(v).ok()
    }
    fn from_usize_in_range(v: usize) -> Self {
        debug_assert!(v <= Self::MAX_USIZE, "sparse index {v} does not fit i32");
        v as i32
    }
}

impl SparseIndex for i64 {
    const MAX_USIZE: usize = if (i64::MAX as u64) < usize::MAX as u64 {
        i64::MAX as usize
    } else {
        usize::MAX
    };
    const ZERO: Self = 0;
    const MINUS_ONE: Self = -1;
    fn to_usize(self) -> usize {
        debug_assert!(self >= 0, "negative sparse index {self}");
        self as usize
    }
    fn from_usize(v: usize) -> Option<Self> {
        i64::try_from(v).ok()
    }
    fn from_usize_in_range(v: usize) -> Self {
        debug_assert!(v <= Self::MAX_USIZE, "sparse index {v} does not fit i64");
        v as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_respect_the_range() {
        assert_eq!(i32::from_usize(5), Some(5));
        assert_eq!(i32::from_usize(i32::MAX as usize), Some(i32::MAX));
        assert_eq!(i32::from_usize(i32::MAX as usize + 1), None);
        assert_eq!(i64::from_usize(1 << 40), Some(1 << 40));
        assert_eq!(7i32.to_usize(), 7);
        assert_eq!((1i64 << 40).to_usize(), 1 << 40);
        assert_eq!(i32::MAX_USIZE, 2_147_483_647);
        assert_eq!(i64::MAX_USIZE as u64, i64::MAX as u64);
    }
}
