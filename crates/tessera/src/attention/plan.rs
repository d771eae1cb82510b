//! Attention dispatch: which kernel (path, tiles, head-dim specialisation, mask and softcap
//! compiled in or not), how many KV splits, the split-KV workspace and merge, and the plan
//! ([`AttentionPlan`]) that holds them. What only one path needs lives in its module:
//!
//! - [`AttentionPath::Hopper`] (`sm_90a` only): TMA + mbarrier pipeline, wgmma, warp-specialised
//!   producer/consumer warpgroups (`flash_sm90.cu`); a persistent 1-D grid of at most one CTA
//!   per SM walking a static list of (query tile, split, batch-head) items, longest first, and
//!   a tail split for a short last wave ([`super::hopper`], [`HopperPlan`]).
//! - [`AttentionPath::Sm80`] (any `sm_80+`): ldmatrix + mma.sync with cp.async double buffering,
//!   FlashAttention-2 partitioning (`flash_sm80.cu`) over a `(B * Hq, q_tiles, splits)` grid in
//!   L2 sections of heads ([`super::ampere`], [`AmperePlan`]).
//!
//! With `splits > 1` each split writes normalised partial outputs and LSEs to a workspace that
//! `combine.cu` merges with the online-softmax rule.

use std::sync::Arc;

use super::ampere::{self, AmperePlan};
use super::hopper::{self, HopperPlan};
use super::{
    strides_bnh, AttentionOptions, AttentionProblem, AttentionTuning, QkvLayout, VarlenBatch, DEVICE_HEADERS,
    PARAMS_HEADER,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::runtime::tma::TmaError;
use crate::runtime::{
    contiguous_strides, Arch, Context, DeviceBuffer, Kernel, KernelKey, KernelParams, KernelSpec, LaunchConfig,
    TensorView, TensorViewMut,
};

const SM80_SOURCE: &str = include_str!("flash_sm80.cu");
const COMBINE_SOURCE: &str = include_str!("combine.cu");
const SM90_SOURCE: &str = include_str!("flash_sm90.cu");

/// Most KV splits a plan uses.
pub const MAX_SPLITS: usize = 64;

/// Which forward kernel family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttentionPath {
    /// Hopper where available, else the Ampere kernel.
    Auto,
    /// TMA + wgmma warp-specialised kernel (`sm_90a`).
    Hopper,
    /// ldmatrix + mma.sync kernel (`sm_80` and newer).
    Sm80,
}

impl AttentionPath {
    pub fn name(self) -> &'static str {
        match self {
            AttentionPath::Auto => "auto",
            AttentionPath::Hopper => "hopper",
            AttentionPath::Sm80 => "sm80",
        }
    }
}

/// The launch parameters, mirrored from `ts::AttentionParams` in `attention_params.cuh`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AttentionParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub lse: u64,
    pub cu_seqlens_q: u64,
    pub cu_seqlens_k: u64,
    pub o_partial: u64,
    pub lse_partial: u64,
    pub q_stride_b: i64,
    pub q_stride_n: i64,
    pub q_stride_h: i64,
    pub k_stride_b: i64,
    pub k_stride_n: i64,
    pub k_stride_h: i64,
    pub v_stride_b: i64,
    pub v_stride_n: i64,
    pub v_stride_h: i64,
    pub o_stride_b: i64,
    pub o_stride_n: i64,
    pub o_stride_h: i64,
    pub lse_stride_b: i64,
    pub lse_stride_h: i64,
    pub partial_rows: i64,
    pub batch: i32,
    pub heads_q: i32,
    pub heads_kv: i32,
    pub seqlen_q: i32,
    pub seqlen_k: i32,
    pub head_dim: i32,
    pub window_left: i32,
    pub window_right: i32,
    pub scale_log2: f32,
    pub softcap_scale: f32,
    pub softcap_log2: f32,
    pub num_splits: i32,
    pub q_tiles: i32,
    pub head_group: i32,
    /// Hopper tail launch: `{b, h, i}` per partial row (the tail split of `hopper::HopperPlan`);
    /// 0 otherwise.
    pub tail_meta: u64,
}

// SAFETY: plain data matching the C layout of ts::AttentionParams (checked by a test that
// compiles `sizeof` into a kernel and by the field list above).
unsafe impl KernelParams for AttentionParams {}

/// Tiles of a forward kernel: `(block_m, block_n, threads, stages)`.
pub type Tiles = (u32, u32, u32, u32);

/// Size of `ts::AttentionParams` in bytes.
pub const PARAMS_BYTES: usize = std::mem::size_of::<AttentionParams>();

/// Compile-time specialisation of one forward kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Variant {
    /// Resolved path: `Hopper` or `Sm80`.
    pub path: AttentionPath,
    pub dtype: DType,
    /// Compiled head dim: 64, 128 or 256 (or the padded generic sizes 32..256 step 32).
    pub head_dim: u32,
    pub block_m: u32,
    pub block_n: u32,
    /// Threads per CTA.
    pub threads: u32,
    /// K/V pipeline depth.
    pub stages: u32,
    /// A window or causal mask is compiled in.
    pub masked: bool,
    pub softcap: bool,
    /// Writes split-KV partials instead of the output.
    pub split: bool,
    /// Hopper: clusters of two CTAs on neighbouring query tiles that share each K/V tile's load
    /// (TMA multicast, [`hopper::use_cta_pairs`]).
    pub pair: bool,
    /// Hopper: built without intra-warpgroup pipelining, one key tile at a time
    /// (`TS_ATTN_SIMPLE_MAINLOOP`; [`AttentionTuning::hopper_simple_mainloop`], a debugging aid).
    pub simple_mainloop: bool,
}

impl Variant {
    /// The specialisation of this variant: its name, preamble and cache hash.
    pub fn key(&self) -> KernelKey {
        let family = match self.path {
            AttentionPath::Hopper => "flash_fwd_hopper",
            _ => "flash_fwd_sm80",
        };
        KernelKey::new(family)
            .ty("Elem", self.dtype)
            .int("kHeadDim", "d", self.head_dim)
            .int("kBlockM", "m", self.block_m)
            .int("kBlockN", "n", self.block_n)
            .int("kThreads", "t", self.threads)
            .int("kStages", "s", self.stages)
            .flag("kMasked", "mask", self.masked)
            .flag("kSoftcap", "softcap", self.softcap)
            .flag("kSplit", "split", self.split)
            .flag("kPair", "pair", self.pair)
            .define(
                "TS_ATTN_SIMPLE_MAINLOOP",
                "simple",
                self.path == AttentionPath::Hopper && self.simple_mainloop,
            )
    }

    /// The kernel spec of this variant.
    pub fn spec(&self) -> KernelSpec {
        match self.path {
            AttentionPath::Hopper => self
                .key()
                .spec("flash_sm90.cu", SM90_SOURCE, "flash_fwd_sm90", DEVICE_HEADERS),
            _ => self
                .key()
                .spec("flash_sm80.cu", SM80_SOURCE, "flash_fwd_sm80", DEVICE_HEADERS),
        }
    }

    /// Dynamic shared memory of a CTA. Ampere: the Q tile plus `stages` K and V tiles of 2-byte
    /// elements, each row padded to a multiple of 64 elements (128 bytes) so that the XOR
    /// swizzle of 16-byte chunks stays inside the row (flash_sm80.cu `kRowElems`). Hopper: the
    /// same tiles (its head dim is already a multiple of 64) plus mbarriers and alignment slack.
    pub fn shared_bytes(&self) -> u32 {
        match self.path {
            AttentionPath::Hopper => hopper::shared_bytes(self.block_m, self.block_n, self.stages, self.head_dim),
            _ => {
                let row = self.head_dim.div_ceil(64) * 64;
                (self.block_m + 2 * self.stages * self.block_n) * row * 2
            }
        }
    }
}

/// The combine kernel merging split-KV partials into the output and LSE.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CombineVariant {
    pub dtype: DType,
    pub head_dim: u32,
}

impl CombineVariant {
    /// Threads per CTA of the combine kernel: one warp per (row, head), 4 warps.
    pub const THREADS: u32 = 128;
    pub fn key(&self) -> KernelKey {
        KernelKey::new("flash_combine")
            .ty("Elem", self.dtype)
            .int("kHeadDim", "d", self.head_dim)
            .int("kThreads", "t", Self::THREADS)
    }

    pub fn spec(&self) -> KernelSpec {
        self.key()
            .spec("combine.cu", COMBINE_SOURCE, "flash_combine", DEVICE_HEADERS)
    }
}

/// Head dim the kernels are compiled for: 64, 128, 256 exactly, others rounded up to a
/// multiple of 32 (zero-padded on load, masked on store).
pub fn compiled_head_dim(d: usize) -> u32 {
    match d {
        64 | 128 | 256 => d as u32,
        _ => d.div_ceil(32) as u32 * 32,
    }
}

/// Waves of resident CTAs one section of a work order aims to fill (both kernels).
pub const SECTION_WAVES: usize = 4;

/// The fewest batch-heads of `items_per_head` work items each that fill [`SECTION_WAVES`] waves
/// of `resident_ctas`, between 1 and `max_heads`.
pub fn heads_for_waves(resident_ctas: usize, items_per_head: usize, max_heads: usize) -> usize {
    (SECTION_WAVES * resident_ctas.max(1))
        .div_ceil(items_per_head.max(1))
        .clamp(1, max_heads.max(1))
}

/// The backend part of a plan: what only one path needs.
enum Backend {
    /// The Ampere kernel's work-order sections.
    Ampere(AmperePlan),
    /// The Hopper kernel's persistent launch, scheduler state and tail split.
    Hopper(HopperPlan),
}

/// A plan: the kernels, the split count and the workspace for one problem.
pub struct AttentionPlan {
    ctx: Context,
    problem: AttentionProblem,
    options: AttentionOptions,
    key: AttentionPlanKey,
    variant: Variant,
    kernel: Arc<Kernel>,
    combine: Option<Arc<Kernel>>,
    splits: usize,
    q_tiles: usize,
    /// Split-KV workspace: partial outputs then partial LSEs (f32).
    workspace: Option<DeviceBuffer<f32>>,
    backend: Backend,
    /// Under `Auto` on Hopper: the Ampere plan used for views that TMA cannot describe
    /// (misaligned base or strides), built on first need.
    fallback: std::sync::OnceLock<Box<AttentionPlan>>,
}

impl std::fmt::Debug for AttentionPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttentionPlan")
            .field("problem", &self.problem)
            .field("variant", &self.variant)
            .field("splits", &self.splits)
            .finish()
    }
}

/// Everything an [`AttentionPlan`] was made from, as a hashable value: the problem (shapes,
/// dtype, varlen totals), every option including the tuning (floats by their bit patterns) and
/// the device (its ordinal and architecture, which with the options decide the kernels and
/// tiles). Two plans with equal keys made on contexts of one device are interchangeable, so a
/// cache of plans can be keyed by it (with the context's stream where plans are per stream).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionPlanKey {
    pub problem: AttentionProblem,
    pub layout: QkvLayout,
    pub causal: bool,
    pub window: (i32, i32),
    /// `AttentionOptions::scale` by its bits.
    pub scale_bits: Option<u32>,
    /// `AttentionOptions::softcap` by its bits.
    pub softcap_bits: u32,
    pub return_lse: bool,
    pub tuning: AttentionTuning,
    /// The device's ordinal.
    pub device: usize,
    pub arch: Arch,
}

impl AttentionPlanKey {
    /// The key of a plan for `problem` and `options` on device `device` of architecture `arch`.
    pub fn new(problem: &AttentionProblem, options: &AttentionOptions, device: usize, arch: Arch) -> AttentionPlanKey {
        AttentionPlanKey {
            problem: *problem,
            layout: options.layout,
            causal: options.causal,
            window: options.window,
            scale_bits: options.scale.map(f32::to_bits),
            softcap_bits: options.softcap.to_bits(),
            return_lse: options.return_lse,
            tuning: options.tuning,
            device,
            arch,
        }
    }
}

/// Validates the options for a head dim (pure: no device needed).
pub fn validate_options(o: &AttentionOptions, d: usize) -> Result<()> {
    if let Some(s) = o.scale {
        if !(s.is_finite() && s > 0.0) {
            return Err(Error::invalid(
                "scale",
                format!("softmax scale must be finite and > 0, got {s}"),
            ));
        }
    }
    if !(o.softcap.is_finite() && o.softcap >= 0.0) {
        return Err(Error::invalid(
            "softcap",
            format!("softcap must be finite and >= 0 (0 = off), got {}", o.softcap),
        ));
    }
    if o.window.0 < -1 || o.window.1 < -1 {
        return Err(Error::invalid(
            "window",
            format!("window sizes must be >= -1 (-1 = unbounded), got {:?}", o.window),
        ));
    }
    if let Some(s) = o.tuning.num_splits {
        if s == 0 || s > MAX_SPLITS {
            return Err(Error::invalid(
                "num_splits",
                format!("num_splits must be 1..={MAX_SPLITS}, got {s}"),
            ));
        }
    }
    if let Some(n) = o.tuning.hopper_block_n {
        // Only head dims that have the long tiling have a choice to force.
        let choices = hopper::block_n_choices(hopper::head_dim(d));
        if !choices.contains(&hopper::LONG_BLOCK_N) || !choices.contains(&n) {
            return Err(Error::invalid(
                "hopper_block_n",
                format!(
                    "hopper_block_n must be 128 or {} and applies to head dims 65..=128, got {n} at D = {d}",
                    hopper::LONG_BLOCK_N
                ),
            ));
        }
    }
    if o.tuning.sm80_heads_per_section == Some(0) {
        return Err(Error::invalid(
            "sm80_heads_per_section",
            "sm80_heads_per_section must be >= 1, got 0",
        ));
    }
    if o.tuning.hopper_max_ctas == Some(0) {
        return Err(Error::invalid("hopper_max_ctas", "hopper_max_ctas must be >= 1, got 0"));
    }
    if let Some(n) = o.tuning.sm80_block_n {
        if n != 32 && n != 64 {
            return Err(Error::invalid(
                "sm80_block_n",
                format!("sm80_block_n must be 32 or 64, got {n}"),
            ));
        }
        if o.softcap > 0.0 || !(65..=128).contains(&d) {
            return Err(Error::invalid(
                "sm80_block_n",
                format!(
                    "sm80_block_n applies to head dims 65..=128 without softcap, got D = {d}, softcap {}",
                    o.softcap
                ),
            ));
        }
    }
    Ok(())
}

/// Device addresses of a split-KV workspace's partial outputs and of its LSEs, which follow
/// `o_len` output floats.
pub(super) fn partial_ptrs(workspace: &DeviceBuffer<f32>, o_len: usize) -> (u64, u64) {
    (workspace.device_ptr(), workspace.device_ptr() + (o_len * 4) as u64)
}

/// The combine kernel's launch: one warp per partial row (and head) of `warp_items`.
pub(super) fn combine_config(warp_items: usize) -> LaunchConfig {
    let warps = (CombineVariant::THREADS / 32) as usize;
    LaunchConfig::linear(warp_items.div_ceil(warps) as u32, CombineVariant::THREADS, 0)
}

/// FlashAttention-2's rule: split only while the CTAs do not fill the GPU, choosing the
/// smallest split count whose wave efficiency is within 85% of the best.
pub fn choose_splits(ctas: usize, sms: usize, k_tiles: usize) -> usize {
    if ctas == 0 || ctas * 5 >= sms * 4 || k_tiles < 2 {
        return 1;
    }
    let max = MAX_SPLITS.min(sms).min(k_tiles);
    let eff = |s: usize| {
        let n = (ctas * s) as f64 / sms as f64;
        n / n.ceil()
    };
    let best = (1..=max).map(eff).fold(0.0f64, f64::max);
    (1..=max).find(|&s| eff(s) >= 0.85 * best).unwrap_or(1)
}

impl AttentionPlan {
    /// Chooses the path, kernel and split count, compiles (or loads) the kernels, allocates the
    /// split workspace and plans the backend's part ([`AmperePlan`], [`HopperPlan`]).
    pub fn new(ctx: &Context, problem: &AttentionProblem, options: &AttentionOptions) -> Result<AttentionPlan> {
        problem.validate()?;
        validate_options(options, problem.head_dim)?;
        let arch = ctx.arch();
        let path = resolve_path(options.tuning.path, arch)?;
        let (head_dim, (block_m, block_n, threads, stages)) = match path {
            AttentionPath::Hopper => hopper::plan_tiles(problem, options)?,
            _ => ampere::tiles(ctx, problem, options),
        };
        let q_tiles = problem.seqlen_q.div_ceil(block_m as usize).max(1);
        if path != AttentionPath::Hopper {
            ampere::check_query_tiles(problem, q_tiles, block_m)?;
        }
        let k_tiles = problem.seqlen_k.div_ceil(block_n as usize);
        let splits = match options.tuning.num_splits {
            Some(s) => s.min(k_tiles.max(1)),
            // (the Hopper grid cap stands for a smaller GPU here too)
            None => choose_splits(
                problem.batch.saturating_mul(problem.heads_q).saturating_mul(q_tiles),
                match (path, options.tuning.hopper_max_ctas) {
                    (AttentionPath::Hopper, Some(m)) => m.min(ctx.info().sm_count as usize),
                    _ => ctx.info().sm_count as usize,
                },
                k_tiles,
            ),
        };
        // Work items (Hopper's persistent loop) and B * Hq (Ampere grid x) are 32-bit on the
        // device, with room for one more grid stride.
        let work = q_tiles
            .checked_mul(splits)
            .and_then(|w| w.checked_mul(problem.batch))
            .and_then(|w| w.checked_mul(problem.heads_q));
        let limit = i32::MAX as usize - 4096;
        if work.is_none_or(|w| w > limit) {
            return Err(Error::Unsupported(format!(
                "attention over {} sequences x {} heads x {q_tiles} query tiles x {splits} splits exceeds the \
                 32-bit work-item range ({limit}); run fewer sequences per call",
                problem.batch, problem.heads_q
            )));
        }
        if options.softcap > 0.0 {
            let q = options.effective_scale(problem.head_dim) / options.softcap;
            if !(q.is_finite() && q > 0.0) {
                return Err(Error::invalid(
                    "softcap",
                    format!(
                        "scale / softcap must be a finite positive f32, got {} / {}",
                        options.effective_scale(problem.head_dim),
                        options.softcap
                    ),
                ));
            }
        }
        let variant = Variant {
            path,
            dtype: problem.dtype,
            head_dim,
            block_m,
            block_n,
            threads,
            stages,
            masked: options.window_for(problem.seqlen_q, problem.seqlen_k) != (-1, -1),
            softcap: options.softcap > 0.0,
            split: splits > 1,
            pair: path == AttentionPath::Hopper && hopper::plan_pairs(problem, options, block_m, splits),
            simple_mainloop: path == AttentionPath::Hopper && options.tuning.hopper_simple_mainloop,
        };
        let kernel = ctx.kernel(&variant.spec())?;
        let (combine, workspace) = if splits > 1 {
            let c = ctx.kernel(
                &CombineVariant {
                    dtype: problem.dtype,
                    head_dim,
                }
                .spec(),
            )?;
            let rows = partial_rows(problem);
            let len = splits * problem.heads_q * rows * (head_dim as usize + 1);
            (Some(c), Some(ctx.alloc::<f32>(len)?))
        } else {
            (None, None)
        };
        let backend = match path {
            AttentionPath::Hopper => Backend::Hopper(HopperPlan::new(
                ctx, problem, options, &variant, &kernel, q_tiles, k_tiles, splits,
            )?),
            _ => Backend::Ampere(AmperePlan::new(
                ctx, problem, options, &variant, &kernel, q_tiles, splits,
            )?),
        };
        Ok(AttentionPlan {
            ctx: ctx.clone(),
            problem: *problem,
            options: *options,
            key: AttentionPlanKey::new(problem, options, ctx.info().ordinal, arch),
            variant,
            kernel,
            combine,
            splits,
            q_tiles,
            workspace,
            backend,
            fallback: std::sync::OnceLock::new(),
        })
    }

    /// Everything this plan was made from ([`AttentionPlanKey`]): equal keys (on one device)
    /// mean interchangeable plans.
    pub fn key(&self) -> AttentionPlanKey {
        self.key
    }
    pub fn problem(&self) -> &AttentionProblem {
        &self.problem
    }
    pub fn variant(&self) -> &Variant {
        &self.variant
    }
    pub fn splits(&self) -> usize {
        self.splits
    }
    /// Bytes of device memory the plan holds besides the caller's tensors.
    pub fn workspace_bytes(&self) -> usize {
        self.workspace.as_ref().map_or(0, |w| w.bytes())
            + match &self.backend {
                Backend::Hopper(h) => h.workspace_bytes(),
                Backend::Ampere(_) => 0,
            }
    }
    /// A readable description (`sm80 d128 m128 n64 splits 1`, `... tail 4x12` with a tail split,
    /// `... pairs grid 132` with CTA pairs).
    pub fn describe(&self) -> String {
        let mut s = format!(
            "{} d{} m{} n{} splits {}",
            self.variant.path.name(),
            self.variant.head_dim,
            self.variant.block_m,
            self.variant.block_n,
            self.splits
        );
        if let Some((items, splits)) = self.tail_split() {
            s += &format!(" tail {items}x{splits}");
        }
        if self.variant.pair {
            s += &format!(" pairs grid {}", self.hopper().map_or(0, HopperPlan::grid));
        }
        s
    }

    /// The tail split this plan runs, `(items, splits)` ([`hopper::tail_split`]), if any.
    pub fn tail_split(&self) -> Option<(usize, usize)> {
        self.hopper().and_then(HopperPlan::tail_split)
    }

    fn hopper(&self) -> Option<&HopperPlan> {
        match &self.backend {
            Backend::Hopper(h) => Some(h),
            Backend::Ampere(_) => None,
        }
    }

    /// The Ampere kernel's work-order section ([`ampere::sm80_head_group`]); the Hopper kernel
    /// gets all batch-heads as one.
    fn head_group(&self) -> usize {
        match &self.backend {
            Backend::Ampere(a) => a.head_group,
            Backend::Hopper(_) => (self.problem.batch * self.problem.heads_q).max(1),
        }
    }

    /// The LSE shape this plan writes: `[B, Hq, Nq]`, or `[Hq, total_q]` for varlen.
    pub fn lse_shape(&self) -> Vec<usize> {
        match self.problem.varlen {
            Some((total_q, _)) => vec![self.problem.heads_q, total_q],
            None => vec![self.problem.batch, self.problem.heads_q, self.problem.seqlen_q],
        }
    }

    /// A contiguous LSE view of `buf` in [`AttentionPlan::lse_shape`].
    pub fn lse_view_mut<'a>(&self, buf: &'a mut DeviceBuffer<f32>) -> Result<TensorViewMut<'a>> {
        let shape = self.lse_shape();
        let strides = contiguous_strides(&shape);
        buf.view_mut(&shape, &strides)
    }

    /// Runs the plan: `out` must have q's shape (any strides, last dim contiguous) and dtype;
    /// `lse`, when given, must be f32 in [`AttentionPlan::lse_shape`] (any strides, last dim
    /// contiguous). `varlen` must be given iff the plan was made for a varlen batch and must
    /// match it.
    pub fn run(
        &self,
        q: &TensorView,
        k: &TensorView,
        v: &TensorView,
        out: &mut TensorViewMut,
        lse: Option<&mut TensorViewMut>,
        varlen: Option<&VarlenBatch>,
    ) -> Result<()> {
        let layout = self.options.layout;
        let p = AttentionProblem::of_views(q, k, v, layout, varlen)?;
        if p != self.problem {
            return Err(Error::invalid(
                "attention",
                format!("attention plan was made for {:?}, called with {:?}", self.problem, p),
            ));
        }
        if out.shape() != q.shape() || out.dtype() != q.dtype() {
            return Err(Error::invalid(
                "out",
                format!(
                    "out must have q's shape {:?} and dtype {}, got {:?} {}",
                    q.shape(),
                    q.dtype(),
                    out.shape(),
                    out.dtype()
                ),
            ));
        }
        if *out.strides().last().unwrap_or(&1) != 1 {
            return Err(Error::invalid(
                "out",
                "its last dimension must be contiguous (stride 1)",
            ));
        }
        let is_varlen = varlen.is_some();
        let (qb, qn, qh) = strides_bnh(q, layout, is_varlen);
        let (kb, kn, kh) = strides_bnh(k, layout, is_varlen);
        let (vb, vn, vh) = strides_bnh(v, layout, is_varlen);
        let (ob, on, oh) = strides_bnh(&out.as_view(), layout, is_varlen);
        check_vector_aligned("q", q.device_ptr(), [qb, qn, qh])?;
        check_vector_aligned("k", k.device_ptr(), [kb, kn, kh])?;
        check_vector_aligned("v", v.device_ptr(), [vb, vn, vh])?;
        check_vector_aligned("out", out.device_ptr(), [ob, on, oh])?;
        // TMA can still refuse a view the alignment rule accepts (a zero stride broadcasting K/V,
        // a stride of 2^40 bytes or more): Auto then runs the Ampere kernel.
        let maps = if self.variant.path == AttentionPath::Hopper {
            match hopper::tensor_maps(&self.problem, &self.variant, q, k, v, layout, is_varlen) {
                Ok(m) => Some(m),
                Err(TmaError::Misaligned(why)) if self.options.tuning.path == AttentionPath::Auto => {
                    let _ = why;
                    return self.fallback_plan()?.run(q, k, v, out, lse, varlen);
                }
                Err(TmaError::Misaligned(why)) => {
                    return Err(Error::Unsupported(format!(
                        "the Hopper attention path cannot describe these views with TMA tensor maps: \
                         {why}; use AttentionPath::Auto or Sm80"
                    )))
                }
                Err(TmaError::Driver(e) | TmaError::Invalid(e)) => return Err(e),
            }
        } else {
            None
        };
        let (lse_ptr, lse_stride_b, lse_stride_h) = match lse {
            Some(l) => {
                let want = self.lse_shape();
                if l.shape() != want.as_slice() || l.dtype() != DType::F32 || *l.strides().last().unwrap() != 1 {
                    return Err(Error::invalid(
                        "lse",
                        format!(
                            "lse must be f32 of shape {want:?} with a contiguous last dim, got {} {:?} strides {:?}",
                            l.dtype(),
                            l.shape(),
                            l.strides()
                        ),
                    ));
                }
                let s = l.strides();
                if is_varlen {
                    (l.device_ptr(), 0i64, s[0] as i64)
                } else {
                    (l.device_ptr(), s[0] as i64, s[1] as i64)
                }
            }
            None => (0, 0, 0),
        };
        let (cu_q, cu_k) = varlen.map_or((0, 0), |vb| vb.device_ptrs());
        let d = self.problem.head_dim;
        let scale = self.options.effective_scale(d);
        let (left, right) = self.options.window_for(self.problem.seqlen_q, self.problem.seqlen_k);
        let rows = partial_rows(&self.problem);
        let (o_partial, lse_partial) = match &self.workspace {
            Some(w) => partial_ptrs(
                w,
                self.splits * self.problem.heads_q * rows * self.variant.head_dim as usize,
            ),
            None => (0, 0),
        };
        let softcap = self.options.softcap;
        let params = AttentionParams {
            q: q.device_ptr(),
            k: k.device_ptr(),
            v: v.device_ptr(),
            o: out.device_ptr(),
            lse: lse_ptr,
            cu_seqlens_q: cu_q,
            cu_seqlens_k: cu_k,
            o_partial,
            lse_partial,
            q_stride_b: qb,
            q_stride_n: qn,
            q_stride_h: qh,
            k_stride_b: kb,
            k_stride_n: kn,
            k_stride_h: kh,
            v_stride_b: vb,
            v_stride_n: vn,
            v_stride_h: vh,
            o_stride_b: ob,
            o_stride_n: on,
            o_stride_h: oh,
            lse_stride_b,
            lse_stride_h,
            partial_rows: rows as i64,
            batch: self.problem.batch as i32,
            heads_q: self.problem.heads_q as i32,
            heads_kv: self.problem.heads_kv as i32,
            seqlen_q: self.problem.seqlen_q as i32,
            seqlen_k: self.problem.seqlen_k as i32,
            head_dim: d as i32,
            window_left: left,
            window_right: right,
            scale_log2: scale * std::f32::consts::LOG2_E,
            softcap_scale: if softcap > 0.0 { scale / softcap } else { 0.0 },
            softcap_log2: softcap * std::f32::consts::LOG2_E,
            num_splits: self.splits as i32,
            q_tiles: self.q_tiles as i32,
            head_group: self.head_group() as i32,
            tail_meta: 0,
        };
        if self.problem.batch == 0 || rows == 0 {
            return Ok(());
        }
        match (&self.backend, maps) {
            (Backend::Hopper(h), Some(maps)) => h.launch(&self.ctx, &self.kernel, &self.variant, &params, maps)?,
            (Backend::Ampere(a), _) => a.launch(&self.ctx, &self.kernel, &self.variant, &params)?,
            (Backend::Hopper(_), None) => {
                return Err(Error::Unsupported(
                    "internal: a Hopper plan without its tensor maps".into(),
                ))
            }
        }
        if let Some(combine) = &self.combine {
            // SAFETY: `params` mirrors ts::AttentionParams with the views validated above; the
            // combine kernel reads the workspace (sized for this problem) the forward kernel just
            // wrote (same stream) and writes out/lse within their validated extents.
            unsafe { combine.launch(&self.ctx, combine_config(rows * self.problem.heads_q), &params)? };
        }
        Ok(())
    }
}

impl AttentionPlan {
    /// The Ampere plan for the same problem and options (Hopper plans under `Auto`, for views
    /// TMA cannot describe).
    fn fallback_plan(&self) -> Result<&AttentionPlan> {
        if let Some(p) = self.fallback.get() {
            return Ok(p);
        }
        let options = AttentionOptions {
            tuning: AttentionTuning {
                path: AttentionPath::Sm80,
                ..self.options.tuning
            },
            ..self.options
        };
        let plan = AttentionPlan::new(&self.ctx, &self.problem, &options)?;
        Ok(self.fallback.get_or_init(|| Box::new(plan)))
    }
}

/// The kernels move rows in 16-byte chunks (cp.async loads, vector stores): a tensor's base
/// address must be 16-byte aligned and its batch, row and head strides multiples of 8 elements.
fn check_vector_aligned(name: &str, ptr: u64, strides: [i64; 3]) -> Result<()> {
    if ptr % 16 != 0 || strides.iter().any(|s| s % 8 != 0) {
        return Err(Error::Unsupported(format!(
            "attention {name}: the kernels need a 16-byte aligned base address and batch/row/head \
             strides that are multiples of 8 elements, got address {ptr:#x} and strides (b, n, h) {strides:?}"
        )));
    }
    Ok(())
}

/// Rows of the split-KV workspace per (split, head).
pub(super) fn partial_rows(p: &AttentionProblem) -> usize {
    p.varlen.map_or(p.batch * p.seqlen_q, |(t, _)| t)
}

/// Resolves `Auto` and checks the device supports the requested path.
pub fn resolve_path(path: AttentionPath, arch: Arch) -> Result<AttentionPath> {
    if arch.major < 8 {
        return Err(Error::Unsupported(format!(
            "attention needs compute capability 8.0 or newer, this GPU is {arch}"
        )));
    }
    let hopper = arch.major == 9 && arch.minor == 0;
    match path {
        AttentionPath::Auto if hopper => Ok(AttentionPath::Hopper),
        AttentionPath::Auto | AttentionPath::Sm80 => Ok(AttentionPath::Sm80),
        AttentionPath::Hopper if hopper => Ok(AttentionPath::Hopper),
        AttentionPath::Hopper => Err(Error::Unsupported(format!(
            "the Hopper attention path needs an sm_90 GPU (wgmma, TMA), this GPU is {arch}; use \
             AttentionPath::Auto or Sm80"
        ))),
    }
}

/// Every variant the dispatcher can produce for `arch` (what CI compiles).
pub fn ci_variants_for(arch: Arch) -> Vec<Variant> {
    let mut out = Vec::new();
    if arch.major < 8 {
        return out;
    }
    // Every (masked, softcap, split) combination the plan can produce.
    let flags = [
        (false, false, false),
        (true, false, false),
        (false, true, false),
        (true, true, false),
        (false, false, true),
        (true, false, true),
        (false, true, true),
        (true, true, true),
    ];
    // `tiles(softcap)` lists the tilings a variant may get. The Ampere kernel's depend on the
    // GPU's shared memory per SM: the one the arch's GPUs take (both for an arch not listed in
    // ampere::shared_per_sm_of), plus the 32-key tiling that AttentionTuning::sm80_block_n can force
    // on any GPU (tests and benchmarks of the smaller GPUs' tiling on a Hopper). The Hopper
    // kernel's: every key tile of hopper::block_n_choices (128 and 176 at D = 128).
    let mut push = |path, dtype, head_dim, tiles: &dyn Fn(bool) -> Vec<(u32, u32, u32, u32)>| {
        for (masked, softcap, split) in flags {
            for (block_m, block_n, threads, stages) in tiles(softcap) {
                let v = Variant {
                    path,
                    dtype,
                    head_dim,
                    block_m,
                    block_n,
                    threads,
                    stages,
                    masked,
                    softcap,
                    split,
                    pair: false,
                    simple_mainloop: false,
                };
                if !out.contains(&v) {
                    out.push(v);
                }
                // Hopper's non-split variants of two consumers also run as CTA pairs.
                if path == AttentionPath::Hopper && !split && hopper::kernel_has_pairs(block_m, 1) {
                    let v = Variant { pair: true, ..v };
                    if !out.contains(&v) {
                        out.push(v);
                    }
                }
            }
        }
    };
    for dtype in [DType::F16, DType::BF16] {
        for head_dim in (32..=256).step_by(32) {
            push(AttentionPath::Sm80, dtype, head_dim, &|softcap| {
                vec![
                    ampere::sm80_tiles_keyed(head_dim, softcap, false),
                    ampere::shared_per_sm_of(arch)
                        .map_or(ampere::sm80_tiles_keyed(head_dim, softcap, true), |shared| {
                            ampere::sm80_tiles(head_dim, softcap, shared)
                        }),
                ]
            });
        }
        if arch.major == 9 && arch.minor == 0 {
            for head_dim in (64..=256).step_by(64) {
                push(AttentionPath::Hopper, dtype, head_dim, &|_| {
                    hopper::block_n_choices(head_dim)
                        .iter()
                        .filter_map(|&n| hopper::tiles(head_dim, n).ok())
                        .collect()
                });
            }
        }
    }
    out
}

/// Every combine variant (what CI compiles).
pub fn ci_combine_variants() -> Vec<CombineVariant> {
    let mut out = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        for head_dim in (32..=256).step_by(32) {
            out.push(CombineVariant { dtype, head_dim });
        }
    }
    out
}

/// The attention params header source (for tests that need it).
pub fn params_header() -> &'static str {
    PARAMS_HEADER
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CI compiles every Hopper tiling the plan can choose or be forced to, for every flag set.
    #[test]
    fn ci_variants_cover_every_hopper_tiling() {
        let vs = ci_variants_for(Arch::SM90);
        for d in [64, 128, 192, 256] {
            for &n in hopper::block_n_choices(d) {
                let count = |pair| {
                    vs.iter()
                        .filter(|v| v.path == AttentionPath::Hopper && v.head_dim == d && v.block_n == n)
                        .filter(|v| v.pair == pair)
                        .count()
                };
                // 2 dtypes x 8 (masked, softcap, split) flag sets, and the CTA pairs of the
                // non-split ones where two consumer warpgroups run (hopper::use_cta_pairs).
                assert_eq!(count(false), 16, "d {d} n {n}");
                assert_eq!(count(true), if d == 64 { 0 } else { 8 }, "d {d} n {n} pairs");
            }
        }
        assert!(vs
            .iter()
            .any(|v| v.block_n == hopper::LONG_BLOCK_N && v.split && v.softcap));
        assert!(vs.iter().filter(|v| v.pair).all(|v| !v.split && v.block_m == 128));
    }

    /// A plan key holds every input: equal inputs give equal keys (and hashes), and changing
    /// any option, tuning field, problem size or the device gives another key.
    #[test]
    fn plan_keys_follow_every_input() {
        use std::collections::hash_map::DefaultHasher;
        use std::hash::{Hash, Hasher};
        let hash = |k: &AttentionPlanKey| {
            let mut h = DefaultHasher::new();
            k.hash(&mut h);
            h.finish()
        };
        let p = AttentionProblem::padded(2, 8, 2, 100, 300, 128, DType::F16);
        let o = AttentionOptions {
            causal: true,
            scale: Some(0.1),
            ..Default::default()
        };
        let key = |p: &AttentionProblem, o: &AttentionOptions| AttentionPlanKey::new(p, o, 0, Arch::SM90);
        let base = key(&p, &o);
        assert_eq!(base, key(&p.clone(), &o.clone()));
        assert_eq!(hash(&base), hash(&key(&p, &o)));
        let t = AttentionTuning::default();
        let tunings = [
            AttentionTuning {
                path: AttentionPath::Sm80,
                ..t
            },
            AttentionTuning {
                num_splits: Some(1),
                ..t
            },
            AttentionTuning {
                sm80_block_n: Some(32),
                ..t
            },
            AttentionTuning {
                sm80_heads_per_section: Some(4),
                ..t
            },
            AttentionTuning {
                hopper_block_n: Some(176),
                ..t
            },
            AttentionTuning {
                hopper_tail_split: false,
                ..t
            },
            AttentionTuning {
                hopper_max_ctas: Some(12),
                ..t
            },
            AttentionTuning {
                hopper_cta_pairs: Some(false),
                ..t
            },
            AttentionTuning {
                hopper_simple_mainloop: true,
                ..t
            },
        ];
        for tuning in tunings {
            let k = key(&p, &AttentionOptions { tuning, ..o });
            assert_ne!(k, base, "{tuning:?}");
            assert_ne!(hash(&k), hash(&base), "{tuning:?}");
        }
        let options = [
            AttentionOptions {
                layout: QkvLayout::Bhnd,
                ..o
            },
            AttentionOptions { causal: false, ..o },
            AttentionOptions { window: (16, -1), ..o },
            AttentionOptions { scale: None, ..o },
            AttentionOptions {
                scale: Some(0.1000001),
                ..o
            },
            AttentionOptions { softcap: 30.0, ..o },
            AttentionOptions { return_lse: true, ..o },
        ];
        for opts in options {
            assert_ne!(key(&p, &opts), base, "{opts:?}");
        }
        assert_ne!(key(&AttentionProblem { seqlen_k: 301, ..p }, &o), base);
        assert_ne!(
            key(
                &AttentionProblem {
                    dtype: DType::BF16,
                    ..p
                },
                &o
            ),
            base
        );
        assert_ne!(AttentionPlanKey::new(&p, &o, 1, Arch::SM90), base);
        assert_ne!(AttentionPlanKey::new(&p, &o, 0, Arch::SM80), base);
    }

    /// On a GPU: plans made from equal inputs report equal keys, and a changed tuning field
    /// another one. Skipped without a device.
    #[test]
    fn plans_from_equal_inputs_have_equal_keys_when_a_device_is_present() {
        let ctx = match Context::new(0) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("plan key test: skipped, {e}");
                return;
            }
        };
        let p = AttentionProblem::padded(1, 4, 4, 256, 256, 64, DType::F16);
        let o = AttentionOptions {
            causal: true,
            ..Default::default()
        };
        let a = AttentionPlan::new(&ctx, &p, &o).unwrap();
        let b = AttentionPlan::new(&ctx, &p, &o).unwrap();
        assert_eq!(a.key(), b.key());
        assert_eq!(a.key(), AttentionPlanKey::new(&p, &o, ctx.info().ordinal, ctx.arch()));
        let forced = AttentionOptions {
            tuning: AttentionTuning {
                path: AttentionPath::Sm80,
                num_splits: Some(2),
                ..o.tuning
            },
            ..o
        };
        let c = AttentionPlan::new(&ctx, &p, &forced).unwrap();
        assert_ne!(a.key(), c.key());
    }
}
