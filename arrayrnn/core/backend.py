"""The backend: which array module (NumPy or CuPy) a call's arrays live in, and on which device.

:func:`get_xp` answers for a group of arrays (and refuses mixed devices or dtypes), :func:`as_array` views
any array-like (DLPack, ``__cuda_array_interface__``, ``__array_interface__``) as NumPy or CuPy, and the
device helpers (:func:`device_of`, :func:`device_id`, :func:`on_device`, :func:`to_host`,
:func:`module_for`) live here and nowhere else. The library asks :func:`cupy_module` whether CuPy is
installed; math code is written against the module :func:`get_xp` returns.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from types import ModuleType
from typing import Any

import numpy as np


@functools.lru_cache(maxsize=1)
def cupy_module() -> ModuleType | None:
    """The ``cupy`` module if it is installed and imports, else ``None``."""
    try:
        import cupy
    except Exception:  # ImportError, or a CUDA library failing to load
        return None
    return cupy


def is_cupy_array(a: Any) -> bool:
    cp = cupy_module()
    return cp is not None and isinstance(a, cp.ndarray)


def is_writeable(a: Any) -> bool:
    """Whether ``a``'s memory may be written in place. CuPy's ``flags`` has no ``writeable``: device memory
    always is."""
    return bool(getattr(getattr(a, "flags", None), "writeable", True))


def device_of(a: Any) -> str:
    """``"cpu"`` or ``"cuda:N"``."""
    if is_cupy_array(a):
        return f"cuda:{a.device.id}"
    return "cpu"


def device_id(a: Any) -> int | None:
    """The CUDA device index of a CuPy array, ``None`` for a host array."""
    return int(a.device.id) if is_cupy_array(a) else None


def on_device(xp: ModuleType, index: int | None) -> contextlib.AbstractContextManager:
    """A context that makes CUDA device ``index`` current (``xp`` is CuPy), or nothing (``None``)."""
    return xp.cuda.Device(index) if index is not None else contextlib.nullcontext()


def _describe(name: str, a: Any) -> str:
    return f"{name} ({type(a).__module__}.{type(a).__name__}, dtype {a.dtype}, on {device_of(a)})"


def get_xp(*arrays: Any, names: tuple[str, ...] | None = None) -> ModuleType:
    """The array module shared by ``arrays`` (``None`` entries are skipped).

    Raises ``TypeError`` naming the arrays when they live on different devices, or when floating
    arrays among them have different dtypes (never a silent cast). ``names`` labels the arrays in
    the message; by default they are called ``arrays[i]``.
    """
    if _all_host(arrays, names):  # NumPy arrays only (every small call's case): no device to compare
        return np
    present = [a for a in arrays if a is not None]
    first = present[0]
    place = _place(first)
    dtype = next((a.dtype for a in present if a.dtype.kind == "f"), None)
    for a in present:
        if _place(a) != place or (dtype is not None and a.dtype.kind == "f" and a.dtype != dtype):
            _refuse_mix(arrays, names)
    return np if place is None else cupy_module()


def _all_host(arrays: tuple, names: tuple[str, ...] | None) -> bool:
    """Whether every array given is a NumPy array; ``TypeError`` (:func:`_refuse_mix`) for NumPy arrays
    of different floating dtypes."""
    dtype = None
    for a in arrays:
        if a is None:
            continue
        if type(a) is not np.ndarray:
            return False
        if a.dtype.kind == "f":
            if dtype is None:
                dtype = a.dtype
            elif a.dtype != dtype:
                _refuse_mix(arrays, names)
    return True


def _place(a: Any) -> int | None:
    """``None`` for a host array, the CUDA device index of a CuPy array."""
    return a.device.id if is_cupy_array(a) else None


def _refuse_mix(arrays: tuple, names: tuple[str, ...] | None) -> None:
    """Raise the ``TypeError`` of :func:`get_xp` for arrays on different devices or of different dtypes."""
    labels = names or tuple(f"arrays[{i}]" for i in range(len(arrays)))
    present = [(label, a) for label, a in zip(labels, arrays, strict=True) if a is not None]
    first_label, first = present[0]
    first_float = next(((lbl, a) for lbl, a in present if _is_floating(a)), None)
    for label, a in present[1:]:
        if device_of(a) != device_of(first):
            raise TypeError(f"{_describe(first_label, first)} and {_describe(label, a)} are on different "
                            "devices; move them to one device first (e.g. params.to(cupy))")
        if first_float is not None and _is_floating(a) and a.dtype != first_float[1].dtype:
            raise TypeError(f"{_describe(*first_float)} and {_describe(label, a)} have different dtypes; "
                            "convert them explicitly (e.g. x.astype(params.data.dtype))")
    raise AssertionError("get_xp found a mix that _refuse_mix could not name")  # pragma: no cover


def _is_floating(a: Any) -> bool:
    return np.dtype(a.dtype).kind == "f"


def as_array(obj: Any, name: str = "array") -> Any:
    """A NumPy or CuPy view of ``obj`` without copying where the protocol allows.

    Accepts NumPy and CuPy arrays as they are, objects with ``__cuda_array_interface__`` (as CuPy
    arrays), objects with ``__dlpack__`` (PyTorch, JAX, ...; CPU ones as NumPy, CUDA ones as CuPy),
    and objects with ``__array_interface__`` or ``__array__``. Anything else is a ``TypeError``.
    """
    if isinstance(obj, np.ndarray) or is_cupy_array(obj):
        return obj
    if hasattr(obj, "__cuda_array_interface__"):
        return _require_cupy(name).asarray(obj)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        if getattr(obj, "requires_grad", False):  # torch refuses to export it through DLPack
            raise TypeError(f"{name} is a torch tensor that requires grad; pass {name}.detach() (arrayrnn "
                            "computes its own gradients; use arrayrnn.torch.ArrayRNN for torch autograd)")
        return _from_dlpack(obj, name)
    if hasattr(obj, "__array_interface__") or hasattr(obj, "__array__"):
        return np.asarray(obj)
    raise TypeError(f"{name} has type {type(obj).__name__}; expected an array (NumPy, CuPy, or any object "
                    "with __dlpack__, __cuda_array_interface__ or __array_interface__)")


def _from_dlpack(obj: Any, name: str) -> Any:
    """A DLPack exporter as NumPy (host memory) or CuPy (device memory); what DLPack cannot carry
    (bfloat16, complex with the conjugate bit, the meta device) is a ``TypeError`` naming ``name``."""
    try:
        device_type = int(obj.__dlpack_device__()[0])
        if device_type in (1, 3):  # kDLCPU, kDLCUDAHost
            return np.from_dlpack(obj)
    except (RuntimeError, ValueError, BufferError, TypeError) as e:
        dtype, device = getattr(obj, "dtype", "?"), getattr(obj, "device", "?")
        raise TypeError(f"{name} ({type(obj).__name__} of dtype {dtype} on device {device}) cannot be shared "
                        f"through DLPack: {e}; pass a float16/float32/float64 array with values (convert "
                        f"first, e.g. {name}.float() or {name}.astype('float32'))") from None
    return _require_cupy(name).from_dlpack(obj)


def _require_cupy(name: str) -> ModuleType:
    cp = cupy_module()
    if cp is None:
        raise TypeError(f"{name} lives on a GPU but CuPy is not installed; install the 'gpu' extra "
                        "(pip install 'arrayrnn[gpu]') or move it to host memory first")
    return cp


def same_memory(a: Any, b: Any) -> bool:
    """Whether arrays ``a`` and ``b`` are the same region of memory (same address, shape and dtype)."""
    return a is b or (a.shape == b.shape and a.dtype == b.dtype and _address(a) == _address(b))


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether host arrays ``a`` and ``b`` have the same dtype, shape and bytes (NaN payloads and the
    sign of zero included): ``memcmp`` where both are C-contiguous (no temporary, one pass that stops at
    the first difference), else an elementwise comparison of the bits."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if _memcmp is not None and a.flags.c_contiguous and b.flags.c_contiguous:
        return _memcmp(a.ctypes.data, b.ctypes.data, a.nbytes) == 0
    bits = np.dtype(f"u{a.dtype.itemsize}") if a.dtype.kind in "fc" and a.dtype.itemsize <= 8 else a.dtype
    return bool(np.array_equal(a.view(bits), b.view(bits)))


def _libc_memcmp() -> Any:
    try:
        memcmp = ctypes.CDLL(None).memcmp  # the C library the process has loaded (Linux, macOS)
    except (OSError, TypeError, AttributeError):  # none to look in (Windows): the NumPy comparison serves
        return None
    memcmp.argtypes, memcmp.restype = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t), ctypes.c_int
    return memcmp


_memcmp = _libc_memcmp()


def _address(a: Any) -> int:
    interface = getattr(a, "__cuda_array_interface__", None) or a.__array_interface__
    return int(interface["data"][0])


def to_host(a: Any) -> np.ndarray:
    """A NumPy array with the contents of ``a`` (a copy only when ``a`` is on a GPU)."""
    return a.get() if is_cupy_array(a) else np.asarray(a)


def module_for(target: Any) -> ModuleType:
    """The array module named by ``target``: a module (numpy / cupy) or a device string."""
    if isinstance(target, ModuleType) and target.__name__ in ("numpy", "cupy"):
        return target
    if isinstance(target, str):
        if target == "cpu" or target == "numpy":
            return np
        if target.startswith("cuda") or target == "cupy":
            return _require_cupy(f"device {target!r}")
    raise ValueError(f"target = {target!r}; expected numpy, cupy, 'cpu', 'cuda' or 'cuda:N'")
