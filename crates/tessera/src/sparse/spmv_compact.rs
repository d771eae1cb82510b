//! 16-bit column indices for the CSR SpMV row kernels (`spmv_csr.cu` compiled with
//! `TS_SPMV_COMPACT_COLUMNS`). A matrix of at most 65536 columns can keep, beside its own
//! indices, a copy of them narrowed to `u16`: the row, binned and long-row kernels then stream
//! `sizeof(Val) + 2` bytes per nonzero instead of `sizeof(Val) + sizeof(Idx)` (fp32 with i32
//! indices: 6 bytes instead of 8, 25% less), which is most of the traffic of a memory-bound SpMV
//! whose `x` stays in L1/L2 (the tall least-squares matrices, 256^2 tomography).
//!
//! The copy ([`CompactColumns`]) is a device conversion (`convert::compact_columns`: the
//! column-panel layout's 16-bit column kernel with one panel), made once per matrix on the first
//! use by a plan that wants it and cached on the matrix
//! ([`CsrMatrix::compact_columns`](super::CsrMatrix::compact_columns)). It depends on the
//! sparsity pattern only, which nothing changes after construction (`update_values` replaces
//! values, never indices), so it outlives `update_values`; the plans that read it are remade.
//! Offsets and values stay the matrix's own. It costs 2 bytes per nonzero of device memory.
//!
//! Not yet run on a GPU, so off by default ([`COMPACT_BY_DEFAULT`]): a plan reads 16-bit
//! columns only when [`SpmvTuning::compact_columns`](super::SpmvTuning::compact_columns) asks,
//! and the autotuner tries them where [`compact_columns_pay`] says they could pay. Once measured,
//! the rule is that function.

use super::convert::ConversionReport;
use super::index::SparseIndex;
use super::spmv::SpmvTuning;
use crate::error::{Error, Result};
use crate::runtime::DeviceBuffer;

/// Columns a matrix may have for its column indices to fit 16 bits (columns `0..=65535`).
pub const MAX_COMPACT_COLS: usize = 1 << 16;

/// Whether the rules apply [`compact_columns_pay`] when the tuning leaves the choice open.
/// False until a GPU run has verified and timed the 16-bit kernels (sparse/NOTES.md: the
/// `tessera-compact` bench rows beside the default ones).
pub const COMPACT_BY_DEFAULT: bool = false;

/// The rule takes 16-bit columns from this many nonzeros on: below it the streams of indices
/// and values are too short to be bandwidth bound (launch and tail latency dominate), so
/// narrowing them would buy nothing for its 2 bytes per nonzero. Not measured: 2^20 nonzeros
/// (8 MiB of fp32 values and i32 indices) is a starting point, to be placed by the
/// `tessera-compact` bench rows (sparse/NOTES.md).
pub const COMPACT_MIN_NNZ: usize = 1 << 20;

/// Whether the rules give the row kernels 16-bit columns on a matrix of `cols` columns and
/// `nnz` nonzeros: the columns fit 16 bits (`cols <= 65536`) and the matrix is large enough to
/// be bandwidth bound ([`COMPACT_MIN_NNZ`]). The plan applies it only where it runs the row
/// kernels (row, binned, long-row), never with column panels or the merge path, which have
/// their own layouts (SELL is a separate matrix type).
pub fn compact_columns_pay(cols: usize, nnz: usize) -> bool {
    cols <= MAX_COMPACT_COLS && nnz >= COMPACT_MIN_NNZ
}

/// Checks that a matrix of `cols` columns can take 16-bit columns.
pub fn check_compact_cols(cols: usize) -> Result<()> {
    if cols > MAX_COMPACT_COLS {
        return Err(Error::invalid(
            "tuning.compact_columns",
            format!(
                "16-bit column indices need at most {MAX_COMPACT_COLS} columns (indices 0..=65535); \
                 the matrix has {cols}"
            ),
        ));
    }
    Ok(())
}

/// Whether an SpMV plan of `tuning` for a matrix of `cols` columns and `nnz` nonzeros reads
/// 16-bit columns, if it runs the row kernels: `Some(true)` forces them (an error on a matrix of
/// more than 65536 columns, or with the merge path or forced column panels: their kernels have
/// layouts of their own), `Some(false)` never, `None` where [`compact_columns_pay`] once
/// [`COMPACT_BY_DEFAULT`] is on (off until measured: never).
pub fn compact_columns_choice(tuning: &SpmvTuning, cols: usize, nnz: usize) -> Result<bool> {
    match tuning.compact_columns {
        Some(false) => Ok(false),
        Some(true) => {
            if tuning.merge_path || tuning.panel_width.is_some_and(|w| w > 0) {
                return Err(Error::invalid(
                    "tuning",
                    format!(
                        "compact_columns is an option of the row kernels; it takes no merge_path or panel_width \
                         (got {}, {:?})",
                        tuning.merge_path, tuning.panel_width
                    ),
                ));
            }
            check_compact_cols(cols)?;
            Ok(true)
        }
        None => Ok(COMPACT_BY_DEFAULT && compact_columns_pay(cols, nnz)),
    }
}

/// The column indices of a host matrix narrowed to 16 bits, as the device conversion makes
/// them (the reference of `tessera verify sparse`, bit for bit); an error when `cols > 65536`.
pub fn compact_columns_host<I: SparseIndex>(indices: &[I], cols: usize) -> Result<Vec<u16>> {
    check_compact_cols(cols)?;
    Ok(indices.iter().map(|&c| c.to_usize() as u16).collect())
}

/// A matrix's column indices narrowed to 16 bits, on the device (made by
/// `convert::compact_columns`, cached by
/// [`CsrMatrix::compact_columns`](super::CsrMatrix::compact_columns)).
pub struct CompactColumns {
    /// 2 bytes per nonzero, little-endian (at least 2 bytes allocated).
    columns: DeviceBuffer<u8>,
    nnz: usize,
    /// The pattern identity of the matrix they were made from (see `CsrMatrix::pattern`).
    pattern: u64,
    report: ConversionReport,
}

impl std::fmt::Debug for CompactColumns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompactColumns")
            .field("nnz", &self.nnz)
            .field("report", &self.report)
            .finish()
    }
}

impl CompactColumns {
    pub(crate) fn new(columns: DeviceBuffer<u8>, nnz: usize, pattern: u64, report: ConversionReport) -> Self {
        debug_assert!(columns.len() >= 2 * nnz);
        CompactColumns {
            columns,
            nnz,
            pattern,
            report,
        }
    }

    /// Nonzeros (one 16-bit column each).
    pub fn nnz(&self) -> usize {
        self.nnz
    }

    /// What the conversion cost (`bytes`: 2 per nonzero, at least 2).
    pub fn report(&self) -> &ConversionReport {
        &self.report
    }

    /// Device bytes kept beside the matrix.
    pub fn bytes(&self) -> usize {
        self.columns.bytes()
    }

    /// The columns on the host (for verification).
    pub fn to_host(&self) -> Result<Vec<u16>> {
        let bytes = self.columns.to_host()?;
        Ok(bytes[..2 * self.nnz]
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect())
    }

    pub(crate) fn device_ptr(&self) -> u64 {
        self.columns.device_ptr()
    }

    pub(crate) fn pattern(&self) -> u64 {
        self.pattern
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::sparse::CsrHost;

    fn is_invalid(r: Result<impl std::fmt::Debug>, arg_want: &str, says: &str) -> bool {
        match r {
            Err(Error::InvalidArgument { arg, rule }) => arg == arg_want && rule.contains(says),
            _ => false,
        }
    }

    #[test]
    fn narrowing_keeps_every_column_up_to_65535() {
        // 3 x 65536 with column 65535 present, i32 and i64 indices
        let a = CsrHost::<f32, i32> {
            rows: 3,
            cols: 65536,
            offsets: vec![0, 3, 3, 5],
            indices: vec![65535, 0, 256, 65534, 1],
            values: vec![1.0; 5],
            sorted: false,
        };
        a.validate().unwrap();
        let want: Vec<u16> = vec![65535, 0, 256, 65534, 1];
        assert_eq!(compact_columns_host(&a.indices, a.cols).unwrap(), want);
        let wide: Vec<i64> = a.indices.iter().map(|&c| c as i64).collect();
        assert_eq!(compact_columns_host(&wide, a.cols).unwrap(), want);
        // the narrowed columns address the same x entries
        for (&c, &n) in a.indices.iter().zip(&want) {
            assert_eq!(c as usize, n as usize);
        }
    }

    #[test]
    fn narrowing_refuses_more_than_65536_columns() {
        assert!(check_compact_cols(65536).is_ok());
        assert!(is_invalid(check_compact_cols(65537), "tuning.compact_columns", "65536"));
        assert!(is_invalid(
            compact_columns_host::<i32>(&[65536], 65537),
            "tuning.compact_columns",
            "the matrix has 65537"
        ));
    }

    #[test]
    fn narrowing_of_empty_matrices() {
        // 0 x 0, 0 x 10, and 513 x 300 with nnz = 0
        assert!(compact_columns_host::<i32>(&[], 0).unwrap().is_empty());
        assert!(compact_columns_host::<i64>(&[], 10).unwrap().is_empty());
        let z = CsrHost::<f64, i64> {
            rows: 513,
            cols: 300,
            offsets: vec![0; 514],
            indices: vec![],
            values: vec![],
            sorted: true,
        };
        z.validate().unwrap();
        assert!(compact_columns_host(&z.indices, z.cols).unwrap().is_empty());
    }

    #[test]
    fn rule_wants_narrow_large_matrices() {
        let big = COMPACT_MIN_NNZ;
        // the tall least-squares matrices and 256^2 tomography, A and A^T where narrow
        assert!(compact_columns_pay(23_394, 19_657_323));
        assert!(compact_columns_pay(6177, 5_510_448));
        assert!(compact_columns_pay(65_536, 15_020_000));
        assert!(compact_columns_pay(65_340, 15_020_000));
        // too wide: the transposes of the tall matrices, 512^2 tomography
        assert!(!compact_columns_pay(936_063, 19_657_323));
        assert!(!compact_columns_pay(306_136, 5_510_448));
        assert!(!compact_columns_pay(65_537, big));
        // boundaries: 65536 columns and 2^20 nonzeros are in, one less nonzero is out
        assert!(compact_columns_pay(MAX_COMPACT_COLS, big));
        assert!(!compact_columns_pay(MAX_COMPACT_COLS, big - 1));
        assert!(!compact_columns_pay(100, 0));
    }

    #[test]
    fn choice_follows_the_tuning() {
        let t = |c| SpmvTuning {
            compact_columns: c,
            ..SpmvTuning::default()
        };
        let big = COMPACT_MIN_NNZ;
        // None: the rule where it is on by default (off until measured: never)
        assert_eq!(
            compact_columns_choice(&t(None), 65_536, big).unwrap(),
            COMPACT_BY_DEFAULT
        );
        assert!(!compact_columns_choice(&t(None), 65_536, big - 1).unwrap());
        assert!(!compact_columns_choice(&t(None), 65_537, big).unwrap());
        // Some(false): never, whatever the matrix
        assert!(!compact_columns_choice(&t(Some(false)), 100, big).unwrap());
        assert!(!compact_columns_choice(&t(Some(false)), 1 << 20, big).unwrap());
        // Some(true): on small matrices too, and nnz = 0; refused where columns need 17 bits
        assert!(compact_columns_choice(&t(Some(true)), 65_536, 0).unwrap());
        assert!(compact_columns_choice(&t(Some(true)), 0, 0).unwrap());
        assert!(is_invalid(
            compact_columns_choice(&t(Some(true)), 65_537, 10),
            "tuning.compact_columns",
            "at most 65536 columns"
        ));
        // row-kernel knobs combine with it; the merge path and forced panels do not
        let with_lanes = SpmvTuning {
            lanes: Some(4),
            long_threshold: Some(0),
            binned: true,
            ..t(Some(true))
        };
        assert!(compact_columns_choice(&with_lanes, 1000, 10).unwrap());
        let merge = SpmvTuning {
            merge_path: true,
            ..t(Some(true))
        };
        assert!(is_invalid(
            compact_columns_choice(&merge, 1000, 10),
            "tuning",
            "merge_path"
        ));
        let panels = SpmvTuning {
            panel_width: Some(1000),
            ..t(Some(true))
        };
        assert!(is_invalid(
            compact_columns_choice(&panels, 1000, 10),
            "tuning",
            "panel_width"
        ));
        let never_panels = SpmvTuning {
            panel_width: Some(0),
            ..t(Some(true))
        };
        assert!(compact_columns_choice(&never_panels, 1000, 10).unwrap());
    }
}
