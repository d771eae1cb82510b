"""``tessera.matmul``: dense GEMM with a fused bias and activation, over tessera's Rust GEMM."""

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
    invalid,
    require_torch,
    stream_of,
)

#: The activations of the fused epilogue (``None`` is the identity).
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")


def matmul(
    a: Any,
    b: Any,
    *,
    bias: Any = None,
    activation: Optional[str] = None,
    out_dtype: Any = None,
    out: Any = None,
) -> Any:
    """``act(a @ b + bias)`` on CUDA tensors, in one kernel (tessera's GEMM, JIT-compiled).

    As ``torch.mm(a, b)`` / ``torch.bmm`` (``torch.addmm(bias, a, b)`` with a bias), with the
    activation fused into the same kernel (the bias is added before it, as cuBLASLt's epilogue).

    Args:
        a: ``[M, K]`` or batched ``[B, M, K]``; float16, bfloat16, float32 or float64 (a torch
            tensor, or any object with ``__cuda_array_interface__`` or ``__dlpack__``).
        b: ``[K, N]`` or ``[B, K, N]``, a's dtype. A transposed view is read in place: pass a
            ``[N, K]`` weight ``w`` as ``w.t()`` (``x @ w.t()``, as ``torch.nn.functional.linear``).
            A 2-D operand beside a 3-D one is shared by every batch entry; batch sizes must be
            equal or one of them 1.
        bias: optional ``[N]`` vector in the output dtype, added to every row.
        activation: ``None``, ``"relu"``, ``"gelu"`` (erf, torch's default), ``"gelu_tanh"``
            (``approximate="tanh"``) or ``"silu"``.
        out_dtype: the output dtype; default a's. float16/bfloat16 inputs may write float16,
            bfloat16 or float32 (accumulation is float32 always); float32 and float64 write
            their own dtype. float32 is exact float32 (never tf32).
        out: write the result here (``[M, N]`` or ``[B, M, N]``, row-major: last dimension
            contiguous) instead of allocating.

    Returns:
        A torch tensor (or ``out``), queued on the current CUDA stream of the inputs' device;
        nothing synchronises.

    Operands are read in place when they are row-major (last stride 1) or column-major
    (second-to-last stride 1) with any leading dimension and batch stride; other torch views
    are copied with ``.contiguous()`` first (interface objects raise). Plans are cached per
    (device, stream, shapes, strides, dtypes, epilogue).

    fp8 and int8 inputs are not taken here (``UnsupportedError`` saying where they go): use
    :func:`tessera.scaled_mm` (``torch._scaled_mm``) and :func:`tessera.int_mm`
    (``torch._int_mm``), sm_80 and newer.

    Raises:
        InvalidArgumentError (a ValueError): shapes, strides, bias or ``out`` that do not fit.
        UnsupportedError (a NotImplementedError): an unsupported dtype (fp8, int8, ...).
        NoGpuError (a RuntimeError): no CUDA driver, device or NVRTC.
    """
    act = _activation(activation)
    aa = _operand(as_arg(a, "a"), "a")
    ba = _operand(as_arg(b, "b"), "b")
    bias_a = as_arg(bias, "bias") if bias is not None else None
    if bias_a is not None and bias_a.is_torch and len(bias_a.shape) == 1 and bias_a.shape[0] > 1 and bias_a.strides[0] != 1:
        bias_a = as_arg(bias_a.obj.contiguous(), "bias")
    m, k = aa.shape[-2], aa.shape[-1]
    n = ba.shape[-1]
    batches = [x.shape[0] for x in (aa, ba) if len(x.shape) == 3]
    batch = _batch(batches)
    shape = (batch, m, n) if batches else (m, n)
    oa: Optional[Arg] = None
    if out is not None:
        oa = as_arg(out, "out")
        check_writable(oa, "out")
        if out_dtype is not None and oa.dtype != dtype_name(out_dtype):
            raise invalid("out", f"has dtype {oa.dtype} but out_dtype={dtype_name(out_dtype)} was asked for")
        odesc = oa.desc()
        odtype = oa.dtype
    else:
        odtype = dtype_name(out_dtype) if out_dtype is not None else aa.dtype
        odesc = (0, odtype, shape, contiguous_strides(shape))
    bdesc = bias_a.desc() if bias_a is not None else None
    _tessera.check_matmul(aa.desc(), ba.desc(), bdesc, odesc, act)
    args = [x for x in (aa, ba, bias_a, oa) if x is not None]
    device = device_of(args)
    if oa is None:
        oa = as_arg(empty(shape, odtype, device), "out")
    if oa.numel == 0:
        return oa.obj
    if k == 0:
        return _empty_k(oa, bias_a, act)
    _tessera.matmul(device, stream_of(args, device), aa.desc(), ba.desc(), bdesc, oa.desc(), act)
    return oa.obj


def _batch(batches: list) -> int:
    """The batch of the product of operands with these batch sizes (those of the 3-D ones):
    equal sizes, or one of them 1 (broadcast); check_matmul rejects any other pair."""
    if not batches:
        return 1
    if len(batches) == 1 or batches[1] == 1:
        return batches[0]
    return batches[1]


def _activation(activation: Any) -> str:
    """The epilogue's name of ``activation`` (``None`` -> ``"none"``)."""
    if activation is None:
        return "none"
    if not isinstance(activation, str):
        raise invalid("activation", f"must be None or one of {', '.join(ACTIVATIONS)}; got {activation!r}")
    return activation


def _operand(x: Arg, name: str) -> Arg:
    """``x`` if the GEMM reads it in place; a contiguous copy of a torch tensor it cannot."""
    if len(x.shape) not in (2, 3):
        raise invalid(name, f"must be 2-D or 3-D (batched), got shape {list(x.shape)}")
    if _tessera.operand_layout(x.shape, x.strides) is not None:
        return x
    if x.is_torch:
        return as_arg(x.obj.contiguous(), name)
    raise invalid(
        name,
        f"strides {list(x.strides)} of shape {list(x.shape)} are neither row-major nor column-major; "
        "pass a contiguous array",
    )


def _empty_k(oa: Arg, bias: Optional[Arg], act: str) -> Any:
    """``out = act(0 + bias)`` for K = 0 (no product to compute), with torch on its stream."""
    torch = require_torch("matmul with K = 0")
    o = oa.obj if oa.is_torch else torch.as_tensor(oa.obj, device="cuda")
    if bias is None:
        o.zero_()
    else:
        bt = bias.obj if bias.is_torch else torch.as_tensor(bias.obj, device="cuda")
        o.copy_(bt.expand(o.shape))
    f = torch.nn.functional
    if act == "relu":
        o.copy_(f.relu(o))
    elif act in ("gelu", "gelu_erf"):
        o.copy_(f.gelu(o))
    elif act == "gelu_tanh":
        o.copy_(f.gelu(o, approximate="tanh"))
    elif act == "silu":
        o.copy_(f.silu(o))
    return oa.obj
