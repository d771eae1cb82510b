//! Paged GQA decode with split-KV: [`DecodePlan`] (plan once per batch composition, run once per
//! layer), the kernel variants and the chunk planner.
//!
//! `O[b, i, h] = softmax_j(Q[b, i, h] . K[b, j, h / g] * scale) V[b, j, h / g]` for `q_len`
//! query tokens per sequence (1 for plain decode, up to 8 for speculative decoding; token `i`
//! sits at position `len - q_len + i` and sees the keys up to it), reading K/V in place from the
//! pages of each sequence's block table. Queries and outputs are `[B, q_len, Hq, D]` fp16/bf16;
//! the optional LSE (natural log, f32) is `[B, q_len, Hq]`. A sequence of length 0 gives zeros
//! (LSE `-inf`).
//!
//! Work: one CTA per (KV head, work item = (sequence, key chunk), row group), serving the query
//! heads of that KV head. Two kernels ([`DecodeLayout`]): when a KV head serves at most 8 query
//! rows (group x q_len), paged_decode_narrow.cu puts the keys on the MMA's M and the rows on
//! its n8; otherwise paged_decode.cu puts 16 or 32 query rows on M. Sequences cut into several
//! chunks are merged with the online-softmax rule by the CTA that finishes the last of them
//! (an arrival counter per (sequence, KV head, row group); paged_decode_common.cuh), in the
//! same launch.

use std::sync::Arc;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::runtime::jit::KernelSpec;
use crate::runtime::launch::{Kernel, KernelParams, LaunchConfig};
use crate::runtime::KernelKey;
use crate::runtime::{Context, DeviceBuffer, TensorView, TensorViewMut};

use super::{KvCacheConfig, PagedBatch, PagedKvCache, PagedTables};

const DECODE_SOURCE: &str = include_str!("paged_decode.cu");
const DECODE_NARROW_SOURCE: &str = include_str!("paged_decode_narrow.cu");

/// Most query tokens per sequence (speculative decoding).
pub const MAX_Q_LEN: usize = 8;
/// Smallest key chunk the planner cuts a sequence into (shorter chunks cost more in partials
/// and merging than they gain in parallelism).
pub const MIN_CHUNK_TOKENS: usize = 256;
/// Most work items (grid.y).
pub const MAX_ITEMS: usize = 65535;
/// Batches reading at most this many K/V bytes per layer launch with programmatic dependent
/// launch (sm_90+): such a decode launch may be scheduled while the previous tessera kernel on
/// the stream finishes (that kernel allows it once its CTAs are past their main loop) and waits
/// for it before touching memory, hiding part of the launch latency, which matters most for short
/// contexts; longer launches measured slower with it, cause not established (see this folder's
/// NOTES.md). Decided from the lengths given to `new` / `update`.
pub const DEPENDENT_LAUNCH_MAX_KV_BYTES: usize = 256 << 20;

/// Whether a decode of sequences `lens` over `cfg`'s cache is short enough for programmatic
/// dependent launch to pay ([`DEPENDENT_LAUNCH_MAX_KV_BYTES`]).
pub fn dependent_launch_pays(lens: &[usize], cfg: &KvCacheConfig) -> bool {
    let tokens = lens.iter().fold(0usize, |a, &l| a.saturating_add(l));
    let bytes = tokens
        .saturating_mul(2 * cfg.heads_kv * cfg.head_dim)
        .saturating_mul(cfg.dtype.size());
    bytes <= DEPENDENT_LAUNCH_MAX_KV_BYTES
}

/// Kernel shape knobs (tile keys per warp, pipeline stages, warps per CTA) of a decode variant.
/// The planner's choice is [`default_kernel_shape`] (measured on the H200: this folder's NOTES.md);
/// `Default` is only the starting point of a variant before that choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DecodeKernelShape {
    /// Warps per CTA: 2, 4 or 8.
    pub warps: u32,
    /// Keys per warp tile: 16, 32 or 64 (powers of two, like page sizes, so a tile always
    /// covers whole pages or lies inside one).
    pub tile_keys: u32,
    /// cp.async stages per warp: 2..=8.
    pub stages: u32,
}

impl Default for DecodeKernelShape {
    fn default() -> Self {
        DecodeKernelShape {
            warps: 4,
            tile_keys: 16,
            stages: 4,
        }
    }
}

impl DecodeKernelShape {
    pub(crate) fn validate(&self) -> Result<()> {
        if !matches!(self.warps, 2 | 4 | 8)
            || !matches!(self.tile_keys, 16 | 32 | 64)
            || !(2..=8).contains(&self.stages)
        {
            return Err(Error::invalid(
                "tuning",
                format!("{self:?}: warps 2, 4 or 8, tile_keys 16/32/64, stages 2..=8"),
            ));
        }
        Ok(())
    }
}

/// How a decode CTA's query rows meet the tensor-core MMA (which kernel runs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DecodeLayout {
    /// Query rows are the MMA's M: 16 (32 for D <= 128 and more than 16 rows) query rows per
    /// CTA (paged_decode.cu); more rows take one CTA (and one read of K/V) per 16 or 32.
    QueryRows,
    /// Keys are the MMA's M and up to 8 query rows its n8 (paged_decode_narrow.cu): half the
    /// MMAs and accumulators of `QueryRows`, and an fp8 cache converted from shared memory
    /// straight into MMA fragments. More than 8 rows take one CTA (and one read of K/V) per 8.
    KeyRows,
}

impl DecodeLayout {
    /// `query-rows` / `key-rows` (bench and verify names).
    pub fn name(self) -> &'static str {
        match self {
            DecodeLayout::QueryRows => "query-rows",
            DecodeLayout::KeyRows => "key-rows",
        }
    }
    /// The planner's choice: `KeyRows` when a KV head serves at most 8 query rows.
    pub fn for_rows(rows: usize) -> DecodeLayout {
        if rows <= 8 {
            DecodeLayout::KeyRows
        } else {
            DecodeLayout::QueryRows
        }
    }
}

/// Options of a decode plan. Defaults: one query token, `scale = 1/sqrt(D)`, fp16 queries for an
/// fp8 cache, and the planner's choices ([`DecodeTuning::default`]).
/// `DecodeOptions { q_len: 4, ..Default::default() }`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecodeOptions {
    /// Query tokens per sequence, 1..=8. Default 1.
    pub q_len: usize,
    /// Softmax scale; `None` = `1/sqrt(D)`. Finite and > 0.
    pub scale: Option<f32>,
    /// Query/output dtype for an fp8 cache (F16 or BF16; default F16). fp16/bf16 caches use
    /// their own dtype.
    pub query_dtype: Option<DType>,
    /// Forced planner choices, for benchmarks and experiments. Default: none forced.
    pub tuning: DecodeTuning,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions {
            q_len: 1,
            scale: None,
            query_dtype: None,
            tuning: DecodeTuning::default(),
        }
    }
}

/// Choices of a decode plan that the planner makes unless forced here: for benchmarks and
/// experiments; the defaults (all `None`) are what the planner chooses. Results do not depend on
/// them beyond rounding (split-KV merges in another order), only speed and which problems a plan
/// accepts. The library never reads them from the environment; the bench harness does
/// (`TESSERA_DECODE_TUNING`, `TESSERA_DECODE_LAYOUT`: [`super::bench::env_tuning`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DecodeTuning {
    /// Key chunk per work item (a multiple of 64); `Some(usize::MAX)` disables split-KV.
    /// Default `None`: the planner chooses from the lengths, Hkv and the SM count
    /// ([`choose_chunk`]).
    pub chunk_tokens: Option<usize>,
    /// Kernel shape (warps, keys per tile, stages). Default `None`: [`default_kernel_shape`],
    /// the first candidate that fits the device's shared memory.
    pub kernel: Option<DecodeKernelShape>,
    /// Kernel layout. Default `None`: [`DecodeLayout::for_rows`].
    pub layout: Option<DecodeLayout>,
}

/// Compile-time specialisation of the decode kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DecodeVariant {
    /// Query / output dtype (fp16 or bf16).
    pub dtype: DType,
    /// Cache dtype (the query dtype or fp8 e4m3).
    pub cache: DType,
    pub head_dim: u32,
    pub page_size: u32,
    pub layout: DecodeLayout,
    /// m16 row blocks per CTA (1 or 2; `QueryRows` only, 1 for `KeyRows`).
    pub m_blocks: u32,
    pub shape: DecodeKernelShape,
}

impl DecodeVariant {
    /// The variant a plan runs: query dtype `dtype`, the cache's dtype, head dim and page size;
    /// the `layout` (or [`DecodeLayout::for_rows`]); for `QueryRows` 2 row blocks when a KV
    /// head serves more than 16 query rows (D <= 128); the `forced` tuning, or the default one
    /// shortened to fit `shared_limit`.
    pub fn for_problem(
        dtype: DType,
        cfg: &KvCacheConfig,
        heads_q: usize,
        q_len: usize,
        layout: Option<DecodeLayout>,
        forced: Option<DecodeKernelShape>,
        shared_limit: u32,
    ) -> DecodeVariant {
        let rows = heads_q / cfg.heads_kv.max(1) * q_len;
        let layout = layout.unwrap_or(DecodeLayout::for_rows(rows));
        let mut v = DecodeVariant {
            dtype,
            cache: cfg.dtype,
            head_dim: cfg.head_dim as u32,
            page_size: cfg.page_size as u32,
            layout,
            m_blocks: if layout == DecodeLayout::QueryRows && cfg.head_dim <= 128 && rows > 16 {
                2
            } else {
                1
            },
            shape: DecodeKernelShape::default(),
        };
        v.shape = forced.unwrap_or_else(|| default_kernel_shape(&v, shared_limit));
        v
    }

    /// Query rows per CTA.
    pub fn rows_per_cta(&self) -> u32 {
        match self.layout {
            DecodeLayout::QueryRows => 16 * self.m_blocks,
            DecodeLayout::KeyRows => 8,
        }
    }

    /// The specialisation of this variant: its name, preamble and cache hash.
    pub fn key(&self) -> KernelKey {
        let t = self.shape;
        let family = match self.layout {
            DecodeLayout::QueryRows => "paged_decode",
            DecodeLayout::KeyRows => "paged_decode_narrow",
        };
        KernelKey::new(family)
            .ty("Elem", self.dtype)
            .ty("Cache", self.cache)
            .int("kHeadDim", "d", self.head_dim)
            .int("kPageSize", "p", self.page_size)
            .int("kMBlocks", "m", self.m_blocks)
            .int("kWarps", "w", t.warps)
            .int("kTileKeys", "k", t.tile_keys)
            .int("kStages", "s", t.stages)
            .flag("kFp8", "fp8", self.cache == DType::F8E4M3)
            .int("kMinCtasPerSm", "o", min_ctas_per_sm(self))
    }

    pub fn spec(&self) -> KernelSpec {
        let (file, source, entry) = match self.layout {
            DecodeLayout::QueryRows => ("paged_decode.cu", DECODE_SOURCE, "paged_decode"),
            DecodeLayout::KeyRows => ("paged_decode_narrow.cu", DECODE_NARROW_SOURCE, "paged_decode_narrow"),
        };
        self.key().spec(file, source, entry, super::DEVICE_HEADERS)
    }

    /// Threads per CTA.
    pub fn threads(&self) -> u32 {
        self.shape.warps * 32
    }

    /// Dynamic shared memory: per warp the pipeline stages (K and V tiles, fp8 scales), and for
    /// `QueryRows` the Q tile before them and fp8 staging tiles; the warp merge reuses the
    /// pipeline area.
    pub fn shared_bytes(&self) -> u32 {
        let t = self.shape;
        let rows = self.rows_per_cta();
        let narrow = self.layout == DecodeLayout::KeyRows;
        let d = self.head_dim;
        let fp8 = self.cache == DType::F8E4M3;
        let tile_pages = if self.page_size < t.tile_keys {
            t.tile_keys / self.page_size
        } else {
            1
        };
        let cache_tile = t.tile_keys * d * self.cache.size() as u32;
        let elem_tile = t.tile_keys * d * 2;
        let stage = 2 * cache_tile + if fp8 { 16 * tile_pages } else { 0 };
        let warp = t.stages * stage + if fp8 && !narrow { 2 * elem_tile } else { 0 };
        let pipeline = t.warps * warp;
        let merge = t.warps * rows * (d + 4) * 4 + t.warps * rows * 8;
        let q_tile = if narrow { 0 } else { rows * d * 2 };
        q_tile + pipeline.max(merge)
    }
}

/// `ts::DecodeParams` (kvcache_params.cuh), field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DecodeParams {
    pub q: u64,
    pub o: u64,
    pub lse: u64,
    pub cache: u64,
    pub scales: u64,
    pub tables: PagedTables,
    pub item_seq: u64,
    pub item_indptr: u64,
    pub o_partial: u64,
    pub lse_partial: u64,
    pub chunk_counters: u64,
    pub q_stride_b: i64,
    pub q_stride_n: i64,
    pub q_stride_h: i64,
    pub o_stride_b: i64,
    pub o_stride_n: i64,
    pub o_stride_h: i64,
    pub batch: i32,
    pub heads_q: i32,
    pub heads_kv: i32,
    pub group: i32,
    pub q_len: i32,
    pub rows: i32,
    pub chunk_tokens: i32,
    pub num_items: i32,
    pub scale_log2: f32,
    pub pad_: i32,
}

// SAFETY: plain data matching the C layout of ts::DecodeParams (size checked by a compile test).
unsafe impl KernelParams for DecodeParams {}

/// The work list of a batch: which (sequence, chunk) each grid row serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkList {
    /// Key chunk per item (a multiple of the kernel's warps x tile keys).
    pub chunk_tokens: usize,
    /// `item_seq[x]`: the sequence of item x, longest chunks first.
    pub item_seq: Vec<i32>,
    /// `item_chunk[x]`: its chunk index within the sequence.
    pub item_chunk: Vec<i32>,
    /// `item_indptr[b] .. item_indptr[b + 1]`: the partial slots of sequence b.
    pub item_indptr: Vec<i32>,
}

impl WorkList {
    /// Items of sequence lengths `lens` cut into chunks of `chunk` tokens (a length-0 sequence
    /// still gets one item, which writes its zeros), ordered longest first.
    pub fn new(lens: &[usize], chunk: usize) -> WorkList {
        let chunk = chunk.max(1);
        let mut items: Vec<(usize, i32, i32)> = Vec::new(); // (tokens, seq, chunk)
        let mut indptr = Vec::with_capacity(lens.len() + 1);
        indptr.push(0i32);
        for (b, &len) in lens.iter().enumerate() {
            let n = len.div_ceil(chunk).max(1);
            for k in 0..n {
                items.push((len.min((k + 1) * chunk) - (k * chunk).min(len), b as i32, k as i32));
            }
            indptr.push(indptr[b] + n as i32);
        }
        items.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        WorkList {
            chunk_tokens: chunk,
            item_seq: items.iter().map(|i| i.1).collect(),
            item_chunk: items.iter().map(|i| i.2).collect(),
            item_indptr: indptr,
        }
    }
    pub fn num_items(&self) -> usize {
        self.item_seq.len()
    }
    /// True when some sequence has more than one chunk (its partials are merged).
    pub fn splits(&self) -> bool {
        self.item_indptr.windows(2).any(|w| w[1] - w[0] > 1)
    }
}

/// Estimated run time (in token units) of the work list on `slots` concurrent CTAs: list
/// scheduling of the items (longest first, `ctas_per_item` CTAs each) where an item costs its
/// tokens plus a fixed `ITEM_OVERHEAD`, plus `MERGE_COST` when partials are merged.
pub fn estimate_cost(lens: &[usize], chunk: usize, ctas_per_item: usize, slots: usize) -> f64 {
    const ITEM_OVERHEAD: f64 = 128.0;
    const MERGE_COST: f64 = 200.0;
    let w = WorkList::new(lens, chunk);
    let mut finish = std::collections::BinaryHeap::new(); // min-heap of slot finish times
    for _ in 0..slots.max(1) {
        finish.push(std::cmp::Reverse(0u64));
    }
    for (x, &s) in w.item_seq.iter().enumerate() {
        let k = w.item_chunk[x] as usize;
        let len = lens[s as usize];
        let tokens = len.min((k + 1) * chunk) - (k * chunk).min(len);
        let cost = tokens as u64 + ITEM_OVERHEAD as u64;
        for _ in 0..ctas_per_item {
            let std::cmp::Reverse(t) = finish.pop().unwrap_or(std::cmp::Reverse(0));
            finish.push(std::cmp::Reverse(t + cost));
        }
    }
    let makespan = finish.into_iter().map(|r| r.0).max().unwrap_or(0) as f64;
    makespan + if w.splits() { MERGE_COST } else { 0.0 }
}

/// Chooses the key chunk for a batch: among cutting the longest sequence into 1, 2, 3, 4, 6, 8,
/// ... 64 chunks (multiples of `quantum`, at least MIN_CHUNK_TOKENS), the one with the lowest
/// [`estimate_cost`]; candidates with more than 16 waves of CTAs are not considered.
pub fn choose_chunk(lens: &[usize], quantum: usize, ctas_per_item: usize, slots: usize) -> usize {
    let quantum = quantum.max(1);
    let max_len = lens.iter().copied().max().unwrap_or(0).max(1);
    let whole = max_len.div_ceil(quantum) * quantum;
    let mut best = (estimate_cost(lens, whole, ctas_per_item, slots), whole);
    for k in [2usize, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64] {
        let chunk = (max_len.div_ceil(k).div_ceil(quantum) * quantum).max(MIN_CHUNK_TOKENS.div_ceil(quantum) * quantum);
        if chunk >= best.1 {
            continue;
        }
        let items: usize = lens.iter().map(|&l| l.div_ceil(chunk).max(1)).sum();
        if items > MAX_ITEMS || items * ctas_per_item > 16 * slots {
            break;
        }
        let cost = estimate_cost(lens, chunk, ctas_per_item, slots);
        if cost < best.0 {
            best = (cost, chunk);
        }
    }
    best.1
}

/// Everything a [`DecodePlan`] is made from besides its context (device and stream): the cache
/// config, the query heads, the lengths (those of the last [`DecodePlan::update`]) and the
/// options with their tuning. Floats compare and hash by their bits. Equal keys on one context
/// give interchangeable plans ([`DecodePlanKey::new`] before planning, [`DecodePlan::key`]
/// after).
#[derive(Clone, Debug)]
pub struct DecodePlanKey {
    pub cfg: KvCacheConfig,
    pub heads_q: usize,
    pub seq_lens: Vec<usize>,
    pub options: DecodeOptions,
}

impl DecodePlanKey {
    /// The key of the plan `DecodePlan::new(ctx, cfg, heads_q, seq_lens, options)` makes.
    pub fn new(cfg: &KvCacheConfig, heads_q: usize, seq_lens: &[usize], options: &DecodeOptions) -> Self {
        DecodePlanKey {
            cfg: cfg.clone(),
            heads_q,
            seq_lens: seq_lens.to_vec(),
            options: *options,
        }
    }

    /// Every field, floats as bits: what `Eq` and `Hash` compare.
    #[allow(clippy::type_complexity)]
    fn parts(
        &self,
    ) -> (
        (usize, usize, usize, usize, DType, usize, u32),
        usize,
        &[usize],
        (usize, Option<u32>, Option<DType>, DecodeTuning),
    ) {
        let c = &self.cfg;
        let o = &self.options;
        (
            (
                c.num_pages,
                c.page_size,
                c.heads_kv,
                c.head_dim,
                c.dtype,
                c.num_layers,
                c.fp8_scale.to_bits(),
            ),
            self.heads_q,
            &self.seq_lens,
            (o.q_len, o.scale.map(f32::to_bits), o.query_dtype, o.tuning),
        )
    }
}

impl PartialEq for DecodePlanKey {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}
impl Eq for DecodePlanKey {}
impl std::hash::Hash for DecodePlanKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.parts().hash(state)
    }
}

/// A decode plan: kernels, work list and workspace for one batch composition.
pub struct DecodePlan {
    ctx: Context,
    cfg: KvCacheConfig,
    heads_q: usize,
    /// The lengths of `new` or of the last successful `update` (for [`DecodePlan::key`]).
    seq_lens: Vec<usize>,
    options: DecodeOptions,
    variant: DecodeVariant,
    row_groups: usize,
    scale: f32,
    kernel: Arc<Kernel>,
    ctas_per_sm: usize,
    /// False after a failed `update` (device work list possibly half written).
    valid: bool,
    /// Launch with programmatic dependent launch ([`dependent_launch_pays`] for the lengths).
    dependent_launch: bool,
    work: WorkList,
    item_seq: DeviceBuffer<i32>,
    item_indptr: DeviceBuffer<i32>,
    o_partial: DeviceBuffer<f32>,
    lse_partial: DeviceBuffer<f32>,
    /// `[B * Hkv * row groups]` arrival counters of split sequences (`unsigned int` on the
    /// device): zero between launches (the last chunk of each sequence re-arms its counter).
    chunk_counters: crate::runtime::WorkCounters,
}

impl std::fmt::Debug for DecodePlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl DecodePlan {
    /// Plans the decode of a batch with lengths `seq_lens` (tokens in the cache, the query
    /// tokens included) over a cache of config `cfg` with `heads_q` query heads.
    pub fn new(
        ctx: &Context,
        cfg: &KvCacheConfig,
        heads_q: usize,
        seq_lens: &[usize],
        options: &DecodeOptions,
    ) -> Result<DecodePlan> {
        let options = *options;
        let (dtype, scale) = validate_decode(cfg, heads_q, seq_lens, &options)?;
        let variant = DecodeVariant::for_problem(
            dtype,
            cfg,
            heads_q,
            options.q_len,
            options.tuning.layout,
            options.tuning.kernel,
            ctx.info().max_shared_per_block_optin,
        );
        let shape = variant.shape;
        let rows = heads_q / cfg.heads_kv * options.q_len;
        let row_groups = rows.div_ceil(variant.rows_per_cta() as usize); // <= 65535: validate_decode
        let smem = variant.shared_bytes();
        if smem > ctx.info().max_shared_per_block_optin {
            return Err(Error::Unsupported(format!(
                "decode tuning {shape:?} needs {smem} bytes of shared memory, the device allows {}",
                ctx.info().max_shared_per_block_optin
            )));
        }
        let kernel = ctx.kernel(&variant.spec())?;
        let ctas_per_sm = kernel.max_active_blocks_per_sm(ctx, variant.threads(), smem)?.max(1) as usize;
        let quantum = (shape.warps * shape.tile_keys) as usize;
        let slots = ctx.info().sm_count as usize * ctas_per_sm;
        let work = plan_work(
            seq_lens,
            options.tuning.chunk_tokens,
            quantum,
            cfg.heads_kv * row_groups,
            slots,
        )?;
        let (item_seq, item_indptr, o_partial, lse_partial) = Self::buffers(ctx, &work, cfg, rows)?;
        // zeroed once; every launch leaves the counters at zero (B is fixed for the plan's life)
        let chunk_counters = crate::runtime::WorkCounters::new(ctx, seq_lens.len() * cfg.heads_kv * row_groups)?;
        Ok(DecodePlan {
            ctx: ctx.clone(),
            cfg: cfg.clone(),
            heads_q,
            seq_lens: seq_lens.to_vec(),
            options,
            variant,
            row_groups,
            scale,
            kernel,
            ctas_per_sm,
            valid: true,
            dependent_launch: dependent_launch_pays(seq_lens, cfg),
            work,
            item_seq,
            item_indptr,
            o_partial,
            lse_partial,
            chunk_counters,
        })
    }

    #[allow(clippy::type_complexity)]
    fn buffers(
        ctx: &Context,
        work: &WorkList,
        cfg: &KvCacheConfig,
        rows: usize,
    ) -> Result<(
        DeviceBuffer<i32>,
        DeviceBuffer<i32>,
        DeviceBuffer<f32>,
        DeviceBuffer<f32>,
    )> {
        let partial_rows = if work.splits() {
            work.num_items() * cfg.heads_kv * rows
        } else {
            0
        };
        Ok((
            ctx.upload(&work.item_seq_and_chunk())?,
            ctx.upload(&work.item_indptr)?,
            ctx.alloc::<f32>(partial_rows * cfg.head_dim)?,
            ctx.alloc::<f32>(partial_rows)?,
        ))
    }

    /// Re-plans for new lengths of the same batch (same B): recomputes the work list and
    /// re-uploads it, reallocating the small buffers only when they must grow. Optional: a plan
    /// stays correct when lengths grow after planning (the last chunk of a sequence runs to its
    /// end), it only drifts from the best balance. A CUDA graph captured around `run` must be
    /// captured again after `update` (the work list, and possibly its buffers, changed). If an
    /// upload fails, the plan refuses to run until an `update` succeeds.
    pub fn update(&mut self, seq_lens: &[usize]) -> Result<()> {
        if seq_lens.len() != self.batch() {
            return Err(Error::invalid(
                "seq_lens",
                format!(
                    "has {} entries, the plan is for {} sequences",
                    seq_lens.len(),
                    self.batch()
                ),
            ));
        }
        let quantum = (self.variant.shape.warps * self.variant.shape.tile_keys) as usize;
        let slots = self.ctx.info().sm_count as usize * self.ctas_per_sm;
        let work = plan_work(
            seq_lens,
            self.options.tuning.chunk_tokens,
            quantum,
            self.cfg.heads_kv * self.row_groups,
            slots,
        )?;
        let rows = self.rows();
        let need_partial = if work.splits() {
            work.num_items() * self.cfg.heads_kv * rows
        } else {
            0
        };
        let packed = work.item_seq_and_chunk();
        self.valid = false;
        if packed.len() <= self.item_seq.len() && need_partial <= self.lse_partial.len() {
            self.item_seq.copy_from_host_at(0, &packed)?;
            self.item_indptr.copy_from_host_at(0, &work.item_indptr)?;
        } else {
            let (a, b, c, d) = Self::buffers(&self.ctx, &work, &self.cfg, rows)?;
            self.item_seq = a;
            self.item_indptr = b;
            self.o_partial = c;
            self.lse_partial = d;
        }
        // re-arm the arrival counters (stream-ordered): a launch that never completed, e.g. a
        // graph replayed with a stale work list, must not poison the launches after an update
        self.chunk_counters.zero()?;
        self.work = work;
        self.dependent_launch = dependent_launch_pays(seq_lens, &self.cfg);
        self.seq_lens.clear();
        self.seq_lens.extend_from_slice(seq_lens);
        self.valid = true;
        Ok(())
    }

    pub fn batch(&self) -> usize {
        self.work.item_indptr.len() - 1
    }
    /// What the plan was made from (see [`DecodePlanKey`]), with the lengths of the last
    /// successful `update`.
    pub fn key(&self) -> DecodePlanKey {
        DecodePlanKey::new(&self.cfg, self.heads_q, &self.seq_lens, &self.options)
    }
    fn rows(&self) -> usize {
        self.heads_q / self.cfg.heads_kv * self.options.q_len
    }
    pub fn work(&self) -> &WorkList {
        &self.work
    }
    pub fn variant(&self) -> &DecodeVariant {
        &self.variant
    }
    /// Workspace bytes (partials, arrival counters and the work list).
    pub fn workspace_bytes(&self) -> usize {
        self.o_partial.bytes()
            + self.lse_partial.bytes()
            + self.chunk_counters.bytes()
            + self.item_seq.bytes()
            + self.item_indptr.bytes()
    }
    /// One line: kernel, chunking, CTAs.
    pub fn describe(&self) -> String {
        let t = self.variant.shape;
        format!(
            "paged decode ({:?}) {} cache {} D={} page={} Hq={} Hkv={} q_len={}: {} items of <= {} tokens x {} KV heads x {} row groups, \
             {} warps x {} keys x {} stages, {} B smem, {} CTAs/SM{}",
            self.variant.layout,
            self.variant.dtype,
            self.cfg.dtype,
            self.cfg.head_dim,
            self.cfg.page_size,
            self.heads_q,
            self.cfg.heads_kv,
            self.options.q_len,
            self.work.num_items(),
            self.work.chunk_tokens,
            self.cfg.heads_kv,
            self.row_groups,
            t.warps,
            t.tile_keys,
            t.stages,
            self.variant.shared_bytes(),
            self.ctas_per_sm,
            if self.work.splits() { ", split-KV" } else { "" }
        )
    }

    /// Runs the decode of `layer`: `q` and `out` are `[B, q_len, Hq, D]` of the plan's query
    /// dtype (any strides with a contiguous last dim, 16-byte aligned rows); `lse`, when given,
    /// f32 `[B, q_len, Hq]` contiguous. `batch` holds the block tables and lengths (validated
    /// when it was updated). Allocates nothing; only kernel launches are queued. The plan's
    /// workspace (partials, arrival counters) belongs to one launch at a time: do not run one
    /// plan on two streams concurrently (one plan per stream instead).
    pub fn run(
        &self,
        q: &TensorView,
        cache: &PagedKvCache,
        layer: usize,
        batch: &PagedBatch,
        out: &mut TensorViewMut,
        lse: Option<&mut TensorViewMut>,
    ) -> Result<()> {
        if !self.valid {
            return Err(Error::invalid(
                "plan",
                "a previous update() failed; update the plan again before running it",
            ));
        }
        let c = cache.config();
        if (c.num_pages, c.page_size, c.heads_kv, c.head_dim, c.dtype)
            != (
                self.cfg.num_pages,
                self.cfg.page_size,
                self.cfg.heads_kv,
                self.cfg.head_dim,
                self.cfg.dtype,
            )
        {
            return Err(Error::invalid(
                "cache",
                format!(
                    "the plan was made for {:?}, the cache is {:?}",
                    self.cfg,
                    cache.config()
                ),
            ));
        }
        let layer_buf = cache.layer(layer)?;
        batch.check_config(&self.cfg)?;
        let b = self.batch();
        if batch.batch() != b {
            return Err(Error::invalid(
                "batch",
                format!("has {} sequences, the plan was made for {b}", batch.batch()),
            ));
        }
        let shape = [b, self.options.q_len, self.heads_q, self.cfg.head_dim];
        let dtype = self.variant.dtype;
        for (name, t) in [("q", *q), ("out", out.as_view())] {
            if t.shape() != shape || t.dtype() != dtype {
                return Err(Error::invalid(
                    name,
                    format!(
                        "must be {dtype} [B, q_len, Hq, D] = {shape:?}, got {} {:?}",
                        t.dtype(),
                        t.shape()
                    ),
                ));
            }
            let s = t.strides();
            if s[3] != 1 || s[..3].iter().any(|&x| x % 8 != 0) || t.device_ptr() % 16 != 0 {
                return Err(Error::invalid(
                    name,
                    format!(
                        "needs a contiguous last dim, 16-byte alignment and strides that are multiples of 8 elements, got strides {s:?}"
                    ),
                ));
            }
        }
        let lse_ptr = match lse {
            Some(l) => {
                let want = [b, self.options.q_len, self.heads_q];
                let contiguous = [self.options.q_len * self.heads_q, self.heads_q, 1];
                if l.shape() != want || l.dtype() != DType::F32 || l.strides() != contiguous {
                    return Err(Error::invalid(
                        "lse",
                        format!(
                            "must be contiguous f32 {want:?}, got {} {:?} strides {:?}",
                            l.dtype(),
                            l.shape(),
                            l.strides()
                        ),
                    ));
                }
                l.device_ptr()
            }
            None => 0,
        };
        let qs = q.strides();
        let os = [out.strides()[0], out.strides()[1], out.strides()[2]];
        let splits = self.work.splits();
        let params = DecodeParams {
            q: q.device_ptr(),
            o: out.device_ptr(),
            lse: lse_ptr,
            cache: layer_buf.device_ptr(),
            scales: if self.cfg.dtype == DType::F8E4M3 {
                cache.scales(layer)?.device_ptr()
            } else {
                0
            },
            tables: batch.tables(),
            item_seq: self.item_seq.device_ptr(),
            item_indptr: self.item_indptr.device_ptr(),
            o_partial: if splits { self.o_partial.device_ptr() } else { 0 },
            lse_partial: if splits { self.lse_partial.device_ptr() } else { 0 },
            chunk_counters: if splits { self.chunk_counters.ptr() } else { 0 },
            q_stride_b: qs[0] as i64,
            q_stride_n: qs[1] as i64,
            q_stride_h: qs[2] as i64,
            o_stride_b: os[0] as i64,
            o_stride_n: os[1] as i64,
            o_stride_h: os[2] as i64,
            batch: b as i32,
            heads_q: self.heads_q as i32,
            heads_kv: self.cfg.heads_kv as i32,
            group: (self.heads_q / self.cfg.heads_kv) as i32,
            q_len: self.options.q_len as i32,
            rows: self.rows() as i32,
            chunk_tokens: self.work.chunk_tokens.min(i32::MAX as usize) as i32,
            num_items: self.work.num_items() as i32,
            scale_log2: self.scale * std::f32::consts::LOG2_E,
            pad_: 0,
        };
        let cfg = LaunchConfig {
            grid: (
                self.cfg.heads_kv as u32,
                self.work.num_items() as u32,
                self.row_groups as u32,
            ),
            block: (self.variant.threads(), 1, 1),
            shared_bytes: self.variant.shared_bytes(),
            cluster_x: 1,
            // the kernel waits for the previous grid before its first global access
            dependent_launch: self.dependent_launch,
            cooperative: false,
        };
        // SAFETY: params mirror ts::DecodeParams. q/out have the plan's shape and dtype with
        // aligned strides (checked above); the layer, scales and tables belong to a cache and
        // batch validated against the plan's config (page ids < P, tables covering every
        // length); the work list and partial workspace were sized for this batch's items, the
        // arrival counters for its B x Hkv x row groups, all zero (each launch re-arms them).
        unsafe { self.kernel.launch(&self.ctx, cfg, &params) }?;
        Ok(())
    }
}

impl WorkList {
    /// item_seq and item_chunk packed for the kernel: `[items]` sequence ids, then `[items]`
    /// chunk indices.
    fn item_seq_and_chunk(&self) -> Vec<i32> {
        let mut v = self.item_seq.clone();
        v.extend_from_slice(&self.item_chunk);
        v
    }
}

/// Checks a decode request without a GPU: the cache config, `Hq % Hkv == 0`, `q_len` in
/// 1..=8, a forced tuning and layout, the query dtype against the cache dtype, the scale and
/// the lengths. Returns the query dtype and the effective scale.
pub fn validate_decode(
    cfg: &KvCacheConfig,
    heads_q: usize,
    seq_lens: &[usize],
    options: &DecodeOptions,
) -> Result<(DType, f32)> {
    cfg.validate()?;
    if seq_lens.len() > MAX_ITEMS {
        return Err(Error::invalid(
            "seq_lens",
            format!(
                "a decode batch holds at most {MAX_ITEMS} sequences, got {}",
                seq_lens.len()
            ),
        ));
    }
    if heads_q > 65536 || heads_q / cfg.heads_kv.max(1) * options.q_len.max(1) > 16 * 65535 {
        return Err(Error::invalid(
            "heads_q",
            format!("{heads_q} query heads exceed the supported 65536 (and 16 * 65535 query rows per KV head)"),
        ));
    }
    if heads_q == 0 || heads_q % cfg.heads_kv != 0 {
        return Err(Error::invalid(
            "heads_q",
            format!(
                "must be a positive multiple of heads_kv = {} (Hq % Hkv == 0), got {heads_q}",
                cfg.heads_kv
            ),
        ));
    }
    if !(1..=MAX_Q_LEN).contains(&options.q_len) {
        return Err(Error::invalid(
            "q_len",
            format!(
                "query tokens per sequence must be in 1..={MAX_Q_LEN}, got {}",
                options.q_len
            ),
        ));
    }
    // a forced tuning: tile sizes and page sizes are both powers of two, so a tile always
    // covers whole pages or lies inside one
    if let Some(t) = options.tuning.kernel {
        t.validate()?;
    }
    let rows = heads_q / cfg.heads_kv * options.q_len;
    if options.tuning.layout == Some(DecodeLayout::KeyRows) && rows.div_ceil(8) > 65_535 {
        return Err(Error::invalid(
            "layout",
            format!(
                "KeyRows takes one CTA per 8 query rows; {rows} rows per KV head exceed the grid's 65535 (use QueryRows)"
            ),
        ));
    }
    let dtype = match (cfg.dtype, options.query_dtype) {
        (DType::F8E4M3, None) => DType::F16,
        (DType::F8E4M3, Some(d @ (DType::F16 | DType::BF16))) => d,
        (DType::F8E4M3, Some(d)) => {
            return Err(Error::invalid(
                "query_dtype",
                format!("{d}: queries over an fp8 cache are fp16 or bf16"),
            ))
        }
        (c, None) => c,
        (c, Some(d)) if d == c => c,
        (c, Some(d)) => {
            return Err(Error::invalid(
                "query_dtype",
                format!("{d} does not match the {c} cache (an fp16/bf16 cache takes queries of its own dtype)"),
            ))
        }
    };
    let scale = options.scale.unwrap_or(1.0 / (cfg.head_dim as f32).sqrt());
    if !(scale.is_finite() && scale > 0.0) {
        return Err(Error::invalid("scale", format!("must be finite and > 0, got {scale}")));
    }
    if seq_lens.is_empty() {
        return Err(Error::invalid("seq_lens", "the batch must have at least one sequence"));
    }
    for (b, &l) in seq_lens.iter().enumerate() {
        if l > i32::MAX as usize - 64 {
            return Err(Error::invalid(
                "seq_lens",
                format!("sequence {b}: {l} tokens exceed the 32-bit limit"),
            ));
        }
    }
    Ok((dtype, scale))
}

/// The default tuning for a variant: the first of these that fits `limit` bytes of shared
/// memory (measured on the H200: this folder's NOTES.md):
/// - `KeyRows`, fp8 cache: 4 warps x 64 keys x 2 stages (129 KB), else 4 x 32 x 2, 4 x 16 x 2;
/// - `KeyRows`, fp16/bf16 cache: 8 x 16 x 2 (128 KB at D = 128), else 8 x 16 x 3, 4 x 16 x 3,
///   4 x 16 x 2;
/// - `QueryRows`, fp8 cache: 4 x 16 x 2 (68 KB: 3 CTAs per SM hide the dequantisation);
/// - `QueryRows`, fp16/bf16 cache: 8 x 16 x 2, else 4 x 16 x 3, else 4 x 16 x 2.
pub fn default_kernel_shape(v: &DecodeVariant, limit: u32) -> DecodeKernelShape {
    let fp8 = v.cache == DType::F8E4M3;
    let candidates: &[(u32, u32, u32)] = match v.layout {
        DecodeLayout::QueryRows if fp8 => &[(4, 16, 2)],
        DecodeLayout::QueryRows => &[(8, 16, 2), (4, 16, 3), (4, 16, 2)],
        DecodeLayout::KeyRows if fp8 => &[(4, 64, 2), (4, 32, 2), (4, 16, 2)],
        DecodeLayout::KeyRows => &[(8, 16, 2), (8, 16, 3), (4, 16, 3), (4, 16, 2)],
    };
    let mut v = *v;
    for &(warps, tile_keys, stages) in candidates {
        v.shape = DecodeKernelShape {
            warps,
            tile_keys,
            stages,
        };
        if v.shared_bytes() <= limit {
            return v.shape;
        }
    }
    v.shape
}

/// The kernel's `__launch_bounds__` minimum of CTAs per SM, so ptxas keeps the registers within
/// what they can share:
/// - `KeyRows`: as many CTAs as shared memory admits (at most 4), while each thread keeps at
///   least 128 registers (D <= 128) or 168 (D = 256);
/// - `QueryRows`: 3 for the fp8 variants with one row block, D <= 128 and one page per tile
///   (68 KB of shared memory: three fit an SM; the dequantisation needs the extra warps), else
///   1 (shared memory limits those to one or two CTAs anyway, and more would spill).
pub fn min_ctas_per_sm(v: &DecodeVariant) -> u32 {
    let one_page_per_tile = v.page_size >= v.shape.tile_keys;
    if v.layout == DecodeLayout::KeyRows {
        let by_smem = 233_472 / (v.shared_bytes() + 1024);
        let regs = if v.head_dim <= 128 { 128 } else { 168 };
        let by_regs = 65_536 / (v.threads() * regs);
        by_smem.min(by_regs).clamp(1, 4)
    } else if v.cache == DType::F8E4M3 && v.m_blocks == 1 && v.head_dim <= 128 && one_page_per_tile {
        (233_472 / (v.shared_bytes() + 1024)).clamp(1, 3)
    } else {
        1
    }
}

fn plan_work(
    lens: &[usize],
    forced: Option<usize>,
    quantum: usize,
    ctas_per_item: usize,
    slots: usize,
) -> Result<WorkList> {
    let chunk = match forced {
        Some(usize::MAX) => lens.iter().copied().max().unwrap_or(0).max(1).div_ceil(quantum) * quantum,
        Some(c) if c == 0 || c % 64 != 0 => {
            return Err(Error::invalid(
                "chunk_tokens",
                format!("must be a positive multiple of 64 (or usize::MAX for no split), got {c}"),
            ))
        }
        Some(c) => {
            let max_len = lens.iter().copied().max().unwrap_or(0).max(1);
            // a chunk at least as long as every sequence is "no split"
            c.min(max_len).div_ceil(quantum) * quantum
        }
        None => choose_chunk(lens, quantum, ctas_per_item, slots),
    };
    let work = WorkList::new(lens, chunk);
    if work.num_items() > MAX_ITEMS {
        return Err(Error::invalid(
            "chunk_tokens",
            format!(
                "{} work items exceed the limit of {MAX_ITEMS}; use longer chunks",
                work.num_items()
            ),
        ));
    }
    Ok(work)
}

/// Opt-in shared memory per block of H100/H200 (the tuning the CI variants and the device bundle
/// are compiled with).
pub const HOPPER_SHARED_LIMIT: u32 = 232_448;

/// Decode variants for the CI compile checks (default tuning for Hopper): every dtype pair x head dim x
/// layout (and row blocks) at page size 16, and every page size for fp16 and fp8 at D = 128 in both
/// layouts.
pub fn ci_variants() -> Vec<DecodeVariant> {
    use DecodeLayout::{KeyRows, QueryRows};
    let mut v = Vec::new();
    let variant = |dtype, cache, head_dim, page_size, layout, m_blocks| {
        let mut v = DecodeVariant {
            dtype,
            cache,
            head_dim,
            page_size,
            layout,
            m_blocks,
            shape: DecodeKernelShape::default(),
        };
        v.shape = default_kernel_shape(&v, HOPPER_SHARED_LIMIT);
        v
    };
    for (dtype, cache) in [
        (DType::F16, DType::F16),
        (DType::BF16, DType::BF16),
        (DType::F16, DType::F8E4M3),
        (DType::BF16, DType::F8E4M3),
    ] {
        for head_dim in [64u32, 128, 256] {
            v.push(variant(dtype, cache, head_dim, 16, KeyRows, 1));
            v.push(variant(dtype, cache, head_dim, 16, QueryRows, 1));
            if head_dim <= 128 {
                v.push(variant(dtype, cache, head_dim, 16, QueryRows, 2));
            }
        }
    }
    // the page size only changes address arithmetic: every size for one dtype / head dim
    for page_size in [8u32, 32, 64, 128, 256] {
        for layout in [KeyRows, QueryRows] {
            v.push(variant(DType::F16, DType::F16, 128, page_size, layout, 1));
            v.push(variant(DType::F16, DType::F8E4M3, 128, page_size, layout, 1));
        }
    }
    v
}
