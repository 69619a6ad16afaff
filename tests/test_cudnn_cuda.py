"""The driver helpers behind Handle: stream addresses, device count, diagnosis (no GPU needed)."""

from __future__ import annotations

import pytest

import cudnn_bindings as cb
from cudnn_bindings import _cuda


class _ProtocolStream:
    def __cuda_stream__(self):
        return (0, 0x1234)


class _CupyLike:
    ptr = 0x5678


class _CoreLike:
    handle = 0x9ABC


class _GarbageStream:
    def __cuda_stream__(self):
        return (0, "x")


class _SmallPtr:
    ptr = 7


@pytest.mark.parametrize(("stream", "address"), [
    (None, 0), (0, 0), (0xDEAD, 0xDEAD), (_ProtocolStream(), 0x1234), (_CupyLike(), 0x5678),
    (_CoreLike(), 0x9ABC), (1, 1), (2, 2),  # cudaStreamLegacy, cudaStreamPerThread
])
def test_stream_address(stream, address: int) -> None:
    assert _cuda.stream_address(stream) == address


@pytest.mark.parametrize(("stream", "exc"), [(True, TypeError), ("0", TypeError), (1.5, TypeError),
                                             (-1, ValueError), (5, ValueError), (2**64, ValueError),
                                             (_GarbageStream(), TypeError), (_SmallPtr(), ValueError)])
def test_stream_address_rejects(stream, exc: type) -> None:
    with pytest.raises(exc, match="stream"):
        _cuda.stream_address(stream)


def test_device_count_is_an_int() -> None:
    n = cb.device_count()
    assert isinstance(n, int) and n >= 0
    if _cuda.driver() is None:
        assert n == 0


def test_diagnose_says_what_is_missing() -> None:
    """Without a usable driver (CI's case) the documented diagnosis; with one, the device count."""
    text = _cuda.diagnose(0)
    if _cuda.driver() is None:
        assert text.startswith("No CUDA driver could be loaded (") or text.startswith(
            "The CUDA driver is present but cuInit failed with CUresult"), text
        if _cuda._state["driver"] is None:
            assert text.endswith("; cuDNN needs an NVIDIA GPU and its driver") and _cuda._state["why"] in text
    else:
        n = cb.device_count()
        assert text == f"The CUDA driver sees {n} device(s); the handle was requested on device 0"


def test_no_driver_diagnosis_names_the_cause(monkeypatch: pytest.MonkeyPatch) -> None:
    """The message when cuda-python cannot find libcuda, and when cuda-python is missing (forced here)."""
    import builtins

    real_import = builtins.__import__

    def no_cuda_python(name, *args, **kwargs):
        if name.startswith("cuda"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(_cuda, "_state", {"loaded": False, "driver": None, "why": "", "init": None})
    monkeypatch.setattr(builtins, "__import__", no_cuda_python)
    assert _cuda.driver() is None and cb.device_count() == 0 and _cuda.current_device() is None
    text = _cuda.diagnose(3)
    assert text.startswith("No CUDA driver could be loaded (cuda-python is not installed"), text
    assert "pip install cuda-python" in text and text.endswith("cuDNN needs an NVIDIA GPU and its driver")
    _cuda.select_device(3)  # nothing to select without a driver; cudnnCreate then reports the diagnosis


def test_select_device_out_of_range() -> None:
    if _cuda.driver() is None:
        _cuda.select_device(3)  # without a driver: nothing to select, cudnnCreate reports the problem
        return
    n = cb.device_count()
    with pytest.raises(ValueError, match=rf"device = {n + 5}; this machine has {n} CUDA device"):
        _cuda.select_device(n + 5)
