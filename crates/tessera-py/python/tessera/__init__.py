"""tessera: GPU operators for LLM inference, JIT-compiled for the GPU in the machine.

Functions take CUDA tensors (torch tensors, or any object with ``__cuda_array_interface__`` or
``__dlpack__``), queue their kernels on the caller's current CUDA stream without synchronising,
and return torch tensors (or write into ``out=``)::

    import torch, tessera

    q = torch.randn(2, 1024, 16, 128, device="cuda", dtype=torch.float16)
    k = torch.randn(2, 1024, 4, 128, device="cuda", dtype=torch.float16)
    v = torch.randn_like(k)
    o = tessera.flash_attn_func(q, k, v, causal=True)      # as flash_attn.flash_attn_func
    p = tessera.softmax(torch.randn(8, 1000, device="cuda"), dim=-1)
    x = torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)  # a [N, K] weight
    y = tessera.matmul(x, w.t(), activation="gelu")         # gelu(x @ w.T), one kernel

fp8 and int8 GEMM (sm_80+; fp8 sm_89+) follow torch's private ops: :func:`scaled_mm`
(``torch._scaled_mm``) and :func:`int_mm` (``torch._int_mm``).

Sparse least squares: :mod:`tessera.sparse` (``csr_matrix``: SpMV/SpMM with torch tensors) and
:func:`lsmr` (SciPy's ``scipy.sparse.linalg.lsmr`` on the GPU).

The paged KV cache (:class:`PagedKVCache`, :func:`append_paged_kv_cache`,
:class:`BatchDecodeWithPagedKVCacheWrapper`) follows FlashInfer's paged API: CSR block tables
(``indptr``, ``indices``, ``last_page_len``), ``plan()`` once per step, ``run()`` per layer.

Kernels are compiled by NVRTC on first use for the exact GPU (``libnvrtc.so.13``: the
``nvidia-cuda-nvrtc`` wheel that torch installs is found automatically) and cached on disk
(``$TESSERA_CACHE_DIR``, else ``~/.cache/tessera``); plans are cached per shape, so repeated
calls cost a lookup. ``import tessera`` works without a GPU; calling an operator without one
raises :class:`NoGpuError`.

Errors: :class:`InvalidArgumentError` (a ``ValueError``), :class:`UnsupportedError` (a
``NotImplementedError``), :class:`NoGpuError`, :class:`CudaError` and :class:`CompileError`
(``RuntimeError``\\ s), all subclasses of :class:`TesseraError`, with tessera's messages.
"""

from __future__ import annotations

from typing import Any, Dict

from ._tensors import find_nvrtc as _find_nvrtc

_find_nvrtc()

from . import _tessera  # noqa: E402
from ._attention import flash_attn_func, flash_attn_varlen_func  # noqa: E402
from ._matmul import matmul  # noqa: E402
from ._scaled_mm import int_mm, scaled_mm  # noqa: E402
from ._softmax import log_softmax, softmax  # noqa: E402
from ._tessera import (  # noqa: E402
    CompileError,
    CudaError,
    InvalidArgumentError,
    NoGpuError,
    OutOfPagesError,
    TesseraError,
    TesseraIOError,
    UnsupportedError,
)

from ._kvcache import (  # noqa: E402
    BatchDecodeWithPagedKVCacheWrapper,
    PagedKVCache,
    append_paged_kv_cache,
)

from . import sparse  # noqa: E402
from ._lsmr import lsmr  # noqa: E402

__version__: str = _tessera.__version__


def is_available(device: int = 0) -> bool:
    """True when tessera can run kernels on CUDA device ``device`` (driver, device and NVRTC
    found). Never raises for a missing GPU."""
    try:
        _tessera.device_info(device)
    except NoGpuError:
        return False
    return True


def device_info(device: int = 0) -> Dict[str, Any]:
    """What tessera sees of CUDA device ``device``: ``name``, ``compute_capability``, ``arch``
    (the NVRTC target, e.g. ``sm_90a``), ``sm_count``, ``total_memory`` (bytes),
    ``driver_version``, ``nvrtc_version`` and ``nvrtc_library``. Raises :class:`NoGpuError`
    (saying what was looked for) when the driver, the device or NVRTC is missing."""
    return dict(_tessera.device_info(device))


def plan_cache_info() -> Dict[str, int]:
    """Sizes and hit/miss counts of the plan caches (``softmax``, ``attention``, ``gemm``,
    ``capacity`` per kind). A plan is kept per (device, stream, shapes, options)."""
    return dict(_tessera.plan_cache_info())


def clear_plan_cache() -> None:
    """Drops every cached plan (their device workspaces are freed in their streams' order).
    Call it before destroying a CUDA stream that tessera ran on."""
    _tessera.clear_plan_cache()


__all__ = [
    "BatchDecodeWithPagedKVCacheWrapper",
    "CompileError",
    "CudaError",
    "InvalidArgumentError",
    "NoGpuError",
    "OutOfPagesError",
    "PagedKVCache",
    "TesseraError",
    "TesseraIOError",
    "UnsupportedError",
    "__version__",
    "append_paged_kv_cache",
    "clear_plan_cache",
    "device_info",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "int_mm",
    "is_available",
    "log_softmax",
    "lsmr",
    "matmul",
    "plan_cache_info",
    "scaled_mm",
    "softmax",
    "sparse",
]
