"""The one copy of ``x`` a call makes: each engine's ``take_input`` gathers the caller's ``x`` into the order
it computes in (the stack driver: rows sorted by length, time-major), zero at padding, in one pass."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import arrayrnn as ar
from arrayrnn.engines import load_engine
from arrayrnn.engines.base import copy_zero_padded

T, B, F = 7, 5, 3
LENGTHS = np.array([3, 7, 0, 5, 7], dtype=np.int64)


def _x(batch_first: bool) -> np.ndarray:
    x = np.random.default_rng(0).standard_normal((B, T, F) if batch_first else (T, B, F))
    return x


def _padding(batch_first: bool) -> np.ndarray:
    padding = np.arange(T)[:, None] >= LENGTHS[None, :]  # (T, B)
    return padding.T if batch_first else padding


@pytest.mark.parametrize("batch_first", [False, True])
def test_the_driver_gathers_sorted_time_major_rows_zero_at_padding(batch_first):
    x = _x(batch_first)
    x[_padding(batch_first)] = np.inf  # padding is never read
    taken = load_engine("reference").take_input(x, LENGTHS, batch_first)
    perm = np.argsort(-LENGTHS, kind="stable")
    time_major = np.swapaxes(x, 0, 1) if batch_first else x
    expected = np.where(_padding(False)[:, :, None], 0.0, time_major)[:, perm]
    assert taken.x.flags.c_contiguous and taken.x.shape == (T, B, F)
    np.testing.assert_array_equal(taken.x, expected)
    np.testing.assert_array_equal(taken.order.perm, perm)


@pytest.mark.parametrize("batch_first", [False, True])
def test_the_default_take_input_keeps_the_callers_layout(batch_first):
    x = _x(batch_first)
    x[_padding(batch_first)] = np.nan
    taken = copy_zero_padded(x, LENGTHS, batch_first)
    assert taken.flags.c_contiguous and taken.shape == x.shape and not np.shares_memory(taken, x)
    np.testing.assert_array_equal(taken, np.where(_padding(batch_first)[:, :, None], 0.0, x))


@pytest.mark.parametrize("batch_first", [False, True])
def test_the_gather_allocates_one_copy_of_x(batch_first):
    x = np.zeros((64, 100, 256) if batch_first else (100, 64, 256), np.float32)
    lengths = np.random.default_rng(1).integers(1, 101, 64)
    engine = load_engine("numba")
    engine.take_input(x[:2], lengths[:2], batch_first)  # warm up anything cached
    tracemalloc.start()
    try:
        engine.take_input(x, lengths, batch_first)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1.05 * x.nbytes, peak / x.nbytes


def test_the_frontend_hands_the_engine_its_own_gather(monkeypatch):
    """rnn_forward makes no copy of its own: the engine's take_input is the copy its forward gets (and the
    result keeps for the recompute after an inference forward)."""
    engine = load_engine("numba")
    taken, received = [], []
    real_take, real_forward = engine.take_input, engine.forward

    def take(x, lengths, batch_first):
        taken.append(real_take(x, lengths, batch_first))
        return taken[-1]

    def forward(params, x, *args, **kwargs):
        received.append(x)
        return real_forward(params, x, *args, **kwargs)

    monkeypatch.setattr(engine, "take_input", take)
    monkeypatch.setattr(engine, "forward", forward)
    spec = ar.RNNSpec("gru", F, 4, dtype="float64")
    x = _x(True)
    res = ar.rnn_forward(ar.PackedParams.init(spec), x, LENGTHS, batch_first=True, engine="numba")
    assert len(taken) == 1 and received == taken
    x[...] = 1e300  # the caller refills its buffer: the backward after inference still sees the old x
    g = ar.rnn_backward(res, np.ones_like(res.y))
    expected = ar.rnn_backward(ar.rnn_forward(ar.PackedParams.init(spec), _x(True), LENGTHS, batch_first=True,
                                              training=True, engine="numba"), np.ones_like(res.y))
    np.testing.assert_allclose(g.dparams.data, expected.dparams.data, rtol=1e-12)
