"""The cuDNN engine: configuration, index map and zero-length fix-ups on CPU; numerics on a GPU.

CPU (CI): descriptor configurations of a grid of specs round-trip through cuDNN; the canonical <-> cudnn
index map built from cuDNN's real answers (in a subprocess: tests/support/cudnn_index_probe.py) is bit-exact
both ways; the zero-length fix-ups give the reference engine's zero-length semantics; without CuPy/GPU
``engine="cudnn"`` and ``to_format("cudnn")`` say what is missing. GPU (``gpu`` marker): the engine against
the reference engine on CuPy.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.cudnn import gpu_reason, requires_cudnn

import arrayrnn as ar
import cudnn_bindings as cb
from arrayrnn.engines import cudnn_format as cf

ROOT = Path(__file__).resolve().parents[1]
MODES = ("rnn_tanh", "rnn_relu", "lstm", "gru")
BIASES = ("double", "single_inp", "single_rec", "none")


def _grid(clip: bool = False):
    for mode, bias, bidir, layers, proj in itertools.product(MODES, BIASES, (False, True), (1, 3), (0, 2)):
        if proj and mode != "lstm":
            continue
        yield ar.RNNSpec(mode=mode, input_size=5, hidden_size=4, num_layers=layers, bidirectional=bidir,
                         bias=bias, proj_size=proj,
                         cell_clip=(-0.5, 0.7) if clip and mode == "lstm" else None)


# ---------------------------------------------------------------- configuration and index map (CPU)
@requires_cudnn
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_descriptor_configurations_round_trip(dtype: str) -> None:
    n = 0
    for spec in itertools.chain(_grid(), _grid(clip=True)):
        config = cf.rnn_config(spec, dtype)
        with cb.RNNDescriptor(config) as desc:
            assert desc.get() == config, spec
        assert config.proj_size == (spec.proj_size or spec.hidden_size)
        assert config.aux_flags == cf.PADDED_IO_ENABLED
        assert config.math_prec == (cb.DataType.DOUBLE if dtype == "float64" else cb.DataType.FLOAT)
        n += 1
        if spec.cell_clip is not None:
            assert (config.clip_mode, config.lclip, config.rclip) == (cb.RNNClipMode.MINMAX, -0.5, 0.7)
    assert n == 160


@requires_cudnn
def test_index_map_from_cudnns_answers_is_bit_exact() -> None:
    """Every mode x bias x direction x layers x projection x dtype (240 specs), in a subprocess because
    the host-buffer-as-handle trick is undocumented and a future cuDNN may crash on it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    probe = ROOT / "tests" / "support" / "cudnn_index_probe.py"
    proc = subprocess.run([sys.executable, str(probe)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"ok": 240}


def _fake_query(spec: ar.RNNSpec, itemsize: int, **bad):
    """A made-up consistent layout (matrices then biases) that ``bad`` can spoil."""
    regions, cursor = {}, 0
    g, d = spec.gates, spec.num_directions
    for part in ("matrix", "bias"):
        for layer in range(spec.num_layers):
            for direction in range(d):
                in_size = spec.layer_input_size(layer)
                for lin in range(2 * g):
                    cols = (in_size if lin < g else spec.output_size) if part == "matrix" else 1
                    dims = (1, spec.hidden_size, cols)
                    regions[(layer * d + direction, lin, part)] = cb.WeightRegion(
                        cursor * itemsize, dims, (dims[1] * cols, cols, 1), cb.DataType.FLOAT)
                    cursor += spec.hidden_size * cols
    regions.update(bad)

    def query(pseudo, lin):
        return cb.WeightParams(regions.get((pseudo, lin, "matrix")), regions.get((pseudo, lin, "bias")))

    return query, cursor * itemsize


def test_index_map_checks_every_region() -> None:
    spec = ar.RNNSpec(mode="gru", input_size=3, hidden_size=2)
    query, nbytes = _fake_query(spec, 4)
    idx = cf.index_map(spec, 4, nbytes, query)
    assert sorted(idx.tolist()) == list(range(idx.size))
    wrong_dims = cb.WeightRegion(0, (1, 2, 5), (10, 5, 1), cb.DataType.FLOAT)
    with pytest.raises(ValueError, match=r"pseudo-layer 0, linLayerID 1, matrix \(l0.fwd.W_ih\) as dims"):
        cf.index_map(spec, 4, nbytes, _fake_query_with(spec, (0, 1, "matrix"), wrong_dims))
    overlapping = cb.WeightRegion(0, (1, 2, 3), (6, 3, 1), cb.DataType.FLOAT)
    with pytest.raises(ValueError, match="overlapping"):
        cf.index_map(spec, 4, nbytes, _fake_query_with(spec, (0, 1, "matrix"), overlapping))
    outside = cb.WeightRegion(nbytes, (1, 2, 3), (6, 3, 1), cb.DataType.FLOAT)
    with pytest.raises(ValueError, match="outside the"):
        cf.index_map(spec, 4, nbytes, _fake_query_with(spec, (0, 1, "matrix"), outside))
    with pytest.raises(ValueError, match=r"no region for pseudo-layer 0, linLayerID 3, bias \(l0.fwd.b_hh\)"):
        cf.index_map(spec, 4, nbytes, _fake_query_with(spec, (0, 3, "bias"), None))


def _fake_query_with(spec, key, region):
    query, _ = _fake_query(spec, 4)

    def spoiled(pseudo, lin):
        good = query(pseudo, lin)
        if (pseudo, lin) != key[:2]:
            return good
        return cb.WeightParams(region, good.bias) if key[2] == "matrix" else cb.WeightParams(good.matrix,
                                                                                             region)

    return spoiled


def test_refusals_say_why() -> None:
    assert "reset-before GRU (reset_after=False)" in cf.refusal(
        ar.RNNSpec(mode="gru", input_size=2, hidden_size=2, reset_after=False))
    assert "not been checked against the reference engine on a GPU" in cf.refusal(
        ar.RNNSpec(mode="lstm", input_size=2, hidden_size=2, cell_clip=1.0))
    assert cf.refusal(ar.RNNSpec(mode="lstm", input_size=2, hidden_size=3, proj_size=2)) is None


# ---------------------------------------------------------------- zero-length rows (pure, on NumPy)
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_zero_length_fixups_give_the_contract(mode: str, batch_first: bool) -> None:
    """Run the reference engine as cuDNN would (zero lengths as 1), apply the fix-ups, and compare with
    the reference engine's own zero-length semantics: outputs, final states and every gradient."""
    spec = ar.RNNSpec(mode=mode, input_size=3, hidden_size=4, num_layers=2, bidirectional=True,
                      dtype="float64")
    rng = np.random.default_rng(1)
    params = ar.PackedParams.init(spec, seed=3, xp=np)
    t, b = 5, 4
    lengths = np.array([3, 0, 5, 0])
    x = rng.standard_normal((b, t, 3) if batch_first else (t, b, 3))
    mask = (np.arange(t)[None, :] < lengths[:, None]) if batch_first else (np.arange(t)[:, None] < lengths)
    x *= mask[..., None]
    lstm = mode == "lstm"
    h0 = rng.standard_normal((4, b, 4))
    c0 = rng.standard_normal((4, b, 4)) if lstm else None
    dy = rng.standard_normal(x.shape[:2] + (8,)) * mask[..., None]
    dh_n = rng.standard_normal((4, b, 4))
    dc_n = rng.standard_normal((4, b, 4)) if lstm else None
    kw = dict(h0=h0, c0=c0, batch_first=batch_first, training=True, engine="reference")
    want = ar.rnn_forward(params, x, lengths=lengths, **kw)
    want_g = ar.rnn_backward(want, dy, dh_n, dc_n)

    got = ar.rnn_forward(params, x, lengths=cf.stand_in_lengths(lengths), **kw)
    zero = lengths == 0
    y, h_n, c_n = got.y.copy(), got.h_n.copy(), None if got.c_n is None else got.c_n.copy()
    assert not np.array_equal(h_n[:, zero], h0[:, zero])  # the stand-in step did change them
    cf.restore_forward(np, zero, y, h_n, c_n, h0, c0, batch_first)
    np.testing.assert_array_equal(y, want.y)
    np.testing.assert_array_equal(h_n, want.h_n)
    if lstm:
        np.testing.assert_array_equal(c_n, want.c_n)
    mdy, mdh, mdc = cf.mask_cotangents(np, zero, dy, dh_n, dc_n, batch_first)
    g = ar.rnn_backward(got, mdy, mdh, mdc)
    dx, dh0, dc0 = g.dx.copy(), g.dh0.copy(), None if g.dc0 is None else g.dc0.copy()
    cf.restore_backward(np, zero, dx, dh0, dc0, dh_n, dc_n, batch_first)
    np.testing.assert_allclose(dx, want_g.dx, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(dh0, want_g.dh0, rtol=1e-12, atol=1e-13)
    if lstm:
        np.testing.assert_allclose(dc0, want_g.dc0, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(g.dparams.data, want_g.dparams.data, rtol=1e-12, atol=1e-13)


def test_stand_in_lengths() -> None:
    out = cf.stand_in_lengths(np.array([0, 3, 0, 1], np.int64))
    assert out.dtype == np.int32 and out.tolist() == [1, 3, 1, 1]


# ---------------------------------------------------------------- without a GPU
def _cupy_missing() -> bool:
    try:
        import cupy  # noqa: F401
    except ImportError:
        return True
    return False


@pytest.mark.skipif(not _cupy_missing(), reason="CuPy is installed; the no-CuPy error cannot be shown")
def test_without_cupy_cudnn_says_what_is_missing() -> None:
    spec = ar.RNNSpec(mode="lstm", input_size=3, hidden_size=4)
    params = ar.PackedParams.init(spec, seed=0, xp=np)
    expected = (r"engine = 'cudnn' cannot be imported \(the cudnn engine needs CuPy .*"
                r"a CUDA GPU, CuPy and libcudnn")
    with pytest.raises(ar.EngineUnavailableError, match=expected):
        params.to_format("cudnn")
    with pytest.raises(ar.EngineUnavailableError, match=expected):
        ar.rnn_forward(params, np.zeros((2, 1, 3), np.float32), engine="cudnn")


# ---------------------------------------------------------------- GPU
GPU_REASON = gpu_reason() or ("CuPy is not installed" if _cupy_missing() else "")
TOLERANCE = {"float64": 1e-9, "float32": 2e-4, "float16": 3e-2}  # max abs error relative to max |ref| + 1


def _compare(spec: ar.RNNSpec, batch_first: bool, lengths, dtype: str, dropout_seed=None) -> None:
    import cupy

    rng = np.random.default_rng(0)
    spec = spec.replace(dtype=dtype)
    params = ar.PackedParams.init(spec, seed=1, xp=cupy)
    t, b = 7, len(lengths)
    lengths = np.asarray(lengths)
    shape = (b, t, spec.input_size) if batch_first else (t, b, spec.input_size)
    valid = (np.arange(t)[None, :] < lengths[:, None]) if batch_first else (np.arange(t)[:, None] < lengths)
    x = cupy.asarray((rng.standard_normal(shape) * valid[..., None]).astype(dtype))
    n = spec.num_layers * spec.num_directions
    h0 = cupy.asarray(rng.standard_normal((n, b, spec.output_size)).astype(dtype))
    c0 = cupy.asarray(rng.standard_normal((n, b, spec.hidden_size)).astype(dtype)) if spec.has_cell else None
    kw = dict(lengths=lengths, h0=h0, c0=c0, batch_first=batch_first, training=True, seed=dropout_seed)
    ref = ar.rnn_forward(params, x, engine="reference", **kw)
    native = params.to_format("cudnn")
    got = ar.rnn_forward(native, x, engine="cudnn", **kw)
    dy = cupy.asarray(rng.standard_normal(ref.y.shape).astype(dtype))
    g_ref, g = ar.rnn_backward(ref, dy), ar.rnn_backward(got, dy)
    tol = TOLERANCE[dtype]
    pairs = [(got.y, ref.y), (got.h_n, ref.h_n), (g.dx, g_ref.dx), (g.dh0, g_ref.dh0),
             (g.dparams.to_format("canonical").data, g_ref.dparams.data)]
    if spec.has_cell:
        pairs += [(got.c_n, ref.c_n), (g.dc0, g_ref.dc0)]
    for a, r in pairs:
        a, r = cupy.asnumpy(a).astype(np.float64), cupy.asnumpy(r).astype(np.float64)
        assert np.max(np.abs(a - r)) <= tol * (1 + np.max(np.abs(r))), spec


@pytest.mark.gpu
@pytest.mark.skipif(bool(GPU_REASON), reason=GPU_REASON or "GPU present")
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_gpu_grid_against_reference(dtype: str, batch_first: bool) -> None:
    for spec in _grid():
        _compare(spec, batch_first, [7, 0, 3, 5], dtype)


@pytest.mark.gpu
@pytest.mark.skipif(bool(GPU_REASON), reason=GPU_REASON or "GPU present")
def test_gpu_dropout_masks_match_reference() -> None:
    spec = ar.RNNSpec(mode="lstm", input_size=5, hidden_size=4, num_layers=3, dropout=0.4)
    _compare(spec, False, [7, 2, 0, 5], "float64", dropout_seed=11)


@pytest.mark.gpu
@pytest.mark.skipif(bool(GPU_REASON), reason=GPU_REASON or "GPU present")
def test_gpu_cell_clip(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check that lifts cf.refusal's clip refusal once it passes on a GPU: cudnnRNNSetClip_v9 (MINMAX)
    against the reference engine's clip (before tanh(c) and before carrying; zero gradient where clipped)."""
    monkeypatch.setattr(cf, "refusal", lambda spec: None)
    spec = ar.RNNSpec(mode="lstm", input_size=5, hidden_size=4, num_layers=2, bidirectional=True,
                      cell_clip=(-0.3, 0.2))
    _compare(spec, False, [7, 0, 3, 5], "float64")


@pytest.mark.gpu
@pytest.mark.skipif(bool(GPU_REASON), reason=GPU_REASON or "GPU present")
def test_gpu_adam_step_on_cudnn_format_equals_canonical() -> None:
    import cupy

    spec = ar.RNNSpec(mode="gru", input_size=5, hidden_size=4, num_layers=2, dtype="float64")
    canonical = ar.PackedParams.init(spec, seed=2, xp=cupy)
    native = canonical.to_format("cudnn")
    grads = canonical.zeros_like()
    grads.data[...] = cupy.asarray(np.random.default_rng(0).standard_normal(grads.data.size))
    ar.optim.Adam(canonical, lr=0.1).step(grads)
    ar.optim.Adam(native, lr=0.1).step(grads.to_format("cudnn"))
    cupy.testing.assert_array_equal(native.to_format("canonical").data, canonical.data)


def test_layer_to_format_converts_in_place() -> None:
    layer = ar.nn.LSTM(3, 4, dtype="float64")
    before = layer.params
    assert layer.to_format("canonical") is layer and layer.params is before
    if _cupy_missing():
        with pytest.raises(ar.EngineUnavailableError, match="the cudnn engine needs CuPy"):
            layer.to_format("cudnn")
        assert layer.params is before  # unchanged after the refusal


@pytest.mark.gpu
@pytest.mark.skipif(bool(GPU_REASON), reason=GPU_REASON or "GPU present")
def test_gpu_layer_holds_cudnn_params() -> None:
    import cupy

    layer = ar.nn.GRU(5, 4, xp=cupy, dtype="float64")
    canonical = layer.params
    x = cupy.asarray(np.random.default_rng(0).standard_normal((9, 2, 5)))
    want = ar.rnn_forward(canonical, x, engine="reference").y
    layer.to_format("cudnn")
    assert layer.params.format == "cudnn"
    cupy.testing.assert_allclose(layer(x)[0], want, rtol=1e-10, atol=1e-12)


def test_check_answers_each_call() -> None:
    import types

    from arrayrnn.engines.base import Call

    fake_cupy = types.ModuleType("cupy")
    spec = ar.RNNSpec(mode="lstm", input_size=3, hidden_size=4)

    def call(**over):
        fields = dict(spec=spec, xp=fake_cupy, device=0, seq_len=cf.AUTO_MIN_SEQ_LEN, batch=2, training=True,
                      dropout=False, params_format="canonical", has_zero_length=True, explicit=False)
        return Call(**{**fields, **over})

    assert cf.check(call()) is None
    assert "NumPy arrays" in cf.check(call(xp=np))
    short = cf.check(call(seq_len=cf.AUTO_MIN_SEQ_LEN - 1))
    assert short.startswith(f"T = {cf.AUTO_MIN_SEQ_LEN - 1} is below cuDNN's threshold")
    assert cf.check(call(seq_len=2, explicit=True)) is None
    assert cf.check(call(seq_len=2, params_format="cudnn")) is None
    gru = ar.RNNSpec(mode="gru", input_size=3, hidden_size=4, reset_after=False)
    assert "reset-before GRU" in cf.check(call(spec=gru, explicit=True))
