"""``tessera.scaled_mm`` and ``tessera.int_mm``: fp8 and int8 GEMM with torch's
``torch._scaled_mm`` / ``torch._int_mm`` contracts, over tessera's tensor-core GEMM."""

from __future__ import annotations

from typing import Any, Optional

from . import _tessera
from ._softmax import dtype_name
from ._tensors import (
    Arg,
    as_arg,
    check_writable,
    contiguous_strides,
    device_of,
    empty,
    require_torch,
    stream_of,
    unsupported,
)

#: The output dtypes of ``scaled_mm`` (the fp8 ones for fp8 inputs only).
SCALED_MM_OUT_DTYPES = ("bfloat16", "float16", "float32", "float8_e4m3fn", "float8_e5m2")


def scaled_mm(
    a: Any,
    b: Any,
    scale_a: Any,
    scale_b: Any,
    bias: Any = None,
    scale_result: Any = None,
    out_dtype: Any = None,
    use_fast_accum: bool = False,
    *,
    amax: Any = None,
) -> Any:
    """``(a @ b) * scale_a * scale_b + bias`` for fp8 inputs, as ``torch._scaled_mm`` (torch >= 2.5:
    one tensor returned), on tessera's tensor-core GEMM (Hopper path on sm_90; mma.sync path on
    sm_80+, fp8 on sm_89+); with an fp8 output,
    ``fp8(scale_result * (a @ b) * scale_a * scale_b)``.

    Args:
        a: ``[M, K]`` row-major (last dimension contiguous), float8_e4m3fn or float8_e5m2 (int8
            is accepted too, a tessera extension: the int32 product dequantised by the scales).
        b: ``[K, N]`` column-major, a's dtype: the transposed view ``w.t()`` of a row-major
            ``[N, K]`` weight ``w`` (what ``torch._scaled_mm`` wants too). A row-major ``b`` raises
            ``InvalidArgumentError`` naming ``b``; it is never copied.
        scale_a: float32, one value (``[]``, ``[1]`` or ``[1, 1]``: per-tensor) or ``[M, 1]``
            (one per row of ``a``: row-wise).
        scale_b: float32, one value or ``[1, N]`` (one per column of the product). Both scales
            must be per-tensor or both row-wise; a per-tensor scale beside a row-wise one raises
            ``UnsupportedError`` (not supported yet). Each element of the float32 accumulator is
            multiplied by ``scale_a[m] * scale_b[n]`` before the bias is added.
        bias: optional ``[N]`` vector in ``out_dtype``, added to every row. bfloat16, float16 and
            float32 outputs only: with an fp8 output a bias raises ``UnsupportedError`` (torch
            accepts a bfloat16 or float16 bias there; tessera's fp8 epilogue has none).
        scale_result: optional float32 tensor of one element (``[]``, ``[1]`` or ``[1, 1]``) on
            the inputs' device, for fp8 outputs only: the output is
            ``fp8(scale_result * d)``, ``d = (a @ b) * scale_a * scale_b`` in float32, rounded to
            nearest even and saturated to the format's largest finite value (448 for e4m3fn,
            57344 for e5m2; NaN stays NaN). None means 1. With a bfloat16, float16 or float32
            output it raises ``InvalidArgumentError`` naming ``scale_result`` (torch ignores it
            there silently).
        out_dtype: ``torch.bfloat16``, ``torch.float16``, ``torch.float32``, or for fp8 inputs
            ``torch.float8_e4m3fn`` or ``torch.float8_e5m2`` (either, whatever a's fp8 format).
            None (torch's default) means a's dtype: an fp8 output for fp8 inputs; int8 inputs
            need an explicit bfloat16, float16 or float32 (``UnsupportedError`` otherwise, as for
            an fp8 ``out_dtype`` with int8 inputs).
        use_fast_accum: accepted and ignored: tessera's fp8 path always accumulates in the
            tensor cores' fp8 accumulation mode (wgmma's, what ``use_fast_accum=True`` selects in
            cuBLASLt: no periodic promotion to a wider accumulator), so long-K results may differ
            slightly more from ``use_fast_accum=False`` than torch's own.
        amax: keyword only, a tessera extension (torch < 2.5 returned it as a second tensor):
            optional float32 CUDA tensor of one element (``[]``, ``[1]`` or ``[1, 1]``) on the
            inputs' device, fp8 outputs only (``InvalidArgumentError`` naming ``amax``
            otherwise). It receives ``max |d|`` over the output, ``d`` taken before
            ``scale_result`` and the fp8 rounding (what the next step's scale is computed from,
            e.g. ``448 / amax``); NaN if any ``d`` is NaN, 0 for an empty output. It is zeroed and
            written on the current CUDA stream, like the output; it must not share memory with
            another argument.

    Returns:
        A new ``[M, N]`` torch tensor of ``out_dtype``, queued on the current CUDA stream of the
        inputs' device; nothing synchronises.

    tessera's kernel reads ``a`` and ``b`` by TMA: their leading dimensions (K bytes) must be
    multiples of 16 bytes, and the output's row pitch too (N elements of ``out_dtype``: N a
    multiple of 16 for an fp8 output, 8 for 16-bit, 4 for float32); torch asks for K and N
    multiples of 16 as well. Plans are cached per (device, stream, shapes, dtypes, scaling).

    Raises:
        InvalidArgumentError (a ValueError): dtypes, shapes, strides, scales, bias,
            ``scale_result`` or ``amax`` that do not fit.
        UnsupportedError (a NotImplementedError): mixed per-tensor/row-wise scales, a bias with an
            fp8 output, an fp8 or None ``out_dtype`` with int8 inputs, a device older than sm_80 (fp8: sm_89).
        NoGpuError (a RuntimeError): no CUDA driver, device or NVRTC.
    """
    aa, ba = as_arg(a, "a"), as_arg(b, "b")
    if out_dtype is None:
        if aa.dtype == "int8":
            raise unsupported(
                "`out_dtype` = None with int8 inputs: torch._scaled_mm's default is a's dtype, and tessera.scaled_mm "
                "writes no int8; pass out_dtype=torch.bfloat16, torch.float16 or torch.float32"
            )
        odtype = aa.dtype  # torch's default: a's fp8 dtype (any other dtype of a is refused below)
    else:
        odtype = dtype_name(out_dtype)
        if odtype not in SCALED_MM_OUT_DTYPES:
            raise unsupported(f"`out_dtype` = {odtype}: tessera.scaled_mm writes {', '.join(SCALED_MM_OUT_DTYPES)}")
    _ = bool(use_fast_accum)  # always fast accumulation (see the docstring)
    sa, sb = _scale(as_arg(scale_a, "scale_a"), "scale_a"), _scale(as_arg(scale_b, "scale_b"), "scale_b")
    bias_a = as_arg(bias, "bias") if bias is not None else None
    if bias_a is not None and bias_a.is_torch and len(bias_a.shape) == 1 and bias_a.shape[0] > 1 and bias_a.strides[0] != 1:
        bias_a = as_arg(bias_a.obj.contiguous(), "bias")
    sr = as_arg(scale_result, "scale_result") if scale_result is not None else None
    am = as_arg(amax, "amax") if amax is not None else None
    if am is not None:
        check_writable(am, "amax")
    shape = _product_shape(aa, ba)
    odesc = (0, odtype, shape, contiguous_strides(shape))
    bdesc = bias_a.desc() if bias_a is not None else None
    srdesc = sr.desc() if sr is not None else None
    amdesc = am.desc() if am is not None else None
    _tessera.check_scaled_mm(aa.desc(), ba.desc(), sa.desc(), sb.desc(), bdesc, odesc, srdesc, amdesc)
    args = [x for x in (aa, ba, sa, sb, bias_a, sr, am) if x is not None]
    device = device_of(args)
    oa = as_arg(empty(shape, odtype, device), "out")
    if oa.numel == 0 or aa.shape[1] == 0:
        if am is not None:  # no product: the amax of zeros (or of nothing) is 0
            _zero(am)
        if oa.numel == 0:
            return oa.obj
        return _fill_k0(oa, bias_a)  # K = 0: the product is zero, the bias remains
    _tessera.scaled_mm(
        device, stream_of(args, device), aa.desc(), ba.desc(), sa.desc(), sb.desc(), bdesc, oa.desc(), srdesc, amdesc
    )
    return oa.obj


def int_mm(a: Any, b: Any) -> Any:
    """``a @ b`` for int8 inputs with an exact int32 result, as ``torch._int_mm``, on tessera's
    tensor-core GEMM (sm_80+).

    Args:
        a: ``[M, K]`` int8, row-major (last dimension contiguous).
        b: ``[K, N]`` int8, column-major: the transposed view ``w.t()`` of a row-major ``[N, K]``
            weight ``w``. A row-major ``b`` (which ``torch._int_mm`` also takes) raises
            ``InvalidArgumentError`` naming ``b``; it is never copied.

    Returns:
        A new ``[M, N]`` int32 torch tensor, queued on the current CUDA stream of the inputs'
        device; nothing synchronises. The int32 sums cannot overflow for K <= 2^17 (each product
        is at most 2^14 in magnitude).

    The leading dimensions of ``a`` and ``b`` (K bytes) and the output's row pitch (4 N bytes)
    must be multiples of 16 bytes (TMA); torch asks for K and N multiples of 8 and M > 16.

    Raises:
        InvalidArgumentError (a ValueError): dtypes, shapes or strides that do not fit.
        UnsupportedError (a NotImplementedError): a device older than sm_80 (fp8: sm_89).
        NoGpuError (a RuntimeError): no CUDA driver, device or NVRTC.
    """
    aa, ba = as_arg(a, "a"), as_arg(b, "b")
    shape = _product_shape(aa, ba)
    odesc = (0, "int32", shape, contiguous_strides(shape))
    _tessera.check_int_mm(aa.desc(), ba.desc(), odesc)
    args = [aa, ba]
    device = device_of(args)
    oa = as_arg(empty(shape, "int32", device), "out")
    if oa.numel == 0:
        return oa.obj
    if aa.shape[1] == 0:
        return _fill_k0(oa, None)
    _tessera.int_mm(device, stream_of(args, device), aa.desc(), ba.desc(), oa.desc())
    return oa.obj


def _product_shape(a: Arg, b: Arg) -> tuple:
    """``(M, N)`` of ``a @ b`` for 2-D operands (the extension checks everything else); shapes
    of other ranks pass through so that its error names the argument."""
    m = a.shape[0] if len(a.shape) == 2 else 0
    n = b.shape[1] if len(b.shape) == 2 else 0
    return (m, n)


def _scale(x: Arg, name: str) -> Arg:
    """A torch scale made contiguous (a row-wise ``[M, 1]`` column of a wider tensor is copied;
    a no-op otherwise); interface objects are passed as they are and checked by the extension."""
    if x.is_torch and not x.obj.is_contiguous():
        return as_arg(x.obj.contiguous(), name)
    return x


def _zero(x: Arg) -> None:
    """Zeroes ``x`` with torch on its current stream."""
    torch = require_torch("scaled_mm's amax of an empty product")
    (x.obj if x.is_torch else torch.as_tensor(x.obj, device="cuda")).zero_()


def _fill_k0(oa: Arg, bias: Optional[Arg]) -> Any:
    """``out = 0 + bias`` for K = 0 (no product to compute), with torch on its stream."""
    torch = require_torch("scaled_mm / int_mm with K = 0")
    o = oa.obj
    if bias is None:
        o.zero_()
    else:
        bt = bias.obj if bias.is_torch else torch.as_tensor(bias.obj, device="cuda")
        o.copy_(bt.expand(o.shape))
    return o


__all__ = ["int_mm", "scaled_mm"]
