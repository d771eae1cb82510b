"""Type stubs of the extension module ``tessera._tessera`` (Rust, PyO3).

Tensors cross as descriptors ``(data_ptr, dtype, shape, strides)``: the device address, a
dtype name (``"float32"``, ``"float16"``, ``"bfloat16"``, ``"int32"``), sizes, and strides in
elements. ``device`` is a CUDA ordinal; ``stream`` a raw ``CUstream`` as an integer (0 = the
default stream). The public API is in ``tessera/__init__.py``; these are its building blocks.
"""

from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

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

def operand_layout(shape: Sequence[int], strides: Sequence[int]) -> Optional[str]:
    """``"row"`` or ``"col"``: how the GEMM reads a 2-D or 3-D operand in place (its last two
    dimensions), or None when it needs a contiguous copy."""

def check_matmul(a: Desc, b: Desc, bias: Optional[Desc], out: Desc, activation: str = "none") -> Tuple[str, str]:
    """Validates ``out = act(a @ b + bias)`` (no device needed; ``out`` may have address 0);
    returns how a and b are read (``"row"`` / ``"col"``)."""

def matmul(
    device: int,
    stream: int,
    a: Desc,
    b: Desc,
    bias: Optional[Desc],
    out: Desc,
    activation: str = "none",
) -> str:
    """Queues ``out = act(a @ b + bias)`` on ``stream``; returns the kernel path that ran
    (``"sm80"``, ``"skinny"``, ``"simt"``, ``"dmma"``)."""

def check_scaled_mm(
    a: Desc,
    b: Desc,
    scale_a: Desc,
    scale_b: Desc,
    bias: Optional[Desc],
    out: Desc,
    scale_result: Optional[Desc] = None,
    amax: Optional[Desc] = None,
) -> str:
    """Validates ``out = (a @ b) * scale_a * scale_b + bias`` (fp8 or int8 ``a`` row-major, ``b``
    column-major; no device needed, ``out`` may have address 0), including the Hopper path's
    16-byte TMA rules; for an fp8 ``out`` (fp8 inputs, no bias) also the optional one-element
    float32 ``scale_result`` and ``amax``; returns the scaling, ``"tensor"`` or ``"row"``."""

def scaled_mm(
    device: int,
    stream: int,
    a: Desc,
    b: Desc,
    scale_a: Desc,
    scale_b: Desc,
    bias: Optional[Desc],
    out: Desc,
    scale_result: Optional[Desc] = None,
    amax: Optional[Desc] = None,
) -> str:
    """Queues ``out = (a @ b) * scale_a * scale_b + bias`` (fp8 ``out``:
    ``fp8(scale_result * (a @ b) * scale_a * scale_b)``, and ``amax`` = max |value| before
    ``scale_result`` if given) on ``stream`` (sm_90 only); returns the kernel path that ran
    (``"hopper"``)."""

def check_int_mm(a: Desc, b: Desc, out: Desc) -> None:
    """Validates ``out = a @ b`` (int8 ``a`` row-major, ``b`` column-major, int32 ``out``)
    without a device."""

def int_mm(device: int, stream: int, a: Desc, b: Desc, out: Desc) -> str:
    """Queues the int32 product ``out = a @ b`` on ``stream`` (sm_90 only); returns the kernel
    path that ran (``"hopper"``)."""

def check_csr(rows: int, cols: int, dtype: str, indptr: bytes, indices: bytes, data: bytes) -> int:
    """Validates host CSR arrays (``indptr``/``indices`` int64 bytes, ``data`` bytes of
    ``dtype``) without a device; returns the nonzeros after duplicates are summed."""

def check_sparse_product(
    rows: int, cols: int, dtype: str, x: Desc, out: Desc, transpose: bool
) -> Tuple[Optional[int], str]:
    """Validates ``out = A @ x`` (``A.T @ x`` with ``transpose``) for a ``rows x cols`` matrix of
    ``dtype`` without a device; returns x's columns (None for a vector) and layout."""

def check_lsmr(
    m: int,
    n: int,
    b_len: int,
    damp: float,
    atol: float,
    btol: float,
    conlim: float,
    x0: Optional[bytes] = None,
    damps: Optional[List[float]] = None,
) -> None:
    """Validates LSMR's arguments as SciPy does (no device needed); ``x0`` as host float64
    bytes; ``damps`` a damp list (not empty, each finite and >= 0, ``damp`` 0)."""

def check_lsmr_many(
    m: int,
    n: int,
    k: int,
    b: bytes,
    damp: float,
    atol: float,
    btol: float,
    conlim: float,
    x0: Optional[bytes] = None,
) -> None:
    """Validates LSMR over the ``k`` columns of ``b`` (host float64 bytes, ``m x k``
    column-major; every element finite, the error names column and row) and ``x0`` (``n x k``
    column-major) without a device: ``1 <= k <= LSMR_MAX_RHS`` and the options as check_lsmr."""

LSMR_MAX_RHS: int
LSMR_MAX_DAMPS: int

LsmrReturn = Tuple[
    bytes, List[int], List[int], List[float], List[float], List[float], List[float], List[float], List[str]
]
"""x of every result (float64 bytes, n each, one after the other), then per result istop, itn,
normr, normar, norma, conda, normx, then the progress lines of ``show``."""

def lsmr_callback(
    device: int,
    stream: int,
    m: int,
    n: int,
    dtype: str,
    apply: Callable[[bool, float, int, int, float, int], None],
    b: bytes,
    damp: float,
    atol: float,
    btol: float,
    conlim: float,
    maxiter: Optional[int],
    x0: Optional[bytes],
    show: bool,
    k: int = 1,
    damps: Optional[List[float]] = None,
) -> LsmrReturn:
    """LSMR on ``stream`` over ``apply(transpose, alpha, x_address, k, beta, y_address)``, which
    queues ``Y = alpha * op(A) X + beta * Y`` on that stream for ``k`` packed column-major
    columns. ``b``/``x0`` are host float64 bytes (``k >= 2``: ``m x k`` and ``n x k``
    column-major, one run over the columns; ``damps``: one run over the damp list); returns
    one result per column or damp (``LsmrReturn``)."""

class SparseMatrix:
    """A CSR matrix on one CUDA device (``tessera.sparse.csr_matrix`` holds one). It queues on
    the stream it was made on; products on other streams are ordered with events."""

    @staticmethod
    def from_csr(
        device: int, stream: int, rows: int, cols: int, dtype: str, indptr: bytes, indices: bytes, data: bytes
    ) -> "SparseMatrix":
        """Uploads host CSR arrays (validated; columns sorted, duplicates summed)."""
    @staticmethod
    def from_coo_device(
        device: int, stream: int, rows: int, cols: int, row: Desc, col: Desc, values: Desc
    ) -> "SparseMatrix":
        """Copies COO triplets on the device and converts them to CSR there."""
    @property
    def device(self) -> int:
        """The CUDA device ordinal."""
    @property
    def shape(self) -> Tuple[int, int]:
        """``(rows, cols)``."""
    @property
    def nnz(self) -> int:
        """Stored nonzeros."""
    @property
    def dtype(self) -> str:
        """The value dtype (torch name)."""
    @property
    def index_dtype(self) -> str:
        """``"int32"`` or ``"int64"``."""
    def matmul(self, stream: int, x: Desc, out: Desc, transpose: bool) -> None:
        """Queues ``out = A @ x`` (or ``A.T @ x``) for ``stream``."""
    def lsmr(
        self,
        b: bytes,
        damp: float,
        atol: float,
        btol: float,
        conlim: float,
        maxiter: Optional[int],
        x0: Optional[bytes],
        show: bool,
        k: int = 1,
        damps: Optional[List[float]] = None,
    ) -> LsmrReturn:
        """LSMR over this matrix (float32/float64) on its stream: one b, the ``k`` columns of
        b (``k >= 2``) or one b per damp of ``damps``, in one run."""
