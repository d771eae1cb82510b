//! Paged KV cache: host block manager, device page storage, fused append, paged GQA decode.
//!
//! The pieces of an LLM server's attention memory:
//! - [`block_manager::BlockManager`] (host, no GPU): a pool of `P` pages of `T` tokens, one block
//!   table per sequence, reference counts, fork, prefix sharing by chained page hashes,
//!   copy-on-write and LRU eviction of cached pages.
//! - [`PagedKvCache`]: per layer `[P][2][T][Hkv][D]` device storage (K and V of a page adjacent,
//!   FlashInfer's "NHD"), fp16 / bf16, or fp8 e4m3 with one f32 scale per (page, KV head, K|V).
//! - [`PagedBatch`]: the block tables (CSR: `indptr`, `indices`) and lengths of a batch in
//!   device buffers of fixed capacity, validated on the host and updated in place each step.
//! - [`PagedKvCache::append`]: one launch writes the new K and V rows of a whole batch (decode
//!   steps and chunked prefill alike), quantising for an fp8 cache.
//! - [`decode::DecodePlan`]: paged GQA decode for 1..=8 query tokens per sequence (speculative
//!   decoding) with split-KV: plan once per batch composition, run once per layer; the run
//!   allocates nothing and is CUDA-graph capturable.
//!
//! Token `t` of a sequence lives in page `table[t / T]` at offset `t % T`.
//!
//! ```no_run
//! # fn main() -> tessera::Result<()> {
//! use half::f16;
//! use tessera::kvcache::{decode::{DecodeOptions, DecodePlan}, AppendBatch, KvCacheConfig, PagedBatch, PagedKvCache};
//! use tessera::runtime::Context;
//! let ctx = Context::new(0)?;
//! let cfg = KvCacheConfig { num_pages: 1024, heads_kv: 8, head_dim: 128, ..Default::default() };
//! let mut cache = PagedKvCache::new(&ctx, cfg.clone())?;
//! // two sequences of 20 and 3 tokens: pages [5, 9] and [2]
//! let mut batch = PagedBatch::new(&ctx, 2, 16)?;
//! batch.update(&cfg, &[&[5, 9], &[2]], &[20, 3])?;
//! // write their K/V rows (20 + 3 rows of [Hkv, D])
//! let rows = ctx.upload(&vec![f16::from_f32(0.5); 23 * 8 * 128])?;
//! let kv = rows.view(&[23, 8, 128], &[8 * 128, 128, 1])?;
//! let appended = AppendBatch::new(&ctx, &[20, 3])?;
//! cache.append(0, &kv, &kv, &batch, &appended)?;
//! // decode one token per sequence with 32 query heads
//! let plan = DecodePlan::new(&ctx, &cfg, 32, batch.seq_lens(), &DecodeOptions::default())?;
//! let q = ctx.upload(&vec![f16::from_f32(0.1); 2 * 32 * 128])?;
//! let mut o = ctx.alloc::<f16>(2 * 32 * 128)?;
//! let shape = [2, 1, 32, 128];
//! let strides = [32 * 128, 32 * 128, 128, 1];
//! plan.run(&q.view(&shape, &strides)?, &cache, 0, &batch, &mut o.view_mut(&shape, &strides)?, None)?;
//! # Ok(()) }
//! ```

#[cfg(feature = "harness")]
pub mod bench;
pub mod block_manager;
pub mod decode;
#[cfg(feature = "harness")]
mod operator;
#[cfg(feature = "harness")]
pub mod reference;
#[cfg(feature = "harness")]
pub mod verify;

#[cfg(test)]
mod block_manager_tests;
#[cfg(test)]
mod compile_tests;
#[cfg(test)]
mod tests;

use std::sync::{Arc, OnceLock};

use cudarc::driver::sys;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::runtime::context::check;
use crate::runtime::jit::KernelSpec;
use crate::runtime::launch::{Kernel, KernelParams, LaunchConfig};
use crate::runtime::KernelKey;
use crate::runtime::{Context, DeviceBuffer, TensorView};

pub use block_manager::PageCopy;
#[cfg(feature = "harness")]
pub use operator::OPERATOR;

/// Device source of the shared parameter header (`tessera/kvcache_params.cuh`).
pub const PARAMS_HEADER: &str = include_str!("kvcache_params.cuh");

/// The paged KV cache kernels' own device headers, handed to NVRTC beside the shared library.
/// `paged_decode_common.cuh` reads its kernel's preamble constants, so it compiles only there.
pub const DEVICE_HEADERS: &[(&str, &str)] = &[
    ("tessera/kvcache_params.cuh", PARAMS_HEADER),
    (
        "tessera/paged_decode_common.cuh",
        include_str!("paged_decode_common.cuh"),
    ),
];
const APPEND_SOURCE: &str = include_str!("append.cu");

/// Largest fp8 scale (the largest finite fp16: the decode rescales probabilities by ratios of
/// V scales in fp16/bf16). Scales must also be normal f32 values (>= `f32::MIN_POSITIVE`): the
/// decode takes a fast reciprocal of the first V scale a warp sees, which flushes subnormals.
/// The V scales of one sequence's pages (per KV head) should stay within a factor of 2^15 of
/// each other: the decode accumulates O in units of the first and multiplies probabilities by
/// the ratio in fp16/bf16, which overflows beyond.
pub const MAX_FP8_SCALE: f32 = 65504.0;

/// True for a valid fp8 scale: normal, positive, at most [`MAX_FP8_SCALE`].
fn valid_fp8_scale(s: f32) -> bool {
    (f32::MIN_POSITIVE..=MAX_FP8_SCALE).contains(&s)
}

/// Head dimensions the decode kernels are compiled for.
pub const HEAD_DIMS: [usize; 3] = [64, 128, 256];

/// Shape and dtype of a paged KV cache.
#[derive(Clone, Debug, PartialEq)]
pub struct KvCacheConfig {
    /// Pages in the pool (`P`), the same for every layer. Required (> 0).
    pub num_pages: usize,
    /// Tokens per page (`T`): a power of two from 8 to 256. Default 16.
    pub page_size: usize,
    /// KV heads (`Hkv`). Required (> 0).
    pub heads_kv: usize,
    /// Head dimension (`D`): 64, 128 or 256. Default 128.
    pub head_dim: usize,
    /// Storage dtype: F16 (default), BF16 or F8E4M3 (then queries and outputs are fp16 or bf16
    /// and every (page, KV head) has a K and a V scale).
    pub dtype: DType,
    /// Layers (each its own `[P][2][T][Hkv][D]` allocation sharing the block tables). Default 1.
    pub num_layers: usize,
    /// fp8 only: the scale every page starts with (stored = round(x / scale)); per-page scales
    /// can be set with [`PagedKvCache::set_scales`]. Default 1.0.
    pub fp8_scale: f32,
}

impl Default for KvCacheConfig {
    fn default() -> Self {
        KvCacheConfig {
            num_pages: 0,
            page_size: 16,
            heads_kv: 0,
            head_dim: 128,
            dtype: DType::F16,
            num_layers: 1,
            fp8_scale: 1.0,
        }
    }
}

impl KvCacheConfig {
    /// Checks every field; the errors name the field and the supported values.
    pub fn validate(&self) -> Result<()> {
        if self.num_pages == 0 || self.num_pages > i32::MAX as usize {
            return Err(Error::invalid(
                "num_pages",
                format!("must be in 1..={}, got {}", i32::MAX, self.num_pages),
            ));
        }
        if !(8..=256).contains(&self.page_size) || !self.page_size.is_power_of_two() {
            return Err(Error::invalid(
                "page_size",
                format!("must be a power of two from 8 to 256, got {}", self.page_size),
            ));
        }
        if self.heads_kv == 0 || self.heads_kv > 1024 {
            return Err(Error::invalid(
                "heads_kv",
                format!("must be in 1..=1024, got {}", self.heads_kv),
            ));
        }
        if !HEAD_DIMS.contains(&self.head_dim) {
            return Err(Error::Unsupported(format!(
                "paged KV cache head_dim {}: supported head dims are {HEAD_DIMS:?}",
                self.head_dim
            )));
        }
        if !matches!(self.dtype, DType::F16 | DType::BF16 | DType::F8E4M3) {
            return Err(Error::Unsupported(format!(
                "KV cache dtype {}: supported are fp16, bf16 and fp8e4m3",
                self.dtype
            )));
        }
        if self.num_layers == 0 {
            return Err(Error::invalid("num_layers", "must be at least 1"));
        }
        if !valid_fp8_scale(self.fp8_scale) {
            return Err(Error::invalid(
                "fp8_scale",
                format!(
                    "must be in (0, {MAX_FP8_SCALE}] and a normal f32 (>= {:e}), got {}",
                    f32::MIN_POSITIVE,
                    self.fp8_scale
                ),
            ));
        }
        // 64-bit offsets inside the kernels; the driver must still be able to allocate a layer
        self.layer_bytes()
            .ok_or_else(|| Error::invalid("num_pages", "the layer size overflows usize"))?;
        Ok(())
    }
    /// Bytes of one cache element.
    pub fn element_bytes(&self) -> usize {
        self.dtype.size()
    }
    /// Elements of one token row of one page half: `Hkv * D`.
    pub fn token_elems(&self) -> usize {
        self.heads_kv * self.head_dim
    }
    /// Elements of one page (K and V): `2 * T * Hkv * D`.
    pub fn page_elems(&self) -> usize {
        2 * self.page_size * self.token_elems()
    }
    /// Bytes of one layer's page storage.
    pub fn layer_bytes(&self) -> Option<usize> {
        self.num_pages
            .checked_mul(self.page_elems())?
            .checked_mul(self.element_bytes())
    }
    /// Pages needed to hold `len` tokens.
    pub fn pages_for(&self, len: usize) -> usize {
        len.div_ceil(self.page_size)
    }
}

/// Device page storage of every layer.
pub struct PagedKvCache {
    ctx: Context,
    cfg: KvCacheConfig,
    layers: Vec<DeviceBuffer<u8>>,
    /// fp8 only: `[P][Hkv][2]` f32 per layer.
    scales: Vec<DeviceBuffer<f32>>,
    /// The append kernel per input dtype (fp16, bf16), loaded on first use.
    append_kernels: [OnceLock<Arc<Kernel>>; 2],
}

impl std::fmt::Debug for PagedKvCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PagedKvCache").field("config", &self.cfg).finish()
    }
}

impl PagedKvCache {
    /// Allocates the pages of every layer (contents unspecified until written; fp8 scales set to
    /// `cfg.fp8_scale`).
    pub fn new(ctx: &Context, cfg: KvCacheConfig) -> Result<PagedKvCache> {
        cfg.validate()?;
        let bytes = cfg.layer_bytes().unwrap_or(0);
        let mut layers = Vec::with_capacity(cfg.num_layers);
        let mut scales = Vec::new();
        for _ in 0..cfg.num_layers {
            layers.push(ctx.alloc::<u8>(bytes)?);
            if cfg.dtype == DType::F8E4M3 {
                scales.push(ctx.upload(&vec![cfg.fp8_scale; cfg.num_pages * cfg.heads_kv * 2])?);
            }
        }
        Ok(PagedKvCache {
            ctx: ctx.clone(),
            cfg,
            layers,
            scales,
            append_kernels: [OnceLock::new(), OnceLock::new()],
        })
    }
    pub fn config(&self) -> &KvCacheConfig {
        &self.cfg
    }
    pub fn context(&self) -> &Context {
        &self.ctx
    }
    /// Queues this cache's later launches and copies ([`append`](Self::append),
    /// [`copy_pages`](Self::copy_pages)) on `ctx`'s stream: a context of the same device
    /// ([`Context::with_stream`] of the one the cache was made with), checked. The pages are
    /// still freed, and [`set_scales`](Self::set_scales) still copies (synchronously), on the
    /// stream they were allocated on. Nothing is ordered here: the caller
    /// orders the new stream after the old one when work on the old one may still touch the cache
    /// ([`Context::wait_for`]).
    pub fn set_context(&mut self, ctx: &Context) -> Result<()> {
        if !self.ctx.same_device(ctx) {
            return Err(Error::invalid("ctx", "is a context of another device than the cache's"));
        }
        self.ctx = ctx.clone();
        Ok(())
    }
    fn check_layer(&self, layer: usize) -> Result<()> {
        if layer >= self.cfg.num_layers {
            return Err(Error::invalid(
                "layer",
                format!("{layer} is out of range: the cache has {} layers", self.cfg.num_layers),
            ));
        }
        Ok(())
    }
    /// The raw pages of `layer` (`[P][2][T][Hkv][D]` elements of the cache dtype).
    pub fn layer(&self, layer: usize) -> Result<&DeviceBuffer<u8>> {
        self.check_layer(layer)?;
        Ok(&self.layers[layer])
    }
    /// Mutable raw pages of `layer` (tests and loaders write whole pages this way).
    pub fn layer_mut(&mut self, layer: usize) -> Result<&mut DeviceBuffer<u8>> {
        self.check_layer(layer)?;
        Ok(&mut self.layers[layer])
    }
    /// fp8 only: the `[P][Hkv][2]` scales of `layer`.
    pub fn scales(&self, layer: usize) -> Result<&DeviceBuffer<f32>> {
        self.check_layer(layer)?;
        self.scales
            .get(layer)
            .ok_or_else(|| Error::invalid("scales", format!("a {} cache has no scales", self.cfg.dtype)))
    }
    /// fp8 only: sets every `[P][Hkv][2]` scale of `layer` (normal, > 0, at most
    /// [`MAX_FP8_SCALE`]; see there for the range the V scales of one sequence should keep).
    /// Pages written before keep their stored bytes: set a page's scale before appending into it.
    pub fn set_scales(&mut self, layer: usize, scales: &[f32]) -> Result<()> {
        self.check_layer(layer)?;
        let want = self.cfg.num_pages * self.cfg.heads_kv * 2;
        if self.scales.is_empty() {
            return Err(Error::invalid(
                "scales",
                format!("only an fp8 cache has scales, this one is {}", self.cfg.dtype),
            ));
        }
        if scales.len() != want {
            return Err(Error::invalid(
                "scales",
                format!("must have P * Hkv * 2 = {want} entries, got {}", scales.len()),
            ));
        }
        if let Some(i) = scales.iter().position(|s| !valid_fp8_scale(*s)) {
            return Err(Error::invalid(
                "scales",
                format!(
                    "scale {i} is {}: scales must be in (0, {MAX_FP8_SCALE}] and normal f32 values (>= {:e})",
                    scales[i],
                    f32::MIN_POSITIVE
                ),
            ));
        }
        self.scales[layer].copy_from_host(scales)
    }

    /// Copies whole pages (K, V and fp8 scales) of every layer, in order: the copy-on-write
    /// copies the block manager returns, issued on the stream before the next append.
    pub fn copy_pages(&mut self, copies: &[PageCopy]) -> Result<()> {
        let p = self.cfg.num_pages;
        for c in copies {
            if c.src as usize >= p || c.dst as usize >= p || c.src == c.dst {
                return Err(Error::invalid(
                    "copies",
                    format!(
                        "page copy {} -> {} is invalid: ids must be distinct and < {p}",
                        c.src, c.dst
                    ),
                ));
            }
        }
        self.ctx.bind()?;
        let page_bytes = self.cfg.page_elems() * self.cfg.element_bytes();
        let scale_bytes = self.cfg.heads_kv * 2 * 4;
        for l in 0..self.cfg.num_layers {
            for c in copies {
                let base = self.layers[l].device_ptr();
                // SAFETY: both page ranges lie inside the layer allocation (ids checked above).
                check("cuMemcpyDtoDAsync", unsafe {
                    sys::cuMemcpyDtoDAsync_v2(
                        base + (c.dst as usize * page_bytes) as u64,
                        base + (c.src as usize * page_bytes) as u64,
                        page_bytes,
                        self.ctx.cu_stream(),
                    )
                })?;
                if let Some(s) = self.scales.get(l) {
                    let base = s.device_ptr();
                    // SAFETY: as above, inside the [P][Hkv][2] scale buffer.
                    check("cuMemcpyDtoDAsync", unsafe {
                        sys::cuMemcpyDtoDAsync_v2(
                            base + (c.dst as usize * scale_bytes) as u64,
                            base + (c.src as usize * scale_bytes) as u64,
                            scale_bytes,
                            self.ctx.cu_stream(),
                        )
                    })?;
                }
            }
        }
        Ok(())
    }

    /// Writes the new K and V rows of a batch into `layer` in one launch.
    ///
    /// `k` and `v` are `[N, Hkv, D]` (fp16 or bf16: the cache dtype, or either for an fp8 cache;
    /// any row and head strides, last dim contiguous), packed by sequence as `appended` says;
    /// `batch` holds the block tables and the lengths *after* the append (so the new rows of
    /// sequence `b` go to positions `len_b - n_b .. len_b`). The pages written must belong to
    /// their sequence alone: issue the block manager's copy-on-write copies
    /// ([`copy_pages`](Self::copy_pages)) first; two sequences writing one page race.
    pub fn append(
        &mut self,
        layer: usize,
        k: &TensorView,
        v: &TensorView,
        batch: &PagedBatch,
        appended: &AppendBatch,
    ) -> Result<()> {
        self.check_layer(layer)?;
        let cfg = &self.cfg;
        batch.check_config(cfg)?;
        if appended.batch() != batch.batch() {
            return Err(Error::invalid(
                "appended",
                format!(
                    "describes {} sequences but the batch has {}",
                    appended.batch(),
                    batch.batch()
                ),
            ));
        }
        for (b, (&n, &len)) in appended.counts().iter().zip(batch.seq_lens()).enumerate() {
            if n > len {
                return Err(Error::invalid(
                    "appended",
                    format!("sequence {b} appends {n} rows but its length is {len} (lengths count the new rows)"),
                ));
            }
        }
        let n = appended.tokens();
        let in_dtype = k.dtype();
        let want_in_ok = match cfg.dtype {
            DType::F8E4M3 => matches!(in_dtype, DType::F16 | DType::BF16),
            d => in_dtype == d,
        };
        if !want_in_ok {
            return Err(Error::invalid(
                "k",
                format!(
                    "dtype {} cannot be stored in a {} cache (fp16/bf16 caches take their own dtype, fp8 takes fp16 or bf16)",
                    in_dtype, cfg.dtype
                ),
            ));
        }
        let shape = [n, cfg.heads_kv, cfg.head_dim];
        for (name, t) in [("k", k), ("v", v)] {
            if t.shape() != shape || t.dtype() != in_dtype {
                return Err(Error::invalid(
                    name,
                    format!(
                        "must be {in_dtype} [N, Hkv, D] = {shape:?}, got {} {:?}",
                        t.dtype(),
                        t.shape()
                    ),
                ));
            }
            if t.strides()[2] != 1 {
                return Err(Error::invalid(name, "its last dimension must be contiguous"));
            }
        }
        if n == 0 {
            return Ok(());
        }
        let vector_ok = [k, v]
            .iter()
            .all(|t| t.device_ptr() % 16 == 0 && t.strides()[0] % 8 == 0 && t.strides()[1] % 8 == 0)
            && cfg.head_dim % 8 == 0;
        let params = AppendParams {
            k: k.device_ptr(),
            v: v.device_ptr(),
            cache: self.layers[layer].device_ptr(),
            scales: self.scales.get(layer).map_or(0, |s| s.device_ptr()),
            tables: batch.tables(),
            append_indptr: appended.indptr.device_ptr(),
            k_stride_n: k.strides()[0] as i64,
            k_stride_h: k.strides()[1] as i64,
            v_stride_n: v.strides()[0] as i64,
            v_stride_h: v.strides()[1] as i64,
            batch: batch.batch() as i32,
            tokens: n as i32,
            heads_kv: cfg.heads_kv as i32,
            head_dim: cfg.head_dim as i32,
            page_size: cfg.page_size as i32,
            vector_ok: vector_ok as i32,
        };
        let variant = AppendVariant {
            input: in_dtype,
            cache: cfg.dtype,
        };
        let slot = &self.append_kernels[(in_dtype == DType::BF16) as usize];
        let kernel = match slot.get() {
            Some(k) => k.clone(),
            None => {
                let k = self.ctx.kernel(&variant.spec())?;
                slot.get_or_init(|| k).clone()
            }
        };
        let per_row = if vector_ok { cfg.head_dim / 8 } else { cfg.head_dim };
        let units = n * 2 * cfg.heads_kv * per_row;
        let grid = units.div_ceil(AppendVariant::THREADS as usize);
        if grid > i32::MAX as usize {
            return Err(Error::invalid("k", format!("{n} rows are too many for one append")));
        }
        // SAFETY: params mirror ts::AppendParams; every pointer is a live device allocation of
        // the validated size: k/v views (shape checked), the layer and scales of this cache, and
        // the batch's tables whose page ids, lengths and table sizes PagedBatch::update checked
        // against this config (positions len - n_b .. len stay inside each table).
        unsafe {
            kernel.launch(
                &self.ctx,
                LaunchConfig::linear(grid as u32, AppendVariant::THREADS, 0).with_dependent_launch(),
                &params,
            )
        }
    }
}

/// Block tables and lengths of a batch in device buffers of fixed capacity, updated in place.
///
/// The host mirror is validated on every update (page ids in range, tables long enough for the
/// lengths), so a kernel never reads a page out of range; a failed update changes nothing.
/// Updates are queued on the stream of the context the batch was made with: use the same
/// context for the cache, the plan and the batch (or synchronise), so an update never
/// overwrites tables a kernel on another stream is still reading.
pub struct PagedBatch {
    capacity_batch: usize,
    capacity_pages: usize,
    batch: usize,
    /// The config the tables were validated against: (num_pages, page_size).
    validated_for: (usize, usize),
    indptr_host: Vec<i32>,
    indices_host: Vec<i32>,
    lens_host: Vec<usize>,
    indptr: DeviceBuffer<i32>,
    indices: DeviceBuffer<i32>,
    lens: DeviceBuffer<i32>,
}

impl std::fmt::Debug for PagedBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PagedBatch")
            .field("batch", &self.batch)
            .field("seq_lens", &self.lens_host)
            .finish()
    }
}

impl PagedBatch {
    /// Device buffers for up to `max_batch` sequences holding `max_pages` table entries in all.
    pub fn new(ctx: &Context, max_batch: usize, max_pages: usize) -> Result<PagedBatch> {
        if max_batch == 0 || max_batch > i32::MAX as usize / 2 {
            return Err(Error::invalid("max_batch", format!("must be in 1..={}", i32::MAX / 2)));
        }
        if max_pages > i32::MAX as usize {
            return Err(Error::invalid("max_pages", format!("must be <= {}", i32::MAX)));
        }
        Ok(PagedBatch {
            capacity_batch: max_batch,
            capacity_pages: max_pages,
            batch: 0,
            validated_for: (0, 0),
            indptr_host: vec![0],
            indices_host: Vec::new(),
            lens_host: Vec::new(),
            indptr: ctx.upload(&vec![0i32; max_batch + 1])?,
            indices: ctx.upload(&vec![0i32; max_pages.max(1)])?,
            lens: ctx.upload(&vec![0i32; max_batch])?,
        })
    }

    /// Sets the batch from one block table per sequence (`tables[b][i]` = physical page of the
    /// sequence's i-th page) and the lengths. Tables may be longer than the lengths need.
    pub fn update(&mut self, cfg: &KvCacheConfig, tables: &[&[u32]], seq_lens: &[usize]) -> Result<()> {
        let mut indptr = Vec::with_capacity(tables.len() + 1);
        indptr.push(0i32);
        let total: usize = tables.iter().map(|t| t.len()).sum();
        if total > self.capacity_pages {
            return Err(Error::invalid(
                "tables",
                format!(
                    "{total} pages in all exceed the batch capacity of {}",
                    self.capacity_pages
                ),
            ));
        }
        if let Some((b, i, &p)) = tables.iter().enumerate().find_map(|(b, t)| {
            t.iter()
                .enumerate()
                .find(|(_, &p)| p > i32::MAX as u32)
                .map(|(i, p)| (b, i, p))
        }) {
            return Err(Error::invalid(
                "tables",
                format!(
                    "sequence {b}, page {i}: physical page {p} is out of range (the cache has {} pages)",
                    cfg.num_pages
                ),
            ));
        }
        let mut indices = Vec::with_capacity(total);
        for t in tables {
            indices.extend(t.iter().map(|&p| p as i32));
            indptr.push(indices.len() as i32);
        }
        self.update_csr(cfg, &indptr, &indices, seq_lens)
    }

    /// As [`update`](Self::update) from FlashInfer-style CSR tables: sequence `b` owns
    /// `indices[indptr[b] .. indptr[b + 1]]`.
    pub fn update_csr(
        &mut self,
        cfg: &KvCacheConfig,
        indptr: &[i32],
        indices: &[i32],
        seq_lens: &[usize],
    ) -> Result<()> {
        check_tables(cfg, indptr, indices, seq_lens, self.capacity_batch, self.capacity_pages)?;
        let b = seq_lens.len();
        // validated: upload (in place, no allocation), then commit the host mirror
        let lens32: Vec<i32> = seq_lens.iter().map(|&l| l as i32).collect();
        self.indptr.copy_from_host_at(0, indptr)?;
        self.indices.copy_from_host_at(0, indices)?;
        self.lens.copy_from_host_at(0, &lens32)?;
        self.batch = b;
        self.validated_for = (cfg.num_pages, cfg.page_size);
        self.indptr_host = indptr.to_vec();
        self.indices_host = indices.to_vec();
        self.lens_host = seq_lens.to_vec();
        Ok(())
    }

    /// Sequences in the batch.
    pub fn batch(&self) -> usize {
        self.batch
    }
    /// Lengths (tokens in the cache) per sequence.
    pub fn seq_lens(&self) -> &[usize] {
        &self.lens_host
    }
    /// The host copy of sequence `b`'s block table.
    /// `None` when `b` is not a sequence of the batch.
    pub fn table(&self, b: usize) -> Option<&[i32]> {
        (b < self.batch).then(|| &self.indices_host[self.indptr_host[b] as usize..self.indptr_host[b + 1] as usize])
    }
    fn check_config(&self, cfg: &KvCacheConfig) -> Result<()> {
        if self.batch == 0 {
            return Err(Error::invalid("batch", "is empty: call update() first"));
        }
        if self.validated_for != (cfg.num_pages, cfg.page_size) {
            return Err(Error::invalid(
                "batch",
                format!(
                    "was validated for {} pages of {} tokens, the cache has {} of {}",
                    self.validated_for.0, self.validated_for.1, cfg.num_pages, cfg.page_size
                ),
            ));
        }
        Ok(())
    }
    fn tables(&self) -> PagedTables {
        PagedTables {
            page_indptr: self.indptr.device_ptr(),
            page_indices: self.indices.device_ptr(),
            seq_lens: self.lens.device_ptr(),
        }
    }
}

/// Validates CSR block tables against a cache config and batch capacities: `indptr` has B + 1
/// non-decreasing entries from 0 within `indices`, every page id is `< num_pages`, every table
/// covers its length (`>= ceil(len / T)` pages), lengths stay within the 32-bit range.
pub fn check_tables(
    cfg: &KvCacheConfig,
    indptr: &[i32],
    indices: &[i32],
    seq_lens: &[usize],
    capacity_batch: usize,
    capacity_pages: usize,
) -> Result<()> {
    cfg.validate()?;
    let b = seq_lens.len();
    if indptr.len() != b + 1 {
        return Err(Error::invalid(
            "indptr",
            format!("must have batch + 1 = {} entries, got {}", b + 1, indptr.len()),
        ));
    }
    if b == 0 || b > capacity_batch {
        return Err(Error::invalid(
            "seq_lens",
            format!("batch of {b} sequences: must be 1..={} (the capacity)", capacity_batch),
        ));
    }
    if indices.len() > capacity_pages {
        return Err(Error::invalid(
            "indices",
            format!("{} entries exceed the capacity of {}", indices.len(), capacity_pages),
        ));
    }
    if indptr[0] != 0 || indptr[b] < 0 || indptr[b] as usize > indices.len() {
        return Err(Error::invalid(
            "indptr",
            format!("must start at 0 and end within indices ({} entries)", indices.len()),
        ));
    }
    if let Some(s) = (0..b).find(|&s| indptr[s + 1] < indptr[s]) {
        return Err(Error::invalid(
            "indptr",
            format!(
                "must be non-decreasing: indptr[{}] = {} < indptr[{s}] = {}",
                s + 1,
                indptr[s + 1],
                indptr[s]
            ),
        ));
    }
    // indptr is now non-decreasing from 0 to at most indices.len(): every slice below is in range
    for s in 0..b {
        let (lo, hi) = (indptr[s], indptr[s + 1]);
        let len = seq_lens[s];
        if len > i32::MAX as usize - 64 {
            return Err(Error::invalid(
                "seq_lens",
                format!("sequence {s}: length {len} exceeds the 32-bit limit"),
            ));
        }
        let have = (hi - lo) as usize;
        let need = cfg.pages_for(len);
        if have < need {
            return Err(Error::invalid(
                "tables",
                format!(
                    "sequence {s} has {len} tokens, which need {need} pages of {}, but its block table has {have}",
                    cfg.page_size
                ),
            ));
        }
        for (i, &p) in indices[lo as usize..hi as usize].iter().enumerate() {
            if p < 0 || p as usize >= cfg.num_pages {
                return Err(Error::invalid(
                    "tables",
                    format!(
                        "sequence {s}, page {i}: physical page {p} is out of range (the cache has {} pages)",
                        cfg.num_pages
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// How many new rows each sequence appends (the packing of the `[N, Hkv, D]` append inputs).
pub struct AppendBatch {
    counts: Vec<usize>,
    indptr: DeviceBuffer<i32>,
}

impl AppendBatch {
    /// `counts[b]` new rows for sequence b (0 allowed).
    pub fn new(ctx: &Context, counts: &[usize]) -> Result<AppendBatch> {
        let indptr = Self::indptr_of(counts)?;
        Ok(AppendBatch {
            counts: counts.to_vec(),
            indptr: ctx.upload(&indptr)?,
        })
    }
    pub(crate) fn indptr_of(counts: &[usize]) -> Result<Vec<i32>> {
        if counts.is_empty() {
            return Err(Error::invalid(
                "counts",
                "must have one entry per sequence (batch >= 1)",
            ));
        }
        let mut indptr = Vec::with_capacity(counts.len() + 1);
        let mut total = 0usize;
        indptr.push(0);
        for &c in counts {
            total += c;
            if total > i32::MAX as usize / 2 {
                return Err(Error::invalid("counts", "more than 2^30 rows in one append"));
            }
            indptr.push(total as i32);
        }
        Ok(indptr)
    }
    /// Replaces the counts in place (same batch size; no allocation).
    pub fn update(&mut self, counts: &[usize]) -> Result<()> {
        if counts.len() != self.counts.len() {
            return Err(Error::invalid(
                "counts",
                format!(
                    "has {} entries, this append batch was made for {}",
                    counts.len(),
                    self.counts.len()
                ),
            ));
        }
        let indptr = Self::indptr_of(counts)?;
        self.indptr.copy_from_host_at(0, &indptr)?;
        self.counts.copy_from_slice(counts);
        Ok(())
    }
    pub fn batch(&self) -> usize {
        self.counts.len()
    }
    pub fn counts(&self) -> &[usize] {
        &self.counts
    }
    /// Rows in all (`N`).
    pub fn tokens(&self) -> usize {
        self.counts.iter().sum()
    }
}

/// `ts::PagedTables`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PagedTables {
    pub page_indptr: u64,
    pub page_indices: u64,
    pub seq_lens: u64,
}

/// `ts::AppendParams` (kvcache_params.cuh), field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AppendParams {
    pub k: u64,
    pub v: u64,
    pub cache: u64,
    pub scales: u64,
    pub tables: PagedTables,
    pub append_indptr: u64,
    pub k_stride_n: i64,
    pub k_stride_h: i64,
    pub v_stride_n: i64,
    pub v_stride_h: i64,
    pub batch: i32,
    pub tokens: i32,
    pub heads_kv: i32,
    pub head_dim: i32,
    pub page_size: i32,
    pub vector_ok: i32,
}

// SAFETY: plain data matching the C layout of ts::AppendParams (size checked by a compile test).
unsafe impl KernelParams for AppendParams {}

/// The append kernel for one (input dtype, cache dtype) pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AppendVariant {
    pub input: DType,
    pub cache: DType,
}

impl AppendVariant {
    pub const THREADS: u32 = 256;
    pub fn key(&self) -> KernelKey {
        KernelKey::new("paged_append")
            .ty("In", self.input)
            .ty("Cache", self.cache)
            .int("kThreads", "t", Self::THREADS)
    }

    pub fn spec(&self) -> KernelSpec {
        self.key()
            .spec("append.cu", APPEND_SOURCE, "paged_append", DEVICE_HEADERS)
    }
}

/// Every append variant (for the CI compile checks).
pub fn ci_append_variants() -> Vec<AppendVariant> {
    let mut v = Vec::new();
    for input in [DType::F16, DType::BF16] {
        for cache in [input, DType::F8E4M3] {
            v.push(AppendVariant { input, cache });
        }
    }
    v
}
