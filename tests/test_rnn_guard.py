"""The backward never depends on what the caller may change after the forward: weights written in between
are detected (the guard), input buffers refilled in between change nothing."""

import numpy as np
import pytest
from support.cudnn import requires_cudnn

import arrayrnn as ar

SPEC = ar.RNNSpec(mode="lstm", input_size=3, hidden_size=4, num_layers=2, dtype="float64")
DY = {False: np.ones((5, 2, 4)), True: np.ones((2, 5, 4))}


@pytest.fixture(params=["reference", "numba"])
def engine(request):
    return request.param


def _grads(params, x, training, engine, h0=None):
    res = ar.rnn_forward(params, x, h0=h0, training=training, engine=engine)
    return ar.rnn_backward(res, dy=np.ones_like(res.y))


@pytest.mark.parametrize("training", [True, False])
def test_weight_write_between_forward_and_backward_raises(engine, training):
    params = ar.PackedParams.init(SPEC, seed=0)
    x = np.random.default_rng(0).standard_normal((5, 2, 3))
    res = ar.rnn_forward(params, x, training=training, engine=engine)
    params.data -= 0.1
    with pytest.raises(ValueError, match="modified in place between rnn_forward and rnn_backward"):
        ar.rnn_backward(res, dy=np.ones_like(res.y))


def test_write_through_a_view_is_detected(engine):
    params = ar.PackedParams.init(SPEC, seed=0)
    res = ar.rnn_forward(params, np.ones((5, 2, 3)), training=True, engine=engine)
    params.view(1, 0, "b_hh")[0] += 1e-12
    with pytest.raises(ValueError, match="modified in place"):
        ar.rnn_backward(res)


def test_an_unchanged_buffer_passes_and_the_step_after_backward_is_fine(engine):
    params = ar.PackedParams.init(SPEC, seed=0)
    x = np.ones((5, 2, 3))
    expected = _grads(params.copy(), x, True, engine)
    res = ar.rnn_forward(params, x, training=True, engine=engine)
    params.data[...] = params.data.copy()  # a write that changes no value
    g = ar.rnn_backward(res, dy=np.ones_like(res.y))
    np.testing.assert_array_equal(g.dparams.data, expected.dparams.data)
    before = params.data.copy()
    params.data -= 0.1 * g.dparams.data  # after the backward: allowed
    np.testing.assert_array_equal(params.data, before - 0.1 * g.dparams.data)
    ar.rnn_backward(ar.rnn_forward(params, x, training=True, engine=engine))  # the next step runs


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("batch_first", [False, True])
def test_reusing_the_input_buffers_does_not_change_the_gradients(engine, training, batch_first):
    rng = np.random.default_rng(1)
    params = ar.PackedParams.init(SPEC, seed=0)
    x = rng.standard_normal((2, 5, 3) if batch_first else (5, 2, 3))
    h0 = rng.standard_normal((2, 2, 4))
    expected = ar.rnn_backward(ar.rnn_forward(params, x.copy(), h0=h0.copy(), batch_first=batch_first,
                                              training=training, engine=engine), dy=DY[batch_first])
    res = ar.rnn_forward(params, x, h0=h0, batch_first=batch_first, training=training, engine=engine)
    x[...] = rng.standard_normal(x.shape)   # a data loader refills its buffer
    h0[...] = 0.0
    got = ar.rnn_backward(res, dy=DY[batch_first])
    np.testing.assert_array_equal(got.dparams.data, expected.dparams.data)
    np.testing.assert_array_equal(got.dx, expected.dx)
    np.testing.assert_array_equal(got.dh0, expected.dh0)


# -- on a GPU: a fingerprint compared on the device, raised without waiting --------------------------------
@pytest.fixture
def gpu_like(monkeypatch):
    """The stand-in CuPy (the check runs the same code as on a GPU: device slots, an async copy into pinned
    memory, an event) with the reference engine on it."""
    from support import fake_cupy

    from arrayrnn.frontend import guard

    monkeypatch.delenv("ARRAYRNN_SYNC_GUARD", raising=False)
    guard._PENDING.clear()
    with fake_cupy.installed() as cp:
        yield cp
    guard._PENDING.clear()


def _device_case(cp, training):
    params = ar.PackedParams.init(SPEC, seed=0, xp=cp)
    x = cp.asarray(np.random.default_rng(0).standard_normal((5, 2, 3)))
    return params, x, ar.rnn_forward(params, x, training=training, engine="reference")


@pytest.mark.parametrize("training", [True, False])
def test_on_a_gpu_the_write_is_raised_by_the_next_call_without_waiting(gpu_like, training):
    from support import fake_cupy

    cp = gpu_like
    params, x, res = _device_case(cp, training)
    params.data -= 0.1
    syncs = fake_cupy.TRANSFERS["sync"]
    ar.rnn_backward(res, dy=cp.ones_like(res.y))  # queued; the GPU is not waited for
    assert fake_cupy.TRANSFERS["sync"] == syncs
    with pytest.raises(ValueError, match="an earlier rnn_backward .*modified in place between rnn_forward "
                                         "and rnn_backward"):
        ar.rnn_forward(params, x, engine="reference")
    ar.rnn_forward(params, x, engine="reference")  # reported once


def test_on_a_gpu_synchronize_waits_and_raises(gpu_like):
    from arrayrnn.frontend import guard

    params, _, res = _device_case(gpu_like, True)
    params.view(1, 0, "b_hh")[0] += 1e-12
    ar.rnn_backward(res)
    with pytest.raises(ValueError, match="modified in place"):
        guard.synchronize()


def test_on_a_gpu_the_sync_guard_variable_raises_in_the_backward(gpu_like, monkeypatch):
    params, _, res = _device_case(gpu_like, True)
    params.data[0] += 1.0
    monkeypatch.setenv("ARRAYRNN_SYNC_GUARD", "1")
    with pytest.raises(ValueError, match="^params.data was modified in place"):
        ar.rnn_backward(res)


def test_on_a_gpu_an_unchanged_buffer_passes(gpu_like):
    from arrayrnn.frontend import guard

    cp = gpu_like
    params, x, res = _device_case(cp, True)
    params.data[...] = params.data.copy()
    ar.rnn_backward(res, dy=cp.ones_like(res.y))
    guard.synchronize()
    ar.rnn_backward(ar.rnn_forward(params, x, training=True, engine="reference"))
    guard.synchronize()


# -- after an inference forward: what was written is compared, not recomputed outputs ----------------------
def test_backward_after_inference_never_raises_when_nothing_was_written(engine, threads):
    """The recompute may round differently from the forward (here the numba engine's plan for 3 threads
    against 2, which gives other last bits for this LSTM); only a write into the weights raises."""
    spec = ar.RNNSpec(mode="lstm", input_size=32, hidden_size=64, num_layers=2, dtype="float64")
    params = ar.PackedParams.init(spec, seed=0)
    x = np.random.default_rng(0).standard_normal((20, 16, 32))
    lengths = np.random.default_rng(1).integers(0, 21, 16)
    threads(3)
    res = ar.rnn_forward(params, x, lengths, engine=engine)
    threads(2)
    got = ar.rnn_backward(res, dy=np.ones_like(res.y))
    want = ar.rnn_backward(ar.rnn_forward(params, x, lengths, training=True, engine=engine),
                           dy=np.ones_like(res.y))
    np.testing.assert_allclose(got.dparams.data, want.dparams.data, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got.dx, want.dx, rtol=1e-10, atol=1e-12)


def test_after_inference_a_write_no_output_shows_is_found_and_a_restored_one_passes(engine):
    """W_hh at T = 1 from zero states changes no output, but it is a write: found, as after a training
    forward. A value written and written back leaves the weights as the forward read them."""
    params = ar.PackedParams.init(SPEC, seed=0)
    x = np.ones((1, 2, 3))
    res = ar.rnn_forward(params, x, engine=engine)
    params.view(0, 0, "W_hh")[...] += 1.0
    with pytest.raises(ValueError, match="modified in place between rnn_forward and rnn_backward"):
        ar.rnn_backward(res)
    res = ar.rnn_forward(params, x, engine=engine)
    kept = params.data.copy()
    params.data *= 2.0
    params.data[...] = kept
    ar.rnn_backward(res)


def test_a_forward_under_no_backward_keeps_nothing_and_its_backward_says_why(engine, monkeypatch):
    """The adapters' inference calls (no gradient will follow) keep no record for a backward; the numba
    engine runs on the buffer's private copy, made once while the weights stay as they are
    (guard.frozen_copy), the reference engine on the buffer itself."""
    from arrayrnn.frontend import guard

    made = []
    real = guard.HostSnapshot
    monkeypatch.setattr(guard, "HostSnapshot", lambda data: made.append(1) or real(data))
    params = ar.PackedParams.init(SPEC, seed=0)
    with guard.no_backward():
        res = ar.rnn_forward(params, np.ones((5, 2, 3)), engine=engine)
        ar.rnn_forward(params, np.ones((5, 2, 3)), engine=engine)
    assert made == ([1] if engine == "numba" else [])
    with pytest.raises(ValueError, match=r"ran inside arrayrnn.frontend.guard.no_backward\(\)"):
        ar.rnn_backward(res)
    ar.rnn_backward(ar.rnn_forward(params, np.ones((5, 2, 3)), engine=engine))  # outside it: recorded
    assert made == [1]  # numba: the same copy, the weights did not change
    params.data[0] += 1.0
    ar.rnn_backward(ar.rnn_forward(params, np.ones((5, 2, 3)), engine=engine))
    assert made == [1, 1]


@pytest.mark.parametrize("training", [True, False])
def test_a_cell_steps_backward_compares_the_weights_it_stepped_with(engine, training):
    spec = ar.RNNSpec(mode="gru", input_size=3, hidden_size=4, dtype="float64")
    params = ar.PackedParams.init(spec, seed=0)
    x = np.ones((2, 3))
    res = ar.cell_step(params, x, training=training, engine=engine)
    params.view(0, 0, "b_hh")[0] += 1e-12
    with pytest.raises(ValueError, match="modified in place"):
        ar.cell_step_backward(res, dh=np.ones_like(res.h))
    params.view(0, 0, "b_hh")[0] -= 1e-12
    res = ar.cell_step(params, x, training=training, engine=engine)
    want = ar.cell_step_backward(ar.cell_step(params.copy(), x, training=True, engine=engine),
                                 dh=np.ones_like(res.h))
    got = ar.cell_step_backward(res, dh=np.ones_like(res.h))
    np.testing.assert_allclose(got.dparams.data, want.dparams.data, rtol=1e-12)


# -- the GPU engines on their CPU stand-ins (the cupy engine's: tests_cudasim/test_gpu_probe_sim.py) -------
@requires_cudnn
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("written", [True, False])
def test_the_cudnn_engine_reports_a_write_and_only_a_write(monkeypatch, training, written):
    """The cuDNN dry run (real cuDNN host code, emulated compute calls): the backward of an inference
    forward reruns it in TRAINING mode, which on a GPU may round otherwise; the guard compares the weights'
    fingerprints, so it raises exactly when ``params.data`` was written in between."""
    from support import cudnn_dry_run

    from arrayrnn.frontend import guard

    monkeypatch.delenv("ARRAYRNN_SYNC_GUARD", raising=False)
    guard._PENDING.clear()
    spec = ar.RNNSpec(mode="gru", input_size=3, hidden_size=4, num_layers=2, dtype="float64")
    with cudnn_dry_run.installed() as cp:
        params = ar.PackedParams.init(spec, seed=1, xp=cp).to_format("cudnn")
        x = cp.asarray(np.random.default_rng(1).standard_normal((5, 2, 3)))
        res = ar.rnn_forward(params, x, training=training, engine="cudnn")
        if written:
            params.data[3] += 1e-9
        ar.rnn_backward(res, dy=cp.ones_like(res.y))
        if written:
            with pytest.raises(ValueError, match="modified in place between rnn_forward and rnn_backward"):
                guard.synchronize()
        else:
            guard.synchronize()
    guard._PENDING.clear()


@requires_cudnn
def test_on_a_gpu_the_fingerprint_follows_the_engines_launches(monkeypatch):
    """On CuPy arrays the forward's fingerprint of ``params.data`` is taken after the engine's forward has
    enqueued its work (the stream orders it after the forward's reads, and its host work no longer delays the
    first kernel); on NumPy the host copy is taken before, since the engine reads the frozen copy."""
    from support import cudnn_dry_run

    from arrayrnn.engines.numba.engine import NumbaEngine
    from arrayrnn.frontend import guard

    monkeypatch.delenv("ARRAYRNN_SYNC_GUARD", raising=False)
    guard._PENDING.clear()
    order = []
    monkeypatch.setattr(NumbaEngine, "forward", _recorded(NumbaEngine.forward, "forward", order))
    monkeypatch.setattr(guard, "snapshot", _recorded(guard.snapshot, "snapshot", order))
    spec = ar.RNNSpec(mode="lstm", input_size=3, hidden_size=4, dtype="float64")
    with cudnn_dry_run.installed() as cp:
        from arrayrnn.engines.cudnn.engine import CudnnEngine

        monkeypatch.setattr(CudnnEngine, "forward", _recorded(CudnnEngine.forward, "forward", order))
        params = ar.PackedParams.init(spec, seed=1, xp=cp).to_format("cudnn")
        res = ar.rnn_forward(params, cp.ones((5, 2, 3)), training=True, engine="cudnn")
        assert order == ["forward", "snapshot"]
        params.data[0] += 1.0  # after the forward: still found
        ar.rnn_backward(res, dy=cp.ones_like(res.y))
        with pytest.raises(ValueError, match="modified in place"):
            guard.synchronize()
    guard._PENDING.clear()
    order.clear()
    ar.rnn_forward(ar.PackedParams.init(spec, seed=1), np.ones((5, 2, 3)), engine="numba")
    assert order == ["snapshot", "forward"]


def _recorded(function, name, order):
    def recorded(*args, **kwargs):
        order.append(name)
        return function(*args, **kwargs)
    return recorded


def test_the_host_copy_compares_values_and_an_untouched_buffer_costs_one_memcmp(monkeypatch):
    """A NumPy forward's record: unchanged bits pass through one ``memcmp`` (no elementwise comparison); a
    write that changes no value passes too (``-0.0`` over ``0.0``, another NaN over a NaN); one ulp raises."""
    from arrayrnn.frontend.guard import HostSnapshot

    data = np.array([0.0, 1.0, np.nan, 2.5], np.float32)
    record = HostSnapshot(data)
    with monkeypatch.context() as m:
        m.setattr(np, "array_equal", None)  # an elementwise comparison would fail
        record.assert_unchanged(data)
    data[0] = -0.0
    data.view(np.uint32)[2] ^= 1  # another NaN payload
    record.assert_unchanged(data)
    data[3] = np.nextafter(np.float32(2.5), np.float32(3))
    with pytest.raises(ValueError, match="modified in place"):
        record.assert_unchanged(data)
