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


@pytest.mark.parametrize(("stream", "address"), [
    (None, 0), (0, 0), (0xDEAD, 0xDEAD), (_ProtocolStream(), 0x1234), (_CupyLike(), 0x5678),
    (_CoreLike(), 0x9ABC),
])
def test_stream_address(stream, address: int) -> None:
    assert _cuda.stream_address(stream) == address


@pytest.mark.parametrize(("stream", "exc"), [(True, TypeError), ("0", TypeError), (1.5, TypeError),
                                             (-1, ValueError)])
def test_stream_address_rejects(stream, exc: type) -> None:
    with pytest.raises(exc, match="stream"):
        _cuda.stream_address(stream)


def test_device_count_is_an_int() -> None:
    n = cb.device_count()
    assert isinstance(n, int) and n >= 0
    if _cuda.driver() is None:
        assert n == 0


def test_diagnose_says_what_is_missing() -> None:
    text = _cuda.diagnose(0)
    if _cuda.driver() is None:
        assert "CUDA driver" in text
    else:
        assert "device" in text


def test_select_device_out_of_range() -> None:
    if _cuda.driver() is None:
        _cuda.select_device(3)  # without a driver: nothing to select, cudnnCreate reports the problem
        return
    n = cb.device_count()
    with pytest.raises(ValueError, match=rf"device = {n + 5}; this machine has {n} CUDA device"):
        _cuda.select_device(n + 5)
