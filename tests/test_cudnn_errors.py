"""CudnnError, check() and the error paths that need no GPU."""

from __future__ import annotations

import pickle

import pytest
from support.cudnn import new_handles, requires_cudnn

import cudnn_bindings as cb
from cudnn_bindings import raw
from cudnn_bindings.errors import status_name


def test_error_attributes_and_message() -> None:
    err = cb.CudnnError(2000, "cudnnSetFoo", "x < 0", "try y")
    assert isinstance(err, RuntimeError)
    assert (err.status, err.name) == (2000, "CUDNN_STATUS_BAD_PARAM")
    assert (err.function, err.detail) == ("cudnnSetFoo", "x < 0")
    assert str(err) == "cudnnSetFoo failed with CUDNN_STATUS_BAD_PARAM (2000): x < 0. try y"
    assert "no further detail" in str(cb.CudnnError(3000, "cudnnSetFoo"))


def test_error_survives_pickling() -> None:
    err = pickle.loads(pickle.dumps(cb.CudnnError(1001, "cudnnCreate", "no device", "hint")))
    assert (err.status, err.name, err.function, err.detail, err.hint) == (
        1001, "CUDNN_STATUS_NOT_INITIALIZED", "cudnnCreate", "no device", "hint")


def test_status_names() -> None:
    assert status_name(0) == "CUDNN_STATUS_SUCCESS"
    assert status_name(4003) == "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED"
    assert status_name(123) == "CUDNN_STATUS_UNKNOWN(123)"


@requires_cudnn
def test_check_passes_success_and_raises_otherwise() -> None:
    assert cb.check(0, "cudnnAnything") is None
    with pytest.raises(cb.CudnnError, match=r"^cudnnAnything failed with .*NOT_SUPPORTED \(3000\)"):
        cb.check(3000, "cudnnAnything")


@requires_cudnn
def test_cudnn_rejection_carries_its_last_error_text() -> None:
    with cb.RNNDescriptor(cb.RNNConfig(input_size=2, hidden_size=2)) as d:
        with pytest.raises(cb.CudnnError) as info:  # an invalid cell mode, bypassing our validation
            raw.set_rnn_descriptor_v8(d.ptr, 0, 7, 2, 0, 0, 0, 0, 0, 4, 4, 4, 1, None, 0)
    err = info.value
    assert err.name == "CUDNN_STATUS_BAD_PARAM" and err.status == 2000
    assert err.function == "cudnnSetRNNDescriptor_v8" and "cellMode" in err.detail
    assert raw.get_last_error_string() == ""  # reading it cleared it: no stale text in the next error


@requires_cudnn
def test_clip_rejection_by_cudnn() -> None:
    with cb.RNNDescriptor(cb.RNNConfig(input_size=2, hidden_size=2)) as d:
        with pytest.raises(cb.CudnnError, match=r"cudnnRNNSetClip_v9 failed with .*BAD_PARAM .*lclip"):
            raw.rnn_set_clip(d.ptr, 1, 2.0, 1.0)


@requires_cudnn
def test_our_validation_runs_before_cudnn() -> None:
    new = new_handles()
    with pytest.raises(ValueError, match="hidden_size = 0"):
        cb.RNNDescriptor(cb.RNNConfig(input_size=2, hidden_size=0))
    assert new() == {}


@requires_cudnn
def test_handle_without_gpu_is_a_clear_cudnn_error() -> None:
    new = new_handles()
    if cb.device_count() > 0:
        pytest.skip("a CUDA device is present; the no-GPU path cannot be exercised here")
    with pytest.raises(cb.CudnnError) as info:
        cb.Handle()
    err = info.value
    assert err.name == "CUDNN_STATUS_NOT_INITIALIZED" and err.function == "cudnnCreate"
    text = str(err)
    assert text.startswith("cudnnCreate failed with CUDNN_STATUS_NOT_INITIALIZED (1001)")
    assert "CUDA driver" in text and ("NVIDIA GPU" in text or "no usable GPU" in text)
    assert new() == {}


def test_handle_rejects_bad_device_before_any_call() -> None:
    with pytest.raises(ValueError, match=r"device = -1; expected an integer in 0\.\."):
        cb.Handle(device=-1)
    with pytest.raises(TypeError, match="device must be an integer"):
        cb.Handle(device="cuda:0")  # type: ignore[arg-type]
