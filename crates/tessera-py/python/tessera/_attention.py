"""``tessera.flash_attn_func`` and ``tessera.flash_attn_varlen_func``: FlashAttention forward
with the argument names, layouts and return conventions of the ``flash_attn`` package (2.x).

Inference only: there is no backward pass, so ``dropout_p`` must be 0, ``deterministic`` (a
backward option) must be False, and calling with tensors that require grad while autograd is
on raises instead of silently returning a result without a graph.
"""

from __future__ import annotations

import math
import os
from typing import Any, List, Optional, Sequence, Tuple, Union

from . import _tessera
from ._tensors import (
    Arg,
    _torch,
    as_arg,
    check_writable,
    device_of,
    empty,
    invalid,
    require_torch,
    stream_of,
    unsupported,
)

_I32_MAX = 2**31 - 1

AttnResult = Union[Any, Tuple[Any, Any, None]]


def flash_attn_func(
    q: Any,
    k: Any,
    v: Any,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    out: Any = None,
) -> AttnResult:
    """Exact attention ``softmax(q k^T * softmax_scale) v``, as ``flash_attn.flash_attn_func``.

    Supports multi-query and grouped-query attention: K/V may have fewer heads than Q (a
    divisor of Q's); query head ``h`` reads KV head ``h // (nheads // nheads_k)``.

    With ``causal=True`` the mask is aligned to the bottom-right corner when
    ``seqlen_q != seqlen_k`` (FlashAttention >= 2.1): query ``i`` sees keys
    ``j <= i + seqlen_k - seqlen_q``. With ``window_size=(left, right)`` query ``i`` sees keys
    ``[i + seqlen_k - seqlen_q - left, i + seqlen_k - seqlen_q + right]`` (-1 = unbounded).
    A query that sees no key (causal with ``seqlen_q > seqlen_k``: the first ``seqlen_q -
    seqlen_k`` rows; or a window that leaves a row empty) gets an output of zeros and an LSE of
    ``-inf``, the log of an empty sum, passed through from the kernels unchanged (never NaN).
    flash_attn itself writes ``+inf`` there (a convention of its backward pass); tessera has no
    backward and returns the mathematically consistent ``-inf``, so ``exp(lse)`` is 0 and such
    rows merge correctly with others (log-sum-exp merging of attention states).

    Args:
        q: ``(batch_size, seqlen_q, nheads, headdim)``, float16 or bfloat16, on a CUDA device.
        k: ``(batch_size, seqlen_k, nheads_k, headdim)``, q's dtype.
        v: ``(batch_size, seqlen_k, nheads_k, headdim)``, q's dtype.
        dropout_p: must be 0.0 (inference only).
        softmax_scale: scale of ``q k^T``; default ``1 / sqrt(headdim)``.
        causal: bottom-right aligned causal mask.
        window_size: ``(left, right)`` sliding window, ``-1`` = unbounded.
        softcap: ``> 0`` caps the scores: ``softcap * tanh(score / softcap)``.
        alibi_slopes: must be None (not supported).
        deterministic: must be False (selects flash_attn's deterministic backward; tessera has
            no backward).
        return_attn_probs: also return the log-sum-exp, as flash_attn: ``(out, softmax_lse,
            None)``. The third element (flash_attn's test-only attention probabilities) is
            always None.
        out: keyword only, tessera's addition: write the output here (``q``'s shape and dtype,
            last dimension contiguous) instead of allocating it.

    Returns:
        ``out`` of shape ``(batch_size, seqlen_q, nheads, headdim)``; with
        ``return_attn_probs``, ``(out, softmax_lse, None)`` with ``softmax_lse`` float32
        ``(batch_size, nheads, seqlen_q)``: natural log, as flash_attn
        (``logsumexp_j(q_i . k_j * softmax_scale)``, after softcap), ``-inf`` for a row that sees
        no key (flash_attn: ``+inf``; see above).

    Head dims up to 256 are supported; one that is not a multiple of 8 is zero-padded (a copy
    of q, k and v) as flash_attn does. Inputs whose last dimension is not contiguous, or that
    are not 16-byte aligned with strides that are multiples of 8 elements, are copied first.
    The kernels are queued on the current CUDA stream of q's device; nothing synchronises.

    Raises:
        UnsupportedError (a NotImplementedError): dropout, ALiBi, deterministic, autograd, a
            dtype or head dim the kernels do not support.
        InvalidArgumentError (a ValueError): inconsistent shapes, dtypes or options.
        NoGpuError (a RuntimeError): no CUDA driver, device or NVRTC.
    """
    _unsupported_options(dropout_p, alibi_slopes, deterministic)
    return _forward(q, k, v, None, softmax_scale, causal, window_size, softcap, return_attn_probs, out)


def flash_attn_varlen_func(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: Any = None,
    *,
    out: Any = None,
) -> AttnResult:
    """Attention over a packed batch of variable-length sequences, as
    ``flash_attn.flash_attn_varlen_func``: sequence ``b`` owns rows
    ``cu_seqlens[b]:cu_seqlens[b + 1]`` of q (and of k/v with ``cu_seqlens_k``).

    Masks, GQA, scale and softcap as :func:`flash_attn_func`, applied per sequence.

    Args:
        q: ``(total_q, nheads, headdim)``, float16 or bfloat16.
        k: ``(total_k, nheads_k, headdim)``; v the same.
        cu_seqlens_q: ``(batch_size + 1,)`` int32, the offsets of the sequences in q: 0 first,
            non-decreasing, last at most ``total_q``. On the GPU its contents are trusted as
            flash_attn trusts them (reading them would synchronise): set the environment
            variable ``TESSERA_CHECK_VARLEN=1`` to check them on every call (a device-to-host
            copy). CPU tensors or lists are checked on the host, then copied to the device.
        cu_seqlens_k: the same for k/v.
        max_seqlen_q: the longest query sequence (no sequence may be longer).
        max_seqlen_k: the longest key sequence.
        dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs: as :func:`flash_attn_func`.
        block_table: must be None (for decode over a paged KV cache use
            :class:`tessera.BatchDecodeWithPagedKVCacheWrapper`).
        out: keyword only, tessera's addition: write the output here.

    Returns:
        ``out`` of shape ``(total_q, nheads, headdim)``; with ``return_attn_probs``,
        ``(out, softmax_lse, None)`` with ``softmax_lse`` float32 ``(nheads, total_q)`` (natural
        log; ``-inf`` for a row that sees no key, as :func:`flash_attn_func`).
    """
    _unsupported_options(dropout_p, alibi_slopes, deterministic)
    if block_table is not None:
        # The paged KV cache has its own API (FlashInfer's): tessera/_kvcache.py.
        raise unsupported(
            "`block_table`: flash_attn_varlen_func does not read a paged KV cache; use tessera.PagedKVCache with "
            "tessera.BatchDecodeWithPagedKVCacheWrapper (decode) instead"
        )
    varlen = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    return _forward(q, k, v, varlen, softmax_scale, causal, window_size, softcap, return_attn_probs, out)


def _unsupported_options(dropout_p: float, alibi_slopes: Any, deterministic: bool) -> None:
    if dropout_p != 0.0:
        raise unsupported(f"`dropout_p` = {dropout_p}: tessera's attention is inference only (dropout_p must be 0.0)")
    if alibi_slopes is not None:
        raise unsupported("`alibi_slopes`: ALiBi biases are not supported")
    if deterministic:
        raise unsupported(
            "`deterministic` = True selects flash_attn's deterministic backward pass; tessera has no backward "
            "(its forward pass is deterministic)"
        )


def _window(window_size: Sequence[int]) -> Tuple[int, int]:
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise invalid("window_size", f"must be a pair of ints (left, right), got {window_size!r}") from None
    return (min(left, _I32_MAX), min(right, _I32_MAX))


def _no_autograd(args: Sequence[Arg]) -> None:
    if not any(a.is_torch for a in args):
        return
    torch = require_torch("autograd check")
    if torch.is_grad_enabled() and any(a.is_torch and a.obj.requires_grad for a in args):
        raise unsupported(
            "q, k or v requires grad but tessera has no backward pass; call under torch.no_grad() or "
            "torch.inference_mode(), or pass detached tensors"
        )


def _kernel_ready(a: Arg, name: str) -> Arg:
    """Copies a torch tensor the kernels cannot read as it is (last dim not contiguous, base not
    16-byte aligned, or strides not multiples of 8 elements), as flash_attn copies inputs."""
    if not a.is_torch:
        return a
    t = a.obj
    if a.strides[-1] != 1 and a.shape[-1] > 1:
        t = t.contiguous()
    elif a.ptr % 16 == 0 and all(s % 8 == 0 for s in a.strides[:-1]):
        return a
    else:
        t = t.clone(memory_format=require_torch("copy").contiguous_format)
    return as_arg(t, name)


def _pad_head_dim(args: List[Arg], names: Sequence[str]) -> List[Arg]:
    """Zero-pads the head dim of q, k, v to a multiple of 8 (torch tensors only)."""
    d = args[0].shape[-1]
    if d % 8 == 0 or d > 256 or not all(a.is_torch for a in args):
        return args
    torch = require_torch("padding the head dim")
    pad = 8 - d % 8
    return [as_arg(torch.nn.functional.pad(a.obj, [0, pad]), n) for a, n in zip(args, names)]


def _cu_seqlens(x: Any, name: str, device: Optional[int]) -> Tuple[Arg, Optional[List[int]]]:
    """The cu_seqlens argument on the device, and its host values when they were read (CPU
    tensors and lists, which are then copied to the device; or TESSERA_CHECK_VARLEN=1)."""
    host: Optional[List[int]] = None
    if isinstance(x, (list, tuple)):
        torch = require_torch(f"`{name}` given as a list")
        x = torch.tensor([int(i) for i in x], dtype=torch.int32)
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor) and not x.is_cuda:
        if x.dtype != torch.int32 or x.dim() != 1:
            raise invalid(name, f"must be a 1-D int32 tensor, got {x.dim()}-D {str(x.dtype).replace('torch.', '')}")
        host = x.tolist()
        x = x.to(torch.device("cuda", torch.cuda.current_device() if device is None else device))
    a = as_arg(x, name)
    if a.dtype != "int32":
        raise invalid(name, f"must be int32, got {a.dtype}")
    if len(a.shape) != 1 or (a.shape[0] > 1 and a.strides[0] != 1):
        raise invalid(name, f"must be a contiguous 1-D tensor of batch_size + 1 entries, got shape {list(a.shape)}")
    if host is None and a.is_torch and os.environ.get("TESSERA_CHECK_VARLEN") == "1":
        host = a.obj.tolist()  # synchronises: asked for
    return a, host


def _forward(q, k, v, varlen, softmax_scale, causal, window_size, softcap, return_lse, out) -> AttnResult:
    names = ("q", "k", "v")
    args = [as_arg(t, n) for t, n in zip((q, k, v), names)]
    _no_autograd(args)
    window = _window(window_size)
    head_dim = args[0].shape[-1] if args[0].shape else 0
    if softmax_scale is None and head_dim > 0:
        softmax_scale = 1.0 / math.sqrt(head_dim)  # of the unpadded head dim, as flash_attn
    scale = None if softmax_scale is None else float(softmax_scale)
    softcap = float(softcap)
    padded = _pad_head_dim(args, names)
    args = [_kernel_ready(a, n) for a, n in zip(padded, names)]

    vl_shape = None
    cu = None
    if varlen is not None:
        cu_q, cu_k, max_q, max_k = varlen
        for n, m in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
            if not isinstance(m, int) or isinstance(m, bool) or m < 0:
                raise invalid(n, f"must be a non-negative int, got {m!r}")
        dev = args[0].device
        cq, hq = _cu_seqlens(cu_q, "cu_seqlens_q", dev)
        ck, hk = _cu_seqlens(cu_k, "cu_seqlens_k", dev)
        if cq.shape != ck.shape:
            raise invalid(
                "cu_seqlens",
                f"cu_seqlens_q has {cq.shape[0]} entries but cu_seqlens_k has {ck.shape[0]} (both must be batch + 1)",
            )
        batch = cq.shape[0] - 1
        total_q, total_k = args[0].shape[0] if args[0].shape else 0, args[1].shape[0] if args[1].shape else 0
        if hq is not None and hk is not None:
            _check_host_cu_seqlens(hq, hk, total_q, total_k, max_q, max_k)
        vl_shape = (batch, total_q, total_k, max_q, max_k)
        cu = (cq, ck, batch, max_q, max_k)

    lse_shape = _tessera.check_attention(
        args[0].desc(), args[1].desc(), args[2].desc(), vl_shape, bool(causal), window, scale, softcap
    )
    user_shape = (*args[0].shape[:-1], head_dim)  # q's shape before any padding
    oa: Optional[Arg] = None
    if out is not None:
        oa = as_arg(out, "out")
        check_writable(oa, "out")
        if oa.shape != user_shape or oa.dtype != args[0].dtype:
            raise invalid(
                "out",
                f"must have q's shape {list(user_shape)} and dtype {args[0].dtype}, got {list(oa.shape)} {oa.dtype}",
            )
        if oa.shape != args[0].shape and not oa.is_torch:
            raise unsupported("out= must be a torch tensor when the head dim is padded")
    everything = args + ([oa] if oa is not None else []) + ([cu[0], cu[1]] if cu is not None else [])
    device = device_of(everything)
    # the kernel writes q's (padded) shape: a caller's `out` directly unless the head dim was
    # padded, then a copy of the unpadded part
    o = oa if oa is not None and oa.shape == args[0].shape else as_arg(empty(args[0].shape, args[0].dtype, device), "out")
    lse = as_arg(empty(lse_shape, "float32", device), "lse") if return_lse else None
    stream = stream_of(everything, device)
    _tessera.flash_attention(
        device,
        stream,
        args[0].desc(),
        args[1].desc(),
        args[2].desc(),
        o.desc(),
        lse.desc() if lse is not None else None,
        None if cu is None else (cu[0].ptr, cu[1].ptr, cu[2], cu[3], cu[4]),
        bool(causal),
        window,
        scale,
        softcap,
    )
    result = o.obj
    if head_dim != args[0].shape[-1]:
        result = result[..., :head_dim]
        if oa is not None:
            result = oa.obj.copy_(result)
    if lse is not None:
        return result, lse.obj, None
    return result


def _check_host_cu_seqlens(hq: List[int], hk: List[int], total_q: int, total_k: int, max_q: int, max_k: int) -> None:
    """Checks cu_seqlens read on the host against the packed tensors and the maxima."""
    longest_q, longest_k = _tessera.validate_cu_seqlens(hq, hk)
    for name, last, total in (("cu_seqlens_q", hq[-1], total_q), ("cu_seqlens_k", hk[-1], total_k)):
        if last > total:
            raise invalid(name, f"ends at {last}, past the {total} packed rows")
    for name, longest, given in (("max_seqlen_q", longest_q, max_q), ("max_seqlen_k", longest_k, max_k)):
        if longest > given:
            raise invalid(name, f"is {given} but a sequence has {longest} rows")
