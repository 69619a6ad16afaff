"""select_engine (the one place choosing an engine), the stack driver's float16 path, and the documented
size of the residual cache."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import ENGINES
from support.rnn_cases import make_case

from arrayrnn import EngineUnavailableError, PackedParams, RNNSpec, engines, rnn_forward
from arrayrnn.engines import engine_unavailable_reason, load_engine, probe_call, select_engine
from arrayrnn.engines.batch_order import BatchOrder

SPEC = RNNSpec(mode="lstm", input_size=3, hidden_size=4, dtype="float64")


def test_reference_is_always_available():
    assert "reference" in ENGINES
    assert select_engine("reference", probe_call(SPEC)).name == "reference"


def test_unknown_engine_lists_the_names():
    with pytest.raises(ValueError, match=r"engine = 'mkl'; expected one of \('auto', 'reference', 'numba'"):
        select_engine("mkl", probe_call(SPEC))


@pytest.mark.parametrize("name", ["cupy", "cudnn"])
def test_gpu_engines_cannot_run_numpy_arrays(name):
    with pytest.raises(EngineUnavailableError, match=rf"engine = '{name}'"):
        select_engine(name, probe_call(SPEC))


def test_auto_on_cpu_picks_numba_when_available_else_reference():
    expected = "numba" if engine_unavailable_reason("numba", probe_call(SPEC)) is None else "reference"
    assert select_engine("auto", probe_call(SPEC)).name == expected


def test_missing_engine_module_is_unavailable_and_auto_falls_back(monkeypatch):
    record = replace(engines.REGISTRY["numba"], source="arrayrnn.engines._not_installed")
    monkeypatch.setitem(engines.REGISTRY, "numba", record)
    message = r"engine = 'numba' is not part of this installation \(module arrayrnn.engines._not_installed"
    with pytest.raises(EngineUnavailableError, match=message):
        load_engine("numba")
    assert select_engine("auto", probe_call(SPEC)).name == "reference"
    assert "numba" not in engines.available_engines(SPEC)


def test_engine_whose_dependency_is_missing_names_it(monkeypatch, tmp_path):
    package = tmp_path / "fake_engines"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "broken.py").write_text("import numba_that_is_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    record = replace(engines.REGISTRY["numba"], source="fake_engines.broken")
    monkeypatch.setitem(engines.REGISTRY, "numba", record)
    message = r"engine = 'numba' cannot be imported .*numba_that_is_not.*it needs the numba package"
    with pytest.raises(EngineUnavailableError, match=message):
        select_engine("numba", probe_call(SPEC))


def test_a_module_without_an_engine_is_unavailable(monkeypatch, tmp_path):
    (tmp_path / "no_engine_here.py").write_text("ENGINE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    engines.register_engine("empty", "no_engine_here")
    try:
        with pytest.raises(EngineUnavailableError, match=r"engine = 'empty': module no_engine_here has no "
                                                         r"ENGINE .*it has int"):
            select_engine("empty", probe_call(SPEC))
        assert "empty" not in engines.available_engines(SPEC)
    finally:
        engines.unregister_engine("empty")


@pytest.mark.parametrize("name", ["reference", "numba", "cupy", "cudnn"])
def test_built_in_engines_cannot_be_replaced_or_removed(name):
    before = engines.REGISTRY[name]
    with pytest.raises(ValueError, match=rf"name = '{name}' is a built-in engine; register yours under"):
        engines.register_engine(name, "somewhere.else")
    with pytest.raises(ValueError, match=rf"name = '{name}' is a built-in engine; only registered"):
        engines.unregister_engine(name)
    assert engines.REGISTRY[name] is before


@pytest.mark.parametrize("devices, message", [
    (("tpu",), r"devices = \('tpu',\); expected a non-empty tuple drawn from \('cpu', 'gpu'\)"),
    ((), r"devices = \(\); expected a non-empty tuple"),
    ("cpu", r"devices = 'cpu'; expected a non-empty tuple"),
])
def test_register_engine_checks_the_devices(devices, message):
    with pytest.raises(ValueError, match=message):
        engines.register_engine("mine", "somewhere.else", devices=devices)
    assert "mine" not in engines.REGISTRY


def test_auto_order_is_the_ranks_of_the_records():
    assert engines.auto_order("cpu") == ("numba", "reference")
    assert engines.auto_order("gpu") == ("cudnn", "cupy", "reference")
    engines.register_engine("first", load_engine("reference"), auto_rank=0)
    try:
        assert engines.auto_order("cpu") == ("first", "numba", "reference")
        assert engines.auto_order("gpu") == ("cudnn", "cupy", "reference")
    finally:
        engines.unregister_engine("first")


def test_canonical_is_not_an_engine_format():
    with pytest.raises(ValueError, match=r"format = 'canonical' belongs to no engine: every engine reads it"):
        engines.engine_for_format("canonical")


def test_float16_runs_with_float32_math_in_the_driver():
    """float16 is GPU-only in rnn_forward; the driver's float16 path (upcast once, cast back) is array
    generic, so it is checked here on NumPy arrays against the float32 run of the same rounded inputs."""
    spec16 = RNNSpec(mode="gru", input_size=3, hidden_size=4, num_layers=2, bidirectional=True,
                     dtype="float16")
    case = make_case(spec16.replace(dtype="float32"), 5, 3)
    order = BatchOrder.from_lengths(np.asarray(case.lengths), 5)
    x16, h16 = order.sort(case.x).astype(np.float16), order.sort(case.h0).astype(np.float16)
    x16 = np.where(order.active(np), x16, 0).astype(np.float16)
    p16 = PackedParams(spec16, case.params.data.astype(np.float16))
    engine = load_engine("reference")
    out16 = engine.forward_sorted(p16, x16, order.batch_sizes, h16, None, None, keep_cache=True)
    out32 = engine.forward_sorted(p16.astype("float32"), x16.astype(np.float32), order.batch_sizes,
                                  h16.astype(np.float32), None, None, keep_cache=True)
    assert out16.y.dtype == np.float16 and out16.h_n.dtype == np.float16
    np.testing.assert_array_equal(out16.y, out32.y.astype(np.float16))
    dy = order.sort(case.dy).astype(np.float16)
    g16 = engine.backward_sorted(out16.cache, dy, np.zeros_like(h16), None)
    g32 = engine.backward_sorted(out32.cache, dy.astype(np.float32), np.zeros_like(h16, dtype=np.float32),
                                 None)
    assert g16.dparams.spec == spec16 and g16.dparams.data.dtype == np.float16 and g16.dx.dtype == np.float16
    np.testing.assert_array_equal(g16.dparams.data, g32.dparams.data.astype(np.float16))


@pytest.mark.parametrize("fields, per_step", [
    (dict(mode="rnn_tanh"), 0),
    (dict(mode="gru"), 4),
    (dict(mode="gru", reset_after=False), 3),
    (dict(mode="lstm"), 6),
    (dict(mode="lstm", proj_size=2), 6),
])
def test_residual_cache_size_is_as_documented(fields, per_step):
    """Bytes per step and row of one direction's residuals: 0 / 4H / 3H / 6H elements (base.py's table)."""
    spec = RNNSpec(input_size=3, hidden_size=5, num_layers=2, bidirectional=True, dtype="float32", **fields)
    x = np.ones((3, 2, 3), np.float32)
    res = rnn_forward(PackedParams.init(spec), x, training=True, engine="reference")
    for layer in res._saved.cache.layers:
        for fwd in layer:
            assert fwd.cache.nbytes_per_step_row() == per_step * spec.hidden_size * 4
            assert fwd.y.shape == (3, 2, spec.output_size)


# every block kind and how the backward writes it: biases on and off, both GRUs, projection, peepholes, layer
# norm (with and without a cell), DropConnect and the other masks, two layers and two directions (the test
# adds padded rows, and rows of length 0)
GRADIENT_BLOCK_CASES = [
    dict(mode="lstm", num_layers=2, bidirectional=True),
    dict(mode="lstm", bias=False, proj_size=2, peepholes=True),
    dict(mode="lstm", layer_norm=True, peepholes=True, weight_dropout=0.3, recurrent_dropout=0.3),
    dict(mode="lstm", zoneout=0.3, zoneout_cell=0.2, proj_size=2, bidirectional=True),
    dict(mode="gru", num_layers=2, dropout=0.3),
    dict(mode="gru", reset_after=False, bidirectional=True, weight_dropout=0.2),
    dict(mode="gru", layer_norm=True, bias=False),
    dict(mode="gru", layer_norm=True, zoneout=0.3),
    dict(mode="rnn_tanh", layer_norm=True, num_layers=2),
    dict(mode="rnn_relu", bias=False, recurrent_dropout=0.4),
]


@pytest.mark.parametrize("engine", ["reference", "numba"])
@pytest.mark.parametrize("fields", GRADIENT_BLOCK_CASES,
                         ids=lambda fields: "-".join(f"{k}={v}" for k, v in fields.items()))
def test_the_backward_writes_every_block_of_its_uninitialised_gradient_buffer(engine, fields, monkeypatch):
    """The backward's gradient buffer is not initialised (:func:`.stack.gradient_buffer`): filled with NaN
    first, every variant's gradients come out finite and bit for bit those of a zeroed buffer, so no block is
    left unwritten (a missed one would be NaN here, and garbage for a user)."""
    from arrayrnn import rnn_backward
    from arrayrnn.engines import stack

    spec = RNNSpec(input_size=3, hidden_size=4, dtype="float64", **fields)
    T, B, out = 5, 3, spec.output_size * spec.num_directions
    rng = np.random.default_rng(7)
    params = PackedParams.init(spec, seed=7)
    x, dy = rng.standard_normal((T, B, 3)), rng.standard_normal((T, B, out))

    def gradients(fill: float, lengths: np.ndarray) -> np.ndarray:
        made = stack.gradient_buffer

        def filled(spec_, xp):
            buffer = made(spec_, xp)
            buffer.data.fill(fill)
            return buffer

        with monkeypatch.context() as patch:
            patch.setattr(stack, "gradient_buffer", filled)
            res = rnn_forward(params, x, lengths, training=True, seed=3, engine=engine)
            return rnn_backward(res, dy).dparams.data

    for lengths in (np.array([5, 2, 4]), np.array([0, 0, 0])):  # padded rows; no step active at all
        poisoned, zeroed = gradients(np.nan, lengths), gradients(0.0, lengths)
        assert np.isfinite(poisoned).all(), f"unwritten entries: {np.flatnonzero(~np.isfinite(poisoned))}"
        assert poisoned.tobytes() == zeroed.tobytes()
