//! `tessera.matmul` as Python sees it (`python/tessera/_matmul.py` wraps and documents it):
//! torch's strides mapped onto tessera's GEMM ([`GemmProblem`]: row- or column-major operands
//! with leading dimensions and batch strides, a fused bias and activation).
//!
//! A logical `rows x cols` operand with element strides `(sr, sc)` is row-major with leading
//! dimension `sr` when its columns are contiguous (`sc == 1`), column-major with leading
//! dimension `sc` when its rows are (`sr == 1`, the transposed view `w.t()` of a `[N, K]`
//! weight); any other stride pattern is not representable ([`operand_layout`] says `None`, and
//! the Python layer copies torch tensors with `.contiguous()`). A size-1 dimension's stride is
//! ignored, as torch ignores it. A 2-D operand beside a 3-D one is shared by every batch entry
//! (batch stride 0).
//!
//! `check_matmul` validates without a device; `matmul` validates again, fetches or makes the
//! plan for (device, stream, problem) and launches on the caller's stream with the GIL
//! released.

use pyo3::prelude::*;
use tessera::gemm::{
    Activation, COperand, GemmEpilogue, GemmOperands, GemmOptions, GemmPath, GemmPlan, GemmProblem, GemmTuning, Layout,
    Precision,
};
use tessera::runtime::{TensorView, TensorViewMut};
use tessera::DType;

use crate::cache::{self, StreamId, GEMM_PLANS};
use crate::desc::{Desc, RawDesc};
use crate::errors::{invalid, to_py, IntoPy};

/// Plans by the problem (shapes, layouts, strides, precision, epilogue) and options.
pub type GemmKey = (GemmProblem, GemmOptions);

/// The precision contract of inputs of torch dtype `dtype` (argument `arg`).
fn precision_of(arg: &'static str, dtype: &str) -> PyResult<Precision> {
    let unsupported = |what: &str| {
        to_py(tessera::Error::Unsupported(format!(
            "`{arg}` has dtype {dtype}: tessera.matmul takes float16, bfloat16, float32 and float64; \
             {what} (Hopper, sm_90, only)"
        )))
    };
    Ok(match dtype {
        "float16" => Precision::F16,
        "bfloat16" => Precision::BF16,
        "float32" => Precision::F32,
        "float64" => Precision::F64,
        d if d.starts_with("float8") => {
            return Err(unsupported(
                "fp8 inputs go through tessera.scaled_mm (torch._scaled_mm's contract: scales, B = w.t())",
            ))
        }
        "int8" => {
            return Err(unsupported(
                "int8 inputs go through tessera.int_mm (torch._int_mm: int32 out) or tessera.scaled_mm (dequantised)",
            ))
        }
        _ => {
            return Err(to_py(tessera::Error::Unsupported(format!(
                "`{arg}` has dtype {dtype}; tessera's GEMM takes float16, bfloat16, float32 and float64"
            ))))
        }
    })
}

/// The dtype of D (or of the bias, argument `arg`) named `name` (a torch dtype name).
fn out_dtype(arg: &str, name: &str) -> PyResult<DType> {
    Ok(match name {
        "float16" => DType::F16,
        "bfloat16" => DType::BF16,
        "float32" => DType::F32,
        "float64" => DType::F64,
        _ => {
            return Err(to_py(tessera::Error::Unsupported(format!(
                "`{arg}` has dtype {name}; tessera's GEMM writes float16, bfloat16, float32 or float64"
            ))))
        }
    })
}

/// `(layout, leading dimension)` of a logical `rows x cols` matrix with element strides
/// `(sr, sc)`, or `None` when it is neither row- nor column-major (module docs).
pub fn layout_of(rows: usize, cols: usize, sr: usize, sc: usize) -> Option<(Layout, usize)> {
    if cols <= 1 || sc == 1 {
        let ld = if rows <= 1 { cols.max(1) } else { sr };
        if ld >= cols.max(1) {
            return Some((Layout::RowMajor, ld));
        }
    }
    if rows <= 1 || sr == 1 {
        let ld = if cols <= 1 { rows.max(1) } else { sc };
        if ld >= rows.max(1) {
            return Some((Layout::ColMajor, ld));
        }
    }
    None
}

/// `"row"` or `"col"`: how tessera reads a 2-D or 3-D operand of `shape` and element `strides`
/// (its last two dimensions), or `None` when it cannot without a copy.
#[pyfunction]
pub fn operand_layout(shape: Vec<usize>, strides: Vec<usize>) -> Option<&'static str> {
    let r = shape.len();
    if !(2..=3).contains(&r) || strides.len() != r {
        return None;
    }
    layout_of(shape[r - 2], shape[r - 1], strides[r - 2], strides[r - 1]).map(|(l, _)| match l {
        Layout::RowMajor => "row",
        Layout::ColMajor => "col",
    })
}

/// One operand as the plan sees it: its layout, leading dimension, batch count and stride.
struct Operand {
    layout: Layout,
    ld: usize,
    /// 1 for a 2-D operand.
    batch: usize,
    batch_stride: usize,
}

fn operand(arg: &'static str, d: &Desc) -> PyResult<Operand> {
    let r = d.shape.len();
    if !(2..=3).contains(&r) {
        return Err(invalid(
            arg,
            format!("must be 2-D or 3-D (batched), got shape {:?}", d.shape),
        ));
    }
    let (rows, cols) = (d.shape[r - 2], d.shape[r - 1]);
    let (layout, ld) = layout_of(rows, cols, d.strides[r - 2], d.strides[r - 1]).ok_or_else(|| {
        invalid(
            arg,
            format!(
                "strides {:?} of shape {:?} are neither row-major (last stride 1) nor column-major \
                 (second-to-last stride 1); pass a contiguous copy",
                d.strides, d.shape
            ),
        )
    })?;
    let (batch, batch_stride) = if r == 3 { (d.shape[0], d.strides[0]) } else { (1, 0) };
    Ok(Operand {
        layout,
        ld,
        batch,
        batch_stride: if batch <= 1 { 0 } else { batch_stride },
    })
}

/// A validated matmul: the problem and the stored-form shapes and strides of each view.
struct Matmul {
    problem: GemmProblem,
    a: (Vec<usize>, Vec<usize>),
    b: (Vec<usize>, Vec<usize>),
    d: (Vec<usize>, Vec<usize>),
}

/// The view of an operand stored `rows x cols` (its stored form) with leading dimension `ld`:
/// `[rows, cols]` strides `[ld, 1]`, or `[batch, rows, cols]` strides `[stride, ld, 1]`.
fn stored(batch: usize, stride: usize, rows: usize, cols: usize, ld: usize) -> (Vec<usize>, Vec<usize>) {
    if batch > 1 {
        (vec![batch, rows, cols], vec![stride, ld, 1])
    } else {
        (vec![rows, cols], vec![ld, 1])
    }
}

fn matmul_problem(a: &Desc, b: &Desc, bias: Option<&Desc>, d: &Desc, activation: &str) -> PyResult<Matmul> {
    let precision = precision_of("a", a.dtype.name_torch())?;
    let pb = precision_of("b", b.dtype.name_torch())?;
    if pb != precision {
        return Err(invalid(
            "b",
            format!(
                "has dtype {}, a has {}: both inputs must have one dtype",
                b.dtype.name_torch(),
                a.dtype.name_torch()
            ),
        ));
    }
    let activation = parse_activation(activation)?;
    let (oa, ob) = (operand("a", a)?, operand("b", b)?);
    let (m, k) = (a.shape[a.shape.len() - 2], a.shape[a.shape.len() - 1]);
    let (kb, n) = (b.shape[b.shape.len() - 2], b.shape[b.shape.len() - 1]);
    if kb != k {
        return Err(invalid(
            "b",
            format!(
                "shape {:?} cannot multiply a of shape {:?}: b has {kb} rows, a has {k} columns",
                b.shape, a.shape
            ),
        ));
    }
    let batched = a.shape.len() == 3 || b.shape.len() == 3;
    let batch = match (a.shape.len(), b.shape.len()) {
        (3, 3) if oa.batch == ob.batch || ob.batch == 1 => oa.batch,
        (3, 3) if oa.batch == 1 => ob.batch,
        (3, 3) => {
            return Err(invalid(
                "b",
                format!(
                    "batch {} differs from a's batch {}; batch sizes must be equal or one of them 1",
                    ob.batch, oa.batch
                ),
            ))
        }
        (3, _) => oa.batch,
        (_, 3) => ob.batch,
        _ => 1,
    };
    let want: Vec<usize> = if batched { vec![batch, m, n] } else { vec![m, n] };
    if d.shape != want {
        return Err(invalid(
            "out",
            format!("has shape {:?}; the product is {want:?}", d.shape),
        ));
    }
    let od = operand("out", d)?;
    if od.layout != Layout::RowMajor && m > 1 && n > 1 {
        return Err(invalid(
            "out",
            format!(
                "strides {:?} are not row-major: its last dimension must be contiguous",
                d.strides
            ),
        ));
    }
    let ldd = if m <= 1 {
        n.max(1)
    } else {
        d.strides[d.strides.len() - 2]
    };
    if d.ptr != 0 && (d.ptr == a.ptr || d.ptr == b.ptr) {
        return Err(invalid(
            "out",
            "shares memory with an input; the GEMM cannot write in place",
        ));
    }
    if let Some(bias) = bias {
        check_bias(bias, n, d.dtype)?;
    }
    let problem = GemmProblem {
        m,
        n,
        k,
        batch,
        precision,
        out: d.dtype,
        a_layout: oa.layout,
        lda: oa.ld,
        batch_stride_a: oa.batch_stride,
        b_layout: ob.layout,
        ldb: ob.ld,
        batch_stride_b: ob.batch_stride,
        ldc: n.max(1),
        batch_stride_c: 0,
        ldr: n.max(1),
        batch_stride_r: 0,
        ldd,
        batch_stride_d: if batch <= 1 { 0 } else { d.strides[0] },
        epilogue: GemmEpilogue {
            activation,
            bias: bias.is_some(),
            c: false,
            residual: false,
            glu: Default::default(),
        },
        scales: Default::default(),
    };
    problem.validate().py_err()?;
    let (ar, ac) = problem.a_stored();
    let (br, bc) = problem.b_stored();
    Ok(Matmul {
        a: stored(batch, problem.batch_stride_a, ar, ac, problem.lda),
        b: stored(batch, problem.batch_stride_b, br, bc, problem.ldb),
        d: stored(batch, problem.batch_stride_d, m, n, problem.ldd),
        problem,
    })
}

/// The bias of a GEMM with `n` output columns written in `out`: a contiguous `[n]` vector of the
/// output's dtype (matmul's and scaled_mm's rule).
pub(crate) fn check_bias(bias: &Desc, n: usize, out: DType) -> PyResult<()> {
    let ok = bias.shape == [n] && (n <= 1 || bias.strides == [1]);
    if !ok {
        return Err(invalid(
            "bias",
            format!(
                "has shape {:?} and strides {:?}; it must be a contiguous [{n}] vector (one value per output column)",
                bias.shape, bias.strides
            ),
        ));
    }
    if bias.dtype != out {
        return Err(invalid(
            "bias",
            format!(
                "has dtype {}; it must have the output's dtype {}",
                bias.dtype.name_torch(),
                out.name_torch()
            ),
        ));
    }
    Ok(())
}

fn parse_activation(name: &str) -> PyResult<Activation> {
    Activation::parse(name).ok_or_else(|| {
        invalid(
            "activation",
            format!("unknown activation {name:?}; None, \"relu\", \"gelu\", \"gelu_tanh\" or \"silu\""),
        )
    })
}

/// The torch dtype names of tessera's dtypes (what error messages of this module show).
pub(crate) trait TorchName {
    fn name_torch(&self) -> &'static str;
}

impl TorchName for DType {
    fn name_torch(&self) -> &'static str {
        match self {
            DType::F64 => "float64",
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F8E4M3 => "float8_e4m3fn",
            DType::F8E5M2 => "float8_e5m2",
            DType::U8 => "uint8",
            DType::I8 => "int8",
            DType::I32 => "int32",
            DType::I64 => "int64",
            #[allow(unreachable_patterns)]
            _ => "unknown",
        }
    }
}

/// Parses one tensor argument of a matmul, naming its dtype the way torch does in errors.
fn desc(arg: &'static str, raw: RawDesc) -> PyResult<Desc> {
    if arg == "out" || arg == "bias" {
        out_dtype(arg, &raw.1)?;
    } else {
        precision_of(arg, &raw.1)?;
    }
    Desc::new(arg, raw)
}

/// Validates `out = act(a @ b + bias)` without a device (`out` may carry address 0); returns
/// `(a's layout, b's layout)` as `"row"` / `"col"`.
#[pyfunction]
#[pyo3(signature = (a, b, bias, out, activation = "none"))]
pub fn check_matmul(
    a: RawDesc,
    b: RawDesc,
    bias: Option<RawDesc>,
    out: RawDesc,
    activation: &str,
) -> PyResult<(&'static str, &'static str)> {
    let (a, b, d) = (desc("a", a)?, desc("b", b)?, desc("out", out)?);
    let bias = bias.map(|x| desc("bias", x)).transpose()?;
    let mm = matmul_problem(&a, &b, bias.as_ref(), &d, activation)?;
    let name = |l: Layout| if l == Layout::RowMajor { "row" } else { "col" };
    Ok((name(mm.problem.a_layout), name(mm.problem.b_layout)))
}

/// The options of a problem whose operands sit at `a` and `b`: the 16-byte tensor-core paths
/// need 16-byte aligned addresses, so a view that starts elsewhere (a slice) runs on the SIMT
/// path instead of failing.
fn options_for(problem: &GemmProblem, a: u64, b: u64) -> GemmOptions {
    let vector = matches!(problem.precision, Precision::F16 | Precision::BF16);
    let path = if vector && (a % 16 != 0 || b % 16 != 0) {
        GemmPath::Simt
    } else {
        GemmPath::Auto
    };
    GemmOptions {
        tuning: GemmTuning {
            path,
            ..Default::default()
        },
    }
}

/// View of `d`'s memory with the stored-form `shape` and `strides`.
pub(crate) fn view(d: &Desc, (shape, strides): &(Vec<usize>, Vec<usize>)) -> PyResult<TensorView<'static>> {
    Desc {
        ptr: d.ptr,
        dtype: d.dtype,
        shape: shape.clone(),
        strides: strides.clone(),
    }
    .view()
}

pub(crate) fn view_mut(d: &Desc, (shape, strides): &(Vec<usize>, Vec<usize>)) -> PyResult<TensorViewMut<'static>> {
    Desc {
        ptr: d.ptr,
        dtype: d.dtype,
        shape: shape.clone(),
        strides: strides.clone(),
    }
    .view_mut()
}

/// `out = act(a @ b + bias)` on `stream` of `device`; returns the kernel path that ran
/// (`"sm80"`, `"skinny"`, `"simt"`, `"dmma"`).
#[pyfunction]
#[pyo3(signature = (device, stream, a, b, bias, out, activation = "none"))]
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    py: Python<'_>,
    device: usize,
    stream: StreamId,
    a: RawDesc,
    b: RawDesc,
    bias: Option<RawDesc>,
    out: RawDesc,
    activation: &str,
) -> PyResult<&'static str> {
    let (a, b, d) = (desc("a", a)?, desc("b", b)?, desc("out", out)?);
    let bias = bias.map(|x| desc("bias", x)).transpose()?;
    let mm = matmul_problem(&a, &b, bias.as_ref(), &d, activation)?;
    let (av, bv) = (view(&a, &mm.a)?, view(&b, &mm.b)?);
    let mut dv = view_mut(&d, &mm.d)?;
    let biasv = bias.as_ref().map(|x| x.view()).transpose()?;
    let opts = options_for(&mm.problem, a.ptr, b.ptr);
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
            plan.run(1.0, 0.0, &ops, &mut dv)?;
            Ok(plan.path().name())
        })
    })
    .py_err()
}
