//! The merge-path CSR SpMV (`spmv_merge.cu`, opt-in by [`SpmvTuning::merge_path`]): every thread
//! consumes [`ITEMS_PER_THREAD`] items of the rows' ends merged with the nonzeros, so the work per
//! thread does not depend on the row lengths (Merrill & Garland 2016). Deterministic: rows
//! spanning threads or CTAs are summed in an order fixed by the matrix (carries in shared memory,
//! then one carry slot per CTA summed in CTA order by a second small kernel), no atomics.
//!
//! The plan part is only the grid size and the three carry arrays (one slot per CTA); each CTA
//! finds its tile on the device, so nothing here depends on more than the shape and nnz.
//!
//! [`SpmvTuning::merge_path`]: super::SpmvTuning::merge_path

use std::sync::Arc;

use super::device::CsrMatrix;
use super::index::SparseIndex;
use super::spmv::{skip_ptr, SkipIf, SPMV_HEADERS};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::runtime::{Context, DeviceBuffer, Kernel, KernelKey, KernelParams, KernelSpec, LaunchConfig};

/// Source of the merge-path kernels.
pub const SOURCE: &str = include_str!("spmv_merge.cu");
/// Threads per CTA of both kernels.
pub const BLOCK_THREADS: u32 = 256;
/// Merge items (row ends and nonzeros) per thread: odd, so the threads' walks through shared
/// memory start on different banks (see the header of `spmv_merge.cu`).
pub const ITEMS_PER_THREAD: u32 = 7;
/// Merge items per CTA.
pub const TILE_ITEMS: usize = (ITEMS_PER_THREAD * BLOCK_THREADS) as usize;

/// Which of the two kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MergeKernel {
    /// `spmv_merge`: one tile of [`TILE_ITEMS`] per CTA.
    Tiles,
    /// `spmv_merge_fixup`: the rows spanning CTAs, one thread per CTA carry.
    Fixup,
}

/// A merge-path kernel variant: its specialisation constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MergeVariant {
    pub value: DType,
    pub index: DType,
    pub kernel: MergeKernel,
}

impl MergeVariant {
    /// The kernel's entry point in `spmv_merge.cu`, also its key's family.
    fn entry(&self) -> &'static str {
        match self.kernel {
            MergeKernel::Tiles => "spmv_merge",
            MergeKernel::Fixup => "spmv_merge_fixup",
        }
    }
    pub fn key(&self) -> KernelKey {
        KernelKey::new(self.entry())
            .ty("Val", self.value)
            .ty("Idx", self.index)
            .int("kItemsPerThread", "i", ITEMS_PER_THREAD)
            .int("kBlockThreads", "t", BLOCK_THREADS)
    }
    pub fn spec(&self) -> KernelSpec {
        self.key().spec("spmv_merge.cu", SOURCE, self.entry(), SPMV_HEADERS)
    }
}

/// Every variant, for the compile tests and `tessera compile`.
pub fn all_variants() -> Vec<MergeVariant> {
    let mut v = Vec::new();
    for value in super::device::VALUE_DTYPES {
        for index in [DType::I32, DType::I64] {
            for kernel in [MergeKernel::Tiles, MergeKernel::Fixup] {
                v.push(MergeVariant { value, index, kernel });
            }
        }
    }
    v
}

/// CTAs of `spmv_merge` for `rows` rows and `nnz` nonzeros: one per [`TILE_ITEMS`] merge items.
pub fn merge_ctas(rows: usize, nnz: usize) -> usize {
    (rows + nnz).div_ceil(TILE_ITEMS)
}

/// `struct MergeParams` of spmv_merge.cu (104 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct MergeParams {
    offsets: u64,
    indices: u64,
    values: u64,
    x: u64,
    y: u64,
    rows: i64,
    nnz: i64,
    ctas: i64,
    alpha: f64,
    beta: f64,
    carry_row: u64,
    carry_sum: u64,
    head_sum: u64,
    skip: u64,
}
const _: () = assert!(std::mem::size_of::<MergeParams>() == 112);
// SAFETY: #[repr(C)]: fourteen eight-byte fields (pointers as u64, i64, f64) in the order and of
// the types of the kernel's struct (pointers, long long, double).
unsafe impl KernelParams for MergeParams {}

/// The merge path of one SpMV plan: its kernels, grid and carry slots.
pub(crate) struct MergePath {
    rows: usize,
    nnz: usize,
    ctas: usize,
    /// One slot per CTA: the row a tile ends inside, or -1.
    carry_row: DeviceBuffer<i64>,
    /// One f64 slot per CTA (f32 kernels use the first half of the bytes).
    carry_sum: DeviceBuffer<f64>,
    head_sum: DeviceBuffer<f64>,
    tiles: Arc<Kernel>,
    fixup: Arc<Kernel>,
}

impl MergePath {
    /// Compiles the kernels of (`value`, `index`) and allocates one carry slot per CTA of a
    /// `rows x _` matrix of `nnz` nonzeros.
    pub fn new(ctx: &Context, value: DType, index: DType, rows: usize, nnz: usize) -> Result<Self> {
        let ctas = merge_ctas(rows, nnz);
        if u32::try_from(ctas).is_err() {
            return Err(Error::Unsupported(format!(
                "{rows} rows and {nnz} nonzeros: {ctas} merge-path tiles, more CTAs than a grid holds"
            )));
        }
        let variant = |kernel| MergeVariant { value, index, kernel };
        Ok(MergePath {
            rows,
            nnz,
            ctas,
            carry_row: ctx.alloc::<i64>(ctas.max(1))?,
            carry_sum: ctx.alloc::<f64>(ctas.max(1))?,
            head_sum: ctx.alloc::<f64>(ctas.max(1))?,
            tiles: ctx.kernel(&variant(MergeKernel::Tiles).spec())?,
            fixup: ctx.kernel(&variant(MergeKernel::Fixup).spec())?,
        })
    }

    /// `y = alpha A x + beta y`: launches both kernels on the context's stream (both do nothing
    /// when `skip`'s flag is set as they run).
    ///
    /// # Safety
    /// `a` must be the matrix this path was made for (value and index types, rows and nnz),
    /// checked by the caller, with its CSR validated on construction (offsets non-decreasing
    /// from 0 to nnz, every index in `0..cols`); `x` at least `cols` elements, `y` at least `rows`.
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
        if self.ctas == 0 {
            return Ok(());
        }
        let params = MergeParams {
            offsets: a.offsets.device_ptr(),
            indices: a.indices.device_ptr(),
            values: a.values.device_ptr(),
            x: x.device_ptr(),
            y: y.device_ptr(),
            rows: self.rows as i64,
            nnz: self.nnz as i64,
            ctas: self.ctas as i64,
            alpha,
            beta,
            carry_row: self.carry_row.device_ptr(),
            carry_sum: self.carry_sum.device_ptr(),
            head_sum: self.head_sum.device_ptr(),
            skip: skip_ptr(skip),
        };
        // checked to fit on construction
        let grid = self.ctas as u32;
        // SAFETY: the caller's contract above; every CTA reads offsets only at path points in
        // 0..=rows, indices and values in 0..nnz, and writes y rows in 0..rows (each once) and
        // its own carry slots (ctas of them allocated); the fixup reads those slots in 0..ctas.
        unsafe {
            self.tiles
                .launch(ctx, LaunchConfig::linear(grid, BLOCK_THREADS, 0), &params)?;
            self.fixup.launch(
                ctx,
                LaunchConfig::linear(grid.div_ceil(BLOCK_THREADS), BLOCK_THREADS, 0),
                &params,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_are_distinct_and_tiles_are_odd() {
        let mut names: Vec<String> = all_variants().iter().map(|v| v.spec().name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 16);
        assert_eq!(ITEMS_PER_THREAD % 2, 1);
        assert_eq!(merge_ctas(0, 0), 0);
        assert_eq!(merge_ctas(1, 0), 1);
        assert_eq!(merge_ctas(TILE_ITEMS - 5, 5), 1);
        assert_eq!(merge_ctas(TILE_ITEMS - 5, 6), 2);
    }
}
