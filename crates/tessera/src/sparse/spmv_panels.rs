//! The column-panel CSR SpMV (`spmv_panels.cu`): x read a panel of columns at a time into
//! shared memory, so that a matrix whose rows gather from all over a long x (the transpose of a
//! tall least-squares matrix: each of its few rows reads entries of u scattered over hundreds of
//! thousands) gathers from the SM instead of one 32-byte L2 sector per nonzero, and its column
//! indices take 16 bits. The layout is a conversion done once per plan on the device
//! ([`convert::panels`](super::convert)); more than one panel adds a second small kernel that
//! sums the panels' partial rows in panel order (deterministic).
//!
//! When the rules take it: see [`panels_pay`].

use std::any::Any;
use std::sync::Arc;

use super::convert::ConversionReport;
use super::device::CsrMatrix;
use super::host::CsrHost;
use super::index::SparseIndex;
use super::spmv::{skip_ptr, SkipIf, SPMV_HEADERS};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::runtime::{Context, DeviceBuffer, Kernel, KernelKey, KernelParams, KernelSpec, LaunchConfig};

/// Source of the panel kernels.
pub const SOURCE: &str = include_str!("spmv_panels.cu");
/// Threads per CTA of both kernels.
pub const BLOCK_THREADS: u32 = 256;
/// Columns of a panel at most: its columns are stored in 16 bits.
pub const MAX_PANEL_WIDTH: usize = 1 << 16;
/// Panels at most (the grid's y extent).
pub const MAX_PANELS: usize = 65535;
/// Shared memory for x per CTA of the default width: 48 KiB (no opt-in needed; four CTAs fit an
/// SM of 228 KiB).
pub const PANEL_SMEM_BYTES: usize = 48 << 10;
/// The rules take panels when the panel rows hold at least this many nonzeros on average: the
/// partials (two Acc per panel row) and offsets (one index per panel row) then stay a small
/// share of the streamed bytes.
const MIN_NNZ_PER_PANEL_ROW: usize = 4;
/// The rules take panels only with at least this many panel rows: a few very long rows (a
/// 1 x 10^6 matrix) would leave one group of lanes per CTA working and the rest idle, where the
/// row kernels' long-row path spreads each row over many full CTAs.
const MIN_PANEL_ROWS: usize = 1 << 14;
/// CTAs of the panel kernel per SM, at most: each stages its panel of x, so more CTAs read x
/// more often; four give one wave of 1024 threads per SM.
const CTAS_PER_SM: usize = 4;
/// Waves of panel CTAs: two waves (each CTA half the rows of one) beat one wave and four on the
/// H100 (the wide transposes, side by side: `sparse/NOTES.md`); the second wave's CTAs start as
/// the first's finish, so no SM idles on a panel's long tail.
const WAVES: usize = 2;
/// Panels the rules ask for at least: with x spread over this many panels the row kernels'
/// gathers miss L1 on nearly every nonzero. Fewer panels (x a few MiB or less) the row kernels
/// served from L1/L2 faster on every matrix measured.
const MIN_PANELS: usize = 64;

/// Columns per panel of the default layout for values of `value`: [`PANEL_SMEM_BYTES`] of x.
pub fn default_panel_width(value: DType) -> usize {
    (PANEL_SMEM_BYTES / value.size()).min(MAX_PANEL_WIDTH)
}

/// Whether the rules run a `rows x cols` matrix of `nnz` nonzeros and `value` entries as column
/// panels of the default width: at least [`MIN_PANELS`] panels (x far larger than a CTA's share
/// of shared memory; with fewer columns the row kernels gather x from L1 and L2), at least
/// [`MIN_NNZ_PER_PANEL_ROW`] nonzeros per panel row on average (rows that reach across many
/// panels: the transposes of tall least-squares matrices, tomography), and at least
/// [`MIN_PANEL_ROWS`] panel rows. Square matrices of scattered columns have far fewer nonzeros
/// per panel row: their partials would outweigh the gathers they save.
pub fn panels_pay(rows: usize, cols: usize, nnz: usize, value: DType) -> bool {
    let panels = cols.div_ceil(default_panel_width(value));
    let panel_rows = panels.saturating_mul(rows);
    panels >= MIN_PANELS && panel_rows >= MIN_PANEL_ROWS && nnz >= MIN_NNZ_PER_PANEL_ROW.saturating_mul(panel_rows)
}

/// A panel kernel variant: its specialisation constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PanelVariant {
    pub value: DType,
    pub index: DType,
    /// Lanes per panel row (1..=32, a power of two); 0 for the reduction of the partials.
    pub lanes: u32,
}

impl PanelVariant {
    fn entry(&self) -> &'static str {
        if self.lanes == 0 {
            "spmv_panels_reduce"
        } else {
            "spmv_panels"
        }
    }
    pub fn key(&self) -> KernelKey {
        KernelKey::new(self.entry())
            .ty("Val", self.value)
            .ty("Idx", self.index)
            .int("kLanes", "l", self.lanes.clamp(1, 32))
            .int("kBlockThreads", "t", BLOCK_THREADS)
    }
    pub fn spec(&self) -> KernelSpec {
        self.key().spec("spmv_panels.cu", SOURCE, self.entry(), SPMV_HEADERS)
    }
}

/// Every variant, for the compile tests and `tessera compile`.
pub fn all_variants() -> Vec<PanelVariant> {
    let mut v = Vec::new();
    for value in super::device::VALUE_DTYPES {
        for index in [DType::I32, DType::I64] {
            for lanes in [0, 1, 2, 4, 8, 16, 32] {
                v.push(PanelVariant { value, index, lanes });
            }
        }
    }
    v
}

/// The panel layout of one matrix on the device (made by `convert::panels`).
pub(crate) struct PanelArrays<T: Element, I: SparseIndex> {
    pub width: usize,
    pub panels: usize,
    /// `panels * rows + 1` offsets; `None`: one panel, the matrix's own.
    pub offsets: Option<DeviceBuffer<I>>,
    /// The values in panel order; `None`: one panel, the matrix's own.
    pub values: Option<DeviceBuffer<T>>,
    /// The 16-bit column of each entry within its panel (2 bytes each, panel order).
    pub columns: DeviceBuffer<u8>,
    pub report: ConversionReport,
}

/// The panel layout of a host matrix, as the device conversion makes it (the reference of `tessera
/// verify sparse`, bit for bit): the panel count (one when `nnz == 0`), `panels * rows + 1`
/// offsets, and each entry's column within its panel and value in panel order (panel, row,
/// the row's own order). With one panel the offsets and values are the matrix's own.
pub fn panels_host<T: Element, I: SparseIndex>(
    a: &CsrHost<T, I>,
    width: usize,
) -> (usize, Vec<usize>, Vec<u16>, Vec<T>) {
    let width = width.max(1);
    let nnz = a.values.len();
    let panels = if nnz == 0 { 1 } else { a.cols.div_ceil(width).max(1) };
    let mut offsets = vec![0usize; panels * a.rows + 1];
    let mut columns = Vec::with_capacity(nnz);
    let mut values = Vec::with_capacity(nnz);
    for p in 0..panels {
        for r in 0..a.rows {
            for k in a.offsets[r].to_usize()..a.offsets[r + 1].to_usize() {
                let c = a.indices[k].to_usize();
                if panels == 1 || c / width == p {
                    columns.push((c - p * width) as u16);
                    values.push(a.values[k]);
                }
            }
            offsets[p * a.rows + r + 1] = columns.len();
        }
    }
    (panels, offsets, columns, values)
}

/// `struct PanelParams` of spmv_panels.cu (112 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct PanelParams {
    offsets: u64,
    columns: u64,
    values: u64,
    x: u64,
    y: u64,
    partials: u64,
    skip: u64,
    rows: i64,
    cols: i64,
    width: i64,
    rows_per_cta: i64,
    panels: i64,
    alpha: f64,
    beta: f64,
}
const _: () = assert!(std::mem::size_of::<PanelParams>() == 112);
// SAFETY: #[repr(C)]: fourteen eight-byte fields (pointers as u64, i64, f64) in the order and of
// the types of the kernel's struct (pointers, long long, double).
unsafe impl KernelParams for PanelParams {}

/// Lanes per panel row: the power of two nearest half the mean nonzeros per panel row (about
/// two per lane), 1..=32.
pub fn panel_lanes(rows: usize, nnz: usize, panels: usize) -> u32 {
    let rows = rows.max(1) * panels.max(1);
    let half = (nnz as f64 / rows as f64 / 2.0).max(1.0);
    1 << (half.log2().round().clamp(0.0, 5.0) as u32)
}

/// The panel path of one SpMV plan: the layout, the kernels and the partial rows.
pub(crate) struct PanelPath {
    rows: usize,
    cols: usize,
    nnz: usize,
    width: usize,
    panels: usize,
    lanes: u32,
    chunks: usize,
    rows_per_cta: usize,
    shared_bytes: u32,
    kernel: Arc<Kernel>,
    /// The reduction and one f64 slot per panel row (f32 kernels use the first half of the
    /// bytes); more than one panel only.
    reduce: Option<(Arc<Kernel>, DeviceBuffer<f64>)>,
    /// `PanelArrays<T, I>` of the plan's types (checked by the plan before a launch).
    arrays: Box<dyn Any + Send + Sync>,
    /// The identity of the matrix (and values) the layout was made from. The layout copies the
    /// columns (and with more than one panel the values), so a plan used with another matrix,
    /// or after `update_values`, would compute with stale entries: such a call is an error.
    source: u64,
    report: ConversionReport,
}

impl PanelPath {
    /// Converts `a` to panels of `width` columns and compiles the kernels.
    pub fn new<T: Element, I: SparseIndex>(a: &CsrMatrix<T, I>, width: usize) -> Result<Self> {
        let ctx = a.context();
        let info = ctx.info();
        // a matrix no wider than the width is one panel of its own width
        let width = if a.cols() <= width { a.cols().max(1) } else { width };
        let shared = width * T::DTYPE.size();
        if shared > info.max_shared_per_block_optin as usize {
            return Err(Error::invalid(
                "panel width",
                format!(
                    "{width} columns of {} need {shared} bytes of shared memory; this GPU allows {} per CTA",
                    T::DTYPE,
                    info.max_shared_per_block_optin
                ),
            ));
        }
        let arrays = super::convert::panels(a, width)?;
        let (rows, nnz, panels) = (a.rows(), a.nnz(), arrays.panels);
        let lanes = panel_lanes(rows, nnz, panels);
        // WAVES waves of CTAS_PER_SM per SM (fewer when their shared memory does not fit), split
        // over the panels in chunks of rows
        let per_sm = (info.max_shared_per_sm as usize / (shared + 1024).max(1)).clamp(1, CTAS_PER_SM);
        let target = std::env::var("TESSERA_SPMV_PANEL_CTAS")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or(info.sm_count as usize * per_sm * WAVES);
        let step = (BLOCK_THREADS / lanes) as usize;
        let chunks = target.div_ceil(panels).clamp(1, rows.div_ceil(step).max(1));
        let rows_per_cta = rows.div_ceil(chunks).max(1);
        let chunks = rows.div_ceil(rows_per_cta).max(1);
        if i32::try_from(chunks).is_err() {
            return Err(Error::Unsupported(format!("{rows} rows: more CTAs than a grid holds")));
        }
        let variant = |lanes| PanelVariant {
            value: T::DTYPE,
            index: I::DTYPE,
            lanes,
        };
        let kernel = ctx.kernel(&variant(lanes).spec())?;
        let reduce = if panels > 1 {
            Some((ctx.kernel(&variant(0).spec())?, ctx.alloc::<f64>(panels * rows)?))
        } else {
            None
        };
        let report = arrays.report.clone();
        Ok(PanelPath {
            rows,
            cols: a.cols(),
            nnz,
            width: arrays.width,
            panels,
            lanes,
            chunks,
            rows_per_cta,
            shared_bytes: shared as u32,
            kernel,
            reduce,
            arrays: Box::new(arrays),
            source: a.identity(),
            report,
        })
    }

    /// A short name: `panels-w<width>x<panels>-l<lanes>`.
    pub fn name(&self) -> String {
        format!("panels-w{}x{}-l{}", self.width, self.panels, self.lanes)
    }

    /// What the conversion to panels cost.
    pub fn report(&self) -> &ConversionReport {
        &self.report
    }

    /// Device bytes the path keeps beside the matrix: the layout and the partial rows.
    pub fn extra_bytes(&self) -> usize {
        self.report.bytes + self.reduce.as_ref().map_or(0, |(_, p)| p.bytes())
    }

    /// Lanes per panel row.
    pub fn lanes(&self) -> u32 {
        self.lanes
    }

    /// The layout on the host (for verification): the panel count, the offsets (`None`: one
    /// panel, the matrix's own), the 16-bit columns and the values (`None`: the matrix's own).
    #[allow(clippy::type_complexity)]
    pub fn download<T: Element, I: SparseIndex>(&self) -> Result<(usize, Option<Vec<I>>, Vec<u16>, Option<Vec<T>>)> {
        let arrays = self
            .arrays
            .downcast_ref::<PanelArrays<T, I>>()
            .ok_or_else(|| Error::invalid("matrix", "value or index type differs from the plan's".to_string()))?;
        let bytes = arrays.columns.to_host()?;
        let columns = bytes[..2 * self.nnz]
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        let offsets = arrays.offsets.as_ref().map(|o| o.to_host()).transpose()?;
        let values = arrays.values.as_ref().map(|v| v.to_host()).transpose()?;
        Ok((self.panels, offsets, columns, values))
    }

    /// `y = alpha A x + beta y` on the context's stream (nothing when `skip`'s flag is set as
    /// the kernels run).
    ///
    /// # Safety
    /// `a` must be the matrix this path was made for (value and index types, shape and nnz),
    /// checked by the caller, with its CSR validated on construction; `x` at least `cols`
    /// elements, `y` at least `rows`.
    #[allow(clippy::too_many_arguments)] // the operands of SpmvPlan::run_unless, passed through
    pub unsafe fn launch<T: Element, I: SparseIndex>(
        &self,
        ctx: &Context,
        skip: Option<SkipIf<'_>>,
        a: &CsrMatrix<T, I>,
        alpha: f64,
        x: &DeviceBuffer<T>,
        beta: f64,
        y: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        let arrays = self
            .arrays
            .downcast_ref::<PanelArrays<T, I>>()
            .ok_or_else(|| Error::invalid("matrix", "value or index type differs from the plan's".to_string()))?;
        if a.identity() != self.source || a.nnz() != self.nnz || a.cols() != self.cols {
            return Err(Error::invalid(
                "matrix",
                "not the matrix this column-panel plan was made from, or its values changed since \
                 (update_values): the panels hold a copy of its entries; make a new plan"
                    .to_string(),
            ));
        }
        if self.rows == 0 {
            return Ok(());
        }
        let params = PanelParams {
            offsets: arrays
                .offsets
                .as_ref()
                .map_or(a.offsets.device_ptr(), |o| o.device_ptr()),
            columns: arrays.columns.device_ptr(),
            values: arrays.values.as_ref().map_or(a.values.device_ptr(), |v| v.device_ptr()),
            x: x.device_ptr(),
            y: y.device_ptr(),
            partials: self.reduce.as_ref().map_or(0, |(_, p)| p.device_ptr()),
            skip: skip_ptr(skip),
            rows: self.rows as i64,
            cols: self.cols as i64,
            width: self.width as i64,
            rows_per_cta: self.rows_per_cta as i64,
            panels: self.panels as i64,
            alpha,
            beta,
        };
        let cfg = LaunchConfig {
            grid: (self.chunks as u32, self.panels as u32, 1),
            ..LaunchConfig::linear(1, BLOCK_THREADS, self.shared_bytes)
        };
        // SAFETY: the caller's contract; the layout was made from `a` (offsets: panels * rows + 1
        // entries ending at nnz, or a's own rows + 1 with one panel; columns and values nnz
        // entries, every column below the panel's width and inside x: the panel starts at
        // p * width < cols); each CTA stages at most width elements of x into shared_bytes
        // (= min(width, cols) elements) and writes either its rows of y (one panel, each row by
        // one group) or their partial slots (panels * rows allocated).
        unsafe { self.kernel.launch(ctx, cfg, &params)? };
        if let Some((reduce, _)) = &self.reduce {
            let grid = self.rows.div_ceil(BLOCK_THREADS as usize).min(1 << 16) as u32;
            // SAFETY: reads the panels * rows partials the first kernel wrote in this call and
            // writes each row of y once (grid-stride over rows).
            unsafe { reduce.launch(ctx, LaunchConfig::linear(grid, BLOCK_THREADS, 0), &params)? };
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panels_pay_on_wide_matrices_only() {
        // the 11kv least-squares matrix's transpose: 77 fp32 panels of 12288
        assert!(panels_pay(23_394, 936_063, 19_657_323, DType::F32));
        // the 8kv one's: 25 panels, x (1.2 MB) served from L2 by the row kernels
        assert!(!panels_pay(6177, 306_136, 5_510_448, DType::F32));
        // tomography 256 (6 panels) and the 11kv matrix itself (2 panels)
        assert!(!panels_pay(65_340, 65_536, 3_000_000, DType::F32));
        assert!(!panels_pay(936_063, 23_394, 19_657_323, DType::F32));
        // the matrix itself: one panel (x stays in L1)
        assert!(!panels_pay(306_136, 6177, 5_510_448, DType::F32));
        // square scattered matrices: far below 4 per panel row
        assert!(!panels_pay(2_000_000, 2_000_000, 32_000_000, DType::F32));
        assert!(!panels_pay(1_000_000, 1_000_000, 20_000_000, DType::F32));
        assert!(!panels_pay(0, 100_000, 0, DType::F32));
        // a few very long rows: the row kernels' long-row path
        assert!(!panels_pay(1, 1_000_000, 1_000_000, DType::F32));
        assert!(!panels_pay(100, 1_000_000, 10_000_000, DType::F32));
    }

    #[test]
    fn lanes_take_about_two_nonzeros_each() {
        assert_eq!(panel_lanes(100, 100 * 36, 1), 16);
        assert_eq!(panel_lanes(100, 100 * 4, 1), 2);
        assert_eq!(panel_lanes(100, 0, 3), 1);
        assert_eq!(panel_lanes(0, 0, 1), 1);
        assert_eq!(panel_lanes(10, 10_000, 1), 32);
        assert_eq!(default_panel_width(DType::F32), 12_288);
        assert_eq!(default_panel_width(DType::F16), 24_576);
        assert_eq!(default_panel_width(DType::F64), 6144);
    }

    #[test]
    fn host_layout_is_panel_row_then_row_order() {
        // 3 x 7, panels of 3 columns: [0..3), [3..6), [6..7)
        let a = CsrHost::<f32, i32> {
            rows: 3,
            cols: 7,
            offsets: vec![0, 3, 3, 6],
            indices: vec![6, 0, 4, 1, 5, 2],
            values: vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            sorted: false,
        };
        let (panels, offsets, columns, values) = panels_host(&a, 3);
        assert_eq!(panels, 3);
        // panel 0: row 0 {col 0}, row 1 {}, row 2 {1, 2}; panel 1: row 0 {4}, row 2 {5};
        // panel 2: row 0 {6}
        assert_eq!(offsets, vec![0, 1, 1, 3, 4, 4, 5, 6, 6, 6]);
        assert_eq!(columns, vec![0, 1, 2, 1, 2, 0]);
        assert_eq!(values, vec![2.0, 4.0, 6.0, 3.0, 5.0, 1.0]);
        // one panel: the matrix's own order and offsets
        let (panels, offsets, columns, values) = panels_host(&a, 7);
        assert_eq!(panels, 1);
        assert_eq!(offsets, vec![0, 3, 3, 6]);
        assert_eq!(columns, vec![6, 0, 4, 1, 5, 2]);
        assert_eq!(values, a.values);
        // the sum over panels of each panel row's dot with x is the row's dot with x
        let x: Vec<f64> = (0..7).map(|i| 1.0 + i as f64).collect();
        let (panels, offsets, columns, values) = panels_host(&a, 2);
        for r in 0..3 {
            let mut sum = 0.0;
            for p in 0..panels {
                for k in offsets[p * 3 + r]..offsets[p * 3 + r + 1] {
                    sum += values[k] as f64 * x[p * 2 + columns[k] as usize];
                }
            }
            let want: f64 = (a.offsets[r] as usize..a.offsets[r + 1] as usize)
                .map(|k| a.values[k] as f64 * x[a.indices[k] as usize])
                .sum();
            assert_eq!(sum, want);
        }
    }

    #[test]
    fn variants_are_distinct() {
        let mut names: Vec<String> = all_variants().iter().map(|v| v.spec().name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 4 * 2 * 7);
    }
}
