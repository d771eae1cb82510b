//! `tessera bench kvcache`: the decode table (B = 8, Hq = 32, Hkv = 8, D = 128, fp16,
//! page 16, contexts 1K..64K), the fp8 cache at 32K, a mixed batch of 64 sequences with
//! log-uniform lengths 128..32768, and the append of one token for 8 sequences.
//!
//! Every decode case first checks the timed output of two sequences (the first and the last,
//! all heads) against the f64 reference and the whole output for unwritten (NaN) elements. The
//! pool holds several disjoint copies of the batch's pages (at least 240 MiB in all) and the
//! timed calls rotate among them, so L2 (60 MB) never serves the cache. Page tables are random
//! permutations of the pool. GB/s = KV bytes read (sum of lengths x Hkv x D x 2 x element bytes)
//! / time; append GB/s = bytes written / time.
//!
//! `TESSERA_DECODE_SWEEP=1` adds rows `tessera-w{warps}k{tile}s{stages}` for kernel tunings and
//! `tessera-chunk{n}` for fixed key chunks (contexts <= 8K); the rows `tessera-query-rows` run
//! the query-rows kernel on every decode shape.
//!
//! Planner overrides from the environment, read here and by `tessera verify kvcache` (the
//! library's planning never reads the environment), for every decode plan whose case does not
//! force the same choice ([`env_tuning`]):
//! - `TESSERA_DECODE_TUNING=warps,tile_keys,stages`: the kernel shape;
//! - `TESSERA_DECODE_LAYOUT=query|key`: the kernel layout.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use serde_json::json;

use super::decode::{
    DecodeKernelShape, DecodeLayout, DecodeOptions, DecodePlan, DecodeTuning, DecodeVariant, HOPPER_SHARED_LIMIT,
};
use super::reference::{decode_reference, encode, gather_sequence};
use super::{AppendBatch, KvCacheConfig, PagedBatch, PagedKvCache};
use crate::check::compare;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::harness::BenchOutcome;
use crate::runtime::{time_median, Context, TimingOptions};
use crate::testdata::{random_matrix, Dist};

/// `TESSERA_DECODE_TUNING=warps,tile_keys,stages`: a kernel shape for benchmark sweeps; `None`
/// when unset. A value that is not three integers is an error, not silently ignored (the shape
/// itself is validated by the plan, like a caller's).
pub fn kernel_shape_from_env() -> Result<Option<DecodeKernelShape>> {
    match std::env::var("TESSERA_DECODE_TUNING") {
        Ok(s) => parse_kernel_shape(&s).map(Some),
        Err(_) => Ok(None),
    }
}

/// A `TESSERA_DECODE_TUNING` value: `warps,tile_keys,stages`.
pub fn parse_kernel_shape(s: &str) -> Result<DecodeKernelShape> {
    let v: Vec<u32> = s.split(',').filter_map(|x| x.trim().parse().ok()).collect();
    if v.len() != 3 {
        return Err(Error::invalid(
            "TESSERA_DECODE_TUNING",
            format!("must be warps,tile_keys,stages (three integers), got {s:?}"),
        ));
    }
    Ok(DecodeKernelShape {
        warps: v[0],
        tile_keys: v[1],
        stages: v[2],
    })
}

/// `TESSERA_DECODE_LAYOUT=query|key`: a forced kernel layout; `None` when unset, any other
/// value is an error.
pub fn layout_from_env() -> Result<Option<DecodeLayout>> {
    match std::env::var("TESSERA_DECODE_LAYOUT") {
        Ok(s) => parse_layout(&s).map(Some),
        Err(_) => Ok(None),
    }
}

/// A `TESSERA_DECODE_LAYOUT` value: `query` or `key`.
pub fn parse_layout(s: &str) -> Result<DecodeLayout> {
    match s {
        "query" => Ok(DecodeLayout::QueryRows),
        "key" => Ok(DecodeLayout::KeyRows),
        _ => Err(Error::invalid(
            "TESSERA_DECODE_LAYOUT",
            format!("must be `query` or `key`, got {s:?}"),
        )),
    }
}

/// The tuning a harness plans a decode with: the case's `forced` choices, and where it forces
/// none the environment's kernel shape ([`kernel_shape_from_env`]) and layout
/// ([`layout_from_env`]). Read at every plan, as the plan once did itself.
pub fn env_tuning(forced: DecodeTuning) -> Result<DecodeTuning> {
    Ok(DecodeTuning {
        kernel: match forced.kernel {
            Some(k) => Some(k),
            None => kernel_shape_from_env()?,
        },
        layout: match forced.layout {
            Some(l) => Some(l),
            None => layout_from_env()?,
        },
        ..forced
    })
}

/// Decode or append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchOp {
    Decode,
    Append,
}

/// One benchmark case.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchCase {
    pub op: BenchOp,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub head_dim: usize,
    pub page_size: usize,
    /// Cache dtype (queries fp16 for an fp8 cache).
    pub dtype: DType,
    /// Tokens in the cache per sequence (the query token included).
    pub lengths: Vec<usize>,
    /// A mixed-length batch (the lengths differ).
    pub mixed: bool,
    /// A forced tuning (impl `tessera-w..k..s..`); `None` = default (`tessera`).
    pub tuning: Option<DecodeKernelShape>,
    /// A forced kernel layout (impl `tessera-query-rows` / `tessera-key-rows` [+ tuning]);
    /// `None` = the planner's.
    pub layout: Option<DecodeLayout>,
    /// A forced key chunk (impl `tessera-chunk{n}`); `None` = the planner's.
    pub chunk: Option<usize>,
}

/// Contexts of the decode table.
pub const CONTEXTS: [usize; 6] = [1024, 4096, 8192, 16384, 32768, 65536];

/// The mixed batch: 64 lengths log-uniform in 128..=32768 (fixed seed, so every run and the
/// baselines see the same batch).
pub fn mixed_lengths() -> Vec<usize> {
    let mut rng = StdRng::seed_from_u64(0x006d_6978_6564);
    (0..64)
        .map(|_| {
            (128f64.ln() + rng.random::<f64>() * (32768f64.ln() - 128f64.ln()))
                .exp()
                .round() as usize
        })
        .collect()
}

impl BenchCase {
    fn decode(ctx: usize, dtype: DType) -> BenchCase {
        BenchCase {
            op: BenchOp::Decode,
            heads_q: 32,
            heads_kv: 8,
            head_dim: 128,
            page_size: 16,
            dtype,
            lengths: vec![ctx; 8],
            mixed: false,
            tuning: None,
            layout: None,
            chunk: None,
        }
    }
    pub fn batch(&self) -> usize {
        self.lengths.len()
    }
    pub fn ctx(&self) -> usize {
        self.lengths.iter().copied().max().unwrap_or(0)
    }
    pub fn name(&self) -> String {
        let op = match self.op {
            BenchOp::Decode => "decode",
            BenchOp::Append => "append",
        };
        let what = if self.mixed {
            format!("mixed {} seqs ctx<={}", self.batch(), self.ctx())
        } else {
            format!("B{} ctx{}", self.batch(), self.ctx())
        };
        format!(
            "{op} {} {what} Hq{} Hkv{} D{} page{}",
            self.dtype, self.heads_q, self.heads_kv, self.head_dim, self.page_size
        )
    }
    /// The JSON params (exactly the keys the baseline runner reads, + `lengths` when mixed).
    pub fn params(&self) -> serde_json::Value {
        let mut p = json!({
            "op": match self.op { BenchOp::Decode => "decode", BenchOp::Append => "append" },
            "B": self.batch(), "Hq": self.heads_q, "Hkv": self.heads_kv, "D": self.head_dim,
            "ctx": self.ctx(), "page": self.page_size, "dtype": bench_dtype_name(self.dtype), "mixed": self.mixed,
        });
        if self.mixed {
            p["lengths"] = json!(self.lengths);
        }
        p
    }
    pub fn implementation(&self) -> String {
        let mut s = String::from("tessera");
        if let Some(layout) = self.layout {
            s = s + "-" + layout.name();
        }
        if let Some(t) = self.tuning {
            s += &format!("-w{}k{}s{}", t.warps, t.tile_keys, t.stages);
        }
        match self.chunk {
            Some(usize::MAX) => s += "-no-split",
            Some(c) => s += &format!("-chunk{c}"),
            None => {}
        }
        s
    }
    /// The decode kernel variant this case runs with its forced tuning (or the default).
    pub fn variant(&self) -> DecodeVariant {
        let cfg = KvCacheConfig {
            num_pages: 1,
            page_size: self.page_size,
            heads_kv: self.heads_kv,
            head_dim: self.head_dim,
            dtype: self.dtype,
            ..Default::default()
        };
        let query = if self.dtype == DType::BF16 {
            DType::BF16
        } else {
            DType::F16
        };
        DecodeVariant::for_problem(
            query,
            &cfg,
            self.heads_q,
            1,
            self.layout,
            self.tuning,
            HOPPER_SHARED_LIMIT,
        )
    }
    /// Bytes of K and V the decode reads.
    pub fn kv_bytes(&self) -> usize {
        let elems: usize = self
            .lengths
            .iter()
            .map(|&l| l * self.heads_kv * self.head_dim * 2)
            .sum();
        elems * self.dtype.size()
    }
}

/// The dtype as the baseline runner names it (`fp16`, `bf16`, `fp8`).
fn bench_dtype_name(d: DType) -> &'static str {
    match d {
        DType::F8E4M3 => "fp8",
        d => d.name(),
    }
}

/// The benchmark cases (`quick`: 4K and 16K decode and the append).
pub fn cases(quick: bool) -> Vec<BenchCase> {
    let mut v: Vec<BenchCase> = CONTEXTS
        .iter()
        .filter(|&&c| !quick || c == 4096 || c == 16384)
        .map(|&c| BenchCase::decode(c, DType::F16))
        .collect();
    v.push(BenchCase::decode(32768, DType::F8E4M3));
    let mut mixed = BenchCase::decode(0, DType::F16);
    mixed.lengths = mixed_lengths();
    mixed.mixed = true;
    v.push(mixed);
    // the query-rows kernel on every decode shape (the planner takes key rows for 4 rows per KV
    // head): the layouts side by side
    let query_rows: Vec<BenchCase> = v
        .iter()
        .map(|c| BenchCase {
            layout: Some(DecodeLayout::QueryRows),
            ..c.clone()
        })
        .collect();
    v.extend(query_rows);
    let mut append = BenchCase::decode(4096, DType::F16);
    append.op = BenchOp::Append;
    v.push(append);
    if std::env::var("TESSERA_DECODE_SWEEP").is_ok_and(|s| s == "1") {
        let sweep = [
            (4u32, 16u32, 2u32),
            (4, 16, 3),
            (4, 16, 4),
            (8, 16, 2),
            (8, 16, 3),
            (8, 16, 4),
            (4, 32, 2),
            (4, 32, 3),
            (8, 32, 2),
            (8, 32, 3),
            (4, 64, 2),
            (2, 32, 4),
        ];
        let mut extra = Vec::new();
        for base in v.iter().filter(|c| {
            c.op == BenchOp::Decode
                && c.layout.is_none()
                && (c.mixed || [1024, 4096, 16384, 65536].contains(&c.ctx()) || c.dtype == DType::F8E4M3)
        }) {
            for &(warps, tile_keys, stages) in &sweep {
                let mut c = base.clone();
                let tuning = DecodeKernelShape {
                    warps,
                    tile_keys,
                    stages,
                };
                c.tuning = Some(tuning);
                if c.variant().shared_bytes() <= HOPPER_SHARED_LIMIT {
                    extra.push(c);
                }
            }
        }
        // the planner's chunk against fixed ones where split-KV decides the time
        for base in v.iter().filter(|c| {
            c.op == BenchOp::Decode && c.layout.is_none() && c.tuning.is_none() && !c.mixed && c.ctx() <= 8192
        }) {
            for chunk in [256usize, 512, 768, 1024, 2048] {
                if chunk < base.ctx() {
                    extra.push(BenchCase {
                        chunk: Some(chunk),
                        ..base.clone()
                    });
                }
            }
        }
        v.extend(extra);
    }
    v
}

/// Verifies and times one case.
pub fn bench_case(ctx: &Context, case: &BenchCase, seed: u64, timing: TimingOptions) -> Result<BenchOutcome> {
    // an fp8 cache is read with fp16 queries
    let query = match case.dtype {
        DType::F8E4M3 => DType::F16,
        d => d,
    };
    crate::dispatch_float!("kvcache bench"; query, [F16, BF16], |T| run::<T>(ctx, case, seed, timing))
}

/// Bytes the rotated copies of a batch's pages must span together.
const ROTATE_BYTES: usize = 240 << 20;

fn run<T: Element>(ctx: &Context, case: &BenchCase, seed: u64, timing: TimingOptions) -> Result<BenchOutcome> {
    let (hq, hkv, d, t) = (case.heads_q, case.heads_kv, case.head_dim, case.page_size);
    let b = case.batch();
    let pages_per_set: usize = case.lengths.iter().map(|&l| l.div_ceil(t)).sum::<usize>().max(1);
    let sets = match case.op {
        BenchOp::Decode => ROTATE_BYTES.div_ceil(case.kv_bytes().max(1)).clamp(1, 16),
        BenchOp::Append => 1,
    };
    let cfg = KvCacheConfig {
        num_pages: pages_per_set * sets,
        page_size: t,
        heads_kv: hkv,
        head_dim: d,
        dtype: case.dtype,
        num_layers: 1,
        fp8_scale: 1.0,
    };
    cfg.validate()?;
    let mut rng = StdRng::seed_from_u64(seed);

    // pool contents: one 16 MiB random block tiled over the pool (never zeros)
    let eb = cfg.element_bytes();
    let block_elems = (16usize << 20) / eb;
    let scale = 1.0f32 / 32.0;
    let values: Vec<f32> = random_matrix(seed ^ 0xb10c, 1, block_elems, block_elems, Dist::Normal { std: 1.0 });
    let mut block = vec![0u8; block_elems * eb];
    block
        .par_chunks_mut(eb)
        .zip(values.par_iter())
        .for_each(|(o, &x)| encode(&cfg, x, scale, o));
    let total = cfg.layer_bytes().unwrap_or(0);
    let mut layer = vec![0u8; total];
    layer.par_chunks_mut(block.len()).for_each(|c| {
        let n = c.len();
        c.copy_from_slice(&block[..n])
    });
    drop(block);
    let mut cache = PagedKvCache::new(ctx, cfg.clone())?;
    cache.layer_mut(0)?.copy_from_host(&layer)?;
    let scales = (case.dtype == DType::F8E4M3).then(|| vec![scale; cfg.num_pages * hkv * 2]);
    if let Some(s) = &scales {
        cache.set_scales(0, s)?;
    }

    // one batch per rotation set, each a random permutation of its own pages
    let mut batches = Vec::with_capacity(sets);
    let mut all_tables = Vec::with_capacity(sets);
    for s in 0..sets {
        let mut pages: Vec<u32> = ((s * pages_per_set) as u32..((s + 1) * pages_per_set) as u32).collect();
        pages.shuffle(&mut rng);
        let mut tables: Vec<Vec<u32>> = Vec::with_capacity(b);
        let mut next = 0;
        for &l in &case.lengths {
            let n = l.div_ceil(t);
            tables.push(pages[next..next + n].to_vec());
            next += n;
        }
        let mut batch = PagedBatch::new(ctx, b, pages_per_set)?;
        let refs: Vec<&[u32]> = tables.iter().map(|x| x.as_slice()).collect();
        batch.update(&cfg, &refs, &case.lengths)?;
        batches.push(batch);
        all_tables.push(tables);
    }

    match case.op {
        BenchOp::Decode => {
            let q_host: Vec<T> = random_matrix(seed ^ 0x9e11, b, hq * d, hq * d, Dist::Normal { std: 1.0 });
            let q = ctx.upload(&q_host)?;
            let shape = [b, 1, hq, d];
            let strides = [hq * d, hq * d, d, 1];
            let qv = q.view(&shape, &strides)?;
            let mut out = ctx.alloc::<T>(b * hq * d)?;
            out.fill_bytes(0xff)?;
            let opts = DecodeOptions {
                tuning: env_tuning(DecodeTuning {
                    chunk_tokens: case.chunk,
                    kernel: case.tuning,
                    layout: case.layout,
                })?,
                ..Default::default()
            };
            let plan = DecodePlan::new(ctx, &cfg, hq, &case.lengths, &opts)?;
            {
                let mut ov = out.view_mut(&shape, &strides)?;
                plan.run(&qv, &cache, 0, &batches[0], &mut ov, None)?;
            }
            let got_all = out.to_host()?;
            if let Some(i) = got_all.iter().position(|x| x.to_f64().is_nan()) {
                return Err(Error::Unsupported(format!(
                    "{}: output element {i} is NaN (unwritten or a numerical failure)",
                    case.name()
                )));
            }
            // reference for the first and the last sequence, every head
            let check: Vec<usize> = if b > 1 { vec![0, b - 1] } else { vec![0] };
            let mut got = Vec::new();
            let mut want = Vec::new();
            for &s in &check {
                let table: Vec<i32> = all_tables[0][s].iter().map(|&p| p as i32).collect();
                let (k, v) = gather_sequence(&cfg, &layer, scales.as_deref(), &table, case.lengths[s]);
                let q64: Vec<f64> = q_host[s * hq * d..(s + 1) * hq * d]
                    .iter()
                    .map(|x| x.to_f64())
                    .collect();
                let r = decode_reference(&q64, &[k], &[v], 1, hq, hkv, d, 1.0 / (d as f64).sqrt());
                want.extend(r.o);
                got.extend(got_all[s * hq * d..(s + 1) * hq * d].iter().map(|x| x.to_f64()));
            }
            let cmp = compare(&got, &want, 1e-2, 1e-2);
            let budget = T::DTYPE.rel_l2_budget();
            if !cmp.passes(budget) {
                return Err(Error::Unsupported(format!(
                    "{}: timed output fails the reference: rel_l2 {:.3e} > {budget:.0e}",
                    case.name(),
                    cmp.rel_l2
                )));
            }
            let mut ov = out.view_mut(&shape, &strides)?;
            let tm = time_median(ctx, timing, |i| {
                plan.run(&qv, &cache, 0, &batches[i % sets], &mut ov, None)
            })?;
            let ms = tm.median_ms;
            let flops: f64 = case.lengths.iter().map(|&l| 4.0 * (l * hq * d) as f64).sum();
            Ok(BenchOutcome {
                case: case.name(),
                params: case.params(),
                implementation: case.implementation(),
                ms,
                gbps: Some(case.kv_bytes() as f64 / ms / 1e6),
                tflops: Some(flops / ms / 1e9),
                extra_mib: Some(plan.workspace_bytes() as f64 / (1 << 20) as f64),
                max_abs_err: Some(cmp.max_abs_err),
                rel_l2: Some(cmp.rel_l2),
            })
        }
        BenchOp::Append => {
            // one new token per sequence at its last position (the lengths count it)
            let rows: Vec<T> = random_matrix(seed ^ 0xa99e, b, hkv * d, hkv * d, Dist::Normal { std: 1.0 });
            let dk = ctx.upload(&rows)?;
            let kv = dk.view(&[b, hkv, d], &[hkv * d, d, 1])?;
            let appended = AppendBatch::new(ctx, &vec![1; b])?;
            cache.append(0, &kv, &kv, &batches[0], &appended)?;
            // check the written rows
            let got = cache.layer(0)?.to_host()?;
            let mut bad = 0usize;
            for s in 0..b {
                let pos = case.lengths[s] - 1;
                let page = all_tables[0][s][pos / t] as usize;
                for h in 0..hkv {
                    for kvh in 0..2 {
                        let base = super::reference::slot(&cfg, page, kvh, pos % t, h);
                        for c in 0..d {
                            let mut e = [0u8; 2];
                            encode(&cfg, rows[(s * hkv + h) * d + c].to_f64() as f32, scale, &mut e[..eb]);
                            if got[(base + c) * eb..(base + c + 1) * eb] != e[..eb] {
                                bad += 1;
                            }
                        }
                    }
                }
            }
            if bad > 0 {
                return Err(Error::Unsupported(format!(
                    "{}: {bad} appended elements are wrong",
                    case.name()
                )));
            }
            let tm = time_median(ctx, timing, |_| cache.append(0, &kv, &kv, &batches[0], &appended))?;
            let ms = tm.median_ms;
            let bytes = b * hkv * d * 2 * eb;
            Ok(BenchOutcome {
                case: case.name(),
                params: case.params(),
                implementation: case.implementation(),
                ms,
                gbps: Some(bytes as f64 / ms / 1e6),
                tflops: None,
                extra_mib: Some(0.0),
                max_abs_err: Some(0.0),
                rel_l2: Some(0.0),
            })
        }
    }
}
