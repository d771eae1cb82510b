//! Softmax dispatch (OneFlow's three paths) and launching.
//!
//! | path | when (Auto) | CTA | row lives in |
//! |---|---|---|---|
//! | [`SoftmaxPath::WarpPerRow`] | cols <= 1024 | 128 threads; `kWarpWidth` lanes per row, `kRowsPerWarp` rows at a time | registers |
//! | [`SoftmaxPath::WarpV2`] | cols <= 1024 with <= 32 input bytes per lane (e.g. 128 columns) | as WarpPerRow, one wave, next rows prefetched into registers | registers |
//! | [`SoftmaxPath::BlockCached`] | cols * 4 B fits the opt-in shared memory and a CTA fits on an SM | 128..1024 threads, one row at a time | shared memory (f32) |
//! | [`SoftmaxPath::BlockUncached`] | anything longer | 1024 threads, one row at a time | nowhere: read twice |
//! | [`SoftmaxPath::Cluster`] | rows over 32 KB: on one CTA up to 128 KB, else on a cluster whose shares fit 64 KB (sm_90) | 512/1024 threads, 1..8 CTAs per row | shared memory (input dtype) |
//! | [`SoftmaxPath::SplitRow`] | rows of 256 KB and more with 16-byte row strides (sm_90): 2..32 shares of up to 64 KB (larger shares past 32) | 512 threads, one cooperative wave of resident CTAs in groups of one row's CTAs (rows g, g + groups, ..., or claimed from a counter where that schedule leaves groups unused); states exchanged through global memory | shared memory (input dtype) |
//! | [`SoftmaxPath::ClusterPipe`] | rows of 256 KB and more that the split-row kernel cannot hold, whose cluster shares fit in shared memory (sm_90) | as Cluster, one wave; the store pass refills the share with the next row | shared memory (input dtype) |
//!
//! Forced only (measured side by side against the dispatched kernels, see the bench):
//! [`SoftmaxPath::WarpNc`] (warp path with loads that keep the default L2 policy).
//!
//! Every kernel grid-strides over rows, so the grid is capped at a number of waves of resident
//! CTAs. Vector (16-byte) accesses are used when the row starts, strides and cols allow them;
//! otherwise a scalar variant, compiled in the same plan, takes the call.

use std::sync::Arc;

use super::{SoftmaxKind, SoftmaxOptions, SoftmaxShape, SoftmaxTuning};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::runtime::{
    Context, DeviceBuffer, Kernel, KernelKey, KernelParams, KernelSpec, LaunchConfig, TensorView, TensorViewMut,
};

/// The kernel source: all three paths, one compiled per variant.
pub const SOURCE: &str = include_str!("softmax.cu");
/// The cluster path's kernel source.
pub const CLUSTER_SOURCE: &str = include_str!("softmax_cluster.cu");

/// Kernel path; `Auto` (the default) lets the plan choose.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SoftmaxPath {
    #[default]
    Auto,
    /// A warp (or a group of 1..32 lanes) per row, the row in registers. cols <= 1024.
    WarpPerRow,
    /// A CTA per row, the row cached in shared memory as f32. cols * 4 B <= the opt-in limit.
    BlockCached,
    /// A CTA per row, the row read twice (online max/sum, then write). Any cols.
    BlockUncached,
    /// A cluster of 1..8 CTAs per row, each caching its share in shared memory in the input
    /// dtype (loaded with cp.async), exchanging max and sum through distributed shared memory.
    /// Needs 16-byte aligned rows; clusters of more than one CTA need sm_90.
    Cluster,
    /// [`SoftmaxPath::WarpPerRow`] with loads that skip L1 but keep the default L2 policy
    /// (`L1::no_allocate`) instead of evict-first (`.cs`). For measuring side by side.
    WarpNc,
    /// [`SoftmaxPath::WarpNc`] plus, for short rows (<= 32 input bytes per lane, e.g. 128
    /// columns), a register double buffer: each lane group loads its rows of the next
    /// grid-stride iteration before reducing the current ones; longer fp32 rows get an occupancy
    /// floor of 7 CTAs per SM on sm_90 instead. One wave of resident CTAs. Auto takes it for
    /// rows of at most 32 input bytes per lane.
    WarpV2,
    /// [`SoftmaxPath::Cluster`] with the pipelined schedule: each thread refills the packs it
    /// has just stored with the next row's copies, so loads of row i+1 overlap stores of row i
    /// (same shared memory). Falls back to the plain schedule for unaligned calls. Auto takes it
    /// for rows of 256 KB and more only where the split-row kernel cannot hold the row.
    ClusterPipe,
    /// The pipelined schedule of [`SoftmaxPath::ClusterPipe`] with a row split across 2..32 CTAs
    /// that are not a hardware cluster: each caches its share (at most 64 KB) in shared memory and
    /// the CTAs of a row exchange their (max, sum) states through global memory (one tagged
    /// 32-byte slot per row and CTA, no fences). One cooperative wave of resident CTAs, every SM
    /// usable (no GPC placement); on sm_90+ the groups claim their rows from a counter where a
    /// static schedule would leave many of them unused ([`split_claims_rows`]). Needs a row
    /// stride that is a multiple of 16 bytes (a plan error otherwise) and sm_70+; calls whose
    /// pointers are not 16-byte aligned run the plain cluster kernel (or, where no cluster holds
    /// the row, the block-uncached one).
    SplitRow,
}

impl SoftmaxPath {
    pub fn name(self) -> &'static str {
        match self {
            SoftmaxPath::Auto => "auto",
            SoftmaxPath::WarpPerRow => "warp",
            SoftmaxPath::BlockCached => "block-smem",
            SoftmaxPath::BlockUncached => "block-uncached",
            SoftmaxPath::Cluster => "cluster",
            SoftmaxPath::WarpNc => "warp-nc",
            SoftmaxPath::WarpV2 => "warp-v2",
            SoftmaxPath::ClusterPipe => "cluster-pipe",
            SoftmaxPath::SplitRow => "split-row",
        }
    }
    /// Every path, `Auto` first.
    pub const ALL: [SoftmaxPath; 9] = [
        Self::Auto,
        Self::WarpPerRow,
        Self::BlockCached,
        Self::BlockUncached,
        Self::Cluster,
        Self::WarpNc,
        Self::WarpV2,
        Self::ClusterPipe,
        Self::SplitRow,
    ];
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == s)
    }
    /// A warp-per-row kernel (any tuning).
    pub fn is_warp(self) -> bool {
        matches!(self, Self::WarpPerRow | Self::WarpNc | Self::WarpV2)
    }
    /// A kernel of `softmax_cluster.cu` (either schedule, hardware cluster or split row).
    pub fn is_cluster(self) -> bool {
        matches!(self, Self::Cluster | Self::ClusterPipe | Self::SplitRow)
    }
    /// `kWarpTuning` of softmax.cu: 0 for every path but the warp tunings.
    fn warp_tuning(self) -> u32 {
        match self {
            Self::WarpNc => 1,
            Self::WarpV2 => 2,
            _ => 0,
        }
    }
    fn index(self) -> u32 {
        match self {
            SoftmaxPath::WarpPerRow | SoftmaxPath::WarpNc | SoftmaxPath::WarpV2 => 0,
            SoftmaxPath::BlockCached => 1,
            SoftmaxPath::BlockUncached => 2,
            SoftmaxPath::Cluster | SoftmaxPath::ClusterPipe | SoftmaxPath::SplitRow | SoftmaxPath::Auto => {
                unreachable!("not a softmax.cu path")
            }
        }
    }
}

/// Largest row the warp path holds in registers.
pub const WARP_MAX_COLS: usize = 1024;
/// Threads per CTA of the warp path.
const WARP_PATH_THREADS: u32 = 128;
/// Threads per CTA of the uncached path: long rows need many loads in flight per row.
const UNCACHED_THREADS: u32 = 1024;
/// Shared memory a cluster-path CTA aims for: small enough that several CTAs share an SM, so
/// one CTA's loads overlap another's stores.
const CLUSTER_TARGET_SHARE_BYTES: usize = 64 * 1024;
/// Except that on GPUs with clusters a row of up to this many input bytes stays on one CTA (1024
/// threads, one per SM): no cluster exchange, which measured faster than two CTAs of 64 KB
/// (fp32 4096 x 32768); but 128 KB shares lost where they still need a cluster (fp16
/// 1024 x 131072 on two CTAs against four; see this folder's NOTES.md).
const CLUSTER_SINGLE_CTA_MAX_BYTES: usize = 128 * 1024;
/// Rows of fewer input bytes stay on the block paths, which reach the copy roofline there.
const CLUSTER_MIN_ROW_BYTES: usize = 32 * 1024;
/// Rows of at least this many input bytes take [`SoftmaxPath::ClusterPipe`]: it gains on
/// 256-512 KB rows and loses on 64-128 KB rows, where a cluster holds one row per pass and has
/// little to overlap (see this folder's NOTES.md).
const CLUSTER_PIPE_MIN_ROW_BYTES: usize = 256 * 1024;
/// Input bytes per lane up to which Auto takes [`SoftmaxPath::WarpV2`] (its register prefetch
/// applies; softmax.cu kMaxPrefetchBytes): it gains on 128-column rows and not on longer ones
/// (see this folder's NOTES.md).
const WARP_PREFETCH_MAX_BYTES: usize = 32;
/// Threads of a cluster-path CTA: 512 for shares up to the target, 1024 above it (one CTA per
/// SM then, so it alone must keep enough copies in flight).
fn cluster_threads(share_bytes: usize) -> u32 {
    if share_bytes <= CLUSTER_TARGET_SHARE_BYTES {
        512
    } else {
        1024
    }
}
/// Waves of resident CTAs launched by a grid-striding kernel (enough for load balance).
const GRID_WAVES: u32 = 32;
/// Waves of the plain cluster path's grid.
const CLUSTER_GRID_WAVES: u32 = 8;
/// Waves of the prefetching paths ([`SoftmaxPath::WarpV2`], [`SoftmaxPath::ClusterPipe`]): one,
/// so that every CTA runs several iterations and its prefetch has something to overlap.
const PREFETCH_GRID_WAVES: u32 = 1;

/// Compile-time specialisation of one kernel variant (the preamble of `softmax.cu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Variant {
    pub in_dtype: DType,
    pub out_dtype: DType,
    pub kind: SoftmaxKind,
    pub path: SoftmaxPath,
    pub block_threads: u32,
    /// Elements per vector access (1 = scalar).
    pub pack: u32,
    /// Warp path: register slots per thread per row.
    pub cols_per_thread: u32,
    /// Warp path: rows a lane group handles at once.
    pub rows_per_warp: u32,
    /// Warp path: lanes per row (1..32, a power of two).
    pub warp_width: u32,
    /// Cluster path: CTAs per row (1, 2, 4 or 8; split-row: 2..=32).
    pub cluster: u32,
    /// Cluster path: output elements per vector store (1 = scalar).
    pub out_pack: u32,
    /// Pipelined cluster and split-row schedules: cp.async commit groups per row, 8 (one per
    /// pack: the reduction starts on the first packs while the others land; shares of at most
    /// 8 packs per thread) or 1 (any share). See [`copy_groups_for`]. Ignored elsewhere.
    pub copy_groups: u32,
    /// Split-row path: each group claims its rows after the first from a counter (`kClaimRows`)
    /// instead of taking rows g, g + groups, ... See [`split_claims_rows`]. Ignored elsewhere.
    pub claim_rows: bool,
}

impl Variant {
    /// Whether this variant runs the pipelined cluster schedule: it needs 16-byte copies, so
    /// the scalar variant of [`SoftmaxPath::ClusterPipe`] is the plain one (split-row has no
    /// scalar variant of its own).
    fn pipelined(&self) -> bool {
        matches!(self.path, SoftmaxPath::ClusterPipe | SoftmaxPath::SplitRow) && self.pack > 1
    }

    /// The specialisation of this variant: its name, preamble and cache hash.
    pub fn key(&self) -> KernelKey {
        let key = KernelKey::new("softmax")
            .flag("kLogSoftmax", "log", self.kind == SoftmaxKind::LogSoftmax)
            .ty("InT", self.in_dtype)
            .ty("OutT", self.out_dtype);
        if self.path.is_cluster() {
            let split = self.path == SoftmaxPath::SplitRow;
            return key
                .int("kBlockThreads", "t", self.block_threads)
                .int("kPack", "p", self.pack)
                .int("kOutPack", "o", self.out_pack)
                .int("kCluster", "k", self.cluster)
                .flag("kPipeline", "pipe", self.pipelined())
                .flag("kGlobalExchange", "split", split)
                .int("kCopyGroups", "g", if self.pipelined() { self.copy_groups } else { 1 })
                .flag("kClaimRows", "claim", split && self.claim_rows);
        }
        key.choice("kPath", self.path.name(), self.path.index())
            .int("kBlockThreads", "t", self.block_threads)
            .int("kPack", "p", self.pack)
            .int("kColsPerThread", "c", self.cols_per_thread)
            .int("kRowsPerWarp", "r", self.rows_per_warp)
            .int("kWarpWidth", "w", self.warp_width)
            .int("kWarpTuning", "v", self.path.warp_tuning())
    }

    /// The kernel spec of this variant.
    pub fn spec(&self) -> KernelSpec {
        if self.path.is_cluster() {
            self.key()
                .spec("softmax_cluster.cu", CLUSTER_SOURCE, "softmax_cluster_kernel", &[])
        } else {
            self.key().spec("softmax.cu", SOURCE, "softmax_kernel", &[])
        }
    }

    /// Rows one CTA handles at a time.
    fn rows_per_cta(&self) -> u32 {
        if self.path.is_warp() {
            (self.block_threads / self.warp_width) * self.rows_per_warp
        } else {
            1
        }
    }
}

/// 16-byte accesses hold this many elements of `d`.
fn pack_of(d: DType) -> u32 {
    (16 / d.size()) as u32
}

/// The warp-path shape for `cols`: (cols_per_thread, warp_width, rows_per_warp).
/// Short rows share a warp (width < 32) so no lane idles; rows of up to 128 columns are taken
/// two at a time per lane group for more loads in flight (OneFlow's rows-per-access).
pub fn warp_shape(cols: usize, pack: u32) -> (u32, u32, u32) {
    let pack = pack as usize;
    let (cpt, width) = if cols <= 32 * pack {
        let groups = cols.div_ceil(pack).next_power_of_two().clamp(1, 32);
        (pack, groups)
    } else {
        (cols.div_ceil(32 * pack) * pack, 32)
    };
    let rows_per_warp = if cols <= 128 { 2 } else { 1 };
    (cpt as u32, width as u32, rows_per_warp)
}

/// The vector width the shape allows: 16-byte packs when cols and both strides are multiples
/// of the pack of both dtypes (pointer alignment is checked per call).
fn vector_pack(shape: &SoftmaxShape) -> u32 {
    let p = pack_of(shape.in_dtype).min(pack_of(shape.out_dtype));
    let ok = [shape.cols, shape.in_stride, shape.out_stride]
        .iter()
        .all(|&v| v % p as usize == 0);
    if ok && p > 1 {
        p
    } else {
        1
    }
}

/// A compiled variant with its launch geometry.
#[derive(Clone)]
struct Launchable {
    variant: Variant,
    kernel: Arc<Kernel>,
    cfg: LaunchConfig,
    /// Cluster path: columns per CTA.
    chunk: usize,
}

/// The parameter struct of `softmax.cu` (`SoftmaxParams`, 56 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SoftmaxParams {
    pub input: u64,
    pub output: u64,
    pub rows: i64,
    pub cols: i64,
    pub in_stride: i64,
    pub out_stride: i64,
    pub scale_log2e: f32,
    pub scale: f32,
}
const _: () = assert!(std::mem::size_of::<SoftmaxParams>() == 56);
// SAFETY: #[repr(C)] plain data matching `struct SoftmaxParams` in softmax.cu field by field
// (two pointers, four 64-bit integers, two floats).
unsafe impl KernelParams for SoftmaxParams {}

/// The parameter struct of `softmax_cluster.cu` (`SoftmaxClusterParams`, 80 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SoftmaxClusterParams {
    pub base: SoftmaxParams,
    pub chunk: i64,
    /// Split-row path: the exchange slots (`ExchangeSlot`, 32 bytes; one per row and CTA of its
    /// group), else 0.
    pub exchange: u64,
    /// Split-row path: the epoch, done and row-claim counters (three `u32`), else 0.
    pub counters: u64,
}
const _: () = assert!(std::mem::size_of::<SoftmaxClusterParams>() == 80);
// SAFETY: #[repr(C)]: SoftmaxParams (56 bytes, the same fields in the same order as the kernel's
// struct) followed by three 64-bit integers, as `struct SoftmaxClusterParams` declares.
unsafe impl KernelParams for SoftmaxClusterParams {}

/// Bytes of one split-row exchange slot (`ExchangeSlot` in softmax_cluster.cu).
const EXCHANGE_SLOT_BYTES: usize = 32;
/// The split-row workspace: the three counters (epoch, CTAs done, rows claimed), padded to one
/// slot (so every slot is a 32-byte sector of its own), then the slots.
const EXCHANGE_COUNTER_BYTES: usize = 32;

/// Everything a [`SoftmaxPlan`] is made from besides its context (device and stream): the
/// shape (with dtypes and strides) and the options, the scale by its bits. Equal keys on one
/// context give interchangeable plans, so a plan cache can be keyed by it
/// ([`SoftmaxPlanKey::new`] before planning, [`SoftmaxPlan::key`] after).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SoftmaxPlanKey {
    pub shape: SoftmaxShape,
    pub kind: SoftmaxKind,
    /// `SoftmaxOptions::scale` as `f32::to_bits` (so `-0.0`, `0.0` and NaNs stay distinct).
    pub scale_bits: u32,
    pub tuning: SoftmaxTuning,
}

impl SoftmaxPlanKey {
    /// The key of the plan `SoftmaxPlan::new(ctx, shape, opts)` makes.
    pub fn new(shape: &SoftmaxShape, opts: &SoftmaxOptions) -> Self {
        SoftmaxPlanKey {
            shape: *shape,
            kind: opts.kind,
            scale_bits: opts.scale.to_bits(),
            tuning: opts.tuning,
        }
    }
}

/// A planned softmax: the dispatch decision and compiled kernels for one [`SoftmaxShape`].
/// Make it once, run it many times; `run` allocates nothing.
pub struct SoftmaxPlan {
    ctx: Context,
    shape: SoftmaxShape,
    opts: SoftmaxOptions,
    /// The path chosen (a split-row plan's scalar variant, for unaligned calls, runs the plain
    /// cluster kernel where that holds the row, else the block-uncached one).
    path: SoftmaxPath,
    /// Split-row path: the counters and exchange slots of the shape (rows x CTAs per row; zeroed
    /// once, the kernel keeps them consistent across launches). One plan's launches must not run
    /// concurrently (e.g. on two streams): they would share these slots.
    exchange: Option<DeviceBuffer<u8>>,
    /// The 16-byte variant, when the shape allows one.
    vector: Option<Launchable>,
    /// The scalar variant, used when a call's pointers are not 16-byte aligned.
    scalar: Launchable,
}

impl std::fmt::Debug for SoftmaxPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftmaxPlan")
            .field("shape", &self.shape)
            .field("path", &self.path())
            .field("variant", &self.primary().variant)
            .field("launch", &self.primary().cfg)
            .finish()
    }
}

impl SoftmaxPlan {
    /// Validates the shape and options, chooses the path and compiles its kernels.
    pub fn new(ctx: &Context, shape: &SoftmaxShape, opts: &SoftmaxOptions) -> Result<Self> {
        shape.validate()?;
        if !opts.scale.is_finite() || opts.scale == 0.0 {
            return Err(Error::invalid(
                "scale",
                format!("{} must be finite and non-zero", opts.scale),
            ));
        }
        let info = ctx.info();
        let smem_needed = cached_smem_bytes(shape.cols);
        let fits_smem = smem_needed <= info.max_shared_per_block_optin as usize;
        let (pi, po) = cluster_packs(shape);
        let cluster_ok = (pi > 1 || po > 1)
            && cluster_shape(
                shape.cols,
                shape.in_dtype.size(),
                pi.max(po) as usize,
                max_cluster(ctx),
                info.max_shared_per_block_optin as usize,
            )
            .is_some();
        // Auto takes the plain cluster path only where every CTA's share stays small enough for
        // several CTAs per SM, or the row fits one CTA (measured: fp32 256x262144 with 128 KB
        // shares ran slower than the uncached path; see this folder's NOTES.md); larger shares
        // only with the pipelined schedule.
        let cluster_auto = (pi > 1 || po > 1)
            && cluster_shape(
                shape.cols,
                shape.in_dtype.size(),
                pi.max(po) as usize,
                max_cluster(ctx),
                0,
            )
            .is_some();
        let row_bytes = shape.cols * shape.in_dtype.size();
        // Split rows where hardware clusters exist (measured there) and the split-row kernel
        // holds the row (16-byte packs, shares that fit a CTA; residency is checked when the
        // kernel's occupancy is known).
        let split_auto =
            max_cluster(ctx) > 1 && split_row_geometry(shape, info.max_shared_per_block_optin as usize).is_some();
        let path = match opts.tuning.path {
            SoftmaxPath::Auto if shape.cols <= WARP_MAX_COLS => {
                // rows of at most 32 input bytes per lane take the prefetching warp kernel
                let (cpt, _, rows_per_warp) = warp_shape(shape.cols, vector_pack(shape));
                if (rows_per_warp * cpt) as usize * shape.in_dtype.size() <= WARP_PREFETCH_MAX_BYTES {
                    SoftmaxPath::WarpV2
                } else {
                    SoftmaxPath::WarpPerRow
                }
            }
            SoftmaxPath::Auto if row_bytes >= SPLIT_MIN_ROW_BYTES && split_auto => SoftmaxPath::SplitRow,
            SoftmaxPath::Auto if row_bytes > CLUSTER_MIN_ROW_BYTES && cluster_auto => {
                if row_bytes >= CLUSTER_PIPE_MIN_ROW_BYTES {
                    SoftmaxPath::ClusterPipe
                } else {
                    SoftmaxPath::Cluster
                }
            }
            // Shares above the target (one 1024-thread CTA per SM) still beat re-reading the row,
            // but only with the pipelined schedule: on fp32 256x262144 (128 KB shares) it beats
            // both the uncached path and the plain cluster (see this folder's NOTES.md).
            SoftmaxPath::Auto if row_bytes >= CLUSTER_PIPE_MIN_ROW_BYTES && cluster_ok => SoftmaxPath::ClusterPipe,
            SoftmaxPath::Auto if fits_smem => SoftmaxPath::BlockCached,
            SoftmaxPath::Auto => SoftmaxPath::BlockUncached,
            p if p.is_warp() && shape.cols > WARP_MAX_COLS => {
                return Err(Error::Unsupported(format!(
                    "the warp-per-row path holds at most {WARP_MAX_COLS} columns, got {}",
                    shape.cols
                )))
            }
            SoftmaxPath::BlockCached if !fits_smem => {
                return Err(Error::Unsupported(format!(
                    "the shared-memory path needs {smem_needed} B for {} columns; this device allows {} B per block",
                    shape.cols, info.max_shared_per_block_optin
                )))
            }
            p if p.is_cluster() && p != SoftmaxPath::SplitRow && !cluster_ok => {
                return Err(Error::Unsupported(format!(
                    "the cluster path needs row strides that are multiples of 16 bytes and a row that {} CTAs \
                     can hold in shared memory; got {} columns with strides {}/{}",
                    max_cluster(ctx),
                    shape.cols,
                    shape.in_stride,
                    shape.out_stride
                )))
            }
            p => p,
        };
        let mut plan_path = path;
        // The split-row kernel (its only variant has 16-byte packs), built once here.
        let split = if path == SoftmaxPath::SplitRow {
            build_variant(ctx, shape, opts.kind, path, pack_of(shape.in_dtype))?
        } else {
            None
        };
        if path == SoftmaxPath::SplitRow && split.is_none() {
            if opts.tuning.path != SoftmaxPath::Auto {
                return Err(Error::Unsupported(split_row_unsupported(
                    shape,
                    info.max_shared_per_block_optin as usize,
                )));
            }
            // Not expected where split_auto holds; keep Auto total all the same.
            plan_path = if row_bytes >= CLUSTER_PIPE_MIN_ROW_BYTES && cluster_ok {
                SoftmaxPath::ClusterPipe
            } else {
                SoftmaxPath::BlockUncached
            };
        }
        let pack = vector_pack(shape);
        let build = |pack: u32| -> Result<Option<Launchable>> { build_variant(ctx, shape, opts.kind, plan_path, pack) };
        let mut scalar = build(1)?;
        if scalar.is_none() && opts.tuning.path == SoftmaxPath::Auto && path == SoftmaxPath::BlockCached {
            // The cached CTA does not fit on an SM with any block size: fall back.
            plan_path = SoftmaxPath::BlockUncached;
            scalar = build_variant(ctx, shape, opts.kind, plan_path, 1)?;
        }
        let scalar = scalar.ok_or_else(|| {
            Error::Unsupported(format!(
                "{} path: no block size fits on this device for {} columns",
                path.name(),
                shape.cols
            ))
        })?;
        let vector = if split.is_some() {
            split
        } else if pack > 1 || plan_path.is_cluster() {
            build_variant(ctx, shape, opts.kind, plan_path, pack.max(2))?
        } else {
            None
        };
        let exchange = match &vector {
            Some(v) if v.variant.path == SoftmaxPath::SplitRow => {
                // One slot per row and CTA of its group (each written once per launch).
                let bytes = shape
                    .rows
                    .checked_mul(v.variant.cluster as usize * EXCHANGE_SLOT_BYTES)
                    .and_then(|b| b.checked_add(EXCHANGE_COUNTER_BYTES))
                    .ok_or_else(|| {
                        Error::Unsupported(format!(
                            "split-row exchange workspace for {} rows overflows usize",
                            shape.rows
                        ))
                    })?;
                let mut b = ctx.alloc::<u8>(bytes)?;
                b.fill_bytes(0)?;
                Some(b)
            }
            _ => None,
        };
        Ok(SoftmaxPlan {
            ctx: ctx.clone(),
            shape: *shape,
            opts: *opts,
            path: plan_path,
            exchange,
            vector,
            scalar,
        })
    }

    /// What the plan was made from (see [`SoftmaxPlanKey`]).
    pub fn key(&self) -> SoftmaxPlanKey {
        SoftmaxPlanKey::new(&self.shape, &self.opts)
    }

    /// The path the plan chose.
    pub fn path(&self) -> SoftmaxPath {
        self.path
    }

    /// The variant used for 16-byte aligned calls (the scalar one otherwise).
    pub fn variant(&self) -> Variant {
        self.primary().variant
    }

    fn primary(&self) -> &Launchable {
        self.vector.as_ref().unwrap_or(&self.scalar)
    }

    /// The shape the plan was made for.
    pub fn shape(&self) -> &SoftmaxShape {
        &self.shape
    }

    /// Runs `output = softmax(scale * input)` on the context's stream (asynchronously).
    pub fn run(&self, input: &TensorView<'_>, output: &mut TensorViewMut<'_>) -> Result<()> {
        let got = SoftmaxShape::of_views(input, &output.as_view())?;
        self.check_shape(&got)?;
        self.launch(input.device_ptr(), output.device_ptr())
    }

    /// Runs in place: `data = softmax(scale * data)`. The plan's input and output dtypes and
    /// strides must be equal.
    pub fn run_inplace(&self, data: &mut TensorViewMut<'_>) -> Result<()> {
        let v = data.as_view();
        let got = SoftmaxShape::of_views(&v, &v)?;
        self.check_shape(&got)?;
        self.launch(v.device_ptr(), v.device_ptr())
    }

    fn check_shape(&self, got: &SoftmaxShape) -> Result<()> {
        let want = &self.shape;
        if got.in_dtype != want.in_dtype || got.out_dtype != want.out_dtype {
            return Err(Error::invalid(
                "input/output",
                format!(
                    "dtypes {} -> {} do not match the plan's {} -> {}",
                    got.in_dtype, got.out_dtype, want.in_dtype, want.out_dtype
                ),
            ));
        }
        if got != want {
            return Err(Error::invalid(
                "input/output",
                format!(
                    "shape {}x{} (row strides {}, {}) does not match the plan's {}x{} (row strides {}, {})",
                    got.rows,
                    got.cols,
                    got.in_stride,
                    got.out_stride,
                    want.rows,
                    want.cols,
                    want.in_stride,
                    want.out_stride
                ),
            ));
        }
        Ok(())
    }

    fn launch(&self, input: u64, output: u64) -> Result<()> {
        let s = &self.shape;
        if s.rows == 0 {
            return Ok(());
        }
        for (arg, p, d) in [("input", input, s.in_dtype), ("output", output, s.out_dtype)] {
            if p % d.size() as u64 != 0 {
                return Err(Error::invalid(
                    arg,
                    format!("device pointer {p:#x} is not aligned to its {d} elements"),
                ));
            }
        }
        let aligned = input % 16 == 0 && output % 16 == 0;
        let l = match &self.vector {
            Some(v) if aligned => v,
            _ => &self.scalar,
        };
        let params = SoftmaxParams {
            input,
            output,
            rows: s.rows as i64,
            cols: s.cols as i64,
            in_stride: s.in_stride as i64,
            out_stride: s.out_stride as i64,
            scale_log2e: self.opts.scale * std::f32::consts::LOG2_E,
            scale: self.opts.scale,
        };
        if l.variant.path.is_cluster() {
            let split = l.variant.path == SoftmaxPath::SplitRow;
            let counters = match (&self.exchange, split) {
                (Some(b), true) => b.device_ptr(),
                (None, true) => {
                    return Err(Error::Unsupported(
                        "internal: a split-row plan without its exchange slots".into(),
                    ))
                }
                _ => 0,
            };
            let cp = SoftmaxClusterParams {
                base: params,
                chunk: l.chunk as i64,
                exchange: if split {
                    counters + EXCHANGE_COUNTER_BYTES as u64
                } else {
                    0
                },
                counters,
            };
            // SAFETY: as below; every CTA of a cluster touches only its share of each row
            // (columns [rank * chunk, (rank + 1) * chunk) clipped to cols). Split-row CTAs also
            // write their slot of each of their rows and the counters (allocated for this shape:
            // rows x CTAs per row slots) and read their rows' other slots; the cooperative
            // launch makes every CTA resident at once, so no wait is left pending.
            return unsafe { l.kernel.launch(&self.ctx, l.cfg, &cp) };
        }
        // SAFETY: the views were bounds-checked against their buffers when made (every row of
        // `cols` elements at `stride` lies inside its allocation), the shape equals the plan's
        // (checked above), the pointers are aligned for the variant chosen, and SoftmaxParams
        // mirrors the kernel's struct. The kernel touches only rows x cols of each view.
        unsafe { l.kernel.launch(&self.ctx, l.cfg, &params) }
    }
}

/// Shared memory of the cached path: the row as f32, rounded up to 16 bytes.
fn cached_smem_bytes(cols: usize) -> usize {
    (cols * 4).div_ceil(16) * 16
}

/// (CTAs per cluster, columns per CTA) for a row of `cols` elements of `in_size` bytes: one CTA
/// for rows of up to `CLUSTER_SINGLE_CTA_MAX_BYTES` (128 KB) where clusters exist (and `max_share`
/// holds it), else the smallest cluster (up to `max_cluster`) whose per-CTA share fits the
/// target, else the largest whose share fits `max_share` bytes. `None` when no cluster can hold
/// the row. `max_share` 0 asks whether the row fits the targets alone.
pub fn cluster_shape(
    cols: usize,
    in_size: usize,
    align: usize,
    max_cluster: u32,
    max_share: usize,
) -> Option<(u32, usize)> {
    let share = |c: u32| cols.div_ceil(c as usize).div_ceil(align) * align;
    // (max_share 0: the target question only, which any device with clusters can then serve)
    let single = share(1) * in_size;
    if max_cluster > 1 && single <= CLUSTER_SINGLE_CTA_MAX_BYTES && (max_share == 0 || single + 1024 <= max_share) {
        return Some((1, share(1)));
    }
    let sizes: Vec<u32> = [1u32, 2, 4, 8].into_iter().filter(|&c| c <= max_cluster).collect();
    if let Some(&c) = sizes
        .iter()
        .find(|&&c| share(c) * in_size <= CLUSTER_TARGET_SHARE_BYTES)
    {
        return Some((c, share(c)));
    }
    let c = *sizes.last()?;
    (share(c) * in_size + 1024 <= max_share).then(|| (c, share(c)))
}

/// The cluster path's vector widths (input, output) for a shape: 16-byte packs where the row
/// stride allows them (pointer alignment is checked per call).
fn cluster_packs(shape: &SoftmaxShape) -> (u32, u32) {
    let pi = pack_of(shape.in_dtype);
    let po = pack_of(shape.out_dtype);
    (
        if shape.in_stride % pi as usize == 0 { pi } else { 1 },
        if shape.out_stride % po as usize == 0 { po } else { 1 },
    )
}

/// Largest cluster the device runs (clusters are a Hopper feature).
fn max_cluster(ctx: &Context) -> u32 {
    if ctx.info().compute_capability.0 >= 9 {
        8
    } else {
        1
    }
}

/// The cluster-path kernel variant for `shape` (`vector`: with 16-byte packs), its share
/// (columns per CTA) and dynamic shared memory, on a device with clusters of up to
/// `max_cluster` CTAs and `optin` bytes of shared memory per CTA; `None` where the path cannot
/// hold the row. No device needed: the plan's choice, also swept by the tests.
pub fn cluster_variant(
    shape: &SoftmaxShape,
    mut variant: Variant,
    vector: bool,
    max_cluster: u32,
    optin: usize,
) -> Option<(Variant, usize, usize)> {
    let (pi, po) = if vector { cluster_packs(shape) } else { (1, 1) };
    if vector && pi == 1 && po == 1 {
        return None;
    }
    let in_size = shape.in_dtype.size();
    let (cluster, chunk) = cluster_shape(shape.cols, in_size, pi.max(po) as usize, max_cluster, optin)?;
    let smem = (chunk * in_size).div_ceil(16) * 16;
    variant.pack = pi;
    variant.out_pack = po;
    variant.cluster = cluster;
    variant.cols_per_thread = 1;
    variant.block_threads = cluster_threads(smem);
    variant.copy_groups = if variant.pipelined() {
        copy_groups_for(chunk, pi, variant.block_threads)
    } else {
        1
    };
    Some((variant, chunk, smem))
}

/// Compiles a cluster-path variant (`vector`: with 16-byte packs) and sizes its grid.
fn build_cluster(ctx: &Context, shape: &SoftmaxShape, variant: Variant, vector: bool) -> Result<Option<Launchable>> {
    let optin = ctx.info().max_shared_per_block_optin as usize;
    let Some((variant, chunk, smem)) = cluster_variant(shape, variant, vector, max_cluster(ctx), optin) else {
        return Ok(None);
    };
    let cluster = variant.cluster;
    let threads = variant.block_threads;
    let kernel = ctx.kernel(&variant.spec())?;
    let resident = if cluster > 1 {
        kernel.max_active_clusters(ctx, LaunchConfig::clustered(cluster, threads, smem as u32, cluster))?
    } else {
        kernel.max_active_blocks_per_sm(ctx, threads, smem as u32)? * ctx.info().sm_count
    };
    if resident == 0 {
        return Ok(None);
    }
    // The pipelined schedule refills a cluster's shares across its rows: one wave of resident
    // clusters, each running several rows. The plain one lets the hardware schedule waves.
    let waves = if variant.pipelined() {
        PREFETCH_GRID_WAVES
    } else {
        CLUSTER_GRID_WAVES
    };
    let clusters = (shape.rows as u64).min(resident as u64 * waves as u64).max(1) as u32;
    Ok(Some(Launchable {
        variant,
        kernel,
        cfg: LaunchConfig::clustered(clusters * cluster, threads, smem as u32, cluster).with_dependent_launch(),
        chunk,
    }))
}

/// Commit groups per row of the pipelined schedules: one per pack ([`COPY_GROUPS`]) where every
/// thread holds at most that many full packs of a `chunk`-element share (`pack` elements each),
/// else one. Per-pack groups let the reduction pass start on the first packs while the last are
/// still arriving: faster on the long rows of the default dispatch (see this folder's NOTES.md).
pub fn copy_groups_for(chunk: usize, pack: u32, threads: u32) -> u32 {
    if chunk / pack.max(1) as usize <= (COPY_GROUPS * threads) as usize {
        COPY_GROUPS
    } else {
        1
    }
}
/// `kCopyGroups` of a pipelined variant whose shares allow one group per pack.
pub const COPY_GROUPS: u32 = 8;

/// Split-row path: input bytes a CTA's share aims for, and its threads (three CTAs per SM).
/// 64 KB / 512 threads measured faster than 32 KB / 256 and 16 KB / 256, and than cluster-pipe's
/// 8 CTAs of 128 KB (the cluster limit) on fp32 256 x 262144 (see this folder's NOTES.md).
pub const SPLIT_SHARE_BYTES: usize = 64 * 1024;
const SPLIT_THREADS: u32 = 512;
/// Rows of at least this many input bytes take [`SoftmaxPath::SplitRow`] on GPUs with clusters:
/// forced side by side, split-row beat cluster-pipe on every row of 256 KB and more (most on the
/// 1 MB rows, which a cluster holds only as 8 x 128 KB, one CTA per SM); on 128 KB rows one CTA
/// holds the row and wins (see this folder's NOTES.md).
const SPLIT_MIN_ROW_BYTES: usize = CLUSTER_PIPE_MIN_ROW_BYTES;
/// Most CTAs a split row spreads over (`kCluster` of the split-row kernel).
pub const SPLIT_MAX_CTAS: u32 = 32;

/// (CTAs per row, columns per CTA) of the split-row path: shares of at most `share_bytes`
/// input bytes (larger ones past [`SPLIT_MAX_CTAS`] CTAs), a multiple of `align` elements;
/// `None` for a row one CTA's share holds.
pub fn split_row_shape(cols: usize, in_size: usize, align: usize, share_bytes: usize) -> Option<(u32, usize)> {
    let align = align.max(1);
    let per = (share_bytes / in_size.max(1) / align).max(1) * align;
    let ctas = cols.div_ceil(per).min(SPLIT_MAX_CTAS as usize);
    if ctas < 2 {
        return None;
    }
    // Even shares (a multiple of the pack), then no CTA without columns.
    let chunk = cols.div_ceil(ctas).div_ceil(align) * align;
    Some((cols.div_ceil(chunk) as u32, chunk))
}

/// Why a forced split-row plan cannot be made for `shape` (`optin`: shared memory per CTA).
fn split_row_unsupported(shape: &SoftmaxShape, optin: usize) -> String {
    let pack = pack_of(shape.in_dtype) as usize;
    let size = shape.in_dtype.size();
    if shape.in_stride % pack != 0 {
        return format!(
            "the split-row path copies 16-byte packs: the input row stride must be a multiple of {pack} \
             elements, got {}",
            shape.in_stride
        );
    }
    match split_row_shape(shape.cols, size, pack, SPLIT_SHARE_BYTES) {
        None => format!(
            "the split-row path splits rows longer than one {} KB share; a row of {} columns ({} B) \
             fits one CTA (use the cluster or block paths)",
            SPLIT_SHARE_BYTES / 1024,
            shape.cols,
            shape.cols * size
        ),
        Some((_, chunk)) if chunk * size + 1024 > optin => format!(
            "the split-row path holds at most {SPLIT_MAX_CTAS} shares per row; {} columns need shares of \
             {} B each, over the {optin} B of shared memory per CTA (use the uncached block path)",
            shape.cols,
            chunk * size,
        ),
        Some((ctas, _)) => {
            format!("the split-row path needs {ctas} CTAs per row resident at once; this device has fewer")
        }
    }
}

/// (CTAs per row, columns per CTA, dynamic shared memory) of the split-row kernel for `shape`
/// on a device with `optin` bytes of shared memory per CTA: `None` without 16-byte input packs,
/// for a row one share holds, or for shares over `optin` (with the 1 KB the kernel adds).
fn split_row_geometry(shape: &SoftmaxShape, optin: usize) -> Option<(u32, usize, u32)> {
    let (pi, _) = cluster_packs(shape);
    if pi == 1 {
        return None;
    }
    let in_size = shape.in_dtype.size();
    let (ctas, chunk) = split_row_shape(shape.cols, in_size, pi as usize, SPLIT_SHARE_BYTES)?;
    let smem = ((chunk * in_size).div_ceil(16) * 16) as u32;
    (smem as usize + 1024 <= optin).then_some((ctas, chunk, smem))
}

/// The split-row kernel variant for `shape`, its share (columns per CTA) and dynamic shared
/// memory on a device with `optin` bytes of shared memory per CTA; `None` where the path cannot
/// hold the row (see `split_row_unsupported`). No device needed: also swept by the tests.
pub fn split_row_variant(shape: &SoftmaxShape, mut variant: Variant, optin: usize) -> Option<(Variant, usize, u32)> {
    let (ctas, chunk, smem) = split_row_geometry(shape, optin)?;
    let (pi, po) = cluster_packs(shape);
    variant.pack = pi;
    variant.out_pack = po;
    variant.cluster = ctas;
    variant.cols_per_thread = 1;
    variant.block_threads = SPLIT_THREADS;
    // One commit group per pack where shares allow it: level or faster against one per row on
    // the forced split-row shapes (see this folder's NOTES.md).
    variant.copy_groups = copy_groups_for(chunk, pi, SPLIT_THREADS);
    Some((variant, chunk, smem))
}

/// Groups of the static split-row schedule (rows g, g + groups, ...) for `rows` over at most
/// `max_groups` resident groups: no more than ceil(rows / max_groups) rounds need.
fn split_static_groups(rows: u64, max_groups: u32) -> u32 {
    let rows = rows.max(1);
    let per_group = rows.div_ceil(max_groups.max(1) as u64);
    rows.div_ceil(per_group) as u32
}

/// Whether the split-row groups of a launch claim their rows (`kClaimRows`: after its first row
/// each group takes the next unclaimed one from a counter, so every resident group works and
/// faster groups take more rows) instead of the static schedule: on GPUs of compute capability
/// 9+ (`major`), where the static schedule would leave more than 8% of the groups that could
/// work unused (`split_static_groups` against min(rows, max_groups)). Claiming won on fp16
/// 256 x 262144 (49 resident groups, 43 static ones of 6 rows) but fell behind on fp16
/// 1024 x 131072 (99 resident, 94 static) and where every group is used (fp32 1024 x 131072,
/// 256 x 262144): where the static schedule uses the groups, claiming only adds the claim to each
/// row (see this folder's NOTES.md).
pub fn split_claims_rows(rows: u64, max_groups: u32, major: u32) -> bool {
    let usable = rows.min(max_groups as u64);
    // (the claiming kernel keeps row indices in 32 bits)
    major >= 9 && rows < 1 << 31 && (split_static_groups(rows, max_groups) as u64) * 100 < usable * 92
}

/// Compiles the split-row variant (16-byte packs) and sizes its grid: one wave of resident CTAs
/// in groups of one row's CTAs, each group running ceil(rows / groups) rows at most (static
/// schedule) or the rows it claims (where [`split_claims_rows`]; every resident group then).
fn build_split_row(ctx: &Context, shape: &SoftmaxShape, variant: Variant) -> Result<Option<Launchable>> {
    let optin = ctx.info().max_shared_per_block_optin as usize;
    let Some((mut variant, chunk, smem)) = split_row_variant(shape, variant, optin) else {
        return Ok(None);
    };
    let ctas = variant.cluster;
    let threads = variant.block_threads;
    let mut kernel = ctx.kernel(&variant.spec())?;
    let resident =
        |k: &Kernel| -> Result<u32> { Ok(k.max_active_blocks_per_sm(ctx, threads, smem)? * ctx.info().sm_count) };
    let max_groups = resident(&kernel)? / ctas;
    if max_groups == 0 {
        return Ok(None);
    }
    let rows = shape.rows.max(1) as u64;
    if split_claims_rows(rows, max_groups, ctx.info().compute_capability.0) {
        let claiming = Variant {
            claim_rows: true,
            ..variant
        };
        let k = ctx.kernel(&claiming.spec())?;
        if resident(&k)? / ctas >= max_groups {
            (variant, kernel) = (claiming, k);
        }
    }
    let groups = if variant.claim_rows {
        // Every resident group (up to one per row), each claiming its rows after the first.
        rows.min(max_groups as u64) as u32
    } else {
        split_static_groups(rows, max_groups)
    };
    Ok(Some(Launchable {
        variant,
        kernel,
        // Cooperative: the CTAs of a row wait for each other, so the driver must place the
        // whole grid at once (it fails the launch rather than let them hang).
        cfg: LaunchConfig::linear(groups * ctas, threads, smem)
            .with_dependent_launch()
            .with_cooperative(),
        chunk,
    }))
}

/// Compiles one variant and sizes its grid. `None` when no CTA of that path fits an SM.
fn build_variant(
    ctx: &Context,
    shape: &SoftmaxShape,
    kind: SoftmaxKind,
    path: SoftmaxPath,
    pack: u32,
) -> Result<Option<Launchable>> {
    let sm = ctx.info().sm_count;
    let mut variant = Variant {
        in_dtype: shape.in_dtype,
        out_dtype: shape.out_dtype,
        kind,
        path,
        block_threads: WARP_PATH_THREADS,
        pack,
        cols_per_thread: pack, // warp path only; a valid value keeps block variants well-formed
        rows_per_warp: 1,
        warp_width: 32,
        cluster: 1,
        out_pack: 1,
        copy_groups: 1,
        claim_rows: false,
    };
    let (threads, smem) = match path {
        p if p.is_warp() => {
            let (cpt, width, rpw) = warp_shape(shape.cols, pack);
            variant.cols_per_thread = cpt;
            variant.warp_width = width;
            variant.rows_per_warp = rpw;
            (WARP_PATH_THREADS, 0)
        }
        SoftmaxPath::BlockCached => {
            let smem = cached_smem_bytes(shape.cols) as u32;
            match best_cached_block(ctx, &variant, smem)? {
                Some(t) => (t, smem),
                None => return Ok(None),
            }
        }
        SoftmaxPath::BlockUncached => (UNCACHED_THREADS, 0),
        // Split-row calls whose pointers are not 16-byte aligned: the plain cluster kernel where it holds
        // the row (read once), else the uncached one (read twice).
        SoftmaxPath::SplitRow if pack == 1 => {
            let plain = Variant {
                path: SoftmaxPath::Cluster,
                ..variant
            };
            return match build_cluster(ctx, shape, plain, false)? {
                Some(l) => Ok(Some(l)),
                None => build_variant(ctx, shape, kind, SoftmaxPath::BlockUncached, 1),
            };
        }
        SoftmaxPath::SplitRow => return build_split_row(ctx, shape, variant),
        p if p.is_cluster() => return build_cluster(ctx, shape, variant, pack > 1),
        _ => unreachable!("resolved by the plan"),
    };
    variant.block_threads = threads;
    let kernel = ctx.kernel(&variant.spec())?;
    let per_sm = kernel.max_active_blocks_per_sm(ctx, threads, smem)?;
    if per_sm == 0 {
        return Ok(None);
    }
    let needed = (shape.rows as u64).div_ceil(variant.rows_per_cta() as u64);
    let waves = if path == SoftmaxPath::WarpV2 {
        PREFETCH_GRID_WAVES
    } else {
        GRID_WAVES
    };
    let cap = sm as u64 * per_sm as u64 * waves as u64;
    let grid = needed.min(cap).max(1) as u32;
    Ok(Some(Launchable {
        variant,
        kernel,
        cfg: LaunchConfig::linear(grid, threads, smem).with_dependent_launch(),
        chunk: 0,
    }))
}

/// Block size for the cached path: the one keeping the most threads resident per SM with
/// `smem` bytes per CTA (the row must be streamed by enough threads), smaller on ties (more
/// CTAs, better tails).
fn best_cached_block(ctx: &Context, base: &Variant, smem: u32) -> Result<Option<u32>> {
    let mut best: Option<(u32, u32)> = None; // (resident threads, block)
    for threads in [128u32, 256, 512, 1024] {
        let v = Variant {
            block_threads: threads,
            ..*base
        };
        let k = ctx.kernel(&v.spec())?;
        let resident = k.max_active_blocks_per_sm(ctx, threads, smem)? * threads;
        if resident > 0 && best.is_none_or(|(r, _)| resident > r) {
            best = Some((resident, threads));
        }
    }
    Ok(best.map(|(_, t)| t))
}

/// The warp-per-row kernels: the dispatched one and the tunings measured against it.
const WARP_PATHS: [SoftmaxPath; 3] = [SoftmaxPath::WarpPerRow, SoftmaxPath::WarpNc, SoftmaxPath::WarpV2];

/// Every variant the dispatcher can produce on `arch` (clusters of several CTAs only on sm_90+)
/// for same-dtype softmax, plus every dtype pairing and kind on each path: what CI compiles.
pub fn ci_variants_for(arch: crate::runtime::Arch) -> Vec<Variant> {
    ci_variants()
        .into_iter()
        .filter(|v| arch.major >= 9 || ((v.cluster <= 1 || v.path == SoftmaxPath::SplitRow) && !v.claim_rows))
        .collect()
}

/// [`ci_variants_for`] a Hopper GPU: every variant.
pub fn ci_variants() -> Vec<Variant> {
    let dtypes = [DType::F32, DType::F16, DType::BF16];
    let mut out = Vec::new();
    let base = |i: DType, o: DType, kind, path, threads, pack| Variant {
        in_dtype: i,
        out_dtype: o,
        kind,
        path,
        block_threads: threads,
        pack,
        cols_per_thread: pack,
        rows_per_warp: 1,
        warp_width: 32,
        cluster: 1,
        out_pack: 1,
        copy_groups: 1,
        claim_rows: false,
    };
    for &d in &dtypes {
        // Warp path: every (cols_per_thread, width, rows) shape for cols 1..=1024, both packs.
        for pack in [1, pack_of(d)] {
            let mut shapes: Vec<(u32, u32, u32)> = (1..=WARP_MAX_COLS).map(|c| warp_shape(c, pack)).collect();
            shapes.dedup();
            shapes.sort();
            shapes.dedup();
            for (cpt, width, rpw) in shapes {
                for path in WARP_PATHS {
                    let mut v = base(d, d, SoftmaxKind::Softmax, path, WARP_PATH_THREADS, pack);
                    v.cols_per_thread = cpt;
                    v.warp_width = width;
                    v.rows_per_warp = rpw;
                    out.push(v);
                }
            }
        }
        for threads in [128, 256, 512, 1024] {
            for pack in [1, pack_of(d)] {
                out.push(base(
                    d,
                    d,
                    SoftmaxKind::Softmax,
                    SoftmaxPath::BlockCached,
                    threads,
                    pack,
                ));
            }
        }
        for pack in [1, pack_of(d)] {
            out.push(base(
                d,
                d,
                SoftmaxKind::Softmax,
                SoftmaxPath::BlockUncached,
                UNCACHED_THREADS,
                pack,
            ));
        }
    }
    // Every dtype pairing and kind on each path (one representative shape each).
    for &i in &dtypes {
        for &o in &dtypes {
            for kind in [SoftmaxKind::Softmax, SoftmaxKind::LogSoftmax] {
                let pack = pack_of(i).min(pack_of(o));
                for path in WARP_PATHS {
                    for cols in [128, 1000] {
                        let mut w = base(i, o, kind, path, WARP_PATH_THREADS, pack);
                        let (cpt, width, rpw) = warp_shape(cols, pack);
                        (w.cols_per_thread, w.warp_width, w.rows_per_warp) = (cpt, width, rpw);
                        out.push(w);
                    }
                }
                for threads in [128, 256, 512, 1024] {
                    // The plan queries the occupancy of every block size of the cached path.
                    out.push(base(i, o, kind, SoftmaxPath::BlockCached, threads, pack));
                }
                out.push(base(i, o, kind, SoftmaxPath::BlockUncached, UNCACHED_THREADS, pack));
            }
        }
    }
    // Cluster path: every cluster size, block size and pair of access widths (16-byte packs or
    // scalar, in and out: row strides and pointers decide) for the same-dtype pairs, and every
    // pairing and kind once. (The scalar-input pipelined variant is the plain kernel.)
    for &d in &dtypes {
        let pk = pack_of(d);
        for cluster in [1, 2, 4, 8] {
            for threads in [512, 1024] {
                for (pack, out_pack) in [(pk, pk), (pk, 1), (1, pk), (1, 1)] {
                    for path in [SoftmaxPath::Cluster, SoftmaxPath::ClusterPipe] {
                        let mut v = base(d, d, SoftmaxKind::Softmax, path, threads, pack);
                        v.cluster = cluster;
                        v.out_pack = out_pack;
                        v.cols_per_thread = 1;
                        out.push(v);
                    }
                }
            }
        }
    }
    for &i in &dtypes {
        for &o in &dtypes {
            for kind in [SoftmaxKind::Softmax, SoftmaxKind::LogSoftmax] {
                for path in [SoftmaxPath::Cluster, SoftmaxPath::ClusterPipe] {
                    let mut v = base(i, o, kind, path, 512, pack_of(i));
                    v.cluster = 4;
                    v.out_pack = pack_of(o);
                    v.cols_per_thread = 1;
                    out.push(v);
                }
            }
        }
    }
    // Split-row path (any arch): every CTA count with packed or scalar stores for the same-dtype
    // pairs, and every pairing and kind once.
    for &d in &dtypes {
        for ctas in 2..=SPLIT_MAX_CTAS {
            let mut v = base(
                d,
                d,
                SoftmaxKind::Softmax,
                SoftmaxPath::SplitRow,
                SPLIT_THREADS,
                pack_of(d),
            );
            v.cluster = ctas;
            v.cols_per_thread = 1;
            for out_pack in [pack_of(d), 1] {
                out.push(Variant { out_pack, ..v });
            }
        }
    }
    for &i in &dtypes {
        for &o in &dtypes {
            for kind in [SoftmaxKind::Softmax, SoftmaxKind::LogSoftmax] {
                for out_pack in [pack_of(o), 1] {
                    let mut v = base(i, o, kind, SoftmaxPath::SplitRow, SPLIT_THREADS, pack_of(i));
                    v.cluster = 8;
                    v.out_pack = out_pack;
                    v.cols_per_thread = 1;
                    out.push(v);
                }
            }
        }
    }
    // Pipelined schedules: one commit group per pack wherever shares allow it. 512-thread
    // shares hold at most 64 KB (8 packs per thread), so only 1024-thread cluster shares and
    // split rows past SPLIT_MAX_CTAS shares also need the one-group variant.
    let per_pack: Vec<Variant> = out
        .iter()
        .filter(|v| v.pipelined())
        .map(|v| Variant {
            copy_groups: COPY_GROUPS,
            ..*v
        })
        .collect();
    out.retain(|v| {
        !v.pipelined() || v.block_threads > 512 || (v.path == SoftmaxPath::SplitRow && v.cluster == SPLIT_MAX_CTAS)
    });
    out.extend(per_pack);
    // Split-row groups that claim their rows (split_claims_rows: sm_90+ only).
    let claiming: Vec<Variant> = out
        .iter()
        .filter(|v| v.path == SoftmaxPath::SplitRow)
        .map(|v| Variant { claim_rows: true, ..*v })
        .collect();
    out.extend(claiming);
    // The scalar variant of the pipelined cluster path is the plain one: one entry per kernel.
    out.sort_by_key(|v| v.spec().name);
    out.dedup_by_key(|v| v.spec().name);
    out
}
