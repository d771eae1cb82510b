"""``tessera.lsmr``: SciPy's ``scipy.sparse.linalg.lsmr`` on the GPU."""

from __future__ import annotations

import array
import ctypes
import sys
from typing import Any, Optional, Tuple

from . import _tessera
from ._tensors import invalid, stream_of
from .sparse import _is_scipy_sparse, _is_torch_tensor, csr_matrix


def lsmr(
    A: Any,
    b: Any,
    damp: float = 0.0,
    atol: float = 1e-6,
    btol: float = 1e-6,
    conlim: float = 1e8,
    maxiter: Optional[int] = None,
    x0: Any = None,
    show: bool = False,
) -> Tuple[Any, int, int, float, float, float, float, float]:
    """Least squares by LSMR on the GPU: ``scipy.sparse.linalg.lsmr``'s arguments, stopping
    rules and returns, with the iteration on the device.

    Solves ``min ||[b; 0] - [A; damp I] x||_2`` (``A x = b`` when consistent, else least
    squares; the minimum-norm solution when A is rank deficient and x0 is None).

    Args:
        A: the ``m x n`` matrix: a :class:`tessera.sparse.csr_matrix` (used in place), a SciPy
            sparse matrix or array (copied to the device once per call; float64), a torch
            sparse CSR/COO tensor (copied once, in its dtype), a dense 2-D CUDA torch tensor
            (products by torch), or an object with ``shape``, ``matvec`` and ``rmatvec`` that
            take and return 1-D CUDA torch tensors (a ``dtype`` attribute picks float32 or
            float64; default b's if b is a torch tensor, else float64). Matrix-free operators
            run on the current stream of their device.
        b: ``[m]`` (or ``[m, 1]``): a NumPy array (or sequence) or a torch tensor.
        damp, atol, btol, conlim, maxiter, x0, show: as SciPy (defaults 0, 1e-6, 1e-6, 1e8,
            ``min(m, n)``, zeros, False). ``show`` prints ``itn ||r|| ||A^T r|| seconds`` every
            16 iterations (the solver's check interval) after the solve.

    Returns:
        ``(x, istop, itn, normr, normar, norma, conda, normx)`` as SciPy (``istop`` 0..7 with
        SciPy's meanings). ``x`` is of b's kind: a float64 NumPy array for a NumPy b (a list
        without NumPy), a torch tensor on b's device and of b's dtype (float32/float64; float64
        otherwise) for a torch b.

    Precision: the solve runs in the matrix's dtype, float32 or float64 (scalar recurrences and
    norms always in float64). A float32 matrix reaches about 1e-6 relative accuracy; ``atol``
    and ``btol`` far below that are not reachable (it then stops by another rule).

    Streams: a csr_matrix solves on the stream it was made on; ``b`` and ``x0`` are read, and
    ``x`` returned, through the host (the solver synchronises every 16 iterations anyway).

    Raises:
        InvalidArgumentError (a ValueError): shapes, NaN/inf in b or x0, negative tolerances.
        UnsupportedError (a NotImplementedError): float16/bfloat16 matrices, other A types.
        NoGpuError (a RuntimeError): no CUDA driver, device or NVRTC.
    """
    for name, v in (("damp", damp), ("atol", atol), ("btol", btol), ("conlim", conlim)):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise invalid(name, f"must be a real number, got {v!r}")
    if maxiter is not None and (isinstance(maxiter, bool) or not isinstance(maxiter, int) or maxiter < 0):
        raise invalid("maxiter", f"must be None or an int >= 0, got {maxiter!r}")
    m, n = _shape_of(A)
    bb, blen = _vector_bytes(b, "b", m)
    xb = _vector_bytes(x0, "x0", n)[0] if x0 is not None else None
    _tessera.check_lsmr(m, n, blen, float(damp), float(atol), float(btol), float(conlim), xb)
    args = (bb, float(damp), float(atol), float(btol), float(conlim), maxiter, xb, bool(show))

    if isinstance(A, csr_matrix) or _is_scipy_sparse(A) or (_is_torch_tensor(A) and A.layout != _strided()):
        mat = A if isinstance(A, csr_matrix) else csr_matrix(_float64(A) if _is_scipy_sparse(A) else A)
        r = mat._m.lsmr(*args)
    else:
        r = _solve_fn(A, b, m, n, args)
    x = _result_like(r[0], b, n)
    if show:
        print(f"tessera.lsmr: {m} x {n}, damp {damp}; itn ||r|| ||A^T r|| time")
        for line in r[8]:
            print(line)
        print(f"tessera.lsmr: istop {r[1]}, itn {r[2]}, normr {r[3]:.3e}, normar {r[4]:.3e}, norma {r[5]:.3e}, "
              f"conda {r[6]:.3e}, normx {r[7]:.3e}")
    return (x, r[1], r[2], r[3], r[4], r[5], r[6], r[7])


def _strided():
    return sys.modules["torch"].strided


def _float64(s: Any) -> Any:
    """A SciPy matrix in float64 (SciPy's lsmr computes in at least float64)."""
    return s if str(s.dtype) == "float64" else s.astype("float64")


def _shape_of(A: Any) -> Tuple[int, int]:
    shape = getattr(A, "shape", None)
    try:
        m, n = (int(v) for v in shape)
    except (TypeError, ValueError):
        raise invalid("A", f"must be a 2-D matrix or operator with a shape (m, n), got {type(A).__name__}") from None
    return m, n


def _vector_bytes(v: Any, name: str, want: int) -> Tuple[bytes, int]:
    """``v`` ([want] or [want, 1]) as host float64 bytes and its length."""
    shape = getattr(v, "shape", None)
    if shape is not None and len(shape) == 2 and int(shape[1]) == 1:
        v = v.reshape(-1)
    elif shape is not None and len(shape) != 1:
        raise invalid(name, f"must be 1-D ([{want}] or [{want}, 1]), got shape {tuple(shape)}")
    if _is_torch_tensor(v):
        t = v.detach().to(device="cpu", dtype=sys.modules["torch"].float64).contiguous()
        data = ctypes.string_at(t.data_ptr(), t.numel() * 8) if t.numel() else b""
    elif hasattr(v, "dtype") and hasattr(v, "tobytes"):  # NumPy
        np = sys.modules.get("numpy") or __import__("numpy")
        data = np.ascontiguousarray(v, dtype=np.float64).tobytes()
    else:
        try:
            data = array.array("d", [float(e) for e in v]).tobytes()
        except (TypeError, ValueError) as e:
            raise invalid(name, f"must be a 1-D array of numbers ({e})") from None
    return data, len(data) // 8


def _result_like(xbytes: bytes, b: Any, n: int) -> Any:
    """x (host float64 bytes) as b's kind (module docstring of lsmr)."""
    if _is_torch_tensor(b):
        torch = sys.modules["torch"]
        x = torch.frombuffer(bytearray(xbytes), dtype=torch.float64) if n else torch.zeros(0, dtype=torch.float64)
        dtype = b.dtype if b.dtype in (torch.float32, torch.float64) else torch.float64
        return x.to(device=b.device, dtype=dtype)
    try:
        import numpy as np  # noqa: PLC0415 (only for NumPy results)
    except ImportError:
        return list(array.array("d", xbytes))
    return np.frombuffer(xbytes, dtype=np.float64).copy()


class _DeviceVector:
    """A CUDA array interface over a solver vector (address, length, dtype), for torch."""

    def __init__(self, ptr: int, length: int, typestr: str):
        self.__cuda_array_interface__ = {
            "shape": (length,),
            "typestr": typestr,
            "data": (ptr, False),
            "strides": None,
            "version": 3,
            "stream": None,  # the solver's stream is the caller's current one: no sync needed
        }


def _solve_fn(A: Any, b: Any, m: int, n: int, args: tuple) -> tuple:
    """LSMR over products computed by torch: a dense CUDA tensor or a matvec/rmatvec object."""
    torch = sys.modules.get("torch")
    if torch is None:
        raise invalid("A", "a dense or matrix-free operator needs torch CUDA tensors (torch is not imported)")
    if isinstance(A, torch.Tensor):
        if A.dim() != 2 or not A.is_cuda:
            raise invalid("A", f"a dense A must be a 2-D CUDA tensor, got shape {tuple(A.shape)} on {A.device}")
        dtype = A.dtype
        device = A.device.index if A.device.index is not None else torch.cuda.current_device()
        matvec, rmatvec = (lambda x: torch.mv(A, x)), (lambda x: torch.mv(A.t(), x))
    elif callable(getattr(A, "matvec", None)) and callable(getattr(A, "rmatvec", None)):
        dtype = getattr(A, "dtype", None)
        if dtype is None or not isinstance(dtype, torch.dtype):
            dtype = b.dtype if _is_torch_tensor(b) and b.dtype in (torch.float32, torch.float64) else torch.float64
        device = b.device.index if _is_torch_tensor(b) and b.is_cuda else torch.cuda.current_device()
        matvec, rmatvec = A.matvec, A.rmatvec
    else:
        raise invalid(
            "A",
            f"{type(A).__name__} is not supported: pass a tessera.sparse.csr_matrix, a SciPy sparse matrix, a torch "
            "sparse or dense CUDA tensor, or an object with shape, matvec and rmatvec",
        )
    if dtype not in (torch.float32, torch.float64):
        raise invalid("A", f"has dtype {dtype}; LSMR runs in float32 or float64")
    typestr = "<f4" if dtype == torch.float32 else "<f8"
    dev = torch.device("cuda", device)

    def apply(transpose: bool, alpha: float, xp: int, beta: float, yp: int) -> None:
        lx, ly = (m, n) if transpose else (n, m)
        x = torch.as_tensor(_DeviceVector(xp, lx, typestr), device=dev)
        y = torch.as_tensor(_DeviceVector(yp, ly, typestr), device=dev)
        r = (rmatvec if transpose else matvec)(x)
        if not isinstance(r, torch.Tensor) or r.numel() != ly:
            what = "rmatvec" if transpose else "matvec"
            raise invalid("A", f"{what} must return a CUDA tensor of {ly} elements, got {type(r).__name__} "
                          f"{tuple(getattr(r, 'shape', ()))}")
        r = r.reshape(ly).to(device=dev, dtype=dtype)
        if beta == 0.0:
            torch.mul(r, alpha, out=y)
        else:
            y.mul_(beta).add_(r, alpha=alpha)

    name = "float32" if dtype == torch.float32 else "float64"
    with torch.cuda.device(device):
        return _tessera.lsmr_callback(device, stream_of([], device), m, n, name, apply, *args)

