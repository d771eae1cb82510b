"""``tessera.softmax`` and ``tessera.log_softmax``."""

from __future__ import annotations

from typing import Any, Optional

from . import _tessera
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
    unsupported,
)


def softmax(x: Any, dim: int = -1, *, dtype: Any = None, out: Any = None) -> Any:
    """Softmax of ``x`` along ``dim``, as ``torch.softmax(x, dim, dtype=dtype)``.

    Args:
        x: a CUDA tensor of float32, float16 or bfloat16 (a torch tensor, or any object with
            ``__cuda_array_interface__`` or ``__dlpack__``).
        dim: the dimension to normalise (negative counts from the end). The last dimension is
            read in place; any other costs a copy of ``x`` (it is moved last and made
            contiguous).
        dtype: the output dtype (``torch.float32``/``float16``/``bfloat16`` or its name);
            default ``x``'s. Computation is always float32.
        out: write the result here instead of allocating (same shape as ``x``; may be ``x``
            itself for an in-place softmax over the last dimension).

    Returns:
        A torch tensor (or ``out``). The kernel is queued on the current CUDA stream of ``x``'s
        device (``torch.cuda.current_stream()``); nothing synchronises.

    Rows whose every element is ``-inf`` give zeros; a NaN makes its row NaN.

    Raises:
        InvalidArgumentError (a ValueError): bad shapes, strides or ``dim``.
        UnsupportedError (a NotImplementedError): an unsupported dtype.
        NoGpuError (a RuntimeError): no CUDA driver, device or NVRTC.
    """
    return _run(x, dim, dtype, out, log=False)


def log_softmax(x: Any, dim: int = -1, *, dtype: Any = None, out: Any = None) -> Any:
    """Log-softmax of ``x`` along ``dim``, as ``torch.log_softmax(x, dim, dtype=dtype)``.

    Arguments, streams and errors as :func:`softmax`. Rows whose every element is ``-inf``
    give ``-inf``.
    """
    return _run(x, dim, dtype, out, log=True)


def dtype_name(dtype: Any) -> str:
    """``torch.float16`` / ``"float16"`` / ``"torch.float16"`` -> ``"float16"``."""
    return str(dtype).replace("torch.", "")


def _rows_collapse(shape, strides) -> bool:
    """Whether a tensor's last dimension is contiguous and its leading dimensions collapse into
    evenly strided, non-overlapping rows (what the kernel reads without a copy)."""
    r = len(shape)
    if shape[-1] > 1 and strides[-1] != 1:
        return False
    rows = 1
    for n in shape[:-1]:
        rows *= n
    if rows > 1 and strides[-2] < shape[-1] and shape[-2] > 1:
        return False  # rows overlap (a broadcast, stride 0)
    return all(shape[i] <= 1 or strides[i] == strides[i + 1] * shape[i + 1] for i in range(r - 2))


def _run(x: Any, dim: int, dtype: Any, out: Any, log: bool) -> Any:
    xa = as_arg(x, "x")
    nd = len(xa.shape)
    if not isinstance(dim, int):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    if not (-max(nd, 1) <= dim < max(nd, 1)):
        raise invalid("dim", f"dimension {dim} is out of range for a tensor of {nd} dims")
    if nd == 0:
        # a scalar: softmax over its one element
        y = _run(require_torch("a 0-dim tensor").as_tensor(xa.obj).reshape(1), -1, dtype, None, log)
        y = y.reshape(())
        return _copy_into(out, y) if out is not None else y
    d = dim % nd
    out_dtype = dtype_name(dtype) if dtype is not None else xa.dtype
    if d != nd - 1:
        if not xa.is_torch:
            raise unsupported("softmax over a dimension other than the last needs a torch tensor")
        y = _run(xa.obj.movedim(d, -1).contiguous(), -1, dtype, None, log).movedim(-1, d)
        return _copy_into(out, y) if out is not None else y
    if not _rows_collapse(xa.shape, xa.strides) and xa.is_torch:
        xa = as_arg(xa.obj.contiguous(), "x")
    oa: Optional[Arg] = None
    if out is not None:
        oa = as_arg(out, "out")
        check_writable(oa, "out")
        if dtype is not None and oa.dtype != out_dtype:
            raise invalid("out", f"has dtype {oa.dtype} but dtype={out_dtype} was asked for")
        odesc = oa.desc()
    else:
        odesc = (0, out_dtype, xa.shape, contiguous_strides(xa.shape))
    if xa.numel == 0:
        if oa is not None and oa.shape != xa.shape:
            raise invalid("out", f"shape {list(oa.shape)} differs from the input's {list(xa.shape)}")
        return out if out is not None else empty(xa.shape, out_dtype, device_of([xa]))
    _tessera.check_softmax(xa.desc(), odesc)
    args = [xa] if oa is None else [xa, oa]
    device = device_of(args)
    if oa is None:
        oa = as_arg(empty(xa.shape, out_dtype, device), "out")
    _tessera.softmax(device, stream_of(args, device), xa.desc(), oa.desc(), log)
    return oa.obj


def _copy_into(out: Any, y: Any) -> Any:
    """Writes ``y`` into a caller's ``out`` (torch tensors only) and returns ``out``."""
    torch = require_torch("out= with this call")
    if not isinstance(out, torch.Tensor):
        raise unsupported("out= must be a torch tensor when softmax is not over the last dimension")
    if tuple(out.shape) != tuple(y.shape):
        raise invalid("out", f"shape {list(out.shape)} differs from the result's {list(y.shape)}")
    out.copy_(y)
    return out
