"""The numba engine's wavefront (arrayrnn/engines/numba/wavefront.py): a small batch's bidirectional layers
run their two directions side by side, a unidirectional stack pipelines its layers over chunks of time. The
results equal one thread's and the reference engine's on every mode and cell variant, with inter-layer
dropout, variable lengths and both dtypes; the chunks run in dependency order; errors reach the caller."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from support.rnn_cases import assert_same_results, engine_results

import arrayrnn as ar
from arrayrnn.engines import thresholds
from arrayrnn.engines.base import CellMasks
from arrayrnn.engines.numba import plan, wavefront


@pytest.fixture
def schedules(monkeypatch):
    """The schedules the engine took, in call order."""
    taken = []
    for name in ("run_directions", "run_pipeline", "backward_directions"):
        real = getattr(wavefront, name)
        monkeypatch.setattr(wavefront, name,
                            lambda *a, _real=real, _name=name: taken.append(_name) or _real(*a))
    return taken


CONFIGS = {
    "lstm-bi-2-layers-dropout": dict(mode="lstm", bidirectional=True, num_layers=2, dropout=0.4),
    "lstm-3-layers-proj-clip": dict(mode="lstm", num_layers=3, proj_size=3, cell_clip=(-0.3, 0.6)),
    "lstm-2-layers-variants": dict(mode="lstm", num_layers=2, dropout=0.3, recurrent_dropout=0.3,
                                   weight_dropout=0.2, zoneout=0.3, zoneout_cell=0.2, peepholes=True),
    "gru-2-layers-dropout": dict(mode="gru", num_layers=2, dropout=0.5),
    "gru-bi-reset-before-zone": dict(mode="gru", bidirectional=True, reset_after=False, zoneout=0.3),
    "rnn_tanh-4-layers": dict(mode="rnn_tanh", num_layers=4),
    "rnn_relu-bi-zone": dict(mode="rnn_relu", bidirectional=True, zoneout=0.2),
}


def _run(engine: str, spec: ar.RNNSpec, B: int, T: int, training: bool) -> dict:
    return engine_results(engine, spec, T, B, seed=11, training=training, mask_seed=9)


@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_side_by_side_equals_one_thread_and_the_reference(config, training, threads, schedules):
    spec = ar.RNNSpec(input_size=5, hidden_size=7, dtype="float64", **CONFIGS[config])
    B, T = 9, 23  # 9 rows: the wavefront's smallest batch; 5 chunks of 4-5 steps
    threads(1)
    one = _run("numba", spec, B, T, training)
    assert schedules == []
    threads(2)
    two = _run("numba", spec, B, T, training)
    expected = ["run_directions"] if spec.bidirectional else ["run_pipeline"]
    if training and spec.bidirectional:
        expected += ["backward_directions"] * spec.num_layers
    assert schedules == expected
    assert_same_results(two, one, rtol=1e-13, atol=1e-14)
    assert_same_results(two, _run("reference", spec, B, T, training), rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("T", [1, 3, 4, 37])
def test_float32_pipeline_with_odd_chunks_equals_the_reference(T, threads, schedules):
    spec = ar.RNNSpec(mode="lstm", input_size=6, hidden_size=37, num_layers=2, dtype="float32")
    threads(2)
    two = _run("numba", spec, 9, T, training=True)
    assert schedules == ["run_pipeline"]
    oracle = _run("reference", spec, 9, T, training=True)
    assert_same_results(two, oracle, rtol=2e-5, atol=2e-6)


def test_plan_side_by_side_from_8_rows_the_pipeline_where_the_column_split_does_not_run(monkeypatch):
    def spec(**fields):
        return ar.RNNSpec(**{"mode": "lstm", "input_size": 4, "hidden_size": 4, **fields})

    def schedule(spec, rows, threads, backward=False, masks=None):
        """The schedule a call of ``rows`` rows takes (its variants: those ``spec`` draws in training)."""
        if backward:
            return plan.backward_plan(spec, rows, threads).schedule
        x = np.zeros((5, rows, spec.input_size), np.float32)
        return plan.forward_plan(spec, x, np.full(5, rows), masks, threads).schedule

    bi, deep = spec(bidirectional=True), spec(num_layers=2)
    few = thresholds.WAVEFRONT_MIN_ROWS
    assert schedule(bi, few, 2) == schedule(bi, 64, 2) == "directions"
    assert schedule(bi, few, 2, backward=True) == "directions"
    assert schedule(bi, 16, 2, backward=True) is None   # the rows split, and less memory
    assert schedule(bi, few - 1, 2) is None    # a small layer: the partner core's wake-up costs more
    assert schedule(deep, few, 2) == schedule(deep, 15, 2) == "layers"
    assert schedule(deep, few, 2, backward=True) is None
    assert schedule(deep, 16, 2) is None       # the rows split takes both threads
    assert schedule(deep, few - 1, 2) is None
    assert schedule(spec(), few, 2) is None    # nothing to run beside the one loop
    assert schedule(deep, few, 1) is None and schedule(bi, 64, 1) is None  # one thread
    large = spec(num_layers=2, hidden_size=512)      # 8 x 2048 x 512 multiply-adds a step: column split
    assert schedule(large, 8, 2) is None
    assert schedule(spec(mode="gru", num_layers=2, hidden_size=512), 8, 2) is None   # columns too
    before = spec(mode="gru", num_layers=2, hidden_size=512, reset_after=False)   # no column loop
    assert schedule(before, 8, 2) == "layers"
    assert schedule(spec(mode="rnn_tanh", num_layers=2, hidden_size=512), 8, 2) == "layers"
    for variant in (dict(proj_size=64), dict(peepholes=True)):  # no column loop runs these: the pipeline does
        assert schedule(spec(num_layers=2, hidden_size=512, **variant), 8, 2) == "layers", variant
    H, rows = 512, 8
    drawn = {"recurrent": CellMasks(recurrent=np.ones((2, rows, H), np.float32)),
             "zoneout_h": CellMasks(zoneout_h=np.ones((2, 5, rows, H), np.float32)),
             "zoneout_c": CellMasks(zoneout_c=np.ones((2, 5, rows, H), np.float32))}
    for name, masks in drawn.items():   # masks applied in the loop: no column loop, the pipeline
        assert schedule(large, rows, 2, masks=masks) == "layers", name
    weight = CellMasks(weight=np.ones((2, 4 * H, H), np.float32))   # DropConnect scales W_hh before the loop
    assert schedule(large, rows, 2, masks=weight) is None
    monkeypatch.setattr(thresholds, "PIPELINE_LAYERS", False)
    assert schedule(deep, few, 2) is None


def test_a_column_split_loop_inside_the_pipeline_runs_on_its_one_thread(threads, monkeypatch):
    # a loop built for the column split, run as a pipeline task while the other worker is busy with the
    # other layer, would wait at its barrier for a part that never starts (the call hung before the fix)
    monkeypatch.setattr(thresholds, "COLUMN_SPLIT_MIN_STEP_FMAS", 0)
    monkeypatch.setattr(plan, "wavefront_schedule",
                        lambda *a, **k: "layers" if not k.get("backward") else None)
    spec = ar.RNNSpec(mode="lstm", input_size=5, hidden_size=37, num_layers=2, dtype="float64")
    threads(2)
    result = {}
    call = threading.Thread(target=lambda: result.update(_run("numba", spec, 9, 11, training=False)),
                            daemon=True)
    call.start()
    call.join(timeout=300)
    assert not call.is_alive(), "the pipelined call did not finish"
    oracle = _run("reference", spec, 9, 11, training=False)
    assert_same_results(result, oracle, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("steps", [0, 1, 3, 4, 9, 64, 1000])
def test_chunks_cover_the_steps_in_order(steps):
    bounds = wavefront.chunk_bounds(steps)
    assert bounds[0][0] == 0 and bounds[-1][1] == steps
    assert all(a[1] == b[0] for a, b in zip(bounds[:-1], bounds[1:], strict=True))
    assert len(bounds) <= thresholds.CHUNKS
    if steps >= thresholds.MIN_CHUNK_STEPS:
        assert all(t1 - t0 >= thresholds.MIN_CHUNK_STEPS for t0, t1 in bounds)


@pytest.mark.parametrize("layers, chunks, workers", [(2, 5, 2), (3, 4, 2), (4, 1, 2), (1, 3, 2), (3, 3, 3)])
def test_tasks_run_after_their_dependencies_on_their_layer_thread(layers, chunks, workers, threads):
    threads(workers)
    lock, finished, owner = threading.Lock(), set(), {}

    def task(layer, j):
        with lock:
            assert (layer - 1, j) in finished or layer == 0
            assert (layer, j - 1) in finished or j == 0
            owner.setdefault(layer, threading.get_ident())
            assert owner[layer] == threading.get_ident()
        with lock:
            finished.add((layer, j))

    wavefront.in_dependency_order(task, layers, chunks, workers)
    assert finished == {(layer, j) for layer in range(layers) for j in range(chunks)}
    # each layer on one thread (checked in task), no more threads than asked for (a worker that finished
    # its part may take the call's next one)
    assert len(set(owner.values())) <= min(layers, workers)


def test_an_error_in_one_layer_stops_every_thread_and_reaches_the_caller(threads):
    threads(2)
    ran = []

    def task(layer, j):
        if (layer, j) == (0, 2):
            raise RuntimeError("chunk 2 of layer 0 failed")
        ran.append((layer, j))

    with pytest.raises(RuntimeError, match="chunk 2 of layer 0 failed"):
        wavefront.in_dependency_order(task, 2, 6, 2)
    assert (1, 2) not in ran and (0, 3) not in ran   # nothing after the failure's diagonal waits forever
