"""Forward semantics PyTorch cannot check directly: single-bias modes, the reset-before GRU, cell clipping,
seeded inter-layer dropout; and the frontend's conveniences (padding never read, backward after inference,
lengths from any integer container, default states)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support.rnn_cases import (
    assert_close,
    forward,
    forward_backward,
    host,
    make_case,
    on_device,
    tolerances,
    xp_of,
)
from support.torch_oracle import run_torch

from arrayrnn import PackedParams, RNNSpec, rnn_backward
from arrayrnn.engines.cells import gate


def _sigmoid(a: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-a))


def _bias(params: PackedParams, name: str) -> np.ndarray:
    spec = params.spec
    return params.view(0, 0, name) if params.layout.has(0, 0, name) else np.zeros(spec.gate_size)


def loop_oracle(params: PackedParams, x: np.ndarray, h0: np.ndarray, c0: np.ndarray | None):
    """One layer, one direction, full lengths, straight from PyTorch's documented cell equations (float64;
    the reset-after GRU's ``b_hn`` inside ``r * (W_hn h + b_hn)``)."""
    spec = params.spec
    W_ih, W_hh = params.view(0, 0, "W_ih"), params.view(0, 0, "W_hh")
    b_ih, b_hh = _bias(params, "b_ih"), _bias(params, "b_hh")
    h, c, ys = h0[0], (c0[0] if c0 is not None else None), []
    for x_t in x:
        xg = x_t @ W_ih.T + b_ih
        if spec.mode == "gru":
            H = spec.hidden_size
            hg = h @ W_hh[:2 * H].T + b_hh[:2 * H]
            r, z = _sigmoid(xg[:, :H] + hg[:, :H]), _sigmoid(xg[:, H:2 * H] + hg[:, H:])
            if spec.reset_after:
                n = np.tanh(xg[:, 2 * H:] + r * (h @ W_hh[2 * H:].T + b_hh[2 * H:]))
            else:
                n = np.tanh(xg[:, 2 * H:] + (r * h) @ W_hh[2 * H:].T + b_hh[2 * H:])
            h = (1 - z) * n + z * h
        else:  # lstm
            i, f, g, o = np.split(xg + h @ W_hh.T + b_hh, 4, axis=1)
            c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
            if spec.cell_clip is not None:
                c = np.clip(c, *spec.cell_clip)
            h = _sigmoid(o) * np.tanh(c)
            if spec.proj_size:
                h = h @ params.view(0, 0, "W_hr").T
        ys.append(h)
    return np.stack(ys), h, c


@pytest.mark.parametrize("fields", [
    dict(mode="gru", reset_after=False),
    dict(mode="gru", reset_after=False, bias="single_rec"),
    dict(mode="gru", reset_after=True, bias="single_rec"),
    dict(mode="lstm", cell_clip=0.3),
    dict(mode="lstm", cell_clip=(-0.2, 0.5), proj_size=2, bias="single_inp"),
], ids=["gru-reset-before", "gru-reset-before-single_rec", "gru-single_rec", "lstm-clip", "lstm-clip-proj"])
def test_forward_matches_loop_oracle(fields, engine):
    spec = RNNSpec(input_size=3, hidden_size=4, dtype="float64", **fields)
    case = make_case(spec, 6, 3, lengths="full", scale=2.0)
    res = host(forward(case, engine))
    y, h, c = loop_oracle(case.params, case.x, case.h0, case.c0)
    np.testing.assert_allclose(res.y, y, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(res.h_n[0], h, rtol=1e-12, atol=1e-14)
    if c is not None:
        np.testing.assert_allclose(res.c_n[0], c, rtol=1e-12, atol=1e-14)
        if spec.cell_clip is not None:
            assert np.isin(c, spec.cell_clip).any(), "the clip must be active"


@pytest.mark.parametrize("mode", ["rnn_tanh", "lstm", "gru"])
@pytest.mark.parametrize("single", ["single_inp", "single_rec"])
def test_single_bias_equals_double_with_the_other_zero(mode, single, engine):
    """A single-bias mode is double mode with the dropped vector zero, forward and backward (PyTorch)."""
    spec = RNNSpec(mode=mode, input_size=3, hidden_size=4, num_layers=2, bidirectional=True, bias=single,
                   dtype="float64")
    case = make_case(spec, 5, 3)
    res, grads = forward_backward(case, engine)
    double = PackedParams.zeros(spec.replace(bias="double"))
    for key, view in case.params.named_views().items():
        double.named_views()[key][...] = view
    ref = run_torch(double, case.x, case.lengths, case.h0, case.c0, case.dy, case.dh_n, case.dc_n)
    tol = tolerances("float64")
    assert_close(res.y, ref.y, "y", **tol)
    assert_close(grads.dx, ref.dx, "dx", **tol)
    for key, view in grads.dparams.named_views().items():
        assert_close(view, ref.grads[key], f"dparams[{key}]", **tol)


def documented_uniforms(seed: int, count: int) -> np.ndarray:
    """The uniforms of arrayrnn.frontend.dropout's docstring, written independently with Python integers."""
    m64 = (1 << 64) - 1

    def mix(z: int) -> int:
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m64
        return z ^ (z >> 31)

    key = mix(seed)
    return np.array([(mix((key + (i + 1) * 0x9E3779B97F4A7C15) & m64) >> 11) / 2**53 for i in range(count)])


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_dropout_is_the_documented_mask_between_layers(mode, engine):
    """Layer-by-layer composition of one-layer PyTorch modules with the masks of arrayrnn.frontend.dropout's
    docstring, drawn independently here, equals the fused call with dropout (unsorted lengths)."""
    p, seed = 0.4, 11
    spec = RNNSpec(mode=mode, input_size=3, hidden_size=4, num_layers=3, bidirectional=True, dropout=p,
                   dtype="float64")
    T, B = 5, 4
    case = make_case(spec, T, B)
    res = host(forward(case, engine, training=True, seed=seed))
    F = spec.num_directions * spec.output_size
    masks = (documented_uniforms(seed, (spec.num_layers - 1) * T * B * F).reshape(-1, T, B, F) >= p) / (1 - p)

    layer_input, D = case.x, spec.num_directions
    for layer in range(spec.num_layers):
        one = spec.replace(num_layers=1, input_size=spec.layer_input_size(layer), dropout=0.0)
        start, _ = case.params.layout.layer_direction_span(layer, 0)
        _, stop = case.params.layout.layer_direction_span(layer, D - 1)
        states = slice(layer * D, (layer + 1) * D)
        c0 = case.c0[states] if spec.has_cell else None
        ref = run_torch(PackedParams(one, case.params.data[start:stop].copy()), layer_input, case.lengths,
                        case.h0[states], c0, np.zeros((T, B, F)), np.zeros_like(case.h0[states]),
                        np.zeros_like(c0) if c0 is not None else None)
        np.testing.assert_allclose(res.h_n[states], ref.h_n, rtol=1e-12, atol=1e-14)
        if spec.has_cell:
            np.testing.assert_allclose(res.c_n[states], ref.c_n, rtol=1e-12, atol=1e-14)
        layer_input = ref.y * masks[layer] if layer < spec.num_layers - 1 else ref.y
    np.testing.assert_allclose(res.y, layer_input, rtol=1e-12, atol=1e-14)


def test_dropout_seed_and_mode(engine):
    spec = RNNSpec(mode="gru", input_size=3, hidden_size=8, num_layers=2, dropout=0.5, dtype="float64")
    case = make_case(spec, 6, 5)
    same = [host(forward(case, engine, training=True, seed=5).y) for _ in range(2)]
    np.testing.assert_array_equal(same[0], same[1])
    assert not np.allclose(host(forward(case, engine, training=True, seed=6).y), same[0])
    no_dropout = make_case(spec.replace(dropout=0.0), 6, 5)
    np.testing.assert_allclose(host(forward(case, engine, seed=5).y), host(forward(no_dropout, engine).y),
                               rtol=1e-14)


def test_padding_is_never_read(engine):
    """NaN or Inf past a row's end in x or dy changes nothing."""
    spec = RNNSpec(mode="lstm", input_size=3, hidden_size=4, num_layers=2, bidirectional=True,
                   dtype="float64")
    case = make_case(spec, 6, 4, lengths="zeros")
    clean_res, clean = map(host, forward_backward(case, engine))
    x, dy = case.x.copy(), case.dy.copy()
    for b, n in enumerate(case.lengths):
        x[n:, b] = np.nan
        dy[n:, b] = np.inf
    res, grads = map(host, forward_backward(case.with_(x=x, dy=dy), engine))
    np.testing.assert_array_equal(res.y, clean_res.y)
    np.testing.assert_array_equal(grads.dx, clean.dx)
    np.testing.assert_array_equal(grads.dparams.data, clean.dparams.data)


@pytest.mark.parametrize("fields", [dict(mode="lstm"), dict(mode="gru"), dict(mode="gru", reset_after=False),
                                    dict(mode="rnn_relu")],
                         ids=["lstm", "gru", "gru-reset-before", "rnn_relu"])
def test_initial_states_of_empty_rows_are_never_read(fields, engine):
    """inf and NaN in h0 / c0 of rows of length 0 come back in h_n / c_n and change nothing else (rows are
    independent: a state no step reads must not reach the weight gradient as 0 * inf)."""
    spec = RNNSpec(input_size=3, hidden_size=4, num_layers=2, bidirectional=True, dtype="float64", **fields)
    case = make_case(spec, 6, 4, lengths="zeros")
    clean_res, clean = map(host, forward_backward(case, engine))
    zero = case.lengths == 0
    h0 = case.h0.copy()
    h0[:, zero] = np.inf
    c0 = None
    if spec.has_cell:
        c0 = case.c0.copy()
        c0[:, zero] = np.nan
    res, grads = map(host, forward_backward(case.with_(h0=h0, c0=c0), engine))
    np.testing.assert_array_equal(res.y, clean_res.y)
    np.testing.assert_array_equal(res.h_n, np.where(zero[None, :, None], np.inf, clean_res.h_n))
    if spec.has_cell:
        np.testing.assert_array_equal(res.c_n, np.where(zero[None, :, None], np.nan, clean_res.c_n))
    for name in ("dx", "dh0", "dc0"):
        np.testing.assert_array_equal(getattr(grads, name), getattr(clean, name), err_msg=name)
    np.testing.assert_array_equal(grads.dparams.data, clean.dparams.data)


@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_relu"])
def test_backward_after_inference_forward(mode, engine):
    spec = RNNSpec(mode=mode, input_size=3, hidden_size=4, num_layers=2, bidirectional=True, dropout=0.3,
                   dtype="float64")
    dev = on_device(make_case(spec, 5, 3), engine)
    inference = forward(dev, engine, training=False)
    assert not inference.training
    g = host(rnn_backward(inference, dev.dy, dev.dh_n, dev.dc_n))
    expected = host(forward_backward(dev.with_(params=PackedParams(spec.replace(dropout=0.0),
                                                                   dev.params.data)), engine)[1])
    for name in ("dx", "dh0", "dc0"):
        if getattr(expected, name) is not None:
            np.testing.assert_allclose(getattr(g, name), getattr(expected, name), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(g.dparams.data, expected.dparams.data, rtol=1e-13, atol=1e-15)


def test_lengths_from_any_integer_container(engine):
    spec = RNNSpec(mode="gru", input_size=3, hidden_size=4, bidirectional=True, dtype="float64")
    case = make_case(spec, 5, 4)
    expected = host(forward(case, engine).y)
    containers = [list(case.lengths), tuple(case.lengths), case.lengths.astype(np.int32),
                  case.lengths.astype(np.uint8), torch.tensor(case.lengths)]
    if xp_of(engine) is not np:
        containers.append(xp_of(engine).asarray(case.lengths))  # lengths on the device
    for lengths in containers:
        np.testing.assert_array_equal(host(forward(case.with_(lengths=lengths), engine).y), expected)


def test_default_states_and_cotangents_are_zeros(engine):
    spec = RNNSpec(mode="lstm", input_size=3, hidden_size=4, proj_size=2, num_layers=2, dtype="float64")
    dev, xp = on_device(make_case(spec, 4, 3), engine), xp_of(engine)
    zeros = dev.with_(h0=xp.zeros_like(dev.h0), c0=xp.zeros_like(dev.c0))
    none = dev.with_(h0=None, c0=None)
    np.testing.assert_array_equal(host(forward(none, engine).y), host(forward(zeros, engine).y))
    res = forward(none, engine, training=True)
    g = host(rnn_backward(res, dev.dy))
    g_zero = host(rnn_backward(res, dev.dy, xp.zeros_like(dev.dh_n), xp.zeros_like(dev.dc_n)))
    np.testing.assert_array_equal(g.dparams.data, g_zero.dparams.data)
    np.testing.assert_array_equal(g.dh0, g_zero.dh0)
    assert not host(rnn_backward(res).dparams).data.any()


def test_result_and_grads_types(engine):
    spec = RNNSpec(mode="gru", input_size=3, hidden_size=4, dtype="float32")
    case = on_device(make_case(spec, 4, 2, batch_first=True), engine)
    res, g = forward_backward(case, engine)
    xp = xp_of(engine)
    assert res.engine == engine and res.training and res.params is case.params
    assert all(isinstance(a, xp.ndarray) for a in (res.y, res.h_n, g.dx, g.dh0, g.dparams.data))
    assert res.y.shape == (2, 4, 4) and res.y.flags.c_contiguous and res.y.dtype == np.float32
    assert g.dx.shape == case.x.shape and g.dx.dtype == np.float32 and g.dc0 is None
    assert g.dparams.spec == spec and g.dparams.data.shape == case.params.data.shape
    assert gate(spec, host(g.dparams).view(0, 0, "b_hh"), "n").any()
    rnn_backward(res, params=case.params)  # the same params are accepted
    rnn_backward(res, params=PackedParams(spec, case.params.data))  # so is another wrapper of its buffer
