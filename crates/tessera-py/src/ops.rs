//! The operators as Python sees them (called by `python/tessera/_softmax.py` and
//! `_attention.py`, which document them). Each `check_*` runs tessera's validation without a
//! device; each op validates again, fetches or makes the plan for (device, stream, problem) and
//! launches on the caller's stream. The GIL is released while planning and launching.

use pyo3::prelude::*;
use tessera::attention::{
    plan::validate_options, AttentionOptions, AttentionPath, AttentionPlan, AttentionProblem, AttentionTuning,
};
use tessera::attention::{QkvLayout, TensorDesc, VarlenBatch, VarlenShape};
use tessera::softmax::{SoftmaxKind, SoftmaxOptions, SoftmaxPlan, SoftmaxPlanKey, SoftmaxShape};

use crate::cache::{self, AttentionKey, StreamId, ATTENTION_PLANS, SOFTMAX_PLANS};
use crate::desc::{Desc, RawDesc};
use crate::errors::{invalid, IntoPy};

fn kind(log: bool) -> SoftmaxKind {
    if log {
        SoftmaxKind::LogSoftmax
    } else {
        SoftmaxKind::Softmax
    }
}

/// The softmax problem of `x -> y` (`input` / `output` in tessera's messages), validated.
fn softmax_shape(x: &Desc, y: &Desc) -> PyResult<SoftmaxShape> {
    let shape = SoftmaxShape::of_views(&x.view()?, &y.view()?).py_err()?;
    shape.validate().py_err()?;
    if x.ptr == y.ptr && x.ptr != 0 && (x.dtype != y.dtype || x.strides != y.strides) {
        return Err(invalid(
            "out",
            "out shares memory with the input: in-place softmax needs the same dtype and strides",
        ));
    }
    Ok(shape)
}

/// Validates a softmax over the last dimension of `x` into `y` without a device.
#[pyfunction]
pub fn check_softmax(x: RawDesc, y: RawDesc) -> PyResult<()> {
    softmax_shape(&Desc::new("input", x)?, &Desc::new("output", y)?).map(|_| ())
}

/// `y = softmax(x)` (or log-softmax) over the last dimension on `stream` of `device`; `y` may
/// be `x` itself (in place).
#[pyfunction]
pub fn softmax(py: Python<'_>, device: usize, stream: StreamId, x: RawDesc, y: RawDesc, log: bool) -> PyResult<()> {
    let (x, y) = (Desc::new("input", x)?, Desc::new("output", y)?);
    let shape = softmax_shape(&x, &y)?;
    let (xv, mut yv) = (x.view()?, y.view_mut()?);
    py.detach(|| {
        cache::with_device(device, |_| {
            let kind = kind(log);
            let opts = SoftmaxOptions {
                kind,
                ..Default::default()
            };
            let plan = SOFTMAX_PLANS.get_or_make(device, stream, SoftmaxPlanKey::new(&shape, &opts), || {
                // SAFETY: `stream` is the caller's current stream of `device` (torch's, or one the
                // caller named), which outlives the plan (module docs of `cache`).
                let ctx = unsafe { cache::context_on(device, stream) }?;
                SoftmaxPlan::new(&ctx, &shape, &opts)
            })?;
            if x.ptr == y.ptr {
                plan.run_inplace(&mut yv)
            } else {
                plan.run(&xv, &mut yv)
            }
        })
    })
    .py_err()
}

/// `(batch, total_q, total_k, max_seqlen_q, max_seqlen_k)` of a varlen batch.
pub type RawVarlenShape = (usize, usize, usize, usize, usize);

fn varlen_shape(v: RawVarlenShape) -> VarlenShape {
    VarlenShape {
        batch: v.0,
        total_q: v.1,
        total_k: v.2,
        max_seqlen_q: v.3,
        max_seqlen_k: v.4,
    }
}

fn attention_options(
    causal: bool,
    window: (i32, i32),
    scale: Option<f32>,
    softcap: f32,
    path: &str,
) -> PyResult<AttentionOptions> {
    let path = match path {
        "auto" => AttentionPath::Auto,
        "hopper" => AttentionPath::Hopper,
        "sm80" => AttentionPath::Sm80,
        p => {
            return Err(invalid(
                "path",
                format!("unknown attention path {p:?}; auto, hopper or sm80"),
            ))
        }
    };
    // everything else at its default (no LSE, the dispatcher's tuning)
    Ok(AttentionOptions {
        layout: QkvLayout::Bnhd,
        causal,
        window,
        scale,
        softcap,
        tuning: AttentionTuning {
            path,
            ..Default::default()
        },
        ..Default::default()
    })
}

/// The output and LSE shapes of a problem: `q`'s shape, and `[B, Hq, Nq]` or `[Hq, total_q]`.
fn lse_shape(p: &AttentionProblem) -> Vec<usize> {
    match p.varlen {
        Some((total_q, _)) => vec![p.heads_q, total_q],
        None => vec![p.batch, p.heads_q, p.seqlen_q],
    }
}

/// Validates a FlashAttention forward call without a device and returns the LSE shape.
/// `varlen` is `(batch, total_q, total_k, max_seqlen_q, max_seqlen_k)` for packed batches.
#[pyfunction]
#[pyo3(signature = (q, k, v, varlen, causal, window, scale, softcap, path = "auto"))]
#[allow(clippy::too_many_arguments)]
pub fn check_attention(
    q: RawDesc,
    k: RawDesc,
    v: RawDesc,
    varlen: Option<RawVarlenShape>,
    causal: bool,
    window: (i32, i32),
    scale: Option<f32>,
    softcap: f32,
    path: &str,
) -> PyResult<Vec<usize>> {
    let (q, k, v) = (Desc::new("q", q)?, Desc::new("k", k)?, Desc::new("v", v)?);
    fn desc(d: &Desc) -> TensorDesc<'_> {
        TensorDesc {
            shape: &d.shape,
            strides: &d.strides,
            dtype: d.dtype,
        }
    }
    let opts = attention_options(causal, window, scale, softcap, path)?;
    let problem = AttentionProblem::of_descs_shape(
        &desc(&q),
        &desc(&k),
        &desc(&v),
        QkvLayout::Bnhd,
        varlen.map(varlen_shape),
    )
    .py_err()?;
    validate_options(&opts, problem.head_dim).py_err()?;
    Ok(lse_shape(&problem))
}

/// FlashAttention forward on `stream` of `device`: `out` (q's shape) and, when given, `lse`
/// (f32, [`lse_shape`]). `varlen` is `(cu_seqlens_q ptr, cu_seqlens_k ptr, batch,
/// max_seqlen_q, max_seqlen_k)`; the totals are q's and k's rows.
#[pyfunction]
#[pyo3(signature = (device, stream, q, k, v, out, lse, varlen, causal, window, scale, softcap, path = "auto"))]
#[allow(clippy::too_many_arguments)]
pub fn flash_attention(
    py: Python<'_>,
    device: usize,
    stream: StreamId,
    q: RawDesc,
    k: RawDesc,
    v: RawDesc,
    out: RawDesc,
    lse: Option<RawDesc>,
    varlen: Option<(u64, u64, usize, usize, usize)>,
    causal: bool,
    window: (i32, i32),
    scale: Option<f32>,
    softcap: f32,
    path: &str,
) -> PyResult<()> {
    let (q, k, v) = (Desc::new("q", q)?, Desc::new("k", k)?, Desc::new("v", v)?);
    let out = Desc::new("out", out)?;
    let lse = lse.map(|l| Desc::new("lse", l)).transpose()?;
    let opts = attention_options(causal, window, scale, softcap, path)?;
    let batch = match varlen {
        Some((cu_q, cu_k, batch, max_q, max_k)) => {
            let shape = VarlenShape {
                batch,
                total_q: q.shape.first().copied().unwrap_or(0),
                total_k: k.shape.first().copied().unwrap_or(0),
                max_seqlen_q: max_q,
                max_seqlen_k: max_k,
            };
            // SAFETY: the Python layer passes the addresses of the caller's int32 cu_seqlens
            // tensors on this device (checked: 1-D, contiguous, batch + 1 entries); their
            // contents are the caller's promise, as with flash_attn (documented there).
            Some(unsafe { VarlenBatch::from_device(cu_q, cu_k, shape) }.py_err()?)
        }
        None => None,
    };
    let (qv, kv, vv) = (q.view()?, k.view()?, v.view()?);
    let mut ov = out.view_mut()?;
    let mut lv = lse.as_ref().map(Desc::view_mut).transpose()?;
    py.detach(|| {
        cache::with_device(device, |dev| {
            let problem = AttentionProblem::of_views(&qv, &kv, &vv, QkvLayout::Bnhd, batch.as_ref())?;
            validate_options(&opts, problem.head_dim)?;
            let key = AttentionKey::new(&problem, &opts, device, dev.arch());
            let plan = ATTENTION_PLANS.get_or_make(device, stream, key, || {
                // SAFETY: as in `softmax`.
                let ctx = unsafe { cache::context_on(device, stream) }?;
                AttentionPlan::new(&ctx, &problem, &opts)
            })?;
            plan.run(&qv, &kv, &vv, &mut ov, lv.as_mut(), batch.as_ref())
        })
    })
    .py_err()
}

/// Checks host `cu_seqlens_q/k` (start at 0, non-decreasing, same length >= 2) and returns the
/// longest query and key sequence.
#[pyfunction]
pub fn validate_cu_seqlens(cu_seqlens_q: Vec<i32>, cu_seqlens_k: Vec<i32>) -> PyResult<(usize, usize)> {
    tessera::attention::validate_cu_seqlens(&cu_seqlens_q, &cu_seqlens_k).py_err()
}
