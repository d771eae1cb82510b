//! `tessera bench gemm`: the shapes of issue 47. fp16 and bf16 squares (2048, 4096, 8192) and
//! Llama projections ((4096, 4096, 4096), (4096, 14336, 4096), (4096, 4096, 14336),
//! (4096, 28672, 8192), (4096, 8192, 28672)), all with B stored [N, K]; decode (M in {1, 8, 16},
//! (N, K) in {(4096, 4096), (14336, 4096), (4096, 14336)}); bias + GELU at (4096, 14336, 4096);
//! exact fp32 and fp64 at 4096^3; a few forced paths; SwiGLU at (4096, 14336, 4096) bf16 with B
//! as [2N, K] (one GEMM over the interleaved 2N-wide weight; the baseline is torch's two GEMMs
//! plus `silu(g) * u`; TFLOP/s count the 2 M 2N K flops of both projections). TFLOP/s for every row, GB/s (weight and
//! activation bytes once) for decode.
//!
//! Timing is `runtime::time_median` (DESIGN.md's method) over rotating input sets that together
//! span more than twice the L2, so weights are read from memory as in a real model. Before
//! timing, the output of the first set is checked against the f64 reference on a sample of rows
//! (the bound of `reference`); a failure aborts the case. Baselines: `scripts/baselines/
//! bench_torch.py --op gemm` (torch.mm / torch.addmm / torch._addmm_activation, i.e. cuBLAS and
//! cuBLASLt) on the same shapes.

use serde_json::{json, Value};

use super::plan::{GemmOptions, GemmPath, GemmPlan, GemmTuning};
use super::problem::{Activation, COperand, GemmOperands, GemmProblem, Glu, Layout, Precision};
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
    /// A GLU epilogue (B has 2N interleaved gate/up columns).
    pub glu: Glu,
    pub path: GemmPath,
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
        if self.glu.is_some() {
            s.push_str(&format!(" {}", self.glu.name()));
        }
        s
    }
    /// `tessera` for the dispatcher's choice, `tessera-<path>` when forced.
    pub fn implementation(&self) -> String {
        match self.path {
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
            "glu": self.glu.name(),
        })
    }
    pub fn problem(&self) -> GemmProblem {
        GemmProblem::new(self.precision, self.out, self.m, self.n, self.k)
            .b_layout(self.b_layout)
            .bias(self.bias)
            .activation(self.activation)
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
            _ => DType::F32,
        },
        m,
        n,
        k,
        b_layout: Layout::ColMajor,
        bias: false,
        activation: Activation::None,
        glu: Glu::None,
        path: GemmPath::Auto,
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
    // decode through the general kernel, for the skinny path's gain
    for m in [1, 16] {
        out.push(BenchCase {
            path: GemmPath::Sm80,
            ..case(Precision::BF16, m, 4096, 4096)
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
    out
}

pub fn bench_case(ctx: &Context, case: &BenchCase, seed: u64, timing: TimingOptions) -> Result<BenchOutcome> {
    let input = case.precision.input_dtype()?;
    crate::dispatch_float!("gemm bench"; input, [F16, BF16, F32, F64], |I| {
        crate::dispatch_float!("gemm bench"; case.out, [F16, BF16, F32, F64], |O| run::<I, O>(ctx, case, seed, timing))
    })
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
            },
        },
    )?;
    let (br, bc) = p.b_stored();
    let set_bytes = (p.m * p.k + p.k * p.b_n()) * std::mem::size_of::<I>();
    let sets = ROTATE_BYTES
        .div_ceil(set_bytes.max(1))
        .clamp(1, MAX_SETS)
        .min((MAX_ROTATE_TOTAL / set_bytes.max(1)).max(1));
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
    let s = t.median_ms * 1e-3;
    let bytes = (p.m * p.k + p.k * p.b_n()) * std::mem::size_of::<I>() + p.m * p.n * std::mem::size_of::<O>();
    let mut params = case.params();
    params["path"] = json!(plan.path().name());
    params["kernel"] = json!(plan.kernel_name());
    params["splits"] = json!(plan.splits());
    Ok(BenchOutcome {
        case: case.name(),
        params,
        implementation: case.implementation(),
        ms: t.median_ms,
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
    })
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
