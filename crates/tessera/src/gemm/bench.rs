//! `tessera bench gemm`: the shapes of issue 47. fp16 and bf16 squares (2048, 4096, 8192) and
//! Llama projections ((4096, 4096, 4096), (4096, 14336, 4096), (4096, 4096, 14336),
//! (4096, 28672, 8192), (4096, 8192, 28672)), all with B stored [N, K]; decode (M in {1, 8, 16},
//! (N, K) in {(4096, 4096), (14336, 4096), (4096, 14336)}); K-heavy (128, 128, 65536) and
//! (256, 256, 32768); bias + GELU at (4096, 14336, 4096);
//! exact fp32 and fp64 at 4096^3; fp8 e4m3 with per-tensor and row-wise scales on the bf16
//! shapes, int8 (s32 out) at 8192^3 and (4096, 14336, 4096), tf32 at 4096^3 and 8192^3; a few
//! forced paths; SwiGLU at (4096, 14336, 4096) bf16 with B as [2N, K] (one GEMM over the
//! interleaved 2N-wide weight; the baseline is torch's two GEMMs plus `silu(g) * u`; TFLOP/s
//! count the 2 M 2N K flops of both projections). TFLOP/s for every row, GB/s (weight and
//! activation bytes once) for decode.
//!
//! Timing is `runtime::time_median` (DESIGN.md's method) over rotating input sets that together
//! span more than twice the L2, so weights are read from memory as in a real model. Before
//! timing, the output of the first set is checked against the f64 reference on a sample of rows
//! (the bound of `reference`); a failure aborts the case. Baselines: `scripts/baselines/
//! bench_torch.py --op gemm` (torch.mm / torch.addmm / torch._addmm_activation, i.e. cuBLAS and
//! cuBLASLt; torch._scaled_mm for fp8, torch._int_mm for int8, torch.mm with TF32 allowed for
//! tf32) on the same shapes.

use serde_json::{json, Value};

use super::plan::{GemmOptions, GemmPath, GemmPlan, GemmTuning};
use super::problem::{
    Activation, COperand, GemmOperands, GemmProblem, GemmScaleOperands, GemmScales, Glu, Layout, Precision,
};
use super::reference::{self, Logical};
use crate::check::{compare, to_f64_vec};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::harness::BenchOutcome;
use crate::runtime::{time_median, Context, DeviceBuffer, TimingOptions};
use crate::testdata::{random_matrix, Dist};

/// Bytes the rotating input sets span together (twice a 60 MiB L2, as bench_common.py).
const ROTATE_BYTES: usize = 120 << 20;
/// Most rotating sets, and most bytes they may take.
const MAX_SETS: usize = 16;
const MAX_ROTATE_TOTAL: usize = 4 << 30;

/// How many copies of A and B (`set_bytes` per copy) the timed loop rotates through: enough to
/// cover ROTATE_BYTES (more than the L2), at most MAX_SETS and MAX_ROTATE_TOTAL bytes, at least 1.
fn rotation_sets(set_bytes: usize) -> usize {
    let set_bytes = set_bytes.max(1);
    ROTATE_BYTES
        .div_ceil(set_bytes)
        .clamp(1, MAX_SETS)
        .min((MAX_ROTATE_TOTAL / set_bytes).max(1))
}

/// The result scale of the fp8-output rows: N(0, 1) operands give |d| up to a few hundred at
/// K = 4096 with the scales, past e4m3's 448; scaled by 1/16 they stay well inside it.
const FP8_RESULT_SCALE: f32 = 0.0625;

/// Rows of D checked against the reference before timing.
const CHECK_ROWS: usize = 12;

/// One benchmark case.
#[derive(Clone, Debug)]
pub struct BenchCase {
    pub precision: Precision,
    pub out: DType,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub b_layout: Layout,
    pub bias: bool,
    pub activation: Activation,
    /// Dequantisation scales (fp8 and int8 rows).
    pub scales: GemmScales,
    /// A GLU epilogue (B has 2N interleaved gate/up columns).
    pub glu: Glu,
    pub path: GemmPath,
    /// Plan with [`GemmTuning::autotune`] (the Hopper path's tiling and splits timed).
    pub autotune: bool,
    /// [`GemmTuning::hopper_cluster`] forced (`tessera-cluster<n>` rows beside the rule's).
    pub hopper_cluster: Option<u32>,
    /// [`GemmTuning::hopper_pingpong`] forced on (`tessera-pingpong` rows beside the rule's).
    pub pingpong: bool,
}

impl BenchCase {
    pub fn name(&self) -> String {
        let mut s = format!(
            "gemm {} {}x{}x{} {}",
            self.precision.name(),
            self.m,
            self.n,
            self.k,
            if self.b_layout == Layout::ColMajor {
                "B[N,K]"
            } else {
                "B[K,N]"
            }
        );
        if self.out.name() != self.precision.name() {
            s.push_str(&format!(" ->{}", self.out));
        }
        if self.bias {
            s.push_str(" bias");
        }
        if self.activation != Activation::None {
            s.push_str(&format!(" {}", self.activation.name()));
        }
        match self.scales {
            GemmScales::None => {}
            GemmScales::PerTensor => s.push_str(" tensor-scales"),
            GemmScales::RowWise => s.push_str(" row-scales"),
        }
        if self.glu.is_some() {
            s.push_str(&format!(" {}", self.glu.name()));
        }
        s
    }
    /// `tessera` for the dispatcher's choice, `tessera-<path>` when forced,
    /// `tessera-autotuned` with the autotune on, `tessera-cluster<n>` with a forced cluster size.
    pub fn implementation(&self) -> String {
        match self.path {
            _ if self.autotune => "tessera-autotuned".into(),
            _ if self.hopper_cluster.is_some() => format!("tessera-cluster{}", self.hopper_cluster.unwrap_or(1)),
            _ if self.pingpong => "tessera-pingpong".into(),
            GemmPath::Auto => "tessera".into(),
            p => format!("tessera-{}", p.name()),
        }
    }
    pub fn params(&self) -> Value {
        json!({
            "M": self.m, "N": self.n, "K": self.k, "batch": 1,
            "dtype": self.precision.name(), "out": self.out.name(),
            "b_layout": if self.b_layout == Layout::ColMajor { "nk" } else { "kn" },
            "bias": self.bias, "activation": self.activation.name(),
            "scales": match self.scales {
                GemmScales::None => "none",
                GemmScales::PerTensor => "tensor",
                GemmScales::RowWise => "row",
            },
            "glu": self.glu.name(),
            // an fp8 output's result scale (run_quantized), for the baseline's scale_result
            "result_scale": (self.out.size() == 1).then_some(FP8_RESULT_SCALE),
        })
    }
    pub fn problem(&self) -> GemmProblem {
        GemmProblem::new(self.precision, self.out, self.m, self.n, self.k)
            .b_layout(self.b_layout)
            .bias(self.bias)
            .activation(self.activation)
            .scales(self.scales)
            .glu(self.glu)
    }
    /// Decode cases report GB/s.
    fn is_decode(&self) -> bool {
        self.m <= 16
    }
}

/// The benchmark cases (`quick`: a few small ones).
pub fn cases(quick: bool) -> Vec<BenchCase> {
    let case = |precision, m, n, k| BenchCase {
        precision,
        out: match precision {
            Precision::F16 => DType::F16,
            Precision::BF16 => DType::BF16,
            Precision::F64 => DType::F64,
            Precision::Fp8E4M3 | Precision::Fp8E5M2 => DType::BF16,
            Precision::Int8 => DType::I32,
            _ => DType::F32,
        },
        m,
        n,
        k,
        b_layout: Layout::ColMajor,
        bias: false,
        activation: Activation::None,
        scales: GemmScales::None,
        glu: Glu::None,
        path: GemmPath::Auto,
        autotune: false,
        hopper_cluster: None,
        pingpong: false,
    };
    if quick {
        return vec![
            case(Precision::BF16, 2048, 2048, 2048),
            case(Precision::BF16, 1, 4096, 4096),
            case(Precision::F32, 1024, 1024, 1024),
        ];
    }
    let mut out = Vec::new();
    for precision in [Precision::BF16, Precision::F16] {
        for s in [2048, 4096, 8192] {
            out.push(case(precision, s, s, s));
        }
        for (m, n, k) in [
            (4096, 14336, 4096),
            (4096, 4096, 14336),
            (4096, 28672, 8192),
            (4096, 8192, 28672),
        ] {
            out.push(case(precision, m, n, k));
        }
    }
    for m in [1, 8, 16] {
        for (n, k) in [(4096, 4096), (14336, 4096), (4096, 14336)] {
            out.push(case(Precision::BF16, m, n, k));
        }
    }
    // without clusters (B tiles loaded by each CTA), for the multicast's gain
    for (m, n, k) in [(4096, 4096, 4096), (8192, 8192, 8192), (4096, 14336, 4096)] {
        out.push(BenchCase {
            hopper_cluster: Some(1),
            ..case(Precision::BF16, m, n, k)
        });
    }
    // decode through the general kernel, for the skinny path's gain
    for m in [1, 16] {
        out.push(BenchCase {
            path: GemmPath::Sm80,
            ..case(Precision::BF16, m, 4096, 4096)
        });
    }
    // K-heavy: split K on the Hopper path; these and the smallest square once more with the
    // autotune (the same case name, another implementation: a side-by-side row)
    for (m, n, k) in [(128, 128, 65536), (256, 256, 32768), (2048, 2048, 2048)] {
        if k != 2048 {
            out.push(case(Precision::BF16, m, n, k));
        }
        out.push(BenchCase {
            autotune: true,
            ..case(Precision::BF16, m, n, k)
        });
    }
    out.push(BenchCase {
        bias: true,
        activation: Activation::GeluTanh,
        ..case(Precision::BF16, 4096, 14336, 4096)
    });
    // SwiGLU: gate and up projections of a Llama-3-8B MLP in one GEMM over B [2N, K]
    out.push(BenchCase {
        glu: Glu::SwiGlu,
        ..case(Precision::BF16, 4096, 14336, 4096)
    });
    out.push(case(Precision::F32, 4096, 4096, 4096));
    out.push(case(Precision::F64, 4096, 4096, 4096));
    out.push(BenchCase {
        path: GemmPath::Simt,
        ..case(Precision::F64, 4096, 4096, 4096)
    });
    // the Hopper-only contracts (torch._scaled_mm, torch._int_mm, TF32 cuBLAS)
    for scales in [GemmScales::PerTensor, GemmScales::RowWise] {
        for (m, n, k) in super::hopper::BENCH_SHAPES {
            out.push(BenchCase {
                scales,
                ..case(Precision::Fp8E4M3, m, n, k)
            });
        }
    }
    // fp8 out (D = fp8(scale_result d)) with the amax, as an fp8 training/inference step runs it
    for (m, n, k) in [(4096, 4096, 4096), (4096, 14336, 4096)] {
        out.push(BenchCase {
            scales: GemmScales::PerTensor,
            out: DType::F8E4M3,
            ..case(Precision::Fp8E4M3, m, n, k)
        });
    }
    for (m, n, k) in [(8192, 8192, 8192), (4096, 14336, 4096)] {
        out.push(case(Precision::Int8, m, n, k));
    }
    for s in [4096, 8192] {
        out.push(case(Precision::Tf32, s, s, s));
    }
    // the ping-pong schedule forced, beside the rules' rows: plain, the heavy epilogues, fp8
    let pingpong = |c: BenchCase| BenchCase { pingpong: true, ..c };
    for (m, n, k) in [(4096, 4096, 4096), (4096, 14336, 4096), (8192, 8192, 8192)] {
        out.push(pingpong(case(Precision::BF16, m, n, k)));
    }
    out.push(pingpong(BenchCase {
        bias: true,
        activation: Activation::GeluTanh,
        ..case(Precision::BF16, 4096, 14336, 4096)
    }));
    out.push(pingpong(BenchCase {
        glu: Glu::SwiGlu,
        ..case(Precision::BF16, 4096, 14336, 4096)
    }));
    for (m, n, k) in [(4096, 4096, 4096), (4096, 14336, 4096)] {
        out.push(pingpong(BenchCase {
            scales: GemmScales::PerTensor,
            ..case(Precision::Fp8E4M3, m, n, k)
        }));
    }
    out
}

pub fn bench_case(ctx: &Context, case: &BenchCase, seed: u64, timing: TimingOptions) -> Result<BenchOutcome> {
    if case.precision.tensor_core_only() {
        return run_quantized(ctx, case, seed, timing);
    }
    let input = case.precision.input_dtype()?;
    crate::dispatch_float!("gemm bench"; input, [F16, BF16, F32, F64], |I| {
        crate::dispatch_float!("gemm bench"; case.out, [F16, BF16, F32, F64], |O| run::<I, O>(ctx, case, seed, timing))
    })
}

/// Benchmark knob (read here only, never by the library): `TESSERA_GEMM_GROUP_ROWS=N` forces the
/// Hopper path's tile-order group ([`GemmTuning::hopper_group_rows`]) in every row.
pub fn group_rows_from_env() -> Option<u32> {
    std::env::var("TESSERA_GEMM_GROUP_ROWS")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
}

/// Benchmark knob (read here only): `TESSERA_GEMM_DMMA_STAGES=3|4` forces the fp64 DMMA path's
/// pipeline depth ([`GemmTuning::dmma_stages`]) in every row.
pub fn dmma_stages_from_env() -> Option<u32> {
    std::env::var("TESSERA_GEMM_DMMA_STAGES")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
}

fn run<I: Element, O: Element>(
    ctx: &Context,
    case: &BenchCase,
    seed: u64,
    timing: TimingOptions,
) -> Result<BenchOutcome> {
    let p = case.problem();
    let plan = GemmPlan::new(
        ctx,
        &p,
        &GemmOptions {
            tuning: GemmTuning {
                path: case.path,
                splits: None,
                autotune: case.autotune,
                hopper_cluster: case.hopper_cluster,
                hopper_pingpong: case.pingpong.then_some(true),
                hopper_group_rows: group_rows_from_env(),
                dmma_stages: dmma_stages_from_env(),
                ..GemmTuning::default()
            },
        },
    )?;
    let (br, bc) = p.b_stored();
    let set_bytes = (p.m * p.k + p.k * p.b_n()) * std::mem::size_of::<I>();
    let sets = rotation_sets(set_bytes);
    let mut a_sets: Vec<DeviceBuffer<I>> = Vec::with_capacity(sets);
    let mut b_sets: Vec<DeviceBuffer<I>> = Vec::with_capacity(sets);
    let dist = Dist::Normal { std: 1.0 };
    let host_a: Vec<I> = random_matrix(seed, p.m, p.k, p.lda, dist);
    let host_b: Vec<I> = random_matrix(seed ^ 0xb, br, bc, p.ldb, dist);
    // the first set is the checked one; the others are copies (the bytes, not the values, are
    // what the rotation is for)
    for _ in 0..sets {
        a_sets.push(ctx.upload(&host_a)?);
        b_sets.push(ctx.upload(&host_b)?);
    }
    // [N], or [2N] (interleaved gate/up biases) with a GLU
    let host_bias: Vec<O> = random_matrix(seed ^ 0xd, 1, p.b_n(), p.b_n(), dist);
    let bias = ctx.upload(&host_bias)?;
    let mut d = ctx.alloc::<O>(p.m * p.n)?;
    let ops = |s: usize| -> Result<GemmOperands<'_>> {
        Ok(GemmOperands {
            a: a_sets[s].matrix(p.m, p.k, p.lda)?,
            b: b_sets[s].matrix(br, bc, p.ldb)?,
            c: COperand::None,
            bias: if p.epilogue.bias {
                Some(bias.view(&[p.b_n()], &[1])?)
            } else {
                None
            },
            residual: None,
        })
    };
    plan.run(1.0, 0.0, &ops(0)?, &mut d.matrix_mut(p.m, p.n, p.ldd)?)?;
    let got = d.to_host()?;
    let cmp = check_rows(&p, &host_a, &host_b, &host_bias, &got)?;
    let t = time_median(ctx, timing, |i| {
        plan.run(1.0, 0.0, &ops(i % sets)?, &mut d.matrix_mut(p.m, p.n, p.ldd)?)
    })?;
    let bytes = (p.m * p.k + p.k * p.b_n()) * std::mem::size_of::<I>() + p.m * p.n * std::mem::size_of::<O>();
    Ok(outcome(case, &p, &plan, t.median_ms, bytes, cmp))
}

/// The row of a timed case: `bytes` moved once (decode rows report GB/s), the split-K
/// workspace as extra memory, the check's (max abs, rel L2).
fn outcome(case: &BenchCase, p: &GemmProblem, plan: &GemmPlan, ms: f64, bytes: usize, cmp: (f64, f64)) -> BenchOutcome {
    let s = ms * 1e-3;
    let mut params = case.params();
    params["path"] = json!(plan.path().name());
    params["kernel"] = json!(plan.kernel_name());
    params["splits"] = json!(plan.splits());
    BenchOutcome {
        case: case.name(),
        params,
        implementation: case.implementation(),
        ms,
        gbps: case.is_decode().then(|| bytes as f64 / s / 1e9),
        tflops: Some(p.flops() / s / 1e12),
        // the split-K partials
        extra_mib: Some(if plan.splits() > 1 {
            (plan.splits() * p.m * p.n * 4) as f64 / (1u64 << 20) as f64
        } else {
            0.0
        }),
        max_abs_err: Some(cmp.0),
        rel_l2: Some(cmp.1),
    }
}

/// Checks CHECK_ROWS rows of `got` (packed [M][N]) against the reference; (max abs, rel L2).
fn check_rows<I: Element, O: Element>(p: &GemmProblem, a: &[I], b: &[I], bias: &[O], got: &[O]) -> Result<(f64, f64)> {
    let rows: Vec<usize> = if p.m <= CHECK_ROWS {
        (0..p.m).collect()
    } else {
        (0..CHECK_ROWS).map(|i| i * (p.m - 1) / (CHECK_ROWS - 1)).collect()
    };
    let mut sub = p.clone();
    sub.m = rows.len();
    sub.lda = p.k;
    sub.batch_stride_a = sub.m * p.k;
    let mut a_rows = Vec::with_capacity(rows.len() * p.k);
    for &r in &rows {
        a_rows.extend(a[r * p.lda..r * p.lda + p.k].iter().map(|x| x.to_f64()));
    }
    let bf = reference::gather_b(&sub, &to_f64_vec(b));
    let biasf = to_f64_vec(bias);
    let (want, tol) = reference::gemm(
        &sub,
        &Logical {
            a: &a_rows,
            b: &bf,
            c: None,
            bias: p.epilogue.bias.then_some(&biasf[..]),
            residual: None,
        },
        1.0,
        0.0,
    );
    let mut g = Vec::with_capacity(want.len());
    for &r in &rows {
        g.extend(got[r * p.ldd..r * p.ldd + p.n].iter().map(|x| x.to_f64()));
    }
    let cmp = compare(&g, &want, 0.0, 0.0);
    let over = (0..want.len()).filter(|&e| (g[e] - want[e]).abs() > tol[e]).count();
    if !cmp.passes(O::DTYPE.rel_l2_budget().max(1e-12)) || over > 0 {
        return Err(Error::Unsupported(format!(
            "output failed verification before timing ({over} elements beyond the bound): {cmp}"
        )));
    }
    Ok((cmp.max_abs_err, cmp.rel_l2))
}

/// The tf32, fp8 and int8 rows: operands as raw bytes (the `Element` types stop at the floats),
/// scales of 1 + 3/4 U(0, 1), the output checked on CHECK_ROWS rows against an f64 product of
/// the stored operand values (int8 -> s32 must be exact), then timed like [`run`].
fn run_quantized(ctx: &Context, case: &BenchCase, seed: u64, timing: TimingOptions) -> Result<BenchOutcome> {
    use crate::numeric;
    let p = case.problem();
    if case.b_layout != Layout::ColMajor || p.epilogue.bias || p.epilogue.activation != Activation::None {
        return Err(Error::Unsupported(
            "the quantized bench rows take B [N, K] without bias or activation".into(),
        ));
    }
    let plan = GemmPlan::new(ctx, &p, &GemmOptions::default())?;
    let input = p.input()?;
    let (es, os) = (input.size(), case.out.size());
    let set_bytes = (p.m * p.k + p.k * p.n) * es;
    let sets = rotation_sets(set_bytes);
    // values: N(0, 1) for the floats (fp8 rounded, saturating), integers -64..=63 for int8
    let random_bytes = |seed: u64, len: usize| -> Vec<u8> {
        let mut bytes = vec![0u8; len * es];
        if input == DType::I8 {
            let v: Vec<f64> = random_matrix(seed, 1, len, len, Dist::Uniform { lo: -64.0, hi: 64.0 });
            for (b, x) in bytes.iter_mut().zip(v) {
                *b = (x.floor() as i8) as u8;
            }
        } else {
            let v: Vec<f32> = random_matrix(seed, 1, len, len, Dist::Normal { std: 1.0 });
            for (i, x) in v.into_iter().enumerate() {
                numeric::store(input, x, &mut bytes[i * es..]);
            }
        }
        bytes
    };
    let host_a = random_bytes(seed, p.m * p.k);
    let host_b = random_bytes(seed ^ 0xb, p.n * p.k);
    let (sa_len, sb_len) = match case.scales {
        GemmScales::RowWise => (p.m, p.n),
        _ => (1, 1),
    };
    let scale =
        |seed: u64, len: usize| -> Vec<f32> { random_matrix(seed, 1, len, len, Dist::Uniform { lo: 1.0, hi: 1.75 }) };
    let (host_sa, host_sb) = (scale(seed ^ 0x5a, sa_len), scale(seed ^ 0x5b, sb_len));
    let mut a_sets = Vec::with_capacity(sets);
    let mut b_sets = Vec::with_capacity(sets);
    for _ in 0..sets {
        a_sets.push(ctx.upload(&host_a)?);
        b_sets.push(ctx.upload(&host_b)?);
    }
    let (sa, sb) = (ctx.upload(&host_sa)?, ctx.upload(&host_sb)?);
    let mut d = ctx.alloc::<u8>(p.m * p.n * os)?;
    let out = case.out;
    let (m, n) = (p.m, p.n);
    // fp8 out: the result scale, and the amax written by every call
    let fp8_out = case.out.size() == 1;
    let result_scale = if fp8_out { FP8_RESULT_SCALE } else { 1.0 };
    let sr = ctx.upload(&[result_scale])?;
    let mut amax = ctx.alloc::<f32>(1)?;
    let mut scale_ops = GemmScaleOperands {
        result: fp8_out.then(|| sr.view(&[1], &[1])).transpose()?,
        ..GemmScaleOperands::default()
    };
    if case.scales != GemmScales::None {
        scale_ops.a = Some(sa.view(&[sa_len], &[1])?);
        scale_ops.b = Some(sb.view(&[sb_len], &[1])?);
    }
    let run = |ops: &GemmOperands<'_>, d: &mut DeviceBuffer<u8>, amax: &mut DeviceBuffer<f32>| -> Result<()> {
        let mut dv = d.view_mut_as(out, &[m, n], &[n, 1])?;
        if fp8_out {
            plan.run_scaled_amax(1.0, 0.0, ops, &scale_ops, &mut dv, &mut amax.view_mut(&[1], &[1])?)
        } else {
            plan.run_scaled(1.0, 0.0, ops, &scale_ops, &mut dv)
        }
    };
    let ops = |s: usize| -> Result<GemmOperands<'_>> {
        Ok(GemmOperands {
            a: a_sets[s].view_as(input, &[p.m, p.k], &[p.k, 1])?,
            b: b_sets[s].view_as(input, &[p.n, p.k], &[p.k, 1])?,
            c: COperand::None,
            bias: None,
            residual: None,
        })
    };
    run(&ops(0)?, &mut d, &mut amax)?;
    // check a sample of rows against the f64 product of the stored values
    let got = d.to_host()?;
    let value = |bytes: &[u8], i: usize| -> f64 {
        if input == DType::I8 {
            bytes[i] as i8 as f64
        } else {
            numeric::load(input, bytes, i)
        }
    };
    let b_f: Vec<f64> = (0..p.n * p.k).map(|i| value(&host_b, i)).collect();
    let rows: Vec<usize> = if m <= CHECK_ROWS {
        (0..m).collect()
    } else {
        (0..CHECK_ROWS).map(|i| i * (m - 1) / (CHECK_ROWS - 1)).collect()
    };
    let (mut err2, mut ref2, mut max_abs) = (0.0f64, 0.0f64, 0.0f64);
    let mut amax_want = 0.0f64; // over the checked rows: a lower bound of the whole D's
    for &r in &rows {
        let a_row: Vec<f64> = (0..p.k).map(|kk| value(&host_a, r * p.k + kk)).collect();
        for c in 0..n {
            let acc: f64 = a_row.iter().zip(&b_f[c * p.k..(c + 1) * p.k]).map(|(x, y)| x * y).sum();
            let s = host_sa[if sa_len > 1 { r } else { 0 }] as f64 * host_sb[if sb_len > 1 { c } else { 0 }] as f64;
            let want = if case.scales == GemmScales::None { acc } else { s * acc };
            amax_want = amax_want.max(want.abs());
            let want = want * result_scale as f64;
            let g = if out == DType::I32 {
                i32::from_le_bytes(got[4 * (r * n + c)..4 * (r * n + c) + 4].try_into().unwrap_or([0; 4])) as f64
            } else {
                numeric::load(out, &got, r * n + c)
            };
            let e = (g - want).abs();
            max_abs = max_abs.max(if e.is_nan() { f64::INFINITY } else { e });
            err2 += e * e;
            ref2 += want * want;
        }
    }
    let rel = (err2 / ref2.max(f64::MIN_POSITIVE)).sqrt();
    let budget = if out == DType::I32 {
        0.0
    } else {
        // the output's rounding, plus tf32's 10-bit mantissa on the operands
        out.rel_l2_budget().max(if input == DType::F32 { 2e-3 } else { 0.0 })
    };
    if rel.is_nan() || rel > budget {
        return Err(Error::Unsupported(format!(
            "output failed verification before timing: rel_l2 {rel:.3e} > {budget:.1e} (max abs {max_abs:.3e})"
        )));
    }
    if fp8_out {
        // the whole D's amax is at least the checked rows' and at most ~2x (N(0, 1) sums)
        let got_amax = amax.to_host()?[0] as f64;
        if !(got_amax >= amax_want * (1.0 - 1e-4) && got_amax <= 4.0 * amax_want) {
            return Err(Error::Unsupported(format!(
                "amax {got_amax:.4e} is not within [1, 4] x the checked rows' {amax_want:.4e}"
            )));
        }
    }
    let t = time_median(ctx, timing, |i| run(&ops(i % sets)?, &mut d, &mut amax))?;
    let bytes = (m * p.k + p.k * n) * es + m * n * os;
    Ok(outcome(case, &p, &plan, t.median_ms, bytes, (max_abs, rel)))
}
