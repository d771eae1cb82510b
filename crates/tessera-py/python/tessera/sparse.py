"""``tessera.sparse``: CSR matrices on the GPU with SpMV and SpMM for torch tensors.

::

    import scipy.sparse, torch, tessera.sparse

    A = tessera.sparse.csr_matrix(scipy.sparse.random(10_000, 5_000, density=1e-3, format="csr"))
    x = torch.randn(5_000, device="cuda", dtype=torch.float64)
    y = A @ x          # SpMV, a torch tensor on the current stream
    z = A.T @ y        # A^T y through the CSR of A^T (made on the device on first use, kept)
    Y = A @ torch.randn(5_000, 16, device="cuda", dtype=torch.float64)   # SpMM
"""

from __future__ import annotations

import array
import ctypes
import sys
from typing import Any, Optional, Tuple

from . import _tessera
from ._tensors import (
    as_arg,
    device_of,
    empty,
    invalid,
    stream_of,
    unsupported,
)

#: Value dtypes a matrix may hold.
VALUE_DTYPES = ("float32", "float64", "float16", "bfloat16")

_I32_MAX = 2**31 - 1


def _torch():
    return sys.modules.get("torch")


def _is_torch_tensor(x: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def _is_scipy_sparse(x: Any) -> bool:
    return type(x).__module__.startswith("scipy.sparse") and hasattr(x, "tocsr")


def _host_bytes(x: Any, name: str, kind: str) -> Tuple[bytes, str]:
    """A host array as native-order bytes and its dtype name: ``kind`` ``"index"`` gives
    int64, ``"value"`` keeps float32/float64/float16/bfloat16 and turns anything else into
    float64. Takes NumPy arrays, CPU torch tensors, ``array.array`` and sequences."""
    if _is_torch_tensor(x):
        torch = _torch()
        if x.is_cuda:
            x = x.cpu()
        name_ = str(x.dtype).replace("torch.", "")
        if kind == "index":
            x, name_ = x.to(torch.int64), "int64"
        elif name_ not in VALUE_DTYPES:
            x, name_ = x.to(torch.float64), "float64"
        x = x.contiguous()
        return ctypes.string_at(x.data_ptr(), x.numel() * x.element_size()), name_
    if hasattr(x, "dtype") and hasattr(x, "tobytes"):  # NumPy
        np = sys.modules.get("numpy") or __import__("numpy")
        if kind == "index":
            return np.ascontiguousarray(x, dtype=np.int64).tobytes(), "int64"
        name_ = str(x.dtype)
        if name_ not in ("float32", "float64", "float16"):
            name_ = "float64"
        return np.ascontiguousarray(x, dtype=name_).tobytes(), name_
    if isinstance(x, array.array) and kind == "value" and x.typecode in ("f", "d"):
        return x.tobytes(), "float32" if x.typecode == "f" else "float64"
    try:
        if kind == "index":
            return array.array("q", [int(v) for v in x]).tobytes(), "int64"
        return array.array("d", [float(v) for v in x]).tobytes(), "float64"
    except (TypeError, ValueError, OverflowError) as e:
        raise invalid(name, f"must be a 1-D array of {'ints' if kind == 'index' else 'numbers'} ({e})") from None


def _default_device() -> int:
    torch = _torch()
    return torch.cuda.current_device() if torch is not None else 0


class csr_matrix:
    """A sparse matrix in CSR form on one CUDA device, for products with torch tensors.

    ``csr_matrix(S)`` takes:

    - a SciPy sparse matrix or array (any format; converted with ``.tocsr()``): its arrays are
      copied to the device once;
    - a torch sparse tensor (``torch.sparse_csr`` or ``torch.sparse_coo``, 2-D, no dense
      dimensions): a CUDA tensor is copied once on the device (as COO triplets) and converted
      to CSR there; a CPU one is copied once from the host. Not zero-copy: tessera's
      ``CsrMatrix`` owns its arrays;
    - ``(data, indices, indptr)`` host arrays with ``shape=(rows, cols)``, as SciPy's
      constructor.

    Columns are sorted within each row and duplicate entries summed (SciPy's canonical form;
    explicit zeros are kept). Values are float32, float64, float16 or bfloat16 (integer SciPy
    matrices become float64); indices are int32 on the device when every dimension and the
    nonzero count fit, else int64. ``device`` picks the CUDA device for host input (default:
    torch's current device).

    ``A @ x`` (``x`` a CUDA tensor of the matrix's dtype: ``[cols]`` gives the SpMV ``[rows]``,
    ``[cols, k]`` the SpMM ``[rows, k]``) returns a new torch tensor, queued on the current
    CUDA stream of x's device; ``A.T @ x`` multiplies by the transpose through the CSR of
    ``A^T``, built on the device on first use and kept with the matrix (twice the memory from
    then on; deterministic). SpMV and SpMM are deterministic: the same inputs give bitwise the
    same result.

    Streams: the matrix (and its cached plans) queue on the CUDA stream that was current when
    it was made; a product on another stream is ordered with CUDA events (no host
    synchronisation). The device memory lives as long as this object.
    """

    def __init__(self, arg: Any, shape: Optional[Tuple[int, int]] = None, *, device: Optional[int] = None):
        if isinstance(arg, csr_matrix):
            self._m = arg._m
            return
        if _is_torch_tensor(arg):
            self._m = _from_torch(arg)
            return
        if _is_scipy_sparse(arg):
            s = arg.tocsr()
            if shape is not None and tuple(shape) != tuple(s.shape):
                raise invalid("shape", f"{tuple(shape)} differs from the matrix's {tuple(s.shape)}")
            data, indices, indptr, shape = s.data, s.indices, s.indptr, s.shape
        elif isinstance(arg, tuple) and len(arg) == 3:
            if shape is None:
                raise invalid("shape", "is needed with (data, indices, indptr)")
            data, indices, indptr = arg
        else:
            raise TypeError(
                "csr_matrix takes a SciPy sparse matrix, a torch sparse tensor or (data, indices, indptr) "
                f"with shape=; got {type(arg).__name__}"
            )
        rows, cols = _shape(shape)
        db, dtype = _host_bytes(data, "data", "value")
        ib, _ = _host_bytes(indices, "indices", "index")
        pb, _ = _host_bytes(indptr, "indptr", "index")
        _tessera.check_csr(rows, cols, dtype, pb, ib, db)
        dev = _default_device() if device is None else int(device)
        self._m = _tessera.SparseMatrix.from_csr(dev, stream_of([], dev), rows, cols, dtype, pb, ib, db)

    @property
    def shape(self) -> Tuple[int, int]:
        """``(rows, cols)``."""
        return tuple(self._m.shape)

    @property
    def nnz(self) -> int:
        """Stored entries (after duplicates were summed; explicit zeros count)."""
        return self._m.nnz

    @property
    def dtype(self) -> Any:
        """The value dtype: a ``torch.dtype`` (its name when torch is not importable)."""
        torch = _torch()
        return getattr(torch, self._m.dtype) if torch is not None else self._m.dtype

    @property
    def index_dtype(self) -> str:
        """``"int32"`` or ``"int64"``: the indices' type on the device."""
        return self._m.index_dtype

    @property
    def device(self) -> int:
        """The CUDA device ordinal."""
        return self._m.device

    @property
    def T(self) -> "_Transposed":
        """The transpose, for ``A.T @ x`` (no copy until the first product)."""
        return _Transposed(self)

    def __matmul__(self, x: Any) -> Any:
        return _product(self, x, transpose=False)

    def __repr__(self) -> str:
        r, c = self.shape
        return (
            f"<tessera.sparse.csr_matrix {r}x{c}, {self.nnz} stored, {self._m.dtype} values, "
            f"{self.index_dtype} indices, cuda:{self.device}>"
        )


class _Transposed:
    """``A.T``: a view of a :class:`csr_matrix` for ``A.T @ x``."""

    def __init__(self, a: csr_matrix):
        self._a = a

    @property
    def shape(self) -> Tuple[int, int]:
        r, c = self._a.shape
        return (c, r)

    @property
    def T(self) -> csr_matrix:
        return self._a

    def __matmul__(self, x: Any) -> Any:
        return _product(self._a, x, transpose=True)

    def __repr__(self) -> str:
        return f"<transpose of {self._a!r}>"


def _shape(shape: Any) -> Tuple[int, int]:
    try:
        rows, cols = (int(v) for v in shape)
    except (TypeError, ValueError):
        raise invalid("shape", f"must be (rows, cols), got {shape!r}") from None
    if rows < 0 or cols < 0:
        raise invalid("shape", f"must be non-negative, got {(rows, cols)}")
    return rows, cols


def _from_torch(t: Any) -> Any:
    torch = _torch()
    if t.layout not in (torch.sparse_csr, torch.sparse_coo):
        if t.layout == torch.strided:
            raise unsupported(
                "a dense torch tensor as a csr_matrix; convert it with .to_sparse_csr() first"
            )
        raise unsupported(f"torch layout {t.layout}; csr_matrix takes sparse_csr and sparse_coo tensors")
    if t.dim() != 2 or t.dense_dim() != 0:
        raise invalid("arg", f"must be a 2-D sparse tensor without dense dimensions, got shape {tuple(t.shape)}")
    rows, cols = (int(v) for v in t.shape)
    if not t.is_cuda:
        c = t.to_sparse_csr() if t.layout == torch.sparse_coo else t
        return csr_matrix((c.values(), c.col_indices(), c.crow_indices()), shape=(rows, cols))._m
    coo = t.to_sparse_coo() if t.layout == torch.sparse_csr else t
    coo = coo.coalesce()
    idx, values = coo.indices(), coo.values().contiguous()
    if str(values.dtype).replace("torch.", "") not in VALUE_DTYPES:
        raise unsupported(f"values of {values.dtype}; csr_matrix holds {', '.join(VALUE_DTYPES)}")
    if max(rows, cols, values.numel()) <= _I32_MAX:
        idx = idx.to(torch.int32)
    row, col = idx[0].contiguous(), idx[1].contiguous()
    dev = t.device.index if t.device.index is not None else torch.cuda.current_device()
    args = [as_arg(row, "row"), as_arg(col, "col"), as_arg(values, "values")]
    return _tessera.SparseMatrix.from_coo_device(
        dev, stream_of(args, dev), rows, cols, args[0].desc(), args[1].desc(), args[2].desc()
    )


def _packed(shape, strides) -> Optional[str]:
    """``"row"`` / ``"col"`` when a 2-D operand is packed in that order, else None."""
    r, k = shape
    if (k <= 1 or strides[1] == 1) and (r <= 1 or k == 0 or strides[0] == k):
        return "row"
    if (r <= 1 or strides[0] == 1) and (k <= 1 or strides[1] == r):
        return "col"
    return None


def _product(a: csr_matrix, x: Any, transpose: bool) -> Any:
    xa = as_arg(x, "x")
    rows, cols = a.shape
    if transpose:
        rows, cols = cols, rows
    layout = "row"
    if len(xa.shape) == 2:
        layout = _packed(xa.shape, xa.strides)
        if layout is None:
            if not xa.is_torch:
                raise invalid("x", f"strides {list(xa.strides)}: a dense operand must be packed row- or column-major")
            xa, layout = as_arg(xa.obj.contiguous(), "x"), "row"
    elif len(xa.shape) == 1 and xa.shape[0] > 1 and xa.strides[0] != 1 and xa.is_torch:
        xa = as_arg(xa.obj.contiguous(), "x")
    dtype = a._m.dtype
    if len(xa.shape) == 1:
        oshape, ostrides = (rows,), (1,)
    elif len(xa.shape) == 2:
        k = xa.shape[1]
        oshape = (rows, k)
        ostrides = (k, 1) if layout == "row" else (1, rows)
    else:
        oshape, ostrides = (rows,), (1,)  # check_sparse_product names x's rank
    _tessera.check_sparse_product(*a.shape, dtype, xa.desc(), (0, dtype, oshape, ostrides), transpose)
    device = device_of([xa])
    if device != a.device:
        raise invalid("x", f"is on cuda:{device}, the matrix on cuda:{a.device}")
    if layout == "row":
        out = empty(oshape, dtype, device)
    else:
        out = empty((oshape[1], oshape[0]), dtype, device).t()
    oa = as_arg(out, "out")
    if oa.numel == 0:
        return out
    a._m.matmul(stream_of([xa], device), xa.desc(), oa.desc(), transpose)
    return out


__all__ = ["csr_matrix"]
