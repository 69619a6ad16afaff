"""The numba engine as a whole: selection by ``engine="auto"``, and equality with the reference engine on
batches larger than the shared test bodies use (many rows, unsorted lengths including 0 and T, both
directions, every mode and option). The shared bodies (tests/test_rnn_*.py) run on it through the
``engine`` fixture of conftest.py.
"""

from __future__ import annotations

import sys
import tracemalloc
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import ENGINES
from support.rnn_cases import assert_same_results, engine_results

import arrayrnn as ar
from arrayrnn import EngineUnavailableError
from arrayrnn.engines import probe_call, select_engine
from arrayrnn.engines.numba import engine as numba_engine
from arrayrnn.engines.numba.plan import forward_plan
from arrayrnn.engines.stack import direction_weights, input_projection

SPEC = ar.RNNSpec(mode="lstm", input_size=3, hidden_size=4)


def test_shared_test_bodies_run_on_numba():
    assert "numba" in ENGINES


def test_auto_picks_numba_on_cpu():
    assert select_engine("auto", probe_call(SPEC)).name == "numba"
    x = np.zeros((2, 1, 3), np.float32)
    assert ar.rnn_forward(ar.PackedParams.init(SPEC), x).engine == "numba"


def test_auto_picks_reference_when_numba_is_not_installed(monkeypatch):
    # an entry of None in sys.modules makes "import numba" raise ImportError, as if it were absent; the
    # engine's modules are dropped from the import cache so that selecting it imports them afresh
    monkeypatch.setitem(sys.modules, "numba", None)
    for name in [name for name in sys.modules if name.startswith("arrayrnn.engines.numba.")]:
        monkeypatch.delitem(sys.modules, name)
    assert select_engine("auto", probe_call(SPEC)).name == "reference"
    with pytest.raises(EngineUnavailableError, match="engine = 'numba' cannot be imported"):
        select_engine("numba", probe_call(SPEC))


def test_numba_refuses_non_numpy_arrays():
    class FakeXp:  # any array module other than NumPy
        pass

    assert "CPU" in numba_engine.ENGINE.check(probe_call(SPEC, FakeXp))


# -- equality with the reference engine -----------------------------------------------------------
CONFIGS = {
    "lstm": dict(mode="lstm"),
    "lstm-proj-clip-bi": dict(mode="lstm", proj_size=3, cell_clip=(-0.3, 0.6), bidirectional=True),
    "lstm-single-inp": dict(mode="lstm", bias="single_inp", num_layers=2),
    "gru-bi": dict(mode="gru", bidirectional=True, num_layers=2),
    "gru-reset-before-bi": dict(mode="gru", reset_after=False, bidirectional=True),
    "gru-no-bias": dict(mode="gru", bias="none"),
    "rnn_tanh-bi": dict(mode="rnn_tanh", bidirectional=True, bias="single_rec"),
    "rnn_relu": dict(mode="rnn_relu", num_layers=2),
}


def _run(engine: str, spec: ar.RNNSpec) -> dict:
    return engine_results(engine, spec, T=9, B=37)


@pytest.mark.parametrize("dtype, rtol, atol", [("float64", 1e-12, 1e-13), ("float32", 2e-5, 2e-6)])
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_numba_equals_reference(config, dtype, rtol, atol):
    spec = ar.RNNSpec(input_size=5, hidden_size=6, dtype=dtype, **CONFIGS[config])
    ours, oracle = _run("numba", spec), _run("reference", spec)
    assert_same_results(ours, oracle, rtol=rtol, atol=atol)


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_inactive_rows_of_the_input_projection_are_never_read(config, monkeypatch):
    """Variable lengths: the projection writes only each step's active rows (ACTIVE_PROJECTION_MAX_FILL);
    with NaN in the rest, every result still equals the reference's (the kernels never read them, and the
    caches they keep there are zeroed)."""
    real, calls = numba_engine.project_active_rows, []

    def poisoned(x, w, batch_sizes, out, threads):
        calls.append(batch_sizes)
        out = np.full((*x.shape[:2], w.W_ih.shape[0]), np.nan, x.dtype) if out is None else out
        return real(x, w, batch_sizes, out, threads)

    monkeypatch.setattr(numba_engine, "project_active_rows", poisoned)
    spec = ar.RNNSpec(input_size=5, hidden_size=6, dtype="float64", **CONFIGS[config])
    ours, oracle = _run("numba", spec), _run("reference", spec)
    assert calls and all(bs.sum() < bs.size * 37 for bs in calls)  # the path ran, on partly active steps
    assert_same_results(ours, oracle, rtol=1e-12, atol=1e-13)


GATHER_CASES = {
    "lstm-proj-peep-dropout": dict(mode="lstm", proj_size=3, peepholes=True, recurrent_dropout=0.3,
                                   weight_dropout=0.2, num_layers=2, bidirectional=True),
    "gru-reset-before-zoneout": dict(mode="gru", reset_after=False, zoneout=0.2),
    "gru": dict(mode="gru", bidirectional=True),
    "rnn_relu": dict(mode="rnn_relu", bias="single_rec"),
}


@pytest.mark.parametrize("engine", ["numba", "reference"])
@pytest.mark.parametrize("case", sorted(GATHER_CASES))
def test_backward_products_on_the_active_rows_equal_those_on_every_row(case, engine, monkeypatch):
    """The hoisted backward products gather the active (step, row) entries when at most
    ACTIVE_ROWS_MAX_FILL of them are active; gradients equal those of the products over every row."""
    from arrayrnn.engines import stack, thresholds

    spec = ar.RNNSpec(input_size=5, hidden_size=6, dtype="float64", **GATHER_CASES[case])
    rng = np.random.default_rng(1)
    T, B = 9, 11
    x = rng.standard_normal((T, B, 5))
    lengths = np.array([9, 0, 3, 1, 9, 2, 5, 0, 4, 7, 1])  # 41 of 99 entries active
    dy = rng.standard_normal((T, B, spec.num_directions * spec.output_size))
    params = ar.PackedParams.init(spec, seed=0)
    grads, gathered_stacks, call = {}, [], stack.ActiveRows.__call__

    def spy(self, a):
        gathered_stacks.append(self.index is not None)
        return call(self, a)

    monkeypatch.setattr(stack.ActiveRows, "__call__", spy)
    for fill in (1.0, 0.0):
        monkeypatch.setattr(thresholds, "ACTIVE_ROWS_MAX_FILL", fill)
        res = ar.rnn_forward(params, x, lengths, training=True, seed=4, engine=engine)
        grads[fill] = ar.rnn_backward(res, dy)
        assert set(gathered_stacks) == {fill == 1.0}
        gathered_stacks.clear()
    gathered, every_row = grads[1.0], grads[0.0]
    for got, want in ((gathered.dx, every_row.dx), (gathered.dh0, every_row.dh0),
                      (gathered.dparams.data, every_row.dparams.data)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


def test_active_rows_gather_where_most_entries_are_padding():
    from arrayrnn.engines.stack import ActiveRows, _compact

    rows = ActiveRows(np, np.array([3, 1, 0]), 3)  # 4 of 9 active
    stack = np.arange(9.0).reshape(3, 3, 1)
    np.testing.assert_array_equal(rows(stack)[:, 0], [0, 1, 2, 3])
    assert rows(stack) is rows(stack)  # gathered once
    np.testing.assert_array_equal(rows.to_stack(rows(stack), stack.shape), np.where(stack < 4, stack, 0))
    assert ActiveRows(np, np.array([3, 3, 2]), 3).index is None  # 8 of 9 active: every row
    owned = np.arange(9.0).reshape(3, 3, 1)
    compacted = ActiveRows(np, np.array([3, 1, 0]), 3, owned=(owned,))(owned)
    assert np.shares_memory(compacted, owned) and compacted[:, 0].tolist() == [0, 1, 2, 3]
    flat = np.arange(20.0)[:, None]  # several blocks: rows move forward, none overwritten before it is read
    index = np.array([0, 2, 3, 7, 8, 9, 15, 19])
    assert _compact(flat, index, block=3)[:, 0].tolist() == index.tolist()


def test_active_rows_projection_writes_only_active_rows():
    """From ACTIVE_PROJECTION_MIN_ROWS active rows a step on average, and at most ACTIVE_PROJECTION_MAX_FILL
    of the entries active, only the active rows are written; otherwise (few rows, no padding) all are."""
    rng = np.random.default_rng(0)
    T = 9
    for dtype in ("float32", "float64"):
        spec = ar.RNNSpec(mode="gru", input_size=7, hidden_size=5, dtype=dtype)
        w = direction_weights(ar.PackedParams.init(spec, seed=0), 0, 0)
        for lengths, partial in (([9, 9, 8, 7, 7, 6, 4, 4, 3, 1, 0, 0], True), ([9, 7, 4, 4, 1, 0], False),
                                 ([9] * 12, False)):
            B = len(lengths)
            x = rng.standard_normal((T, B, 7)).astype(dtype)
            bs = (np.array(lengths)[None] > np.arange(T)[:, None]).sum(axis=1).astype(np.int64)
            out = np.full((T, B, 15), np.nan, dtype)
            run = SimpleNamespace(x=x, batch_sizes=bs, plan=forward_plan(spec, x, bs, threads=2))
            assert run.plan.active_projection == partial
            xw = numba_engine.ENGINE.projector(run, 0, w)(x, out)
            assert np.shares_memory(xw, out)
            active = np.arange(B)[None, :] < bs[:, None] if partial else np.ones((T, B), bool)
            np.testing.assert_allclose(out[active], input_projection(x, w)[active], rtol=1e-5, atol=1e-6)
            assert np.isnan(out[~active]).all()


@pytest.mark.parametrize("config", ["lstm-proj-clip-bi", "gru-bi", "gru-reset-before-bi", "rnn_tanh-bi"])
def test_wide_hidden_sizes_cross_every_tile_edge(config):
    # H = 37: more than two vectors of units with a partial last one (float64: 8 lanes per AVX-512
    # vector, 4 with AVX2 or portable), 23 rows: several row tiles and a short last one
    spec = ar.RNNSpec(input_size=5, hidden_size=37, dtype="float64", **CONFIGS[config])
    ours, oracle = _run("numba", spec), _run("reference", spec)
    assert_same_results(ours, oracle, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("mode, options, shape", [
    ("lstm", {"proj_size": 2, "bidirectional": True}, (7, 20, 5, 6)),
    ("lstm", {}, (7, 20, 5, 6)),
    ("gru", {}, (7, 20, 5, 6)),
    ("lstm", {}, (24, 12, 8, 256)),   # the column split where the call has two threads
    ("gru", {}, (24, 12, 8, 320)),
])
def test_inference_forward_equals_training_forward(mode, options, shape):
    """The gate tiles store the activated gates (the backward's residuals) only when the cache is kept; the
    inference loop's outputs are the training loop's, bit for bit."""
    T, B, I, H = shape
    spec = ar.RNNSpec(mode=mode, input_size=I, hidden_size=H, **options)
    x = np.random.default_rng(3).standard_normal((T, B, I)).astype(np.float32)
    lengths = np.random.default_rng(4).integers(0, T + 1, B)
    params = ar.PackedParams.init(spec)
    for rows in (None, lengths):
        a = ar.rnn_forward(params, x, rows, engine="numba")
        b = ar.rnn_forward(params, x, rows, training=True, engine="numba")
        np.testing.assert_array_equal(a.y, b.y)
        np.testing.assert_array_equal(a.h_n, b.h_n)
        if spec.has_cell:
            np.testing.assert_array_equal(a.c_n, b.c_n)


def test_backward_twice_from_one_forward_gives_the_same_gradients():
    spec = ar.RNNSpec(mode="gru", input_size=5, hidden_size=6, bidirectional=True)
    x = np.random.default_rng(4).standard_normal((7, 20, 5)).astype(np.float32)
    res = ar.rnn_forward(ar.PackedParams.init(spec), x, training=True, engine="numba")
    first, second = ar.rnn_backward(res), ar.rnn_backward(res)
    np.testing.assert_array_equal(first.dparams.data, second.dparams.data)
    np.testing.assert_array_equal(first.dx, second.dx)


# -- memory of a training step (tracemalloc counts NumPy's allocations; deterministic) ------------------
def _step_memory(mode: str, lengths: np.ndarray | None) -> tuple[float, float]:
    """(bytes a training forward's result holds, peak bytes of its backward above that), in units of one
    (T, B, H) float64 array."""
    T, B, H = 50, 32, 64
    spec = ar.RNNSpec(mode, H, H, dtype="float64")
    params = ar.PackedParams.init(spec)
    rng = np.random.default_rng(0)
    x, dy = rng.standard_normal((T, B, H)), rng.standard_normal((T, B, H))
    ar.rnn_backward(ar.rnn_forward(params, x, lengths=lengths, training=True, engine="numba"), dy)  # compile
    tracemalloc.start()
    try:
        res = ar.rnn_forward(params, x, lengths=lengths, training=True, engine="numba")
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        ar.rnn_backward(res, dy)
        peak = tracemalloc.get_traced_memory()[1] - held
    finally:
        tracemalloc.stop()
    unit = T * B * H * 8
    return held / unit, peak / unit


def test_training_forward_keeps_one_copy_of_x():
    # unsorted lengths: the engine keeps its own sorted x; the result adds only y in the caller's order
    held_uniform, _ = _step_memory("lstm", None)
    held_unsorted, _ = _step_memory("lstm", np.random.default_rng(1).integers(1, 51, 32))
    assert held_unsorted - held_uniform < 1.5


@pytest.mark.parametrize("mode, needed", [("lstm", 6), ("gru", 5)])
def test_backward_peak_is_the_gradients_and_previous_states(mode, needed):
    # what must coexist in the backward, in (T, B, H) units: LSTM dpre_in (4) + h_prev + c_prev;
    # GRU dpre_in (3) + the n part of dpre_rec (1; its r, z parts are dpre_in's) + h_prev (a whole
    # dpre_rec made it 7). h_prev/c_prev are dropped before the dx GEMM, whose output is dx itself
    _, peak = _step_memory(mode, None)
    assert peak < needed + 0.8
