"""The little of the CUDA driver API a `Handle` needs: device count, device selection, a diagnosis.

Calls the driver through NVIDIA's cuda-python (``cuda.bindings.driver``), which finds ``libcuda`` itself;
without cuda-python, without a driver or without a device every function here still answers (``0``
devices, ``None``) and `diagnose` says which of these is the cause. Selecting a device makes its primary
context current, which is what ``cudaSetDevice`` does (and what CuPy does), so CuPy keeps working beside it.
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any

from . import args

__all__ = ["driver", "device_count", "current_device", "select_device", "diagnose", "stream_address"]

_lock = threading.Lock()
_state: dict[str, Any] = {"loaded": False, "driver": None, "why": "", "init": None}
_primary: dict[int, Any] = {}  # device ordinal -> retained primary context (kept for the process lifetime)


def _load() -> ModuleType | None:
    try:
        from cuda.bindings import driver as drv  # optional dependency (the gpu extra)
    except ImportError as exc:
        _state["why"] = f"cuda-python is not installed ({exc}); pip install cuda-python"
        return None
    try:
        (status,) = drv.cuInit(0)
    except Exception as exc:  # cuda-python raises when libcuda itself cannot be found or loaded
        _state["why"] = f"{type(exc).__name__}: {exc}"
        return None
    _state["init"] = int(status)
    return drv


def driver() -> ModuleType | None:
    """``cuda.bindings.driver`` after a successful ``cuInit(0)``; ``None`` when absent or unusable."""
    with _lock:
        if not _state["loaded"]:
            _state["driver"], _state["loaded"] = _load(), True
    if _state["driver"] is None or _state["init"] != 0:
        return None
    return _state["driver"]


def device_count() -> int:
    """Number of CUDA devices visible to the driver (0 when there is no driver or no device)."""
    drv = driver()
    if drv is None:
        return 0
    status, n = drv.cuDeviceGetCount()
    return int(n) if int(status) == 0 else 0


def current_device() -> int | None:
    """Ordinal of the device of the current context, or ``None`` when no context is current."""
    drv = driver()
    if drv is None:
        return None
    status, ctx = drv.cuCtxGetCurrent()
    if int(status) != 0 or not int(ctx):
        return None
    status, dev = drv.cuCtxGetDevice()
    return int(dev) if int(status) == 0 else None


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
            status, dev = drv.cuDeviceGet(device)
            _check(status, "cuDeviceGet", device)
            status, ctx = drv.cuDevicePrimaryCtxRetain(dev)
            _check(status, "cuDevicePrimaryCtxRetain", device)
            _primary[device] = ctx
    (status,) = drv.cuCtxSetCurrent(_primary[device])
    _check(status, "cuCtxSetCurrent", device)


def _check(status: Any, fn: str, device: int) -> None:
    if int(status) != 0:
        raise RuntimeError(f"{fn} failed with CUresult {int(status)} for device {device}")


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
    ``__cuda_stream__()`` (CUDA stream protocol), ``.ptr`` (CuPy) or ``.handle`` (cuda.core), checked by
    `args.stream` (NULL, CUDA's special streams 1 and 2, or an address of at least 4096)."""
    if stream is None:
        return 0
    if isinstance(stream, bool):
        raise TypeError(f"stream must be None, an int address or a stream object; got {stream!r}")
    if hasattr(stream, "__index__"):
        value: Any = stream
    elif hasattr(stream, "__cuda_stream__"):
        value = stream.__cuda_stream__()[1]
    else:
        attr = next((a for a in ("ptr", "handle") if hasattr(stream, a)), None)
        if attr is None:
            raise TypeError(f"stream must be None, an int address or a stream object (__cuda_stream__, .ptr, "
                            f".handle); got {type(stream).__name__}")
        value = getattr(stream, attr)
    try:
        value = int(value)
    except (TypeError, ValueError):
        raise TypeError(f"stream ({type(stream).__name__}) gave the address {value!r}; expected an "
                        f"integer") from None
    return args.stream("stream", value) or 0
