//! CSR SpMV, `y = alpha * A x + beta * y`: the plan (which kernels, lanes per row, the long-row
//! segments) made once per matrix from its row lengths, and the launch (`spmv_csr.cu`).
//!
//! Dispatch. Rows of up to `long_threshold` nonzeros go to `spmv_csr_rows`, a group of `lanes`
//! lanes per row, `lanes` the power of two nearest half the mean length of those rows (clamped
//! to 1..=32), so each lane takes about two nonzeros per row; twice that (one nonzero per lane)
//! when the columns are scattered, half (short rows) when they are nearly consecutive, and at
//! most 16 on matrices of few rows
//! ([`choose_spmv_shape`]). Rows longer than the threshold
//! (32 x that mean, at least 1024) go to `spmv_csr_long_rows`, cut into segments of
//! [`SEGMENT_NNZ`] nonzeros, one CTA each. Both kernels are deterministic: every row is summed
//! in one fixed order, so repeated calls give bitwise identical y.
//!
//! Wide matrices (at least 64 panels of x and four nonzeros per panel row on average,
//! [`panels_pay`]: the transposes of the widest tall least-squares matrices) take the
//! column-panel kernels instead ([`spmv_panels`](super::spmv_panels)): x staged a panel at a
//! time in shared memory, 16-bit columns, the panels' partial rows summed in panel order.
//!
//! Opt-in until measured ([`SpmvTuning::compact_columns`]; the autotuner tries it where
//! [`compact_columns_pay`] holds: at most 65536 columns and at least
//! [`COMPACT_MIN_NNZ`](super::spmv_compact::COMPACT_MIN_NNZ) nonzeros, e.g. the tall
//! least-squares matrices, 256^2 tomography and its transpose): the row kernels read the
//! columns narrowed to 16 bits ([`spmv_compact`](super::spmv_compact)), 2 bytes per nonzero
//! less to stream, from a copy made once and cached on the matrix.
//!
//! Opt-in ([`SpmvTuning::merge_path`]): the merge-path kernels (`spmv_merge.cu`,
//! [`spmv_merge`](super::spmv_merge)), nonzeros and row ends balanced across threads whatever the
//! row lengths, for power-law matrices; deterministic as well.

use std::sync::Arc;

use super::device::{check_planned, check_spmv_operands, CsrMatrix};
use super::index::SparseIndex;
use super::spmv_compact::{compact_columns_choice, compact_columns_pay, CompactColumns, COMPACT_BY_DEFAULT};
use super::spmv_merge::MergePath;
use super::spmv_panels::{default_panel_width, panels_pay, PanelPath};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::runtime::{Context, DeviceBuffer, Kernel, KernelKey, KernelParams, KernelSpec, LaunchConfig};

/// Source of the SpMV kernels.
pub const SOURCE: &str = include_str!("spmv_csr.cu");
/// The CSR SpMV kernels' own device header (loads of indices, values and x; the store of y),
/// shared by `spmv_csr.cu` and `spmv_merge.cu`.
pub const SPMV_HEADERS: &[(&str, &str)] = &[("tessera/spmv_load.cuh", include_str!("spmv_load.cuh"))];
/// Threads per CTA of both kernels.
pub const BLOCK_THREADS: u32 = 256;
/// Nonzeros per CTA of the long-row kernel.
pub const SEGMENT_NNZ: usize = 4096;
/// Rows of more nonzeros than this are always long.
const MIN_LONG_THRESHOLD: usize = 1024;
/// Rows of more than this many times the mean short-row length are long.
const LONG_FACTOR: f64 = 32.0;
/// Below this column locality (the descriptor's share of consecutive entries in one 128-byte
/// line of `x`) a row's gathers are scattered: the SpMV gives each lane one nonzero per row,
/// not two, so that a warp has twice the independent gathers in flight.
const SCATTERED_LOCALITY: f64 = 0.25;
/// At or above this column locality (banded and stencil matrices: a row's columns are nearly
/// consecutive, so its lanes read the same few lines of `x`) short rows take half the lanes,
/// about four nonzeros per lane: twice the rows per warp and the same lines read (fitted to the
/// autotuner's choice on the banded bench matrix, locality 0.97: 2 lanes 15% faster than 4;
/// the tall least-squares matrices, 0.88, keep theirs).
const CONTIGUOUS_LOCALITY: f64 = 0.95;
/// The most lanes per row [`CONTIGUOUS_LOCALITY`] halves (short rows only).
const CONTIGUOUS_MAX_LANES: u32 = 8;
/// Matrices of fewer rows than this get at most 16 lanes per row in the SpMV: two rows per
/// warp and twice the nonzeros per lane beat one row per warp on rows of hundreds of
/// nonzeros when the rows are few (tall least-squares transposes, 256^2 tomography).
const FEW_ROWS: usize = 1 << 17;

/// Tuning knobs for benchmarks and tests; the defaults are the dispatcher's choice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SpmvTuning {
    /// Lanes per row of the row kernel (1, 2, 4, 8, 16 or 32); `None`: from the row lengths.
    pub lanes: Option<u32>,
    /// Rows of more nonzeros take the long-row kernel; `None`: from the row lengths.
    /// `Some(usize::MAX)` keeps every row in the row kernel.
    pub long_threshold: Option<usize>,
    /// Bin the short rows by length (2-32 lanes per row by length, one launch). Opt-in until
    /// measured; `lanes` is ignored with it.
    pub binned: bool,
    /// The merge-path kernels instead of the row kernels: every thread takes the same number of
    /// row ends and nonzeros (Merrill & Garland 2016), for row lengths of any spread. Opt-in and
    /// not among the autotuner's candidates: on the H100 it tied the row kernels on power-law
    /// rows and lost on every other bench matrix (sparse/NOTES.md). Takes no `lanes`,
    /// `long_threshold` or `binned`.
    pub merge_path: bool,
    /// The column-panel kernels ([`spmv_panels`](super::spmv_panels)): `Some(w)` panels of `w`
    /// columns (`1..=65536`; x's panel must fit a CTA's shared memory), `Some(0)` never,
    /// `None` where the rules take them ([`panels_pay`]: wide matrices, with no other knob
    /// set). Takes no `lanes`, `long_threshold`, `binned` or `merge_path`.
    pub panel_width: Option<usize>,
    /// 16-bit column indices in the row kernels (row, binned and long-row;
    /// [`spmv_compact`](super::spmv_compact)): `Some(true)` always (an `InvalidArgument` error
    /// on a matrix of more than 65536 columns, or with `merge_path` or a forced `panel_width`),
    /// `Some(false)` never, `None` the rules' choice: never until a GPU run has measured them
    /// ([`COMPACT_BY_DEFAULT`](super::spmv_compact::COMPACT_BY_DEFAULT); then
    /// [`compact_columns_pay`]: at most 65536 columns and at least
    /// [`COMPACT_MIN_NNZ`](super::spmv_compact::COMPACT_MIN_NNZ) nonzeros, on the row kernels
    /// only). Combines with `lanes`, `long_threshold` and `binned`.
    pub compact_columns: Option<bool>,
}

/// Options of an SpMV plan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SpmvOptions {
    pub tuning: SpmvTuning,
}

/// Which kernel variant: its specialisation constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SpmvVariant {
    pub value: DType,
    pub index: DType,
    /// Lanes per row (row kernel); 0 for the long-row kernel, [`BINNED`] for the binned one.
    pub lanes: u32,
    /// Columns read as 16 bits (`TS_SPMV_COMPACT_COLUMNS`) instead of as `index`.
    pub compact: bool,
}

/// [`SpmvVariant::lanes`] of the binned kernel.
pub const BINNED: u32 = u32::MAX;
/// Lanes per row of the binned kernel's bins.
pub const BIN_LANES: [u32; 5] = [2, 4, 8, 16, 32];

/// The bin of a row of `len` nonzeros: about four per lane.
pub fn bin_of(len: usize) -> usize {
    BIN_LANES
        .iter()
        .position(|&l| len <= 4 * l as usize)
        .unwrap_or(BIN_LANES.len() - 1)
}

impl SpmvVariant {
    pub fn key(&self) -> KernelKey {
        let family = match self.lanes {
            0 => "spmv_csr_long",
            BINNED => "spmv_csr_binned",
            _ => "spmv_csr_rows",
        };
        KernelKey::new(family)
            .ty("Val", self.value)
            .ty("Idx", self.index)
            .int("kLanes", "l", self.lanes.clamp(1, 32))
            .int("kBlockThreads", "t", BLOCK_THREADS)
            .int("kSegmentNnz", "s", SEGMENT_NNZ as i64)
            .define("TS_SPMV_COMPACT_COLUMNS", "c16", self.compact)
    }
    pub fn spec(&self) -> KernelSpec {
        let entry = match self.lanes {
            0 => "spmv_csr_long_rows",
            BINNED => "spmv_csr_binned",
            _ => "spmv_csr_rows",
        };
        self.key().spec("spmv_csr.cu", SOURCE, entry, SPMV_HEADERS)
    }
}

/// Every variant, for the compile tests and `tessera compile`.
pub fn all_variants() -> Vec<SpmvVariant> {
    let mut v = Vec::new();
    for value in super::device::VALUE_DTYPES {
        for index in [DType::I32, DType::I64] {
            for lanes in [0, 1, 2, 4, 8, 16, 32, BINNED] {
                for compact in [false, true] {
                    v.push(SpmvVariant {
                        value,
                        index,
                        lanes,
                        compact,
                    });
                }
            }
        }
    }
    v
}

/// A device-side condition under which a product does nothing: the f64 at `index` of a device
/// buffer, read by the kernels when they run (not when they are queued); not zero skips the call
/// and leaves `y` as it was. For loops that queue products ahead of a stop decided on the device
/// (LSMR's stop flag): a skipped product costs its launch, not a pass over the matrix.
#[derive(Clone, Copy, Debug)]
pub struct SkipIf<'a> {
    flag: &'a DeviceBuffer<f64>,
    index: usize,
}

impl<'a> SkipIf<'a> {
    /// The flag `flag[index]`; `index` must be in the buffer.
    pub fn new(flag: &'a DeviceBuffer<f64>, index: usize) -> Result<Self> {
        if index >= flag.len() {
            return Err(Error::invalid(
                "skip flag",
                format!("index {index} of a buffer of {} elements", flag.len()),
            ));
        }
        Ok(SkipIf { flag, index })
    }

    /// The flag's device address (in the buffer: checked by `new`).
    pub(crate) fn device_ptr(&self) -> u64 {
        self.flag.device_ptr() + (self.index * std::mem::size_of::<f64>()) as u64
    }
}

/// The kernels' `skip` pointer of an optional flag (0: never skip).
pub(crate) fn skip_ptr(skip: Option<SkipIf<'_>>) -> u64 {
    skip.map_or(0, |s| s.device_ptr())
}

/// `struct SpmvParams` of spmv_csr.cu (176 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct SpmvParams {
    offsets: u64,
    indices: u64,
    values: u64,
    x: u64,
    y: u64,
    rows: i64,
    long_threshold: i64,
    alpha: f64,
    beta: f64,
    long_rows: u64,
    segment_row: u64,
    segment_first: u64,
    partials: u64,
    row_done: u64,
    bin_rows: u64,
    skip: u64,
    bin_first_cta: [i32; 6],
    bin_first_row: [i32; 6],
}
const _: () = assert!(std::mem::size_of::<SpmvParams>() == 176);
// SAFETY: #[repr(C)]: 16 eight-byte fields (pointers as u64, i64, f64) then two arrays of six
// i32, in the order and of the types of the kernel's struct (pointers, long long, double, int).
unsafe impl KernelParams for SpmvParams {}

/// The long rows and their segments, on the device.
struct LongRows {
    count: usize,
    segments: usize,
    rows: DeviceBuffer<i64>,
    segment_row: DeviceBuffer<i32>,
    segment_first: DeviceBuffer<i32>,
    /// f64 slots (f32 kernels use the first half of the bytes).
    partials: DeviceBuffer<f64>,
    row_done: DeviceBuffer<i32>,
    kernel: Arc<Kernel>,
}

/// The short rows by bin, on the device.
struct Bins {
    rows: DeviceBuffer<i64>,
    first_cta: [i32; 6],
    first_row: [i32; 6],
}

/// A planned SpMV for one matrix: made by [`CsrMatrix::spmv_plan`] (cached) or
/// [`SpmvPlan::new`].
pub struct SpmvPlan {
    ctx: Context,
    value: DType,
    index: DType,
    rows: usize,
    cols: usize,
    nnz: usize,
    lanes: u32,
    long_threshold: usize,
    kernels: SpmvKernels,
}

/// What an SpMV plan launches.
enum SpmvKernels {
    /// The row kernel (or the binned one), then the long-row kernel where rows are long; with
    /// `compact`, both read the matrix's 16-bit columns instead of its indices.
    Rows {
        kernel: Arc<Kernel>,
        bins: Option<Bins>,
        long: Option<LongRows>,
        compact: Option<Arc<CompactColumns>>,
    },
    /// The merge-path kernels (opt-in).
    MergePath(MergePath),
    /// The column-panel kernels.
    Panels(PanelPath),
}

impl std::fmt::Debug for SpmvPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpmvPlan")
            .field("value", &self.value)
            .field("index", &self.index)
            .field("lanes", &self.lanes)
            .field("long_threshold", &self.long_threshold)
            .field("path", &self.path())
            .field("long_rows", &self.long_rows())
            .finish()
    }
}

/// (lanes, long threshold) for rows of lengths `lengths`: the threshold from the mean length
/// (taken twice: first over every row, then over the rows below the first threshold, so a few
/// huge rows do not inflate it), the lanes from the mean of the rows up to the threshold.
pub fn choose_shape(lengths: &[usize], tuning: &SpmvTuning) -> (u32, usize) {
    let mean_upto = |cap: usize| {
        let (n, s) = lengths
            .iter()
            .filter(|&&l| l <= cap)
            .fold((0usize, 0usize), |(n, s), &l| (n + 1, s + l));
        if n == 0 {
            0.0
        } else {
            s as f64 / n as f64
        }
    };
    let threshold_for = |mean: f64| ((mean * LONG_FACTOR) as usize).max(MIN_LONG_THRESHOLD);
    let threshold = tuning
        .long_threshold
        .unwrap_or_else(|| threshold_for(mean_upto(threshold_for(mean_upto(usize::MAX)))));
    let lanes = tuning.lanes.unwrap_or_else(|| {
        let half = (mean_upto(threshold) / 2.0).max(1.0);
        // the power of two nearest half the mean (rounded in log2)
        1 << (half.log2().round().clamp(0.0, 5.0) as u32)
    });
    (lanes, threshold)
}

/// (lanes, long threshold) of the SpMV plan: [`choose_shape`], then refined by the matrix's
/// column locality and row count (rules fitted to the autotuner's choices on the benchmark
/// matrices, see sparse/NOTES.md): scattered columns take about one nonzero per lane instead of
/// two, nearly consecutive ones (short rows) about four, and matrices of fewer than
/// [`FEW_ROWS`] rows at most 16 lanes. Forced lanes
/// (`tuning.lanes`) are kept as given.
pub fn choose_spmv_shape(lengths: &[usize], col_locality: f64, tuning: &SpmvTuning) -> (u32, usize) {
    let (lanes, threshold) = choose_shape(lengths, tuning);
    if tuning.lanes.is_some() {
        return (lanes, threshold);
    }
    let (count, sum) = lengths
        .iter()
        .filter(|&&l| l <= threshold)
        .fold((0usize, 0usize), |(n, s), &l| (n + 1, s + l));
    // twice the lanes only while each keeps about one nonzero per row
    let doubled = (lanes * 2).min(32);
    let fills = count > 0 && (doubled as usize) * count <= sum;
    let lanes = if col_locality < SCATTERED_LOCALITY && fills {
        doubled
    } else if col_locality >= CONTIGUOUS_LOCALITY && lanes <= CONTIGUOUS_MAX_LANES {
        (lanes / 2).max(1)
    } else {
        lanes
    };
    let lanes = if lengths.len() < FEW_ROWS { lanes.min(16) } else { lanes };
    (lanes, threshold)
}

/// The SpMV choices [`CsrMatrix::autotune_spmv`](super::CsrMatrix::autotune_spmv) times for
/// rows of `lengths`: the rules' tuning (default) first, then the row kernel with half and twice
/// its lanes per row (where they exist), then the binned kernel; at most four, all with the
/// rules' long-row threshold. Where the rules take column panels ([`panels_pay`], for a matrix
/// of `cols` columns and `value` entries), the row kernel with the rules' lanes comes second
/// (five in all); where 16-bit columns could pay ([`compact_columns_pay`]), the rules' choice
/// with the other column width comes second (16-bit while they are off by default).
pub fn spmv_candidates(lengths: &[usize], col_locality: f64, cols: usize, value: DType) -> Vec<SpmvTuning> {
    let (lanes, _) = choose_spmv_shape(lengths, col_locality, &SpmvTuning::default());
    let mut out = vec![SpmvTuning::default()];
    let nnz: usize = lengths.iter().sum();
    if panels_pay(lengths.len(), cols, nnz, value) {
        out.push(SpmvTuning {
            panel_width: Some(0),
            ..SpmvTuning::default()
        });
    }
    if compact_columns_pay(cols, nnz) {
        out.push(SpmvTuning {
            compact_columns: Some(!COMPACT_BY_DEFAULT),
            ..SpmvTuning::default()
        });
    }
    for l in [lanes / 2, lanes * 2] {
        if (1..=32).contains(&l) {
            out.push(SpmvTuning {
                lanes: Some(l),
                ..SpmvTuning::default()
            });
        }
    }
    out.push(SpmvTuning {
        binned: true,
        ..SpmvTuning::default()
    });
    out
}

impl SpmvPlan {
    /// Plans `y = alpha A x + beta y` for `a`: chooses the kernels from its row lengths,
    /// compiles them and uploads the long-row segment tables.
    pub fn new<T: Element, I: SparseIndex>(a: &CsrMatrix<T, I>, opts: &SpmvOptions) -> Result<Self> {
        if let Some(l) = opts.tuning.lanes {
            if !(l.is_power_of_two() && l <= 32) {
                return Err(Error::invalid(
                    "tuning.lanes",
                    format!("{l} lanes per row; supported: 1, 2, 4, 8, 16, 32"),
                ));
            }
        }
        let ctx = a.context().clone();
        let t = &opts.tuning;
        // whether the row kernels (if they run) read 16-bit columns; a forced choice that cannot
        // hold is an error here, before anything is built
        let compact = compact_columns_choice(t, a.cols(), a.nnz())?;
        let row_knobs = t.lanes.is_some()
            || t.long_threshold.is_some()
            || t.binned
            || t.merge_path
            || t.compact_columns == Some(true);
        let panel_width = match t.panel_width {
            Some(0) => None,
            Some(w) => Some(w),
            None if !row_knobs && panels_pay(a.rows(), a.cols(), a.nnz(), T::DTYPE) => {
                Some(default_panel_width(T::DTYPE))
            }
            None => None,
        };
        let rules_panels = t.panel_width.is_none();
        if let Some(width) = panel_width {
            if row_knobs {
                return Err(Error::invalid(
                    "tuning",
                    format!(
                        "panel_width takes no lanes, long_threshold, binned or merge_path (got {:?}, {:?}, {}, {})",
                        t.lanes, t.long_threshold, t.binned, t.merge_path
                    ),
                ));
            }
            match PanelPath::new(a, width) {
                Ok(path) => {
                    return Ok(SpmvPlan::of(
                        a,
                        ctx,
                        path.lanes(),
                        usize::MAX,
                        SpmvKernels::Panels(path),
                    ));
                }
                // the rules' choice falls back to the row kernels (the layout's copy of the
                // entries and its partials did not fit, or too many panel rows for the index
                // type); a forced width reports why it cannot run
                Err(_) if rules_panels => {}
                Err(e) => return Err(e),
            }
        }
        if opts.tuning.merge_path {
            if t.lanes.is_some() || t.long_threshold.is_some() || t.binned {
                return Err(Error::invalid(
                    "tuning",
                    format!(
                        "merge_path takes no lanes, long_threshold or binned (got {:?}, {:?}, {})",
                        t.lanes, t.long_threshold, t.binned
                    ),
                ));
            }
            let merge = MergePath::new(&ctx, T::DTYPE, I::DTYPE, a.rows(), a.nnz())?;
            return Ok(SpmvPlan::of(a, ctx, 0, usize::MAX, SpmvKernels::MergePath(merge)));
        }
        let lengths = a.row_lengths();
        let (lanes, long_threshold) = choose_spmv_shape(lengths, a.descriptor().col_locality, &opts.tuning);
        let compact = if compact {
            match a.compact_columns() {
                Ok(c) => Some(c),
                // the rules' choice falls back to the matrix's own indices (the copy did not
                // fit); a forced one reports why it cannot run
                Err(_) if t.compact_columns.is_none() => None,
                Err(e) => return Err(e),
            }
        } else {
            None
        };
        let variant = SpmvVariant {
            value: T::DTYPE,
            index: I::DTYPE,
            lanes: if opts.tuning.binned { BINNED } else { lanes },
            compact: compact.is_some(),
        };
        let kernel = ctx.kernel(&variant.spec())?;
        let bins = if opts.tuning.binned {
            let mut by_bin: [Vec<i64>; 5] = Default::default();
            for (r, &len) in lengths.iter().enumerate() {
                if len <= long_threshold {
                    by_bin[bin_of(len)].push(r as i64);
                }
            }
            let (mut first_cta, mut first_row) = ([0i32; 6], [0i32; 6]);
            for b in 0..5 {
                let per_cta = (BLOCK_THREADS / BIN_LANES[b]) as usize;
                let ctas = by_bin[b].len().div_ceil(per_cta);
                first_cta[b + 1] = i32_of(first_cta[b] as usize + ctas, "CTAs")?;
                first_row[b + 1] = i32_of(first_row[b] as usize + by_bin[b].len(), "rows")?;
            }
            let all: Vec<i64> = by_bin.concat();
            Some(Bins {
                rows: if all.is_empty() {
                    ctx.alloc::<i64>(1)?
                } else {
                    ctx.upload(&all)?
                },
                first_cta,
                first_row,
            })
        } else {
            None
        };

        let long_list: Vec<usize> = (0..lengths.len()).filter(|&r| lengths[r] > long_threshold).collect();
        let long = if long_list.is_empty() {
            None
        } else {
            let mut segment_row = Vec::new();
            let mut segment_first = Vec::with_capacity(long_list.len());
            for (k, &r) in long_list.iter().enumerate() {
                segment_first.push(i32_of(segment_row.len(), "long-row segments")?);
                for _ in 0..lengths[r].div_ceil(SEGMENT_NNZ) {
                    segment_row.push(i32_of(k, "long rows")?);
                }
            }
            let segments = segment_row.len();
            let kernel = ctx.kernel(&SpmvVariant { lanes: 0, ..variant }.spec())?;
            let mut row_done = ctx.alloc::<i32>(long_list.len())?;
            row_done.fill_bytes(0)?;
            Some(LongRows {
                count: long_list.len(),
                segments,
                rows: ctx.upload(&long_list.iter().map(|&r| r as i64).collect::<Vec<_>>())?,
                segment_row: ctx.upload(&segment_row)?,
                segment_first: ctx.upload(&segment_first)?,
                partials: ctx.alloc::<f64>(segments)?,
                row_done,
                kernel,
            })
        };
        let kernels = SpmvKernels::Rows {
            kernel,
            bins,
            long,
            compact,
        };
        Ok(SpmvPlan::of(a, ctx, lanes, long_threshold, kernels))
    }

    /// The plan of `a` with its kernels chosen.
    fn of<T: Element, I: SparseIndex>(
        a: &CsrMatrix<T, I>,
        ctx: Context,
        lanes: u32,
        long_threshold: usize,
        kernels: SpmvKernels,
    ) -> SpmvPlan {
        SpmvPlan {
            ctx,
            value: T::DTYPE,
            index: I::DTYPE,
            rows: a.rows(),
            cols: a.cols(),
            nnz: a.nnz(),
            lanes,
            long_threshold,
            kernels,
        }
    }

    /// The column-panel layout on the host (the panel path only; for verification): see
    /// [`PanelPath::download`].
    #[allow(clippy::type_complexity)]
    pub(crate) fn panel_layout<T: Element, I: SparseIndex>(
        &self,
    ) -> Result<Option<(usize, Option<Vec<I>>, Vec<u16>, Option<Vec<T>>)>> {
        match &self.kernels {
            SpmvKernels::Panels(p) => p.download::<T, I>().map(Some),
            _ => Ok(None),
        }
    }

    /// Device bytes the plan keeps beside the matrix: on the column-panel path the layout and
    /// the partial rows; with 16-bit columns those columns (cached on the matrix, shared by its
    /// plans); 0 on the others.
    pub fn extra_bytes(&self) -> usize {
        match &self.kernels {
            SpmvKernels::Panels(p) => p.extra_bytes(),
            SpmvKernels::Rows { compact: Some(c), .. } => c.bytes(),
            _ => 0,
        }
    }

    /// What converting the matrix for this plan cost: to column panels (the panel path), or to
    /// 16-bit columns (made once per matrix: a later plan reports the first conversion).
    pub fn conversion(&self) -> Option<&super::convert::ConversionReport> {
        match &self.kernels {
            SpmvKernels::Panels(p) => Some(p.report()),
            SpmvKernels::Rows { compact: Some(c), .. } => Some(c.report()),
            _ => None,
        }
    }

    /// Whether the row kernels read 16-bit columns ([`SpmvTuning::compact_columns`]).
    pub fn compact_columns(&self) -> bool {
        matches!(self.kernels, SpmvKernels::Rows { compact: Some(_), .. })
    }

    /// Lanes per row of the row kernel (0 on the merge path; per panel row on the panel path).
    pub fn lanes(&self) -> u32 {
        self.lanes
    }
    /// Rows of more nonzeros take the long-row kernel (`usize::MAX` on the merge path).
    pub fn long_threshold(&self) -> usize {
        self.long_threshold
    }
    /// Number of long rows and of their segments (CTAs of the long-row kernel).
    pub fn long_rows(&self) -> (usize, usize) {
        match &self.kernels {
            SpmvKernels::Rows { long: Some(l), .. } => (l.count, l.segments),
            _ => (0, 0),
        }
    }
    /// A short name of the kernels this plan runs (`rows-l8`, `rows-l4+long`, `merge-path`;
    /// `-c16` after the row kernels' name when they read 16-bit columns: `rows-l8-c16+long`).
    pub fn path(&self) -> String {
        match &self.kernels {
            SpmvKernels::MergePath(_) => "merge-path".to_string(),
            SpmvKernels::Panels(p) => p.name(),
            SpmvKernels::Rows {
                bins, long, compact, ..
            } => {
                let mut s = if bins.is_some() {
                    "binned".to_string()
                } else {
                    format!("rows-l{}", self.lanes)
                };
                if compact.is_some() {
                    s.push_str("-c16");
                }
                if long.is_some() {
                    s.push_str("+long");
                }
                s
            }
        }
    }

    /// `y = alpha * A x + beta * y`. `a` must be the matrix the plan was made for (same shape and
    /// row lengths; on the column-panel path the very matrix and values, see
    /// [`path`](Self::path)); `x` has `cols` elements and `y` `rows`.
    pub fn run<T: Element, I: SparseIndex>(
        &self,
        a: &CsrMatrix<T, I>,
        alpha: f64,
        x: &DeviceBuffer<T>,
        beta: f64,
        y: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        self.run_unless(None, a, alpha, x, beta, y)
    }

    /// [`run`](Self::run), except that nothing happens (y unchanged) when `skip` is given and
    /// its flag is not zero as the kernels run.
    pub fn run_unless<T: Element, I: SparseIndex>(
        &self,
        skip: Option<SkipIf<'_>>,
        a: &CsrMatrix<T, I>,
        alpha: f64,
        x: &DeviceBuffer<T>,
        beta: f64,
        y: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        check_planned(a, self.value, self.index, self.rows, self.cols)?;
        check_spmv_operands(self.rows, self.cols, x.len(), y.len(), alpha, beta)?;
        if a.nnz() != self.nnz {
            return Err(Error::invalid(
                "matrix",
                format!("{} nonzeros; the plan was made for {}", a.nnz(), self.nnz),
            ));
        }
        if self.rows == 0 {
            return Ok(());
        }
        let (kernel, bins, long, compact) = match &self.kernels {
            // SAFETY: `a` matches the plan (value and index types, shape and nnz: checked above),
            // its offsets were validated on construction (rows + 1 non-decreasing entries ending
            // at nnz, every index in 0..cols; indices and values hold at least one element), x
            // has >= cols elements and y >= rows.
            SpmvKernels::MergePath(m) => return unsafe { m.launch(&self.ctx, skip, a, alpha, x, beta, y) },
            // SAFETY: as above; the panel layout was made from `a` when the plan was.
            SpmvKernels::Panels(p) => return unsafe { p.launch(&self.ctx, skip, a, alpha, x, beta, y) },
            SpmvKernels::Rows {
                kernel,
                bins,
                long,
                compact,
            } => (kernel, bins, long, compact),
        };
        if let Some(c) = compact {
            if c.pattern() != a.pattern() {
                return Err(Error::invalid(
                    "matrix",
                    "not the matrix this plan's 16-bit columns were made from (the plan reads a copy of \
                     its column indices); make a new plan"
                        .to_string(),
                ));
            }
        }
        let mut params = SpmvParams {
            offsets: a.offsets.device_ptr(),
            indices: compact.as_ref().map_or(a.indices.device_ptr(), |c| c.device_ptr()),
            values: a.values.device_ptr(),
            x: x.device_ptr(),
            y: y.device_ptr(),
            rows: self.rows as i64,
            long_threshold: self.long_threshold.min(i64::MAX as usize) as i64,
            alpha,
            beta,
            long_rows: 0,
            segment_row: 0,
            segment_first: 0,
            partials: 0,
            row_done: 0,
            bin_rows: 0,
            skip: skip_ptr(skip),
            bin_first_cta: [0; 6],
            bin_first_row: [0; 6],
        };
        let grid = match bins {
            Some(b) => {
                params.bin_rows = b.rows.device_ptr();
                params.bin_first_cta = b.first_cta;
                params.bin_first_row = b.first_row;
                b.first_cta[5] as u32
            }
            None => u32::try_from(self.rows.div_ceil((BLOCK_THREADS / self.lanes) as usize))
                .map_err(|_| Error::Unsupported(format!("{} rows: more CTAs than a grid holds", self.rows)))?,
        };
        // SAFETY: the buffers belong to `a`, which matches the plan (checked above): offsets has
        // rows + 1 entries, indices and values its nnz (at least 1 element allocated), every
        // index is in 0..cols (validated on construction) and x has >= cols elements, y >= rows;
        // each row is written by one lane only. With 16-bit columns, indices is the copy made
        // from `a`'s pattern (checked above): nnz columns of 2 bytes, the same values, and the
        // kernel was compiled to read 2 bytes a column. SpmvParams mirrors the kernel's struct.
        unsafe { kernel.launch(&self.ctx, LaunchConfig::linear(grid, BLOCK_THREADS, 0), &params)? };
        if let Some(l) = long {
            params.long_rows = l.rows.device_ptr();
            params.segment_row = l.segment_row.device_ptr();
            params.segment_first = l.segment_first.device_ptr();
            params.partials = l.partials.device_ptr();
            params.row_done = l.row_done.device_ptr();
            // SAFETY: as above; the segment tables were built from the same row offsets (one
            // entry per long row, one per segment), partials has one slot per segment and
            // row_done one zeroed counter per long row, which the last CTA of each row resets.
            unsafe {
                l.kernel.launch(
                    &self.ctx,
                    LaunchConfig::linear(l.segments as u32, BLOCK_THREADS, 0),
                    &params,
                )?
            };
        }
        Ok(())
    }
}

fn i32_of(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Unsupported(format!("more than 2^31 {what}")))
}

#[cfg(test)]
mod tests {

    #[test]
    fn autotune_candidates_are_the_rules_their_neighbours_and_binned() {
        // mean 16 -> 8 lanes by the rules (neither scattered nor nearly consecutive columns)
        let c = spmv_candidates(&[16; 100], 0.5, 100, DType::F32);
        assert_eq!(c[0], SpmvTuning::default());
        assert_eq!(c[1].lanes, Some(4));
        assert_eq!(c[2].lanes, Some(16));
        assert!(c[3].binned);
        assert_eq!(c.len(), 4);
        // 1 lane by the rules: no half; 32 lanes: no double
        assert_eq!(spmv_candidates(&[1; 10], 1.0, 10, DType::F32).len(), 3);
        assert_eq!(spmv_candidates(&vec![200; FEW_ROWS], 1.0, 100_000, DType::F32).len(), 3);
        // a narrow large matrix (16-bit columns could pay): the other column width second
        let narrow = spmv_candidates(&vec![200; FEW_ROWS], 1.0, 1000, DType::F32);
        assert_eq!(narrow[0], SpmvTuning::default());
        assert_eq!(narrow[1].compact_columns, Some(!COMPACT_BY_DEFAULT));
        assert_eq!(narrow.len(), 4);
        assert!(spmv_candidates(&[], 1.0, 0, DType::F32).len() >= 2);
        // a wide matrix (the rules take panels): the row kernel at the rules' lanes second
        let wide = spmv_candidates(&[900; 6000], 0.1, 800_000, DType::F32);
        assert_eq!(wide[0], SpmvTuning::default());
        assert_eq!(wide[1].panel_width, Some(0));
        assert_eq!(wide.len(), 5);
    }

    #[test]
    fn compact_variants_are_new_and_the_others_unchanged() {
        let v = all_variants();
        let mut names: Vec<String> = v.iter().map(|v| v.spec().name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 4 * 2 * 8 * 2);
        let plain = SpmvVariant {
            value: DType::F32,
            index: DType::I32,
            lanes: 8,
            compact: false,
        };
        // the existing variants keep their names (and cache keys): no switch in the preamble
        assert_eq!(plain.spec().name, "spmv_csr_rows_fp32_i32_l8_t256_s4096");
        assert!(!plain.spec().preamble.contains("TS_SPMV_COMPACT_COLUMNS"));
        let compact = SpmvVariant { compact: true, ..plain };
        assert_eq!(compact.spec().name, "spmv_csr_rows_fp32_i32_l8_t256_s4096_c16");
        assert!(compact.spec().preamble.contains("#define TS_SPMV_COMPACT_COLUMNS 1"));
        let long = SpmvVariant { lanes: 0, ..compact };
        assert_eq!(long.spec().entry, "spmv_csr_long_rows");
        assert!(long.spec().name.ends_with("_c16"));
    }

    #[test]
    fn spmv_shape_follows_locality_and_row_count() {
        let t = SpmvTuning::default();
        // scattered columns: one nonzero per lane; local ones: two
        assert_eq!(choose_spmv_shape(&[16; 1000], 0.0, &t), (16, 1024));
        assert_eq!(choose_spmv_shape(&[16; 1000], 0.9, &t), (8, 1024));
        // nearly consecutive columns (banded): about four nonzeros per lane on short rows only
        assert_eq!(choose_spmv_shape(&[9; 1000], 0.88, &t), (4, 1024));
        assert_eq!(choose_spmv_shape(&[9; 1000], 0.97, &t), (2, 1024));
        assert_eq!(choose_spmv_shape(&[1; 1000], 0.97, &t), (1, 1024));
        assert_eq!(choose_spmv_shape(&vec![900; FEW_ROWS], 0.97, &t).0, 32);
        // never more lanes than nonzeros
        assert_eq!(choose_spmv_shape(&[1; 1000], 0.0, &t), (1, 1024));
        assert_eq!(choose_spmv_shape(&[3; 1000], 0.0, &t), (2, 1024));
        // rows of hundreds: 16 lanes on few rows, 32 on many
        assert_eq!(choose_spmv_shape(&[900; 1000], 0.9, &t).0, 16);
        assert_eq!(choose_spmv_shape(&vec![900; FEW_ROWS], 0.9, &t).0, 32);
        // forced lanes are kept
        let forced = SpmvTuning {
            lanes: Some(4),
            ..SpmvTuning::default()
        };
        assert_eq!(choose_spmv_shape(&[16; 1000], 0.0, &forced), (4, 1024));
    }
    use super::*;

    #[test]
    fn bins_hold_about_four_nonzeros_per_lane() {
        assert_eq!(bin_of(0), 0);
        assert_eq!(bin_of(8), 0);
        assert_eq!(bin_of(9), 1);
        assert_eq!(bin_of(16), 1);
        assert_eq!(bin_of(17), 2);
        assert_eq!(bin_of(128), 4);
        assert_eq!(bin_of(100_000), 4);
    }

    #[test]
    fn shape_follows_the_short_rows() {
        let t = SpmvTuning::default();
        // uniform 16 per row: 8 lanes (2 nonzeros each), nothing long
        assert_eq!(choose_shape(&[16; 1000], &t), (8, 1024));
        // a few huge rows do not move the lanes or the threshold of the short ones
        let mut l = vec![4usize; 10_000];
        l[7] = 100_000;
        l[77] = 50_000;
        let (lanes, threshold) = choose_shape(&l, &t);
        assert_eq!(lanes, 2);
        assert_eq!(threshold, 1024);
        assert!(l.iter().filter(|&&n| n > threshold).count() == 2);
        // forced values win
        let forced = SpmvTuning {
            lanes: Some(32),
            long_threshold: Some(5),
            binned: false,
            merge_path: false,
            panel_width: None,
            compact_columns: None,
        };
        assert_eq!(choose_shape(&l, &forced), (32, 5));
        // empty matrix
        assert_eq!(choose_shape(&[], &t), (1, 1024));
    }
}
