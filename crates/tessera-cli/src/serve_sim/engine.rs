//! What runs the phases of a step: the [`Engine`] trait, the dry run's [`DryEngine`] and the
//! [`GpuEngine`], which runs the layer stack on the device (the paged KV cache of every layer,
//! the random Q/K/V pool, the prefill and decode kernels, CUDA event timing) and the
//! correctness check against the CPU reference.

use std::time::{Duration, Instant};

use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use tessera::attention::{AttentionOptions, AttentionPlan, AttentionProblem, AttentionTuning, VarlenBatch};
use tessera::check::compare;
use tessera::kvcache::decode::{DecodeOptions, DecodePlan};
use tessera::kvcache::reference::{decode_reference, gather_sequence};
use tessera::kvcache::{AppendBatch, KvCacheConfig, PagedBatch, PagedKvCache};
use tessera::runtime::{Context, DeviceBuffer, EventTimer};
use tessera::testdata::{random_matrix, Dist};
use tessera::{DType, Error};

use super::scheduler::{DecodePhase, PrefillItem, Scheduler};
use super::{HEADS_KV, HEADS_Q, HEAD_DIM};

/// Timing of one phase as an engine ran it.
#[derive(Clone, Copy, Debug, Default)]
pub struct PhaseTiming {
    /// GPU time (CUDA events), `None` without a GPU.
    pub gpu_ms: Option<f64>,
    /// Host time spent planning and uploading (tables, plans, batch descriptions).
    pub plan: Duration,
}

/// What runs the phases of a step: the GPU, or nothing (dry run).
pub trait Engine {
    fn prefill(&mut self, sched: &Scheduler, items: &[PrefillItem]) -> tessera::Result<PhaseTiming>;
    fn decode(&mut self, sched: &Scheduler, phase: &DecodePhase) -> tessera::Result<PhaseTiming>;
}

/// The dry run: no device work.
pub struct DryEngine;

impl Engine for DryEngine {
    fn prefill(&mut self, _: &Scheduler, _: &[PrefillItem]) -> tessera::Result<PhaseTiming> {
        Ok(PhaseTiming::default())
    }
    fn decode(&mut self, _: &Scheduler, _: &DecodePhase) -> tessera::Result<PhaseTiming> {
        Ok(PhaseTiming::default())
    }
}

/// Which slice of the random pool a tensor takes.
#[derive(Clone, Copy)]
enum Slot {
    PrefillQ = 1,
    PrefillK,
    PrefillV,
    PrefillNewK,
    PrefillNewV,
    DecodeQ,
    DecodeNewK,
    DecodeNewV,
}

/// Offset (elements, a multiple of 64: 128-byte aligned) of an `elems`-element slice of a
/// `pool_len`-element pool, varying with (step, layer, slot).
fn pool_offset(seed: u64, pool_len: usize, step: u64, layer: usize, slot: Slot, elems: usize) -> usize {
    let mut h = seed ^ step.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (layer as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= (slot as u64).wrapping_mul(0x94d0_49bb_1331_11eb);
    h = (h ^ (h >> 31)).wrapping_mul(0xd6e8_feb8_6659_fd93);
    h ^= h >> 32;
    let room = (pool_len - elems) / 64;
    (h % (room as u64 + 1)) as usize * 64
}

/// When the correctness check runs.
#[derive(Clone, Copy, Debug)]
pub struct CheckPolicy {
    pub enabled: bool,
    /// The first check runs at the first decode step from this step on.
    pub first: u64,
    /// Then every this many steps.
    pub every: Option<u64>,
}

/// One correctness check.
#[derive(Clone, Debug, Serialize)]
pub struct CheckResult {
    pub step: u64,
    pub request: usize,
    pub seq_len: usize,
    /// Prompt tokens of the sequence that sit in shared (prefix-cached) pages.
    pub cached_prefix: usize,
    pub layer: usize,
    pub rel_l2: f64,
    pub max_abs_err: f64,
    pub nan: usize,
    pub budget: f64,
    pub passed: bool,
}

/// The device side: the paged cache of every layer, the random pool, plans and timers.
pub struct GpuEngine {
    ctx: Context,
    cfg: KvCacheConfig,
    layers: usize,
    max_batch: usize,
    seed: u64,
    cache: PagedKvCache,
    pool: DeviceBuffer<f16>,
    pool_host: Vec<f16>,
    prefill_out: DeviceBuffer<f16>,
    /// `[2][max_batch][Hq][D]`: layer 0 writes the first half (kept for the check), the other
    /// layers the second.
    decode_out: DeviceBuffer<f16>,
    prefill_batch: PagedBatch,
    decode_batch: PagedBatch,
    decode_plan: Option<DecodePlan>,
    decode_append: Option<AppendBatch>,
    timer: EventTimer,
    check: CheckPolicy,
    next_check: Option<u64>,
    pub checks: Vec<CheckResult>,
}

impl GpuEngine {
    /// Allocates the cache, the pool (filled with seeded normal values), the outputs and the
    /// batch tables. `max_prefill_rows`: the most prompt tokens one prefill step can hold.
    pub fn new(
        ctx: &Context,
        cfg: KvCacheConfig,
        max_batch: usize,
        max_seq_tokens: usize,
        max_prefill_rows: usize,
        seed: u64,
        check: CheckPolicy,
    ) -> tessera::Result<GpuEngine> {
        let layers = cfg.num_layers;
        let cache = PagedKvCache::new(ctx, cfg.clone())?;
        // the largest slice is a prefill's queries (keys are Hkv / Hq of that); the pool is
        // twice that, so slices move around
        let max_slice = max_prefill_rows * HEADS_Q * HEAD_DIM;
        let cols = tessera::testdata::BLOCK;
        let rows = (2 * max_slice).div_ceil(cols);
        let pool_host: Vec<f16> = random_matrix(seed, rows, cols, cols, Dist::Normal { std: 1.0 });
        let pool = ctx.upload(&pool_host)?;
        let max_pages = max_batch * cfg.pages_for(max_seq_tokens);
        Ok(GpuEngine {
            prefill_out: ctx.alloc(max_slice)?,
            decode_out: ctx.alloc(2 * max_batch * HEADS_Q * HEAD_DIM)?,
            prefill_batch: PagedBatch::new(ctx, max_batch, max_pages)?,
            decode_batch: PagedBatch::new(ctx, max_batch, max_pages)?,
            decode_plan: None,
            decode_append: None,
            timer: EventTimer::new(ctx)?,
            ctx: ctx.clone(),
            layers,
            max_batch,
            seed,
            cache,
            pool,
            pool_host,
            cfg,
            next_check: check.enabled.then_some(check.first),
            check,
            checks: Vec::new(),
        })
    }

    /// Device bytes of the pool, the outputs and the cache.
    pub fn device_bytes(&self) -> usize {
        self.pool.bytes()
            + self.prefill_out.bytes()
            + self.decode_out.bytes()
            + self.cfg.layer_bytes().unwrap_or(0) * self.layers
    }

    fn offset(&self, step: u64, layer: usize, slot: Slot, elems: usize) -> usize {
        pool_offset(self.seed, self.pool.len(), step, layer, slot, elems)
    }

    /// Compiles and loads every kernel the run uses (attention with and without split-KV,
    /// append, decode), so that the first steps do not time the JIT.
    pub fn warm_up(&mut self) -> tessera::Result<()> {
        let (hq, hkv, d) = (HEADS_Q, HEADS_KV, HEAD_DIM);
        let (nq, nk) = (64usize, 512usize);
        let vb = VarlenBatch::new(&self.ctx, &[0, nq as i32], &[0, nk as i32])?;
        let problem = AttentionProblem::varlen(&vb, hq, hkv, d, DType::F16);
        for splits in [1, 2] {
            let opts = AttentionOptions {
                causal: true,
                tuning: AttentionTuning {
                    num_splits: Some(splits),
                    ..Default::default()
                },
                ..Default::default()
            };
            let plan = AttentionPlan::new(&self.ctx, &problem, &opts)?;
            let q = self.pool.view_at(0, &[nq, hq, d], &[hq * d, d, 1])?;
            let kv = self.pool.view_at(0, &[nk, hkv, d], &[hkv * d, d, 1])?;
            let mut o = self.prefill_out.view_mut(&[nq, hq, d], &[hq * d, d, 1])?;
            plan.run(&q, &kv, &kv, &mut o, None, Some(&vb))?;
        }
        // one row into page 0 of layer 0 (no sequence holds it yet), then a decode over it
        self.decode_batch.update(&self.cfg, &[&[0]], &[1])?;
        let appended = AppendBatch::new(&self.ctx, &[1])?;
        let row = self.pool.view_at(0, &[1, hkv, d], &[hkv * d, d, 1])?;
        self.cache.append(0, &row, &row, &self.decode_batch, &appended)?;
        let plan = DecodePlan::new(&self.ctx, &self.cfg, hq, &[1], &DecodeOptions::default())?;
        let q = self.pool.view_at(0, &[1, 1, hq, d], &[hq * d, hq * d, d, 1])?;
        let mut o = self.decode_out.view_mut(&[1, 1, hq, d], &[hq * d, hq * d, d, 1])?;
        plan.run(&q, &self.cache, 0, &self.decode_batch, &mut o, None)?;
        self.ctx.synchronize()
    }

    fn check_due(&self, step: u64) -> bool {
        self.next_check.is_some_and(|s| step >= s)
    }

    /// Compares this step's layer-0 decode of one sequence with the f64 reference over K/V
    /// gathered from the device pages by the block manager's table.
    fn run_check(&self, sched: &Scheduler, phase: &DecodePhase, q_offset: usize) -> tessera::Result<CheckResult> {
        let step = sched.step();
        let items = &phase.items;
        let mut rng = StdRng::seed_from_u64(self.seed ^ step);
        let hits: Vec<usize> = (0..items.len()).filter(|&i| items[i].cached > 0).collect();
        let idx = if hits.is_empty() {
            rng.random_range(0..items.len())
        } else {
            hits[rng.random_range(0..hits.len())]
        };
        let it = &items[idx];
        let (hq, hkv, d) = (HEADS_Q, HEADS_KV, HEAD_DIM);
        let layer = self.cache.layer(0)?.to_host()?;
        let scales = match self.cfg.dtype {
            DType::F8E4M3 => Some(self.cache.scales(0)?.to_host()?),
            _ => None,
        };
        let table: Vec<i32> = sched.block_table(it.seq)?.iter().map(|&p| p as i32).collect();
        let (k, v) = gather_sequence(&self.cfg, &layer, scales.as_deref(), &table, it.len);
        let q0 = q_offset + idx * hq * d;
        let q: Vec<f64> = self.pool_host[q0..q0 + hq * d].iter().map(|x| x.to_f64()).collect();
        let want = decode_reference(&q, &[k], &[v], 1, hq, hkv, d, 1.0 / (d as f64).sqrt());
        let out = self.decode_out.to_host()?;
        let got: Vec<f64> = out[idx * hq * d..(idx + 1) * hq * d]
            .iter()
            .map(|x| x.to_f64())
            .collect();
        let cmp = compare(&got, &want.o, 1e-2, 1e-2);
        // the reference reads the same (dequantised) cache values, so the query dtype's budget
        let budget = DType::F16.rel_l2_budget();
        Ok(CheckResult {
            step,
            request: it.req,
            seq_len: it.len,
            cached_prefix: it.cached,
            layer: 0,
            rel_l2: cmp.rel_l2,
            max_abs_err: cmp.max_abs_err,
            nan: cmp.nan_count,
            budget,
            passed: cmp.passes(budget),
        })
    }
}

impl Engine for GpuEngine {
    fn prefill(&mut self, sched: &Scheduler, items: &[PrefillItem]) -> tessera::Result<PhaseTiming> {
        let t0 = Instant::now();
        let (hq, hkv, d) = (HEADS_Q, HEADS_KV, HEAD_DIM);
        let step = sched.step();
        let (mut cu_q, mut cu_k) = (vec![0i32], vec![0i32]);
        for it in items {
            cu_q.push(cu_q[cu_q.len() - 1] + it.suffix() as i32);
            cu_k.push(cu_k[cu_k.len() - 1] + it.len as i32);
        }
        let (nq, nk) = (cu_q[items.len()] as usize, cu_k[items.len()] as usize);
        let tables = items
            .iter()
            .map(|it| sched.block_table(it.seq))
            .collect::<tessera::Result<Vec<_>>>()?;
        let lens: Vec<usize> = items.iter().map(|it| it.len).collect();
        self.prefill_batch.update(&self.cfg, &tables, &lens)?;
        let counts: Vec<usize> = items.iter().map(PrefillItem::suffix).collect();
        let appended = AppendBatch::new(&self.ctx, &counts)?;
        let vb = VarlenBatch::new(&self.ctx, &cu_q, &cu_k)?;
        let problem = AttentionProblem::varlen(&vb, hq, hkv, d, DType::F16);
        let opts = AttentionOptions {
            causal: true,
            ..Default::default()
        };
        let plan = AttentionPlan::new(&self.ctx, &problem, &opts)?;
        let offsets: Vec<[usize; 5]> = (0..self.layers)
            .map(|l| {
                [
                    self.offset(step, l, Slot::PrefillQ, nq * hq * d),
                    self.offset(step, l, Slot::PrefillK, nk * hkv * d),
                    self.offset(step, l, Slot::PrefillV, nk * hkv * d),
                    self.offset(step, l, Slot::PrefillNewK, nq * hkv * d),
                    self.offset(step, l, Slot::PrefillNewV, nq * hkv * d),
                ]
            })
            .collect();
        let plan_time = t0.elapsed();

        let (q_st, kv_st) = ([hq * d, d, 1], [hkv * d, d, 1]);
        self.timer.start()?;
        for (l, off) in offsets.iter().enumerate() {
            let q = self.pool.view_at(off[0], &[nq, hq, d], &q_st)?;
            let k = self.pool.view_at(off[1], &[nk, hkv, d], &kv_st)?;
            let v = self.pool.view_at(off[2], &[nk, hkv, d], &kv_st)?;
            let mut o = self.prefill_out.view_mut(&[nq, hq, d], &q_st)?;
            plan.run(&q, &k, &v, &mut o, None, Some(&vb))?;
            let new_k = self.pool.view_at(off[3], &[nq, hkv, d], &kv_st)?;
            let new_v = self.pool.view_at(off[4], &[nq, hkv, d], &kv_st)?;
            self.cache.append(l, &new_k, &new_v, &self.prefill_batch, &appended)?;
        }
        let ms = self.timer.stop_ms()?;
        Ok(PhaseTiming {
            gpu_ms: Some(ms),
            plan: plan_time,
        })
    }

    fn decode(&mut self, sched: &Scheduler, phase: &DecodePhase) -> tessera::Result<PhaseTiming> {
        let t0 = Instant::now();
        let (hq, hkv, d) = (HEADS_Q, HEADS_KV, HEAD_DIM);
        let step = sched.step();
        let items = &phase.items;
        let b = items.len();
        let tables = items
            .iter()
            .map(|it| sched.block_table(it.seq))
            .collect::<tessera::Result<Vec<_>>>()?;
        let lens: Vec<usize> = items.iter().map(|it| it.len).collect();
        self.decode_batch.update(&self.cfg, &tables, &lens)?;
        if let Some(p) = self.decode_plan.as_mut().filter(|p| p.batch() == b) {
            p.update(&lens)?;
        } else {
            self.decode_plan = Some(DecodePlan::new(
                &self.ctx,
                &self.cfg,
                hq,
                &lens,
                &DecodeOptions::default(),
            )?);
        }
        if self.decode_append.as_ref().is_none_or(|a| a.batch() != b) {
            self.decode_append = Some(AppendBatch::new(&self.ctx, &vec![1; b])?);
        }
        let offsets: Vec<[usize; 3]> = (0..self.layers)
            .map(|l| {
                [
                    self.offset(step, l, Slot::DecodeQ, b * hq * d),
                    self.offset(step, l, Slot::DecodeNewK, b * hkv * d),
                    self.offset(step, l, Slot::DecodeNewV, b * hkv * d),
                ]
            })
            .collect();
        let plan_time = t0.elapsed();

        let check = self.check_due(step);
        if check {
            self.decode_out.fill_bytes(0xff)?; // NaN: an unwritten output fails the check
        }
        let (Some(plan), Some(appended)) = (&self.decode_plan, &self.decode_append) else {
            return Err(Error::invalid("decode", "no plan"));
        };
        let shape = [b, 1, hq, d];
        let q_st = [hq * d, hq * d, d, 1];
        let kv_st = [hkv * d, d, 1];
        let half = self.max_batch * hq * d;
        self.timer.start()?;
        if !phase.copies.is_empty() {
            self.cache.copy_pages(&phase.copies)?;
        }
        for (l, off) in offsets.iter().enumerate() {
            let new_k = self.pool.view_at(off[1], &[b, hkv, d], &kv_st)?;
            let new_v = self.pool.view_at(off[2], &[b, hkv, d], &kv_st)?;
            self.cache.append(l, &new_k, &new_v, &self.decode_batch, appended)?;
            let q = self.pool.view_at(off[0], &shape, &q_st)?;
            let mut o = self
                .decode_out
                .view_mut_at(if l == 0 { 0 } else { half }, &shape, &q_st)?;
            plan.run(&q, &self.cache, l, &self.decode_batch, &mut o, None)?;
        }
        let ms = self.timer.stop_ms()?;
        if check {
            let r = self.run_check(sched, phase, offsets[0][0])?;
            self.checks.push(r);
            self.next_check = self.check.every.map(|n| step + n.max(1));
        }
        Ok(PhaseTiming {
            gpu_ms: Some(ms),
            plan: plan_time,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_offsets_stay_inside_and_aligned() {
        for step in 0..50 {
            for l in 0..4 {
                let off = pool_offset(1, 10_000, step, l, Slot::DecodeQ, 4096);
                assert!(off % 64 == 0 && off + 4096 <= 10_000);
            }
        }
        assert_eq!(pool_offset(1, 4096, 3, 0, Slot::PrefillK, 4096), 0);
        let a = pool_offset(1, 1 << 20, 3, 0, Slot::PrefillK, 4096);
        let b = pool_offset(1, 1 << 20, 3, 1, Slot::PrefillK, 4096);
        assert_ne!(a, b, "layers read different slices");
    }
}
