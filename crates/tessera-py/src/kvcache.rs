//! The paged KV cache as Python sees it (`python/tessera/_kvcache.py` wraps and documents it):
//!
//! - [`KvCache`]: a [`PagedKvCache`] (the library allocates and owns the pages, in the device's
//!   memory pool); Python reads the addresses of its layers and scales to make torch views of
//!   them, and appends / copies pages through it.
//! - [`DecodeWrapper`]: the state of a `BatchDecodeWithPagedKVCacheWrapper`: the tables of the
//!   last `plan()` (validated on the host) and, per (device, stream, cache config), the device
//!   tables ([`PagedBatch`]) and the [`DecodePlan`].
//!
//! Streams. Every call names the caller's current stream. An object remembers the stream it
//! was last used on; a call on another stream first makes that stream wait for the previous one
//! (an event, [`Context::wait_for`]: no host synchronisation), so work on one object is
//! ordered across streams. Device tables and plans belong to one stream and are rebuilt when
//! the stream changes; the pages are freed on the stream they were allocated on, after the last
//! stream's work (`Drop for KvCache`).

use pyo3::prelude::*;
use tessera::kvcache::decode::{validate_decode, DecodeOptions, DecodePlan, DecodeTuning};
use tessera::kvcache::{check_tables, AppendBatch, KvCacheConfig, PageCopy, PagedBatch, PagedKvCache};
use tessera::runtime::Context;
use tessera::{DType, Error};

use crate::cache::{self, StreamId};
use crate::desc::{Desc, RawDesc};
use crate::errors::{invalid, IntoPy};

/// `(num_pages, page_size, heads_kv, head_dim, dtype, num_layers, fp8_scale)`.
pub type RawConfig = (usize, usize, usize, usize, String, usize, f32);

fn kv_dtype(name: &str) -> PyResult<DType> {
    DType::parse(name).ok_or_else(|| {
        crate::errors::to_py(Error::Unsupported(format!(
            "KV cache dtype {name}: supported are fp16, bf16 and fp8e4m3"
        )))
    })
}

/// The torch name of a cache dtype.
fn torch_name(d: DType) -> &'static str {
    match d {
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::F8E4M3 => "float8_e4m3fn",
        _ => "unknown",
    }
}

fn config(raw: RawConfig) -> PyResult<KvCacheConfig> {
    let (num_pages, page_size, heads_kv, head_dim, dtype, num_layers, fp8_scale) = raw;
    let cfg = KvCacheConfig {
        num_pages,
        page_size,
        heads_kv,
        head_dim,
        dtype: kv_dtype(&dtype)?,
        num_layers,
        fp8_scale,
    };
    cfg.validate().py_err()?;
    Ok(cfg)
}

/// Validates a cache configuration without a device; returns the bytes of one layer.
#[pyfunction]
pub fn check_kv_cache(cfg: RawConfig) -> PyResult<usize> {
    Ok(config(cfg)?.layer_bytes().unwrap_or(0))
}

/// The context of `device` queueing on `stream`.
fn on(device: usize, stream: StreamId) -> tessera::Result<Context> {
    // SAFETY: `stream` is the caller's current stream of `device` (torch's, or one the caller
    // named), which outlives the objects made with it (module docs of `cache`).
    unsafe { cache::context_on(device, stream) }
}

/// Device tables and append counts of `append_paged_kv_cache`, kept between calls on one stream.
struct AppendScratch {
    stream: StreamId,
    cap_batch: usize,
    cap_pages: usize,
    batch: PagedBatch,
    appended: Option<AppendBatch>,
}

/// Capacities for `batch` sequences and `pages` table entries, with room to grow.
fn capacities(batch: usize, pages: usize) -> (usize, usize) {
    (batch.max(1).next_power_of_two(), pages.max(1).next_power_of_two())
}

/// The append counts `counts` in `slot` (updated in place when the batch size is the same).
fn append_batch<'a>(
    ctx: &Context,
    slot: &'a mut Option<AppendBatch>,
    counts: &[usize],
) -> tessera::Result<&'a AppendBatch> {
    match slot {
        Some(a) if a.batch() == counts.len() => {
            if a.counts() != counts {
                a.update(counts)?;
            }
        }
        _ => *slot = Some(AppendBatch::new(ctx, counts)?),
    }
    Ok(slot.as_ref().expect("set above"))
}

/// A paged KV cache owned by tessera (`tessera.PagedKVCache` holds one).
#[pyclass(module = "tessera._tessera", name = "KvCache")]
pub struct KvCache {
    device: usize,
    alloc_stream: StreamId,
    last_stream: StreamId,
    cache: PagedKvCache,
    scratch: Option<AppendScratch>,
}

impl KvCache {
    /// Moves the cache's work to `stream`, ordered after everything queued on its previous one.
    fn use_stream(&mut self, stream: StreamId) -> tessera::Result<()> {
        if stream == self.last_stream {
            return Ok(());
        }
        let ctx = on(self.device, stream)?;
        ctx.wait_for(&on(self.device, self.last_stream)?)?;
        self.cache.set_context(&ctx)?;
        self.last_stream = stream;
        Ok(())
    }
}

impl Drop for KvCache {
    fn drop(&mut self) {
        // the pages are freed on the allocation stream: after the last stream's work
        if self.last_stream != self.alloc_stream {
            let (device, alloc, last) = (self.device, self.alloc_stream, self.last_stream);
            let _ = cache::with_device(device, |_| on(device, alloc)?.wait_for(&on(device, last)?));
        }
    }
}

#[pymethods]
impl KvCache {
    /// Allocates the pages of every layer on `device`, ordered on `stream` (and waits for the
    /// allocation, so any stream may use the pages afterwards).
    #[new]
    fn new(py: Python<'_>, device: usize, stream: StreamId, cfg: RawConfig) -> PyResult<KvCache> {
        let cfg = config(cfg)?;
        let cache = py
            .detach(|| {
                cache::with_device(device, |_| {
                    let ctx = on(device, stream)?;
                    let c = PagedKvCache::new(&ctx, cfg)?;
                    ctx.synchronize()?;
                    Ok(c)
                })
            })
            .py_err()?;
        Ok(KvCache {
            device,
            alloc_stream: stream,
            last_stream: stream,
            cache,
            scratch: None,
        })
    }

    /// The CUDA device ordinal.
    #[getter]
    fn device(&self) -> usize {
        self.device
    }

    /// `(num_pages, page_size, heads_kv, head_dim, dtype (torch name), num_layers, fp8_scale)`.
    fn config(&self) -> RawConfig {
        let c = self.cache.config();
        (
            c.num_pages,
            c.page_size,
            c.heads_kv,
            c.head_dim,
            torch_name(c.dtype).to_string(),
            c.num_layers,
            c.fp8_scale,
        )
    }

    /// `(address, bytes)` of the `[P, 2, T, Hkv, D]` pages of `layer`.
    fn layer_memory(&self, layer: usize) -> PyResult<(u64, usize)> {
        let b = self.cache.layer(layer).py_err()?;
        Ok((b.device_ptr(), b.bytes()))
    }

    /// `(address, bytes)` of the `[P, Hkv, 2]` f32 scales of `layer` (fp8 caches only).
    fn scales_memory(&self, layer: usize) -> PyResult<(u64, usize)> {
        let b = self.cache.scales(layer).py_err()?;
        Ok((b.device_ptr(), b.bytes()))
    }

    /// Sets every `[P, Hkv, 2]` scale of `layer` (fp8 only; each in (0, 65504]). Synchronises: the
    /// work queued on the cache's last stream first, then the copy.
    fn set_scales(&mut self, py: Python<'_>, layer: usize, scales: Vec<f32>) -> PyResult<()> {
        let (device, last) = (self.device, self.last_stream);
        let cache = &mut self.cache;
        py.detach(|| {
            cache::with_device(device, |_| {
                on(device, last)?.synchronize()?;
                cache.set_scales(layer, &scales)
            })
        })
        .py_err()
    }

    /// Copies whole pages `src[i] -> dst[i]` (K, V and scales of every layer) on `stream`.
    fn copy_pages(&mut self, py: Python<'_>, stream: StreamId, src: Vec<i64>, dst: Vec<i64>) -> PyResult<()> {
        if src.len() != dst.len() {
            return Err(invalid(
                "dst",
                format!("has {} entries but src has {}", dst.len(), src.len()),
            ));
        }
        let p = self.cache.config().num_pages as i64;
        let mut copies = Vec::with_capacity(src.len());
        for (i, (&s, &d)) in src.iter().zip(&dst).enumerate() {
            if !(0..p).contains(&s) || !(0..p).contains(&d) || s == d {
                return Err(invalid(
                    "src",
                    format!("page copy {i}: {s} -> {d} is invalid: ids must be distinct and in 0..{p}"),
                ));
            }
            copies.push(PageCopy {
                src: s as u32,
                dst: d as u32,
            });
        }
        let device = self.device;
        py.detach(|| {
            cache::with_device(device, |_| {
                self.use_stream(stream)?;
                self.cache.copy_pages(&copies)
            })
        })
        .py_err()
    }

    /// Writes `counts[b]` new K/V rows per sequence (packed by sequence in `k`/`v`, `[N, Hkv,
    /// D]`) into `layer` at positions `seq_lens[b] - counts[b] ..`, on `stream`. The tables
    /// (`indptr`, `indices`) and lengths after the append are validated against the cache.
    #[allow(clippy::too_many_arguments)]
    fn append(
        &mut self,
        py: Python<'_>,
        stream: StreamId,
        layer: usize,
        k: RawDesc,
        v: RawDesc,
        indptr: Vec<i32>,
        indices: Vec<i32>,
        seq_lens: Vec<usize>,
        counts: Vec<usize>,
    ) -> PyResult<()> {
        let (k, v) = (Desc::new("append_key", k)?, Desc::new("append_value", v)?);
        let (kv, vv) = (k.view()?, v.view()?);
        if counts.len() != seq_lens.len() {
            return Err(invalid(
                "counts",
                format!("has {} entries for {} sequences", counts.len(), seq_lens.len()),
            ));
        }
        let device = self.device;
        py.detach(|| {
            cache::with_device(device, |_| {
                let cfg = self.cache.config().clone();
                let ctx = on(device, stream)?;
                let b = seq_lens.len();
                let mut scratch = match self.scratch.take() {
                    Some(s) if s.stream == stream && s.cap_batch >= b && s.cap_pages >= indices.len() => s,
                    _ => {
                        let (cap_batch, cap_pages) = capacities(b, indices.len());
                        AppendScratch {
                            stream,
                            cap_batch,
                            cap_pages,
                            batch: PagedBatch::new(&ctx, cap_batch, cap_pages)?,
                            appended: None,
                        }
                    }
                };
                scratch.batch.update_csr(&cfg, &indptr, &indices, &seq_lens)?;
                let appended = append_batch(&ctx, &mut scratch.appended, &counts)?;
                // after the table uploads (a new scratch synchronises `stream` once), so that
                // they do not wait for the cache's previous stream
                let r = self
                    .use_stream(stream)
                    .and_then(|_| self.cache.append(layer, &kv, &vv, &scratch.batch, appended));
                self.scratch = Some(scratch);
                r
            })
        })
        .py_err()
    }
}

/// What `plan()` was given, validated on the host.
struct Planned {
    heads_q: usize,
    heads_kv: usize,
    head_dim: usize,
    page_size: usize,
    kv_dtype: DType,
    options: DecodeOptions,
    indptr: Vec<i32>,
    indices: Vec<i32>,
    lens: Vec<usize>,
    /// Counts plan() calls, so the device state knows which tables it holds.
    generation: u64,
}

/// The device side of a plan for one (device, stream, cache config).
struct DecodeState {
    device: usize,
    stream: StreamId,
    cfg: KvCacheConfig,
    heads_q: usize,
    options: DecodeOptions,
    cap_batch: usize,
    cap_pages: usize,
    generation: u64,
    batch: PagedBatch,
    plan: DecodePlan,
    /// One new row per sequence (the native decode-step append).
    ones: Option<AppendBatch>,
}

/// The state of a `BatchDecodeWithPagedKVCacheWrapper`.
#[pyclass(module = "tessera._tessera", name = "DecodeWrapper")]
#[derive(Default)]
pub struct DecodeWrapper {
    planned: Option<Planned>,
    generation: u64,
    state: Option<DecodeState>,
}

impl DecodeWrapper {
    /// Brings the device state up to date with the last plan() for a cache of config `cfg`
    /// used on `stream`: nothing when it is, the tables and work list updated in place when
    /// only they changed, else built anew (freeing the old state on its own stream).
    fn prepare(&mut self, device: usize, stream: StreamId, cfg: &KvCacheConfig) -> tessera::Result<()> {
        let p = self
            .planned
            .as_ref()
            .ok_or_else(|| Error::invalid("plan", "run() or append() before plan(): call plan(...) first"))?;
        if (cfg.page_size, cfg.heads_kv, cfg.head_dim, cfg.dtype) != (p.page_size, p.heads_kv, p.head_dim, p.kv_dtype) {
            return Err(Error::invalid(
                "paged_kv_cache",
                format!(
                    "has page_size {}, {} KV heads, head_dim {} and dtype {}, but plan() was given page_size {}, {} KV heads, head_dim {} and dtype {}",
                    cfg.page_size, cfg.heads_kv, cfg.head_dim, cfg.dtype, p.page_size, p.heads_kv, p.head_dim, p.kv_dtype
                ),
            ));
        }
        let b = p.lens.len();
        if let Some(s) = self.state.as_mut() {
            let same_place = s.device == device && s.stream == stream && s.cfg == *cfg;
            if same_place && s.generation == p.generation {
                return Ok(());
            }
            if same_place
                && s.heads_q == p.heads_q
                && s.options == p.options
                && s.cap_batch >= b
                && s.cap_pages >= p.indices.len()
            {
                s.batch.update_csr(cfg, &p.indptr, &p.indices, &p.lens)?;
                if s.plan.batch() == b {
                    s.plan.update(&p.lens)?;
                } else {
                    s.plan = DecodePlan::new(&on(device, stream)?, cfg, p.heads_q, &p.lens, &p.options)?;
                }
                s.generation = p.generation;
                return Ok(());
            }
        }
        self.state = None;
        let ctx = on(device, stream)?;
        let (cap_batch, cap_pages) = capacities(b, p.indices.len());
        let mut batch = PagedBatch::new(&ctx, cap_batch, cap_pages)?;
        batch.update_csr(cfg, &p.indptr, &p.indices, &p.lens)?;
        let plan = DecodePlan::new(&ctx, cfg, p.heads_q, &p.lens, &p.options)?;
        self.state = Some(DecodeState {
            device,
            stream,
            cfg: cfg.clone(),
            heads_q: p.heads_q,
            options: p.options,
            cap_batch,
            cap_pages,
            generation: p.generation,
            batch,
            plan,
            ones: None,
        });
        Ok(())
    }
}

#[pymethods]
impl DecodeWrapper {
    #[new]
    fn new() -> DecodeWrapper {
        DecodeWrapper::default()
    }

    /// Validates a decode batch on the host and keeps it: CSR tables (`indptr`, `indices`),
    /// lengths, heads, head dim, page size, dtypes, scale, and whether to split long sequences
    /// over several CTAs (split-KV, the default) or not. When the wrapper already ran on `stream` of `device`, the device tables and
    /// plan for that cache are updated here (so the next run() has no host work); else the first
    /// run() builds them.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (device, stream, indptr, indices, seq_lens, heads_q, heads_kv, head_dim, page_size, kv_dtype, q_dtype, scale, disable_split_kv))]
    fn plan(
        &mut self,
        py: Python<'_>,
        device: usize,
        stream: StreamId,
        indptr: Vec<i32>,
        indices: Vec<i32>,
        seq_lens: Vec<usize>,
        heads_q: usize,
        heads_kv: usize,
        head_dim: usize,
        page_size: usize,
        kv_dtype: &str,
        q_dtype: &str,
        scale: Option<f32>,
        disable_split_kv: bool,
    ) -> PyResult<()> {
        let kv = self::kv_dtype(kv_dtype)?;
        let q = DType::parse(q_dtype)
            .ok_or_else(|| invalid("q_data_type", format!("{q_dtype}: queries are float16 or bfloat16")))?;
        // the page ids are checked against the cache's page count when the tables are uploaded
        // (run(), or here when the cache is known); everything else is checked now
        let probe = KvCacheConfig {
            num_pages: i32::MAX as usize,
            page_size,
            heads_kv,
            head_dim,
            dtype: kv,
            num_layers: 1,
            fp8_scale: 1.0,
        };
        // one query token (the default q_len)
        let options = DecodeOptions {
            scale,
            query_dtype: Some(q),
            tuning: DecodeTuning {
                chunk_tokens: disable_split_kv.then_some(usize::MAX),
                ..Default::default()
            },
            ..Default::default()
        };
        check_tables(
            &probe,
            &indptr,
            &indices,
            &seq_lens,
            i32::MAX as usize / 2,
            i32::MAX as usize,
        )
        .py_err()?;
        validate_decode(&probe, heads_q, &seq_lens, &options).py_err()?;
        self.generation += 1;
        self.planned = Some(Planned {
            heads_q,
            heads_kv,
            head_dim,
            page_size,
            kv_dtype: kv,
            options,
            indptr,
            indices,
            lens: seq_lens,
            generation: self.generation,
        });
        // eager upload for the cache of the last run on this stream; a failure here (say, page
        // ids past that cache's end when another cache is next) is left for run() to report
        if let Some(cfg) = self
            .state
            .as_ref()
            .filter(|s| s.device == device && s.stream == stream)
            .map(|s| s.cfg.clone())
        {
            let ok = py.detach(|| cache::with_device(device, |_| self.prepare(device, stream, &cfg)).is_ok());
            if !ok {
                self.state = None;
            }
        }
        Ok(())
    }

    /// `(batch, heads_q, head_dim)` of the last plan(), or None.
    fn planned_shape(&self) -> Option<(usize, usize, usize)> {
        self.planned.as_ref().map(|p| (p.lens.len(), p.heads_q, p.head_dim))
    }

    /// A line describing the device plan (kernel, split-KV, CTAs), once run() built it.
    fn describe(&self) -> Option<String> {
        self.state.as_ref().map(|s| s.plan.describe())
    }

    /// Decode of `layer` of `cache` on `stream`: `q` and `out` are `[B, 1, Hq, D]` descriptors,
    /// `lse` `[B, 1, Hq]` f32.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (device, stream, q, out, lse, cache, layer))]
    fn run(
        &mut self,
        py: Python<'_>,
        device: usize,
        stream: StreamId,
        q: RawDesc,
        out: RawDesc,
        lse: Option<RawDesc>,
        cache: &Bound<'_, KvCache>,
        layer: usize,
    ) -> PyResult<()> {
        let (q, out) = (Desc::new("q", q)?, Desc::new("out", out)?);
        let lse = lse.map(|l| Desc::new("lse", l)).transpose()?;
        let qv = q.view()?;
        let mut ov = out.view_mut()?;
        let mut lv = lse.as_ref().map(Desc::view_mut).transpose()?;
        let mut c = cache.borrow_mut();
        if c.device != device {
            return Err(invalid(
                "paged_kv_cache",
                format!("is on cuda:{} but q is on cuda:{device}", c.device),
            ));
        }
        let c: &mut KvCache = &mut c;
        py.detach(|| {
            cache::with_device(device, |_| {
                // the tables first: building them anew synchronises `stream`, which must not
                // yet wait for the cache's previous stream
                let cfg = c.cache.config().clone();
                self.prepare(device, stream, &cfg)?;
                c.use_stream(stream)?;
                let s = self.state.as_ref().expect("prepared");
                s.plan.run(&qv, &c.cache, layer, &s.batch, &mut ov, lv.as_mut())
            })
        })
        .py_err()
    }

    /// Appends one new K/V row per sequence (`k`, `v`: `[B, Hkv, D]`) at the last position of
    /// each planned length (`seq_lens[b] - 1`) into `layer` of `cache`, on `stream`, with the
    /// tables uploaded for the plan (no host work in a steady decode loop).
    #[allow(clippy::too_many_arguments)]
    fn append(
        &mut self,
        py: Python<'_>,
        device: usize,
        stream: StreamId,
        k: RawDesc,
        v: RawDesc,
        cache: &Bound<'_, KvCache>,
        layer: usize,
    ) -> PyResult<()> {
        let (k, v) = (Desc::new("append_key", k)?, Desc::new("append_value", v)?);
        let (kv, vv) = (k.view()?, v.view()?);
        let mut c = cache.borrow_mut();
        if c.device != device {
            return Err(invalid(
                "paged_kv_cache",
                format!("is on cuda:{} but append_key is on cuda:{device}", c.device),
            ));
        }
        let c: &mut KvCache = &mut c;
        py.detach(|| {
            cache::with_device(device, |_| {
                let cfg = c.cache.config().clone();
                self.prepare(device, stream, &cfg)?;
                let s = self.state.as_mut().expect("prepared");
                let ones = vec![1usize; s.batch.batch()];
                let ctx = on(device, stream)?;
                let appended = append_batch(&ctx, &mut s.ones, &ones)?;
                c.use_stream(stream)?; // after the (possibly synchronising) table uploads
                c.cache.append(layer, &kv, &vv, &s.batch, appended)
            })
        })
        .py_err()
    }
}
