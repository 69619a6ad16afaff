"""bench/onnx_peer.py: ONNX Runtime's LSTM/GRU/RNN on our weights (the library's ONNX export) equals our
reference engine.

ORT's CPU LSTM/GRU kernels run float32 only ("does not support double yet"), so every comparison is
float32 (tolerance 1e-5) and float64 params are a clear ValueError.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

import arrayrnn as ar

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

_PATH = Path(__file__).resolve().parent.parent / "bench" / "onnx_peer.py"
_spec = importlib.util.spec_from_file_location("onnx_peer", _PATH)
onnx_peer = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("onnx_peer", onnx_peer)
_spec.loader.exec_module(onnx_peer)
OnnxPeer = onnx_peer.OnnxPeer

TOL = {"rtol": 1e-5, "atol": 1e-5}


def _case(mode: str, layers: int, bidirectional: bool, B: int = 4, T: int = 7, seed: int = 0, **spec_kw):
    spec = ar.RNNSpec(mode=mode, input_size=5, hidden_size=6, num_layers=layers,
                      bidirectional=bidirectional, **spec_kw)
    params = ar.PackedParams.init(spec, seed=seed)
    # weights well away from zero so that a swapped gate cannot hide
    params.data[:] *= 3.0
    x = np.random.default_rng(seed).standard_normal((T, B, 5)).astype(np.float32)
    return params, x


def _reference(params, x, lengths=None) -> np.ndarray:
    return ar.rnn_forward(params, x, lengths=lengths, engine="reference").y


@pytest.mark.parametrize("mode", ["lstm", "gru"])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_peer_equals_reference_uniform_lengths(mode, layers, bidirectional):
    params, x = _case(mode, layers, bidirectional)
    peer = OnnxPeer(params, threads=1)
    want = _reference(params, x)
    np.testing.assert_allclose(peer(x), want, **TOL)
    np.testing.assert_allclose(peer.bound(x)(), want, **TOL)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_peer_equals_reference_unsorted_lengths(mode, layers, bidirectional):
    params, x = _case(mode, layers, bidirectional, B=5)
    lengths = np.array([3, 7, 1, 0, 5])  # unsorted, full, one step, zero-length
    peer = OnnxPeer(params, threads=2)
    want = _reference(params, x, lengths)
    got = peer(x, lengths)
    np.testing.assert_allclose(got, want, **TOL)
    np.testing.assert_allclose(peer.bound(x, lengths)(), want, **TOL)
    # both sides write exact zeros past each row's length (the padded steps are compared, not skipped)
    pad = np.arange(x.shape[0])[:, None] >= lengths[None, :]
    assert np.all(got[pad] == 0) and np.all(want[pad] == 0)
    assert np.all(np.abs(got[~pad]).max(axis=-1) > 0)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_peer_batch_one_long_sequence(mode):
    params, x = _case(mode, 1, False, B=1, T=40)
    np.testing.assert_allclose(OnnxPeer(params)(x), _reference(params, x), **TOL)
    np.testing.assert_allclose(OnnxPeer(params)(x, np.array([23])), _reference(params, x, np.array([23])),
                               **TOL)


@pytest.mark.parametrize("mode", ["rnn_tanh", "rnn_relu"])
def test_peer_rnn_modes(mode):
    params, x = _case(mode, 2, True, B=3)
    lengths = np.array([7, 0, 4])
    np.testing.assert_allclose(OnnxPeer(params)(x, lengths), _reference(params, x, lengths), **TOL)


@pytest.mark.parametrize("spec_kw", [{"reset_after": False}, {"bias": "single_rec"}, {"bias": "single_inp"},
                                     {"bias": False}])
def test_peer_gru_variants(spec_kw):
    params, x = _case("gru", 2, True, **spec_kw)
    np.testing.assert_allclose(OnnxPeer(params)(x), _reference(params, x), **TOL)


def test_peer_from_torch_equals_torch():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    module = torch.nn.LSTM(5, 6, 2, bidirectional=True)
    x = np.random.default_rng(1).standard_normal((7, 3, 5)).astype(np.float32)
    with torch.inference_mode():
        want = module(torch.from_numpy(x))[0].numpy()
    np.testing.assert_allclose(OnnxPeer.from_torch(module)(x), want, **TOL)


def test_bound_call_reuses_its_output_and_sees_no_later_input_change():
    params, x = _case("lstm", 1, False)
    run = OnnxPeer(params).bound(x)
    first = run().copy()
    x[:] = 0.0  # the input was copied into ORT at bind time
    second = run()
    assert second is run()
    np.testing.assert_array_equal(first, second)


# -- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec_kw, match", [
    ({"mode": "lstm", "proj_size": 3}, "proj_size = 3"),
    ({"mode": "lstm", "cell_clip": 2.0}, "cell_clip"),
    ({"mode": "lstm", "dtype": "float64"}, "float32 only"),
])
def test_unsupported_params_are_a_clear_value_error(spec_kw, match):
    spec = ar.RNNSpec(input_size=5, hidden_size=6, **spec_kw)
    with pytest.raises(ValueError, match=match):
        OnnxPeer(ar.PackedParams.init(spec))


def test_bad_constructor_arguments():
    params, _ = _case("gru", 1, False)
    with pytest.raises(TypeError, match="expected arrayrnn.PackedParams"):
        OnnxPeer(params.data)
    with pytest.raises(ValueError, match="threads = 0"):
        OnnxPeer(params, threads=0)


@pytest.mark.parametrize("x, lengths, error, match", [
    (np.zeros((7, 4), np.float32), None, ValueError, r"x.shape = \(7, 4\)"),
    (np.zeros((7, 4, 3), np.float32), None, ValueError, "input_size = 5"),
    (np.zeros((0, 4, 5), np.float32), None, ValueError, "T >= 1"),
    (np.zeros((7, 4, 5), np.float64), None, TypeError, "x.dtype = float64"),
    ([[[0.0] * 5]], None, TypeError, "numpy.ndarray"),
    (np.zeros((7, 4, 5), np.float32), np.array([1, 2, 3]), ValueError, r"shape \(B,\) = \(4,\)"),
    (np.zeros((7, 4, 5), np.float32), np.array([1.0, 2, 3, 4]), ValueError, "integer array"),
    (np.zeros((7, 4, 5), np.float32), np.array([1, 8, 3, 4]), ValueError, r"lengths\[1\] = 8"),
    (np.zeros((7, 4, 5), np.float32), np.array([1, 2, -1, 4]), ValueError, r"lengths\[2\] = -1"),
])
def test_bad_call_input(x, lengths, error, match):
    params, _ = _case("lstm", 1, False)
    peer = OnnxPeer(params)
    with pytest.raises(error, match=match):
        peer(x, lengths)
    with pytest.raises(error, match=match):
        peer.bound(x, lengths)
