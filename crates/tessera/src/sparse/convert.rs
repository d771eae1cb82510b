//! Format conversions on the device (`convert.cu`), each done once per matrix and reported
//! ([`ConversionReport`]): the CSR of the transpose ([`CsrMatrix::transpose`], cached by
//! [`CsrMatrix::transposed`]), COO -> CSR ([`CooMatrix`], [`CsrMatrix::from_coo`]), CSR -> BSR
//! ([`CsrMatrix::to_bsr`], cached by [`CsrMatrix::bsr`]) and BSR -> Blocked-ELL
//! ([`BsrMatrix::to_blocked_ell`](super::BsrMatrix::to_blocked_ell)); for the SpMV, the column
//! panels of `spmv_panels` and the 16-bit columns of `spmv_compact` (cached by
//! [`CsrMatrix::compact_columns`]).
//!
//! CSR -> BSR sorts the entries stably by column, then by block row (so by block row, column,
//! input position), marks where a new block starts, scans the marks into block slots, and
//! writes each entry (duplicates summed in f64 in input order, rounded once, as the host's
//! [`BsrHost::from_csr`](super::BsrHost::from_csr)) into its block's zeroed `b x b` values:
//! the same arrays as the host conversion, bit for bit. Blocked-ELL copies each BSR block to
//! its slot (width: the longest block row, from the downloaded block offsets).
//!
//! Both are stable sorts by key on the device (LSD radix sort by 8-bit digits, one pass per
//! byte of the largest key), so the results are deterministic and equal to the host's
//! [`CsrHost::transpose`](super::CsrHost::transpose) and
//! [`CsrHost::from_coo`](super::CsrHost::from_coo): A^T's rows hold their entries in the order
//! of A's rows; COO triplets end up sorted by (row, column), duplicates summed in input order
//! (in f64, rounded once) or rejected naming the first one. Offsets come from integer-atomic
//! histograms and a scan. The result's descriptor is counted on the device too (only its row
//! offsets come back to the host: planning reads the row lengths).
//!
//! Scratch: about `5 nnz` indices beyond the result (keys and permutations of two radix
//! buffers, the row or column keys), freed when the conversion returns.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::bsr::{check_conversion_block, BellMatrix, BsrMatrix};
use super::descriptor::SparseDescriptor;
use super::device::{upload_nonempty, CsrMatrix, VALUE_DTYPES};
use super::host::{check_sizes, check_triplet_indices, check_triplet_lengths, duplicate_error, CooHost, Duplicates};
use super::index::SparseIndex;
use super::spmv_compact::{check_compact_cols, CompactColumns};
use super::spmv_panels::{PanelArrays, MAX_PANELS, MAX_PANEL_WIDTH};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::runtime::{Context, DeviceBuffer, Kernel, KernelKey, KernelParams, KernelSpec, LaunchConfig};

/// Source of the conversion kernels.
pub const SOURCE: &str = include_str!("convert.cu");
/// Threads per CTA of every conversion kernel (the radix kernels need one per 8-bit digit).
pub const BLOCK_THREADS: u32 = 256;
/// Keys per thread of a radix tile.
const ITEMS: usize = 8;
/// Keys per radix tile (one CTA).
const TILE: usize = BLOCK_THREADS as usize * ITEMS;
/// Elements per thread of each chunk the scan takes.
const SCAN_ITEMS: usize = 4;
/// Radix digits per pass (8 bits).
const DIGITS: usize = 256;
/// CTAs of the grid-stride kernels, at most.
const MAX_GRID: usize = 1 << 16;

/// What a conversion cost: wall time (the device work included: it ends with a
/// synchronisation) and device memory.
#[derive(Clone, Debug, PartialEq)]
pub struct ConversionReport {
    /// Which conversion (`"csr -> csr of A^T"`, `"coo -> csr"`).
    pub what: &'static str,
    /// Wall time from the call to the finished matrix (kernels, the offsets' download, the
    /// descriptor).
    pub elapsed: Duration,
    /// Device bytes of the result (offsets, indices, values), kept while it lives.
    pub bytes: usize,
    /// Device bytes of scratch at the peak, freed when the conversion returns.
    pub scratch_bytes: usize,
}

impl std::fmt::Display for ConversionReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {:.3} ms, {:.1} MiB kept, {:.1} MiB scratch",
            self.what,
            self.elapsed.as_secs_f64() * 1e3,
            self.bytes as f64 / (1 << 20) as f64,
            self.scratch_bytes as f64 / (1 << 20) as f64
        )
    }
}

/// The kernels of `convert.cu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Entry {
    ExpandRows,
    RadixHist,
    Scan,
    RadixScatter,
    Count,
    Gather,
    Heads,
    CheckRange,
    Structure,
    BlockRows,
    BsrHeads,
    BsrBlocks,
    PanelKeys,
    PanelColumns,
    /// Value kernels (need the value type).
    GatherValues,
    SumRuns,
    BsrFill,
    BellFill,
}

impl Entry {
    const INDEX: [Entry; 14] = [
        Entry::ExpandRows,
        Entry::RadixHist,
        Entry::Scan,
        Entry::RadixScatter,
        Entry::Count,
        Entry::Gather,
        Entry::Heads,
        Entry::CheckRange,
        Entry::Structure,
        Entry::BlockRows,
        Entry::BsrHeads,
        Entry::BsrBlocks,
        Entry::PanelKeys,
        Entry::PanelColumns,
    ];
    const VALUES: [Entry; 4] = [Entry::GatherValues, Entry::SumRuns, Entry::BsrFill, Entry::BellFill];

    fn name(self) -> &'static str {
        match self {
            Entry::ExpandRows => "conv_expand_rows",
            Entry::RadixHist => "conv_radix_hist",
            Entry::Scan => "conv_scan",
            Entry::RadixScatter => "conv_radix_scatter",
            Entry::Count => "conv_count",
            Entry::Gather => "conv_gather",
            Entry::Heads => "conv_heads",
            Entry::CheckRange => "conv_check_range",
            Entry::Structure => "conv_structure",
            Entry::BlockRows => "conv_block_rows",
            Entry::BsrHeads => "conv_bsr_heads",
            Entry::BsrBlocks => "conv_bsr_blocks",
            Entry::PanelKeys => "conv_panel_keys",
            Entry::PanelColumns => "conv_panel_columns",
            Entry::GatherValues => "conv_gather_values",
            Entry::SumRuns => "conv_sum_runs",
            Entry::BsrFill => "conv_bsr_fill",
            Entry::BellFill => "conv_bell_fill",
        }
    }
    /// The switch that compiles this entry alone.
    fn switch(self) -> &'static str {
        match self {
            Entry::ExpandRows => "TS_CONV_EXPAND_ROWS",
            Entry::RadixHist => "TS_CONV_RADIX_HIST",
            Entry::Scan => "TS_CONV_SCAN",
            Entry::RadixScatter => "TS_CONV_RADIX_SCATTER",
            Entry::Count => "TS_CONV_COUNT",
            Entry::Gather => "TS_CONV_GATHER",
            Entry::Heads => "TS_CONV_HEADS",
            Entry::CheckRange => "TS_CONV_CHECK_RANGE",
            Entry::Structure => "TS_CONV_STRUCTURE",
            Entry::BlockRows => "TS_CONV_BLOCK_ROWS",
            Entry::BsrHeads => "TS_CONV_BSR_HEADS",
            Entry::BsrBlocks => "TS_CONV_BSR_BLOCKS",
            Entry::PanelKeys => "TS_CONV_PANEL_KEYS",
            Entry::PanelColumns => "TS_CONV_PANEL_COLUMNS",
            Entry::GatherValues => "TS_CONV_GATHER_VALUES",
            Entry::SumRuns => "TS_CONV_SUM_RUNS",
            Entry::BsrFill => "TS_CONV_BSR_FILL",
            Entry::BellFill => "TS_CONV_BELL_FILL",
        }
    }
    fn needs_values(self) -> bool {
        Entry::VALUES.contains(&self)
    }
}

/// One conversion kernel: the entry, its index type and (value kernels) value type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvertVariant {
    pub entry: Entry,
    pub index: DType,
    pub value: Option<DType>,
}

impl ConvertVariant {
    pub fn key(&self) -> KernelKey {
        let name = self.entry.name();
        let mut key = KernelKey::new("sparse_convert")
            .define(self.entry.switch(), name.trim_start_matches("conv_"), true)
            .ty("Idx", self.index);
        if let Some(v) = self.value {
            key = key.ty("Val", v).define("TS_CONV_VALUES", "values", true);
        }
        key.int("kBlockThreads", "t", BLOCK_THREADS)
            .int("kItems", "i", ITEMS as i64)
            .int("kScanItems", "s", SCAN_ITEMS as i64)
    }
    pub fn spec(&self) -> KernelSpec {
        self.key().spec("convert.cu", SOURCE, self.entry.name(), &[])
    }
}

/// Every variant, for the compile tests.
pub fn all_variants() -> Vec<ConvertVariant> {
    let mut v = Vec::new();
    for index in [DType::I32, DType::I64] {
        for entry in Entry::INDEX {
            v.push(ConvertVariant {
                entry,
                index,
                value: None,
            });
        }
        for value in VALUE_DTYPES {
            for entry in Entry::VALUES {
                v.push(ConvertVariant {
                    entry,
                    index,
                    value: Some(value),
                });
            }
        }
    }
    v
}

/// `struct ConvParams` of convert.cu (152 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct ConvParams {
    offsets: u64,
    indices: u64,
    keys_in: u64,
    perm_in: u64,
    keys_out: u64,
    perm_out: u64,
    scan: u64,
    rows_in: u64,
    cols_in: u64,
    flags: u64,
    values_in: u64,
    values_out: u64,
    counters: u64,
    n: i64,
    rows: i64,
    bound: i64,
    shift: i32,
    tiles: i32,
    block: i64,
    width: i64,
}
const _: () = assert!(std::mem::size_of::<ConvParams>() == 152);
// SAFETY: #[repr(C)]: 13 pointers (as u64) and three long long, then two int, then two long
// long, in the order and of the types of the kernel's struct.
unsafe impl KernelParams for ConvParams {}

/// The conversion kernels of one (value, index) type pair on one context.
struct Converter<T: Element, I: SparseIndex> {
    ctx: Context,
    _types: std::marker::PhantomData<(T, I)>,
}

/// Bits of the largest key below `bound` (0 for bound <= 1).
fn key_bits(bound: usize) -> u32 {
    usize::BITS - bound.saturating_sub(1).leading_zeros()
}

fn grid_for(n: usize) -> u32 {
    n.div_ceil(BLOCK_THREADS as usize).clamp(1, MAX_GRID) as u32
}

fn grid_u32(n: usize, what: &str) -> Result<u32> {
    u32::try_from(n.max(1)).map_err(|_| Error::Unsupported(format!("{what}: more CTAs than a grid holds")))
}

impl<T: Element, I: SparseIndex> Converter<T, I> {
    fn new(ctx: &Context) -> Result<Self> {
        if !VALUE_DTYPES.contains(&T::DTYPE) {
            return Err(Error::Unsupported(format!(
                "sparse values of {}; supported: fp32, fp64, fp16, bf16",
                T::DTYPE
            )));
        }
        Ok(Converter {
            ctx: ctx.clone(),
            _types: std::marker::PhantomData,
        })
    }

    fn kernel(&self, entry: Entry) -> Result<Arc<Kernel>> {
        let v = ConvertVariant {
            entry,
            index: I::DTYPE,
            value: entry.needs_values().then_some(T::DTYPE),
        };
        self.ctx.kernel(&v.spec())
    }

    /// Launches `entry` on `grid` CTAs.
    ///
    /// # Safety
    /// Every pointer of `p` the entry reads or writes (convert.cu documents which) points to a
    /// live allocation of the size the entry addresses for `p.n`, `p.rows` and `grid`.
    unsafe fn launch(&self, entry: Entry, grid: u32, p: &ConvParams) -> Result<()> {
        let kernel = self.kernel(entry)?;
        // SAFETY: the caller's contract; ConvParams mirrors the kernel's struct.
        unsafe { kernel.launch(&self.ctx, LaunchConfig::linear(grid, BLOCK_THREADS, 0), p) }
    }

    fn alloc(&self, n: usize) -> Result<DeviceBuffer<I>> {
        self.ctx.alloc::<I>(n.max(1))
    }

    /// `buf[..n]` replaced by its exclusive prefix sum, the total into `buf[n]`.
    fn scan(&self, buf: &mut DeviceBuffer<I>, n: usize) -> Result<()> {
        assert!(buf.len() > n, "scan: the total needs a slot");
        let p = ConvParams {
            scan: buf.device_ptr(),
            n: n as i64,
            ..Default::default()
        };
        // SAFETY: buf holds n + 1 elements (asserted); one CTA walks them.
        unsafe { self.launch(Entry::Scan, 1, &p) }
    }

    /// `counts[key] += 1` for the `n` keys (counts zeroed by the caller, all keys in range).
    fn count(&self, keys: &DeviceBuffer<I>, n: usize, counts: &mut DeviceBuffer<I>) -> Result<()> {
        let p = ConvParams {
            keys_in: keys.device_ptr(),
            scan: counts.device_ptr(),
            n: n as i64,
            ..Default::default()
        };
        // SAFETY: keys holds n keys, each below counts.len() (the callers' invariant: column or
        // row indices of a validated matrix, with counts sized by that dimension).
        unsafe { self.launch(Entry::Count, grid_for(n), &p) }
    }

    /// `out[i] = src[perm[i]]` for i < n.
    fn gather(&self, src: &DeviceBuffer<I>, perm: &DeviceBuffer<I>, n: usize) -> Result<DeviceBuffer<I>> {
        let out = self.alloc(n)?;
        let p = ConvParams {
            keys_in: src.device_ptr(),
            perm_in: perm.device_ptr(),
            keys_out: out.device_ptr(),
            n: n as i64,
            ..Default::default()
        };
        // SAFETY: perm holds n entries, each a position in src (a permutation of 0..n, or the
        // one-element lookups of `read_at`); out holds n.
        unsafe { self.launch(Entry::Gather, grid_for(n), &p)? };
        Ok(out)
    }

    /// Element `i` of `buf`, on the host (a one-element gather; for error messages).
    fn read_at(&self, buf: &DeviceBuffer<I>, i: usize) -> Result<usize> {
        let at = self.ctx.upload(&[I::from_usize_in_range(i)])?;
        Ok(self.gather(buf, &at, 1)?.to_host()?[0].to_usize())
    }

    /// Stable sort of `n` keys (each below `bound`) carrying a permutation (`perm_in`; `None`:
    /// the identity): the sorted keys and the permuted permutation.
    fn radix_sort(
        &self,
        keys_in: &DeviceBuffer<I>,
        perm_in: Option<&DeviceBuffer<I>>,
        n: usize,
        bound: usize,
    ) -> Result<(DeviceBuffer<I>, DeviceBuffer<I>)> {
        let tiles = n.div_ceil(TILE);
        let tiles_i32 = i32::try_from(tiles).map_err(|_| Error::Unsupported(format!("{n} keys: too many tiles")))?;
        let mut hist = self.alloc(DIGITS * tiles + 1)?;
        let mut cur = (self.alloc(n)?, self.alloc(n)?);
        let mut next = (self.alloc(n)?, self.alloc(n)?);
        let passes = key_bits(bound).div_ceil(8).max(1);
        for pass in 0..passes {
            let (keys, perm) = if pass == 0 {
                (keys_in.device_ptr(), perm_in.map_or(0, |p| p.device_ptr()))
            } else {
                (cur.0.device_ptr(), cur.1.device_ptr())
            };
            let p = ConvParams {
                keys_in: keys,
                perm_in: perm,
                keys_out: next.0.device_ptr(),
                perm_out: next.1.device_ptr(),
                scan: hist.device_ptr(),
                n: n as i64,
                shift: 8 * pass as i32,
                tiles: tiles_i32,
                ..Default::default()
            };
            let grid = grid_u32(tiles, "radix sort")?;
            // SAFETY: keys (and perm, when given) hold n entries; hist holds DIGITS * tiles + 1;
            // the scattered slots are a permutation of 0..n (the scanned histogram counts every
            // key once), within keys_out and perm_out of n entries.
            unsafe { self.launch(Entry::RadixHist, grid, &p)? };
            self.scan(&mut hist, DIGITS * tiles)?;
            // SAFETY: as above.
            unsafe { self.launch(Entry::RadixScatter, grid, &p)? };
            std::mem::swap(&mut cur, &mut next);
        }
        Ok(cur)
    }

    /// The row of each nonzero of `a` (CSR offsets -> COO rows).
    fn rows_of(&self, a: &CsrMatrix<T, I>) -> Result<DeviceBuffer<I>> {
        let row_of = self.alloc(a.nnz())?;
        let p = ConvParams {
            offsets: a.offsets.device_ptr(),
            keys_out: row_of.device_ptr(),
            rows: a.rows() as i64,
            ..Default::default()
        };
        // SAFETY: offsets holds rows + 1 entries ending at nnz (validated on construction);
        // row_of holds nnz (at least one element).
        unsafe {
            self.launch(
                Entry::ExpandRows,
                grid_u32(a.rows().div_ceil((BLOCK_THREADS / 32) as usize), "rows")?,
                &p,
            )?
        };
        Ok(row_of)
    }

    /// `columns[k]` = column `k` of `a` as 16 bits (little-endian), for every nonzero; the
    /// caller checked that `a` has at most 65536 columns and that `columns` holds `2 nnz` bytes.
    fn narrow_columns(&self, a: &CsrMatrix<T, I>, columns: &DeviceBuffer<u8>) -> Result<()> {
        let nnz = a.nnz();
        assert!(columns.len() >= 2 * nnz, "narrow_columns: 2 bytes per nonzero");
        if nnz == 0 {
            return Ok(());
        }
        // the panel-column kernel with one panel (no permutation, no panel keys): indices[k] - 0
        let p = ConvParams {
            indices: a.indices.device_ptr(),
            values_out: columns.device_ptr(),
            width: MAX_PANEL_WIDTH as i64,
            n: nnz as i64,
            ..Default::default()
        };
        // SAFETY: indices holds nnz entries, each in 0..cols <= 65536 (validated on construction;
        // the caller's check), so each fits 16 bits; columns holds 2 nnz bytes (asserted).
        unsafe { self.launch(Entry::PanelColumns, grid_for(nnz), &p) }
    }

    /// CSR offsets (`dim + 1`) from `n` row keys (each below `dim`): histogram, then scan.
    fn offsets_of(&self, keys: &DeviceBuffer<I>, n: usize, dim: usize) -> Result<DeviceBuffer<I>> {
        let mut offsets = self.ctx.alloc::<I>(dim + 1)?;
        offsets.fill_bytes(0)?;
        if n > 0 {
            self.count(keys, n, &mut offsets)?;
        }
        self.scan(&mut offsets, dim)?;
        Ok(offsets)
    }

    /// The descriptor of a device CSR matrix with rows of `lengths` nonzeros whose columns are
    /// nondecreasing within rows: the row statistics on the host, the structure counts on the
    /// device.
    fn descriptor(
        &self,
        cols: usize,
        lengths: Vec<usize>,
        offsets: &DeviceBuffer<I>,
        indices: &DeviceBuffer<I>,
    ) -> Result<SparseDescriptor> {
        let rows = lengths.len();
        let mut counters = self.ctx.alloc::<i64>(7)?;
        counters.fill_bytes(0)?;
        if lengths.iter().any(|&l| l > 0) {
            let grid = grid_u32(rows.div_ceil((BLOCK_THREADS / 32) as usize), "structure")?;
            for shift in 0..5 {
                let p = ConvParams {
                    offsets: offsets.device_ptr(),
                    indices: indices.device_ptr(),
                    counters: counters.device_ptr(),
                    rows: rows as i64,
                    shift,
                    ..Default::default()
                };
                // SAFETY: offsets holds rows + 1 entries and indices their nnz, columns
                // nondecreasing within rows (the binary searches rely on it; both conversions
                // sort them); counters holds 7 and the launch writes [0], [1] and [2 + shift].
                unsafe { self.launch(Entry::Structure, grid, &p)? };
            }
        }
        let c: Vec<usize> = counters.to_host()?.into_iter().map(|v| v as usize).collect();
        Ok(SparseDescriptor::from_counts(
            cols,
            lengths,
            c[0],
            c[1],
            [c[2], c[3], c[4], c[5], c[6]],
        ))
    }

    /// The finished matrix from its device arrays (columns nondecreasing within rows).
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        what: &'static str,
        start: Instant,
        scratch_bytes: usize,
        cols: usize,
        offsets: DeviceBuffer<I>,
        indices: DeviceBuffer<I>,
        values: DeviceBuffer<T>,
    ) -> Result<CsrMatrix<T, I>> {
        let lengths: Vec<usize> = offsets
            .to_host()?
            .windows(2)
            .map(|w| w[1].to_usize() - w[0].to_usize())
            .collect();
        let descriptor = self.descriptor(cols, lengths.clone(), &offsets, &indices)?;
        let report = ConversionReport {
            what,
            elapsed: start.elapsed(),
            bytes: offsets.bytes() + indices.bytes() + values.bytes(),
            scratch_bytes,
        };
        Ok(CsrMatrix::from_device_parts(
            &self.ctx,
            cols,
            lengths,
            (offsets, indices, values),
            descriptor,
            report,
        ))
    }
}

/// The CSR of A^T (see [`CsrMatrix::transpose`]).
pub(crate) fn transpose<T: Element, I: SparseIndex>(a: &CsrMatrix<T, I>) -> Result<CsrMatrix<T, I>> {
    let conv = Converter::<T, I>::new(a.context())?;
    a.context().synchronize()?;
    let start = Instant::now();
    let (rows, cols, nnz) = (a.rows(), a.cols(), a.nnz());
    let offsets = conv.offsets_of(&a.indices, nnz, cols)?;
    let (indices, values, scratch) = if nnz == 0 {
        (conv.alloc(1)?, a.context().alloc::<T>(1)?, 0)
    } else {
        let row_of = conv.rows_of(a)?;
        // stable by column: within a column, A's row order
        let (_, perm) = conv.radix_sort(&a.indices, None, nnz, cols)?;
        let indices = conv.gather(&row_of, &perm, nnz)?;
        drop(row_of);
        let values = a.context().alloc::<T>(nnz)?;
        let p = ConvParams {
            perm_in: perm.device_ptr(),
            values_in: a.values.device_ptr(),
            values_out: values.device_ptr(),
            n: nnz as i64,
            ..Default::default()
        };
        // SAFETY: perm is a permutation of 0..nnz; values_in and values_out hold nnz.
        unsafe { conv.launch(Entry::GatherValues, grid_for(nnz), &p)? };
        let idx = std::mem::size_of::<I>();
        (indices, values, (5 * nnz + DIGITS * nnz.div_ceil(TILE)) * idx)
    };
    conv.finish("csr -> csr of A^T", start, scratch, rows, offsets, indices, values)
}

/// The column panels of `a` for the panel SpMV (`spmv_panels.cu`): its columns cut into
/// panels of `width` columns (`1..=65536`), each panel's entries row by row in A's order with
/// their columns within the panel as 16 bits. One panel (`cols <= width`, or no nonzeros) keeps
/// A's own offsets and values and only adds the 16-bit columns. Deterministic: a stable sort of
/// A's row-major entries by panel, offsets from integer counts and a scan.
pub(crate) fn panels<T: Element, I: SparseIndex>(a: &CsrMatrix<T, I>, width: usize) -> Result<PanelArrays<T, I>> {
    if !(1..=MAX_PANEL_WIDTH).contains(&width) {
        return Err(Error::invalid(
            "panel width",
            format!("{width} columns; supported: 1..={MAX_PANEL_WIDTH} (16-bit columns)"),
        ));
    }
    let conv = Converter::<T, I>::new(a.context())?;
    let ctx = a.context();
    ctx.synchronize()?;
    let start = Instant::now();
    let (rows, cols, nnz) = (a.rows(), a.cols(), a.nnz());
    let panels = if nnz == 0 { 1 } else { cols.div_ceil(width).max(1) };
    if panels > MAX_PANELS {
        return Err(Error::Unsupported(format!(
            "{cols} columns in panels of {width}: {panels} panels, at most {MAX_PANELS} (a grid's y extent)"
        )));
    }
    let panel_rows = panels.checked_mul(rows).filter(|&n| n < I::MAX_USIZE).ok_or_else(|| {
        Error::Unsupported(format!(
            "{panels} panels of {rows} rows: more panel rows than {} offsets hold",
            I::DTYPE
        ))
    })?;
    let columns = ctx.alloc::<u8>(2 * nnz.max(1))?;
    let idx = std::mem::size_of::<I>();
    let (offsets, values, scratch) = if panels == 1 {
        // one panel: every column is in 0..cols <= width <= 65536 (or there are none)
        conv.narrow_columns(a, &columns)?;
        (None, None, 0)
    } else {
        let row_of = conv.rows_of(a)?;
        let panel_of = conv.alloc(nnz)?;
        let panel_row = conv.alloc(nnz)?;
        let p = ConvParams {
            indices: a.indices.device_ptr(),
            keys_in: row_of.device_ptr(),
            keys_out: panel_of.device_ptr(),
            perm_out: panel_row.device_ptr(),
            width: width as i64,
            rows: rows as i64,
            n: nnz as i64,
            ..Default::default()
        };
        // SAFETY: indices and row_of hold nnz entries (columns in 0..cols, rows in 0..rows), so
        // every panel is below `panels` and every panel row below panels * rows, which fits I
        // (checked); panel_of and panel_row hold nnz.
        unsafe { conv.launch(Entry::PanelKeys, grid_for(nnz), &p)? };
        drop(row_of);
        let offsets = conv.offsets_of(&panel_row, nnz, panel_rows)?;
        drop(panel_row);
        let (sorted, perm) = conv.radix_sort(&panel_of, None, nnz, panels)?;
        drop(panel_of);
        let values = ctx.alloc::<T>(nnz)?;
        let p = ConvParams {
            indices: a.indices.device_ptr(),
            perm_in: perm.device_ptr(),
            keys_in: sorted.device_ptr(),
            values_in: a.values.device_ptr(),
            values_out: values.device_ptr(),
            width: width as i64,
            n: nnz as i64,
            ..Default::default()
        };
        // SAFETY: perm is a permutation of 0..nnz; values_in and values_out hold nnz.
        unsafe { conv.launch(Entry::GatherValues, grid_for(nnz), &p)? };
        let p = ConvParams {
            values_out: columns.device_ptr(),
            ..p
        };
        // SAFETY: as above; sorted[i] is the panel of entry perm[i], so its column minus
        // sorted[i] * width is in 0..width (fits 16 bits); columns holds 2 nnz bytes.
        unsafe { conv.launch(Entry::PanelColumns, grid_for(nnz), &p)? };
        (
            Some(offsets),
            Some(values),
            (5 * nnz + DIGITS * nnz.div_ceil(TILE)) * idx,
        )
    };
    ctx.synchronize()?;
    let bytes = columns.bytes()
        + offsets.as_ref().map_or(0, |o: &DeviceBuffer<I>| o.bytes())
        + values.as_ref().map_or(0, |v: &DeviceBuffer<T>| v.bytes());
    Ok(PanelArrays {
        width,
        panels,
        offsets,
        values,
        columns,
        report: ConversionReport {
            what: "csr -> column panels",
            elapsed: start.elapsed(),
            bytes,
            scratch_bytes: scratch,
        },
    })
}

/// The column indices of `a` narrowed to 16 bits for the SpMV row kernels (see
/// [`spmv_compact`](super::spmv_compact)); `a` must have at most 65536 columns (else an
/// `InvalidArgument` error). Reported as `"csr -> 16-bit columns"`: 2 bytes per nonzero kept,
/// no scratch.
pub(crate) fn compact_columns<T: Element, I: SparseIndex>(a: &CsrMatrix<T, I>) -> Result<CompactColumns> {
    check_compact_cols(a.cols())?;
    let conv = Converter::<T, I>::new(a.context())?;
    let ctx = a.context();
    ctx.synchronize()?;
    let start = Instant::now();
    let columns = ctx.alloc::<u8>(2 * a.nnz().max(1))?;
    conv.narrow_columns(a, &columns)?;
    ctx.synchronize()?;
    let report = ConversionReport {
        what: "csr -> 16-bit columns",
        elapsed: start.elapsed(),
        bytes: columns.bytes(),
        scratch_bytes: 0,
    };
    Ok(CompactColumns::new(columns, a.nnz(), a.pattern(), report))
}

/// A sparse matrix as (row, column, value) triplets in device memory, in any order, duplicates
/// allowed; converted to CSR on the device by [`CsrMatrix::from_coo`].
pub struct CooMatrix<T: Element, I: SparseIndex> {
    ctx: Context,
    rows: usize,
    cols: usize,
    nnz: usize,
    row_indices: DeviceBuffer<I>,
    col_indices: DeviceBuffer<I>,
    values: DeviceBuffer<T>,
}

impl<T: Element, I: SparseIndex> CooMatrix<T, I> {
    /// Validates `coo` on the host (sizes fit `I`, one value per triplet, indices in range) and
    /// uploads it.
    pub fn from_host(ctx: &Context, coo: &CooHost<T, I>) -> Result<Self> {
        let nnz = coo.row_indices.len();
        check_sizes::<I>(coo.rows, coo.cols, nnz)?;
        check_triplet_lengths(nnz, coo.col_indices.len(), coo.values.len())?;
        check_triplet_indices("row_indices", &coo.row_indices, coo.rows)?;
        check_triplet_indices("col_indices", &coo.col_indices, coo.cols)?;
        Converter::<T, I>::new(ctx)?;
        Ok(CooMatrix {
            ctx: ctx.clone(),
            rows: coo.rows,
            cols: coo.cols,
            nnz,
            row_indices: upload_nonempty(ctx, &coo.row_indices)?,
            col_indices: upload_nonempty(ctx, &coo.col_indices)?,
            values: upload_nonempty(ctx, &coo.values)?,
        })
    }

    /// Takes triplets already on the device (one per element of the three buffers), checking
    /// the sizes on the host and every index on the device; an index outside its dimension is
    /// an error naming the first such position.
    pub fn from_device(
        ctx: &Context,
        rows: usize,
        cols: usize,
        row_indices: DeviceBuffer<I>,
        col_indices: DeviceBuffer<I>,
        values: DeviceBuffer<T>,
    ) -> Result<Self> {
        let conv = Converter::<T, I>::new(ctx)?;
        let nnz = row_indices.len();
        check_sizes::<I>(rows, cols, nnz)?;
        check_triplet_lengths(nnz, col_indices.len(), values.len())?;
        for (what, buf, bound, dim) in [
            ("row_indices", &row_indices, rows, "rows"),
            ("col_indices", &col_indices, cols, "columns"),
        ] {
            if nnz == 0 {
                break;
            }
            let mut first = ctx.alloc::<i64>(1)?;
            first.fill_bytes(0xff)?;
            let p = ConvParams {
                keys_in: buf.device_ptr(),
                counters: first.device_ptr(),
                n: nnz as i64,
                bound: bound as i64,
                ..Default::default()
            };
            // SAFETY: buf holds nnz indices; first one counter.
            unsafe { conv.launch(Entry::CheckRange, grid_for(nnz), &p)? };
            let at = first.to_host()?[0];
            if at >= 0 {
                let at = at as usize;
                let v = conv.read_at(buf, at)?;
                return Err(Error::invalid(
                    what,
                    format!("{what}[{at}] = {v} is outside the {dim} 0..{bound}"),
                ));
            }
        }
        let nnz_buffers = |b: DeviceBuffer<I>| if nnz == 0 { conv.alloc(1) } else { Ok(b) };
        let values = if nnz == 0 { ctx.alloc::<T>(1)? } else { values };
        Ok(CooMatrix {
            ctx: ctx.clone(),
            rows,
            cols,
            nnz,
            row_indices: nnz_buffers(row_indices)?,
            col_indices: nnz_buffers(col_indices)?,
            values,
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// The number of triplets.
    pub fn nnz(&self) -> usize {
        self.nnz
    }
}

/// COO -> CSR on the device (see [`CsrMatrix::from_coo`]).
pub(crate) fn from_coo<T: Element, I: SparseIndex>(
    coo: &CooMatrix<T, I>,
    duplicates: Duplicates,
) -> Result<CsrMatrix<T, I>> {
    let conv = Converter::<T, I>::new(&coo.ctx)?;
    coo.ctx.synchronize()?;
    let start = Instant::now();
    let (rows, cols, n) = (coo.rows, coo.cols, coo.nnz);
    const WHAT: &str = "coo -> csr";
    if n == 0 {
        let offsets = conv.offsets_of(&coo.row_indices, 0, rows)?;
        return conv.finish(WHAT, start, 0, cols, offsets, conv.alloc(1)?, coo.ctx.alloc::<T>(1)?);
    }
    // stable by column, then stable by row: (row, column) order, input order among duplicates
    let (_, by_col) = conv.radix_sort(&coo.col_indices, None, n, cols)?;
    let row_keys = conv.gather(&coo.row_indices, &by_col, n)?;
    let (sorted_rows, perm) = conv.radix_sort(&row_keys, Some(&by_col), n, rows)?;
    drop((row_keys, by_col));
    let sorted_cols = conv.gather(&coo.col_indices, &perm, n)?;

    let mut flags = conv.alloc(n + 1)?;
    let mut first_dup = coo.ctx.alloc::<i64>(1)?;
    first_dup.fill_bytes(0xff)?;
    let p = ConvParams {
        rows_in: sorted_rows.device_ptr(),
        cols_in: sorted_cols.device_ptr(),
        scan: flags.device_ptr(),
        counters: first_dup.device_ptr(),
        n: n as i64,
        ..Default::default()
    };
    // SAFETY: sorted_rows and sorted_cols hold n entries, flags n + 1, first_dup one counter.
    unsafe { conv.launch(Entry::Heads, grid_for(n), &p)? };
    if duplicates == Duplicates::Reject {
        let at = first_dup.to_host()?[0];
        if at >= 0 {
            let at = at as usize;
            return Err(duplicate_error(
                conv.read_at(&sorted_rows, at)?,
                conv.read_at(&sorted_cols, at)?,
            ));
        }
    }
    conv.scan(&mut flags, n)?;
    let kept = conv.read_at(&flags, n)?;

    let out_rows = conv.alloc(kept)?;
    let indices = conv.alloc(kept)?;
    let values = coo.ctx.alloc::<T>(kept.max(1))?;
    let p = ConvParams {
        rows_in: sorted_rows.device_ptr(),
        cols_in: sorted_cols.device_ptr(),
        flags: flags.device_ptr(),
        perm_in: perm.device_ptr(),
        values_in: coo.values.device_ptr(),
        keys_out: out_rows.device_ptr(),
        perm_out: indices.device_ptr(),
        values_out: values.device_ptr(),
        n: n as i64,
        ..Default::default()
    };
    // SAFETY: the sorted arrays and perm hold n entries, flags n + 1 (scanned: every slot is
    // below kept); out_rows, indices and values hold kept; perm indexes the n input values.
    unsafe { conv.launch(Entry::SumRuns, grid_for(n), &p)? };
    let offsets = conv.offsets_of(&out_rows, kept, rows)?;
    let idx = std::mem::size_of::<I>();
    let scratch = (7 * n + DIGITS * n.div_ceil(TILE)) * idx;
    conv.finish(WHAT, start, scratch, cols, offsets, indices, values)
}

/// CSR -> BSR on the device (see [`CsrMatrix::to_bsr`] and the module documentation).
pub(crate) fn csr_to_bsr<T: Element, I: SparseIndex>(a: &CsrMatrix<T, I>, block: usize) -> Result<BsrMatrix<T, I>> {
    check_conversion_block(block)?;
    let conv = Converter::<T, I>::new(a.context())?;
    let ctx = a.context();
    ctx.synchronize()?;
    let start = Instant::now();
    let (rows, cols, nnz) = (a.rows(), a.cols(), a.nnz());
    let block_rows = rows.div_ceil(block);
    const WHAT: &str = "csr -> bsr";
    let report = |bytes: usize, scratch_bytes: usize| ConversionReport {
        what: WHAT,
        elapsed: start.elapsed(),
        bytes,
        scratch_bytes,
    };
    if nnz == 0 {
        let mut offsets = ctx.alloc::<I>(block_rows + 1)?;
        offsets.fill_bytes(0)?;
        let (indices, values) = (conv.alloc(1)?, ctx.alloc::<T>(1)?);
        ctx.synchronize()?;
        let r = report(offsets.bytes() + indices.bytes() + values.bytes(), 0);
        return Ok(BsrMatrix::from_device_parts(
            ctx,
            (rows, cols, block),
            offsets,
            indices,
            values,
            0,
            Some(r),
        ));
    }
    let grid_rows = grid_u32(rows.div_ceil((BLOCK_THREADS / 32) as usize), "rows")?;
    // the row of every entry, then its block row
    let row_of = conv.alloc(nnz)?;
    let p = ConvParams {
        offsets: a.offsets.device_ptr(),
        keys_out: row_of.device_ptr(),
        rows: rows as i64,
        ..Default::default()
    };
    // SAFETY: offsets holds rows + 1 entries ending at nnz; row_of holds nnz.
    unsafe { conv.launch(Entry::ExpandRows, grid_rows, &p)? };
    let block_row_of = conv.alloc(nnz)?;
    let p = ConvParams {
        keys_in: row_of.device_ptr(),
        keys_out: block_row_of.device_ptr(),
        n: nnz as i64,
        block: block as i64,
        ..Default::default()
    };
    // SAFETY: both hold nnz entries.
    unsafe { conv.launch(Entry::BlockRows, grid_for(nnz), &p)? };
    // stable by column, then stable by block row: (block row, column, input position)
    let (_, by_col) = conv.radix_sort(&a.indices, None, nnz, cols)?;
    let keys = conv.gather(&block_row_of, &by_col, nnz)?;
    drop(block_row_of);
    let (sorted_br, perm) = conv.radix_sort(&keys, Some(&by_col), nnz, block_rows)?;
    drop((keys, by_col));

    let mut flags = conv.alloc(nnz + 1)?;
    let p = ConvParams {
        keys_in: sorted_br.device_ptr(),
        perm_in: perm.device_ptr(),
        indices: a.indices.device_ptr(),
        scan: flags.device_ptr(),
        n: nnz as i64,
        block: block as i64,
        ..Default::default()
    };
    // SAFETY: sorted_br and perm hold nnz entries (perm: positions of a's nnz indices); flags
    // holds nnz + 1.
    unsafe { conv.launch(Entry::BsrHeads, grid_for(nnz), &p)? };
    conv.scan(&mut flags, nnz)?;
    let nnzb = conv.read_at(&flags, nnz)?;
    check_sizes::<I>(rows, cols, nnzb)?;

    let out_br = conv.alloc(nnzb)?;
    let indices = conv.alloc(nnzb)?;
    let p = ConvParams {
        keys_in: sorted_br.device_ptr(),
        perm_in: perm.device_ptr(),
        indices: a.indices.device_ptr(),
        flags: flags.device_ptr(),
        keys_out: out_br.device_ptr(),
        perm_out: indices.device_ptr(),
        n: nnz as i64,
        block: block as i64,
        ..Default::default()
    };
    // SAFETY: as for the heads; flags is scanned (every slot below nnzb), out_br and indices
    // hold nnzb.
    unsafe { conv.launch(Entry::BsrBlocks, grid_for(nnz), &p)? };
    let offsets = conv.offsets_of(&out_br, nnzb, block_rows)?;
    drop(out_br);

    let bb = block * block;
    let mut values = ctx.alloc::<T>(nnzb * bb)?;
    values.fill_bytes(0)?;
    let p = ConvParams {
        perm_in: perm.device_ptr(),
        rows_in: row_of.device_ptr(),
        indices: a.indices.device_ptr(),
        flags: flags.device_ptr(),
        values_in: a.values.device_ptr(),
        values_out: values.device_ptr(),
        n: nnz as i64,
        block: block as i64,
        ..Default::default()
    };
    // SAFETY: perm holds nnz positions into a's arrays and row_of (nnz each); flags nnz + 1,
    // scanned, so every block slot is below nnzb and every written position below nnzb * b * b
    // (row % b, column % b < b).
    unsafe { conv.launch(Entry::BsrFill, grid_for(nnz), &p)? };
    ctx.synchronize()?;
    let idx = std::mem::size_of::<I>();
    let scratch = (8 * nnz + DIGITS * nnz.div_ceil(TILE)) * idx;
    let r = report(offsets.bytes() + indices.bytes() + values.bytes(), scratch);
    Ok(BsrMatrix::from_device_parts(
        ctx,
        (rows, cols, block),
        offsets,
        indices,
        values,
        nnzb,
        Some(r),
    ))
}

/// BSR -> Blocked-ELL on the device (see [`BsrMatrix::to_blocked_ell`]).
pub(crate) fn bsr_to_bell<T: Element, I: SparseIndex>(a: &BsrMatrix<T, I>) -> Result<BellMatrix<T, I>> {
    let conv = Converter::<T, I>::new(a.context())?;
    let ctx = a.context();
    ctx.synchronize()?;
    let start = Instant::now();
    let (rows, cols, block) = (a.rows(), a.cols(), a.block());
    let block_rows = a.block_rows();
    let (offsets, block_indices, values_in) = a.arrays();
    let host_offsets = offsets.to_host()?;
    let width = host_offsets
        .windows(2)
        .map(|w| w[1].to_usize() - w[0].to_usize())
        .max()
        .unwrap_or(0);
    let slots = block_rows * width;
    check_sizes::<I>(rows, cols, slots)?;
    let bb = block * block;
    let mut indices = conv.alloc(slots)?;
    indices.fill_bytes(0xff)?; // -1: padding
    let mut values = ctx.alloc::<T>((slots * bb).max(1))?;
    values.fill_bytes(0)?;
    let nnzb = a.nnzb();
    let mut scratch = 0;
    if nnzb > 0 {
        let block_row_of = conv.alloc(nnzb)?;
        let p = ConvParams {
            offsets: offsets.device_ptr(),
            keys_out: block_row_of.device_ptr(),
            rows: block_rows as i64,
            ..Default::default()
        };
        // SAFETY: offsets holds block_rows + 1 entries ending at nnzb; block_row_of holds nnzb.
        unsafe {
            conv.launch(
                Entry::ExpandRows,
                grid_u32(block_rows.div_ceil((BLOCK_THREADS / 32) as usize), "block rows")?,
                &p,
            )?
        };
        let p = ConvParams {
            keys_in: block_row_of.device_ptr(),
            offsets: offsets.device_ptr(),
            indices: block_indices.device_ptr(),
            values_in: values_in.device_ptr(),
            values_out: values.device_ptr(),
            keys_out: indices.device_ptr(),
            n: (nnzb * bb) as i64,
            block: block as i64,
            width: width as i64,
            ..Default::default()
        };
        // SAFETY: values_in holds nnzb * b * b, block_row_of / block_indices nnzb; each block s
        // of block row br goes to slot br * width + (s - offsets[br]) < block_rows * width
        // (no block row holds more than width blocks): indices holds slots, values slots * b * b.
        unsafe { conv.launch(Entry::BellFill, grid_for(nnzb * bb), &p)? };
        scratch = nnzb * std::mem::size_of::<I>();
        ctx.synchronize()?;
    }
    let report = ConversionReport {
        what: "bsr -> blocked-ell",
        elapsed: start.elapsed(),
        bytes: indices.bytes() + values.bytes(),
        scratch_bytes: scratch,
    };
    BellMatrix::from_device_parts(ctx, (rows, cols, block), width, indices, values, Some(report))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every conversion kernel compiles for every CI architecture without spills (needs NVRTC
    /// only; the registry's test does the same for all operators).
    #[test]
    fn conversion_kernels_compile_without_spills() {
        if !crate::runtime::probe::nvrtc_or_skip("conversion_kernels_compile_without_spills") {
            return;
        }
        for arch in crate::runtime::Arch::CI_TARGETS {
            for v in all_variants() {
                let c = crate::runtime::compile_only(&v.spec(), arch).unwrap_or_else(|e| panic!("{v:?} {arch}: {e}"));
                assert!(c.resources.spill_free(), "{v:?} {arch}: {:?}\n{}", c.resources, c.log);
            }
        }
    }

    #[test]
    fn radix_passes_cover_the_largest_key() {
        assert_eq!(key_bits(0), 0);
        assert_eq!(key_bits(1), 0);
        assert_eq!(key_bits(2), 1);
        assert_eq!(key_bits(256), 8);
        assert_eq!(key_bits(257), 9);
        assert_eq!(key_bits(1 << 21), 21);
        assert_eq!(key_bits(usize::MAX), 64);
    }

    #[test]
    fn variant_names_are_distinct() {
        let v = all_variants();
        let mut names: Vec<String> = v.iter().map(|v| v.spec().name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), v.len());
        assert_eq!(v.len(), 2 * (14 + 4 * 4));
    }

    /// The radix pass of convert.cu, step for step on the host (digit-major tile histograms,
    /// their exclusive scan, ranks by warp then item then lane): it must be a stable sort.
    #[test]
    #[allow(clippy::needless_range_loop)] // indices mirror the kernel's (warp, item, lane)
    fn radix_pass_model_is_a_stable_sort() {
        let mut state = 0x9e3779b97f4a7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for n in [0usize, 1, 31, 2047, 2048, 2049, 9001] {
            let keys: Vec<u32> = (0..n).map(|_| (next() % 300) as u32).collect();
            let mut order: Vec<usize> = (0..n).collect();
            let mut cur = keys.clone();
            for shift in [0u32, 8] {
                let tiles = n.div_ceil(TILE);
                let digit = |k: u32| ((k >> shift) & 255) as usize;
                let mut hist = vec![0usize; DIGITS * tiles];
                for (i, &k) in cur.iter().enumerate() {
                    hist[digit(k) * tiles + i / TILE] += 1;
                }
                let mut run = 0;
                for h in hist.iter_mut() {
                    let c = *h;
                    *h = run;
                    run += c;
                }
                let warps = BLOCK_THREADS as usize / 32;
                let mut out_keys = vec![0u32; n];
                let mut out_order = vec![0usize; n];
                for t in 0..tiles {
                    let mut warp_counts = vec![[0usize; DIGITS]; warps];
                    let mut ranks = vec![0usize; TILE];
                    for w in 0..warps {
                        for item in 0..ITEMS {
                            for lane in 0..32 {
                                let at = t * TILE + w * ITEMS * 32 + item * 32 + lane;
                                if at < n {
                                    let d = digit(cur[at]);
                                    ranks[at - t * TILE] = warp_counts[w][d];
                                    warp_counts[w][d] += 1;
                                }
                            }
                        }
                    }
                    for d in 0..DIGITS {
                        let mut run = 0;
                        for wc in warp_counts.iter_mut() {
                            let c = wc[d];
                            wc[d] = run;
                            run += c;
                        }
                    }
                    for local in 0..TILE {
                        let at = t * TILE + local;
                        if at < n {
                            let d = digit(cur[at]);
                            let w = local / (ITEMS * 32);
                            let slot = hist[d * tiles + t] + warp_counts[w][d] + ranks[local];
                            out_keys[slot] = cur[at];
                            out_order[slot] = order[at];
                        }
                    }
                }
                cur = out_keys;
                order = out_order;
            }
            let mut want: Vec<usize> = (0..n).collect();
            want.sort_by_key(|&i| keys[i]);
            assert_eq!(order, want, "n = {n}");
        }
    }
}
