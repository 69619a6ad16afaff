"""``cell_step`` / ``cell_step_backward`` (one step of one cell) and the step engines behind them, on every
engine: a step equals a one-step sequence through ``rnn_forward`` / ``rnn_backward`` (reference engine),
PyTorch's cells (the oracle for the modes they have) and float64 central differences."""

from __future__ import annotations

import concurrent.futures
import threading

import numpy as np
import pytest
from support.engine_cases import EngineOnDevice, cpu_engines, dry_run_cases, engine_fixture, gpu_cases
from support.rnn_cases import host, make_case, on_device, xp_of

import arrayrnn as ar
from arrayrnn import RNNSpec
from arrayrnn.engines import load_engine, stack, step_engine, thresholds
from arrayrnn.engines import step as step_module
from arrayrnn.engines.base import Engine
from arrayrnn.engines.step import StepEngine

# conftest's engines that step (cuDNN runs whole sequences only: test_cell_step_on_cudnn_is_refused...)
engine = engine_fixture([*(EngineOnDevice(name, np) for name in cpu_engines()),
                         *(case for case in gpu_cases() if str(case) != "cudnn")])

SPECS = {
    "lstm": {"mode": "lstm"},
    "lstm-proj": {"mode": "lstm", "proj_size": 2},
    "lstm-clip-nobias": {"mode": "lstm", "cell_clip": 0.4, "bias": False},
    "gru": {"mode": "gru"},
    "gru-reset-before": {"mode": "gru", "reset_after": False},
    "gru-single-rec": {"mode": "gru", "bias": "single_rec"},
    "rnn-tanh-single-inp": {"mode": "rnn_tanh", "bias": "single_inp"},
    "rnn-relu": {"mode": "rnn_relu"},
}


def cell_case(name: str, B: int = 3, dtype: str = "float64", seed: int = 0):
    spec = RNNSpec(input_size=4, hidden_size=5, dtype=dtype, **SPECS[name])
    return make_case(spec, 1, B, seed=seed, lengths="full", scale=1.5)


def step(case, engine, training=True):
    """``cell_step`` of the case's one step on the engine's device, and its backward with the case's
    cotangents of ``h_n`` / ``c_n``."""
    dev = on_device(case, engine)
    res = ar.cell_step(dev.params, dev.x[0], dev.h0[0], dev.c0[0] if dev.c0 is not None else None,
                       training=training, engine=engine)
    return res, ar.cell_step_backward(res, dev.dh_n[0], dev.dc_n[0] if dev.dc_n is not None else None)


def one_step_sequence(case):
    """The oracle: the same step as a sequence of length one on the reference engine."""
    res = ar.rnn_forward(case.params, case.x, h0=case.h0, c0=case.c0, training=True, engine="reference")
    return res, ar.rnn_backward(res, np.zeros_like(res.y), case.dh_n, case.dc_n)


@pytest.mark.parametrize("name", list(SPECS))
def test_a_step_equals_a_one_step_sequence(name, engine):
    case = cell_case(name)
    res, g = step(case, engine)
    want, want_g = one_step_sequence(case)
    tol = {"rtol": 1e-10, "atol": 1e-12}
    np.testing.assert_allclose(host(res.h), want.h_n[0], **tol)
    np.testing.assert_allclose(host(g.dx), want_g.dx[0], **tol)
    np.testing.assert_allclose(host(g.dh), want_g.dh0[0], **tol)
    np.testing.assert_allclose(host(g.dparams.data), want_g.dparams.data, **tol)
    if case.spec.has_cell:
        np.testing.assert_allclose(host(res.c), want.c_n[0], **tol)
        np.testing.assert_allclose(host(g.dc), want_g.dc0[0], **tol)
    assert res.engine == str(engine) and g.dparams.spec == case.spec


@pytest.mark.parametrize("name", ["lstm", "gru-reset-before", "lstm-proj", "rnn-relu"])
def test_every_step_gradient_entry_equals_central_differences(name, engine):
    case = cell_case(name, B=2, seed=3)
    res, g = step(case, engine)
    inputs = {"params": case.params.data, "x": case.x[0], "h": case.h0[0]}
    grads = {"params": g.dparams.data, "x": g.dx, "h": g.dh}
    if case.spec.has_cell:
        inputs["c"], grads["c"] = case.c0[0], g.dc
    for name_, value in inputs.items():
        numeric = _central_differences(case, engine, name_, value)
        np.testing.assert_allclose(host(grads[name_]), numeric, rtol=1e-6, atol=1e-8, err_msg=name_)


def _central_differences(case, engine, name, value, eps=1e-6):
    def loss(changed):
        args = {"params": case.params.data, "x": case.x[0], "h": case.h0[0],
                "c": case.c0[0] if case.c0 is not None else None, name: changed}
        dev = on_device(case.with_(params=ar.PackedParams(case.spec, args["params"])), engine)
        xp = xp_of(engine)
        res = ar.cell_step(dev.params, xp.asarray(args["x"]), xp.asarray(args["h"]),
                           xp.asarray(args["c"]) if args["c"] is not None else None, engine=engine)
        total = np.sum(host(res.h) * case.dh_n[0])
        return total + (np.sum(host(res.c) * case.dc_n[0]) if res.c is not None else 0.0)

    flat = value.reshape(-1)
    grad = np.empty_like(flat)
    for i in range(flat.size):
        up, down = flat.copy(), flat.copy()
        up[i] += eps
        down[i] -= eps
        grad[i] = (loss(up.reshape(value.shape)) - loss(down.reshape(value.shape))) / (2 * eps)
    return grad.reshape(value.shape)


@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
def test_a_step_equals_torchs_cell(mode):
    torch = pytest.importorskip("torch")
    cls = {"lstm": torch.nn.LSTMCell, "gru": torch.nn.GRUCell}.get(mode, torch.nn.RNNCell)
    kwargs = {"nonlinearity": mode[4:]} if mode.startswith("rnn") else {}
    cell = cls(4, 5, dtype=torch.float64, **kwargs)
    params = _params_of(cell, mode)
    rng = np.random.default_rng(0)
    x, h, c, dh, dc = (rng.standard_normal((3, n)) for n in (4, 5, 5, 5, 5))
    xt, ht, ct = (torch.tensor(a, requires_grad=True) for a in (x, h, c))
    out = cell(xt, (ht, ct)) if mode == "lstm" else (cell(xt, ht),)
    torch.autograd.backward(out, [torch.tensor(dh), torch.tensor(dc)][:len(out)])
    res = ar.cell_step(params, x, h, c if mode == "lstm" else None, training=True)
    g = ar.cell_step_backward(res, dh, dc if mode == "lstm" else None)
    np.testing.assert_allclose(res.h, out[0].detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(g.dx, xt.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(g.dh, ht.grad.numpy(), rtol=1e-12, atol=1e-12)
    torch_grads = np.concatenate([p.grad.numpy().reshape(-1) for p in cell.parameters()])
    np.testing.assert_allclose(g.dparams.data, torch_grads, rtol=1e-12, atol=1e-12)
    if mode == "lstm":
        np.testing.assert_allclose(res.c, out[1].detach().numpy(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(g.dc, ct.grad.numpy(), rtol=1e-12, atol=1e-12)


def _params_of(cell, mode):
    """A torch cell's parameters in its order (W_ih, W_hh, b_ih, b_hh): the canonical layout of the cell."""
    spec = RNNSpec(mode=mode, input_size=cell.input_size, hidden_size=cell.hidden_size, dtype="float64")
    return ar.PackedParams(spec, np.concatenate([p.detach().numpy().reshape(-1) for p in cell.parameters()]))


def test_a_backward_after_an_inference_step_recomputes_it(engine):
    case = cell_case("lstm")
    trained, after_inference = (step(case, engine, training=t)[1] for t in (True, False))
    np.testing.assert_array_equal(host(after_inference.dparams.data), host(trained.dparams.data))
    np.testing.assert_array_equal(host(after_inference.dx), host(trained.dx))


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("engine", ["reference", "numba"])
def test_every_weight_gradient_product_is_written_into_its_block(engine, name, rows, monkeypatch):
    """The weight gradients' products of a step and of a sequence write their block of the gradient buffer
    themselves (``matmul(a, b, out=block)``), no temporary copied in (one row: the outer products); the
    step still equals the one-step sequence."""
    original, into = stack._weight_grads, []

    def recording(matmul, spec, grads, *args, **kwargs):
        def product(a, b, out=None):
            into.append(out is not None and np.shares_memory(out, grads.data))
            return matmul(a, b, out=out)
        return original(product, spec, grads, *args, **kwargs)

    monkeypatch.setattr(stack, "_weight_grads", recording)
    monkeypatch.setattr(step_module, "_weight_grads", recording)
    case = cell_case(name, B=rows)
    _, g = step(case, engine)
    res = ar.rnn_forward(case.params, case.x, h0=case.h0, c0=case.c0, training=True, engine=engine)
    want = ar.rnn_backward(res, np.zeros_like(res.y), case.dh_n, case.dc_n)
    assert len(into) >= 4 and all(into)
    np.testing.assert_allclose(g.dparams.data, want.dparams.data, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("engine", ["reference", "numba"])
def test_zero_states_by_default_and_the_inputs_are_not_written(engine):
    """(One named engine: with engine='auto' in a new process, a training and an inference call of one
    family may run on different engines for a while, which agree within rounding, not bitwise.)"""
    case = cell_case("lstm")
    x, h, c = case.x[0].copy(), np.zeros((3, 5)), np.zeros((3, 5))
    for training in (True, False):  # (an inference step may read the weights otherwise: its own bits)
        res = ar.cell_step(case.params, x, training=training, engine=engine)
        explicit = ar.cell_step(case.params, x, h, c, training=training, engine=engine)
        np.testing.assert_array_equal(res.h, explicit.h)
        np.testing.assert_array_equal(res.c, explicit.c)
        np.testing.assert_array_equal(x, case.x[0])
        assert not np.shares_memory(res.h, x)


@pytest.mark.parametrize("training", [True, False])
def test_a_weight_change_between_step_and_backward_raises(training):
    case = cell_case("gru", dtype="float32")
    params = case.params.copy()
    res = ar.cell_step(params, case.x[0], case.h0[0], training=training)
    params.data[0] += 1.0  # an optimizer step before the backward
    with pytest.raises(ValueError, match="modified in place between|changed between"):
        ar.cell_step_backward(res, case.dh_n[0])


@pytest.mark.parametrize("mutate, error, match", [
    (lambda a: a.update(params=ar.PackedParams.init(RNNSpec(mode="lstm", input_size=4, hidden_size=5,
                                                            num_layers=2, dtype="float64"))),
     ValueError, "num_layers = 2.*one layer in one direction"),
    (lambda a: a.update(params=ar.PackedParams.init(RNNSpec(mode="lstm", input_size=4, hidden_size=5,
                                                            zoneout=0.1, dtype="float64"))),
     ValueError, r"\('zoneout',\); a cell step runs plain cells"),
    (lambda a: a.update(x=np.zeros((1, 3, 4))), ValueError, r"x has shape \(1, 3, 4\); expected a 2-D array"),
    (lambda a: a.update(x=np.zeros((3, 7))), ValueError, r"input_size = 4"),
    (lambda a: a.update(x=np.zeros((0, 4))), ValueError, "at least one row"),
    (lambda a: a.update(x=np.zeros((3, 4), np.float32)), TypeError, "x .*dtype float32.* different dtypes"),
    (lambda a: a.update(h=np.zeros((2, 5))), ValueError, r"h has shape \(2, 5\); expected \(B, H_out\)"),
    (lambda a: a.update(c=np.zeros((3, 4))), ValueError, r"c has shape \(3, 4\); expected \(B, hidden_size"),
    (lambda a: a.update(training=1), TypeError, "training = 1; expected True or False"),
    (lambda a: a.update(params="weights"), TypeError, "params has type str; expected an arrayrnn.Packed"),
])
def test_bad_arguments_are_clear_errors(mutate, error, match):
    case = cell_case("lstm")
    args = {"params": case.params, "x": case.x[0], "h": case.h0[0], "c": case.c0[0], "training": False}
    mutate(args)
    with pytest.raises(error, match=match):
        ar.cell_step(args.pop("params"), args.pop("x"), **args)


def test_a_cell_state_for_a_cell_without_one_and_float16_are_refused():
    case = cell_case("gru")
    with pytest.raises(ValueError, match="c was given but mode = 'gru' has no cell state"):
        ar.cell_step(case.params, case.x[0], case.h0[0], np.zeros((3, 5)))
    res = ar.cell_step(case.params, case.x[0], case.h0[0], training=True)
    with pytest.raises(ValueError, match="dc was given but mode = 'gru'"):
        ar.cell_step_backward(res, case.dh_n[0], np.zeros((3, 5)))
    half = ar.PackedParams(case.spec.replace(dtype="float16"), case.params.data.astype(np.float16))
    with pytest.raises(TypeError, match="a cell step runs float32 and float64"):
        ar.cell_step(half, case.x[0].astype(np.float16))
    with pytest.raises(TypeError, match="expected the CellResult returned by cell_step"):
        ar.cell_step_backward(ar.rnn_forward(case.params, case.x))


def test_the_numba_step_keeps_its_packed_weights_until_a_value_changes():
    pytest.importorskip("numba")
    case = cell_case("lstm", dtype="float32")
    stepper = step_engine(load_engine("numba"))
    data = case.params.data.copy()
    sw = stepper.prepare(case.spec, data)
    stepper.forward(sw, case.x[0], case.h0[0], case.c0[0], keep_cache=False)
    assert sw.packed and stepper.prepare(case.spec, data, sw) is sw
    data[-1] += 1.0  # a write no version counter sees
    renewed = stepper.prepare(case.spec, data, sw)
    assert renewed is not sw
    h_new = stepper.forward(renewed, case.x[0], case.h0[0], case.c0[0], keep_cache=False).h_n
    want = ar.cell_step(ar.PackedParams(case.spec, data), case.x[0], case.h0[0], case.c0[0])
    np.testing.assert_allclose(h_new, want.h, rtol=1e-6, atol=1e-7)
    other = data.copy()
    assert stepper.prepare(case.spec, other, renewed) is not renewed  # same values, other memory


@pytest.mark.parametrize("name", [*SPECS, "cifg"])
def test_the_numba_inference_step_on_its_kept_loop_equals_the_training_step(name):
    """An inference step runs on the thread's kept loop (its buffers reused between calls); it gives what a
    step that builds its loop anew gives (a training step's), for batches that change between calls,
    returns new arrays each call and never writes its inputs. Bit for bit where it runs the same products;
    within rounding where its products run from the caller's buffer (the plain built-in cells,
    ``steps_from_source``: one compiled call of both products)."""
    pytest.importorskip("numba")
    import arrayrnn.cells  # noqa: F401  (registers "cifg")

    spec = RNNSpec(input_size=4, hidden_size=5, dtype="float32", **SPECS.get(name, {"mode": name}))
    stepper = step_engine(load_engine("numba"))
    tol = {"rtol": 1e-5, "atol": 1e-6}
    sw = stepper.prepare(spec, ar.PackedParams.init(spec, seed=1).data)
    rng = np.random.default_rng(0)
    earlier = []
    for B in (3, 3, 1, 4, 3):
        x, h = (rng.standard_normal((B, n)).astype(np.float32) for n in (4, spec.output_size))
        c = rng.standard_normal((B, spec.cell_width)).astype(np.float32) if spec.has_cell else None
        inputs = [a.copy() for a in (x, h, c) if a is not None]
        fast = stepper.forward(sw, x, h, c, keep_cache=False)
        built = stepper.forward(sw, x, h, c, keep_cache=True)
        for a, b in zip(inputs, (x, h, c), strict=False):
            np.testing.assert_array_equal(a, b)
        same = (np.testing.assert_allclose if stepper.steps_from_source(spec, B)
                else lambda a, b, **_: np.testing.assert_array_equal(a, b))
        same(fast.h_n, built.h_n, **tol)
        same(fast.y, built.y, **tol)
        if spec.has_cell:
            same(fast.c_n, built.c_n, **tol)
        earlier.append((fast, fast.h_n.copy()))
    for fast, h_then in earlier:  # a later call never wrote an earlier call's result
        np.testing.assert_array_equal(fast.h_n, h_then)


@pytest.mark.parametrize(("rows", "gemv"), [(1, False), (1, True), (3, False), (9, False)])
@pytest.mark.parametrize("name", ["lstm", "gru", "rnn-tanh-single-inp", "lstm-clip-nobias", "gru-single-rec"])
def test_an_inference_step_from_the_source_reads_the_buffer_as_it_is_at_each_call(name, rows, gemv, threads,
                                                                                  monkeypatch):
    """Steps from the caller's buffer need no prepare: any write (a bias included) reaches the next step.
    Both products in one compiled call (3 and 9 rows: a partial row block and several), or, for one row of
    large weights at more than one thread, BLAS's two GEMVs (``gemv``: the size threshold at 0); the rows
    table set so that any size of weights reads the buffer."""
    pytest.importorskip("numba")
    monkeypatch.setattr(thresholds, "SOURCE_STEP_ROWS", ((rows + 1, 0),))
    monkeypatch.setattr(thresholds, "SOURCE_GEMV_MIN_BYTES", 0 if gemv else 1 << 62)
    case = cell_case(name, B=rows, dtype="float64")
    stepper = step_engine(load_engine("numba"))
    assert stepper.steps_from_source(case.spec, rows) and not stepper.steps_from_source(case.spec, rows + 2)
    data = case.params.data.copy()
    sw = stepper.prepare(case.spec, data)
    args = (case.x[0], case.h0[0], case.c0[0] if case.c0 is not None else None)
    threads(2 if gemv else 1)
    from arrayrnn.engines.numba.source_step import SourceStep

    on_blas = []
    gemv_products = SourceStep._gemv_products
    monkeypatch.setattr(SourceStep, "_gemv_products", lambda *a: on_blas.append(1) or gemv_products(*a))
    for write in (lambda: None, lambda: data.__setitem__(slice(-3, None), 0.5), lambda: data.__imul__(-1.5)):
        write()
        got = stepper.forward(sw, *args, keep_cache=False)
        want = ar.cell_step(ar.PackedParams(case.spec, data.copy()), *args, engine="reference")
        np.testing.assert_allclose(got.h_n, want.h, rtol=1e-12, atol=1e-14)
        if want.c is not None:
            np.testing.assert_allclose(got.c_n, want.c, rtol=1e-12, atol=1e-14)
    assert len(on_blas) == (3 if gemv else 0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_source_step_takes_any_buffer_and_input_with_one_signature_per_dtype(dtype, monkeypatch):
    """A read-only weight buffer and inputs that are strided or read-only step as a writeable, contiguous
    one does, and compile no second signature (weights go as addresses, inputs are copied)."""
    pytest.importorskip("numba")
    from arrayrnn.engines.numba.source_step import gru_source_step

    monkeypatch.setattr(thresholds, "SOURCE_GEMV_MIN_BYTES", 1 << 62)
    case = cell_case("gru", B=3, dtype=dtype)
    stepper = step_engine(load_engine("numba"))
    x, h = case.x[0], case.h0[0]
    want = ar.cell_step(case.params, x, h, engine="reference").h
    frozen = case.params.data.copy()
    frozen.flags.writeable = False
    wide = np.zeros((3, 2 * x.shape[1]), x.dtype)
    wide[:, ::2] = x
    h_read_only = h.copy()
    h_read_only.flags.writeable = False
    got = [stepper.forward(stepper.prepare(case.spec, data), x_in, h_in, None, keep_cache=False).h_n
           for data, x_in, h_in in ((case.params.data.copy(), x, h), (frozen, wide[:, ::2], h_read_only))]
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == "float32" else {"rtol": 1e-12, "atol": 1e-14}
    np.testing.assert_allclose(got[0], want, **tol)
    np.testing.assert_array_equal(got[1], got[0])
    assert stepper.steps_from_source(case.spec, 3)
    assert sum(str(sig[0].dtype) == dtype for sig in gru_source_step.signatures) == 1


def test_which_inference_steps_read_the_source():
    """Up to 16 rows always; up to 32 from 512 KiB of weights, 64 from 4 MiB; never a cell whose loop
    makes its own recurrent product (projection, layer norm, reset-before GRU, a custom cell)."""
    pytest.importorskip("numba")
    stepper = step_engine(load_engine("numba"))

    def reads(rows, H, dtype="float32", mode="lstm", **kw):
        return stepper.steps_from_source(RNNSpec(mode, input_size=H, hidden_size=H, dtype=dtype, **kw), rows)

    assert reads(1, 4) and reads(16, 4) and not reads(17, 4)
    assert reads(32, 128) and not reads(33, 128) and not reads(32, 127)  # 32 * 128 * 128 B = 512 KiB
    assert reads(64, 362) and not reads(65, 362) and not reads(64, 361)  # 32 * (362^2 + 362) B >= 4 MiB
    assert reads(64, 256, "float64") and not reads(64, 255, "float64")
    assert reads(64, 420, mode="gru") and reads(32, 256, mode="rnn_tanh")
    assert not reads(33, 256, mode="rnn_tanh")
    import arrayrnn.cells  # noqa: F401  (registers "cifg")

    for other in ({"proj_size": 8}, {"layer_norm": True}, {"mode": "gru", "reset_after": False},
                  {"mode": "cifg"}):
        assert not reads(1, 256, **other)


def test_threads_stepping_one_cell_at_once_each_get_their_own_results():
    pytest.importorskip("numba")
    spec = RNNSpec(mode="lstm", input_size=8, hidden_size=16, dtype="float64")
    stepper = step_engine(load_engine("numba"))
    sw = stepper.prepare(spec, ar.PackedParams.init(spec, seed=2).data)
    rng = np.random.default_rng(3)
    inputs = [tuple(rng.standard_normal((2, n)) for n in (8, 16, 16)) for _ in range(4)]
    want = [stepper.forward(sw, *args, keep_cache=False).h_n for args in inputs]  # one thread at a time
    start = threading.Barrier(len(inputs))

    def steps(k: int) -> bool:
        start.wait()
        return all(np.array_equal(stepper.forward(sw, *inputs[k], keep_cache=False).h_n, want[k])
                   for _ in range(200))

    with concurrent.futures.ThreadPoolExecutor(len(inputs)) as pool:
        assert all(pool.map(steps, range(len(inputs))))


def test_the_generic_step_engine_sums_its_biases_again_on_every_prepare():
    """Its views read the buffer as it is, but ``input_bias`` is a sum: a bias written in place (an
    optimizer's step) must reach the next step."""
    case = cell_case("gru")
    stepper = step_engine(load_engine("reference"))
    assert type(stepper) is StepEngine
    sw = stepper.prepare(case.spec, case.params.data)
    case.params.view(0, 0, "b_ih")[:] += 1.0
    again = stepper.prepare(case.spec, case.params.data, sw)
    assert again is not sw and again.source is case.params.data
    np.testing.assert_allclose(again.w.input_bias, sw.w.input_bias + 1.0, rtol=1e-15)  # b_ih in every gate


class _WholeSequences(Engine):
    """An engine that is not a stack engine (as cuDNN's): it has no direction kernel to step."""

    name = "whole-sequences"

    def check(self, call):
        return None

    def forward(self, *args, **kwargs):
        raise AssertionError("not called")

    def backward(self, *args, **kwargs):
        raise AssertionError("not called")


def test_an_engine_of_whole_sequences_has_no_step():
    with pytest.raises(ValueError, match="engine = 'whole-sequences' runs whole sequences only; a cell step "
                                         "runs on the numba, cupy or reference engine"):
        step_engine(_WholeSequences())


@pytest.mark.parametrize("cudnn", [case for case in (*gpu_cases(), *dry_run_cases()) if str(case) == "cudnn"])
def test_cell_step_on_cudnn_is_refused_with_the_engines_that_step(cudnn):
    with cudnn.activate():
        case = on_device(cell_case("lstm", dtype="float32"), cudnn)
        with pytest.raises(ValueError, match="engine = 'cudnn' runs whole sequences only"):
            ar.cell_step(case.params, case.x[0], engine="cudnn")
