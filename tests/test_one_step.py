"""``rnn_forward`` over one time step (inference, NumPy) as one cell step per layer-direction
(arrayrnn.engines.one_step): the call it serves, its results against PyTorch and the stack driver, its
backward, the weights written between calls, and the calls it leaves to the driver."""

import contextlib
import itertools

import numpy as np
import pytest
import torch
from support.fresh_process import run_fresh
from support.twin_cells import TWINS, twin_params

import arrayrnn as ar
from arrayrnn.engines.numba import step as numba_step
from arrayrnn.frontend import rnn as frontend

pytestmark = pytest.mark.usefixtures("auto_takes_numba")

TORCH_MODULES = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn_tanh": torch.nn.RNN,
                 "rnn_relu": torch.nn.RNN}


@pytest.fixture
def served(monkeypatch):
    """The calls the one-step path ran (a list of 1 per call)."""
    ran = []

    def spy(*args, **kwargs):
        ran.append(1)
        return real(*args, **kwargs)

    real = frontend.one_step_forward
    monkeypatch.setattr(frontend, "one_step_forward", spy)
    return ran


@contextlib.contextmanager
def _driver():
    """Every call inside goes through the stack driver."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(frontend, "serves_one_step", lambda engine, call: False)
        yield


def _inputs(spec, B, batch_first=False, states=True, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, 1, spec.input_size) if batch_first else (1, B, spec.input_size))
    h0 = rng.standard_normal(spec.state_shape(B)) if states else None
    c0 = rng.standard_normal(spec.state_shape(B, cell=True)) if states and spec.has_cell else None
    return *(a.astype(spec.dtype) if a is not None else None for a in (x, h0, c0)),


CASES = [dict(mode=m, num_layers=L, bidirectional=bi) for m, L, bi in
         itertools.product(("lstm", "gru", "rnn_tanh", "rnn_relu"), (1, 2), (False, True))]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c.values())))
@pytest.mark.parametrize("B", [1, 3])
def test_one_step_equals_pytorch(served, case, B):
    spec = ar.RNNSpec(input_size=5, hidden_size=6, dtype="float64", **case)
    params = ar.PackedParams.init(spec, seed=1)
    x, h0, c0 = _inputs(spec, B)
    res = ar.rnn_forward(params, x, h0=h0, c0=c0, engine="auto")
    assert served == [1] and res.engine == "numba"

    kwargs = dict(num_layers=spec.num_layers, bidirectional=spec.bidirectional)
    if spec.mode.startswith("rnn"):
        kwargs["nonlinearity"] = spec.mode.removeprefix("rnn_")
    module = TORCH_MODULES[spec.mode](5, 6, **kwargs).double()
    torch.nn.utils.vector_to_parameters(torch.from_numpy(params.data.copy()), module.parameters())
    with torch.no_grad():
        hx = (torch.from_numpy(h0), torch.from_numpy(c0)) if spec.has_cell else torch.from_numpy(h0)
        y, states = module(torch.from_numpy(x), hx)
    h_n, c_n = states if spec.has_cell else (states, None)
    np.testing.assert_allclose(res.y, y.numpy(), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(res.h_n, h_n.numpy(), rtol=1e-12, atol=1e-13)
    if spec.has_cell:
        np.testing.assert_allclose(res.c_n, c_n.numpy(), rtol=1e-12, atol=1e-13)
    else:
        assert res.c_n is None


OPTIONS = [dict(mode="lstm", proj_size=3, num_layers=2, bidirectional=True),
           dict(mode="lstm", cell_clip=(-0.3, 0.8), bias="single_inp"),
           dict(mode="gru", reset_after=False, bias="single_rec", num_layers=2),
           dict(mode="gru", bias=False, bidirectional=True),
           dict(mode="lstm", dropout=0.5, num_layers=3),  # inference: no inter-layer dropout
           dict(mode="cifg", num_layers=2, bidirectional=True),
           dict(mode="slstm", num_layers=2)]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda c: "-".join(map(str, c.values())))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("B", [1, 4])
@pytest.mark.parametrize("batch_first", [False, True])
def test_one_step_equals_the_stack_driver(served, options, dtype, B, batch_first):
    from arrayrnn.cells import cifg, slstm  # noqa: F401 - registers the modes

    spec = ar.RNNSpec(input_size=5, hidden_size=7, dtype=dtype, **options)
    params = ar.PackedParams.init(spec, seed=2)
    x, h0, c0 = _inputs(spec, B, batch_first)
    ones = np.ones(B, np.int64)
    fast = ar.rnn_forward(params, x, ones, h0=h0, c0=c0, batch_first=batch_first, engine="numba")
    zeros = ar.rnn_forward(params, x, batch_first=batch_first, engine="numba")  # zero initial states
    assert served == [1, 1]
    with _driver():
        slow = ar.rnn_forward(params, x, h0=h0, c0=c0, batch_first=batch_first, engine="numba")
        slow_zeros = ar.rnn_forward(params, x, batch_first=batch_first, engine="numba")
    for a, b in ((fast, slow), (zeros, slow_zeros)):  # the driver's bits: the same packed products
        assert a.y.shape == b.y.shape and a.y.dtype == b.y.dtype and a.y.flags.c_contiguous
        for name in ("y", "h_n", "c_n"):
            got, want = getattr(a, name), getattr(b, name)
            assert (got is None) == (want is None)
            if got is not None:
                np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("B", [1, 3])
@pytest.mark.parametrize("mode", list(TWINS))
def test_a_twin_cell_gives_the_builtin_bits_in_one_step(served, mode, B):
    """docs/guide/custom_cells.md: each twin gives the built-in's bits, engine by engine; here on the one-step
    path (a one-row built-in step that read the weights through BLAS would not)."""
    spec = ar.RNNSpec(mode, input_size=5, hidden_size=6, num_layers=2, bidirectional=True, dtype="float32")
    params = ar.PackedParams.init(spec, seed=3)
    x, h0, c0 = _inputs(spec, B)
    builtin = ar.rnn_forward(params, x, h0=h0, c0=c0, engine="numba")
    twin = ar.rnn_forward(twin_params(params), x, h0=h0, c0=c0, engine="numba")
    assert served == [1, 1]
    for a, b in ((builtin.y, twin.y), (builtin.h_n, twin.h_n), (builtin.c_n, twin.c_n)):
        assert (a is None) == (b is None) and (a is None or np.array_equal(a, b))


def test_backward_after_a_one_step_forward_equals_the_driver(served):
    spec = ar.RNNSpec(mode="lstm", input_size=4, hidden_size=5, num_layers=2, bidirectional=True,
                      dtype="float64")
    params = ar.PackedParams.init(spec, seed=3)
    x, h0, c0 = _inputs(spec, 2)
    res = ar.rnn_forward(params, x, h0=h0, c0=c0, engine="numba")
    assert served == [1]
    grads = ar.rnn_backward(res, np.ones_like(res.y), np.ones_like(res.h_n))
    with _driver():
        base = ar.rnn_forward(params, x, h0=h0, c0=c0, engine="numba")
        want = ar.rnn_backward(base, np.ones_like(base.y), np.ones_like(base.h_n))
    for name in ("dx", "dh0", "dc0"):
        np.testing.assert_array_equal(getattr(grads, name), getattr(want, name))
    np.testing.assert_array_equal(grads.dparams.data, want.dparams.data)


def test_a_write_between_forward_and_backward_still_raises(served):
    spec = ar.RNNSpec(mode="gru", input_size=4, hidden_size=5, dtype="float64")
    params = ar.PackedParams.init(spec, seed=3)
    res = ar.rnn_forward(params, _inputs(spec, 1)[0], engine="numba")
    params.view(0, 0, "b_hh")[0] += 1.0
    with pytest.raises(ValueError, match="params.data was modified"):
        ar.rnn_backward(res, np.ones_like(res.y))
    assert served == [1]


@pytest.mark.parametrize("write", ["optimizer", "bias", "one_ulp"])
def test_a_write_between_calls_is_seen_by_the_next_call(served, write):
    """The step weights are made once per frozen copy: a write gives the next call a new copy, so new
    weights, whichever block and however small."""
    spec = ar.RNNSpec(mode="lstm", input_size=4, hidden_size=5, num_layers=2, dtype="float64")
    params = ar.PackedParams.init(spec, seed=4)
    x = _inputs(spec, 1)[0]
    before = ar.rnn_forward(params, x, engine="numba")
    if write == "optimizer":
        params.data -= 0.1
    elif write == "bias":
        params.view(1, 0, "b_ih")[3] += 0.5
    else:
        params.data[-1] = np.nextafter(params.data[-1], np.inf)
    after = ar.rnn_forward(params, x, engine="numba")
    fresh = ar.rnn_forward(ar.PackedParams(spec, params.data.copy()), x, engine="numba")
    assert served == [1, 1, 1]
    np.testing.assert_array_equal(after.y, fresh.y)
    np.testing.assert_array_equal(after.h_n, fresh.h_n)
    if write != "one_ulp":
        assert not np.array_equal(after.y, before.y)


@pytest.mark.parametrize("call", ["training", "two steps", "a zero length", "all states", "variant",
                                  "reference engine"])
def test_calls_it_leaves_to_the_driver(served, call):
    spec = ar.RNNSpec(mode="lstm", input_size=4, hidden_size=5, dtype="float64")
    x = _inputs(spec, 2)[0]
    kwargs = {"engine": "numba"}
    if call == "training":
        kwargs["training"] = True
    elif call == "two steps":
        x = np.concatenate([x, x])
    elif call == "a zero length":
        kwargs["lengths"] = np.array([1, 0])
    elif call == "all states":
        kwargs["return_all_states"] = True
    elif call == "variant":
        spec = spec.replace(peepholes=True)
    else:
        kwargs["engine"] = "reference"
    res = ar.rnn_forward(ar.PackedParams.init(spec, seed=0), x, **kwargs)
    assert served == [] and res.y.shape == (x.shape[0], 2, 5)


def test_a_call_the_driver_splits_over_threads_stays_with_the_driver(monkeypatch, served):
    spec = ar.RNNSpec(mode="lstm", input_size=4, hidden_size=5, dtype="float64")
    monkeypatch.setattr(numba_step, "one_step_on_one_thread", lambda spec, rows: False)
    ar.rnn_forward(ar.PackedParams.init(spec, seed=0), _inputs(spec, 2)[0], engine="numba")
    assert served == []
    monkeypatch.setattr(numba_step, "one_step_on_one_thread", lambda spec, rows: True)
    ar.rnn_forward(ar.PackedParams.init(spec, seed=0), _inputs(spec, 2)[0], engine="numba")
    assert served == [1]


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_one_step_on_one_thread_reads_the_drivers_plan(threads):
    """Served exactly where the driver's plan runs every loop and projection on one thread (its call may
    still hold BLAS to one thread at 8-15 rows, where a column split could run but does not)."""
    from arrayrnn.engines.numba.plan import forward_plan, one_step_on_one_thread

    before = ar.get_num_threads()
    ar.set_num_threads(threads)
    try:
        for spec in (ar.RNNSpec(mode="lstm", input_size=256, hidden_size=256),
                     ar.RNNSpec(mode="lstm", input_size=64, hidden_size=512),
                     ar.RNNSpec(mode="gru", input_size=64, hidden_size=64, bidirectional=True, num_layers=2)):
            for rows in (1, 8, 12, 16, 64, 256):
                x = np.zeros((1, rows, spec.input_size), np.float32)
                plan = forward_plan(spec, x, np.array([rows]))
                alone = (plan.schedule is None and plan.row_threads == 1 and plan.column_parts == 1
                         and all(plan.packed_projection))
                assert one_step_on_one_thread(spec, rows) == alone
                assert alone or threads > 1 or not all(plan.packed_projection)
        assert one_step_on_one_thread(ar.RNNSpec(mode="lstm", input_size=256, hidden_size=256), 8)
    finally:
        ar.set_num_threads(before)


_FRESH = """
    import numpy as np
    import arrayrnn as ar
    from arrayrnn.engines.numba import warmup as W
    from arrayrnn.frontend import rnn as frontend

    served = []
    real = frontend.one_step_forward
    frontend.one_step_forward = lambda *args: (served.append(1), real(*args))[1]
    spec = ar.RNNSpec(mode="gru", input_size=3, hidden_size=5, num_layers=2, dtype="float64")
    params = ar.PackedParams.init(spec, seed=0)
    x = np.random.default_rng(0).standard_normal((1, 2, 3))
    first = ar.rnn_forward(params, x)                     # the reference engine while numba compiles
    assert first.engine == "reference" and served == [], (first.engine, served)
    assert W.wait(spec, training=False, timeout=800)
    before = W.compiled_signatures()
    h = None
    for step in range(3):                                 # a streaming loop, its state fed back
        res = ar.rnn_forward(params, x, h0=h)
        want = ar.rnn_forward(params, x, h0=h, engine="reference")
        np.testing.assert_allclose(res.h_n, want.h_n, rtol=1e-12, atol=1e-13)
        h = res.h_n
    assert res.engine == "numba" and served == [1, 1, 1], (res.engine, served)
    assert W.new_signatures(before, W.compiled_signatures()) == {}
    print("ok")
"""


def test_a_users_fresh_process_streams_through_the_one_step_path(tmp_path):
    """The default setting (background compile on, an empty cache): once the family has loaded, ``auto``
    runs a one-step call through the one-step path and compiles nothing more in the caller's process."""
    out = run_fresh(_FRESH, tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize("bidirectional", [False, True])
def test_results_own_their_memory_and_a_later_call_never_writes_them(served, bidirectional):
    spec = ar.RNNSpec(mode="lstm", input_size=4, hidden_size=5, bidirectional=bidirectional,
                      dtype="float64")
    params = ar.PackedParams.init(spec, seed=5)
    x, h0, c0 = _inputs(spec, 3)
    first = ar.rnn_forward(params, x, h0=h0, c0=c0, engine="numba")
    kept = [first.y.copy(), first.h_n.copy(), first.c_n.copy()]
    arrays = [first.y, first.h_n, first.c_n, x, h0, c0, params.data]
    assert not any(np.shares_memory(a, b) for i, a in enumerate(arrays[:3]) for b in arrays[i + 1:])
    ar.rnn_forward(params, 2 * x, h0=-h0, c0=c0, engine="numba")
    for got, want in zip((first.y, first.h_n, first.c_n), kept, strict=True):
        np.testing.assert_array_equal(got, want)
    assert served == [1, 1]


def test_two_caller_threads_streaming_on_the_same_weights_get_the_single_thread_results(served):
    """Each thread steps on its own kept loop over the same step weights (made once per frozen copy)."""
    from concurrent.futures import ThreadPoolExecutor

    spec = ar.RNNSpec(mode="lstm", input_size=4, hidden_size=5, num_layers=2, dtype="float64")
    params = ar.PackedParams.init(spec, seed=6)
    inputs = [_inputs(spec, 2, seed=k) for k in range(8)]
    alone = [ar.rnn_forward(ar.PackedParams(spec, params.data.copy()), x, h0=h0, c0=c0, engine="numba")
             for x, h0, c0 in inputs]

    def streams(k: int) -> bool:
        x, h0, c0 = inputs[k]
        return all(np.array_equal(ar.rnn_forward(params, x, h0=h0, c0=c0, engine="numba").h_n, alone[k].h_n)
                   for _ in range(50))

    with ThreadPoolExecutor(2) as pool:
        assert all(pool.map(streams, range(len(inputs))))
    assert len(served) == len(inputs) * 51
