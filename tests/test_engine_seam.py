"""The engine seam, on CPU, through test-only engines whose native weight formats are
permutations of the canonical one (tests/support/permuted_engine.py), registered like a built-in engine:

1. a format belongs to its engine: ``to_format`` finds it at call time; views work through the engine's
   layout or are refused (never canonical slices of a foreign buffer);
2. canonical params given to such an engine are converted for the call with a one-time warning, the
   gradient converted back; params in its format are never converted; save writes canonical; optimizers
   and clipping are format-agnostic;
3. selection sees the whole call and explains every refusal;
4. whole-stack engines get the caller's rows, layout and host lengths, and the shared dropout masks.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import warnings
from dataclasses import replace

import numpy as np
import pytest
from support.rnn_cases import host, make_case, on_device

import arrayrnn as ar
from arrayrnn import EngineUnavailableError, PackedParams, RNNSpec, engines, rnn_backward, rnn_forward
from arrayrnn.core.errors import FormatConversionWarning
from arrayrnn.engines import probe_call, register_engine, select_engine, unregister_engine
from arrayrnn.engines.base import Call, Engine
from arrayrnn.frontend import rnn as rnn_module
from arrayrnn.frontend.dropout import dropout_masks

SPEC = RNNSpec(mode="lstm", input_size=3, hidden_size=4, num_layers=2, bidirectional=True, proj_size=2,
               dtype="float64")


@pytest.fixture
def permuted(monkeypatch):
    """Register the test engines (as a module name and as an object), fresh, and forget warnings."""
    monkeypatch.delitem(sys.modules, "support.permuted_engine", raising=False)
    register_engine("permuted", "support.permuted_engine")
    permuted_engine = importlib.import_module("support.permuted_engine")  # the fresh module, not the
    # package attribute left by an earlier import
    register_engine("reversed", permuted_engine.REVERSED)
    for engine in (permuted_engine.ENGINE, permuted_engine.REVERSED):
        engine.calls.clear()
        engine.checks.clear()
        engine.refuse, engine.refuse_zero_length, engine.prefer_not = None, False, None
    monkeypatch.setattr(rnn_module, "_WARNED", set())
    yield permuted_engine
    unregister_engine("permuted")
    unregister_engine("reversed")


# -- 1. formats belong to engines -----------------------------------------------------------------
def test_to_format_finds_the_engine_at_call_time(monkeypatch):
    monkeypatch.delitem(sys.modules, "support.permuted_engine", raising=False)
    register_engine("permuted", "support.permuted_engine")
    try:
        params = PackedParams.init(SPEC, seed=3)
        native = params.to_format("permuted")  # nothing imported the engine's module before
        assert "support.permuted_engine" in sys.modules and native.format == "permuted"
        assert not np.array_equal(native.data, params.data)
        assert sorted(native.data) == sorted(params.data)
        back = native.to_format("canonical")
        assert back.format == "canonical" and np.array_equal(back.data, params.data)
        assert native.to_format("permuted") is native
    finally:
        unregister_engine("permuted")


def test_format_conversion_between_two_engine_formats_goes_through_canonical(permuted):
    params = PackedParams.init(SPEC, seed=4)
    other = params.to_format("permuted").to_format("reversed")
    assert other.format == "reversed"
    np.testing.assert_array_equal(other.data, params.data[::-1])


def test_a_format_must_be_an_engine_with_that_native_format(permuted):
    with pytest.raises(ValueError, match=r"format = 'numba'; engine 'numba' reads the 'canonical' format"):
        PackedParams.zeros(SPEC).to_format("numba")


def test_views_of_a_native_buffer_go_through_the_engines_layout(permuted):
    params = PackedParams.init(SPEC, seed=5)
    native = params.to_format("permuted")
    assert native.layout is not params.layout and native.layout.size == params.layout.size
    for key, view in native.named_views().items():
        np.testing.assert_array_equal(view, params.named_views()[key])
    assert list(native.named_views()) == [b.key for b in reversed(params.layout.blocks)]
    for block in native.layout.blocks:
        np.testing.assert_array_equal(native.block_view(block), params.view(block.layer, block.direction,
                                                                            block.name))
    w = native.view(1, 1, "W_hh")
    np.testing.assert_array_equal(w, params.view(1, 1, "W_hh"))
    w[0, 0] = 42.0  # a view aliases the native buffer
    assert native.to_format("canonical").view(1, 1, "W_hh")[0, 0] == 42.0


def test_canonical_block_of_a_native_buffer_is_refused(permuted):
    params = PackedParams.init(SPEC)
    native = params.to_format("permuted")
    canonical_block = params.layout.block(0, 0, "W_ih")
    with pytest.raises(ValueError, match=r"not a block of this buffer's layout \(params.format = 'permuted'"):
        native.block_view(canonical_block)


@pytest.mark.parametrize("what", ["layout", "view", "named_views", "block_view", "iter"])
def test_views_of_a_format_without_layout_say_to_convert(permuted, what):
    params = PackedParams.init(SPEC)
    native = params.to_format("reversed")
    calls = {"layout": lambda: native.layout, "view": lambda: native.view(0, 0, "W_ih"),
             "named_views": native.named_views, "iter": lambda: list(native),
             "block_view": lambda: native.block_view(params.layout.blocks[0])}
    with pytest.raises(ValueError, match=r"params.format = 'reversed' has no per-block layout.*"
                                         r"params.to_format\('canonical'\)"):
        calls[what]()


# -- 2. conversion for a call, gradients, save, optimizers ----------------------------------------
def _reference(case, **kw):
    res = rnn_forward(case.params, case.x, case.lengths, case.h0, case.c0, engine="reference", training=True,
                      **kw)
    return res, rnn_backward(res, case.dy, case.dh_n, case.dc_n)


def test_canonical_params_are_converted_for_the_call_with_a_one_time_warning(permuted):
    case = make_case(SPEC, 5, 3, lengths="unsorted")
    with pytest.warns(FormatConversionWarning, match=r"params.to_format\('permuted'\)"):
        res = rnn_forward(case.params, case.x, case.lengths, case.h0, case.c0, engine="permuted",
                          training=True)
    seen = permuted.ENGINE.calls[-1].params
    assert seen.format == "permuted" and seen is not case.params
    g = rnn_backward(res, case.dy, case.dh_n, case.dc_n)
    ref_res, ref = _reference(case)
    np.testing.assert_allclose(res.y, ref_res.y, rtol=1e-13)
    assert g.dparams.format == "canonical"
    np.testing.assert_allclose(g.dparams.data, ref.dparams.data, rtol=1e-12, atol=1e-14)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second call converts again but does not warn again
        rnn_forward(case.params, case.x, case.lengths, case.h0, case.c0, engine="permuted")
    assert case.params.format == "canonical"


def test_params_in_the_engines_format_are_never_converted(permuted):
    case = make_case(SPEC, 4, 3)
    native = case.params.to_format("permuted")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = rnn_forward(native, case.x, case.lengths, case.h0, case.c0, engine="permuted", training=True)
    assert permuted.ENGINE.calls[-1].params is native
    g = rnn_backward(res, case.dy, case.dh_n, case.dc_n)
    assert g.dparams.format == "permuted"
    _, ref = _reference(case)
    np.testing.assert_allclose(g.dparams.to_format("canonical").data, ref.dparams.data, rtol=1e-12,
                               atol=1e-14)


def test_native_params_on_a_canonical_engine_are_converted_and_dparams_keep_their_format(permuted):
    case = make_case(SPEC, 4, 2)
    native = case.params.to_format("permuted")
    with pytest.warns(FormatConversionWarning, match=r"engine 'reference' .*params.to_format\('canonical'\)"):
        res = rnn_forward(native, case.x, case.lengths, case.h0, case.c0, engine="reference", training=True)
    g = rnn_backward(res, case.dy, case.dh_n, case.dc_n)
    assert g.dparams.format == "permuted"
    _, ref = _reference(case)
    np.testing.assert_allclose(g.dparams.to_format("canonical").data, ref.dparams.data, rtol=1e-12,
                               atol=1e-14)


def test_backward_after_inference_uses_the_converted_params(permuted):
    case = make_case(SPEC, 4, 2)
    with pytest.warns(FormatConversionWarning):
        res = rnn_forward(case.params, case.x, case.lengths, case.h0, case.c0, engine="permuted")
    g = rnn_backward(res, case.dy, case.dh_n, case.dc_n)
    _, ref = _reference(case)
    np.testing.assert_allclose(g.dparams.data, ref.dparams.data, rtol=1e-12, atol=1e-14)


def test_save_of_native_params_writes_canonical_and_leaves_them_alone(permuted, tmp_path):
    params = PackedParams.init(SPEC, seed=9)
    native = params.to_format("permuted")
    before = native.data.copy()
    ar.save(tmp_path / "p.npz", native)
    loaded = ar.load(tmp_path / "p.npz")
    assert loaded.format == "canonical"
    np.testing.assert_array_equal(loaded.data, params.data)
    assert native.format == "permuted"
    np.testing.assert_array_equal(native.data, before)


@pytest.mark.parametrize("make", [lambda p: ar.optim.SGD(p, lr=0.1, momentum=0.9),
                                  lambda p: ar.optim.Adam(p, lr=0.01)], ids=["sgd", "adam"])
def test_optimizers_and_clipping_are_format_agnostic(permuted, make):
    case = make_case(SPEC, 4, 2)
    _, ref = _reference(case)
    canonical, native = case.params.copy(), case.params.to_format("permuted")
    g_canonical, g_native = ref.dparams.copy(), ref.dparams.to_format("permuted")
    norms = [ar.optim.clip_grad_norm(g, 0.5) for g in (g_canonical, g_native)]
    assert norms[0] == pytest.approx(norms[1], rel=1e-12)
    for params, grads in ((canonical, g_canonical), (native, g_native)):
        opt = make(params)
        opt.step(grads)
        opt.step(grads)
    np.testing.assert_allclose(native.to_format("canonical").data, canonical.data, rtol=1e-13, atol=1e-15)


def test_layer_to_format_converts_once(permuted):
    layer = ar.nn.LSTM(3, 4, 2, bidirectional=True, engine="permuted", dtype="float64", seed=1)
    x = np.random.default_rng(0).standard_normal((5, 2, 3))
    with pytest.warns(FormatConversionWarning, match=r"layer.to_format\('permuted'\)"):
        expected = layer(x)
    assert layer.to_format("permuted") is layer and layer.params.format == "permuted"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = layer(x)
    assert permuted.ENGINE.calls[-1].params is layer.params
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-13)
    with pytest.raises(ValueError, match=r"format = 'nope'"):
        layer.to_format("nope")


# -- 3. selection sees the whole call -------------------------------------------------------------
def test_the_engine_sees_the_whole_call(permuted):
    spec = SPEC.replace(dropout=0.3)
    case = make_case(spec, 6, 4, lengths="zeros")
    rnn_forward(case.params.to_format("permuted"), case.x, case.lengths, case.h0, case.c0, engine="permuted",
                training=True, seed=1)
    call = permuted.ENGINE.checks[-1]
    assert call == Call(spec=spec, xp=np, device=None, seq_len=6, batch=4, training=True,
                        params_format="permuted", has_zero_length=True, explicit=True)


def test_explicit_engine_says_exactly_what_it_cannot_run(permuted):
    permuted.ENGINE.refuse_zero_length = True
    case = make_case(SPEC, 4, 3, lengths="zeros")
    with pytest.raises(EngineUnavailableError,
                       match=r"engine = 'permuted' cannot run this call: the permuted test engine cannot run "
                             r"rows of length 0"):
        rnn_forward(case.params, case.x, case.lengths, engine="permuted")


def test_auto_error_lists_every_candidate_with_its_reason(permuted, monkeypatch):
    register_engine("permuted", "support.permuted_engine", auto_rank=0)
    register_engine("reversed", permuted.REVERSED, auto_rank=1)
    monkeypatch.setitem(engines.REGISTRY, "numba", replace(engines.REGISTRY["numba"], auto_rank=None))
    permuted.ENGINE.prefer_not = "T = 4 is below the permuted engine's threshold"
    permuted.REVERSED.refuse = "the reversed engine is switched off"
    reference = engines.load_engine("reference")
    monkeypatch.setattr(reference, "check", lambda call: "the reference engine is switched off too")
    case = make_case(SPEC, 4, 3)
    with pytest.raises(EngineUnavailableError) as info:
        rnn_forward(case.params, case.x, engine="auto")
    message = str(info.value)
    assert message == ("engine = 'auto' found no engine for this call; "
                       "permuted: T = 4 is below the permuted engine's threshold; "
                       "reversed: the reversed engine is switched off; "
                       "reference: the reference engine is switched off too")
    assert permuted.ENGINE.checks[-1].explicit is False


def test_auto_takes_the_first_candidate_that_accepts(permuted, monkeypatch):
    register_engine("reversed", permuted.REVERSED, auto_rank=0)
    register_engine("permuted", "support.permuted_engine", auto_rank=1)
    permuted.REVERSED.prefer_not = "not by preference"
    case = make_case(SPEC, 4, 3)
    native = case.params.to_format("permuted")
    assert rnn_forward(native, case.x, engine="auto").engine == "permuted"
    assert select_engine("reversed", probe_call(SPEC)).name == "reversed"  # the preference binds auto only


def test_engine_interface_has_check_and_no_unused_backward_arguments():
    assert list(inspect.signature(Engine.backward).parameters) == ["self", "cache", "dy", "dh_n", "dc_n"]
    assert list(inspect.signature(Engine.forward).parameters) == [
        "self", "params", "x", "lengths", "h0", "c0", "masks", "batch_first", "keep_cache"]
    assert not hasattr(Engine, "unavailable_reason") and not hasattr(Engine, "auto_ok")


def test_select_engine_and_to_format_reject_bad_types():
    with pytest.raises(TypeError, match=r"call has type RNNSpec; expected an arrayrnn.engines.base.Call"):
        select_engine("auto", SPEC)
    with pytest.raises(TypeError, match=r"format has type int; expected a str"):
        PackedParams.zeros(SPEC).to_format(3)


def test_register_engine_rejects_bad_names():
    with pytest.raises(ValueError, match=r"name = 'auto'"):
        register_engine("auto", "x")
    with pytest.raises(TypeError, match=r"engine has type int"):
        register_engine("mine", 3)
    with pytest.raises(ValueError, match=r"name = 'numba' is a built-in engine"):
        unregister_engine("numba")


# -- 4. what a whole-stack engine receives --------------------------------------------------------
@pytest.mark.parametrize("batch_first", [False, True])
def test_whole_stack_engine_gets_the_callers_rows_layout_and_host_lengths(permuted, batch_first):
    spec = SPEC.replace(dropout=0.5)
    case = make_case(spec, 5, 4, lengths="zeros", batch_first=batch_first)
    lengths = np.asarray(case.lengths)
    active = lengths[None, :] > np.arange(5)[:, None]
    active = (active.T if batch_first else active)[:, :, None]
    x = np.where(active, case.x, np.nan)  # NaN padding: never read
    res = rnn_forward(case.params.to_format("permuted"), x, lengths, case.h0, case.c0,
                      batch_first=batch_first, training=True, seed=7, engine="permuted")
    seen = permuted.ENGINE.calls[-1]
    assert seen.batch_first is batch_first and seen.keep_cache is True
    assert isinstance(seen.lengths, np.ndarray) and seen.lengths.dtype == np.int64
    np.testing.assert_array_equal(seen.lengths, lengths)  # the caller's order, not sorted
    assert seen.x is not x and seen.x.shape == x.shape and seen.x.flags.c_contiguous
    np.testing.assert_array_equal(seen.x, np.where(active, x, 0.0))
    np.testing.assert_array_equal(seen.h0, case.h0)
    expected_masks = dropout_masks(spec, 5, 4, 7)
    assert len(seen.masks) == len(expected_masks) == 1
    np.testing.assert_array_equal(seen.masks[0], expected_masks[0])
    assert np.isfinite(res.y).all()


def test_dropout_masks_are_the_same_on_a_whole_stack_engine_and_the_driver(permuted, engine):
    spec = SPEC.replace(dropout=0.4, num_layers=3)
    case = make_case(spec, 5, 3, lengths="unsorted")
    out = [rnn_forward(c.params, c.x, c.lengths, c.h0, c.c0, training=True, seed=11, engine=name).y
           for c, name in ((case.with_(params=case.params.to_format("permuted")), "permuted"),
                           (on_device(case, engine), engine))]
    np.testing.assert_allclose(out[0], host(out[1]), rtol=1e-12, atol=1e-14)


def test_dropout_masks_are_drawn_with_the_arrays_module():
    class Recorder:  # a module that is NumPy but records that it was asked
        def __init__(self):
            self.asked = 0

        def __getattr__(self, name):
            self.asked += 1
            return getattr(np, name)

    spec = RNNSpec(mode="gru", input_size=2, hidden_size=3, num_layers=2, dropout=0.5)
    xp = Recorder()
    masks = dropout_masks(spec, 4, 2, 3, xp)
    assert xp.asked > 0
    np.testing.assert_array_equal(masks[0], dropout_masks(spec, 4, 2, 3)[0])


# -- 7. the engine fixture's array-module dimension -----------------------------------------------
def test_every_cpu_engine_runs_the_shared_bodies_on_numpy(engine):
    from conftest import ENGINE_CASES, ENGINES

    assert {(str(c), c.xp) for c in ENGINE_CASES} >= {(name, np) for name in ENGINES}
    assert engine.xp.__name__ in ("numpy", "cupy") and str(engine) in engines.REGISTRY
    if engine.xp is not np:  # on a device (or its stand-in), the engine's own arrays come back
        res = rnn_forward(PackedParams.init(SPEC, xp=engine.xp), engine.xp.zeros((2, 1, 3)), engine=engine)
        assert isinstance(res.y, engine.xp.ndarray) and res.engine == engine


@pytest.mark.gpu
def test_dropout_masks_are_identical_on_numpy_and_cupy():
    cp = pytest.importorskip("cupy", reason="CuPy is not installed")
    try:
        cp.cuda.runtime.getDeviceCount()
    except Exception as err:  # CuPy without a driver or device
        pytest.skip(f"no CUDA device: {err}")
    spec = RNNSpec(mode="lstm", input_size=2, hidden_size=5, num_layers=3, bidirectional=True, dropout=0.3)
    host = dropout_masks(spec, 7, 4, 123)
    device = dropout_masks(spec, 7, 4, 123, cp)
    for h, d in zip(host, device, strict=True):
        assert isinstance(d, cp.ndarray)
        np.testing.assert_array_equal(cp.asnumpy(d), h)
