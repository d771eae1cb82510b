//! `tessera.scaled_mm` and `tessera.int_mm` as Python sees them (`python/tessera/_scaled_mm.py`
//! wraps and documents them): torch's `torch._scaled_mm` / `torch._int_mm` contracts mapped
//! onto tessera's Hopper GEMM ([`GemmProblem`] with [`Precision::Fp8E4M3`], `Fp8E5M2` or `Int8`
//! and [`GemmScales`]).
//!
//! Both take `a` `[M, K]` row-major and `b` `[K, N]` column-major, the transposed view `w.t()` of
//! a row-major `[N, K]` weight (tessera's `Layout::ColMajor` B, stored `[N, K]`), and are 2-D only.
//! `scaled_mm` multiplies the f32 accumulator of element (m, n) by `scale_a * scale_b`: one value
//! each ([`GemmScales::PerTensor`], `[1]` views) or `scale_a [M, 1]` and `scale_b [1, N]`
//! ([`GemmScales::RowWise`], `[M]` and `[N]` views); a per-tensor scale beside a row-wise one is
//! not supported yet. `int_mm` writes the exact int32 product, no epilogue.
//!
//! `check_*` validates without a device, including the Hopper path's address-free rules
//! (16-byte leading dimensions for TMA) as if the device were sm_90, so argument errors are the
//! same with and without a GPU; the run functions validate again, fetch or make the plan for
//! (device, stream, problem) and launch on the caller's stream with the GIL released. On a device
//! other than sm_90 the plan fails with tessera's `Unsupported` error.

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
    if let Some(bias) = bias {
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

/// Validates `out = (a @ b) * scale_a * scale_b + bias` without a device (`out` may carry
/// address 0); returns the scaling, `"tensor"` or `"row"`.
#[pyfunction]
#[pyo3(signature = (a, b, scale_a, scale_b, bias, out))]
pub fn check_scaled_mm(
    a: RawDesc,
    b: RawDesc,
    scale_a: RawDesc,
    scale_b: RawDesc,
    bias: Option<RawDesc>,
    out: RawDesc,
) -> PyResult<&'static str> {
    let (a, b) = (input_desc(Op::ScaledMm, "a", a)?, input_desc(Op::ScaledMm, "b", b)?);
    let (sa, sb) = (Desc::new("scale_a", scale_a)?, Desc::new("scale_b", scale_b)?);
    let d = out_desc("out", out)?;
    let bias = bias.map(|x| out_desc("bias", x)).transpose()?;
    let mm = lowp_problem(Op::ScaledMm, &a, &b, Some((&sa, &sb)), bias.as_ref(), &d)?;
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

/// Fetches or makes the plan of `mm` on (device, stream) and runs it with the GIL released;
/// returns the kernel path that ran.
fn launch(
    py: Python<'_>,
    device: usize,
    stream: StreamId,
    tensors: (&Desc, &Desc, Option<&Desc>, &Desc),
    scales: Option<(&Desc, &Desc)>,
    mm: &LowpMm,
) -> PyResult<&'static str> {
    let (a, b, bias, d) = tensors;
    let (av, bv) = (view(a, &mm.a)?, view(b, &mm.b)?);
    let mut dv = view_mut(d, &mm.d)?;
    let biasv = bias.map(|x| x.view()).transpose()?;
    let scale_views = match (scales, &mm.scales) {
        (Some((sa, sb)), Some((va, vb))) => GemmScaleOperands {
            a: Some(view(sa, va)?),
            b: Some(view(sb, vb)?),
            result: None,
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
            plan.run_scaled(1.0, 0.0, &ops, &scale_views, &mut dv)?;
            Ok(plan.path().name())
        })
    })
    .py_err()
}

/// `out = (a @ b) * scale_a * scale_b + bias` on `stream` of `device` (fp8 or int8 in, sm_90);
/// returns the kernel path that ran (`"hopper"`).
#[pyfunction]
#[pyo3(signature = (device, stream, a, b, scale_a, scale_b, bias, out))]
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
) -> PyResult<&'static str> {
    let (a, b) = (input_desc(Op::ScaledMm, "a", a)?, input_desc(Op::ScaledMm, "b", b)?);
    let (sa, sb) = (Desc::new("scale_a", scale_a)?, Desc::new("scale_b", scale_b)?);
    let d = out_desc("out", out)?;
    let bias = bias.map(|x| out_desc("bias", x)).transpose()?;
    let mm = lowp_problem(Op::ScaledMm, &a, &b, Some((&sa, &sb)), bias.as_ref(), &d)?;
    launch(py, device, stream, (&a, &b, bias.as_ref(), &d), Some((&sa, &sb)), &mm)
}

/// `out = a @ b` (int8 in, exact int32 out) on `stream` of `device` (sm_90); returns the kernel
/// path that ran (`"hopper"`).
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
    launch(py, device, stream, (&a, &b, None, &d), None, &mm)
}
