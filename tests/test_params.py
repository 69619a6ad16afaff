import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import arrayrnn as ar
from arrayrnn import EngineUnavailableError, PackedParams, RNNSpec, layout_of
from arrayrnn.core.interop import torch_key

SMALL = ar.RNNSpec(mode="lstm", input_size=2, hidden_size=3)
TORCH_CLASSES = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn_tanh": torch.nn.RNN,
                 "rnn_relu": torch.nn.RNN}


def torch_module(spec):
    kwargs = dict(num_layers=spec.num_layers, bidirectional=spec.bidirectional, bias=spec.bias == "double")
    if spec.mode.startswith("rnn"):
        kwargs["nonlinearity"] = spec.mode[4:]
    if spec.proj_size:
        kwargs["proj_size"] = spec.proj_size
    return TORCH_CLASSES[spec.mode](spec.input_size, spec.hidden_size, **kwargs)


GRID = [
    RNNSpec(mode, 5, 6, num_layers=layers, bidirectional=bidi, bias=bias, proj_size=proj)
    for mode, layers, bidi, bias, proj in itertools.product(
        ("rnn_tanh", "rnn_relu", "lstm", "gru"), (1, 2, 3), (False, True), (True, False), (0, 3))
    if not (proj and mode != "lstm")
]


@pytest.mark.parametrize("spec", GRID, ids=str)
def test_layout_equals_torch_parameters(spec):
    module = torch_module(spec)
    layout = layout_of(spec)
    params = list(module.named_parameters())
    assert layout.size == sum(p.numel() for _, p in params)
    assert [torch_key(b) for b in layout.blocks] == [name for name, _ in params]
    assert [b.shape for b in layout.blocks] == [tuple(p.shape) for _, p in params]


def test_single_bias_modes_keep_one_vector_where_double_has_it():
    modes = ("double", "single_inp", "single_rec")
    double, inp, rec = (layout_of(RNNSpec("gru", 4, 3, bias=b)) for b in modes)
    assert [b.name for b in inp.blocks] == ["W_ih", "W_hh", "b_ih"]
    assert [b.name for b in rec.blocks] == ["W_ih", "W_hh", "b_hh"]
    assert inp.size == rec.size == double.size - 9
    assert rec.block(0, 0, "b_hh").shape == double.block(0, 0, "b_hh").shape == (9,)


def assert_layout_invariants(spec):
    layout = layout_of(spec)
    covered = np.zeros(layout.size, dtype=int)
    for block in layout.blocks:
        covered[block.offset:block.stop] += 1
        assert block.size == math.prod(block.shape) > 0
    assert (covered == 1).all(), "blocks must be disjoint and cover the buffer exactly"
    offsets = [b.offset for b in layout.blocks]
    assert offsets == sorted(offsets) and offsets[0] == 0
    for layer, direction in itertools.product(range(spec.num_layers), range(spec.num_directions)):
        w_ih = layout.block(layer, direction, "W_ih")
        assert w_ih.shape == (spec.gate_size, spec.layer_input_size(layer))
        assert layout.block(layer, direction, "W_hh").shape == (spec.gate_size, spec.output_size)
        assert layout.has(layer, direction, "b_ih") == spec.has_b_ih
        assert layout.has(layer, direction, "b_hh") == spec.has_b_hh
        assert layout.has(layer, direction, "W_hr") == bool(spec.proj_size)


@st.composite
def specs(draw):
    mode = draw(st.sampled_from(["rnn_tanh", "rnn_relu", "lstm", "gru"]))
    hidden = draw(st.integers(1, 9))
    proj = draw(st.integers(0, hidden - 1)) if mode == "lstm" else 0
    return RNNSpec(mode, draw(st.integers(1, 9)), hidden, num_layers=draw(st.integers(1, 4)),
                   bidirectional=draw(st.booleans()), proj_size=proj,
                   bias=draw(st.sampled_from(["double", "single_inp", "single_rec", "none"])),
                   reset_after=draw(st.booleans()) if mode == "gru" else True,
                   dtype=draw(st.sampled_from(["float32", "float64"])))


@settings(max_examples=150, deadline=None)
@given(specs())
def test_layout_invariants_property(spec):
    assert_layout_invariants(spec)


@settings(max_examples=60, deadline=None)
@given(specs(), st.integers(0, 2**31 - 1))
def test_views_alias_the_buffer_property(spec, seed):
    params = PackedParams.init(spec, seed=seed)
    for key, view in params.named_views().items():
        assert np.shares_memory(view, params.data), key
        before = params.data.copy()
        view[...] = 7
        changed = np.flatnonzero(params.data != before)
        block = next(b for b in params.layout.blocks if b.key == key)
        assert set(changed) <= set(range(block.offset, block.stop))
    assert (params.data == 7).all()


def test_view_writes_reach_the_buffer_and_named_views_order():
    spec = RNNSpec("lstm", 3, 4, num_layers=2, bidirectional=True, proj_size=2)
    params = PackedParams.zeros(spec)
    params.view(1, 1, "W_hr")[0, 1] = 5.0
    block = params.layout.block(1, 1, "W_hr")
    assert params.data[block.offset + 1] == 5.0 and params.data.sum() == 5.0
    keys = list(params.named_views())
    assert keys[:5] == ["l0.fwd.W_ih", "l0.fwd.W_hh", "l0.fwd.b_ih", "l0.fwd.b_hh", "l0.fwd.W_hr"]
    assert keys[-1] == "l1.rev.W_hr" and len(keys) == 20


def test_init_is_uniform_like_torch_and_seeded():
    spec = RNNSpec("gru", 16, 25, num_layers=2)
    a, b, c = (PackedParams.init(spec, seed=s) for s in (3, 3, 4))
    assert np.array_equal(a.data, b.data) and not np.array_equal(a.data, c.data)
    assert a.data.dtype == np.float32
    assert np.abs(a.data).max() <= 1 / 5 and np.abs(a.data).max() > 0.19
    assert abs(a.data.mean()) < 0.01


def test_wrap_existing_buffer_without_copy():
    spec = RNNSpec("rnn_tanh", 2, 3, dtype="float64")
    buffer = np.arange(layout_of(spec).size, dtype=np.float64)
    params = PackedParams(spec, buffer)
    assert params.data is buffer
    tensor = torch.zeros(layout_of(spec).size, dtype=torch.float64)
    wrapped = PackedParams(spec, tensor)
    wrapped.view(0, 0, "b_hh")[...] = 1.0
    assert tensor.sum().item() == 3.0, "a DLPack buffer must be wrapped, not copied"


@pytest.mark.parametrize(("buffer", "error", "message"), [
    (np.zeros(10), ValueError, r"buffer has 10 elements; expected 21"),
    (np.zeros((3, 7)), ValueError, r"buffer has shape \(3, 7\); expected a 1-D buffer of 21"),
    (np.zeros(21, dtype=np.float32), TypeError, r"buffer has dtype float32; expected spec.dtype = float64"),
    (np.zeros(42)[::2], ValueError, r"expected a contiguous 1-D buffer"),
    ([0.0] * 21, TypeError, r"buffer has type list"),
])
def test_wrap_validates_the_buffer(buffer, error, message):
    spec = RNNSpec("rnn_tanh", 2, 3, dtype="float64")
    with pytest.raises(error, match=message):
        PackedParams(spec, buffer)


def test_wrap_rejects_a_non_spec():
    with pytest.raises(TypeError, match="spec has type dict"):
        PackedParams({"mode": "lstm"}, np.zeros(3))


def test_zeros_like_copy_astype_to():
    spec = RNNSpec("lstm", 3, 4, bidirectional=True)
    params = PackedParams.init(spec, seed=0)
    zeros, copy = params.zeros_like(), params.copy()
    assert zeros.spec == spec and not zeros.data.any() and zeros.data.shape == params.data.shape
    assert np.array_equal(copy.data, params.data) and not np.shares_memory(copy.data, params.data)
    doubled = params.astype("float64")
    assert doubled.spec.dtype == "float64" and doubled.data.dtype == np.float64
    assert np.array_equal(doubled.data.astype(np.float32), params.data)
    moved = params.to(np)
    assert np.array_equal(moved.data, params.data) and not np.shares_memory(moved.data, params.data)
    assert np.shares_memory(moved.view(0, 1, "W_hh"), moved.data)
    assert params.to("cpu").device == "cpu"


def test_view_errors_name_what_is_present():
    params = PackedParams.zeros(RNNSpec("gru", 3, 4, bias="single_inp"))
    with pytest.raises(ValueError, match=r"name = 'b_hh' is absent for bias='single_inp'"):
        params.view(0, 0, "b_hh")
    with pytest.raises(ValueError, match=r"name = 'W_xx'; expected one of \('W_ih', 'W_hh', 'b_ih'\)"):
        params.view(0, 0, "W_xx")
    with pytest.raises(ValueError, match=r"layer = 1; expected 0 <= layer < num_layers = 1"):
        params.view(1, 0, "W_ih")
    with pytest.raises(ValueError, match=r"direction = 1; expected 0 <= direction < 1"):
        params.view(0, 1, "W_ih")


def test_to_format_canonical_is_identity_and_unknown_is_error():
    params = PackedParams.zeros(RNNSpec("lstm", 3, 4))
    assert params.to_format("canonical") is params
    with pytest.raises(ValueError, match=r"format = 'onednn'; expected 'canonical' or the name of an engine"):
        params.to_format("onednn")


def test_to_unknown_device_is_error():
    params = PackedParams.zeros(RNNSpec("lstm", 3, 4))
    with pytest.raises(ValueError, match=r"target = 'tpu'"):
        params.to("tpu")


def test_format_whose_engine_module_is_missing_is_a_clear_error(monkeypatch):
    # an installation without the cudnn engine's module (a trimmed wheel, say)
    from arrayrnn import engines

    record = replace(engines.REGISTRY["cudnn"], source="arrayrnn.engines._not_installed")
    monkeypatch.setitem(engines.REGISTRY, "cudnn", record)
    with pytest.raises(EngineUnavailableError, match="engine = 'cudnn' is not part of this installation"):
        PackedParams.zeros(RNNSpec("lstm", 3, 4)).to_format("cudnn")


def test_init_seed_errors_name_seed():
    with pytest.raises(ValueError, match="seed = -1"):
        ar.PackedParams.init(SMALL, seed=-1)
    with pytest.raises(TypeError, match="seed has type str"):
        ar.PackedParams.init(SMALL, seed="abc")
    np.testing.assert_array_equal(ar.PackedParams.init(SMALL, seed=np.int64(3)).data,
                                  ar.PackedParams.init(SMALL, seed=3).data)


def test_a_torch_buffer_that_requires_grad_says_detach():
    buffer = torch.zeros(ar.PackedParams.init(SMALL).data.size, requires_grad=True)
    with pytest.raises(TypeError, match=r"requires grad; pass .*\.detach\(\)"):
        ar.PackedParams(SMALL, buffer)


def test_peepholes_add_one_P_view_per_layer_direction_after_the_other_blocks():
    spec = RNNSpec("lstm", 5, 4, num_layers=2, bidirectional=True, proj_size=2, peepholes=True)
    plain = layout_of(spec.replace(peepholes=False))
    layout = layout_of(spec)
    assert layout.size == plain.size + 2 * 2 * 3 * 4
    params = PackedParams.init(spec, seed=3)
    keys = list(params.named_views())
    assert keys[:6] == ["l0.fwd.W_ih", "l0.fwd.W_hh", "l0.fwd.b_ih", "l0.fwd.b_hh", "l0.fwd.W_hr", "l0.fwd.P"]
    assert sum(k.endswith(".P") for k in keys) == 4
    P = params.view(1, 1, "P")
    assert P.shape == (3, 4) and np.shares_memory(P, params.data)
    P[...] = 7.0
    block = layout.block(1, 1, "P")
    assert np.all(params.data[block.offset:block.stop] == 7.0) and block.stop == layout.size
    # every other block has the shape it has without peepholes
    for b in plain.blocks:
        assert layout.block(b.layer, b.direction, b.name).shape == b.shape
    with pytest.raises(ValueError, match=r"name = 'P' is absent for .*peepholes=False"):
        PackedParams.init(spec.replace(peepholes=False)).view(0, 0, "P")
