"""The little of the CUDA driver API a `Handle` needs: device count, device selection, a diagnosis.

Uses ``libcuda`` through ctypes (present wherever a GPU is), so no CUDA Python package is required.
Selecting a device makes its primary context current, which is what ``cudaSetDevice`` does.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from ctypes import byref, c_int, c_uint, c_void_p

__all__ = ["driver", "device_count", "current_device", "select_device", "diagnose", "stream_address"]

_DRIVER_NAMES = ("nvcuda.dll",) if sys.platform == "win32" else ("libcuda.so.1", "libcuda.so")
_lock = threading.Lock()
_state: dict[str, object] = {"loaded": False, "driver": None, "why": "", "init": None}
_primary: dict[int, int] = {}  # device ordinal -> retained primary context (kept for the process lifetime)


def _load() -> ctypes.CDLL | None:
    why = []
    for name in _DRIVER_NAMES:
        try:
            drv = ctypes.CDLL(name)
        except OSError as exc:
            why.append(str(exc))
            continue
        protos = {"cuInit": [c_uint], "cuDeviceGetCount": [c_void_p], "cuDeviceGet": [c_void_p, c_int],
                  "cuDevicePrimaryCtxRetain": [c_void_p, c_int], "cuCtxSetCurrent": [c_void_p],
                  "cuCtxGetCurrent": [c_void_p], "cuCtxGetDevice": [c_void_p]}
        for fn, args in protos.items():
            getattr(drv, fn).argtypes, getattr(drv, fn).restype = args, c_int
        return drv
    _state["why"] = "; ".join(why)
    return None


def driver() -> ctypes.CDLL | None:
    """The CUDA driver library, initialised with ``cuInit(0)``; ``None`` when absent or unusable."""
    with _lock:
        if not _state["loaded"]:
            _state["driver"], _state["loaded"] = _load(), True
            drv = _state["driver"]
            if drv is not None:
                _state["init"] = drv.cuInit(0)
    if _state["driver"] is None or _state["init"] != 0:
        return None
    return _state["driver"]  # type: ignore[return-value]


def device_count() -> int:
    """Number of CUDA devices visible to the driver (0 when there is no driver or no device)."""
    drv, n = driver(), c_int(0)
    if drv is None or drv.cuDeviceGetCount(byref(n)) != 0:
        return 0
    return n.value


def current_device() -> int | None:
    """Ordinal of the device of the current context, or ``None`` when no context is current."""
    drv, ctx, dev = driver(), c_void_p(), c_int()
    if drv is None or drv.cuCtxGetCurrent(byref(ctx)) != 0 or not ctx.value:
        return None
    return dev.value if drv.cuCtxGetDevice(byref(dev)) == 0 else None


def select_device(device: int) -> None:
    """Make ``device`` current (its primary context), like ``cudaSetDevice``.

    Without a usable driver this does nothing (``cudnnCreate`` will then fail and `diagnose` explains).
    Raises ``ValueError`` when the device does not exist.
    """
    drv = driver()
    if drv is None:
        return
    n = device_count()
    if device >= n:
        raise ValueError(f"device = {device}; this machine has {n} CUDA device(s)"
                         + (f" (0..{n - 1})" if n else ""))
    if current_device() == device or (current_device() is None and device == 0):
        return
    with _lock:
        if device not in _primary:
            dev, ctx = c_int(), c_void_p()
            _check(drv.cuDeviceGet(byref(dev), device), "cuDeviceGet", device)
            _check(drv.cuDevicePrimaryCtxRetain(byref(ctx), dev.value), "cuDevicePrimaryCtxRetain", device)
            _primary[device] = int(ctx.value or 0)
    _check(drv.cuCtxSetCurrent(_primary[device]), "cuCtxSetCurrent", device)


def _check(status: int, fn: str, device: int) -> None:
    if status != 0:
        raise RuntimeError(f"{fn} failed with CUresult {status} for device {device}")


def diagnose(device: int = 0) -> str:
    """One sentence on why a cuDNN handle cannot be created here (for error messages)."""
    driver()
    if _state["driver"] is None:
        return f"No CUDA driver could be loaded ({_state['why']}); cuDNN needs an NVIDIA GPU and its driver"
    if _state["init"] != 0:
        return f"The CUDA driver is present but cuInit failed with CUresult {_state['init']} (no usable GPU?)"
    return f"The CUDA driver sees {device_count()} device(s); the handle was requested on device {device}"


def stream_address(stream: object) -> int:
    """A ``cudaStream_t`` address from ``None`` (legacy default stream), an int, an object with
    ``__cuda_stream__()`` (CUDA stream protocol), ``.ptr`` (CuPy) or ``.handle`` (cuda.core)."""
    if stream is None:
        return 0
    if isinstance(stream, bool):
        raise TypeError(f"stream must be None, an int address or a stream object; got {stream!r}")
    if isinstance(stream, int):
        if stream < 0:
            raise ValueError(f"stream = {stream}; expected a non-negative address")
        return stream
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    for attr in ("ptr", "handle"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise TypeError(f"stream must be None, an int address or a stream object (__cuda_stream__, .ptr, "
                    f".handle); got {type(stream).__name__}")
