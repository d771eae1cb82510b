//! `tessera.scaled_mm` and `tessera.int_mm` as Python sees them (`python/tessera/_scaled_mm.py`
//! wraps and documents them): torch's `torch._scaled_mm` / `torch._int_mm` contracts mapped
//! onto tessera's tensor-core GEMM, the Hopper path on sm_90 and the mma.sync (sm80) path on
//! sm_80+ (fp8: sm_89+) ([`GemmProblem`] with [`Precision::Fp8E4M3`], `Fp8E5M2` or `Int8`
//! and [`GemmScales`]).
//!
//! Both take `a` `[M, K]` row-major and `b` `[K, N]` column-major, the transposed view `w.t()` of
//! a row-major `[N, K]` weight (tessera's `Layout::ColMajor` B, stored `[N, K]`), and are 2-D only.
//! `scaled_mm` multiplies the f32 accumulator of element (m, n) by `scale_a * scale_b`: one value
//! each ([`GemmScales::PerTensor`], `[1]` views) or `scale_a [M, 1]` and `scale_b [1, N]`
//! ([`GemmScales::RowWise`], `[M]` and `[N]` views); a per-tensor scale beside a row-wise one is
//! not supported yet. fp8 inputs may also write an fp8 output (`float8_e4m3fn` or `float8_e5m2`):
//! `fp8(scale_result * d)`, with the optional one-value `scale_result` and the optional output
//! amax (`GemmPlan::run_scaled_amax`, max |d| before the result scale); an fp8 output takes no
//! bias. `int_mm` writes the exact int32 product, no epilogue.
//!
//! `check_*` validates without a device, including the Hopper path's address-free rules
//! (16-byte leading dimensions for TMA) as if the device were sm_90, so argument errors are the
//! same with and without a GPU; the run functions validate again, fetch or make the plan for
//! (device, stream, problem) and launch on the caller's stream with the GIL released. Before
//! sm_80 (fp8: sm_89) the plan fails with tessera's `Unsupported` error.

use pyo3::prelude::*;
use tessera::gemm::plan::hopper_rule_broken;
use tessera::gemm::{
    COperand, GemmOperands, GemmOptions, GemmPlan, GemmProblem, GemmScaleOperands, GemmScales, Layout, Precision,
};
use tessera::runtime::Arch;
use tessera::DType;

use crate::cache::{self, StreamId, GEMM_PLANS};
use crate::desc::{Desc, RawDesc};
use crate::errors::{invalid, to_py, IntoPy};
use crate::gemm::{check_bias, layout_of, view, view_mut, TorchName};

/// A stored-form view: `(shape, strides)`.
type Stored = (Vec<usize>, Vec<usize>);

/// A validated scaled_mm / int_mm call: the problem and the views the plan takes.
struct LowpMm {
    problem: GemmProblem,
    a: Stored,
    b: Stored,
    d: Stored,
    /// `(scale_a, scale_b)` views (`[1]`/`[1]` or `[M]`/`[N]`, stride 1); none for int_mm.
    scales: Option<(Stored, Stored)>,
}

/// Which function is being validated (its name in errors and its dtype rules).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    ScaledMm,
    IntMm,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::ScaledMm => "scaled_mm",
            Op::IntMm => "int_mm",
        }
    }
}

/// Parses input `arg` of `op`, checking its dtype first so the error names torch's dtypes.
fn input_desc(op: Op, arg: &'static str, raw: RawDesc) -> PyResult<Desc> {
    let ok = match op {
        Op::ScaledMm => matches!(raw.1.as_str(), "float8_e4m3fn" | "float8_e5m2" | "int8"),
        Op::IntMm => raw.1 == "int8",
    };
    if !ok {
        let want = match op {
            Op::ScaledMm => "float8_e4m3fn or float8_e5m2 (torch._scaled_mm's inputs), or int8 (dequantised)",
            Op::IntMm => "int8 (torch._int_mm's inputs)",
        };
        return Err(invalid(
            arg,
            format!("has dtype {}; tessera.{} takes {want}", raw.1, op.name()),
        ));
    }
    Desc::new(arg, raw)
}

fn precision_of(dtype: DType) -> Precision {
    match dtype {
        DType::F8E4M3 => Precision::Fp8E4M3,
        DType::F8E5M2 => Precision::Fp8E5M2,
        _ => Precision::Int8,
    }
}

/// Leading dimension of a logical `rows x cols` matrix read column-major (rows contiguous), or
/// `None`. Unlike [`layout_of`] this prefers column-major for a single column, so `w.t()` of a
/// `[1, K]` weight is read as B stored `[1, K]`.
fn col_major_ld(rows: usize, cols: usize, sr: usize, sc: usize) -> Option<usize> {
    if rows == 0 {
        return Some(1); // K = 0: nothing is read
    }
    if rows == 1 || sr == 1 {
        let ld = if cols <= 1 { rows.max(1) } else { sc };
        if ld >= rows.max(1) {
            return Some(ld);
        }
    }
    None
}

/// A scale argument: one value for the whole operand, or one per row of A / column of B.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Scale {
    Tensor,
    Vector,
}

/// Classifies `scale_a` (`len` = M: one value or `[M, 1]`) or `scale_b` (`len` = N: one value
/// or `[1, N]`).
fn scale_kind(arg: &'static str, s: &Desc, len: usize) -> PyResult<Scale> {
    if s.dtype != DType::F32 {
        return Err(invalid(
            arg,
            format!(
                "has dtype {}; scales are float32 (as torch._scaled_mm's)",
                s.dtype.name_torch()
            ),
        ));
    }
    let numel: usize = s.shape.iter().product();
    let (want, stride_at) = if arg == "scale_a" {
        (vec![len, 1], 0)
    } else {
        (vec![1, len], 1)
    };
    if numel == 1 {
        return Ok(Scale::Tensor);
    }
    if s.shape != want {
        return Err(invalid(
            arg,
            format!(
                "has shape {:?}; it must hold one value (per-tensor scaling: shape [], [1] or [1, 1]) or be {want:?} \
                 (row-wise scaling)",
                s.shape
            ),
        ));
    }
    if s.strides[stride_at] != 1 {
        return Err(invalid(
            arg,
            format!(
                "has shape {:?} and strides {:?}; a row-wise scale must be contiguous",
                s.shape, s.strides
            ),
        ));
    }
    Ok(Scale::Vector)
}

/// The scaling of a call from its two scale arguments. A one-value scale of an operand with one
/// row (M = 1) or column (N = 1) is also its row-wise vector, so it pairs with a row-wise other.
fn scaling(sa: &Desc, sb: &Desc, m: usize, n: usize) -> PyResult<GemmScales> {
    let (ka, kb) = (scale_kind("scale_a", sa, m)?, scale_kind("scale_b", sb, n)?);
    Ok(match (ka, kb) {
        (Scale::Tensor, Scale::Tensor) => GemmScales::PerTensor,
        (Scale::Vector, Scale::Vector) => GemmScales::RowWise,
        (Scale::Tensor, Scale::Vector) if m == 1 => GemmScales::RowWise,
        (Scale::Vector, Scale::Tensor) if n == 1 => GemmScales::RowWise,
        (Scale::Tensor, Scale::Vector) => {
            return Err(mixed_scales(
                "scale_a",
                "scale_b",
                &format!("scale_a.expand({m}, 1).contiguous()"),
            ))
        }
        (Scale::Vector, Scale::Tensor) => {
            return Err(mixed_scales(
                "scale_b",
                "scale_a",
                &format!("scale_b.expand(1, {n}).contiguous()"),
            ))
        }
    })
}

fn mixed_scales(one: &str, vector: &str, fix: &str) -> PyErr {
    to_py(tessera::Error::Unsupported(format!(
        "`{one}` is one value (per-tensor) while `{vector}` is row-wise: mixing per-tensor and row-wise \
         scales is not supported yet; pass both per-tensor or both row-wise (e.g. `{one}` = {fix})"
    )))
}

fn is_fp8(dtype: DType) -> bool {
    matches!(dtype, DType::F8E4M3 | DType::F8E5M2)
}

/// The output dtypes of scaled_mm for inputs of `input` (bfloat16, float16, float32; and the fp8
/// formats for fp8 inputs), named as torch names them. An int32 output of int8 inputs is left to
/// the problem's own error (it is the plain product, `int_mm`).
fn check_scaled_out(input: DType, out: DType) -> PyResult<()> {
    let plain_int = input == DType::I8 && out == DType::I32;
    if plain_int || matches!(out, DType::BF16 | DType::F16 | DType::F32) || (is_fp8(input) && is_fp8(out)) {
        return Ok(());
    }
    let supported = if is_fp8(input) {
        "bfloat16, float16, float32, float8_e4m3fn or float8_e5m2"
    } else {
        "bfloat16, float16 or float32 (the int32 product dequantised; fp8 outputs take fp8 inputs)"
    };
    Err(to_py(tessera::Error::Unsupported(format!(
        "`out_dtype` = {} with {} inputs: tessera.scaled_mm writes {supported}",
        out.name_torch(),
        input.name_torch()
    ))))
}

/// The optional one-value f32 tensors of an fp8 output: `scale_result` (read) and `amax`
/// (written). Either is an error with another output; any shape of one element is accepted
/// (`[]`, `[1]`, `[1, 1]`, as torch's per-tensor scales).
fn check_fp8_extra(arg: &'static str, x: &Desc, out: DType) -> PyResult<()> {
    if !is_fp8(out) {
        let what = if arg == "amax" {
            "the output amax is computed for fp8 outputs only"
        } else {
            "the result scale applies to fp8 outputs only (torch._scaled_mm ignores it for wider outputs)"
        };
        return Err(invalid(
            arg,
            format!(
                "given with a {} output: {what} (out_dtype float8_e4m3fn or float8_e5m2); pass {arg}=None",
                out.name_torch()
            ),
        ));
    }
    let numel: usize = x.shape.iter().product();
    if x.dtype != DType::F32 || numel != 1 {
        return Err(invalid(
            arg,
            format!(
                "has dtype {} and shape {:?}; it must be a float32 tensor of one element (e.g. shape [], [1] or [1, 1])",
                x.dtype.name_torch(),
                x.shape
            ),
        ));
    }
    Ok(())
}

/// Whether the `amax` element (4 bytes at `amax`) lies within the bytes `x` addresses: it is
/// zeroed before the kernel runs, so it must not be an input, a scale or the output.
fn overlaps(amax: u64, x: &Desc) -> bool {
    if amax == 0 || x.ptr == 0 || x.shape.contains(&0) {
        return false;
    }
    let last: u128 = x
        .shape
        .iter()
        .zip(&x.strides)
        .map(|(&n, &s)| (n as u128 - 1) * s as u128)
        .sum();
    let end = x.ptr as u128 + (last + 1) * x.dtype.size() as u128;
    (amax as u128) + 4 > x.ptr as u128 && (amax as u128) < end
}

/// The result scale and the amax of a scaled_mm call (both optional), checked against the
/// output and the other tensors.
fn check_extras(
    d: &Desc,
    scale_result: Option<&Desc>,
    amax: Option<&Desc>,
    others: &[(&'static str, Option<&Desc>)],
) -> PyResult<()> {
    if let Some(sr) = scale_result {
        check_fp8_extra("scale_result", sr, d.dtype)?;
    }
    if let Some(am) = amax {
        check_fp8_extra("amax", am, d.dtype)?;
        for (name, x) in others
            .iter()
            .chain([("out", Some(d)), ("scale_result", scale_result)].iter())
        {
            if let Some(x) = x {
                if overlaps(am.ptr, x) {
                    return Err(invalid(
                        "amax",
                        format!(
                            "shares memory with `{name}`; it is zeroed before the GEMM runs, so it must be a \
                             tensor of its own"
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

fn lowp_problem(
    op: Op,
    a: &Desc,
    b: &Desc,
    scales: Option<(&Desc, &Desc)>,
    bias: Option<&Desc>,
    d: &Desc,
) -> PyResult<LowpMm> {
    for (arg, x, want) in [("a", a, "[M, K]"), ("b", b, "[K, N]")] {
        if x.shape.len() != 2 {
            return Err(invalid(
                arg,
                format!(
                    "must be 2-D {want}, got shape {:?}; tessera.{} takes no batch",
                    x.shape,
                    op.name()
                ),
            ));
        }
    }
    if b.dtype != a.dtype {
        return Err(invalid(
            "b",
            format!(
                "has dtype {}, a has {}: both inputs must have one dtype (tessera has no mixed-format GEMM)",
                b.dtype.name_torch(),
                a.dtype.name_torch()
            ),
        ));
    }
    let (m, k) = (a.shape[0], a.shape[1]);
    let (kb, n) = (b.shape[0], b.shape[1]);
    if kb != k {
        return Err(invalid(
            "b",
            format!(
                "shape {:?} cannot multiply a of shape {:?}: b has {kb} rows, a has {k} columns",
                b.shape, a.shape
            ),
        ));
    }
    let lda = match layout_of(m, k, a.strides[0], a.strides[1]) {
        Some((Layout::RowMajor, ld)) => ld,
        _ => {
            return Err(invalid(
                "a",
                format!(
                    "strides {:?} of shape {:?} are not row-major: tessera.{} reads A [M, K] with its last \
                     dimension contiguous (as torch._scaled_mm); pass a.contiguous()",
                    a.strides,
                    a.shape,
                    op.name()
                ),
            ))
        }
    };
    let ldb = col_major_ld(k, n, b.strides[0], b.strides[1]).ok_or_else(|| {
        let row_major = matches!(layout_of(k, n, b.strides[0], b.strides[1]), Some((Layout::RowMajor, _)));
        invalid(
            "b",
            format!(
                "strides {:?} of shape {:?} are {}; tessera.{} reads B column-major ([K, N] with its first \
                 dimension contiguous, stored [N, K]): pass a row-major [N, K] weight w as w.t()",
                b.strides,
                b.shape,
                if row_major {
                    "row-major"
                } else {
                    "neither row- nor column-major"
                },
                op.name()
            ),
        )
    })?;
    if d.shape != [m, n] {
        return Err(invalid(
            "out",
            format!("has shape {:?}; the product is [{m}, {n}]", d.shape),
        ));
    }
    let ldd = match layout_of(m, n, d.strides[0], d.strides[1]) {
        Some((Layout::RowMajor, ld)) => ld,
        _ => {
            return Err(invalid(
                "out",
                format!(
                    "strides {:?} are not row-major: its last dimension must be contiguous",
                    d.strides
                ),
            ))
        }
    };
    if d.ptr != 0 && (d.ptr == a.ptr || d.ptr == b.ptr) {
        return Err(invalid(
            "out",
            "shares memory with an input; the GEMM cannot write in place",
        ));
    }
    if op == Op::IntMm && d.dtype != DType::I32 {
        return Err(invalid(
            "out",
            format!("has dtype {}; int_mm writes int32", d.dtype.name_torch()),
        ));
    }
    if op == Op::ScaledMm {
        check_scaled_out(a.dtype, d.dtype)?;
    }
    if let Some(bias) = bias {
        if is_fp8(d.dtype) {
            return Err(to_py(tessera::Error::Unsupported(format!(
                "`bias` with a {} output: tessera's fp8 outputs take no bias (torch._scaled_mm accepts a \
                 bfloat16 or float16 one there); pass bias=None, or ask for a bfloat16 or float16 output, which \
                 takes a bias of its own dtype",
                d.dtype.name_torch()
            ))));
        }
        check_bias(bias, n, d.dtype)?;
    }
    let gemm_scales = match scales {
        Some((sa, sb)) => scaling(sa, sb, m, n)?,
        None => GemmScales::None,
    };
    let mut problem = GemmProblem::new(precision_of(a.dtype), d.dtype, m, n, k)
        .b_layout(Layout::ColMajor)
        .bias(bias.is_some())
        .scales(gemm_scales);
    problem.lda = lda;
    problem.ldb = ldb;
    problem.ldd = ldd;
    problem.validate().py_err()?;
    // The Hopper path's rules that need no address (16-byte TMA strides, K >= 1), checked as if
    // on sm_90 so the error is the same without a device; an empty product launches nothing.
    if m > 0 && n > 0 && k > 0 {
        if let Some(e) = hopper_rule_broken(&problem, Arch::SM90) {
            return Err(to_py(e));
        }
    }
    let vec1 = |len: usize| (vec![len], vec![1]);
    let scales = match gemm_scales {
        GemmScales::None => None,
        GemmScales::PerTensor => Some((vec1(1), vec1(1))),
        GemmScales::RowWise => Some((vec1(m), vec1(n))),
    };
    Ok(LowpMm {
        a: (vec![m, k], vec![lda, 1]),
        b: (vec![n, k], vec![ldb, 1]),
        d: (vec![m, n], vec![ldd, 1]),
        scales,
        problem,
    })
}

fn scale_name(s: GemmScales) -> &'static str {
    match s {
        GemmScales::None => "none",
        GemmScales::PerTensor => "tensor",
        GemmScales::RowWise => "row",
    }
}

/// Parses the out / bias argument (any dtype tessera knows; the problem checks which).
fn out_desc(arg: &'static str, raw: RawDesc) -> PyResult<Desc> {
    Desc::new(arg, raw)
}

/// The parsed tensors of one scaled_mm call.
struct ScaledArgs {
    a: Desc,
    b: Desc,
    sa: Desc,
    sb: Desc,
    bias: Option<Desc>,
    scale_result: Option<Desc>,
    amax: Option<Desc>,
    d: Desc,
}

/// Parses and validates a scaled_mm call (no device needed).
#[allow(clippy::too_many_arguments)]
fn scaled_args(
    a: RawDesc,
    b: RawDesc,
    scale_a: RawDesc,
    scale_b: RawDesc,
    bias: Option<RawDesc>,
    out: RawDesc,
    scale_result: Option<RawDesc>,
    amax: Option<RawDesc>,
) -> PyResult<(ScaledArgs, LowpMm)> {
    let (a, b) = (input_desc(Op::ScaledMm, "a", a)?, input_desc(Op::ScaledMm, "b", b)?);
    let (sa, sb) = (Desc::new("scale_a", scale_a)?, Desc::new("scale_b", scale_b)?);
    let d = out_desc("out", out)?;
    let bias = bias.map(|x| out_desc("bias", x)).transpose()?;
    let scale_result = scale_result.map(|x| Desc::new("scale_result", x)).transpose()?;
    let amax = amax.map(|x| Desc::new("amax", x)).transpose()?;
    let mm = lowp_problem(Op::ScaledMm, &a, &b, Some((&sa, &sb)), bias.as_ref(), &d)?;
    check_extras(
        &d,
        scale_result.as_ref(),
        amax.as_ref(),
        &[
            ("a", Some(&a)),
            ("b", Some(&b)),
            ("scale_a", Some(&sa)),
            ("scale_b", Some(&sb)),
        ],
    )?;
    let args = ScaledArgs {
        a,
        b,
        sa,
        sb,
        bias,
        scale_result,
        amax,
        d,
    };
    Ok((args, mm))
}

/// Validates `out = fp8?(scale_result * ((a @ b) * scale_a * scale_b + bias))` without a device
/// (`out` may carry address 0), with the optional `scale_result` and `amax` of an fp8 output;
/// returns the scaling, `"tensor"` or `"row"`.
#[pyfunction]
#[pyo3(signature = (a, b, scale_a, scale_b, bias, out, scale_result = None, amax = None))]
#[allow(clippy::too_many_arguments)]
pub fn check_scaled_mm(
    a: RawDesc,
    b: RawDesc,
    scale_a: RawDesc,
    scale_b: RawDesc,
    bias: Option<RawDesc>,
    out: RawDesc,
    scale_result: Option<RawDesc>,
    amax: Option<RawDesc>,
) -> PyResult<&'static str> {
    let (_, mm) = scaled_args(a, b, scale_a, scale_b, bias, out, scale_result, amax)?;
    Ok(scale_name(mm.problem.scales))
}

/// Validates `out = a @ b` (int8 in, int32 out) without a device (`out` may carry address 0).
#[pyfunction]
pub fn check_int_mm(a: RawDesc, b: RawDesc, out: RawDesc) -> PyResult<()> {
    let (a, b) = (input_desc(Op::IntMm, "a", a)?, input_desc(Op::IntMm, "b", b)?);
    let d = out_desc("out", out)?;
    lowp_problem(Op::IntMm, &a, &b, None, None, &d)?;
    Ok(())
}

/// The result scale and amax of an fp8-output scaled_mm call (both optional).
#[derive(Default)]
struct Fp8Extras<'a> {
    scale_result: Option<&'a Desc>,
    amax: Option<&'a Desc>,
}

/// Fetches or makes the plan of `mm` on (device, stream) and runs it with the GIL released;
/// returns the kernel path that ran.
fn launch(
    py: Python<'_>,
    device: usize,
    stream: StreamId,
    tensors: (&Desc, &Desc, Option<&Desc>, &Desc),
    scales: Option<(&Desc, &Desc)>,
    extras: Fp8Extras<'_>,
    mm: &LowpMm,
) -> PyResult<&'static str> {
    let (a, b, bias, d) = tensors;
    let (av, bv) = (view(a, &mm.a)?, view(b, &mm.b)?);
    let mut dv = view_mut(d, &mm.d)?;
    let biasv = bias.map(|x| x.view()).transpose()?;
    let one = (vec![1], vec![1]);
    let result = extras.scale_result.map(|x| view(x, &one)).transpose()?;
    let mut amaxv = extras.amax.map(|x| view_mut(x, &one)).transpose()?;
    let scale_views = match (scales, &mm.scales) {
        (Some((sa, sb)), Some((va, vb))) => GemmScaleOperands {
            a: Some(view(sa, va)?),
            b: Some(view(sb, vb)?),
            result,
        },
        _ => GemmScaleOperands::default(),
    };
    let opts = GemmOptions::default();
    py.detach(|| {
        cache::with_device(device, |_| {
            let plan = GEMM_PLANS.get_or_make(device, stream, (mm.problem.clone(), opts), || {
                // SAFETY: `stream` is the caller's current stream of `device` (torch's, or one the
                // caller named), which outlives the plan (module docs of `cache`).
                let ctx = unsafe { cache::context_on(device, stream) }?;
                GemmPlan::new(&ctx, &mm.problem, &opts)
            })?;
            let ops = GemmOperands {
                a: av,
                b: bv,
                c: COperand::None,
                bias: biasv,
                residual: None,
            };
            match amaxv.as_mut() {
                Some(amax) => plan.run_scaled_amax(1.0, 0.0, &ops, &scale_views, &mut dv, amax)?,
                None => plan.run_scaled(1.0, 0.0, &ops, &scale_views, &mut dv)?,
            }
            Ok(plan.path().name())
        })
    })
    .py_err()
}

/// `out = fp8?(scale_result * ((a @ b) * scale_a * scale_b + bias))` on `stream` of `device`
/// (fp8 or int8 in; sm_90 Hopper path, or the sm80 path on sm_80+, fp8 sm_89+), writing the output amax into `amax` if given (fp8 outputs); returns
/// the kernel path that ran (`"hopper"` or `"sm80"`).
#[pyfunction]
#[pyo3(signature = (device, stream, a, b, scale_a, scale_b, bias, out, scale_result = None, amax = None))]
#[allow(clippy::too_many_arguments)]
pub fn scaled_mm(
    py: Python<'_>,
    device: usize,
    stream: StreamId,
    a: RawDesc,
    b: RawDesc,
    scale_a: RawDesc,
    scale_b: RawDesc,
    bias: Option<RawDesc>,
    out: RawDesc,
    scale_result: Option<RawDesc>,
    amax: Option<RawDesc>,
) -> PyResult<&'static str> {
    let (x, mm) = scaled_args(a, b, scale_a, scale_b, bias, out, scale_result, amax)?;
    let extras = Fp8Extras {
        scale_result: x.scale_result.as_ref(),
        amax: x.amax.as_ref(),
    };
    launch(
        py,
        device,
        stream,
        (&x.a, &x.b, x.bias.as_ref(), &x.d),
        Some((&x.sa, &x.sb)),
        extras,
        &mm,
    )
}

/// `out = a @ b` (int8 in, exact int32 out) on `stream` of `device` (sm_80+); returns the kernel
/// path that ran (`"hopper"` or `"sm80"`).
#[pyfunction]
pub fn int_mm(
    py: Python<'_>,
    device: usize,
    stream: StreamId,
    a: RawDesc,
    b: RawDesc,
    out: RawDesc,
) -> PyResult<&'static str> {
    let (a, b) = (input_desc(Op::IntMm, "a", a)?, input_desc(Op::IntMm, "b", b)?);
    let d = out_desc("out", out)?;
    let mm = lowp_problem(Op::IntMm, &a, &b, None, None, &d)?;
    launch(py, device, stream, (&a, &b, None, &d), None, Fp8Extras::default(), &mm)
}
