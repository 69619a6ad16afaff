"""arrayrnn.onnx.export: a PackedParams stack as a runnable ONNX model, against our reference engine (run in
onnxruntime, float32: its CPU LSTM/GRU kernels have no float64)."""

from __future__ import annotations

import numpy as np
import pytest

import arrayrnn as ar
from arrayrnn import onnx as ar_onnx

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


def session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("mode,kwargs", [
    ("lstm", {"num_layers": 2, "bidirectional": True}),
    ("gru", {"num_layers": 2}),
    ("gru", {"reset_after": False, "bias": "single_rec", "bidirectional": True}),
    ("rnn_tanh", {"bias": False}),
    ("rnn_relu", {"num_layers": 3, "bidirectional": True}),
])
def test_export_runs_like_rnn_forward_with_lengths_and_states(mode, kwargs, tmp_path):
    spec = ar.RNNSpec(mode=mode, input_size=5, hidden_size=6, **kwargs)
    params = ar.PackedParams.init(spec, seed=0)
    params.data[:] *= 3.0  # weights well away from zero, so that a swapped gate cannot hide
    rng = np.random.default_rng(0)
    x = rng.standard_normal((7, 4, 5)).astype(np.float32)
    lengths = np.array([7, 3, 0, 5])  # unsorted, with a zero-length row
    h0 = rng.standard_normal(spec.state_shape(4)).astype(np.float32)
    c0 = rng.standard_normal(spec.state_shape(4, cell=True)).astype(np.float32) if spec.has_cell else None
    path = ar_onnx.export(params, tmp_path / "m.onnx")
    feeds = {"X": x, "sequence_lens": lengths.astype(np.int32), "initial_h": h0}
    if spec.has_cell:
        feeds["initial_c"] = c0
    got = session(path).run(None, feeds)
    want = ar.rnn_forward(params, x, lengths, h0, c0, engine="reference")
    np.testing.assert_allclose(got[0], want.y, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(got[1], want.h_n, atol=1e-5, rtol=1e-5)
    if spec.has_cell:
        np.testing.assert_allclose(got[2], want.c_n, atol=1e-5)


def test_export_without_lengths_or_states(tmp_path):
    params = ar.PackedParams.init(ar.RNNSpec(mode="gru", input_size=3, hidden_size=4), seed=1)
    path = ar_onnx.export(params, tmp_path / "m.onnx", variable_lengths=False, states=False)
    sess = session(path)
    assert [i.name for i in sess.get_inputs()] == ["X"] and [o.name for o in sess.get_outputs()] == ["Y"]
    x = np.random.default_rng(1).standard_normal((4, 2, 3)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"X": x})[0], ar.rnn_forward(params, x).y, atol=1e-5)


def test_gate_rows_take_our_order_to_onnxs():
    spec = ar.RNNSpec(mode="lstm", input_size=1, hidden_size=2)
    assert ar_onnx.gate_rows(spec).tolist() == [0, 1, 6, 7, 2, 3, 4, 5]  # i, o, f, g(c)
    assert ar_onnx.gate_rows(spec.replace(mode="gru")).tolist() == [2, 3, 0, 1, 4, 5]  # z, r, n(h)


@pytest.mark.parametrize("spec_kw, match", [({"proj_size": 2}, "proj_size = 2"),
                                             ({"cell_clip": 3.0}, "cell_clip")])
def test_unexportable_stacks_are_a_clear_value_error(spec_kw, match, tmp_path):
    params = ar.PackedParams.init(ar.RNNSpec(mode="lstm", input_size=3, hidden_size=4, **spec_kw))
    with pytest.raises(ValueError, match=match):
        ar_onnx.export(params, tmp_path / "m.onnx")
    with pytest.raises(TypeError, match="expected an arrayrnn.PackedParams"):
        ar_onnx.export(params.data, tmp_path / "m.onnx")


def test_importing_arrayrnn_onnx_needs_no_onnx_package():
    import subprocess
    import sys

    code = "import sys; sys.modules['onnx'] = None; import arrayrnn.onnx, arrayrnn; print('ok')"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "ok"


@pytest.mark.parametrize("layers, bidirectional, lengths", [(1, False, None), (2, True, [7, 3, 0, 5])])
def test_peepholes_equal_onnxruntimes_lstm_with_P(layers, bidirectional, lengths, tmp_path):
    """ONNX's LSTM with the peephole input P (i, f see c_{t-1}, o sees c_t) computes our peepholes=True."""
    spec = ar.RNNSpec(mode="lstm", input_size=5, hidden_size=6, num_layers=layers,
                      bidirectional=bidirectional, peepholes=True, dtype="float32")
    params = ar.PackedParams.init(spec, seed=4)
    params.data[:] *= 3.0  # peepholes well away from zero, so that swapped rows cannot hide
    rng = np.random.default_rng(2)
    x = rng.standard_normal((7, 4, 5)).astype(np.float32)
    h0 = rng.standard_normal(spec.state_shape(4)).astype(np.float32)
    c0 = rng.standard_normal(spec.state_shape(4, cell=True)).astype(np.float32)
    variable = lengths is not None
    path = ar_onnx.export(params, tmp_path / "m.onnx", variable_lengths=variable)
    feeds = {"X": x, "initial_h": h0, "initial_c": c0}
    if variable:
        feeds["sequence_lens"] = np.array(lengths, np.int32)
    y, h_n, c_n = session(path).run(None, feeds)
    want = ar.rnn_forward(params, x, lengths, h0, c0, engine="reference")
    np.testing.assert_allclose(y, want.y, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(h_n, want.h_n, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(c_n, want.c_n, atol=2e-5, rtol=1e-5)
    plain = ar.rnn_forward(ar.PackedParams(spec.replace(peepholes=False),
                                           _without_peepholes(params)), x, lengths, h0, c0)
    assert not np.allclose(plain.y, want.y, atol=1e-3)  # the peepholes matter here


def _without_peepholes(params):
    keep = [b for b in params.layout.blocks if b.name != "P"]
    return np.concatenate([params.data[b.offset:b.stop] for b in keep])


def test_zoneout_is_not_exportable():
    with pytest.raises(ValueError, match=r"zoneout = 0.1, zoneout_cell = None; ONNX's operators have no"):
        ar_onnx.export(ar.PackedParams.init(ar.RNNSpec("gru", 2, 3, zoneout=0.1)), "unused.onnx")
