"""The cudnn engine's per-shape plans, its algorithm choice and its host work per repeated call, on the dry
run (stand-in CuPy, cuDNN validating every call with a fake handle, the compute calls emulated).

A repeated call at the same configuration must reuse its plan: no descriptor created, no size queried, no
host-to-device copy, no synchronisation, one cuDNN compute call per segment; and still equal the
reference engine. The algorithm follows PyTorch's rule and falls back to STANDARD where cuDNN refuses (the
fake handle refuses every persistent algorithm: only a GPU runs them)."""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter

import numpy as np
import pytest
from support.cudnn import requires_cudnn

import arrayrnn as ar
import cudnn_bindings as cb
from arrayrnn.engines.cudnn import config as cf

pytestmark = requires_cudnn

S3_LIKE = ar.RNNSpec(mode="lstm", input_size=4, hidden_size=8, dtype="float64")
SMALL_H = ar.RNNSpec(mode="lstm", input_size=4, hidden_size=8)  # float32, small H: persistent-eligible


@pytest.fixture(scope="module")
def dry():
    """(stand-in CuPy, the dry run's engine module, its support module)."""
    from support import cudnn_dry_run, fake_cupy

    with cudnn_dry_run.installed() as cp:
        yield cp, cudnn_dry_run._engine_module(), cudnn_dry_run, fake_cupy


@pytest.fixture
def descriptors_made(monkeypatch):
    """Counts the cuDNN descriptors created, per class."""
    made: Counter[str] = Counter()
    for cls in (cb.RNNDescriptor, cb.RNNDataDescriptor, cb.TensorDescriptor):
        original = cls.__init__

        def counting(self, *args, _original=original, _name=cls.__name__, **kwargs):
            made[_name] += 1
            _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", counting)
    return made


def _inputs(cp, spec, T=6, B=3, lengths=None, seed=0):
    rng = np.random.default_rng(seed)
    params = ar.PackedParams.init(spec, seed=seed, xp=cp).to_format("cudnn")
    x = cp.asarray(rng.standard_normal((T, B, spec.input_size)).astype(spec.dtype))
    dy = cp.asarray(rng.standard_normal((T, B, spec.num_directions * spec.output_size)).astype(spec.dtype))
    return params, x, dy, None if lengths is None else np.asarray(lengths)


def _step(params, x, dy, lengths):
    res = ar.rnn_forward(params, x, lengths, training=True, engine="cudnn")
    return res, ar.rnn_backward(res, dy)


def _reference(params, x, dy, lengths):
    canonical = params.to_format("canonical")
    host = ar.PackedParams(canonical.spec, canonical.data.get())
    res = ar.rnn_forward(host, x.get(), lengths, training=True, engine="reference")
    return res, ar.rnn_backward(res, dy.get())


@pytest.mark.parametrize("spec, lengths", [
    (S3_LIKE, None),
    (ar.RNNSpec(mode="gru", input_size=3, hidden_size=5, num_layers=2, bidirectional=True, dtype="float64"),
     [6, 0, 4]),
    (ar.RNNSpec(mode="lstm", input_size=3, hidden_size=5, num_layers=3, dropout=0.3, proj_size=3,
                dtype="float64"), [6, 2, 5]),
], ids=["lstm-full", "gru-bi-empty-row", "lstm-dropout-layers"])
def test_a_repeated_call_reuses_its_plan_and_makes_no_host_wait(dry, descriptors_made, spec, lengths):
    cp, engine_module, dry_run, fake = dry
    params, x, dy, lengths = _inputs(cp, spec, lengths=lengths)
    _step(params, x, dy, lengths)  # makes the plan
    plans, stats, transfers = len(engine_module.ENGINE.plans), Counter(dry_run.STATS), Counter(fake.TRANSFERS)
    made = Counter(descriptors_made)
    res, g = _step(params, x, dy, lengths)
    assert len(engine_module.ENGINE.plans) == plans
    assert descriptors_made == made, "a repeated call created descriptors"
    calls = dry_run.STATS - stats
    segments = spec.num_layers if spec.dropout else 1
    assert {k: calls[k] for k in calls if not k.startswith("emulated")} == {
        "cudnnRNNForward": segments, "cudnnRNNBackwardData_v8": segments,
        "cudnnRNNBackwardWeights_v8": segments}, "a repeated call queried sizes or made extra calls"
    assert fake.TRANSFERS - transfers == Counter(), "a repeated call copied to the device or waited for it"
    want_res, want = _reference(params, x, dy, lengths)
    if not spec.dropout:  # the dropout masks are drawn per call: compare the plain stacks only
        np.testing.assert_allclose(res.y.get(), want_res.y, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(g.dparams.to_format("canonical").data.get(), want.dparams.data, rtol=1e-9,
                                   atol=1e-11)
        np.testing.assert_allclose(g.dx.get(), want.dx, rtol=1e-10, atol=1e-12)


def test_inference_and_training_padding_and_layouts_get_their_own_plans(dry):
    cp, engine_module, _, _ = dry
    engine = engine_module.ENGINE
    params, x, _, _ = _inputs(cp, S3_LIKE)
    full = np.full(3, 6)
    plan = engine.plan_for(params, x, full, False, True)
    assert engine.plan_for(params, x, full.copy(), False, True) is plan
    padded = engine.plan_for(params, x, np.array([6, 1, 6]), False, True)
    others = [engine.plan_for(params, x, full, False, False), padded,
              engine.plan_for(params, cp.ascontiguousarray(x.transpose(1, 0, 2)), full, True, True)]
    assert len({id(p) for p in (plan, *others)}) == 4
    assert plan.full and not padded.full
    assert engine.plan_for(params, x, np.array([2, 0, 5]), False, True) is padded, "other lengths, one plan"


# -- lengths changing under one shape -----------------------------------------------------------------------
PADDED = [([6, 2, 5], "lstm-1"), ([3, 6, 0], "lstm-2")]


@pytest.mark.parametrize("spec", [
    S3_LIKE,
    ar.RNNSpec(mode="gru", input_size=3, hidden_size=5, num_layers=2, bidirectional=True, dtype="float64"),
], ids=["lstm", "gru-bi-2"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_new_lengths_reuse_the_plan_and_set_its_descriptors_in_place(dry, descriptors_made, spec,
                                                                        batch_first):
    """Calls whose lengths change under one shape share a plan: no descriptor is created after the first
    (cuDNN's data descriptors are set in place, sizes asked again), and every call, including the backward of
    a forward made before the lengths changed, equals the reference engine at its own lengths."""
    cp, engine_module, _, _ = dry
    engine_module.ENGINE.plans.clear()
    params, x, dy, _ = _inputs(cp, spec, seed=5)
    if batch_first:
        x, dy = (cp.ascontiguousarray(a.transpose(1, 0, 2)) for a in (x, dy))
    lengths = [np.asarray(lens) for lens, _ in PADDED]
    forward = lambda lens: ar.rnn_forward(params, x, lens, training=True, engine="cudnn",  # noqa: E731
                                          batch_first=batch_first)
    forward(lengths[0])
    plans, made = len(engine_module.ENGINE.plans), Counter(descriptors_made)
    first = forward(lengths[0])
    second = forward(lengths[1])                       # the plan now holds the second lengths
    grads = [ar.rnn_backward(first, dy), ar.rnn_backward(second, dy)]  # back to the first, then the second
    assert len(engine_module.ENGINE.plans) == plans and descriptors_made == made
    for res, g, lens in zip((first, second), grads, lengths, strict=True):
        want_res = ar.rnn_forward(ar.PackedParams(spec, params.to_format("canonical").data.get()), x.get(),
                                  lens, training=True, engine="reference", batch_first=batch_first)
        want = ar.rnn_backward(want_res, dy.get())
        np.testing.assert_allclose(res.y.get(), want_res.y, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(res.h_n.get(), want_res.h_n, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(g.dx.get(), want.dx, rtol=1e-9, atol=1e-11)
        np.testing.assert_allclose(g.dparams.to_format("canonical").data.get(), want.dparams.data, rtol=1e-9,
                                   atol=1e-11)


def test_threads_sharing_a_padded_plan_each_run_their_own_lengths(dry):
    """Four threads, each with its own lengths, one plan: every result is the reference's at its lengths
    (the plan's lock covers setting the descriptors and the calls that read them)."""
    import threading

    cp, engine_module, _, _ = dry
    params, x, _, _ = _inputs(cp, S3_LIKE, B=3, seed=6)
    host = ar.PackedParams(S3_LIKE, params.to_format("canonical").data.get())
    cases = [np.array(lens) for lens in ([6, 2, 5], [1, 6, 3], [4, 4, 0], [2, 3, 1])]
    errors: list[BaseException] = []

    def work(lens: np.ndarray) -> None:
        try:
            want = ar.rnn_forward(host, x.get(), lens, engine="reference").y
            for _ in range(3):
                np.testing.assert_allclose(ar.rnn_forward(params, x, lens, engine="cudnn").y.get(), want,
                                           rtol=1e-10, atol=1e-12)
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(lens,)) for lens in cases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


# -- the algorithm ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode, hidden, dtype, equal, training, proj, want", [
    ("lstm", 128, "float32", True, True, 0, "PERSIST_STATIC_SMALL_H"),     # S3
    ("lstm", 160, "float32", True, False, 0, "PERSIST_STATIC_SMALL_H"),    # <= 192 forward
    ("lstm", 160, "float32", True, True, 0, "STANDARD"),                   # > 128 backward
    ("gru", 192, "float32", True, False, 0, "PERSIST_STATIC_SMALL_H"),
    ("gru", 193, "float32", True, False, 0, "STANDARD"),
    ("rnn_tanh", 384, "float32", True, False, 0, "PERSIST_STATIC_SMALL_H"),
    ("rnn_relu", 257, "float32", True, True, 0, "STANDARD"),
    ("lstm", 256, "float32", True, True, 0, "STANDARD"),                   # S1
    ("lstm", 64, "float64", True, True, 0, "STANDARD"),
    ("lstm", 64, "float32", False, True, 0, "STANDARD"),                   # unequal lengths
    ("lstm", 64, "float32", True, True, 32, "STANDARD"),                   # projection
    ("lstm", 256, "float16", True, True, 0, "PERSIST_STATIC"),
])
def test_auto_follows_pytorchs_rule(mode, hidden, dtype, equal, training, proj, want):
    spec = ar.RNNSpec(mode=mode, input_size=256, hidden_size=hidden, proj_size=proj)
    algo, why = cf.choose_algo(spec, dtype, equal, training, compute_major=9)
    assert algo.name == want and why
    if want == "PERSIST_STATIC_SMALL_H":
        assert cf.choose_algo(spec, dtype, equal, training, compute_major=5)[0] != algo  # needs sm >= 6.0


def test_a_named_algorithm_is_asked_for_and_a_bad_name_is_refused(monkeypatch):
    spec = ar.RNNSpec(mode="lstm", input_size=8, hidden_size=512)
    assert cf.choose_algo(spec, "float32", True, True, 9, "persist_dynamic")[0] == cb.RNNAlgo.PERSIST_DYNAMIC
    monkeypatch.setattr(cf, "algo", "fastest")
    with pytest.raises(ValueError, match=r"cudnn.config.algo = 'fastest'; expected 'auto' or one of"):
        cf.requested_algo()


@pytest.mark.parametrize("asked", ["auto", "persist_static", "persist_static_small_h"])
def test_a_refused_persistent_algorithm_falls_back_to_standard_and_says_why(dry, monkeypatch, caplog, asked):
    """The fake handle's cuDNN refuses every persistent algorithm (NOT_SUPPORTED from the size query): the
    plan runs STANDARD, says why, and the results are the reference engine's."""
    cp, engine_module, _, _ = dry
    monkeypatch.setattr(cf, "algo", asked)
    engine_module.ENGINE.plans.clear()
    params, x, dy, _ = _inputs(cp, SMALL_H, seed=3)
    with caplog.at_level(logging.INFO, logger="arrayrnn.cudnn"):
        res, g = _step(params, x, dy, None)
    plan = engine_module.ENGINE.plan_for(params, x, np.full(3, 6), False, True)
    wanted = "PERSIST_STATIC" if asked == "persist_static" else "PERSIST_STATIC_SMALL_H"
    assert plan.algo == "STANDARD"
    assert f"cuDNN refused {wanted} (CUDNN_STATUS_NOT_SUPPORTED" in plan.segments[0].note
    assert any("cudnn plan" in r.message and f"cuDNN refused {wanted}" in r.message for r in caplog.records)
    want_res, want = _reference(params, x, dy, None)
    np.testing.assert_allclose(res.y.get(), want_res.y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g.dparams.to_format("canonical").data.get(), want.dparams.data, rtol=1e-4,
                               atol=1e-5)


def _refusing_at(function: str):
    """Dry-run bindings in which cuDNN gives a persistent algorithm its sizes (STANDARD's) but refuses it at
    ``function``, a compute call: what a GPU may answer where the size query did not (issue 44)."""
    from support import cudnn_dry_run
    from support.cudnn_emulator import rnn_config

    def persistent(desc) -> bool:
        return rnn_config(desc).algo != cb.RNNAlgo.STANDARD

    class Refused:
        def __init__(self, call):
            self.prepared = call.prepared

        def __call__(self, **addresses):
            refusals[function] += 1
            raise cb.CudnnError(int(cb.Status.NOT_SUPPORTED), function, "stand-in refusal")

    def standard(desc):  # the fake handle's cuDNN validates only STANDARD: a persistent call runs as its twin
        if not persistent(desc):
            return desc
        return cb.RNNDescriptor(dataclasses.replace(rnn_config(desc), algo=cb.RNNAlgo.STANDARD))

    class RefusingAtCompute(cudnn_dry_run.DryRunBindings):
        def temp_space_sizes(self, handle, rnn_desc, x_desc, fwd_mode=cb.ForwardMode.TRAINING):
            return super().temp_space_sizes(handle, standard(rnn_desc), x_desc, fwd_mode)

        def _prepared(self, name, rnn_desc, fixed):
            call = getattr(super(), name)(standard(rnn_desc), **fixed)
            return Refused(call) if persistent(rnn_desc) and call.prepared.function == function else call

        def prepare_forward(self, rnn_desc, **fixed):
            return self._prepared("prepare_forward", rnn_desc, fixed)

        def prepare_backward_data(self, rnn_desc, **fixed):
            return self._prepared("prepare_backward_data", rnn_desc, fixed)

        def prepare_backward_weights(self, rnn_desc, **fixed):
            return self._prepared("prepare_backward_weights", rnn_desc, fixed)

    refusals: Counter[str] = Counter()
    return RefusingAtCompute(), refusals


@pytest.mark.parametrize("function", ["cudnnRNNForward", "cudnnRNNBackwardData_v8"])
def test_a_persistent_algorithm_refused_at_a_compute_call_falls_back_to_standard_once(monkeypatch, caplog,
                                                                                        function):
    """cuDNN accepts PERSIST_STATIC_SMALL_H when the plan asks its sizes, then refuses it at a compute call:
    the call runs again on a STANDARD plan (a forward from the start, a backward from a new forward), the
    answer is the reference engine's, a warning says so once, and the key stays STANDARD (no second try)."""
    from support import cudnn_dry_run

    bindings, refusals = _refusing_at(function)
    monkeypatch.setattr(cf, "algo", "auto")
    with cudnn_dry_run.installed(bindings) as cp:
        engine = cudnn_dry_run._engine_module(bindings).ENGINE
        engine.plans.clear()
        params, x, dy, _ = _inputs(cp, SMALL_H, seed=7)
        with caplog.at_level(logging.INFO, logger="arrayrnn.cudnn"):
            first = _step(params, x, dy, None)
            second = _step(params, x, dy, None)
        plan = engine.plan_for(params, x, np.full(3, 6), False, True)
        assert plan.algo == "STANDARD" and f"cuDNN refused PERSIST_STATIC_SMALL_H at {function}" in (
            plan.segments[0].note)
        assert refusals == Counter({function: 1}), "the refused algorithm was tried again"
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "refused" in r.message]
        assert len(warnings) == 1
        want_res, want = _reference(params, x, dy, None)
        for res, g in (first, second):
            np.testing.assert_allclose(res.y.get(), want_res.y, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(g.dx.get(), want.dx, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(g.dparams.to_format("canonical").data.get(), want.dparams.data,
                                       rtol=1e-4, atol=1e-5)


def test_other_cudnn_errors_at_a_compute_call_are_not_taken_for_a_refusal(monkeypatch):
    """Only BAD_PARAM / NOT_SUPPORTED from a persistent plan is a refusal; an execution failure reaches the
    caller as it is, and STANDARD's own refusals are not retried."""
    from support import cudnn_dry_run

    bindings, _ = _refusing_at("cudnnRNNForward")
    monkeypatch.setattr(cf, "algo", "auto")
    with cudnn_dry_run.installed(bindings) as cp:
        engine = cudnn_dry_run._engine_module(bindings).ENGINE
        engine.plans.clear()
        params, x, _, _ = _inputs(cp, SMALL_H, seed=8)
        plan = engine.plan_for(params, x, np.full(3, 6), False, False)
        assert plan.algo == "PERSIST_STATIC_SMALL_H"
        failing = cb.CudnnError(int(cb.Status.EXECUTION_FAILED), "cudnnRNNForward")

        def fail(**addresses):
            raise failing

        segment = plan.segments[0]
        monkeypatch.setattr(segment, "calls", dataclasses.replace(segment.calls, forward=fail))
        with pytest.raises(cb.CudnnError) as caught:
            ar.rnn_forward(params, x, engine="cudnn")
        assert caught.value is failing and engine.plan_for(params, x, np.full(3, 6), False, False) is plan


def test_standard_is_chosen_without_asking_cudnn_twice(dry, monkeypatch):
    cp, engine_module, _, _ = dry
    spec = ar.RNNSpec(mode="lstm", input_size=4, hidden_size=8, proj_size=3, dtype="float64")
    params, x, _, _ = _inputs(cp, spec)
    plan = engine_module.ENGINE.plan_for(params, x, np.full(3, 6), False, False)
    assert plan.algo == "STANDARD" and plan.segments[0].note == "projection runs the standard algorithm only"


# -- on a GPU: what only real cuDNN can answer ------------------------------------------------------------
def _gpu_reason() -> str:
    from support.engine_cases import gpu_cases

    return "" if any(case == "cudnn" for case in gpu_cases()) else "no CUDA GPU with CuPy and cuDNN here"


needs_gpu = pytest.mark.skipif(bool(_gpu_reason()), reason=_gpu_reason() or "GPU present")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("asked", ["auto", "persist_static", "persist_dynamic", "persist_static_small_h"])
@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh"])
def test_gpu_every_algorithm_that_runs_equals_the_reference(monkeypatch, mode, asked):
    """Small H, float32, equal lengths: the persistent algorithms' home. Whatever cuDNN accepts runs and
    equals the reference engine (float32 tolerance); what it refuses falls back with the reason. The plan
    that ran is printed (pytest -rA / -s shows it in the GPU run's log)."""
    import cupy
    from support.cudnn_cases import check

    from arrayrnn.engines import load_engine

    monkeypatch.setattr(cf, "algo", asked)
    engine = load_engine("cudnn")
    engine.plans.clear()
    spec = ar.RNNSpec(mode=mode, input_size=16, hidden_size=64, num_layers=2, dtype="float32")
    for batch_first in (False, True):
        check(cupy, spec, lengths=[8] * 8, batch_first=batch_first, dtype="float32")
    plans = list(engine.plans._plans.values())
    print(f"{mode} asked {asked}:", sorted({f"{'batch-major' if p.key.batch_first else 'time-major'} "
                                            f"{s.algo.name}: {s.note}" for p in plans for s in p.segments}))
    if asked == "auto":  # PyTorch's rule for H = 64: PERSIST_STATIC_SMALL_H, which cuDNN takes for PyTorch
        assert {p.algo for p in plans if not p.key.batch_first} == {"PERSIST_STATIC_SMALL_H"}


@pytest.mark.gpu
@needs_gpu
def test_gpu_the_weight_guard_reports_a_write_without_waiting():
    import cupy

    from arrayrnn.frontend import guard

    spec = ar.RNNSpec(mode="lstm", input_size=4, hidden_size=8)
    params = ar.PackedParams.init(spec, seed=0, xp=cupy).to_format("cudnn")
    x = cupy.ones((6, 3, 4), np.float32)
    res = ar.rnn_forward(params, x, training=True, engine="cudnn")
    params.data *= 2
    ar.rnn_backward(res, cupy.ones_like(res.y))
    with pytest.raises(ValueError, match="modified in place"):
        guard.synchronize()
    res = ar.rnn_forward(params, x, training=True, engine="cudnn")
    ar.rnn_backward(res, cupy.ones_like(res.y))
    guard.synchronize()  # unchanged: nothing to report
