"""Type stubs of the extension module ``tessera._tessera`` (Rust, PyO3).

Tensors cross as descriptors ``(data_ptr, dtype, shape, strides)``: the device address, a
dtype name (``"float32"``, ``"float16"``, ``"bfloat16"``, ``"int32"``), sizes, and strides in
elements. ``device`` is a CUDA ordinal; ``stream`` a raw ``CUstream`` as an integer (0 = the
default stream). The public API is in ``tessera/__init__.py``; these are its building blocks.
"""

from typing import Dict, List, Optional, Sequence, Tuple, Union

Desc = Tuple[int, str, Sequence[int], Sequence[int]]

__version__: str
PLAN_CACHE_CAPACITY: int

class TesseraError(Exception):
    """Base class of every error tessera raises."""

class InvalidArgumentError(TesseraError, ValueError):
    """An argument broke a documented rule (shape, dtype, stride, range); the message names it."""

class UnsupportedError(TesseraError, NotImplementedError):
    """A valid but unsupported argument or combination; the message says what is supported."""

class NoGpuError(TesseraError, RuntimeError):
    """No usable GPU: the CUDA driver, a device or NVRTC is missing."""

class CudaError(TesseraError, RuntimeError):
    """A CUDA driver call failed; the message names the call."""

class CompileError(TesseraError, RuntimeError):
    """NVRTC rejected a kernel; the message carries the kernel, options and log."""

class TesseraIOError(TesseraError, OSError):
    """A file-system error (the kernel cache)."""

class OutOfPagesError(TesseraError, MemoryError):
    """The paged KV cache has no free or evictable page; nothing was changed (preempt a sequence)."""

def check_softmax(x: Desc, y: Desc) -> None:
    """Validates a softmax over the last dimension of ``x`` into ``y`` (no device needed)."""

def softmax(device: int, stream: int, x: Desc, y: Desc, log: bool) -> None:
    """Queues ``y = softmax(x)`` (``log_softmax`` with ``log``) over the last dimension on
    ``stream``; ``y`` may be ``x`` (in place)."""

def check_attention(
    q: Desc,
    k: Desc,
    v: Desc,
    varlen: Optional[Tuple[int, int, int, int, int]],
    causal: bool,
    window: Tuple[int, int],
    scale: Optional[float],
    softcap: float,
    path: str = "auto",
) -> List[int]:
    """Validates a FlashAttention forward (no device needed) and returns the LSE shape
    (``[B, Hq, Nq]``, or ``[Hq, total_q]`` when ``varlen`` = ``(batch, total_q, total_k,
    max_seqlen_q, max_seqlen_k)`` is given)."""

def flash_attention(
    device: int,
    stream: int,
    q: Desc,
    k: Desc,
    v: Desc,
    out: Desc,
    lse: Optional[Desc],
    varlen: Optional[Tuple[int, int, int, int, int]],
    causal: bool,
    window: Tuple[int, int],
    scale: Optional[float],
    softcap: float,
    path: str = "auto",
) -> None:
    """Queues a FlashAttention forward on ``stream``. ``varlen`` is ``(cu_seqlens_q address,
    cu_seqlens_k address, batch, max_seqlen_q, max_seqlen_k)``; ``path`` forces a kernel
    family (``"auto"``, ``"hopper"``, ``"sm80"``)."""

def validate_cu_seqlens(cu_seqlens_q: Sequence[int], cu_seqlens_k: Sequence[int]) -> Tuple[int, int]:
    """Checks host offsets (start at 0, non-decreasing, equal lengths >= 2); returns the longest
    query and key sequence."""

def device_info(device: int = 0) -> Dict[str, Union[int, str, Tuple[int, int]]]:
    """Properties of a CUDA device; raises ``NoGpuError`` when none is usable."""

def pointer_device(ptr: int) -> int:
    """The CUDA device ordinal of a device address."""

def plan_cache_info() -> Dict[str, int]:
    """Sizes and hit/miss counts of the plan caches."""

def clear_plan_cache() -> None:
    """Drops every cached plan."""

KvConfig = Tuple[int, int, int, int, str, int, float]

def check_kv_cache(cfg: KvConfig) -> int:
    """Validates a paged KV cache configuration ``(num_pages, page_size, heads_kv, head_dim, dtype,
    num_layers, fp8_scale)`` without a device; returns the bytes of one layer."""

class KvCache:
    """A paged KV cache whose pages tessera allocates and owns (``tessera.PagedKVCache`` wraps it).
    Work is queued on the stream each call names; a call on another stream than the last one
    first makes it wait for that one (an event)."""

    def __init__(self, device: int, stream: int, cfg: KvConfig) -> None: ...
    @property
    def device(self) -> int:
        """The CUDA device ordinal."""
    def config(self) -> KvConfig:
        """``(num_pages, page_size, heads_kv, head_dim, dtype (torch name), num_layers, fp8_scale)``."""
    def layer_memory(self, layer: int) -> Tuple[int, int]:
        """``(address, bytes)`` of the ``[P, 2, T, Hkv, D]`` pages of ``layer``."""
    def scales_memory(self, layer: int) -> Tuple[int, int]:
        """``(address, bytes)`` of the ``[P, Hkv, 2]`` float32 scales of ``layer`` (fp8 only)."""
    def set_scales(self, layer: int, scales: Sequence[float]) -> None:
        """Sets every scale of ``layer`` (fp8 only); synchronises."""
    def copy_pages(self, stream: int, src: Sequence[int], dst: Sequence[int]) -> None:
        """Queues whole-page copies ``src[i] -> dst[i]`` (every layer, K, V and scales)."""
    def append(
        self,
        stream: int,
        layer: int,
        k: Desc,
        v: Desc,
        indptr: Sequence[int],
        indices: Sequence[int],
        seq_lens: Sequence[int],
        counts: Sequence[int],
    ) -> None:
        """Queues the write of ``counts[b]`` rows per sequence (packed in ``k``/``v``, ``[N, Hkv,
        D]``) at positions ``seq_lens[b] - counts[b] ..`` of ``layer``; the CSR tables and the
        lengths after the append are validated against the cache."""

class DecodeWrapper:
    """State of ``tessera.BatchDecodeWithPagedKVCacheWrapper``: the host-validated tables of the last
    ``plan()`` and, per (device, stream, cache), the device tables and decode plan."""

    def __init__(self) -> None: ...
    def plan(
        self,
        device: int,
        stream: int,
        indptr: Sequence[int],
        indices: Sequence[int],
        seq_lens: Sequence[int],
        heads_q: int,
        heads_kv: int,
        head_dim: int,
        page_size: int,
        kv_dtype: str,
        q_dtype: str,
        scale: Optional[float],
        disable_split_kv: bool,
    ) -> None:
        """Validates and keeps a decode batch (CSR tables, lengths, heads, dtypes, scale)."""
    def planned_shape(self) -> Optional[Tuple[int, int, int]]:
        """``(batch, heads_q, head_dim)`` of the last plan, or None."""
    def describe(self) -> Optional[str]:
        """The device plan in one line, once run() built it."""
    def run(
        self,
        device: int,
        stream: int,
        q: Desc,
        out: Desc,
        lse: Optional[Desc],
        cache: KvCache,
        layer: int,
    ) -> None:
        """Queues the decode of ``layer``: ``q``/``out`` ``[B, 1, Hq, D]``, ``lse`` f32 ``[B, 1, Hq]``."""
    def append(self, device: int, stream: int, k: Desc, v: Desc, cache: KvCache, layer: int) -> None:
        """Queues the write of one row per sequence (``[B, Hkv, D]``) at position ``len_b - 1``."""
