//! Block-sparse matrices on the device: BSR ([`BsrMatrix`]) and Blocked-ELL ([`BellMatrix`]),
//! square blocks of 2, 4, 8, 16 or 32 (layouts in [`block`](super::block)), with SpMV
//! (`spmv_bsr.cu`) and SpMM `C = alpha A B + beta C` (`spmm_bsr.cu`, B and C row- or
//! column-major). Both kernels serve both formats (Blocked-ELL is BSR with a fixed stride per
//! block row and -1 padding slots) and are deterministic.
//!
//! # Which SpMM path runs
//! * fp16 / bf16 values with 16 x 16 or 32 x 32 blocks: tensor cores (`mma.sync` m16n8k16, f32
//!   accumulate), a warp per block row and tile of 8, 16 or 32 columns ([`tensor_core_n8`]).
//! * Everything else, fp32 included: CUDA cores, a warp per block row and 32 columns, products
//!   and sums in the value's own precision (f64 for f64). fp32 does **not** go through tf32
//!   tensor cores: tf32 keeps 10 mantissa bits, so an fp32 SpMM would silently lose about three
//!   decimal digits (DESIGN.md's tf32 budget is 1e-3 against fp32's 1e-5). A tf32 path would be
//!   an explicit opt-in; it is not built yet.
//! * `spmm_on` forces a path for tests and benchmarks: the CUDA-core path for fp16/bf16 with
//!   16 x 16 blocks (what the tensor cores gain), a tensor-core tile width. fp16/bf16 with
//!   32 x 32 blocks have no CUDA-core variant ([`cuda_cores_available`]).
//!
//! # How to get one
//! Explicitly: [`CsrMatrix::to_bsr`](super::CsrMatrix::to_bsr) / [`CsrMatrix::bsr`]
//! (converted on the device, cached on the CSR matrix until its values change), the same for
//! Blocked-ELL, or [`BsrMatrix::from_host`] / [`BellMatrix::from_host`]. The CSR SpMV/SpMM
//! dispatch never switches format on its own: converting costs a pass over the matrix and
//! `b * b` storage per touched block, which only the caller knows to amortise.
//! [`block_format_advised`] is the rule a caller (or a future dispatcher) can apply to a
//! descriptor.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::block::{check_block_size, BellHost, BsrHost};
use super::convert::ConversionReport;
use super::descriptor::SparseDescriptor;
use super::device::{check_operand, check_scalars, check_spmv_operands, upload_nonempty, VALUE_DTYPES};
use super::host::DenseLayout;
use super::index::SparseIndex;
use super::spmm::MAX_N;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::runtime::{Context, DeviceBuffer, Kernel, KernelKey, KernelParams, KernelSpec, LaunchConfig};

/// Source of the block-sparse SpMM kernel.
pub const SPMM_SOURCE: &str = include_str!("spmm_bsr.cu");
/// Source of the block-sparse SpMV kernel.
pub const SPMV_SOURCE: &str = include_str!("spmv_bsr.cu");
/// Threads per CTA of the SpMM kernel (4 warps; the staged path's shared memory is sized by it).
pub const SPMM_THREADS: u32 = 128;
/// Threads per CTA of the SpMV kernel (8 block rows).
pub const SPMV_THREADS: u32 = 256;
/// The fill (`nnz / (touched blocks * b * b)`) from which [`block_format_advised`] says yes.
pub const ADVISED_MIN_FILL: f64 = 0.5;

/// The rule for choosing BSR with `b x b` blocks over CSR for SpMM from a matrix's descriptor:
/// the nonzeros fill the touched `b x b` blocks to at least [`ADVISED_MIN_FILL`], so the block
/// form stores at most twice the values and reads B once per block instead of once per
/// nonzero; `b` must be one of [`SparseDescriptor`]'s block sizes. Not applied automatically
/// (see the module documentation).
pub fn block_format_advised(d: &SparseDescriptor, b: usize) -> bool {
    d.nnz > 0 && d.fill_at(b).is_some_and(|f| f >= ADVISED_MIN_FILL)
}

/// How an SpMM kernel computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockPath {
    /// mma.sync m16n8k16 with `n8` tiles of 8 columns per warp (fp16/bf16, b = 16 or 32).
    TensorCores { n8: u32 },
    /// As `TensorCores`, with each block's B tile staged in shared memory by cp.async (double
    /// buffered) and read by ldmatrix.trans: row-major B and C with `n % 8 == 0` only. The
    /// default there (1.6x to 3x faster than `TensorCores` on 16 x 16 blocks, sparse/NOTES.md).
    TensorCoresStaged { n8: u32 },
    /// FMA in the value's precision, 32 columns per warp.
    CudaCores,
}

/// The n8 tiles per warp of the tensor-core path for `n` columns: 1, 2 or 4 (8 to 32 columns).
pub fn tensor_core_n8(n: usize) -> u32 {
    n.div_ceil(8).next_power_of_two().clamp(1, 4) as u32
}

/// Whether (value, block) takes the tensor-core SpMM.
pub fn uses_tensor_cores(value: DType, block: usize) -> bool {
    matches!(value, DType::F16 | DType::BF16) && block % 16 == 0
}

/// Whether the CUDA-core SpMM exists for (value, block): always, except fp16/bf16 with 32 x 32
/// blocks (tensor cores only: that variant spilled on sm_89/sm_90a, and nothing needs it beside
/// the tensor-core path; 16 x 16 keeps it as the tensor cores' twin for tests and benchmarks).
pub fn cuda_cores_available(value: DType, block: usize) -> bool {
    !(matches!(value, DType::F16 | DType::BF16) && block > 16)
}

/// One block-sparse SpMM kernel variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockSpmmVariant {
    pub value: DType,
    pub index: DType,
    pub block: u32,
    pub layout: DenseLayout,
    pub path: BlockPath,
}

impl BlockSpmmVariant {
    pub fn key(&self) -> KernelKey {
        let (tc, staged, n8) = match self.path {
            BlockPath::TensorCores { n8 } => (true, false, n8),
            BlockPath::TensorCoresStaged { n8 } => (true, true, n8),
            BlockPath::CudaCores => (false, false, 1),
        };
        KernelKey::new("spmm_bsr")
            .ty("Val", self.value)
            .ty("Idx", self.index)
            .int("kBlock", "b", self.block)
            .flag("kColMajor", "colmajor", self.layout == DenseLayout::ColMajor)
            .flag("kTensorCores", "tc", tc)
            .flag("kStaged", "staged", staged)
            .int("kN8", "n8_", n8)
            .int("kBlockThreads", "t", SPMM_THREADS)
    }
    pub fn spec(&self) -> KernelSpec {
        self.key().spec("spmm_bsr.cu", SPMM_SOURCE, "spmm_bsr", &[])
    }
    /// Columns one warp covers.
    fn tile_cols(&self) -> usize {
        match self.path {
            BlockPath::TensorCores { n8 } | BlockPath::TensorCoresStaged { n8 } => 8 * n8 as usize,
            BlockPath::CudaCores => 32,
        }
    }
    /// A short name of the path (`tc-n4`, `cuda-cores`).
    pub fn path_name(&self) -> String {
        match self.path {
            BlockPath::TensorCores { n8 } => format!("tc-n{n8}"),
            BlockPath::TensorCoresStaged { n8 } => format!("tc-staged-n{n8}"),
            BlockPath::CudaCores => "cuda-cores".into(),
        }
    }
}

/// The SpMM variant for (value, index, block, n, layout).
pub fn choose_spmm_variant(
    value: DType,
    index: DType,
    block: usize,
    n: usize,
    layout: DenseLayout,
) -> BlockSpmmVariant {
    let path = if uses_tensor_cores(value, block) {
        let n8 = tensor_core_n8(n);
        // B tiles through shared memory where the 16-byte copies are legal: row-major, n % 8 == 0
        if layout == DenseLayout::RowMajor && n % 8 == 0 {
            BlockPath::TensorCoresStaged { n8 }
        } else {
            BlockPath::TensorCores { n8 }
        }
    } else {
        BlockPath::CudaCores
    };
    BlockSpmmVariant {
        value,
        index,
        block: block as u32,
        layout,
        path,
    }
}

/// One block-sparse SpMV kernel variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockSpmvVariant {
    pub value: DType,
    pub index: DType,
    pub block: u32,
}

impl BlockSpmvVariant {
    pub fn key(&self) -> KernelKey {
        KernelKey::new("spmv_bsr")
            .ty("Val", self.value)
            .ty("Idx", self.index)
            .int("kBlock", "b", self.block)
            .int("kBlockThreads", "t", SPMV_THREADS)
    }
    pub fn spec(&self) -> KernelSpec {
        self.key().spec("spmv_bsr.cu", SPMV_SOURCE, "spmv_bsr", &[])
    }
}

/// Every SpMM variant the planner can produce, for the compile tests.
pub fn all_spmm_variants() -> Vec<BlockSpmmVariant> {
    let mut v = Vec::new();
    for value in VALUE_DTYPES {
        for index in [DType::I32, DType::I64] {
            for block in super::block::BLOCK_SIZES {
                for layout in [DenseLayout::RowMajor, DenseLayout::ColMajor] {
                    let mut paths: Vec<BlockPath> = Vec::new();
                    if uses_tensor_cores(value, block) {
                        paths.extend([1, 2, 4].map(|n8| BlockPath::TensorCores { n8 }));
                        if layout == DenseLayout::RowMajor {
                            paths.extend([1, 2, 4].map(|n8| BlockPath::TensorCoresStaged { n8 }));
                        }
                    }
                    if cuda_cores_available(value, block) {
                        paths.push(BlockPath::CudaCores);
                    }
                    for path in paths {
                        v.push(BlockSpmmVariant {
                            value,
                            index,
                            block: block as u32,
                            layout,
                            path,
                        });
                    }
                }
            }
        }
    }
    v
}

/// Every SpMV variant, for the compile tests.
pub fn all_spmv_variants() -> Vec<BlockSpmvVariant> {
    let mut v = Vec::new();
    for value in VALUE_DTYPES {
        for index in [DType::I32, DType::I64] {
            for block in super::block::BLOCK_SIZES {
                v.push(BlockSpmvVariant {
                    value,
                    index,
                    block: block as u32,
                });
            }
        }
    }
    v
}

/// `struct BsrParams` of spmm_bsr.cu and spmv_bsr.cu (112 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct BsrParams {
    block_offsets: u64,
    block_indices: u64,
    values: u64,
    b: u64,
    c: u64,
    rows: i64,
    cols: i64,
    n: i64,
    ldb: i64,
    ldc: i64,
    block_rows: i64,
    ell_width: i64,
    alpha: f64,
    beta: f64,
}
const _: () = assert!(std::mem::size_of::<BsrParams>() == 112);
// SAFETY: #[repr(C)], 14 eight-byte fields (pointers as u64, long long, double) in the order
// and of the types of the kernels' struct.
unsafe impl KernelParams for BsrParams {}

/// The device arrays and kernels shared by BSR and Blocked-ELL.
struct BlockArrays<T: Element, I: SparseIndex> {
    ctx: Context,
    rows: usize,
    cols: usize,
    block: usize,
    /// Stored blocks (Blocked-ELL: slots, padding included).
    blocks: usize,
    /// 0 for BSR; block slots per block row for Blocked-ELL.
    ell_width: usize,
    /// BSR: `block_rows + 1` offsets; Blocked-ELL: one unread element.
    block_offsets: DeviceBuffer<I>,
    block_indices: DeviceBuffer<I>,
    values: DeviceBuffer<T>,
    conversion: Option<ConversionReport>,
    kernels: Mutex<HashMap<BlockSpmmVariant, Arc<Kernel>>>,
    spmv_kernel: Mutex<Option<Arc<Kernel>>>,
}

impl<T: Element, I: SparseIndex> BlockArrays<T, I> {
    fn check_types() -> Result<()> {
        if !VALUE_DTYPES.contains(&T::DTYPE) {
            return Err(Error::Unsupported(format!(
                "sparse values of {}; supported: fp32, fp64, fp16, bf16",
                T::DTYPE
            )));
        }
        Ok(())
    }

    fn block_rows(&self) -> usize {
        self.rows.div_ceil(self.block)
    }

    fn params(&self, b: &DeviceBuffer<T>, c: &DeviceBuffer<T>, n: usize, layout: DenseLayout) -> BsrParams {
        BsrParams {
            block_offsets: self.block_offsets.device_ptr(),
            block_indices: self.block_indices.device_ptr(),
            values: self.values.device_ptr(),
            b: b.device_ptr(),
            c: c.device_ptr(),
            rows: self.rows as i64,
            cols: self.cols as i64,
            n: n as i64,
            ldb: layout.leading_dim(self.cols, n) as i64,
            ldc: layout.leading_dim(self.rows, n) as i64,
            block_rows: self.block_rows() as i64,
            ell_width: self.ell_width as i64,
            alpha: 0.0,
            beta: 0.0,
        }
    }

    fn spmv(&self, alpha: f64, x: &DeviceBuffer<T>, beta: f64, y: &mut DeviceBuffer<T>) -> Result<()> {
        check_spmv_operands(self.rows, self.cols, x.len(), y.len(), alpha, beta)?;
        if self.rows == 0 {
            return Ok(());
        }
        let kernel = {
            let mut slot = self.spmv_kernel.lock().unwrap_or_else(|e| e.into_inner());
            match slot.as_ref() {
                Some(k) => k.clone(),
                None => {
                    let v = BlockSpmvVariant {
                        value: T::DTYPE,
                        index: I::DTYPE,
                        block: self.block as u32,
                    };
                    let k = self.ctx.kernel(&v.spec())?;
                    *slot = Some(k.clone());
                    k
                }
            }
        };
        let params = BsrParams {
            alpha,
            beta,
            ..self.params(x, y, 1, DenseLayout::RowMajor)
        };
        let per_cta = (SPMV_THREADS / 32) as usize;
        let grid = u32::try_from(self.block_rows().div_ceil(per_cta)).map_err(|_| {
            Error::Unsupported(format!("{} block rows: more CTAs than a grid holds", self.block_rows()))
        })?;
        // SAFETY: the arrays were validated (host) or built valid (device conversion) together:
        // block_offsets (BSR) hold block_rows + 1 entries ending at the block count, every block
        // column is in 0..block_cols or -1 (Blocked-ELL padding, never dereferenced), values hold
        // b * b per block; the kernel reads x only below cols (x has >= cols elements, checked)
        // and writes y only below rows (y has >= rows, checked), each element by one lane.
        // BsrParams mirrors the kernel's struct.
        unsafe { kernel.launch(&self.ctx, LaunchConfig::linear(grid, SPMV_THREADS, 0), &params) }
    }

    #[allow(clippy::too_many_arguments)]
    fn spmm(
        &self,
        alpha: f64,
        b: &DeviceBuffer<T>,
        n: usize,
        layout: DenseLayout,
        beta: f64,
        c: &mut DeviceBuffer<T>,
        path: Option<BlockPath>,
    ) -> Result<BlockSpmmVariant> {
        if n == 0 || n > MAX_N {
            return Err(Error::invalid("n", format!("{n} columns; supported: 1..={MAX_N}")));
        }
        check_operand(
            "b",
            b.len(),
            self.cols.saturating_mul(n),
            format_args!("B is {} x {n}", self.cols),
        )?;
        check_operand(
            "c",
            c.len(),
            self.rows.saturating_mul(n),
            format_args!("C is {} x {n}", self.rows),
        )?;
        check_scalars(alpha, beta)?;
        let mut variant = choose_spmm_variant(T::DTYPE, I::DTYPE, self.block, n, layout);
        if let Some(p) = path {
            if let BlockPath::TensorCoresStaged { .. } = p {
                if layout != DenseLayout::RowMajor || n % 8 != 0 {
                    return Err(Error::Unsupported(format!(
                        "the staged tensor-core block SpMM takes row-major B and C with n a multiple of 8, not \
                         {layout:?} with n = {n}"
                    )));
                }
            }
            if matches!(p, BlockPath::TensorCores { .. } | BlockPath::TensorCoresStaged { .. })
                && !uses_tensor_cores(T::DTYPE, self.block)
            {
                return Err(Error::Unsupported(format!(
                    "the tensor-core block SpMM takes fp16/bf16 values with 16 x 16 or 32 x 32 blocks, not {} with \
                     {} x {}",
                    T::DTYPE,
                    self.block,
                    self.block
                )));
            }
            if p == BlockPath::CudaCores && !cuda_cores_available(T::DTYPE, self.block) {
                return Err(Error::Unsupported(format!(
                    "the CUDA-core block SpMM takes {} values with blocks up to 16 x 16; {} x {} blocks run on tensor \
                     cores",
                    T::DTYPE,
                    self.block,
                    self.block
                )));
            }
            if let BlockPath::TensorCores { n8 } | BlockPath::TensorCoresStaged { n8 } = p {
                if ![1, 2, 4].contains(&n8) {
                    return Err(Error::invalid(
                        "path",
                        format!("n8 = {n8}; the tensor-core path takes 1, 2 or 4"),
                    ));
                }
            }
            variant.path = p;
        }
        if self.rows == 0 {
            return Ok(variant);
        }
        let kernel = {
            let mut kernels = self.kernels.lock().unwrap_or_else(|e| e.into_inner());
            match kernels.get(&variant) {
                Some(k) => k.clone(),
                None => {
                    let k = self.ctx.kernel(&variant.spec())?;
                    kernels.insert(variant, k.clone());
                    k
                }
            }
        };
        let params = BsrParams {
            alpha,
            beta,
            ..self.params(b, c, n, layout)
        };
        let warps = self.block_rows().saturating_mul(n.div_ceil(variant.tile_cols()));
        let grid = u32::try_from(warps.div_ceil((SPMM_THREADS / 32) as usize))
            .ok()
            .filter(|&g| g <= i32::MAX as u32)
            .ok_or_else(|| Error::Unsupported(format!("{} x {n}: more CTAs than a grid holds", self.rows)))?;
        // SAFETY: as for spmv: valid block arrays; B is read only at rows < cols and columns < n
        // with the packed leading dimension of `layout` (B has >= cols * n elements, checked), C
        // written only at rows < rows and columns < n (>= rows * n elements, checked), each
        // element by one lane; the tensor-core path reads A with 4-byte loads at even element
        // offsets of 16-bit values (device allocations are 256-byte aligned); the staged path
        // copies 16-byte chunks of B only where row < cols and the chunk's 8 columns < n (n % 8
        // == 0, row-major, checked above: every chunk lies inside B and is 16-byte aligned) and
        // uses static shared memory only. BsrParams mirrors the kernel's struct.
        unsafe { kernel.launch(&self.ctx, LaunchConfig::linear(grid, SPMM_THREADS, 0), &params)? };
        Ok(variant)
    }
}

/// A BSR matrix in device memory (layout in [`block`](super::block)).
pub struct BsrMatrix<T: Element, I: SparseIndex> {
    inner: BlockArrays<T, I>,
}

/// A Blocked-ELL matrix in device memory (layout in [`block`](super::block)).
pub struct BellMatrix<T: Element, I: SparseIndex> {
    inner: BlockArrays<T, I>,
}

impl<T: Element, I: SparseIndex> std::fmt::Debug for BsrMatrix<T, I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BsrMatrix")
            .field("dtype", &T::DTYPE)
            .field("index", &I::DTYPE)
            .field("rows", &self.inner.rows)
            .field("cols", &self.inner.cols)
            .field("block", &self.inner.block)
            .field("blocks", &self.inner.blocks)
            .finish()
    }
}

impl<T: Element, I: SparseIndex> std::fmt::Debug for BellMatrix<T, I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BellMatrix")
            .field("dtype", &T::DTYPE)
            .field("index", &I::DTYPE)
            .field("rows", &self.inner.rows)
            .field("cols", &self.inner.cols)
            .field("block", &self.inner.block)
            .field("width", &self.inner.ell_width)
            .finish()
    }
}

/// The accessors and products both formats share.
macro_rules! block_matrix_common {
    () => {
        pub fn rows(&self) -> usize {
            self.inner.rows
        }
        pub fn cols(&self) -> usize {
            self.inner.cols
        }
        /// The side `b` of the square blocks.
        pub fn block(&self) -> usize {
            self.inner.block
        }
        pub fn block_rows(&self) -> usize {
            self.inner.block_rows()
        }
        pub fn context(&self) -> &Context {
            &self.inner.ctx
        }
        /// What converting to this matrix on the device cost (`None` for an upload).
        pub fn conversion(&self) -> Option<&ConversionReport> {
            self.inner.conversion.as_ref()
        }
        /// Device bytes of the matrix (offsets, block indices, values).
        pub fn bytes(&self) -> usize {
            self.inner.block_offsets.bytes() + self.inner.block_indices.bytes() + self.inner.values.bytes()
        }

        /// `y = alpha * A x + beta * y` (deterministic); `x` has `cols` elements, `y` `rows`;
        /// `beta == 0` does not read `y`. Invalid operands are an error and nothing is written.
        pub fn spmv(&self, alpha: f64, x: &DeviceBuffer<T>, beta: f64, y: &mut DeviceBuffer<T>) -> Result<()> {
            self.inner.spmv(alpha, x, beta, y)
        }

        /// `C = alpha * A B + beta * C` for dense B (`cols x n`) and C (`rows x n`), both packed
        /// in `layout` (deterministic), on the path the module documentation describes.
        /// Invalid operands are an error and nothing is written.
        pub fn spmm(
            &self,
            alpha: f64,
            b: &DeviceBuffer<T>,
            n: usize,
            layout: DenseLayout,
            beta: f64,
            c: &mut DeviceBuffer<T>,
        ) -> Result<()> {
            self.inner.spmm(alpha, b, n, layout, beta, c, None).map(|_| ())
        }

        /// [`spmm`](Self::spmm) on a forced path (tests and benchmarks: the CUDA-core path for
        /// any dtype, the tensor-core path with a chosen tile where it applies); returns the
        /// variant that ran.
        #[allow(clippy::too_many_arguments)]
        pub fn spmm_on(
            &self,
            path: BlockPath,
            alpha: f64,
            b: &DeviceBuffer<T>,
            n: usize,
            layout: DenseLayout,
            beta: f64,
            c: &mut DeviceBuffer<T>,
        ) -> Result<BlockSpmmVariant> {
            self.inner.spmm(alpha, b, n, layout, beta, c, Some(path))
        }

        /// The variant [`spmm`](Self::spmm) runs for `n` columns in `layout`.
        pub fn spmm_variant(&self, n: usize, layout: DenseLayout) -> BlockSpmmVariant {
            choose_spmm_variant(T::DTYPE, I::DTYPE, self.inner.block, n, layout)
        }
    };
}

impl<T: Element, I: SparseIndex> BsrMatrix<T, I> {
    /// Uploads a host BSR matrix (validated again here).
    pub fn from_host(ctx: &Context, host: &BsrHost<T, I>) -> Result<Self> {
        BlockArrays::<T, I>::check_types()?;
        host.validate()?;
        Ok(Self::from_device_parts(
            ctx,
            (host.rows, host.cols, host.block),
            ctx.upload(&host.block_offsets)?,
            upload_nonempty(ctx, &host.block_indices)?,
            upload_nonempty(ctx, &host.values)?,
            host.nnzb(),
            None,
        ))
    }

    /// A matrix from arrays a device conversion made (valid by construction).
    pub(crate) fn from_device_parts(
        ctx: &Context,
        (rows, cols, block): (usize, usize, usize),
        block_offsets: DeviceBuffer<I>,
        block_indices: DeviceBuffer<I>,
        values: DeviceBuffer<T>,
        blocks: usize,
        conversion: Option<ConversionReport>,
    ) -> Self {
        BsrMatrix {
            inner: BlockArrays {
                ctx: ctx.clone(),
                rows,
                cols,
                block,
                blocks,
                ell_width: 0,
                block_offsets,
                block_indices,
                values,
                conversion,
                kernels: Mutex::new(HashMap::new()),
                spmv_kernel: Mutex::new(None),
            },
        }
    }

    /// The number of stored blocks.
    pub fn nnzb(&self) -> usize {
        self.inner.blocks
    }

    /// Stored blocks / all `block_rows * block_cols` blocks.
    pub fn block_density(&self) -> f64 {
        let all = self.block_rows() * self.cols().div_ceil(self.block());
        if all == 0 {
            0.0
        } else {
            self.nnzb() as f64 / all as f64
        }
    }

    /// Downloads the arrays (tests, verification).
    pub fn to_host(&self) -> Result<BsrHost<T, I>> {
        let a = &self.inner;
        let bb = a.block * a.block;
        Ok(BsrHost {
            rows: a.rows,
            cols: a.cols,
            block: a.block,
            block_offsets: a.block_offsets.to_host()?,
            block_indices: a.block_indices.to_host()?[..a.blocks].to_vec(),
            values: a.values.to_host()?[..a.blocks * bb].to_vec(),
        })
    }

    /// The Blocked-ELL form, made on the device (`convert.cu`); its cost is in its
    /// [`conversion`](BellMatrix::conversion).
    pub fn to_blocked_ell(&self) -> Result<BellMatrix<T, I>> {
        super::convert::bsr_to_bell(self)
    }

    pub(crate) fn arrays(&self) -> (&DeviceBuffer<I>, &DeviceBuffer<I>, &DeviceBuffer<T>) {
        (&self.inner.block_offsets, &self.inner.block_indices, &self.inner.values)
    }

    block_matrix_common!();
}

impl<T: Element, I: SparseIndex> BellMatrix<T, I> {
    /// Uploads a host Blocked-ELL matrix (validated again here).
    pub fn from_host(ctx: &Context, host: &BellHost<T, I>) -> Result<Self> {
        BlockArrays::<T, I>::check_types()?;
        host.validate()?;
        Self::from_device_parts(
            ctx,
            (host.rows, host.cols, host.block),
            host.width,
            upload_nonempty(ctx, &host.block_indices)?,
            upload_nonempty(ctx, &host.values)?,
            None,
        )
    }

    /// A matrix from arrays a device conversion made (valid by construction).
    pub(crate) fn from_device_parts(
        ctx: &Context,
        (rows, cols, block): (usize, usize, usize),
        width: usize,
        block_indices: DeviceBuffer<I>,
        values: DeviceBuffer<T>,
        conversion: Option<ConversionReport>,
    ) -> Result<Self> {
        let block_rows = rows.div_ceil(block);
        // The kernels take ell_width == 0 for BSR: a Blocked-ELL matrix without blocks runs as
        // a BSR one whose block rows are all empty (zero offsets); otherwise the offsets are not
        // read and one element keeps the pointer valid.
        let block_offsets = if width == 0 {
            ctx.upload(&vec![I::ZERO; block_rows + 1])?
        } else {
            ctx.alloc::<I>(1)?
        };
        Ok(BellMatrix {
            inner: BlockArrays {
                ctx: ctx.clone(),
                rows,
                cols,
                block,
                blocks: block_rows * width,
                ell_width: width,
                block_offsets,
                block_indices,
                values,
                conversion,
                kernels: Mutex::new(HashMap::new()),
                spmv_kernel: Mutex::new(None),
            },
        })
    }

    /// Block slots per block row.
    pub fn width(&self) -> usize {
        self.inner.ell_width
    }

    /// Downloads the arrays (tests, verification).
    pub fn to_host(&self) -> Result<BellHost<T, I>> {
        let a = &self.inner;
        let bb = a.block * a.block;
        Ok(BellHost {
            rows: a.rows,
            cols: a.cols,
            block: a.block,
            width: a.ell_width,
            block_indices: a.block_indices.to_host()?[..a.blocks].to_vec(),
            values: a.values.to_host()?[..a.blocks * bb].to_vec(),
        })
    }

    block_matrix_common!();
}

/// Checks a block size for a conversion (an `Error::Invalid` naming `block`).
pub(crate) fn check_conversion_block(block: usize) -> Result<()> {
    check_block_size(block)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every block-sparse kernel compiles for every CI architecture without spills (needs
    /// NVRTC only; the registry's test does the same for all operators).
    #[test]
    fn block_kernels_compile_without_spills() {
        if !crate::runtime::probe::nvrtc_or_skip("block_kernels_compile_without_spills") {
            return;
        }
        use rayon::prelude::*;
        let specs: Vec<KernelSpec> = all_spmm_variants()
            .iter()
            .map(|v| v.spec())
            .chain(all_spmv_variants().iter().map(|v| v.spec()))
            .collect();
        let jobs: Vec<_> = crate::runtime::Arch::CI_TARGETS
            .iter()
            .flat_map(|&a| specs.iter().map(move |s| (s, a)))
            .collect();
        let failures: Vec<String> = jobs
            .par_iter()
            .filter_map(|(s, a)| match crate::runtime::compile_only(s, *a) {
                Ok(c) if c.resources.spill_free() => None,
                Ok(c) => Some(format!("{} {a}: {:?}", s.name, c.resources)),
                Err(e) => Some(format!("{} {a}: {e}", s.name)),
            })
            .collect();
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn variants_are_distinct_and_cover_the_planner() {
        let v = all_spmm_variants();
        let mut names: Vec<String> = v.iter().map(|v| v.spec().name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), v.len());
        // 2 full dtypes x 5 blocks + 2 halves x 4 blocks up to 16 on CUDA cores, 2 halves x 2
        // blocks x 3 tiles on tensor cores; x 2 index types x 2 layouts
        // and the staged tensor-core path (row-major only): 2 halves x 2 blocks x 3 tiles x 2 index
        assert_eq!(v.len(), (2 * 5 + 2 * 4 + 2 * 2 * 3) * 2 * 2 + 2 * 2 * 3 * 2);
        // every forced path that spmm_on accepts is compiled by CI
        for value in VALUE_DTYPES {
            for b in super::super::block::BLOCK_SIZES {
                let cuda = BlockSpmmVariant {
                    value,
                    index: DType::I32,
                    block: b as u32,
                    layout: DenseLayout::ColMajor,
                    path: BlockPath::CudaCores,
                };
                assert_eq!(v.contains(&cuda), cuda_cores_available(value, b), "{cuda:?}");
            }
        }
        assert_eq!(all_spmv_variants().len(), 4 * 2 * 5);
        for value in VALUE_DTYPES {
            for b in super::super::block::BLOCK_SIZES {
                for n in [1, 2, 7, 8, 9, 17, 32, 129, 1000] {
                    for layout in [DenseLayout::RowMajor, DenseLayout::ColMajor] {
                        let c = choose_spmm_variant(value, DType::I64, b, n, layout);
                        assert!(v.contains(&c), "{c:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn tensor_cores_for_halves_with_blocks_of_16_and_32_only() {
        assert!(uses_tensor_cores(DType::F16, 16) && uses_tensor_cores(DType::BF16, 32));
        assert!(!uses_tensor_cores(DType::F32, 16), "fp32 must not silently run in tf32");
        assert!(!uses_tensor_cores(DType::F64, 32) && !uses_tensor_cores(DType::F16, 8));
        assert_eq!(
            [1, 8, 9, 16, 17, 32, 33, 500].map(tensor_core_n8),
            [1, 1, 2, 2, 4, 4, 4, 4]
        );
    }

    #[test]
    fn advice_needs_well_filled_blocks() {
        use super::super::generate::{generate_block_sparse, BlockSparse};
        use super::super::{CsrHost, SparseDescriptor};
        let s = |fill| BlockSparse {
            block: 16,
            density: 0.1,
            fill,
            empty_block_rows: 0.0,
        };
        let full: CsrHost<f32, i32> = generate_block_sparse(s(1.0), 512, 512, 3).unwrap();
        let sparse: CsrHost<f32, i32> = generate_block_sparse(s(0.1), 512, 512, 3).unwrap();
        assert!(block_format_advised(&SparseDescriptor::of(&full), 16));
        assert!(!block_format_advised(&SparseDescriptor::of(&sparse), 16));
        assert!(!block_format_advised(&SparseDescriptor::of(&full), 3));
    }
}
