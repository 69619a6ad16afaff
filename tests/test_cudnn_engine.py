"""The cuDNN engine's host-side parts on CPU; the engine on a GPU (marker ``gpu``).

CPU (CI): descriptor configurations of a grid of specs round-trip through cuDNN (with their math types); the
canonical <-> cudnn index map built from cuDNN's real answers (in a subprocess:
tests/support/cudnn_index_probe.py) is bit-exact both ways, and so is the layer-by-layer map composed from it;
the padding / empty-row masks give the reference engine's semantics with hostile inputs; ``check`` asks the
bindings whether libcudnn loads; without CuPy ``engine="cudnn"`` and ``to_format("cudnn")`` say what is
missing. The whole engine runs without a GPU in tests/test_cudnn_dry_run.py.

GPU: the dry run's checks (tests/support/cudnn_cases.py) on real CuPy and cuDNN.
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
from support.cudnn_cases import GRID, check

import arrayrnn as ar
import cudnn_bindings as cb
from arrayrnn.engines import thresholds
from arrayrnn.engines.cudnn import config as cf
from arrayrnn.engines.cudnn import padding, weight_map

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
        assert config.math_type == {"float16": cb.MathType.TENSOR_OP_MATH, "float32": cb.MathType.FMA_MATH,
                                    "float64": cb.MathType.DEFAULT_MATH}[dtype]
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
    idx = weight_map.index_map(spec, 4, nbytes, query)
    assert sorted(idx.tolist()) == list(range(idx.size))
    wrong_dims = cb.WeightRegion(0, (1, 2, 5), (10, 5, 1), cb.DataType.FLOAT)
    with pytest.raises(ValueError, match=r"pseudo-layer 0, linLayerID 1, matrix \(l0.fwd.W_ih\) as dims"):
        weight_map.index_map(spec, 4, nbytes, _fake_query_with(spec, (0, 1, "matrix"), wrong_dims))
    overlapping = cb.WeightRegion(0, (1, 2, 3), (6, 3, 1), cb.DataType.FLOAT)
    with pytest.raises(ValueError, match="overlapping"):
        weight_map.index_map(spec, 4, nbytes, _fake_query_with(spec, (0, 1, "matrix"), overlapping))
    outside = cb.WeightRegion(nbytes, (1, 2, 3), (6, 3, 1), cb.DataType.FLOAT)
    with pytest.raises(ValueError, match="outside the"):
        weight_map.index_map(spec, 4, nbytes, _fake_query_with(spec, (0, 1, "matrix"), outside))
    with pytest.raises(ValueError, match=r"no region for pseudo-layer 0, linLayerID 3, bias \(l0.fwd.b_hh\)"):
        weight_map.index_map(spec, 4, nbytes, _fake_query_with(spec, (0, 3, "bias"), None))


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
    assert "also clips c0 on entry" in cf.refusal(
        ar.RNNSpec(mode="lstm", input_size=2, hidden_size=2, cell_clip=1.0))
    assert cf.refusal(ar.RNNSpec(mode="lstm", input_size=2, hidden_size=3, proj_size=2)) is None


# ---------------------------------------------------------------- padding and empty rows (pure, on NumPy)
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_row_masks_give_the_contract_with_hostile_inputs(mode: str, batch_first: bool) -> None:
    """Run the reference engine as cuDNN would (empty rows as one step, from what ``Rows`` lets in), apply
    ``Rows``' restorations, and compare with the reference engine's own semantics, bit for bit where the
    contract fixes values: inf/NaN in the padding of dy and in h0/c0 of empty rows must not leak."""
    spec = ar.RNNSpec(mode=mode, input_size=3, hidden_size=4, num_layers=2, bidirectional=True,
                      dtype="float64")
    rng = np.random.default_rng(1)
    params = ar.PackedParams.init(spec, seed=3, xp=np)
    t, b, lstm = 5, 4, mode == "lstm"
    lengths = np.array([3, 0, 5, 0])
    valid = np.arange(t)[:, None] < lengths
    valid = (valid.T if batch_first else valid)[..., None]
    x = np.where(valid, rng.standard_normal((b, t, 3) if batch_first else (t, b, 3)), np.nan)
    h0 = rng.standard_normal((4, b, 4))
    h0[:, lengths == 0] = np.inf
    c0 = rng.standard_normal((4, b, 4)) if lstm else None
    if lstm:
        c0[:, lengths == 0] = np.nan
    dy = np.where(valid, rng.standard_normal(x.shape[:2] + (8,)), np.inf)
    dh_n = rng.standard_normal((4, b, 4))
    dc_n = rng.standard_normal((4, b, 4)) if lstm else None
    kw = dict(batch_first=batch_first, training=True, engine="reference")
    want = ar.rnn_forward(params, x, lengths, h0, c0, **kw)
    want_g = ar.rnn_backward(want, dy, dh_n, dc_n)

    rows = padding.Rows.of(np, lengths, t, batch_first)
    h0_in, c0_in = rows.states_in(np, h0, c0)
    assert np.isfinite(h0_in).all() and (c0_in is None or np.isfinite(c0_in).all())
    x_in = np.where(valid, x, 0.0)  # the engine's input: zero at the padding of the true lengths
    got = ar.rnn_forward(params, x_in, padding.stand_in_lengths(lengths), h0_in, c0_in, **kw)
    assert not np.array_equal(got.h_n[:, lengths == 0], h0_in[:, lengths == 0])  # the stand-in step ran
    y, h_n, c_n = rows.forward_out(np, got.y, got.h_n, got.c_n, h0, c0)
    np.testing.assert_array_equal(y, want.y)
    np.testing.assert_array_equal(h_n, want.h_n)
    if lstm:
        np.testing.assert_array_equal(c_n, want.c_n)
    g = ar.rnn_backward(got, *rows.cotangents_in(np, dy, dh_n, dc_n))
    dx, dh0, dc0 = rows.backward_out(np, g.dx, g.dh0, g.dc0, dh_n, dc_n)
    np.testing.assert_allclose(dx, want_g.dx, rtol=1e-12, atol=1e-13)
    np.testing.assert_array_equal(dh0[:, lengths == 0], dh_n[:, lengths == 0])
    np.testing.assert_allclose(dh0, want_g.dh0, rtol=1e-12, atol=1e-13)
    if lstm:
        np.testing.assert_allclose(dc0, want_g.dc0, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(g.dparams.data, want_g.dparams.data, rtol=1e-12, atol=1e-13)


def test_rows_without_padding_or_empty_rows_touch_nothing() -> None:
    rows = padding.Rows.of(np, np.array([4, 4]), 4, batch_first=False)
    assert rows.valid is None and rows.empty is None
    y, dy = np.full((4, 2, 3), np.nan), np.full((4, 2, 3), np.inf)
    assert rows.forward_out(np, y, y, None, y, None)[0] is y
    assert rows.cotangents_in(np, dy, dy, None)[0] is dy


def test_stand_in_lengths() -> None:
    out = padding.stand_in_lengths(np.array([0, 3, 0, 1], np.int64))
    assert out.dtype == np.int32 and out.tolist() == [1, 3, 1, 1]


# ---------------------------------------------------------------- layer by layer (dropout): one gather
@pytest.mark.parametrize("mode, bidir", [("lstm", True), ("gru", False)])
def test_layer_maps_compose_the_whole_stacks_map_with_each_layers(mode: str, bidir: bool) -> None:
    spec = ar.RNNSpec(mode=mode, input_size=3, hidden_size=2, num_layers=3, bidirectional=bidir,
                      dtype="float64")
    whole_query, whole_bytes = _fake_query(spec, 8)
    whole_idx = weight_map.index_map(spec, 8, whole_bytes, whole_query)
    layers = []
    for layer in range(spec.num_layers):
        sub = cf.layer_spec(spec, layer)
        query, nbytes = _fake_query(sub, 8)
        layers.append((weight_map.index_map(sub, 8, nbytes, query), nbytes // 8))
    maps = weight_map.layer_maps(spec, whole_idx, whole_bytes // 8, [i for i, _ in layers],
                                 [n for _, n in layers], 8)
    assert all(off * 8 % weight_map.WEIGHT_ALIGN_BYTES == 0 for off in maps.offsets)
    canonical = np.random.default_rng(0).standard_normal(whole_idx.size)
    whole = weight_map.to_cudnn(np, canonical, whole_idx, whole_bytes // 8)
    stacked = whole[maps.gather]
    stacked[maps.holes] = 0
    layout, last = ar.layout_of(spec), spec.num_directions - 1
    for layer, ((idx, size), off) in enumerate(zip(layers, maps.offsets, strict=True)):
        start, stop = layout.layer_direction_span(layer, 0)[0], layout.layer_direction_span(layer, last)[1]
        np.testing.assert_array_equal(weight_map.to_canonical(stacked[off:off + size], idx),
                                      canonical[start:stop])
    assert maps.holes.size and not stacked[maps.holes].any()  # alignment gaps between the layers
    grads = np.append(stacked, 0.0)  # the extra zero element the whole stack's holes read
    np.testing.assert_array_equal(grads[maps.back], whole)
    assert {a.dtype for a in (whole_idx, maps.gather, maps.holes, maps.back)} == {np.dtype(np.int32)}


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
# The dry run's checks (tests/support/cudnn_cases.py: hostile padding, inf/NaN states of empty rows, non-zero
# dh_n/dc_n, results kept on the device) on real CuPy and cuDNN.
GPU_REASON = gpu_reason() or ("CuPy is not installed" if _cupy_missing() else "")
needs_gpu = pytest.mark.skipif(bool(GPU_REASON), reason=GPU_REASON or "GPU present")


def _cupy():
    import cupy

    return cupy


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("batch_first", [False, True], ids=["time-major", "batch-major"])
def test_gpu_grid_against_reference(dtype: str, batch_first: bool) -> None:
    """float32 within 2e-4: also shows FMA math (TF32 would be about 1e-3 off)."""
    for spec in GRID:
        check(_cupy(), spec, batch_first=batch_first, dtype=dtype)


@pytest.mark.gpu
@needs_gpu
def test_gpu_batch_major_without_padding() -> None:
    for spec in GRID:
        check(_cupy(), spec, lengths=[5, 5, 5], batch_first=True)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("batch_first", [False, True], ids=["time-major", "batch-major"])
def test_gpu_dropout_masks_match_reference(batch_first: bool) -> None:
    spec = ar.RNNSpec(mode="lstm", input_size=3, hidden_size=5, num_layers=3, bidirectional=True,
                      proj_size=3, dropout=0.4, dtype="float64")
    check(_cupy(), spec, batch_first=batch_first, seed=11)


@pytest.mark.gpu
@needs_gpu
def test_gpu_long_sequences_through_auto() -> None:
    spec = ar.RNNSpec(mode="gru", input_size=3, hidden_size=6, num_layers=2, bidirectional=True,
                      dtype="float64")
    T = thresholds.AUTO_MIN_SEQ_LEN + 1
    assert check(_cupy(), spec, lengths=[T, 0, 4, T - 3], engine="auto")["engine"] == "cudnn"


def _clip_case(spec: ar.RNNSpec, lengths: list[int], states: bool, seed: int = 0):
    """params (scaled so the cell state leaves a small clip range), x, h0, c0 (N(0, 1): outside it), dy."""
    rng = np.random.default_rng(seed)
    params = ar.PackedParams.init(spec, seed=3)
    params.data[...] *= 3
    T, B, d = max(lengths), len(lengths), spec.num_directions * spec.num_layers
    x = 2 * rng.standard_normal((T, B, spec.input_size))
    h0, c0 = ((rng.standard_normal((d, B, spec.hidden_size)) for _ in range(2)) if states else (None, None))
    dy = rng.standard_normal((T, B, spec.num_directions * spec.hidden_size))
    return params, x, np.array(lengths), h0, c0, dy


@pytest.mark.gpu
@needs_gpu
def test_gpu_cell_clip_is_cudnns_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why cf.refusal keeps refusing cell_clip. Measured on an H200 with cuDNN 9.19: cudnnRNNSetClip_v9
    (MINMAX) clips the cell state where the reference engine does (after each update, before tanh and
    before carrying; zero gradient where clipped), but it also clips ``cx`` on entry and returns the
    PRE-clip ``cy``. Pinned here: if a cuDNN stops doing so, revisit the refusal. (-0.25, 0.25) is exact in
    float32, in which cuDNN keeps the bounds.)"""
    cupy = _cupy()
    monkeypatch.setattr(cf, "refusal", lambda spec: None)
    lo, hi = -0.25, 0.25
    spec = ar.RNNSpec(mode="lstm", input_size=3, hidden_size=5, num_layers=2, bidirectional=True,
                      cell_clip=(lo, hi), dtype="float64")
    params, x, lengths, h0, c0, _ = _clip_case(spec, [6, 0, 2, 4], states=True)
    native = params.to(cupy).to_format("cudnn")
    got = ar.rnn_forward(native, cupy.asarray(x), lengths, cupy.asarray(h0), cupy.asarray(c0), engine="cudnn")
    y, h_n, c_n = (cupy.asnumpy(a) for a in (got.y, got.h_n, got.c_n))
    entry = ar.rnn_forward(params, x, lengths, h0, np.clip(c0, lo, hi), engine="reference")
    np.testing.assert_allclose(y, entry.y, rtol=0, atol=1e-12)
    np.testing.assert_allclose(h_n, entry.h_n, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.clip(c_n, lo, hi), entry.c_n, rtol=0, atol=1e-12)
    ran = c_n[:, lengths > 0]  # (an empty row's c_n is its c0, passed through by the engine)
    assert ((ran < lo) | (ran > hi)).any()  # cuDNN's cy is the state before its last clip
    plain = ar.rnn_forward(params, x, lengths, h0, c0, engine="reference")
    assert np.abs(y - plain.y).max() > 1e-3  # the reference does not clip c0


@pytest.mark.gpu
@needs_gpu
def test_gpu_cell_clip_gradients_match_from_zero_states(monkeypatch: pytest.MonkeyPatch) -> None:
    """With zero initial states and a cotangent on y only (so neither difference above shows), cuDNN's
    clipped gradients are the reference's."""
    cupy = _cupy()
    monkeypatch.setattr(cf, "refusal", lambda spec: None)
    spec = ar.RNNSpec(mode="lstm", input_size=3, hidden_size=5, num_layers=2, cell_clip=(-0.25, 0.25),
                      dtype="float64")
    params, x, lengths, _, _, dy = _clip_case(spec, [6, 6, 6, 6], states=False)
    want = ar.rnn_forward(params, x, lengths, training=True, engine="reference")
    g_want = ar.rnn_backward(want, dy)
    native = params.to(cupy).to_format("cudnn")
    got = ar.rnn_forward(native, cupy.asarray(x), lengths, training=True, engine="cudnn")
    g = ar.rnn_backward(got, cupy.asarray(dy))
    np.testing.assert_allclose(cupy.asnumpy(got.y), want.y, rtol=0, atol=1e-12)
    np.testing.assert_allclose(cupy.asnumpy(g.dx), g_want.dx, rtol=0, atol=1e-12)
    np.testing.assert_allclose(cupy.asnumpy(g.dparams.to_format("canonical").data), g_want.dparams.data,
                               rtol=0, atol=1e-12)
    np.testing.assert_allclose(cupy.asnumpy(g.dc0), g_want.dc0, rtol=0, atol=1e-12)
    assert (g_want.dparams.data != 0).any()


@pytest.mark.gpu
@needs_gpu
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


def test_layer_to_format_refuses_cudnn_without_cupy() -> None:
    """The conversion itself: test_cudnn_dry_run.py::test_layer_to_format_converts_the_layer_in_place."""
    layer = ar.nn.LSTM(3, 4, dtype="float64")
    before = layer.params
    assert layer.to_format("canonical") is layer and layer.params is before
    if _cupy_missing():
        with pytest.raises(ar.EngineUnavailableError, match="the cudnn engine needs CuPy"):
            layer.to_format("cudnn")
        assert layer.params is before  # unchanged after the refusal


@pytest.mark.gpu
@needs_gpu
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
        fields = dict(spec=spec, xp=fake_cupy, device=0, seq_len=thresholds.AUTO_MIN_SEQ_LEN, batch=2,
                      training=True, params_format="canonical", has_zero_length=True,
                      explicit=False)
        return Call(**{**fields, **over})

    assert cf.check(call()) is None
    assert "NumPy arrays" in cf.check(call(xp=np))
    short = cf.check(call(seq_len=thresholds.AUTO_MIN_SEQ_LEN - 1))
    assert short.startswith(f"T = {thresholds.AUTO_MIN_SEQ_LEN - 1} is below cuDNN's threshold")
    assert cf.check(call(seq_len=2, explicit=True)) is None
    assert cf.check(call(seq_len=2, params_format="cudnn")) is None
    gru = ar.RNNSpec(mode="gru", input_size=3, hidden_size=4, reset_after=False)
    assert "reset-before GRU" in cf.check(call(spec=gru, explicit=True))


def test_check_asks_the_bindings_whether_libcudnn_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where libcudnn cannot load, neither "auto" nor a named "cudnn" takes the call, and the reason is the
    bindings' own (which places were searched)."""
    import types

    from arrayrnn.engines.base import Call

    def missing() -> int:
        raise cb.CudnnLibraryError("no libcudnn.so.9; searched: $CUDNN_PATH (unset), the wheel (absent)")

    monkeypatch.setattr(cb, "version", missing)
    spec = ar.RNNSpec(mode="lstm", input_size=3, hidden_size=4)
    for explicit in (False, True):
        call = Call(spec=spec, xp=types.ModuleType("cupy"), device=0, seq_len=64, batch=2, training=False,
                    params_format="cudnn", has_zero_length=False, explicit=explicit)
        assert cf.check(call) == ("libcudnn cannot be loaded (no libcudnn.so.9; searched: $CUDNN_PATH "
                                  "(unset), the wheel (absent))")


def test_precision_fma_for_float32_unless_tf32_is_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = ar.RNNSpec(mode="gru", input_size=3, hidden_size=4)
    assert cf.rnn_config(spec, "float32").math_type == cb.MathType.FMA_MATH
    assert cf.rnn_config(spec, "float16").math_type == cb.MathType.TENSOR_OP_MATH
    assert cf.rnn_config(spec, "float64").math_type == cb.MathType.DEFAULT_MATH
    assert cf.rnn_config(spec, "float32", tf32=True).math_type == cb.MathType.DEFAULT_MATH
    monkeypatch.setattr(cf, "allow_tf32", True)  # the documented switch, read at every call
    assert cf.rnn_config(spec, "float32").math_type == cb.MathType.DEFAULT_MATH
    assert cf.rnn_config(spec, "float16").math_type == cb.MathType.TENSOR_OP_MATH
