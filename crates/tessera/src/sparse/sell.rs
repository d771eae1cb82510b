//! SELL-C-sigma ([`SellMatrix`]): rows sorted by length within windows of `sigma` rows, cut into
//! slices of C = [`SLICE_ROWS`] rows stored column-major and padded to the slice's longest row,
//! and its SpMV (`spmv_sell.cu`, one thread per row, deterministic). For short rows of very
//! different lengths (power-law), where CSR's lanes per row fit some rows badly and sorting
//! makes the slices nearly rectangular; [`prefers_sell`] is the rule, [`padding_ratio`] its
//! cost term, computable from the row lengths before building anything.
//!
//! Built on the host (O(nnz + rows log sigma)) from a [`CsrHost`], or from a [`CsrMatrix`]
//! (downloaded once); the cost is reported ([`SellMatrix::conversion`]).

use std::sync::Arc;
use std::time::Instant;

use super::convert::ConversionReport;
use super::descriptor::SparseDescriptor;
use super::device::{check_spmv_operands, upload_nonempty, CsrMatrix, VALUE_DTYPES};
use super::host::{check_sizes, CsrHost};
use super::index::SparseIndex;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::runtime::{Context, DeviceBuffer, Kernel, KernelKey, KernelParams, KernelSpec, LaunchConfig};

/// Source of the SELL SpMV kernel.
pub const SOURCE: &str = include_str!("spmv_sell.cu");
/// Rows per slice (C): one warp.
pub const SLICE_ROWS: usize = 32;
/// Threads per CTA.
pub const BLOCK_THREADS: u32 = 256;
/// SELL is preferred only for rows this short on average (longer rows keep a warp busy in CSR).
pub const SELL_MAX_AVG_ROW: f64 = 32.0;
/// ... and only when row lengths vary this much (coefficient of variation): uniform rows gain
/// nothing from sorting.
pub const SELL_MIN_ROW_CV: f64 = 0.5;
/// ... and only when padding adds at most this fraction of stored entries (stored / nnz).
pub const SELL_MAX_PADDING: f64 = 1.25;

/// Options of [`SellMatrix`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SellOptions {
    /// Rows sorted by length within windows of this many rows (a positive multiple of
    /// [`SLICE_ROWS`]). Default 1024: wide enough to group rows of a power-law matrix into
    /// nearly rectangular slices, narrow enough that x is gathered in roughly row order.
    pub sigma: usize,
}

impl Default for SellOptions {
    fn default() -> Self {
        SellOptions { sigma: 1024 }
    }
}

/// Stored entries / nonzeros of the SELL-C-sigma form of rows of `lengths` (1 without
/// nonzeros): what the slices' padding costs.
pub fn padding_ratio(lengths: &[usize], sigma: usize) -> f64 {
    let nnz: usize = lengths.iter().sum();
    if nnz == 0 {
        return 1.0;
    }
    let order = sorted_order(lengths, sigma.max(1));
    let stored: usize = order
        .chunks(SLICE_ROWS)
        .map(|s| SLICE_ROWS * s.iter().map(|&r| lengths[r]).max().unwrap_or(0))
        .sum();
    stored as f64 / nnz as f64
}

/// The dispatch rule: SELL-C-sigma for short rows of high variance whose padding stays small.
pub fn prefers_sell(d: &SparseDescriptor, padding: f64) -> bool {
    d.nnz > 0 && d.avg_row <= SELL_MAX_AVG_ROW && d.row_cv >= SELL_MIN_ROW_CV && padding <= SELL_MAX_PADDING
}

/// Rows in SELL order: within each window of `sigma` rows, longest first (stable).
fn sorted_order(lengths: &[usize], sigma: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    for window in order.chunks_mut(sigma) {
        window.sort_by_key(|&r| std::cmp::Reverse(lengths[r]));
    }
    order
}

/// The SELL arrays on the host.
struct SellHost<T, I> {
    slice_offsets: Vec<I>,
    slice_width: Vec<i32>,
    indices: Vec<I>,
    values: Vec<T>,
    row_of: Vec<I>,
}

fn build<T: Element, I: SparseIndex>(a: &CsrHost<T, I>, sigma: usize) -> Result<SellHost<T, I>> {
    let lengths: Vec<usize> = (0..a.rows).map(|r| a.row_len(r)).collect();
    let order = sorted_order(&lengths, sigma);
    let slices = a.rows.div_ceil(SLICE_ROWS);
    let mut slice_offsets = Vec::with_capacity(slices + 1);
    let mut slice_width = Vec::with_capacity(slices);
    let mut stored = 0usize;
    slice_offsets.push(I::ZERO);
    for s in order.chunks(SLICE_ROWS) {
        let width = s.iter().map(|&r| lengths[r]).max().unwrap_or(0);
        slice_width
            .push(i32::try_from(width).map_err(|_| Error::Unsupported(format!("SELL rows of {width} nonzeros")))?);
        stored += SLICE_ROWS * width;
        check_sizes::<I>(a.rows, a.cols, stored).map_err(|_| {
            Error::Unsupported(format!(
                "SELL storage of {stored} entries (padding included) does not fit the {} index type",
                I::DTYPE
            ))
        })?;
        slice_offsets.push(I::from_usize_in_range(stored));
    }
    let mut indices = vec![I::ZERO; stored];
    let mut values = vec![T::default(); stored];
    for (s, rows) in order.chunks(SLICE_ROWS).enumerate() {
        let base = slice_offsets[s].to_usize();
        for (lane, &r) in rows.iter().enumerate() {
            let (cols, vals) = a.row(r);
            for (j, (&c, &v)) in cols.iter().zip(vals).enumerate() {
                indices[base + j * SLICE_ROWS + lane] = c;
                values[base + j * SLICE_ROWS + lane] = v;
            }
        }
    }
    Ok(SellHost {
        slice_offsets,
        slice_width,
        indices,
        values,
        row_of: order.into_iter().map(I::from_usize_in_range).collect(),
    })
}

/// The SELL SpMV kernel of one (value, index) pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SellVariant {
    pub value: DType,
    pub index: DType,
}

impl SellVariant {
    pub fn key(&self) -> KernelKey {
        KernelKey::new("spmv_sell")
            .ty("Val", self.value)
            .ty("Idx", self.index)
            .int("kBlockThreads", "t", BLOCK_THREADS)
    }
    pub fn spec(&self) -> KernelSpec {
        self.key().spec("spmv_sell.cu", SOURCE, "spmv_sell", &[])
    }
}

/// Every variant, for the compile tests.
pub fn all_variants() -> Vec<SellVariant> {
    VALUE_DTYPES
        .into_iter()
        .flat_map(|value| [DType::I32, DType::I64].map(|index| SellVariant { value, index }))
        .collect()
}

/// `struct SellParams` of spmv_sell.cu (80 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct SellParams {
    slice_offsets: u64,
    slice_width: u64,
    indices: u64,
    values: u64,
    row_of: u64,
    x: u64,
    y: u64,
    rows: i64,
    alpha: f64,
    beta: f64,
}
const _: () = assert!(std::mem::size_of::<SellParams>() == 80);
// SAFETY: #[repr(C)], ten eight-byte fields (pointers as u64, long long, double) in the order
// and of the types of the kernel's struct.
unsafe impl KernelParams for SellParams {}

/// A matrix in SELL-C-sigma form on the device, with its SpMV kernel.
pub struct SellMatrix<T: Element, I: SparseIndex> {
    ctx: Context,
    rows: usize,
    cols: usize,
    nnz: usize,
    stored: usize,
    sigma: usize,
    slice_offsets: DeviceBuffer<I>,
    slice_width: DeviceBuffer<i32>,
    indices: DeviceBuffer<I>,
    values: DeviceBuffer<T>,
    row_of: DeviceBuffer<I>,
    kernel: Arc<Kernel>,
    conversion: ConversionReport,
}

impl<T: Element, I: SparseIndex> SellMatrix<T, I> {
    /// Builds the SELL-C-sigma form of `a` on the host and uploads it.
    pub fn from_host(ctx: &Context, a: &CsrHost<T, I>, opts: &SellOptions) -> Result<Self> {
        let start = Instant::now();
        if opts.sigma == 0 || opts.sigma % SLICE_ROWS != 0 {
            return Err(Error::invalid(
                "sigma",
                format!(
                    "{}; the sorting window is a positive multiple of the slice height {SLICE_ROWS}",
                    opts.sigma
                ),
            ));
        }
        if !VALUE_DTYPES.contains(&T::DTYPE) {
            return Err(Error::Unsupported(format!(
                "sparse values of {}; supported: fp32, fp64, fp16, bf16",
                T::DTYPE
            )));
        }
        a.validate()?;
        let h = build(a, opts.sigma)?;
        let kernel = ctx.kernel(
            &SellVariant {
                value: T::DTYPE,
                index: I::DTYPE,
            }
            .spec(),
        )?;
        let bytes = std::mem::size_of_val(&h.slice_offsets[..])
            + std::mem::size_of_val(&h.slice_width[..])
            + std::mem::size_of_val(&h.indices[..])
            + std::mem::size_of_val(&h.values[..])
            + std::mem::size_of_val(&h.row_of[..]);
        Ok(SellMatrix {
            ctx: ctx.clone(),
            rows: a.rows,
            cols: a.cols,
            nnz: a.nnz(),
            stored: h.indices.len(),
            sigma: opts.sigma,
            slice_offsets: ctx.upload(&h.slice_offsets)?,
            slice_width: upload_nonempty(ctx, &h.slice_width)?,
            indices: upload_nonempty(ctx, &h.indices)?,
            values: upload_nonempty(ctx, &h.values)?,
            row_of: upload_nonempty(ctx, &h.row_of)?,
            kernel,
            conversion: ConversionReport {
                what: "csr -> sell-c-sigma (host)",
                elapsed: start.elapsed(),
                bytes,
                scratch_bytes: 0,
            },
        })
    }

    /// The SELL-C-sigma form of a device CSR matrix (downloaded once, built on the host).
    pub fn from_csr(a: &CsrMatrix<T, I>, opts: &SellOptions) -> Result<Self> {
        let start = Instant::now();
        let nnz = a.nnz();
        let host = CsrHost {
            rows: a.rows(),
            cols: a.cols(),
            offsets: a.offsets.to_host()?,
            indices: a.indices.to_host()?[..nnz].to_vec(),
            values: a.values.to_host()?[..nnz].to_vec(),
            sorted: false,
        };
        let host = CsrHost {
            sorted: (0..host.rows).all(|r| host.row(r).0.windows(2).all(|w| w[0] < w[1])),
            ..host
        };
        let mut m = Self::from_host(a.context(), &host, opts)?;
        m.conversion.what = "csr -> sell-c-sigma (via host)";
        m.conversion.elapsed = start.elapsed();
        Ok(m)
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    pub fn nnz(&self) -> usize {
        self.nnz
    }
    pub fn sigma(&self) -> usize {
        self.sigma
    }
    /// Stored entries (padding included) / nonzeros; 1 without nonzeros.
    pub fn padding_ratio(&self) -> f64 {
        if self.nnz == 0 {
            1.0
        } else {
            self.stored as f64 / self.nnz as f64
        }
    }
    /// What building it cost.
    pub fn conversion(&self) -> &ConversionReport {
        &self.conversion
    }

    /// `y = alpha * A x + beta * y` (deterministic); `x` has `cols` elements, `y` `rows`;
    /// `beta == 0` does not read `y`.
    pub fn spmv(&self, alpha: f64, x: &DeviceBuffer<T>, beta: f64, y: &mut DeviceBuffer<T>) -> Result<()> {
        check_spmv_operands(self.rows, self.cols, x.len(), y.len(), alpha, beta)?;
        if self.rows == 0 {
            return Ok(());
        }
        let params = SellParams {
            slice_offsets: self.slice_offsets.device_ptr(),
            slice_width: self.slice_width.device_ptr(),
            indices: self.indices.device_ptr(),
            values: self.values.device_ptr(),
            row_of: self.row_of.device_ptr(),
            x: x.device_ptr(),
            y: y.device_ptr(),
            rows: self.rows as i64,
            alpha,
            beta,
        };
        let grid = u32::try_from(self.rows.div_ceil(BLOCK_THREADS as usize))
            .map_err(|_| Error::Unsupported(format!("{} rows: more CTAs than a grid holds", self.rows)))?;
        // SAFETY: the arrays were built together (build): slice s covers entries
        // slice_offsets[s] .. + 32 * slice_width[s], every index (padding: 0, with cols >= 1
        // whenever an entry exists) is in 0..cols and x has >= cols elements; row_of is a
        // permutation of 0..rows and y has >= rows, each written by one thread. SellParams
        // mirrors the kernel's struct.
        unsafe {
            self.kernel
                .launch(&self.ctx, LaunchConfig::linear(grid, BLOCK_THREADS, 0), &params)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(lengths: &[usize], cols: usize) -> CsrHost<f64, i32> {
        let mut dense = vec![0.0; lengths.len() * cols];
        for (r, &l) in lengths.iter().enumerate() {
            for c in 0..l {
                dense[r * cols + (c * 7 + r) % cols] = (r * 100 + c) as f64 + 1.0;
            }
        }
        CsrHost::from_dense(lengths.len(), cols, &dense)
    }

    #[test]
    fn slices_are_column_major_and_cover_every_entry_once() {
        let lengths: Vec<usize> = (0..70).map(|r| (r * 13) % 9).collect();
        let a = matrix(&lengths, 50);
        let h = build(&a, 64).unwrap();
        assert_eq!(h.slice_width.len(), 3);
        // y = A x through the SELL arrays equals the CSR product
        let x: Vec<f64> = (0..50).map(|c| c as f64 * 0.5 - 3.0).collect();
        let mut y = vec![0.0; 70];
        for s in 0..3 {
            let base = h.slice_offsets[s] as usize;
            for lane in 0..SLICE_ROWS {
                let sorted = s * SLICE_ROWS + lane;
                if sorted >= 70 {
                    continue;
                }
                let mut sum = 0.0;
                for j in 0..h.slice_width[s] as usize {
                    let at = base + j * SLICE_ROWS + lane;
                    sum += h.values[at] * x[h.indices[at] as usize];
                }
                y[h.row_of[sorted] as usize] = sum;
            }
        }
        let mut want = vec![0.0; 70];
        super::super::reference::spmv(&a, 1.0, &x, 0.0, &mut want);
        assert_eq!(y, want);
        // rows are sorted longest first within each window of 64
        let lens: Vec<usize> = h.row_of.iter().map(|&r| lengths[r as usize]).collect();
        assert!(lens[..64].windows(2).all(|w| w[0] >= w[1]));
        assert!(lens[64..].windows(2).all(|w| w[0] >= w[1]));
        let stored: usize = h.slice_width.iter().map(|&w| w as usize * SLICE_ROWS).sum();
        assert_eq!(stored, h.indices.len());
        assert!((padding_ratio(&lengths, 64) - stored as f64 / a.nnz() as f64).abs() < 1e-12);
    }

    #[test]
    fn rule_takes_short_uneven_rows_with_little_padding() {
        // short rows of 1..16 nonzeros in scrambled order: sorted, the slices are tight
        let lengths: Vec<usize> = (0..4096).map(|r| 1 + (r * 7919) % 16).collect();
        let a = matrix(&lengths, 128);
        let d = SparseDescriptor::of(&a);
        let padding = padding_ratio(&lengths, 1024);
        assert!(d.row_cv >= SELL_MIN_ROW_CV, "{d}");
        assert!(prefers_sell(&d, padding), "{d} padding {padding}");
        // unsorted (sigma = one slice) pads much more
        assert!(padding_ratio(&lengths, SLICE_ROWS) > SELL_MAX_PADDING);
        // a few rows far longer than the rest pad their slices: no
        let spiky: Vec<usize> = (0..4096).map(|r| if r % 97 == 0 { 60 } else { 1 + r % 5 }).collect();
        assert!(padding_ratio(&spiky, 1024) > SELL_MAX_PADDING);
        // uniform rows: no
        let uniform = matrix(&[8; 512], 64);
        assert!(!prefers_sell(&SparseDescriptor::of(&uniform), 1.0));
        // too much padding: no
        assert!(!prefers_sell(&d, 2.0));
        assert_eq!(padding_ratio(&[0, 0, 0], 32), 1.0);
    }

    #[test]
    fn sell_kernels_compile_without_spills() {
        if !crate::runtime::probe::nvrtc_or_skip("sell_kernels_compile_without_spills") {
            return;
        }
        for arch in crate::runtime::Arch::CI_TARGETS {
            for v in all_variants() {
                let c = crate::runtime::compile_only(&v.spec(), arch).unwrap_or_else(|e| panic!("{v:?} {arch}: {e}"));
                assert!(c.resources.spill_free(), "{v:?} {arch}: {:?}", c.resources);
            }
        }
    }

    #[test]
    fn variants_are_distinct() {
        let mut names: Vec<String> = all_variants().iter().map(|v| v.spec().name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 8);
    }
}
