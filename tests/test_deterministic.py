"""``ar.set_deterministic(True)``: the same call gives the same bits whatever the process has reached (numba
loaded or not, the thread count, other threads calling at the same time); bad input is refused."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import arrayrnn as ar
from arrayrnn.engines import forget_choices
from arrayrnn.engines.numba import warmup

pytest.importorskip("numba")

# a case whose bits differ between thread counts by default (the layer pipeline and the active rows'
# projection at 3 threads against 1)
SPEC = ar.RNNSpec(mode="lstm", input_size=32, hidden_size=64, num_layers=2, dtype="float64")
X = np.random.default_rng(0).standard_normal((20, 16, 32))
LENGTHS = np.random.default_rng(1).integers(0, 21, 16)


@pytest.fixture
def deterministic():
    ar.set_deterministic(True)
    yield
    ar.set_deterministic(False)


def outputs(params, training=False):
    res = ar.rnn_forward(params, X, LENGTHS, training=training)
    if not training:
        return res.engine, res.y
    g = ar.rnn_backward(res, dy=np.ones_like(res.y))
    return res.engine, np.concatenate([res.y.ravel(), g.dx.ravel(), g.dparams.data])


@pytest.mark.parametrize("training", [False, True])
def test_the_same_bits_at_every_thread_count_and_before_numba_loads(deterministic, threads, monkeypatch,
                                                                    training):
    params = ar.PackedParams.init(SPEC, seed=0)
    monkeypatch.setattr(warmup, "loaded", lambda call: False)  # a new process: nothing loaded
    monkeypatch.setattr(warmup, "background_enabled", lambda: True)
    forget_choices()
    results = []
    for n in (1, 2, 3):
        threads(n)
        results.append(outputs(params, training))
    assert {engine for engine, _ in results} == {"numba"}  # auto waits for numba instead of reference
    for _, got in results[1:]:
        np.testing.assert_array_equal(got, results[0][1])


def test_the_same_bits_while_other_threads_are_calling(deterministic, threads):
    threads(2)
    params = ar.PackedParams.init(SPEC, seed=0)
    want = outputs(params, training=True)[1]
    got, errors = [], []

    def caller():
        try:
            for _ in range(3):
                got.append(outputs(params, training=True)[1])
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    callers = [threading.Thread(target=caller) for _ in range(3)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(timeout=600)
    assert not errors and len(got) == 9
    for g in got:
        np.testing.assert_array_equal(g, want)


def test_off_by_default_and_switched_back_restores_the_threads(threads):
    assert ar.is_deterministic() is False
    ar.set_deterministic(True)
    try:
        assert ar.is_deterministic() is True
        from arrayrnn.engines.numba.loop_threads import available_threads

        threads(2)
        assert available_threads() == 1
    finally:
        ar.set_deterministic(False)
    assert available_threads() == 2


@pytest.mark.parametrize("bad", ["yes", 1, None, 0.0])
def test_a_flag_that_is_not_a_bool_is_refused_naming_it(bad):
    with pytest.raises(TypeError, match=rf"flag = {bad!r}; expected True or False"):
        ar.set_deterministic(bad)
    assert ar.is_deterministic() is False
