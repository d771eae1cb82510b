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
