"""The NumPy engines run on a private, frozen copy of ``params.data`` (arrayrnn.frontend.guard.frozen_copy):
a call on unchanged weights reuses the copy and what the numba engine packed from it; any write to the
buffer, however small and however made, gives the next call a new copy and new packed forms."""

import dataclasses
import gc

import numpy as np
import pytest

import arrayrnn as ar
from arrayrnn.engines import derived
from arrayrnn.engines.base import DirectionWeights
from arrayrnn.engines.numba import direction
from arrayrnn.engines.numba import engine as numba_engine
from arrayrnn.frontend import guard

SPEC = ar.RNNSpec(mode="lstm", input_size=3, hidden_size=4, num_layers=2, bidirectional=True,
                  dtype="float64")


def _x(T=5, B=2):
    return np.random.default_rng(1).standard_normal((T, B, SPEC.input_size))


@pytest.fixture
def packs(monkeypatch):
    """How many times the numba engine packed the recurrent weights."""
    made = []

    def counting(*args, **kwargs):
        made.append(args[-1] if len(args) > 3 else kwargs.get("backward", False))
        return direction.cell_of(*args, **kwargs)

    monkeypatch.setattr(numba_engine, "cell_of", counting)
    return made


def test_calls_on_unchanged_weights_pack_once(packs):
    params = ar.PackedParams.init(SPEC, seed=0)
    first = ar.rnn_forward(params, _x(), engine="numba")
    assert len(packs) == 4  # 2 layers x 2 directions
    again = ar.rnn_forward(params, _x(), engine="numba")
    assert len(packs) == 4
    np.testing.assert_array_equal(again.y, first.y)


@pytest.mark.parametrize("write", ["optimizer", "view", "one_ulp", "restore"])
def test_a_write_between_calls_is_seen_by_the_next_call(packs, write):
    params = ar.PackedParams.init(SPEC, seed=0)
    before = ar.rnn_forward(params, _x(), engine="numba")
    original = params.data.copy()
    if write == "optimizer":
        params.data -= 0.1 * np.ones_like(params.data)
    elif write == "view":
        params.view(1, 1, "W_hh")[2, 1] += 0.5
    else:  # the smallest change: one unit in the last place of one weight
        params.data[7] = np.nextafter(params.data[7], np.inf)
        if write == "restore":
            ar.rnn_forward(params, _x(), engine="numba")
            params.data[...] = original
    after = ar.rnn_forward(params, _x(), engine="numba")
    fresh = ar.rnn_forward(ar.PackedParams(SPEC, params.data.copy()), _x(), engine="numba")
    np.testing.assert_array_equal(after.y, fresh.y)  # the new weights, bit for bit
    if write == "restore":
        np.testing.assert_array_equal(after.y, before.y)
    else:
        assert not np.array_equal(after.y, before.y) or write == "one_ulp"
        assert len(packs) >= 8  # packed again


def test_training_steps_with_an_optimizer_match_fresh_params():
    params = ar.PackedParams.init(SPEC, seed=0)
    opt_params = ar.PackedParams(SPEC, params.data.copy())
    for _ in range(3):
        res = ar.rnn_forward(opt_params, _x(), training=True, engine="numba")
        grads = ar.rnn_backward(res, dy=np.ones_like(res.y))
        fresh = ar.rnn_forward(ar.PackedParams(SPEC, opt_params.data.copy()), _x(), training=True,
                               engine="numba")
        fresh_grads = ar.rnn_backward(fresh, dy=np.ones_like(fresh.y))
        np.testing.assert_array_equal(res.y, fresh.y)
        np.testing.assert_array_equal(grads.dparams.data, fresh_grads.dparams.data)
        opt_params.data -= 0.05 * grads.dparams.data  # in place, as an optimizer step


def test_a_forward_and_backward_leave_the_kept_packs_unchanged():
    params = ar.PackedParams.init(SPEC, seed=0)
    res = ar.rnn_forward(params, _x(), training=True, engine="numba")
    snap = guard.frozen_copy(params.data)
    forms = derived._FORMS[id(snap.copy)]
    before = {key: [np.array(a, copy=True) for a in _arrays_of(value)] for key, value in forms.items()}
    assert any(isinstance(value, DirectionWeights) for value in forms.values())  # the views are kept too
    ar.rnn_backward(res, dy=np.ones_like(res.y))
    ar.rnn_forward(params, _x(), training=True, engine="numba")
    for key, arrays in before.items():
        for a, b in zip(_arrays_of(forms[key]), arrays, strict=True):
            np.testing.assert_array_equal(a, b)


def _arrays_of(form) -> list[np.ndarray]:
    """The arrays a kept form holds: itself, a bundle's (a tuple), or a record's fields (DirectionWeights)."""
    if isinstance(form, np.ndarray):
        return [form]
    if dataclasses.is_dataclass(form):
        form = [getattr(form, f.name) for f in dataclasses.fields(form)]
    if isinstance(form, (tuple, list)):
        return [a for part in form for a in _arrays_of(part)]
    return []


def test_weight_dropout_is_never_served_from_the_kept_packs(packs):
    spec = ar.RNNSpec(mode="lstm", input_size=3, hidden_size=4, weight_dropout=0.5, dtype="float64")
    params = ar.PackedParams.init(spec, seed=0)
    a = ar.rnn_forward(params, _x(), training=True, seed=1, engine="numba")
    b = ar.rnn_forward(params, _x(), training=True, seed=2, engine="numba")
    assert len(packs) == 2 and not np.array_equal(a.y, b.y)


def test_the_copy_and_its_forms_go_with_the_buffer():
    params = ar.PackedParams.init(SPEC, seed=0)
    ar.rnn_forward(params, _x(), engine="numba")
    key = (params.data.ctypes.data, params.data.nbytes, params.data.dtype.str)
    copy_key = id(guard.frozen_copy(params.data).copy)
    assert key in guard._LATEST and copy_key in derived._FORMS
    del params
    gc.collect()
    assert key not in guard._LATEST and copy_key not in derived._FORMS


def test_freeze_takes_an_owning_array_and_other_arrays_get_new_forms():
    owner = np.arange(6.0)
    with pytest.raises(ValueError, match="owns its memory"):
        derived.freeze(owner[2:])
    made = []
    assert derived.cached(owner[:3], "k", lambda: made.append(1) or len(made)) == 1
    assert derived.cached(owner[:3], "k", lambda: made.append(1) or len(made)) == 2  # not frozen
    derived.freeze(owner)
    assert derived.is_frozen(owner[1:]) and not derived.is_frozen(owner.copy())
    assert derived.cached(owner[:3], "k", lambda: "first") == "first"
    assert derived.cached(owner[:3], "k", lambda: "second") == "first"
    assert derived.cached(owner[3:], "k", lambda: "other place") == "other place"


def test_nan_and_signed_zero_writes_count_as_writes():
    """Bits decide reuse (a NaN written over a NaN with another payload, 0.0 over -0.0): the copy then
    stands for the buffer exactly."""
    data = np.array([0.0, np.nan, 1.0])
    snap = guard.frozen_copy(data)
    data[0] = -0.0
    assert guard.frozen_copy(data) is not snap
    snap = guard.frozen_copy(data)
    assert guard.frozen_copy(data) is snap


def test_a_new_view_of_the_same_memory_reuses_the_copy(packs):
    """An adapter wraps the same weight memory in a new NumPy view at every call (``Tensor.numpy()``)."""
    memory = ar.PackedParams.init(SPEC, seed=0).data
    first = ar.rnn_forward(ar.PackedParams(SPEC, memory[:]), _x(), engine="numba")
    again = ar.rnn_forward(ar.PackedParams(SPEC, memory[:]), _x(), engine="numba")
    assert len(packs) == 4
    np.testing.assert_array_equal(again.y, first.y)


def test_only_the_last_buffers_copies_are_kept():
    buffers = [ar.PackedParams.init(SPEC, seed=k) for k in range(guard._KEEP + 3)]
    for params in buffers:
        ar.rnn_forward(params, _x(), engine="numba")
    assert len(guard._LATEST) <= guard._KEEP


def test_params_in_an_engines_own_format_keep_it_on_the_copy():
    params = ar.PackedParams.init(SPEC, seed=0)
    snap = guard.frozen_copy(params.data)
    native = ar.PackedParams._wrap(SPEC, params.data, "permuted")
    assert snap.params(native).format == "permuted" and snap.params(params).format == "canonical"
    assert snap.params(params).data is snap.copy


def test_two_caller_threads_on_the_same_weights_get_the_single_thread_results():
    from concurrent.futures import ThreadPoolExecutor

    params = ar.PackedParams.init(SPEC, seed=0)
    xs = [np.random.default_rng(k).standard_normal((5, 2, SPEC.input_size)) for k in range(8)]
    alone = [ar.rnn_forward(ar.PackedParams(SPEC, params.data.copy()), x, engine="numba").y for x in xs]
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(lambda x: ar.rnn_forward(params, x, engine="numba").y, xs))
    for a, b in zip(alone, together, strict=True):
        np.testing.assert_array_equal(a, b)
