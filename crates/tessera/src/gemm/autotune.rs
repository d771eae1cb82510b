//! Autotune of the Hopper path's tiling and K splits ([`GemmTuning::autotune`]).
//!
//! The dispatcher's rules ([`choose_tile`](super::hopper) by waves, [`hopper_splits`] by SM
//! count) pick well on most shapes but are rules of thumb. With `autotune` on, planning a
//! problem times at most [`MAX_CANDIDATES`] (tiling, splits) pairs around the rules' choice once
//! per dispatch key, on scratch operands of the problem's shape (random values, packed
//! layouts, no epilogue operands: the main loop is what the candidates differ in), with CUDA
//! events (warm-up, then the best of [`TIMED_RUNS`]), and keeps the fastest. The choice is
//! remembered in the process and persisted in `<kernel cache dir>/gemm-autotune.tsv` (one
//! `key<TAB>block_n<TAB>splits` line per key, written atomically by rename), so a key is timed once per machine, at planning,
//! never on the hot path. A missing or unreadable file only means timing again.
//!
//! Keyed by: device name, arch, precision, output dtype, M, N, K, B's layout, scales. Batched
//! problems are not tuned (the rules apply).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

use super::plan::{hopper_splits, GemmOptions, GemmPath, GemmPlan, GemmTuning};
use super::problem::{COperand, GemmEpilogue, GemmOperands, GemmProblem, GemmScales, Layout};
use crate::dtype::DType;
use crate::error::Result;
use crate::runtime::{Context, EventTimer};

/// Most (tiling, splits) pairs timed per key.
pub const MAX_CANDIDATES: usize = 4;
/// Timed runs per candidate (the best counts), after two warm-up runs.
const TIMED_RUNS: usize = 5;
/// The persisted choices' file name in the kernel cache directory.
const FILE: &str = "gemm-autotune.tsv";

/// A Hopper tiling width (`block_n`, 128 or 256) and K split count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HopperChoice {
    pub block_n: u32,
    pub splits: u32,
}

static CHOICES: Mutex<Option<HashMap<String, HopperChoice>>> = Mutex::new(None);

/// The dispatch key of `p` on `ctx`'s device.
pub fn key(ctx: &Context, p: &GemmProblem) -> String {
    format!(
        "{} {} {} ->{} {}x{}x{} b{} {:?}",
        ctx.info().name,
        ctx.arch(),
        p.precision.name(),
        p.out,
        p.m,
        p.n,
        p.k,
        if p.b_layout == Layout::ColMajor { "nk" } else { "kn" },
        p.scales
    )
}

fn file() -> Option<PathBuf> {
    crate::runtime::jit::default_cache_dir().map(|d| d.join(FILE))
}

/// The persisted choices (empty when the file is missing or unreadable; malformed lines are
/// skipped).
fn load() -> HashMap<String, HopperChoice> {
    let text = file().and_then(|f| std::fs::read_to_string(f).ok()).unwrap_or_default();
    parse(&text)
}

/// `key<TAB>block_n<TAB>splits` lines; others skipped.
pub fn parse(text: &str) -> HashMap<String, HopperChoice> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split('\t');
            let (key, bn, s) = (f.next()?, f.next()?, f.next()?);
            let choice = HopperChoice {
                block_n: bn.parse().ok().filter(|b| *b == 128 || *b == 256)?,
                splits: s.parse().ok().filter(|s| *s >= 1)?,
            };
            (f.next().is_none() && !key.is_empty()).then(|| (key.to_string(), choice))
        })
        .collect()
}

/// The lines of `choices`, sorted by key.
pub fn format(choices: &HashMap<String, HopperChoice>) -> String {
    let mut keys: Vec<&String> = choices.keys().collect();
    keys.sort();
    keys.iter()
        .map(|k| format!("{k}\t{}\t{}\n", choices[*k].block_n, choices[*k].splits))
        .collect()
}

/// Writes the choices (temporary file, then rename: readers see the old or the new file whole).
/// Failure to write is not an error: the next process times again.
fn store(choices: &HashMap<String, HopperChoice>) {
    let Some(path) = file() else { return };
    let tmp = path.with_extension(format!("tsv.{}", std::process::id()));
    let ok = path.parent().is_some_and(|d| std::fs::create_dir_all(d).is_ok())
        && std::fs::write(&tmp, format(choices)).is_ok()
        && std::fs::rename(&tmp, &path).is_ok();
    if !ok {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// The candidates for `p`: both tilings with the rules' splits, and when the rules split K,
/// half and twice as many splits on the narrow tiling (where valid); at most
/// [`MAX_CANDIDATES`], the rules' own choice first.
pub fn candidates(p: &GemmProblem, sm_count: u32) -> Result<Vec<HopperChoice>> {
    let (s0, _) = hopper_splits(p, sm_count, None)?;
    let tiles = |bn: usize| p.m.div_ceil(super::hopper::BLOCK_M) * p.n.div_ceil(bn);
    // the rules' tiling first (choose_tile's wave rule, for the ordering only)
    let first = super::hopper::choose_tile(p.m, p.n, p.batch, sm_count).block_n;
    let other = if first == 256 { 128 } else { 256 };
    let mut out = vec![
        HopperChoice {
            block_n: first,
            splits: s0 as u32,
        },
        HopperChoice {
            block_n: other,
            splits: s0 as u32,
        },
    ];
    if s0 > 1 {
        for s in [s0 / 2, s0 * 2] {
            if hopper_splits(p, sm_count, Some(s as u32)).is_ok() && tiles(128) * s <= 2 * sm_count as usize {
                out.push(HopperChoice {
                    block_n: 128,
                    splits: s as u32,
                });
            }
        }
    }
    out.dedup();
    out.truncate(MAX_CANDIDATES);
    Ok(out)
}

/// The (tiling, splits) for `p` on the Hopper path: remembered, persisted, or timed now.
pub fn hopper_choice(ctx: &Context, p: &GemmProblem) -> Result<HopperChoice> {
    let key = key(ctx, p);
    {
        let mut guard = CHOICES.lock().unwrap_or_else(|e| e.into_inner());
        let choices = guard.get_or_insert_with(load);
        if let Some(c) = choices.get(&key) {
            return Ok(*c);
        }
    }
    let best = time_candidates(ctx, p)?;
    let mut guard = CHOICES.lock().unwrap_or_else(|e| e.into_inner());
    let choices = guard.get_or_insert_with(load);
    // merge with what another process may have written meanwhile
    for (k, v) in load() {
        choices.entry(k).or_insert(v);
    }
    choices.insert(key, best);
    store(choices);
    Ok(best)
}

/// Times every candidate on scratch operands of `p`'s shape; the fastest.
fn time_candidates(ctx: &Context, p: &GemmProblem) -> Result<HopperChoice> {
    let input = p.input()?;
    // packed layouts, no epilogue operands, no scales (the main loop is what differs)
    let mut bare = GemmProblem::new(p.precision, p.out, p.m, p.n, p.k).b_layout(p.b_layout);
    bare.epilogue = GemmEpilogue {
        activation: p.epilogue.activation,
        ..GemmEpilogue::default()
    };
    bare.scales = GemmScales::None;
    let (br, bc) = bare.b_stored();
    let a = ctx.upload(&random_bytes(input, p.m * p.k, 1))?;
    let b = ctx.upload(&random_bytes(input, br * bc, 2))?;
    let mut d = ctx.alloc::<u8>(p.m * p.n * p.out.size())?;
    let timer = EventTimer::new(ctx)?;
    let mut best: Option<(f64, HopperChoice)> = None;
    for c in candidates(p, ctx.info().sm_count)? {
        let opts = GemmOptions {
            tuning: GemmTuning {
                path: GemmPath::Hopper,
                splits: Some(c.splits),
                hopper_block_n: Some(c.block_n),
                ..GemmTuning::default()
            },
        };
        let plan = GemmPlan::new(ctx, &bare, &opts)?;
        let ops = GemmOperands {
            a: a.view_as(input, &[p.m, p.k], &[p.k, 1])?,
            b: b.view_as(input, &[br, bc], &[bc, 1])?,
            c: COperand::None,
            bias: None,
            residual: None,
        };
        let mut run = || plan.run(1.0, 0.0, &ops, &mut d.view_mut_as(p.out, &[p.m, p.n], &[p.n, 1])?);
        run()?;
        run()?;
        let mut ms = f64::INFINITY;
        for _ in 0..TIMED_RUNS {
            timer.start()?;
            run()?;
            ms = ms.min(timer.stop_ms()?);
        }
        if best.is_none_or(|(t, _)| ms < t) {
            best = Some((ms, c));
        }
    }
    Ok(best.map_or(
        HopperChoice {
            block_n: 256,
            splits: 1,
        },
        |(_, c)| c,
    ))
}

/// `len` values of `dtype` uniform in [-1, 1) (int8: -64..=63) from a fixed seed, as bytes.
fn random_bytes(dtype: DType, len: usize, seed: u64) -> Vec<u8> {
    let size = dtype.size();
    let mut bytes = vec![0u8; len * size];
    let mut state = 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(seed) | 1;
    for i in 0..len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let u = (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
        if dtype == DType::I8 {
            bytes[i] = ((u * 64.0).floor() as i8) as u8;
        } else {
            crate::numeric::store(dtype, u, &mut bytes[i * size..]);
        }
    }
    bytes
}
