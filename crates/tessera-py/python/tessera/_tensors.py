"""Tensor arguments: torch tensors, ``__cuda_array_interface__`` objects and DLPack producers
turned into the plain descriptors the extension takes, the caller's stream, and outputs.

torch is imported only when a caller hands over a torch tensor or tessera has to allocate an
output, so ``import tessera`` works without torch (and without a GPU).
"""

from __future__ import annotations

import os
import sys
from typing import Any, NamedTuple, Optional, Sequence, Tuple

from . import _tessera
from ._tessera import InvalidArgumentError, NoGpuError, UnsupportedError

# CUDA array interface type strings tessera understands (little-endian).
_TYPESTR = {"<f4": "float32", "<f2": "float16", "<i4": "int32", "<f8": "float64", "|i1": "int8", "<i1": "int8"}


def invalid(arg: str, rule: str) -> InvalidArgumentError:
    """An ``InvalidArgumentError`` worded as tessera's Rust errors are."""
    return InvalidArgumentError(f"invalid argument `{arg}`: {rule}")


def unsupported(what: str) -> UnsupportedError:
    """An ``UnsupportedError`` worded as tessera's Rust errors are."""
    return UnsupportedError(f"unsupported: {what}")


class Arg(NamedTuple):
    """One tensor argument."""

    obj: Any
    """The torch tensor or the ``__cuda_array_interface__`` object itself (kept alive)."""
    ptr: int
    dtype: str
    shape: Tuple[int, ...]
    strides: Tuple[int, ...]
    """In elements."""
    device: Optional[int]
    """CUDA device ordinal; ``None`` for interface objects until resolved."""
    is_torch: bool
    stream: Optional[int]
    """The producer's stream from ``__cuda_array_interface__`` (v3), if it gave one."""

    def desc(self) -> Tuple[int, str, Tuple[int, ...], Tuple[int, ...]]:
        """``(ptr, dtype, shape, strides)`` as the extension takes it."""
        return (self.ptr, self.dtype, self.shape, self.strides)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def _torch():
    """torch if it is already imported (a torch tensor cannot exist otherwise)."""
    return sys.modules.get("torch")


def require_torch(why: str):
    """Imports torch or raises a clear error saying what needed it."""
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415 (lazily)
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise unsupported(f"{why} needs PyTorch, which is not importable ({e})") from None
    return torch


def _gpu_reason() -> Optional[str]:
    """Why no GPU is usable here, or None when device 0 works."""
    try:
        _tessera.device_info(0)
    except NoGpuError as e:
        return str(e)
    return None


def as_arg(x: Any, name: str) -> Arg:
    """Describes ``x`` (a CUDA torch tensor, an object with ``__cuda_array_interface__``, or a
    DLPack producer, converted through torch without a copy)."""
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        if not x.is_cuda:
            reason = _gpu_reason()
            if reason is not None:
                raise NoGpuError(f"`{name}` is a tensor on {x.device} and no GPU is usable: {reason}")
            raise invalid(name, f"tessera runs on CUDA tensors; {name} is on {x.device} (move it with .cuda())")
        return Arg(
            x,
            x.data_ptr(),
            str(x.dtype).replace("torch.", ""),
            tuple(x.shape),
            tuple(x.stride()),
            x.device.index if x.device.index is not None else torch.cuda.current_device(),
            True,
            None,
        )
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        return _from_cai(x, cai, name)
    if hasattr(x, "__dlpack__"):
        torch = require_torch(f"`{name}` (a DLPack object)")
        return as_arg(torch.from_dlpack(x), name)
    raise TypeError(
        f"`{name}` must be a CUDA torch.Tensor, an object with __cuda_array_interface__ or a DLPack "
        f"producer; got {type(x).__name__}"
    )


def _from_cai(x: Any, cai: dict, name: str) -> Arg:
    if cai.get("mask") is not None:
        raise unsupported(f"`{name}` has a __cuda_array_interface__ mask; masked arrays are not supported")
    typestr = cai["typestr"]
    dtype = _TYPESTR.get(typestr, typestr)
    itemsize = int(typestr[2:]) if typestr[2:].isdigit() else 1
    shape = tuple(int(n) for n in cai["shape"])
    byte_strides = cai.get("strides")
    if byte_strides is None:
        strides = contiguous_strides(shape)
    else:
        if any(s % itemsize for s in byte_strides):
            raise invalid(name, f"byte strides {tuple(byte_strides)} are not multiples of the {itemsize}-byte element")
        strides = tuple(int(s) // itemsize for s in byte_strides)
    ptr, _readonly = cai["data"]
    stream = cai.get("stream") if cai.get("version", 0) >= 3 else None
    return Arg(x, int(ptr or 0), dtype, shape, strides, None, False, stream)


def contiguous_strides(shape: Sequence[int]) -> Tuple[int, ...]:
    """Row-major strides (elements) of ``shape``."""
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * max(shape[i + 1], 1)
    return tuple(strides)


def check_writable(a: Arg, name: str) -> None:
    """Outputs handed in through ``__cuda_array_interface__`` must not be read-only."""
    if not a.is_torch and a.obj.__cuda_array_interface__["data"][1]:
        raise invalid(name, "is read-only (its __cuda_array_interface__ says so)")


def device_of(args: Sequence[Arg]) -> int:
    """The one CUDA device of all ``args`` (asking the driver about interface objects, which
    raises ``NoGpuError`` without a GPU)."""
    devices = []
    for a in args:
        if a.device is not None:
            devices.append(a.device)
        elif a.ptr != 0:
            devices.append(_tessera.pointer_device(a.ptr))
    if not devices:
        torch = _torch()
        devices.append(torch.cuda.current_device() if torch is not None else 0)
    if any(d != devices[0] for d in devices):
        raise invalid("tensors", f"all tensors must be on one CUDA device, got devices {sorted(set(devices))}")
    return devices[0]


def stream_of(args: Sequence[Arg], device: int) -> int:
    """The stream to launch on: torch's current stream of ``device`` when any argument is a torch
    tensor; else the stream an interface object named (CUDA array interface v3); else torch's
    current stream if torch is loaded; else the default stream (0)."""
    torch = _torch()
    if torch is None or not any(a.is_torch for a in args):
        for a in args:
            if a.stream is not None:
                return int(a.stream)
        if torch is None:
            return 0
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return int(raw(device)) if raw is not None else int(torch.cuda.current_stream(device).cuda_stream)


def empty(shape: Sequence[int], dtype: str, device: int):
    """A new torch tensor on ``device`` (outputs are allocated by torch's caching allocator on
    the current stream, as any torch op's)."""
    torch = require_torch("allocating an output (pass out= to avoid it)")
    return torch.empty(tuple(shape), dtype=getattr(torch, dtype), device=torch.device("cuda", device))


def find_nvrtc() -> None:
    """Points tessera at the ``libnvrtc.so.13`` of this interpreter's site-packages (the
    ``nvidia-cuda-nvrtc`` wheel torch installs) unless ``TESSERA_NVRTC`` is already set, so the
    library need not ask a ``python3`` on PATH where its packages are."""
    if os.environ.get("TESSERA_NVRTC"):
        return
    for base in sys.path:
        for sub in ("nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib"):
            path = os.path.join(base or ".", sub, "libnvrtc.so.13")
            if os.path.isfile(path):
                os.environ["TESSERA_NVRTC"] = os.path.abspath(path)
                os.environ.setdefault("TESSERA_NO_PYTHON_PROBE", "1")
                return
