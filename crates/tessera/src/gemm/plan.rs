//! Dispatch and launch: [`GemmPlan::new`] validates a [`GemmProblem`], chooses a kernel path
//! ([`GemmPath`]), compiles it and sizes its workspace; [`GemmPlan::run`] checks one call's
//! operands against the plan and launches, allocating nothing.
//!
//! Dispatch ([`choose_path`]), by precision, shape, layout and alignment:
//! - fp64: [`GemmPath::Dmma`] on sm_80+, else [`GemmPath::Simt`];
//! - fp32 (exact): [`GemmPath::Simt`];
//! - fp16/bf16: [`GemmPath::Skinny`] for M <= 16 with B stored [N, K] and A row-major (decode);
//!   else, on sm_90, [`GemmPath::Hopper`] when its rules hold ([`hopper_rule_broken`]: A
//!   row-major, every leading dimension and batch stride a multiple of 16 bytes, K >= 1); else
//!   [`GemmPath::Sm80`] when A is row-major and the 16-byte rule holds (A and B 16-byte aligned;
//!   lda, ldb and their batch strides multiples of 16 bytes); else the slower
//!   [`GemmPath::Simt`] (any layout and alignment);
//! - tf32, fp8 (e4m3, e5m2) and int8 (tensor cores only; A row-major and B stored [N, K]):
//!   [`GemmPath::Hopper`] on sm_90 when its rules hold, else [`GemmPath::Sm80`] (sm_80+; fp8
//!   sm_89+) under the 16-byte rule; elsewhere an error that names the broken rule.
//! - a GLU epilogue ([`super::problem::Glu`]): as above without the skinny and DMMA paths (fp16/
//!   bf16: Hopper, sm80, else SIMT; fp32 and fp64: SIMT); forcing skinny or dmma is an error.

use std::sync::Arc;

use super::hopper::{self, HopperGemmArgs, HopperGemmPlan, HopperShapeKey};
use super::problem::{
    check_aligned, check_operands, COperand, GemmOperands, GemmProblem, GemmScaleOperands, GemmScales, Layout,
    Precision,
};
use super::{dmma, simt, skinny, sm80};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::runtime::{Arch, Context, DeviceBuffer, Kernel, KernelParams, KernelSpec, LaunchConfig, TensorViewMut};

/// A kernel path of the GEMM.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GemmPath {
    /// The dispatcher's choice (module docs).
    #[default]
    Auto,
    /// fp16/bf16 on the sm_80+ tensor cores (ldmatrix + mma.sync + cp.async), `gemm_sm80.cu`.
    Sm80,
    /// CUDA cores, any precision and alignment, `gemm_simt.cu`.
    Simt,
    /// fp16/bf16 decode, M <= 16 with B stored [N, K], split-K, `gemm_skinny.cu`.
    Skinny,
    /// fp64 on the DMMA tensor cores (sm_80+), `gemm_dmma.cu`.
    Dmma,
    /// sm_90a tensor cores (TMA + wgmma, warp-specialised, persistent): fp16, bf16, tf32, fp8,
    /// int8; `gemm_sm90.cu`.
    Hopper,
}

impl GemmPath {
    pub const ALL: [GemmPath; 6] = [
        GemmPath::Auto,
        GemmPath::Sm80,
        GemmPath::Simt,
        GemmPath::Skinny,
        GemmPath::Dmma,
        GemmPath::Hopper,
    ];
    pub const fn name(self) -> &'static str {
        match self {
            GemmPath::Auto => "auto",
            GemmPath::Sm80 => "sm80",
            GemmPath::Simt => "simt",
            GemmPath::Skinny => "skinny",
            GemmPath::Dmma => "dmma",
            GemmPath::Hopper => "hopper",
        }
    }
    pub fn parse(s: &str) -> Option<GemmPath> {
        GemmPath::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s.trim()))
    }
}

/// Forced kernel choices, for benchmarks and tests; the defaults are the dispatcher's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GemmTuning {
    /// The kernel path. Default [`GemmPath::Auto`]. A forced path that cannot run the problem
    /// is an error saying why.
    pub path: GemmPath,
    /// K splits of the skinny path (default `None`: enough CTAs for about four per SM) and of
    /// the Hopper path (default `None`: [`hopper_splits`]'s choice; a forced count must divide K
    /// into equal k-block multiples, else planning fails saying so).
    pub splits: Option<u32>,
    /// The Hopper path's tile width (`block_n`: 256 or 128). Default `None`: by waves.
    pub hopper_block_n: Option<u32>,
    /// The Hopper path's ping-pong schedule (128 x 128 tiles, each consumer warpgroup its own
    /// tile, in turns: one's epilogue overlaps the other's MMAs): `Some(true)` forces it (with
    /// `hopper_block_n` `None` or 128), `Some(false)` rules it out. Default `None`: the rules'.
    pub hopper_pingpong: Option<bool>,
    /// CTAs per thread-block cluster on the Hopper path: 2 share each B tile through TMA
    /// multicast, 1 runs without clusters. Default `None`: 2 where the tile rows pair up
    /// (`hopper::choose_cluster`) and the device co-schedules pairs.
    pub hopper_cluster: Option<u32>,
    /// Tile rows (cluster-tile rows with clusters) per group of the Hopper path's persistent
    /// tile order: the CTAs in flight together cover about `group` rows of tiles, so a group
    /// trades A's L2 reuse against B's. Default `None`: about sqrt(CTAs x tile width / 128),
    /// a near-square block of D (`hopper::group_rows`); larger values are clamped to the tile
    /// rows there are; 0 is an error.
    pub hopper_group_rows: Option<u32>,
    /// Pipeline stages of the fp64 DMMA path: 3 or 4 (4 needs 128 KiB of shared memory per
    /// CTA: sm_80 and sm_90; elsewhere an error). Default `None`: 3.
    pub dmma_stages: Option<u32>,
    /// On the Hopper path, time up to 4 (tiling, splits) candidates once per dispatch key at
    /// planning and keep the fastest, remembered on disk next to the kernel cache
    /// ([`autotune`](super::autotune)); forced `splits` or `hopper_block_n` are kept as given.
    /// Default false (the rules' choice; planning allocates and times nothing).
    pub autotune: bool,
}

/// Options of a GEMM plan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GemmOptions {
    /// Default: nothing forced.
    pub tuning: GemmTuning,
}

/// `struct GemmParams` of gemm_params.cuh (240 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct GemmParams {
    a: u64,
    b: u64,
    c: u64,
    bias: u64,
    residual: u64,
    d: u64,
    workspace: u64,
    lda: i64,
    ldb: i64,
    ldc: i64,
    ldr: i64,
    ldd: i64,
    stride_a: i64,
    stride_b: i64,
    stride_c: i64,
    stride_r: i64,
    stride_d: i64,
    alpha: f64,
    beta: f64,
    m: i32,
    n: i32,
    k: i32,
    batch: i32,
    a_col_major: i32,
    b_col_major: i32,
    activation: i32,
    has_c: i32,
    has_bias: i32,
    has_residual: i32,
    splits: i32,
    k_per_split: i32,
    scale_a: u64,
    scale_b: u64,
    scale_result: u64,
    amax: u64,
    scale_a_rows: i32,
    scale_b_cols: i32,
}
const _: () = assert!(std::mem::size_of::<GemmParams>() == 240);
// SAFETY: #[repr(C)]: 7 pointers as u64, 10 i64, 2 f64, 12 i32, 4 pointers as u64, 2 i32, in the
// order and of the types of the kernel's struct (const void*, long long, double, int); no padding
// (240 = 7*8 + 10*8 + 2*8 + 12*4 + 4*8 + 2*4, every u64 at a multiple of 8).
unsafe impl KernelParams for GemmParams {}

/// Why the 16-byte vector paths (sm80, skinny) cannot take this problem, or `None`.
pub fn vector_rule_broken(p: &GemmProblem) -> Option<Error> {
    let input = match p.precision {
        Precision::F32 | Precision::F64 => {
            return Some(Error::Unsupported(format!(
                "the tensor-core vector paths take fp16, bf16, tf32, fp8 or int8 inputs, not {}",
                p.precision.name()
            )))
        }
        _ => match p.input() {
            Ok(d) => d,
            Err(e) => return Some(e),
        },
    };
    if p.a_layout != Layout::RowMajor {
        return Some(Error::Unsupported(
            "the sm80 and skinny paths take a row-major A; a column-major A runs on the simt path".into(),
        ));
    }
    if input.size() != 2 && p.b_layout != Layout::ColMajor {
        return Some(Error::invalid(
            "b_layout",
            format!("{} inputs need B stored [N, K]", p.precision.name()),
        ));
    }
    let v = sm80::VEC_BYTES / input.size();
    let mut rules = vec![("lda", p.lda), ("ldb", p.ldb)];
    if p.batch > 1 {
        rules.extend([
            ("batch_stride_a", p.batch_stride_a),
            ("batch_stride_b", p.batch_stride_b),
        ]);
    }
    for (arg, x) in rules {
        if x % v != 0 {
            return Some(Error::invalid(
                arg,
                format!("{x} is not a multiple of {v} elements (16 bytes), which the vector paths' loads need"),
            ));
        }
    }
    None
}

/// Why the skinny path cannot take this problem, or `None`.
pub fn skinny_rule_broken(p: &GemmProblem) -> Option<Error> {
    if p.m > skinny::MAX_M {
        return Some(Error::Unsupported(format!(
            "the skinny path takes M <= {}, not {}",
            skinny::MAX_M,
            p.m
        )));
    }
    if p.b_layout != Layout::ColMajor {
        return Some(Error::Unsupported(
            "the skinny path takes B stored [N, K] (column-major)".into(),
        ));
    }
    if !matches!(p.precision, Precision::F16 | Precision::BF16) {
        return Some(Error::Unsupported(format!(
            "the skinny path takes fp16 or bf16 inputs, not {}",
            p.precision.name()
        )));
    }
    vector_rule_broken(p)
}

/// Why the Hopper path cannot take this problem on `arch`, or `None` (the rules that do not
/// depend on addresses; [`hopper::hopper_supports`] checks those at run time).
pub fn hopper_rule_broken(p: &GemmProblem, arch: Arch) -> Option<Error> {
    if arch != Arch::SM90 {
        return Some(Error::Unsupported(format!(
            "the Hopper (wgmma + TMA) path runs on sm_90 only; this device is {arch}"
        )));
    }
    let input = match p.input() {
        Ok(d) if hopper::HOPPER_OPERANDS.contains(&d) && p.precision != Precision::F32 => d,
        _ => {
            return Some(Error::Unsupported(format!(
                "the Hopper path takes fp16, bf16, tf32, fp8 or int8 inputs, not {}",
                p.precision.name()
            )))
        }
    };
    if !hopper::hopper_outputs(input).contains(&p.out) {
        return Some(Error::Unsupported(format!(
            "the Hopper path has no {} output for {} inputs",
            p.out,
            p.precision.name()
        )));
    }
    if p.a_layout != Layout::RowMajor {
        return Some(Error::Unsupported("the Hopper path takes a row-major A".into()));
    }
    if input.size() != 2 && p.b_layout != Layout::ColMajor {
        return Some(Error::invalid(
            "b_layout",
            format!("{} inputs need B stored [N, K]", p.precision.name()),
        ));
    }
    if p.k == 0 {
        return Some(Error::Unsupported("the Hopper path needs K >= 1".into()));
    }
    let (es, os) = (input.size(), p.out.size());
    let mut rules = vec![("lda", p.lda * es), ("ldb", p.ldb * es), ("ldd", p.ldd * os)];
    if p.epilogue.c {
        rules.push(("ldc", p.ldc * os));
    }
    if p.epilogue.residual {
        rules.push(("ldr", p.ldr * os));
    }
    if p.batch > 1 {
        rules.extend([
            ("batch_stride_a", p.batch_stride_a * es),
            ("batch_stride_b", p.batch_stride_b * es),
            ("batch_stride_d", p.batch_stride_d * os),
        ]);
        if p.epilogue.c {
            rules.push(("batch_stride_c", p.batch_stride_c * os));
        }
        if p.epilogue.residual {
            rules.push(("batch_stride_r", p.batch_stride_r * os));
        }
    }
    for (arg, bytes) in rules {
        if bytes % 16 != 0 {
            return Some(Error::invalid(
                arg,
                format!("{bytes} bytes is not a multiple of 16, which the Hopper path's TMA copies need"),
            ));
        }
        if bytes == 0 && arg.starts_with("batch_stride") {
            return Some(Error::invalid(
                arg,
                "0: an operand shared by every batch entry has no TMA batch stride",
            ));
        }
    }
    None
}

/// Most K splits of the Hopper path.
pub const HOPPER_MAX_SPLITS: usize = 64;

/// `(splits, k_per_split)` of the Hopper path for `p` on `sm_count` SMs: split K when the
/// output tiles (counted at 128 x 128) fill less than half the SMs (K-heavy shapes such as
/// 128 x 128 x 65536, which would otherwise run on one or two SMs), into the most equal parts
/// that keep at least [`HOPPER_MIN_SPLIT_BLOCKS`] k-blocks each, at most one CTA per SM and
/// [`HOPPER_MAX_SPLITS`], and divide K exactly into k-block multiples (each part is one batch
/// entry of the kernel; a ragged last part would read past K). Not for batched problems, an
/// i32 output (the reduction sums f32) or a GLU epilogue. `(1, K)` when not split. `forced` asks for a count:
/// 1 disables splitting; another that breaks these rules is an error.
pub fn hopper_splits(p: &GemmProblem, sm_count: u32, forced: Option<u32>) -> Result<(usize, usize)> {
    let bk = hopper::block_k(p.input()?);
    let fits = |s: usize| s >= 1 && p.k % s == 0 && (p.k / s) % bk == 0 && p.k / s >= HOPPER_MIN_SPLIT_BLOCKS * bk;
    // (a GLU's epilogue pairs gate and up columns of one accumulator: the reduction has none)
    // (an fp8 output's conversion and amax live in the Hopper epilogue, not in the reduction)
    let splittable = p.batch == 1 && p.out != DType::I32 && p.out.size() != 1 && !p.epilogue.glu.is_some();
    if let Some(f) = forced {
        let f = f as usize;
        if f <= 1 {
            return Ok((1, p.k));
        }
        if !splittable || !fits(f) || f > HOPPER_MAX_SPLITS {
            return Err(Error::invalid(
                "splits",
                format!(
                    "{f} K splits on the Hopper path: need batch 1, a float output, at most \
                     {HOPPER_MAX_SPLITS}, no GLU or fp8 output, and K = {} divided into equal parts of at least {} and a \
                     multiple of {bk}",
                    p.k,
                    HOPPER_MIN_SPLIT_BLOCKS * bk
                ),
            ));
        }
        return Ok((f, p.k / f));
    }
    let tiles = p.m.div_ceil(hopper::BLOCK_M) * p.n.div_ceil(128);
    let sms = sm_count.max(1) as usize;
    if !splittable || 2 * tiles > sms {
        return Ok((1, p.k));
    }
    let want = (sms / tiles).min(HOPPER_MAX_SPLITS);
    Ok((2..=want).rev().find(|&s| fits(s)).map_or((1, p.k), |s| (s, p.k / s)))
}

/// Fewest k-blocks per Hopper split (a part must fill the pipeline a few times over).
pub const HOPPER_MIN_SPLIT_BLOCKS: usize = 8;

/// The path the dispatcher takes for `p` on `arch`, or the reason a forced path cannot run it.
pub fn choose_path(p: &GemmProblem, arch: Arch, forced: GemmPath) -> Result<GemmPath> {
    let ampere = arch.major >= 8;
    let need_ampere =
        |what: &str| Error::Unsupported(format!("the {what} path needs sm_80 or newer; this device is {arch}"));
    if p.precision.tensor_core_only() && !matches!(forced, GemmPath::Auto | GemmPath::Hopper | GemmPath::Sm80) {
        return Err(Error::Unsupported(format!(
            "{} inputs run on the hopper and sm80 paths only, not {}",
            p.precision.name(),
            forced.name()
        )));
    }
    let glu = p.epilogue.glu;
    if glu.is_some() && matches!(forced, GemmPath::Skinny | GemmPath::Dmma) {
        return Err(Error::invalid(
            "glu",
            format!(
                "{} has no {} epilogue; the hopper, sm80 and simt paths (and auto) have",
                forced.name(),
                glu.name()
            ),
        ));
    }
    match forced {
        GemmPath::Auto => {}
        GemmPath::Hopper => {
            return match hopper_rule_broken(p, arch) {
                Some(e) => Err(e),
                None => Ok(GemmPath::Hopper),
            }
        }
        GemmPath::Simt => return Ok(GemmPath::Simt),
        GemmPath::Dmma => {
            if p.precision != Precision::F64 {
                return Err(Error::Unsupported(format!(
                    "the dmma path takes fp64, not {}",
                    p.precision.name()
                )));
            }
            return if ampere {
                Ok(GemmPath::Dmma)
            } else {
                Err(need_ampere("dmma"))
            };
        }
        GemmPath::Sm80 => return sm80_rule_broken(p, arch).map_or(Ok(GemmPath::Sm80), Err),
        GemmPath::Skinny => {
            return match skinny_rule_broken(p) {
                Some(e) => Err(e),
                None if ampere => Ok(GemmPath::Skinny),
                None => Err(need_ampere("skinny")),
            }
        }
    }
    Ok(match p.precision {
        Precision::F64 if ampere && !glu.is_some() => GemmPath::Dmma,
        Precision::F64 | Precision::F32 => GemmPath::Simt,
        Precision::F16 | Precision::BF16 if ampere => {
            if !glu.is_some() && skinny_rule_broken(p).is_none() {
                GemmPath::Skinny
            } else if hopper_rule_broken(p, arch).is_none() {
                GemmPath::Hopper
            } else if vector_rule_broken(p).is_none() {
                GemmPath::Sm80
            } else {
                GemmPath::Simt
            }
        }
        Precision::F16 | Precision::BF16 => GemmPath::Simt,
        Precision::Tf32 | Precision::Fp8E4M3 | Precision::Fp8E5M2 | Precision::Int8 => {
            match (hopper_rule_broken(p, arch), sm80_rule_broken(p, arch)) {
                (None, _) => GemmPath::Hopper,
                (Some(_), None) => GemmPath::Sm80,
                // on sm_90 the Hopper rule (a superset of the address rules) names the argument;
                // elsewhere the sm80 path is the only one
                (Some(h), Some(_)) if arch == Arch::SM90 => return Err(h),
                (Some(_), Some(s)) => return Err(s),
            }
        }
    })
}

/// Why the sm80 path cannot take `p` on `arch`, or `None`: the 16-byte rule
/// ([`vector_rule_broken`]), sm_80+ (fp8: sm_89+), and an output of [`sm80::outputs`].
pub fn sm80_rule_broken(p: &GemmProblem, arch: Arch) -> Option<Error> {
    if let Some(e) = vector_rule_broken(p) {
        return Some(e);
    }
    let input = match p.input() {
        Ok(d) => d,
        Err(e) => return Some(e),
    };
    if !sm80::arch_supports(input, arch) {
        let need = if input.size() == 1 && input != DType::I8 {
            "sm_89"
        } else {
            "sm_80"
        };
        return Some(Error::Unsupported(format!(
            "the sm80 path runs {} on {need} or newer; this device is {arch}",
            p.precision.name()
        )));
    }
    if !sm80::outputs(input).contains(&p.out) {
        return Some(Error::Unsupported(format!(
            "the sm80 path has no {} output for {} inputs",
            p.out,
            p.precision.name()
        )));
    }
    None
}

/// The DMMA pipeline depth: the default, or a forced one `arch` can hold.
pub(super) fn dmma_stages(forced: Option<u32>, arch: Arch) -> Result<usize> {
    let Some(s) = forced else { return Ok(dmma::STAGES) };
    let choices = dmma::stage_choices(arch);
    if choices.contains(&(s as usize)) {
        Ok(s as usize)
    } else {
        Err(Error::invalid(
            "dmma_stages",
            format!(
                "{s} DMMA pipeline stages on sm_{}{}: this device takes {choices:?}",
                arch.major, arch.minor
            ),
        ))
    }
}

/// Every kernel variant the dispatcher can produce for `arch` (what CI compiles).
pub fn kernel_specs(arch: Arch) -> Vec<KernelSpec> {
    let mut v: Vec<KernelSpec> = simt::all_variants().iter().map(|s| s.spec()).collect();
    if arch.major >= 8 {
        v.extend(sm80::variants(arch).iter().map(|s| s.spec()));
        v.extend(skinny::all_variants().iter().map(|s| s.spec()));
        v.extend([DType::F16, DType::BF16, DType::F32].map(skinny::reduce_spec));
        v.extend(dmma::stage_choices(arch).iter().map(|&s| dmma::spec(s)));
    }
    v.extend(super::glu::all_specs());
    v.extend(hopper::kernel_specs(arch));
    v
}

/// A planned GEMM: made once per problem, run many times.
pub struct GemmPlan {
    ctx: Context,
    problem: GemmProblem,
    path: GemmPath,
    kernel: Arc<Kernel>,
    config: LaunchConfig,
    /// Skinny split-K: the reduction, its launch and the f32 partials.
    reduce: Option<(Arc<Kernel>, LaunchConfig)>,
    workspace: Option<DeviceBuffer<f32>>,
    splits: usize,
    k_per_split: usize,
    /// Byte alignment the path needs of A's and B's addresses (1: none).
    operand_align: u64,
    /// The Hopper path's own plan (tensor maps, persistent grid).
    hopper: Option<HopperGemmPlan>,
}

impl std::fmt::Debug for GemmPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GemmPlan")
            .field("path", &self.path)
            .field("kernel", &self.kernel.name)
            .field("splits", &self.splits)
            .finish()
    }
}

impl GemmPlan {
    /// Validates `problem`, chooses the path (or takes `opts.tuning.path`), compiles the kernel
    /// and allocates the split-K workspace when the skinny path splits K.
    pub fn new(ctx: &Context, problem: &GemmProblem, opts: &GemmOptions) -> Result<GemmPlan> {
        problem.validate()?;
        let input = problem.input()?;
        let arch = ctx.arch();
        let path = choose_path(problem, arch, opts.tuning.path)?;
        // the kernels' N: B's columns (2N with a GLU, whose D has N)
        let (m, n, batch) = (problem.m, problem.b_n(), problem.batch);
        let glu = problem.epilogue.glu.is_some();
        let mut splits = 1;
        let mut k_per_split = problem.k;
        let mut reduce = None;
        let mut workspace = None;
        if path == GemmPath::Hopper {
            let sms = ctx.info().sm_count;
            let tuning = &opts.tuning;
            let (forced_splits, forced_block_n) = if tuning.autotune
                && tuning.splits.is_none()
                && tuning.hopper_block_n.is_none()
                && tuning.hopper_pingpong.is_none()
                && batch == 1
            {
                let c = super::autotune::hopper_choice(ctx, problem)?;
                (Some(c.splits), Some(c.block_n))
            } else {
                (tuning.splits, tuning.hopper_block_n)
            };
            (splits, k_per_split) = hopper_splits(problem, sms, forced_splits)?;
            // split K: `splits` partial products over equal k ranges, run as a batch (entry s
            // reads A and B from k = s * k_per_split on; the scales apply to each part), summed in
            // order into D with the epilogue by the split-K reduction
            // (the Hopper plan takes D's N; with a GLU it reads 2N columns of B itself)
            let key = HopperShapeKey {
                m,
                n: problem.n,
                k: k_per_split,
                batch: if splits > 1 { splits } else { batch },
                b_nk: problem.b_layout == Layout::ColMajor,
                dtype: input,
                out_dtype: if splits > 1 { DType::F32 } else { problem.out },
                glu,
            };
            if splits > 1 {
                reduce = Some((
                    ctx.kernel(&skinny::reduce_spec(problem.out))?,
                    skinny::reduce_config(m * problem.n, sms),
                ));
                workspace = Some(ctx.alloc::<f32>(splits * m * problem.n)?);
            }
            let tile = match (forced_block_n, tuning.hopper_pingpong) {
                (None | Some(128), Some(true)) => hopper::PINGPONG_TILE,
                (Some(bn), Some(true)) => {
                    return Err(Error::invalid(
                        "hopper_block_n",
                        format!("{bn} with hopper_pingpong: the ping-pong tiles are 128 columns wide"),
                    ))
                }
                // the rules pick a cooperative tiling (ping-pong is opt-in until measured)
                (None, _) => hopper::choose_tile(key.m, key.b_n(), key.batch, sms),
                (Some(bn), _) => match hopper::TILES.iter().find(|t| t.block_n == bn && !t.pingpong) {
                    Some(tile) => *tile,
                    None => {
                        return Err(Error::invalid(
                            "hopper_block_n",
                            format!("{bn}: the Hopper tilings are 256 and 128 columns wide"),
                        ))
                    }
                },
            };
            let hp = HopperGemmPlan::with_tile(ctx, &key, tile, tuning.hopper_cluster, tuning.hopper_group_rows)?;
            return Ok(GemmPlan {
                ctx: ctx.clone(),
                problem: problem.clone(),
                path,
                kernel: hp.kernel().clone(),
                config: hp.launch_config(),
                reduce,
                workspace,
                splits,
                k_per_split,
                operand_align: 16,
                hopper: Some(hp),
            });
        }
        let (spec, config, operand_align) = match path {
            GemmPath::Sm80 => {
                let v = sm80::Sm80Variant {
                    input,
                    out: problem.out,
                    b_col_major: problem.b_layout == Layout::ColMajor,
                    glu,
                };
                (v.spec(), sm80::Sm80Variant::launch_config(m, n, batch), 16)
            }
            GemmPath::Simt => {
                let v = simt::SimtVariant {
                    input,
                    out: problem.out,
                    glu,
                };
                (v.spec(), v.launch_config(m, n, batch), 1)
            }
            GemmPath::Dmma => {
                let stages = dmma_stages(opts.tuning.dmma_stages, ctx.arch())?;
                (dmma::spec(stages), dmma::launch_config(m, n, batch, stages), 1)
            }
            GemmPath::Skinny => {
                let sms = ctx.info().sm_count;
                (splits, k_per_split) = skinny::choose_splits(n, problem.k, batch, sms, opts.tuning.splits);
                if splits > 1 {
                    let elements = batch * m * n;
                    reduce = Some((
                        ctx.kernel(&skinny::reduce_spec(problem.out))?,
                        skinny::reduce_config(elements, sms),
                    ));
                    workspace = Some(ctx.alloc::<f32>(splits * elements)?);
                }
                let v = skinny::SkinnyVariant {
                    input,
                    out: problem.out,
                };
                (v.spec(), skinny::SkinnyVariant::launch_config(n, splits, batch), 16)
            }
            GemmPath::Auto | GemmPath::Hopper => unreachable!("choose_path resolves these"),
        };
        if config.grid.1 > 65535 {
            return Err(Error::invalid(
                "m",
                format!("{m} rows need {} CTA rows, more than the grid's 65535", config.grid.1),
            ));
        }
        let kernel = ctx.kernel(&spec)?;
        Ok(GemmPlan {
            ctx: ctx.clone(),
            problem: problem.clone(),
            path,
            kernel,
            config,
            reduce,
            workspace,
            splits,
            k_per_split,
            operand_align,
            hopper: None,
        })
    }

    /// The path this plan runs.
    pub fn path(&self) -> GemmPath {
        self.path
    }
    /// K splits (skinny path; 1 elsewhere).
    pub fn splits(&self) -> usize {
        self.splits
    }
    pub fn problem(&self) -> &GemmProblem {
        &self.problem
    }
    /// The kernel variant's name.
    pub fn kernel_name(&self) -> &str {
        &self.kernel.name
    }

    /// `D = act(alpha * A @ B + beta * C + bias) + R` for the planned problem. The operands must
    /// match the plan (dtypes, shapes, strides, which epilogue terms); on any violation nothing is
    /// launched and D is untouched. alpha and beta must be finite (beta is ignored without C).
    pub fn run(&self, alpha: f64, beta: f64, ops: &GemmOperands<'_>, d: &mut TensorViewMut<'_>) -> Result<()> {
        self.run_scaled(alpha, beta, ops, &GemmScaleOperands::default(), d)
    }

    /// [`GemmPlan::run`] with the dequantisation scales the problem declares
    /// ([`GemmScales`]): f32 `scale_a` `[1]` or `[M]` and `scale_b` `[1]` or `[N]`, contiguous;
    /// and for an fp8 output the optional result scale (`scales.result`, f32 `[1]`).
    pub fn run_scaled(
        &self,
        alpha: f64,
        beta: f64,
        ops: &GemmOperands<'_>,
        scales: &GemmScaleOperands<'_>,
        d: &mut TensorViewMut<'_>,
    ) -> Result<()> {
        self.launch(alpha, beta, ops, scales, d, 0)
    }

    /// [`GemmPlan::run_scaled`] for an fp8 output that also writes the output's amax into
    /// `amax` (f32 `[1]`): `max |d|` over every element of D, `d` the epilogue's f32 value
    /// before the result scale and the fp8 conversion (what the next step's scale is computed
    /// from; NaN when any `d` is NaN). `amax` is zeroed on the stream first, then raised by the
    /// kernel; it is complete when the call's stream work is. Errors (nothing written): a
    /// non-fp8 output, `amax` not f32 `[1]`, or the errors of [`GemmPlan::run_scaled`].
    pub fn run_scaled_amax(
        &self,
        alpha: f64,
        beta: f64,
        ops: &GemmOperands<'_>,
        scales: &GemmScaleOperands<'_>,
        d: &mut TensorViewMut<'_>,
        amax: &mut TensorViewMut<'_>,
    ) -> Result<()> {
        if self.problem.out.size() != 1 {
            return Err(Error::invalid(
                "amax",
                format!(
                    "the output amax is computed for fp8 outputs (fp8e4m3, fp8e5m2), not {}",
                    self.problem.out
                ),
            ));
        }
        if amax.dtype() != DType::F32 || amax.shape() != [1] {
            return Err(Error::invalid(
                "amax",
                format!("{} view {:?}; the amax is fp32 [1]", amax.dtype(), amax.shape()),
            ));
        }
        check_aligned("amax", amax.device_ptr(), 4, "an f32 written by atomics")?;
        self.launch(alpha, beta, ops, scales, d, amax.device_ptr())
    }

    /// Validates one call and launches it; `amax` is the device address of the f32 amax (0 =
    /// none; fp8 outputs only, checked by the caller).
    fn launch(
        &self,
        alpha: f64,
        beta: f64,
        ops: &GemmOperands<'_>,
        scales: &GemmScaleOperands<'_>,
        d: &mut TensorViewMut<'_>,
        amax: u64,
    ) -> Result<()> {
        let p = &self.problem;
        check_operands(p, ops, d)?;
        check_scales(p, scales)?;
        if !alpha.is_finite() {
            return Err(Error::invalid("alpha", format!("{alpha} is not finite")));
        }
        if p.epilogue.c && !beta.is_finite() {
            return Err(Error::invalid("beta", format!("{beta} is not finite")));
        }
        if self.operand_align > 1 {
            let why = format!("the {} path's 16-byte loads", self.path.name());
            check_aligned("a", ops.a.device_ptr(), self.operand_align, &why)?;
            check_aligned("b", ops.b.device_ptr(), self.operand_align, &why)?;
        }
        if p.out == DType::I32 && alpha != 1.0 {
            return Err(Error::invalid(
                "alpha",
                format!("{alpha}: an i32 output is the plain int8 product, alpha must be 1"),
            ));
        }
        if p.is_empty() {
            // no element: the amax of nothing is 0 (the Hopper plan zeroes it before a launch)
            if amax != 0 {
                hopper::zero_f32(&self.ctx, amax)?;
            }
            return Ok(());
        }
        let (c, ldc, stride_c) = match ops.c {
            COperand::None => (0, 0, 0),
            COperand::Tensor(c) => (c.device_ptr(), p.ldc, p.batch_stride_c),
            COperand::D => (d.device_ptr(), p.ldd, p.batch_stride_d),
        };
        if let Some(hp) = &self.hopper {
            let args = HopperGemmArgs {
                m: p.m,
                n: p.n,
                k: p.k,
                batch: p.batch,
                dtype: p.input()?,
                out_dtype: p.out,
                a: ops.a.device_ptr(),
                lda: p.lda,
                stride_a: p.batch_stride_a,
                b: ops.b.device_ptr(),
                ldb: p.ldb,
                stride_b: p.batch_stride_b,
                b_nk: p.b_layout == Layout::ColMajor,
                c,
                ldc: if c == 0 { p.ldd } else { ldc },
                stride_c,
                beta: if p.epilogue.c { beta as f32 } else { 0.0 },
                d: d.device_ptr(),
                ldd: p.ldd,
                stride_d: p.batch_stride_d,
                bias: ops.bias.map_or(0, |b| b.device_ptr()),
                residual: ops.residual.map_or(0, |r| r.device_ptr()),
                ldr: p.ldr,
                stride_r: p.batch_stride_r,
                alpha: alpha as f32,
                // with a GLU: the gate's activation
                activation: if p.epilogue.glu.is_some() {
                    p.epilogue.glu.gate_activation().code()
                } else {
                    p.epilogue.activation.code()
                },
                glu: p.epilogue.glu.is_some(),
                scale_a: scales.a.map_or(0, |s| s.device_ptr()),
                scale_a_rows: p.scales == GemmScales::RowWise,
                scale_b: scales.b.map_or(0, |s| s.device_ptr()),
                scale_b_cols: p.scales == GemmScales::RowWise,
                scale_result: scales.result.map_or(0, |s| s.device_ptr()),
                amax,
            };
            // The Hopper plan checks every address rule and launches (one commented unsafe
            // launch inside HopperGemmPlan::run).
            let Some(workspace) = self.workspace.as_ref().filter(|_| self.splits > 1) else {
                return hp.run(&self.ctx, &args);
            };
            // split K: the partial products (scaled, no epilogue) into the f32 workspace as a
            // batch over k ranges (batch 1 only: hopper_splits), then the reduction below
            let kc = self.k_per_split;
            hp.run(
                &self.ctx,
                &HopperGemmArgs {
                    k: kc,
                    batch: self.splits,
                    out_dtype: DType::F32,
                    stride_a: kc,
                    stride_b: if args.b_nk { kc } else { kc * p.ldb },
                    c: 0,
                    ldc: p.n,
                    stride_c: 0,
                    beta: 0.0,
                    d: workspace.device_ptr(),
                    ldd: p.n,
                    stride_d: p.m * p.n,
                    bias: 0,
                    residual: 0,
                    alpha: 1.0,
                    activation: 0,
                    ..args
                },
            )?;
        }
        let params = GemmParams {
            a: ops.a.device_ptr(),
            b: ops.b.device_ptr(),
            c,
            bias: ops.bias.map_or(0, |b| b.device_ptr()),
            residual: ops.residual.map_or(0, |r| r.device_ptr()),
            d: d.device_ptr(),
            workspace: self.workspace.as_ref().map_or(0, |w| w.device_ptr()),
            lda: p.lda as i64,
            ldb: p.ldb as i64,
            ldc: ldc as i64,
            ldr: p.ldr as i64,
            ldd: p.ldd as i64,
            stride_a: p.batch_stride_a as i64,
            stride_b: p.batch_stride_b as i64,
            stride_c: stride_c as i64,
            stride_r: p.batch_stride_r as i64,
            stride_d: p.batch_stride_d as i64,
            alpha,
            beta: if p.epilogue.c { beta } else { 0.0 },
            m: p.m as i32,
            // with a GLU the kernels count B's 2N columns (D has N = n / 2)
            n: p.b_n() as i32,
            k: p.k as i32,
            batch: p.batch as i32,
            a_col_major: (p.a_layout == Layout::ColMajor) as i32,
            b_col_major: (p.b_layout == Layout::ColMajor) as i32,
            // with a GLU: the gate's activation (the GLU kernels read it so)
            activation: if p.epilogue.glu.is_some() {
                p.epilogue.glu.gate_activation().code() as i32
            } else {
                p.epilogue.activation.code() as i32
            },
            has_c: p.epilogue.c as i32,
            has_bias: p.epilogue.bias as i32,
            has_residual: p.epilogue.residual as i32,
            splits: self.splits as i32,
            k_per_split: self.k_per_split.min(i32::MAX as usize) as i32,
            scale_a: scales.a.map_or(0, |s| s.device_ptr()),
            scale_b: scales.b.map_or(0, |s| s.device_ptr()),
            scale_result: scales.result.map_or(0, |s| s.device_ptr()),
            amax,
            scale_a_rows: (p.scales == GemmScales::RowWise) as i32,
            scale_b_cols: (p.scales == GemmScales::RowWise) as i32,
        };
        if amax != 0 && self.hopper.is_none() {
            // the kernel raises the amax from zero (the Hopper plan zeroes its own)
            hopper::zero_f32(&self.ctx, amax)?;
        }
        // SAFETY: check_operands matched every view to the problem (dtype, shape, leading
        // dimension, batch stride), and each view was bounds-checked against its allocation
        // when made, so every element the kernel addresses (rows < M, columns < N, k < K of each
        // batch entry, 64-bit offsets) lies inside its buffer. The vector paths' 16-byte
        // alignment of A and B was checked above and that of lda/ldb/strides at planning. Each
        // element of D is written by one thread, which reads C (possibly D itself) first. The
        // workspace holds splits x batch x M x N f32, written by the first kernel and read by
        // the reduction after it on the same stream. GemmParams mirrors the kernel's struct.
        unsafe {
            // (the Hopper path's products ran above; only its split-K reduction remains)
            if self.hopper.is_none() {
                self.kernel.launch(&self.ctx, self.config, &params)?;
            }
            if let Some((reduce, cfg)) = &self.reduce {
                reduce.launch(&self.ctx, *cfg, &params)?;
            }
        }
        Ok(())
    }
}

/// The scale tensors of a call against the problem's [`GemmScales`]: f32, `[1]` each for
/// per-tensor, `[M]` and `[N]` for row-wise, none without scales.
fn check_scales(p: &GemmProblem, s: &GemmScaleOperands<'_>) -> Result<()> {
    if let Some(v) = s.result {
        if p.out.size() != 1 {
            return Err(Error::invalid(
                "scale_result",
                format!("given, but the result scale applies to fp8 outputs only, not {}", p.out),
            ));
        }
        if v.dtype() != DType::F32 || v.shape() != [1] {
            return Err(Error::invalid(
                "scale_result",
                format!("{} view {:?}; the plan expects fp32 [1]", v.dtype(), v.shape()),
            ));
        }
    }
    let (len_a, len_b) = match p.scales {
        GemmScales::None => {
            if s.a.is_some() || s.b.is_some() {
                return Err(Error::invalid(
                    "scales",
                    "given, but the plan has no dequantisation scales (GemmProblem::scales)",
                ));
            }
            return Ok(());
        }
        GemmScales::PerTensor => (1, 1),
        GemmScales::RowWise => (p.m, p.n),
    };
    for (arg, view, len) in [("scale_a", s.a, len_a), ("scale_b", s.b, len_b)] {
        let Some(v) = view else {
            return Err(Error::invalid(
                arg,
                format!("missing: the plan's {:?} scales need it", p.scales),
            ));
        };
        if v.dtype() != DType::F32 || v.shape() != [len] || (len > 1 && v.strides() != [1]) {
            return Err(Error::invalid(
                arg,
                format!(
                    "{} view {:?} with strides {:?}; the plan expects fp32 [{len}] with stride 1",
                    v.dtype(),
                    v.shape(),
                    v.strides()
                ),
            ));
        }
    }
    Ok(())
}
