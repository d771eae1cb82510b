"""The paged KV cache: :class:`PagedKVCache`, :func:`append_paged_kv_cache` and
:class:`BatchDecodeWithPagedKVCacheWrapper`, in the manner of FlashInfer's paged API.

The cache owns its pages: tessera allocates them (``num_layers`` allocations of
``[num_pages, 2, page_size, num_kv_heads, head_dim]``, FlashInfer's "NHD" layout, K then V of a
page adjacent) from its device memory pool; :meth:`PagedKVCache.kv_cache` is a torch view of
them, without a copy, that keeps the cache alive.

Block tables are FlashInfer's CSR form: sequence ``b`` owns pages
``indices[indptr[b]:indptr[b + 1]]``, and its last page holds ``last_page_len[b]`` tokens, so its
length is ``(indptr[b + 1] - indptr[b] - 1) * page_size + last_page_len[b]``. Token ``t`` of a
sequence lives in page ``table[t // page_size]`` at offset ``t % page_size``.

Streams: work is queued on the caller's current CUDA stream without synchronising. A cache or
wrapper used on another stream than before first makes the current stream wait for the previous
one (an event), so tessera's own work on one object is ordered whatever the streams; work other
code queues on the pages (through the torch views) follows torch's rules: use the same stream,
or synchronise, as with FlashInfer.
"""

from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence, Tuple, Union

from . import _tessera
from ._attention import _kernel_ready, _no_autograd
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

# accepted spellings of the cache dtypes -> tessera's names
_KV_DTYPES = {
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float8_e4m3fn": "fp8e4m3",
    "fp8_e4m3": "fp8e4m3",
    "fp8e4m3": "fp8e4m3",
    "e4m3": "fp8e4m3",
}
_Q_DTYPES = {"float16": "float16", "fp16": "float16", "half": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16"}

Ints = Union[Sequence[int], Any]


def _dtype_name(d: Any, arg: str, table: dict) -> str:
    """tessera's name of a torch dtype or a dtype string (``arg`` names it in errors)."""
    name = str(d).replace("torch.", "") if not isinstance(d, str) else d
    try:
        return table[name.lower()]
    except KeyError:
        raise unsupported(f"`{arg}` = {name}: supported are {', '.join(sorted(set(table)))}") from None


_Q_DEFAULT = "float16"  # FlashInfer's default of plan(q_data_type=...)


def resolve_plan_dtypes(
    q_data_type: Any = _Q_DEFAULT,
    kv_data_type: Any = None,
    o_data_type: Any = None,
    data_type: Any = None,
) -> Tuple[str, str]:
    """tessera's names ``(q, kv)`` of the dtypes ``BatchDecodeWithPagedKVCacheWrapper.plan()``
    was given, by FlashInfer's rule (``flashinfer/decode.py``, ``plan``):

    1. ``data_type`` (deprecated) fills only the arguments that are None: ``q_data_type`` if it is
       None, ``kv_data_type`` if it is None. An explicit ``q_data_type`` / ``kv_data_type`` wins.
       ``q_data_type`` defaults to ``"float16"`` (not None), so ``data_type`` alone sets only
       the cache dtype, and ``plan(..., data_type=torch.float8_e4m3fn,
       q_data_type=torch.float16)`` is an fp16 query over an fp8 cache.
    2. ``kv_data_type`` still None: ``q_data_type``.
    3. ``o_data_type`` None: ``q_data_type`` (tessera writes the output in q's dtype only).

    Pure host logic (no device, no torch needed); raises ``UnsupportedError`` for a dtype tessera
    does not support and ``InvalidArgumentError`` for a combination it refuses, naming the
    argument.
    """
    kv_from_data_type = data_type is not None and kv_data_type is None and q_data_type is not None
    if data_type is not None:
        if q_data_type is None:
            q_data_type = data_type
        if kv_data_type is None:
            kv_data_type = data_type
    if q_data_type is None:
        raise invalid("q_data_type", "must be a dtype (a torch dtype or its name) when data_type is not given")
    q_name = _dtype_name(q_data_type, "q_data_type", _Q_DTYPES)
    kv_name = _dtype_name(q_data_type if kv_data_type is None else kv_data_type, "kv_data_type", _KV_DTYPES)
    if o_data_type is not None and _dtype_name(o_data_type, "o_data_type", _Q_DTYPES) != q_name:
        raise unsupported(f"`o_data_type` = {o_data_type}: the output has q's dtype ({q_name})")
    if kv_from_data_type and kv_name != "fp8e4m3" and kv_name != q_name:
        # a 16-bit cache must match the query: say why data_type did not set the query dtype
        raise invalid(
            "data_type",
            f"sets only the dtypes not given (as in FlashInfer): q_data_type is {q_name} (its default is "
            f"{_Q_DEFAULT}) but the cache dtype is {kv_name}, and a 16-bit cache must have q's dtype; pass "
            f"q_data_type={kv_name} too (or use q_data_type / kv_data_type instead of the deprecated data_type)",
        )
    return q_name, kv_name


def _host_ints(x: Any, name: str) -> List[int]:
    """The values of an index argument on the host: a list/tuple of ints, or an integer tensor
    (a CUDA tensor is copied to the host: that synchronises with its stream)."""
    if isinstance(x, (list, tuple)):
        out = []
        for v in x:
            if isinstance(v, bool) or not isinstance(v, int):
                try:
                    iv = int(v)
                except (TypeError, ValueError):
                    raise invalid(name, f"must hold ints, got {type(v).__name__}") from None
                if iv != v:
                    raise invalid(name, f"must hold ints, got {v!r}")
                v = iv
            out.append(int(v))
        return out
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            raise invalid(name, f"must be an integer tensor, got {str(x.dtype).replace('torch.', '')}")
        if x.dim() != 1:
            raise invalid(name, f"must be 1-D, got shape {list(x.shape)}")
        return [int(v) for v in x.tolist()]
    if hasattr(x, "tolist"):  # numpy
        return _host_ints(list(x.tolist()), name)
    raise TypeError(f"`{name}` must be a list of ints or a 1-D integer tensor, got {type(x).__name__}")


def _tensor_device(*xs: Any) -> Optional[int]:
    """The CUDA device of the first CUDA torch tensor among ``xs``, else None."""
    torch = _torch()
    if torch is None:
        return None
    for x in xs:
        if isinstance(x, torch.Tensor) and x.is_cuda:
            return x.device.index if x.device.index is not None else torch.cuda.current_device()
    return None


def _default_device(device: Any) -> int:
    """A CUDA ordinal from ``None`` (torch's current device, else 0), an int, ``"cuda:N"`` or a
    ``torch.device``."""
    if device is None:
        torch = _torch()
        return torch.cuda.current_device() if torch is not None and torch.cuda.is_available() else 0
    if isinstance(device, bool):
        raise invalid("device", f"must be a CUDA device, got {device!r}")
    if isinstance(device, int):
        if device < 0:
            raise invalid("device", f"must be a CUDA ordinal >= 0, got {device}")
        return device
    text = str(device)
    if text == "cuda":
        return _default_device(None)
    if text.startswith("cuda:") and text[5:].isdigit():
        return int(text[5:])
    raise invalid("device", f"must be a CUDA device (an ordinal, 'cuda:N' or a torch.device), got {device!r}")


def _lengths(indptr: List[int], last_page_len: List[int], page_size: int) -> List[int]:
    """Sequence lengths from FlashInfer's indptr and last_page_len."""
    b = len(indptr) - 1
    if b < 1:
        raise invalid("indptr", f"must have batch_size + 1 >= 2 entries, got {len(indptr)}")
    if len(last_page_len) != b:
        raise invalid("last_page_len", f"must have batch_size = {b} entries (one per sequence), got {len(last_page_len)}")
    lens = []
    for i in range(b):
        pages = indptr[i + 1] - indptr[i]
        last = last_page_len[i]
        if pages < 0:
            raise invalid("indptr", f"must be non-decreasing: indptr[{i + 1}] = {indptr[i + 1]} < indptr[{i}] = {indptr[i]}")
        if pages == 0:
            if last != 0:
                raise invalid("last_page_len", f"sequence {i} has no pages, so last_page_len[{i}] must be 0, got {last}")
            lens.append(0)
            continue
        if not 0 <= last <= page_size:
            raise invalid("last_page_len", f"last_page_len[{i}] = {last} must be in 0..={page_size} (the page size)")
        lens.append((pages - 1) * page_size + last)
    return lens


class _DeviceMemory:
    """``__cuda_array_interface__`` of ``nbytes`` bytes of the cache's memory at ``ptr``; keeps
    ``owner`` (the cache) alive while any tensor made from it lives."""

    def __init__(self, owner: Any, ptr: int, nbytes: int) -> None:
        self._owner = owner
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
            "stream": None,  # the pages were synchronised when allocated
        }


class PagedKVCache:
    """A paged KV cache on a CUDA device, owned by tessera.

    Per layer ``[num_pages, 2, page_size, num_kv_heads, head_dim]`` (K at ``[:, 0]``, V at
    ``[:, 1]``: FlashInfer's "NHD" layout), fp16, bf16 or fp8 e4m3. An fp8 cache has one f32
    scale per (page, KV head, K|V) (stored value = round(x / scale)), ``fp8_scale`` to start.

    Args:
        num_pages: pages in the pool (``P``), shared by the layers.
        page_size: tokens per page (``T``): a power of two from 8 to 256.
        num_kv_heads: KV heads (``Hkv``).
        head_dim: 64, 128 or 256.
        dtype: ``torch.float16`` / ``"fp16"``, ``torch.bfloat16`` / ``"bf16"``, or
            ``torch.float8_e4m3fn`` / ``"fp8_e4m3"``.
        num_layers: layers, each its own allocation (default 1).
        device: CUDA device (ordinal, ``"cuda:N"`` or ``torch.device``); default torch's current
            device.
        fp8_scale: the scale every page of an fp8 cache starts with (default 1.0).

    The pages' contents are unspecified until written (by :func:`append_paged_kv_cache`, by
    :meth:`BatchDecodeWithPagedKVCacheWrapper.append`, or through :meth:`kv_cache`). They are
    freed when the object and every view of it are gone.

    Raises:
        InvalidArgumentError / UnsupportedError: a field out of range (checked without a GPU).
        NoGpuError: no usable GPU.
    """

    def __init__(
        self,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: Any = "float16",
        num_layers: int = 1,
        device: Any = None,
        fp8_scale: float = 1.0,
    ) -> None:
        ints = {"num_pages": num_pages, "page_size": page_size, "num_kv_heads": num_kv_heads,
                "head_dim": head_dim, "num_layers": num_layers}
        for name, v in ints.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise invalid(name, f"must be a non-negative int, got {v!r}")
        cfg = (num_pages, page_size, num_kv_heads, head_dim, _dtype_name(dtype, "dtype", _KV_DTYPES), num_layers,
               float(fp8_scale))
        _tessera.check_kv_cache(cfg)  # argument errors without a device
        dev = _default_device(device)
        self._c = _tessera.KvCache(dev, stream_of([], dev), cfg)

    # -- properties --------------------------------------------------------------------------

    @property
    def num_pages(self) -> int:
        """Pages in the pool (``P``)."""
        return int(self._c.config()[0])

    @property
    def page_size(self) -> int:
        """Tokens per page (``T``)."""
        return int(self._c.config()[1])

    @property
    def num_kv_heads(self) -> int:
        """KV heads (``Hkv``)."""
        return int(self._c.config()[2])

    @property
    def head_dim(self) -> int:
        """Head dimension (``D``)."""
        return int(self._c.config()[3])

    @property
    def dtype(self) -> str:
        """The storage dtype by its torch name: ``"float16"``, ``"bfloat16"`` or ``"float8_e4m3fn"``
        (``getattr(torch, cache.dtype)`` is the torch dtype)."""
        return str(self._c.config()[4])

    @property
    def num_layers(self) -> int:
        """Layers."""
        return int(self._c.config()[5])

    @property
    def device(self) -> int:
        """The CUDA device ordinal."""
        return int(self._c.device)

    @property
    def shape(self) -> Tuple[int, int, int, int, int]:
        """``(num_pages, 2, page_size, num_kv_heads, head_dim)``: the shape of :meth:`kv_cache`."""
        p, t, h, d = self._c.config()[:4]
        return (p, 2, t, h, d)

    def __repr__(self) -> str:
        return (f"PagedKVCache(num_pages={self.num_pages}, page_size={self.page_size}, num_kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, dtype={self.dtype}, num_layers={self.num_layers}, device=cuda:{self.device})")

    # -- views -------------------------------------------------------------------------------

    def kv_cache(self, layer: int = 0):
        """The pages of ``layer`` as a torch tensor ``[num_pages, 2, page_size, num_kv_heads,
        head_dim]`` of the cache dtype: a view of tessera's memory (no copy) that keeps the cache
        alive. Read or write pages through it on the current stream (writes into an fp8 cache
        store raw e4m3 values, to be read with the page's scale)."""
        torch = require_torch("PagedKVCache.kv_cache")
        ptr, nbytes = self._c.layer_memory(layer)
        raw = torch.as_tensor(_DeviceMemory(self, ptr, nbytes), device=torch.device("cuda", self.device))
        return raw.view(getattr(torch, self.dtype)).view(self.shape)

    def scales(self, layer: int = 0):
        """fp8 caches only: the ``[num_pages, num_kv_heads, 2]`` float32 scales of ``layer`` (``[...,
        0]`` K, ``[..., 1]`` V) as a torch view of tessera's memory (values must stay finite and
        > 0). Dequantised K of page ``p``, head ``h``: ``kv_cache()[p, 0, :, h].float() *
        scales()[p, h, 0]``."""
        torch = require_torch("PagedKVCache.scales")
        ptr, nbytes = self._c.scales_memory(layer)
        raw = torch.as_tensor(_DeviceMemory(self, ptr, nbytes), device=torch.device("cuda", self.device))
        return raw.view(torch.float32).view(self.num_pages, self.num_kv_heads, 2)

    def set_scales(self, scales: Any, layer: int = 0) -> None:
        """fp8 only: sets all ``[num_pages, num_kv_heads, 2]`` scales of ``layer`` (a tensor or
        nested list; checked to lie in (0, 65504]). Synchronises. Pages keep their stored bytes: set a
        page's scale before appending into it."""
        torch = _torch()
        if torch is not None and isinstance(scales, torch.Tensor):
            values = [float(v) for v in scales.detach().flatten().tolist()]
        else:
            values = [float(v) for v in _flatten(scales)]
        self._c.set_scales(layer, values)

    def copy_pages(self, src: Ints, dst: Ints) -> None:
        """Copies whole pages ``src[i] -> dst[i]`` (K, V and fp8 scales of every layer), in order,
        on the current stream: the copy-on-write of a shared page before appending into it."""
        s, d = _host_ints(src, "src"), _host_ints(dst, "dst")
        self._c.copy_pages(stream_of([], self.device), s, d)


def _flatten(x: Any) -> List[Any]:
    if isinstance(x, (list, tuple)):
        out: List[Any] = []
        for v in x:
            out += _flatten(v)
        return out
    return [x]


def _check_cache(cache: Any, name: str = "paged_kv_cache") -> PagedKVCache:
    if not isinstance(cache, PagedKVCache):
        raise TypeError(
            f"`{name}` must be a tessera.PagedKVCache (tessera owns its pages; PagedKVCache.kv_cache() is a torch view "
            f"of them), got {type(cache).__name__}"
        )
    return cache


def _kv_inputs(append_key: Any, append_value: Any) -> Tuple[Arg, Arg]:
    """The K/V rows, copied when their last dimension is not contiguous."""
    out = []
    for x, n in ((append_key, "append_key"), (append_value, "append_value")):
        a = as_arg(x, n)
        if a.is_torch and len(a.shape) == 3 and a.strides[-1] != 1 and a.shape[-1] > 1:
            a = as_arg(a.obj.contiguous(), n)
        out.append(a)
    return out[0], out[1]


def append_paged_kv_cache(
    append_key: Any,
    append_value: Any,
    batch_indices: Ints,
    positions: Ints,
    paged_kv_cache: PagedKVCache,
    kv_indices: Ints,
    kv_indptr: Ints,
    kv_last_page_len: Ints,
    kv_layout: str = "NHD",
    *,
    layer: int = 0,
) -> None:
    """Writes new K/V rows into a paged cache, as ``flashinfer.append_paged_kv_cache``.

    Row ``i`` of ``append_key`` / ``append_value`` (``[nnz, num_kv_heads, head_dim]``, fp16 or
    bf16: the cache dtype, or either for an fp8 cache, which quantises with each page's scale)
    goes to position ``positions[i]`` of sequence ``batch_indices[i]``. The tables and
    ``kv_last_page_len`` describe the sequences *after* the append.

    tessera's append kernel writes the rows of each sequence at its last positions: the rows
    must be packed by sequence in order (``batch_indices`` non-decreasing) and sequence ``b``'s
    ``n_b`` rows must be at positions ``len_b - n_b, ..., len_b - 1`` in order (what
    ``flashinfer.get_batch_indices_positions`` produces); anything else raises
    ``UnsupportedError`` naming the argument.

    Args:
        append_key, append_value: ``[nnz, num_kv_heads, head_dim]`` CUDA tensors (last dim
            contiguous, or copied).
        batch_indices, positions: ``[nnz]`` ints: CPU tensors or lists (CUDA tensors are copied
            to the host, which synchronises).
        paged_kv_cache: a :class:`PagedKVCache` (its layer ``layer`` is written).
        kv_indices, kv_indptr, kv_last_page_len: the CSR block tables and last-page fills after
            the append; checked against the cache (page ids < num_pages, tables long enough).
        kv_layout: must be ``"NHD"``.
        layer: keyword only, tessera's addition: the layer to write (default 0).

    Queued on the current stream of the tensors' device; nothing synchronises except reading
    CUDA index tensors. In a decode loop :meth:`BatchDecodeWithPagedKVCacheWrapper.append` reuses
    the tables of ``plan()`` instead (no host work per layer).
    """
    cache = _check_cache(paged_kv_cache)
    if kv_layout != "NHD":
        raise unsupported(f"`kv_layout` = {kv_layout!r}: tessera's paged cache is \"NHD\" only")
    k, v = _kv_inputs(append_key, append_value)
    if len(k.shape) != 3:
        raise invalid("append_key", f"must be [nnz, num_kv_heads, head_dim], got shape {list(k.shape)}")
    nnz = k.shape[0]
    bi = _host_ints(batch_indices, "batch_indices")
    pos = _host_ints(positions, "positions")
    for name, vals in (("batch_indices", bi), ("positions", pos)):
        if len(vals) != nnz:
            raise invalid(name, f"must have nnz = {nnz} entries (append_key's rows), got {len(vals)}")
    indptr = _host_ints(kv_indptr, "kv_indptr")
    indices = _host_ints(kv_indices, "kv_indices")
    lens = _lengths(indptr, _host_ints(kv_last_page_len, "kv_last_page_len"), cache.page_size)
    counts = _counts(bi, pos, lens)
    device = device_of([k, v])
    if device != cache.device:
        raise invalid("paged_kv_cache", f"is on cuda:{cache.device} but append_key is on cuda:{device}")
    stream = stream_of([k, v], device)
    cache._c.append(stream, layer, k.desc(), v.desc(), indptr, indices, lens, counts)


def _counts(bi: List[int], pos: List[int], lens: List[int]) -> List[int]:
    """Rows per sequence, checking that the rows of each sequence are its last positions."""
    b = len(lens)
    counts = [0] * b
    prev = 0
    for i, s in enumerate(bi):
        if not 0 <= s < b:
            raise invalid("batch_indices", f"batch_indices[{i}] = {s} is not a sequence of the batch (0..{b})")
        if s < prev:
            raise unsupported(
                f"`batch_indices`: rows must be packed by sequence in order (non-decreasing), but batch_indices[{i}] = "
                f"{s} follows {prev}"
            )
        prev = s
        counts[s] += 1
    row = 0
    for s in range(b):
        n = counts[s]
        if n > lens[s]:
            raise invalid("kv_last_page_len", f"sequence {s} appends {n} rows but its length after the append is {lens[s]}")
        for j in range(n):
            want = lens[s] - n + j
            if pos[row + j] != want:
                raise unsupported(
                    f"`positions`: tessera appends each sequence's rows at its last positions in order; sequence {s} "
                    f"has {n} rows and length {lens[s]}, so positions[{row + j}] must be {want}, got {pos[row + j]}"
                )
        row += n
    return counts


class BatchDecodeWithPagedKVCacheWrapper:
    """Batched decode (one query token per sequence) over a :class:`PagedKVCache`, in the manner of
    ``flashinfer.BatchDecodeWithPagedKVCacheWrapper``: ``plan()`` once per step with the block
    tables (host work: validation, upload, split-KV planning), then ``run()`` per layer (kernel
    launches only).

    GQA: query head ``h`` reads KV head ``h // (num_qo_heads // num_kv_heads)``. Long sequences
    are split over several CTAs and merged (split-KV), as FlashInfer does.

    Args:
        float_workspace_buffer: accepted for FlashInfer compatibility and unused: tessera
            allocates its (small) split-KV workspace itself, from its memory pool.
        kv_layout: must be ``"NHD"``.
        use_cuda_graph: must be False (CUDA-graph capture is not supported by this wrapper).
        use_tensor_cores: accepted and ignored (tessera picks its kernel itself).
    """

    def __init__(
        self,
        float_workspace_buffer: Any = None,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        use_tensor_cores: bool = False,
    ) -> None:
        if kv_layout != "NHD":
            raise unsupported(f"`kv_layout` = {kv_layout!r}: tessera's paged cache is \"NHD\" only")
        if use_cuda_graph:
            raise unsupported("`use_cuda_graph` = True: CUDA-graph capture is not supported by tessera's decode wrapper")
        self._w = _tessera.DecodeWrapper()
        self._q_dtype: Optional[str] = None

    def plan(
        self,
        indptr: Ints,
        indices: Ints,
        last_page_len: Ints,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        pos_encoding_mode: str = "NONE",
        window_left: int = -1,
        logits_soft_cap: Optional[float] = None,
        q_data_type: Any = "float16",
        kv_data_type: Any = None,
        o_data_type: Any = None,
        data_type: Any = None,
        sm_scale: Optional[float] = None,
        rope_scale: Optional[float] = None,
        rope_theta: Optional[float] = None,
        non_blocking: bool = True,
        block_tables: Any = None,
        seq_lens: Any = None,
        fixed_split_size: Optional[int] = None,
        disable_split_kv: bool = False,
    ) -> None:
        """Plans the decode of a batch: sequence ``b`` owns pages ``indices[indptr[b]:indptr[b +
        1]]`` and has ``(indptr[b + 1] - indptr[b] - 1) * page_size + last_page_len[b]`` tokens
        (its query's own K/V included: append it before ``run()``).

        Args:
            indptr: ``[batch_size + 1]`` ints, 0 first, non-decreasing.
            indices: the physical page ids, ``[indptr[-1]]`` (or more) ints.
            last_page_len: ``[batch_size]`` ints in ``1..=page_size`` (0 for a sequence without
                pages).
            num_qo_heads, num_kv_heads: query and KV heads (``num_qo_heads % num_kv_heads == 0``).
            head_dim: 64, 128 or 256. page_size: the cache's page size.
            pos_encoding_mode: must be ``"NONE"`` (apply RoPE to q and k before).
            window_left: must be -1. logits_soft_cap: must be None or 0.
            q_data_type: ``torch.float16`` (default) or ``torch.bfloat16`` (or their names).
            kv_data_type: the cache dtype; default ``q_data_type`` (fp8: ``torch.float8_e4m3fn``).
            o_data_type: None or ``q_data_type``.
            data_type: deprecated (FlashInfer's rule): fills ``q_data_type`` and ``kv_data_type``
                only where they are None. Since ``q_data_type`` defaults to ``"float16"``,
                ``data_type`` alone sets the cache dtype; ``plan(..., data_type=torch.float8_e4m3fn,
                q_data_type=torch.float16)`` plans an fp16 query over an fp8 cache (see
                :func:`tessera._kvcache.resolve_plan_dtypes`).
            sm_scale: softmax scale; default ``1 / sqrt(head_dim)``.
            rope_scale, rope_theta, non_blocking: accepted and ignored (as FlashInfer with
                ``pos_encoding_mode="NONE"``).
            block_tables, seq_lens, fixed_split_size: must be None.
            disable_split_kv: one CTA per (sequence, KV head) instead of split-KV.

        The index arguments may be lists or CPU tensors; CUDA tensors are copied to the host
        (a synchronisation, as FlashInfer's plan does). Page ids are checked against the cache
        when the tables are uploaded: here when this wrapper already ran on the current stream
        (its last cache), else at the first ``run()``.
        """
        if pos_encoding_mode != "NONE":
            raise unsupported(f"`pos_encoding_mode` = {pos_encoding_mode!r}: only \"NONE\" (apply RoPE to q and k first)")
        if window_left not in (-1, None):
            raise unsupported(f"`window_left` = {window_left}: sliding windows are not supported by the paged decode")
        if logits_soft_cap not in (None, 0, 0.0):
            raise unsupported(f"`logits_soft_cap` = {logits_soft_cap}: soft-capping is not supported by the paged decode")
        for name, val in (("block_tables", block_tables), ("seq_lens", seq_lens), ("fixed_split_size", fixed_split_size)):
            if val is not None:
                raise unsupported(f"`{name}`: not supported (pass the CSR tables indptr / indices / last_page_len)")
        q_name, kv_name = resolve_plan_dtypes(q_data_type, kv_data_type, o_data_type, data_type)
        for name, v in (("num_qo_heads", num_qo_heads), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
                        ("page_size", page_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise invalid(name, f"must be a positive int, got {v!r}")
        if sm_scale is not None and not (math.isfinite(float(sm_scale)) and float(sm_scale) > 0):
            raise invalid("sm_scale", f"must be finite and > 0, got {sm_scale}")
        ip = _host_ints(indptr, "indptr")
        idx = _host_ints(indices, "indices")
        lens = _lengths(ip, _host_ints(last_page_len, "last_page_len"), page_size)
        dev = _tensor_device(indptr, indices, last_page_len)
        device = dev if dev is not None else _default_device(None)
        torch = _torch()
        stream = stream_of([], device) if torch is not None else 0
        self._w.plan(device, stream, ip, idx, lens, num_qo_heads, num_kv_heads, head_dim, page_size, kv_name, q_name,
                     None if sm_scale is None else float(sm_scale), bool(disable_split_kv))
        self._q_dtype = q_name

    begin_forward = plan

    def run(
        self,
        q: Any,
        paged_kv_cache: PagedKVCache,
        *,
        k_scale: Optional[float] = None,
        v_scale: Optional[float] = None,
        out: Any = None,
        lse: Any = None,
        return_lse: bool = False,
        layer: int = 0,
    ) -> Any:
        """Decode attention of ``layer`` of ``paged_kv_cache`` for the planned batch:
        ``out[b, h] = softmax_j(q[b, h] . K[b, j, h // g] * sm_scale) V[b, j, h // g]`` over the
        ``len_b`` tokens of sequence ``b`` (0 tokens: zeros, LSE ``-inf``).

        The LSE follows FlashInfer's convention: base 2, ``lse[b, h] = log2(sum_j 2^(s_j *
        log2(e)))`` of the scaled scores ``s_j = q[b, h] . K[b, j, h // g] * sm_scale``, i.e. the
        natural-log LSE times ``log2(e)`` (``torch.logsumexp(s, -1) / math.log(2)``). A sequence
        of length 0 sees no key: its LSE is ``-inf`` (never NaN) and its output zeros.
        (:func:`tessera.flash_attn_func`'s LSE is flash_attn's: natural log.)

        Args:
            q: ``[batch_size, num_qo_heads, head_dim]`` of the planned ``q_data_type`` (copied
                when its strides are not multiples of 8 elements or it is not 16-byte aligned).
            paged_kv_cache: a :class:`PagedKVCache` matching the plan (page size, heads, head
                dim, dtype).
            k_scale, v_scale: must be None (an fp8 cache carries per-page scales itself).
            out: write the output here (``q``'s shape and dtype) instead of allocating it.
            lse: write the log-sum-exp here (float32 ``[batch_size, num_qo_heads]``,
                contiguous); implies ``return_lse``.
            return_lse: also return the LSE (base 2, as FlashInfer; see above).
            layer: keyword only, tessera's addition: the layer to read (default 0).

        Returns:
            ``out``, or ``(out, lse)`` with ``return_lse`` (``lse``: float32 ``[batch_size,
            num_qo_heads]``, base 2).

        Queued on the current stream of q's device; nothing synchronises. The first run after a
        plan() on a new stream or cache uploads the tables and plans (small synchronous copies).
        The base-2 LSE costs one more small elementwise kernel (torch's), on the same stream.
        """
        for name, val in (("k_scale", k_scale), ("v_scale", v_scale)):
            if val is not None:
                raise unsupported(f"`{name}`: an fp8 PagedKVCache carries per-page scales (PagedKVCache.set_scales)")
        shape = self._w.planned_shape()
        if shape is None:
            raise invalid("plan", "run() before plan(): call plan(...) first")
        cache = _check_cache(paged_kv_cache)
        b, hq, d = shape
        qa = as_arg(q, "q")
        _no_autograd([qa])
        if qa.shape != (b, hq, d):
            raise invalid("q", f"must be [batch_size, num_qo_heads, head_dim] = {[b, hq, d]} (from plan()), got {list(qa.shape)}")
        if qa.dtype != self._q_dtype:
            raise invalid("q", f"has dtype {qa.dtype} but plan() was given q_data_type {self._q_dtype}")
        qa = _kernel_ready(qa, "q")
        device = device_of([qa])
        if device != cache.device:
            raise invalid("paged_kv_cache", f"is on cuda:{cache.device} but q is on cuda:{device}")
        if out is not None:
            oa = as_arg(out, "out")
            check_writable(oa, "out")
            if oa.shape != qa.shape or oa.dtype != qa.dtype:
                raise invalid("out", f"must have q's shape {list(qa.shape)} and dtype {qa.dtype}, got {list(oa.shape)} {oa.dtype}")
        else:
            oa = as_arg(empty(qa.shape, qa.dtype, device), "out")
        la: Optional[Arg] = None
        if lse is not None:
            la = as_arg(lse, "lse")
            check_writable(la, "lse")
            if la.shape != (b, hq) or la.dtype != "float32" or (b * hq > 1 and la.strides != (hq, 1)):
                raise invalid("lse", f"must be a contiguous float32 [{b}, {hq}], got {la.dtype} {list(la.shape)}")
            return_lse = True
        elif return_lse:
            la = as_arg(empty((b, hq), "float32", device), "lse")
        stream = stream_of([qa, oa], device)
        lse_desc = None if la is None else (la.ptr, la.dtype, (b, 1, hq), (hq, hq, 1))
        # the base-2 scaling needs torch: fail before launching, not with a natural-log LSE written
        torch = None if la is None else require_torch("the base-2 LSE of BatchDecodeWithPagedKVCacheWrapper")
        self._w.run(device, stream, _as_4d(qa), _as_4d(oa), lse_desc, cache._c, layer)
        if la is not None:
            _lse_to_base2(torch, la, device, stream)
        return (oa.obj, la.obj) if return_lse and la is not None else oa.obj

    forward = run

    def run_return_lse(
        self,
        q: Any,
        paged_kv_cache: PagedKVCache,
        *,
        k_scale: Optional[float] = None,
        v_scale: Optional[float] = None,
        out: Any = None,
        lse: Any = None,
        layer: int = 0,
    ) -> Tuple[Any, Any]:
        """:meth:`run` with ``return_lse=True``, as FlashInfer's ``run_return_lse``: returns
        ``(out, lse)``, ``lse`` float32 ``[batch_size, num_qo_heads]`` in base 2 (FlashInfer's
        convention: the natural-log LSE times ``log2(e)``; ``-inf`` for a sequence of length 0).
        Arguments as :meth:`run`."""
        return self.run(q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale, out=out, lse=lse, return_lse=True,
                        layer=layer)

    forward_return_lse = run_return_lse

    def append(self, append_key: Any, append_value: Any, paged_kv_cache: PagedKVCache, *, layer: int = 0) -> None:
        """tessera's decode-step append: writes one new K/V row per sequence (``append_key`` /
        ``append_value``: ``[batch_size, num_kv_heads, head_dim]``) at the last position of each
        planned sequence (``len_b - 1``) of ``layer``, with the tables ``plan()`` uploaded: no
        host work per layer. Plan with the lengths including the new token, then per layer
        ``append`` and ``run``."""
        shape = self._w.planned_shape()
        if shape is None:
            raise invalid("plan", "append() before plan(): call plan(...) first")
        cache = _check_cache(paged_kv_cache)
        k, v = _kv_inputs(append_key, append_value)
        want = (shape[0], cache.num_kv_heads, cache.head_dim)
        for a, n in ((k, "append_key"), (v, "append_value")):
            if a.shape != want:
                raise invalid(n, f"must be [batch_size, num_kv_heads, head_dim] = {list(want)}, got {list(a.shape)}")
        device = device_of([k, v])
        if device != cache.device:
            raise invalid("paged_kv_cache", f"is on cuda:{cache.device} but append_key is on cuda:{device}")
        self._w.append(device, stream_of([k, v], device), k.desc(), v.desc(), cache._c, layer)

    def describe(self) -> Optional[str]:
        """The device plan in one line (kernel, split-KV, CTAs) once ``run()`` built it, else None."""
        return self._w.describe()


LOG2E = 1.4426950408889634
"""log2(e): tessera's kernels write the natural-log LSE; FlashInfer's API returns it in base 2."""


def _lse_to_base2(torch: Any, la: Arg, device: int, stream: int) -> None:
    """Multiplies the natural-log LSE the kernel wrote into ``la`` by log2(e), in place, queued on
    ``stream`` (the decode's) after the kernel. ``-inf`` (a row that sees no key) stays ``-inf``;
    finite values stay finite: nothing becomes NaN."""
    t = la.obj if la.is_torch else torch.as_tensor(la.obj, device=torch.device("cuda", device))
    if stream_of([], device) == stream:
        t.mul_(LOG2E)
        return
    # the decode ran on another stream (an interface object's): scale on that one, in its order
    with torch.cuda.stream(torch.cuda.ExternalStream(stream, device=torch.device("cuda", device))):
        t.mul_(LOG2E)


def _as_4d(a: Arg) -> Tuple[int, str, Tuple[int, ...], Tuple[int, ...]]:
    """``[B, H, D]`` as the kernel's ``[B, 1, H, D]``."""
    b, h, d = a.shape
    s0, s1, s2 = a.strides
    return (a.ptr, a.dtype, (b, 1, h, d), (s0, s0, s1, s2))
