"""``tessera.lsmr``: SciPy's ``scipy.sparse.linalg.lsmr`` on the GPU."""

from __future__ import annotations

import array
import ctypes
import numbers
import sys
from typing import Any, List, Optional, Tuple, Union

from . import _tessera
from ._tensors import invalid, stream_of
from .sparse import _is_scipy_sparse, _is_torch_tensor, csr_matrix

#: Right-hand sides (columns of a 2-D ``b``) one call solves together.
MAX_RHS = _tessera.LSMR_MAX_RHS

#: ``(x, istop, itn, normr, normar, norma, conda, normx)``: numbers for one right-hand side,
#: arrays of length k for a 2-D b.
_Solve = Tuple[Any, Any, Any, Any, Any, Any, Any, Any]


def lsmr(
    A: Any,
    b: Any,
    damp: Any = 0.0,
    atol: float = 1e-6,
    btol: float = 1e-6,
    conlim: float = 1e8,
    maxiter: Optional[int] = None,
    x0: Any = None,
    show: bool = False,
) -> Union[_Solve, List[_Solve]]:
    """Least squares by LSMR on the GPU: ``scipy.sparse.linalg.lsmr``'s arguments, stopping
    rules and returns, with the iteration on the device.

    Solves ``min ||[b; 0] - [A; damp I] x||_2`` (``A x = b`` when consistent, else least
    squares; the minimum-norm solution when A is rank deficient and x0 is None). Beyond SciPy,
    a 2-D ``b`` solves its columns together and a list of damps solves one ``b`` for each damp,
    each in one run that shares the products with A (below).

    Args:
        A: the ``m x n`` matrix: a :class:`tessera.sparse.csr_matrix` (used in place), a SciPy
            sparse matrix or array (copied to the device once per call; float64), a torch
            sparse CSR/COO tensor (copied once, in its dtype), a dense 2-D CUDA torch tensor
            (products by torch), or an object with ``shape``, ``matvec`` and ``rmatvec`` that
            take and return 1-D CUDA torch tensors (a ``dtype`` attribute picks float32 or
            float64; default b's if b is a torch tensor, else float64). Matrix-free operators
            run on the current stream of their device.
        b: ``[m]`` (or ``[m, 1]``): a NumPy array (or sequence) or a torch tensor. Or
            ``[m, k]`` with ``2 <= k <= MAX_RHS`` (65535), a NumPy array or torch tensor: many
            right-hand sides, each column its own LSMR solve (its own iterations, estimates and
            stop, as a separate call with that column would give, up to summation order), all
            in one run whose products with A are batched (an SpMM for sparse A, one matrix
            product for a dense torch A; a matvec/rmatvec object is called column by column).
            Every element must be finite.
        damp: a number as SciPy (default 0), or a sequence of numbers (list, tuple, 1-D NumPy
            array or torch tensor), each finite and >= 0, with a 1-D ``b``: one solve per damp,
            in one run sharing the bidiagonalisation (the products with A); the returns are
            then a list (below). A damp list with a 2-D ``b`` is an error.
        atol, btol, conlim, maxiter, show: as SciPy (defaults 1e-6, 1e-6, 1e8, ``min(m, n)``,
            False). ``show`` prints ``itn ||r|| ||A^T r|| seconds`` every 16 iterations (the
            solver's check interval) after the solve, then the final numbers (with a 2-D b:
            the most iterations and the largest norms over the columns at each check, then
            one line per column; with a damp list: the first damp of each run of 64, then one
            line per damp).
        x0: the initial guess, as SciPy (default zeros): ``[n]`` (or ``[n, 1]``) for a 1-D b;
            ``[n, k]`` (column j for column j of b) for a 2-D b.

    Returns:
        ``(x, istop, itn, normr, normar, norma, conda, normx)`` as SciPy (``istop`` 0..7 with
        SciPy's meanings). ``x`` is of b's kind: a float64 NumPy array for a NumPy b (a list
        without NumPy), a torch tensor on b's device and of b's dtype (float32/float64; float64
        otherwise) for a torch b.

        With a 2-D b (``[m, k]``, k >= 2): the same 8-tuple with ``x`` of shape ``[n, k]``
        (column j solves column j of b; of b's kind as above: float64 NumPy, or a torch tensor
        on b's device) and the seven numbers as arrays of length k, entry j for column j: for a
        NumPy b NumPy arrays (``istop``, ``itn`` int64; the others float64), for a torch b CPU
        torch tensors (``istop``, ``itn`` torch.int64; the others torch.float64). (Without
        NumPy, a 2-D b with ``tolist`` such as a memoryview gives nested lists and lists.)

        With a damp list: a list of the 8-tuples (each as for one damp), in the order of the
        list.

    Precision: the solve runs in the matrix's dtype, float32 or float64 (scalar recurrences and
    norms always in float64). A float32 matrix reaches about 1e-6 relative accuracy; ``atol``
    and ``btol`` far below that are not reachable (it then stops by another rule).

    Streams: a csr_matrix solves on the stream it was made on; ``b`` and ``x0`` are read, and
    ``x`` returned, through the host (the solver synchronises every 16 iterations anyway).

    Raises:
        InvalidArgumentError (a ValueError): shapes (a b of 3 or more dimensions, more than
            MAX_RHS columns, an x0 not of b's form), NaN/inf in b or x0 (for a 2-D b the
            message names the column and row), negative tolerances or damps, a damp list with
            a 2-D b, more right-hand sides than the device's free memory holds.
        UnsupportedError (a NotImplementedError): float16/bfloat16 matrices, other A types.
        NoGpuError (a RuntimeError): no CUDA driver, device or NVRTC.
    """
    damps = _damp_list(damp)
    scalars = (("atol", atol), ("btol", btol), ("conlim", conlim))
    for name, v in ((("damp", damp),) if damps is None else ()) + scalars:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise invalid(name, f"must be a real number, got {v!r}")
    if maxiter is not None and (isinstance(maxiter, bool) or not isinstance(maxiter, int) or maxiter < 0):
        raise invalid("maxiter", f"must be None or an int >= 0, got {maxiter!r}")
    m, n = _shape_of(A)
    d = float(damp) if damps is None else 0.0
    k = _columns(b, m)
    if k == 1:
        bb, blen = _vector_bytes(b, "b", m)
        xb = _vector_bytes(x0, "x0", n)[0] if x0 is not None else None
        _tessera.check_lsmr(m, n, blen, d, float(atol), float(btol), float(conlim), xb, damps)
    else:
        if damps is not None:
            raise invalid("damp", f"a damp list takes a 1-D b; b has shape {tuple(b.shape)} (solve each column "
                          "with the list, or each damp with the columns)")
        bb = _matrix_bytes(b, "b")
        xb = _x0_many(x0, n, k)
        _tessera.check_lsmr_many(m, n, k, bb, d, float(atol), float(btol), float(conlim), xb)
    args = (bb, d, float(atol), float(btol), float(conlim), maxiter, xb, bool(show), k, damps)

    if isinstance(A, csr_matrix) or _is_scipy_sparse(A) or (_is_torch_tensor(A) and A.layout != _strided()):
        mat = A if isinstance(A, csr_matrix) else csr_matrix(_float64(A) if _is_scipy_sparse(A) else A)
        r = mat._m.lsmr(*args)
    else:
        r = _solve_fn(A, b, m, n, args)
    if show:
        _show(r, m, n, d, k, damps)
    if damps is not None:
        step = 8 * n
        return [
            (_result_like(r[0][j * step:(j + 1) * step], b, n),) + tuple(r[i][j] for i in range(1, 8))
            for j in range(len(damps))
        ]
    if k > 1:
        return (_matrix_result_like(r[0], b, n, k),) + tuple(_numbers_like(r[i], b, i <= 2) for i in range(1, 8))
    return (_result_like(r[0], b, n),) + tuple(r[i][0] for i in range(1, 8))


def _show(r: tuple, m: int, n: int, damp: float, k: int, damps: Optional[List[float]]) -> None:
    """The progress lines and final numbers of ``show``."""
    if damps is not None:
        print(f"tessera.lsmr: {m} x {n}, {len(damps)} damps in one run; itn ||r|| ||A^T r|| time (first damp)")
    elif k > 1:
        print(f"tessera.lsmr: {m} x {n}, {k} right-hand sides, damp {damp}; itn ||r|| ||A^T r|| time "
              "(most iterations, largest norms over the columns)")
    else:
        print(f"tessera.lsmr: {m} x {n}, damp {damp}; itn ||r|| ||A^T r|| time")
    for line in r[8]:
        print(line)
    for j in range(len(r[1])):
        which = f"damp {damps[j]}: " if damps is not None else f"column {j}: " if k > 1 else ""
        print(f"tessera.lsmr: {which}istop {r[1][j]}, itn {r[2][j]}, normr {r[3][j]:.3e}, normar {r[4][j]:.3e}, "
              f"norma {r[5][j]:.3e}, conda {r[6][j]:.3e}, normx {r[7][j]:.3e}")


def _damp_list(damp: Any) -> Optional[List[float]]:
    """None for a scalar ``damp`` (checked with the other numbers), else the damps as floats."""
    if isinstance(damp, (bool, int, float, str, bytes)) or not hasattr(damp, "__iter__"):
        return None  # a number, or something the scalar check rejects with its message
    if getattr(damp, "ndim", 1) != 1:
        raise invalid("damp", f"must be a real number or a 1-D sequence of them, got shape {tuple(damp.shape)}")
    values = damp.tolist() if hasattr(damp, "tolist") else list(damp)
    for j, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise invalid("damp", f"element {j} is {v!r}; a damp list holds real numbers")
    return [float(v) for v in values]


def _columns(b: Any, m: int) -> int:
    """The right-hand sides in ``b``: 1 for ``[m]``, ``[m, 1]`` or a sequence, else k of
    ``[m, k]`` (its shape checked here, its values by the native check)."""
    shape = getattr(b, "shape", None)
    if shape is None or len(shape) == 1 or (len(shape) == 2 and int(shape[1]) == 1):
        return 1
    shape = tuple(int(s) for s in shape)
    if len(shape) != 2:
        raise invalid("b", f"must be [m], [m, 1] or [m, k] (k <= {MAX_RHS} right-hand sides), got shape {shape}")
    if shape[0] != m:
        raise invalid("b", f"has shape {shape}; A has m = {m} rows so b must be [{m}] or [{m}, k]")
    if shape[1] == 0:
        raise invalid("b", f"has shape {shape}: no right-hand side; give [{m}] or [{m}, k] with k >= 1")
    if shape[1] > MAX_RHS:
        raise invalid("b", f"has {shape[1]} columns; at most {MAX_RHS} right-hand sides per call "
                      "(solve them in chunks)")
    return shape[1]


def _matrix_bytes(v: Any, name: str) -> bytes:
    """A 2-D array (torch tensor, NumPy array, or without NumPy anything with ``tolist``,
    such as a 2-D memoryview) as host float64 bytes, column-major."""
    if _is_torch_tensor(v):
        t = v.detach().to(device="cpu", dtype=sys.modules["torch"].float64).t().contiguous()
        return ctypes.string_at(t.data_ptr(), t.numel() * 8) if t.numel() else b""
    np = _numpy()
    try:
        if np is not None:
            return np.asarray(v, dtype=np.float64).tobytes(order="F")
        rows = v.tolist() if hasattr(v, "tolist") else [list(r) for r in v]
        k = len(rows[0]) if rows else 0
        return array.array("d", [float(r[j]) for j in range(k) for r in rows]).tobytes()
    except (TypeError, ValueError, IndexError) as e:
        raise invalid(name, f"must be a 2-D array of numbers ({e})") from None


def _numpy() -> Any:
    """NumPy, or None when it is not importable."""
    try:
        import numpy  # noqa: PLC0415 (optional)
    except ImportError:
        return None
    return numpy


def _x0_many(x0: Any, n: int, k: int) -> Optional[bytes]:
    """``x0`` for a 2-D b of k columns: ``[n, k]``, as host float64 bytes, column-major."""
    if x0 is None:
        return None
    shape = getattr(x0, "shape", None)
    shape = tuple(int(s) for s in shape) if shape is not None else None
    if shape != (n, k):
        got = f"shape {shape}" if shape is not None else type(x0).__name__
        raise invalid("x0", f"with a 2-D b of {k} columns x0 must be [n, k] = [{n}, {k}] (one initial guess per "
                      f"column, a NumPy array or torch tensor), got {got}")
    return _matrix_bytes(x0, "x0")


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
        v = v.reshape(-1) if hasattr(v, "reshape") else [row[0] for row in v.tolist()]
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


def _matrix_result_like(xbytes: bytes, b: Any, n: int, k: int) -> Any:
    """X (host float64 bytes, ``n x k`` column-major) as ``[n, k]`` of b's kind: a torch
    tensor as b (dtype, device), else a NumPy array (nested lists without NumPy)."""
    if _is_torch_tensor(b):
        torch = sys.modules["torch"]
        dtype = b.dtype if b.dtype in (torch.float32, torch.float64) else torch.float64
        if n == 0:
            return torch.zeros((0, k), dtype=dtype, device=b.device)
        x = torch.frombuffer(bytearray(xbytes), dtype=torch.float64).view(k, n)
        return x.to(device=b.device, dtype=dtype).t().contiguous()
    np = _numpy()
    if np is None:
        x = array.array("d", xbytes)
        return [[x[j * n + i] for j in range(k)] for i in range(n)]
    return np.frombuffer(xbytes, dtype=np.float64).reshape(k, n).T.copy()


def _numbers_like(values: List[Any], b: Any, integer: bool) -> Any:
    """One number per column for a 2-D b: CPU torch int64/float64 tensors for a torch b,
    else NumPy int64/float64 arrays (lists without NumPy)."""
    if _is_torch_tensor(b):
        torch = sys.modules["torch"]
        return torch.tensor(values, dtype=torch.int64 if integer else torch.float64)
    np = _numpy()
    if np is None:
        return list(values)
    return np.array(values, dtype=np.int64 if integer else np.float64)


class _DeviceBlock:
    """A CUDA array interface over a solver block of ``k`` packed vectors (address, ``(k,
    length)`` row-major, that is ``length x k`` column-major; dtype), for torch."""

    def __init__(self, ptr: int, k: int, length: int, typestr: str):
        self.__cuda_array_interface__ = {
            "shape": (k, length),
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

        def many(transpose: bool, xs: Any, ly: int) -> Any:
            # rows of xs are the columns of X: (A X)^T = X^T A^T, (A^T X)^T = X^T A
            return torch.mm(xs, A if transpose else A.t())
    elif callable(getattr(A, "matvec", None)) and callable(getattr(A, "rmatvec", None)):
        dtype = getattr(A, "dtype", None)
        if dtype is None or not isinstance(dtype, torch.dtype):
            dtype = b.dtype if _is_torch_tensor(b) and b.dtype in (torch.float32, torch.float64) else torch.float64
        device = b.device.index if _is_torch_tensor(b) and b.is_cuda else torch.cuda.current_device()
        matvec, rmatvec = A.matvec, A.rmatvec

        def many(transpose: bool, xs: Any, ly: int) -> Any:
            return torch.stack([one(transpose, x, ly) for x in xs])
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

    def one(transpose: bool, x: Any, ly: int) -> Any:
        r = (rmatvec if transpose else matvec)(x)
        if not isinstance(r, torch.Tensor) or r.numel() != ly:
            what = "rmatvec" if transpose else "matvec"
            raise invalid("A", f"{what} must return a CUDA tensor of {ly} elements, got {type(r).__name__} "
                          f"{tuple(getattr(r, 'shape', ()))}")
        return r.reshape(ly).to(device=dev, dtype=dtype)

    def apply(transpose: bool, alpha: float, xp: int, k: int, beta: float, yp: int) -> None:
        lx, ly = (m, n) if transpose else (n, m)
        x = torch.as_tensor(_DeviceBlock(xp, k, lx, typestr), device=dev)
        y = torch.as_tensor(_DeviceBlock(yp, k, ly, typestr), device=dev)
        r = one(transpose, x[0], ly).unsqueeze(0) if k == 1 else many(transpose, x, ly).to(device=dev, dtype=dtype)
        if beta == 0.0:
            torch.mul(r, alpha, out=y)
        else:
            y.mul_(beta).add_(r, alpha=alpha)

    name = "float32" if dtype == torch.float32 else "float64"
    with torch.cuda.device(device):
        return _tessera.lsmr_callback(device, stream_of([], device), m, n, name, apply, *args)
