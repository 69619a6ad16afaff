"""Custom cells on the numba engine (arrayrnn/engines/numba/custom_loops.py, cell_overloads.py): the
built-ins' twins give the built-in numba loops' bits, CIFG against the reference engine and float64 central
differences, cells numba refuses, ``engine="auto"``, the cell step, a cell replaced under its name.

Each cell's loops compile once per process and dtype (seconds): the tests share cells and keep shapes small.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from support.twin_cells import TWINS, outputs_and_grads, twin_params

import arrayrnn as ar
from arrayrnn import cellmath as cm
from arrayrnn.cells import cifg  # noqa: F401 - registers mode "cifg"
from arrayrnn.core.cell_registry import CellDefinitionError
from arrayrnn.engines import forget_choices, numba_cache
from arrayrnn.engines.numba import bundles, cell_overloads, custom_loops
from arrayrnn.engines.numba.simd_ir import MAX_NV

pytest.importorskip("numba")
import numba  # noqa: E402

VARIANT = {"recurrent_dropout": 0.3, "weight_dropout": 0.2, "dropout": 0.25}


def _run(params, x, lengths, training, engine="numba", seed=11, **options):
    return outputs_and_grads(params, x, lengths, training, engine, seed, **options)


def _assert_same_bits(builtin, twin):
    for k, (a, b) in enumerate(zip(builtin, twin, strict=True)):
        assert (a is None) == (b is None), k
        if a is not None:
            assert a.dtype == b.dtype and np.array_equal(a, b), (k, float(np.max(np.abs(a - b))))


# -- cellmath compiled --------------------------------------------------------------------------------
def test_every_cellmath_function_has_an_overload():
    assert cell_overloads.OVERLOADED == set(cm.__all__)


@numba.njit
def _all_math(x):
    return (cm.sigmoid(x), cm.tanh(x), cm.relu(x), cm.dsigmoid(x), cm.dtanh(x), cm.drelu(x), cm.step(x),
            cm.exp(x), cm.log(abs(x)), cm.sqrt(abs(x)), cm.logsigmoid(x), cm.maximum(x, 0.0),
            cm.minimum(x, 0), cm.where(x > 0, x, 0.0))


@pytest.mark.parametrize("dtype, rtol", [("float64", 1e-14), ("float32", 3e-6)])
def test_compiled_cellmath_agrees_with_cellmath_and_keeps_the_dtype(dtype, rtol):
    for value in (-3.5, -0.3, 0.2, 2.75):
        x = np.dtype(dtype).type(value)
        compiled = _all_math(x)
        expected = (cm.sigmoid(x), cm.tanh(x), cm.relu(x), cm.dsigmoid(x), cm.dtanh(x), cm.drelu(x),
                    cm.step(x), cm.exp(x), cm.log(abs(x)), cm.sqrt(abs(x)), cm.logsigmoid(x),
                    cm.maximum(x, 0.0), cm.minimum(x, 0), cm.where(x > 0, x, 0.0))
        for k, (got, want) in enumerate(zip(compiled, expected, strict=True)):
            np.testing.assert_allclose(float(got), float(want), rtol=rtol, atol=1e-30, err_msg=str(k))
    real = numba.from_dtype(np.dtype(dtype))
    returned = _all_math.overloads[(real,)].signature.return_type
    assert returned == numba.types.UniTuple(real, 14)  # a float64 literal does not promote float32
    nan = _all_math(np.float64(np.nan))
    assert math.isnan(nan[11]) and math.isnan(nan[12])  # maximum / minimum propagate NaN


# -- the twins: the built-in numba loops' bits -------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("mode", list(TWINS))
def test_twins_give_the_builtin_numba_bits(mode, dtype, threads):
    spec = ar.RNNSpec(mode, input_size=5, hidden_size=6, num_layers=2, bidirectional=True, dtype=dtype)
    params = ar.PackedParams.init(spec, seed=3)
    rng = np.random.default_rng(1)
    for n_threads, B, variant in ((1, 4, {}), (1, 4, VARIANT), (2, 24, VARIANT)):
        threads(n_threads)
        x = rng.standard_normal((7, B, 5)).astype(dtype)
        lengths = np.array([7, 0, 2, 5] * (B // 4))
        p = ar.PackedParams(spec.replace(**variant), params.data)
        for training in (False, True):
            builtin = _run(p, x, lengths, training)
            twin = _run(twin_params(p), x, lengths, training)
            _assert_same_bits(builtin, twin)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_twins_give_the_builtin_bits_with_all_states_and_no_cache(mode):
    spec = ar.RNNSpec(mode, input_size=3, hidden_size=5, num_layers=2, dtype="float32")
    params = ar.PackedParams.init(spec, seed=4)
    x = np.random.default_rng(2).standard_normal((6, 3, 3)).astype(np.float32)
    lengths = np.array([6, 3, 0])
    for training in (False, True):
        builtin = _run(params, x, lengths, training, return_all_states=True)
        twin = _run(twin_params(params), x, lengths, training, return_all_states=True)
        _assert_same_bits(builtin, twin)


def test_twin_cell_step_gives_the_builtin_bits():
    spec = ar.RNNSpec("lstm", input_size=3, hidden_size=5, dtype="float32")
    params = ar.PackedParams.init(spec, seed=5)
    rng = np.random.default_rng(3)
    x, h, c = (rng.standard_normal((2, n)).astype(np.float32) for n in (3, 5, 5))
    results = []
    for p in (params, twin_params(params)):
        step = ar.cell_step(p, x, h, c, training=True, engine="numba")
        g = ar.cell_step_backward(step, dh=np.ones_like(step.h), dc=np.ones_like(step.c))
        results.append((step.h, step.c, g.dx, g.dh, g.dc, g.dparams.data))
    _assert_same_bits(*results)


# -- CIFG ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype, rtol", [("float32", 2e-5), ("float64", 1e-12)])
def test_cifg_on_numba_agrees_with_the_reference_engine(dtype, rtol):
    spec = ar.RNNSpec("cifg", input_size=4, hidden_size=6, num_layers=2, bidirectional=True, dtype=dtype,
                      recurrent_dropout=0.2)
    params = ar.PackedParams.init(spec, seed=8)
    x = np.random.default_rng(5).standard_normal((5, 4, 4)).astype(dtype)
    lengths = np.array([5, 1, 0, 4])
    numba_out = _run(params, x, lengths, True, return_all_states=True)
    reference = _run(params, x, lengths, True, engine="reference", return_all_states=True)
    for a, b in zip(numba_out, reference, strict=True):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol)


# -- other shapes of cells: three states, more gates than a tile, a split gate -----------------------
def _wide_forward(a, b, c, d, e, h, u, v):
    a, b, c, d, e = cm.sigmoid(a), cm.tanh(b), cm.sigmoid(c), cm.tanh(d), cm.sigmoid(e)
    u_new = a * u + b
    v_new = cm.maximum(c * v + d * e, u_new)
    h_new = cm.tanh(v_new) * e
    return (h_new, u_new, v_new), (a, b, c, d, e, u, v, v_new, h_new)


def _wide_backward(res, d_new):
    a, b, c, d, e, u, v, v_new, h_new = res
    dh, du, dv = d_new
    t = cm.tanh(v_new)
    dv = dv + dh * e * cm.dtanh(t)
    chosen = cm.where(c * v + d * e >= a * u + b, 1.0, 0.0)
    du = du + dv * (1.0 - chosen)
    dv_in = dv * chosen
    return (du * u * cm.dsigmoid(a), du * cm.dtanh(b), dv_in * v * cm.dsigmoid(c), dv_in * e * cm.dtanh(d),
            (dv_in * d + dh * t) * cm.dsigmoid(e), 0.0, du * a, dv_in * c)


WIDE = ar.Cell("probe_numba_wide", gates=("a", "b", "c", "d", "e"), states=("h", "u", "v"),
               forward=_wide_forward, backward=_wide_backward)


def test_a_cell_of_three_states_and_more_gates_than_a_tile_agrees_with_the_reference():
    assert len(WIDE.gates) > MAX_NV  # the product on plain packed weights, not gate-grouped
    ar.register_cell(WIDE, replace=True)
    try:
        spec = ar.RNNSpec(WIDE.name, input_size=3, hidden_size=4, bidirectional=True, dtype="float64")
        params = ar.PackedParams.init(spec, seed=2)
        x = np.random.default_rng(4).standard_normal((5, 3, 3))
        lengths = np.array([5, 0, 3])
        got = _run(params, x, lengths, True, return_all_states=True)
        want = _run(params, x, lengths, True, engine="reference", return_all_states=True)
        assert got[2].shape == (2, 3, 8)  # c_n: u and v side by side
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)
    finally:
        ar.unregister_cell(WIDE.name)


# -- cells numba refuses ------------------------------------------------------------------------------
def _python_only(x):
    return x  # a plain Python function: numba cannot call it from compiled code


def _forward_calling_python(pre, h):
    y = cm.tanh(_python_only(pre))
    return (y,), (y,)


def _backward_calling_python(res, d_new):
    return _python_only(d_new[0]) * cm.dtanh(res[0]), 0.0


def _tanh_forward(pre, h):
    y = cm.tanh(pre)
    return (y,), (y,)


@pytest.mark.parametrize("forward, backward, what", [
    (_forward_calling_python, _backward_calling_python, "its forward"),
    (_tanh_forward, _backward_calling_python, "its backward"),
])
def test_a_cell_numba_cannot_compile_is_refused_with_its_name_and_the_reason(forward, backward, what):
    cell = ar.register_cell(ar.Cell("probe_numba_refused", gates=("a",), forward=forward, backward=backward),
                            replace=True)
    try:
        params = ar.PackedParams.init(ar.RNNSpec(cell.name, 2, 3), seed=0)
        with pytest.raises(CellDefinitionError,
                           match=f"cell 'probe_numba_refused': numba cannot compile {what} .*_python_only"):
            ar.rnn_forward(params, np.ones((2, 1, 2), np.float32), training=True, engine="numba")
        assert ar.rnn_forward(params, np.ones((2, 1, 2), np.float32), engine="reference").y.shape == (2, 1, 3)
    finally:
        ar.unregister_cell(cell.name)


# -- engine="auto", a cell replaced under its name ----------------------------------------------------
def _scaled_tanh_forward(pre, h):
    y = cm.tanh(pre) * 0.5
    return (y,), (y,)


def _scaled_tanh_backward(res, d_new):
    y = res[0]
    return d_new[0] * 0.5 * (1.0 - 4.0 * y * y), 0.0


def test_auto_takes_numba_once_the_cells_loops_have_compiled(monkeypatch):
    monkeypatch.setattr(numba_cache, "background_enabled", lambda: True)  # as in a user's process
    cell = ar.register_cell(ar.Cell("probe_numba_auto", gates=("a",), forward=_tanh_forward,
                                    backward=TWINS["rnn_tanh"].backward), replace=True)
    try:
        params = ar.PackedParams.init(ar.RNNSpec(cell.name, 2, 3), seed=0)
        x = np.ones((3, 2, 2), np.float32)
        assert not custom_loops.loaded(cell, "float32", training=False)
        assert ar.rnn_forward(params, x, engine="auto").engine == "reference"  # never waits for a compile
        call = ar.engines.probe_call(params.spec, np, explicit=False)
        assert "not compiled yet" in ar.engines.engine_unavailable_reason("numba", call)
        assert "arrayrnn.warmup(spec)" in ar.engines.engine_unavailable_reason("numba", call)
        ar.rnn_forward(params, x, engine="numba")  # compiles the forward loop
        assert custom_loops.loaded(cell, "float32", training=False)
        assert ar.rnn_forward(params, x, engine="auto").engine == "numba"
        assert ar.rnn_forward(params, x, engine="auto", training=True).engine == "reference"
        ar.warmup(params.spec, "float32", progress=False)  # training=True: compiles the backward too
        assert ar.rnn_forward(params, x, engine="auto", training=True).engine == "numba"
    finally:
        ar.unregister_cell(cell.name)
        forget_choices()


def test_a_cell_replaced_under_its_name_runs_its_new_definition():
    name = "probe_numba_replaced"
    first = ar.register_cell(ar.Cell(name, gates=("a",), forward=_tanh_forward,
                                     backward=TWINS["rnn_tanh"].backward), replace=True)
    try:
        params = ar.PackedParams.init(ar.RNNSpec(name, 2, 3), seed=0)
        x = np.random.default_rng(0).standard_normal((3, 2, 2)).astype(np.float32)
        y_first = ar.rnn_forward(params, x, engine="numba").y
        ar.register_cell(ar.Cell(name, gates=("a",), forward=_scaled_tanh_forward,
                                 backward=_scaled_tanh_backward), replace=True)
        y_second = ar.rnn_forward(params, x, engine="numba").y
        np.testing.assert_allclose(y_second, ar.rnn_forward(params, x, engine="reference").y, rtol=1e-6)
        assert not np.allclose(y_first, y_second)
        assert custom_loops.compiled(first) is not custom_loops.compiled(params.spec.custom_cell)
    finally:
        ar.unregister_cell(name)


# -- the loops' bundles -------------------------------------------------------------------------------
def test_the_custom_loops_unpack_their_bundles_in_field_order():
    import ast
    import inspect

    expected = {"steps": bundles.Steps, "state": bundles.State, "cell": bundles.CustomCell,
                "cache": bundles.CustomCache, "variants": bundles.Variants,
                "residuals": bundles.CustomResiduals, "grads": bundles.CustomBackSteps,
                "carry": bundles.Cotangents}
    works = {"_forward_loop": bundles.ForwardWork, "_backward_loop": bundles.BackwardWork}
    for node in ast.walk(ast.parse(inspect.getsource(custom_loops))):
        if isinstance(node, ast.FunctionDef) and node.name in works:
            for stmt in ast.walk(node):
                if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Name) \
                        and isinstance(stmt.targets[0], ast.Tuple):
                    names = tuple(t.id for t in stmt.targets[0].elts)
                    bundle = works[node.name] if stmt.value.id == "work" else expected[stmt.value.id]
                    assert names == bundle._fields, (node.name, stmt.value.id)


# -- the bench runs end to end (never asserts timings) ------------------------------------------------
def test_the_custom_cells_bench_runs_its_rows(capsys, monkeypatch, threads):  # threads: restored after
    from pathlib import Path

    from support.bench_loader import load_bench

    pytest.importorskip("torch")
    path = Path(__file__).resolve().parent.parent / "bench" / "bench_custom_cells.py"
    bench = load_bench(monkeypatch, path)
    monkeypatch.setattr(bench, "GAP_S", 0.0)
    bench.main(["--shapes", "Q1", "--rounds", "1", "--threads", "1"])
    out = capsys.readouterr().out
    for row in ("| Q1 | twin_lstm / lstm, numba | forward |",
                "| Q1 | twin_lstm / lstm, numba | training step |",
                "| Q1 | PyTorch sLSTM loop / slstm, numba | training step |"):
        assert row in out
    try:
        import flashrnn  # noqa: F401
    except ImportError:
        assert "no FlashRNN rows" in out
    else:
        assert "| Q1 | FlashRNN vanilla / slstm, numba | training step |" in out
