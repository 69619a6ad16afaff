"""Owning descriptors against the real library: round trips, cuDNN's own rejections, lifetime, leaks."""

from __future__ import annotations

import gc
import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from support.cudnn import new_handles, requires_cudnn

import cudnn_bindings as cb
from cudnn_bindings.config import MATH_PRECISIONS

pytestmark = requires_cudnn

PRECISIONS = [(dt, mp) for dt, mps in MATH_PRECISIONS.items() for mp in mps]
ALGOS = [a for a in cb.RNNAlgo if a is not cb.RNNAlgo.COUNT]


@pytest.fixture
def rnn_desc():
    with cb.RNNDescriptor(cb.RNNConfig(input_size=1, hidden_size=1)) as d:
        yield d


# ---------------------------------------------------------------- RNN descriptor round trips
def test_rnn_round_trip_full_categorical_grid(rnn_desc: cb.RNNDescriptor) -> None:
    """Every mode x bias mode x direction x input mode x (data type, math precision) x math type."""
    grid = itertools.product(cb.RNNMode, cb.RNNBiasMode, cb.DirectionMode, cb.RNNInputMode, PRECISIONS,
                             cb.MathType)
    n = 0
    for mode, bias, direction, inp, (dt, mp), math_type in grid:
        cfg = cb.RNNConfig(cell_mode=mode, bias_mode=bias, dir_mode=direction, input_mode=inp, data_type=dt,
                           math_prec=mp, math_type=math_type, input_size=8, hidden_size=8, num_layers=2)
        rnn_desc.set(cfg)
        assert rnn_desc.get() == cfg, cfg
        n += 1
    assert n == 4 * 4 * 2 * 2 * len(PRECISIONS) * 4


@st.composite
def rnn_configs(draw) -> cb.RNNConfig:
    mode = draw(st.sampled_from(list(cb.RNNMode)))
    hidden = draw(st.integers(1, 2048))
    inp = draw(st.sampled_from([cb.RNNInputMode.LINEAR_INPUT, cb.RNNInputMode.SKIP_INPUT]))
    proj = draw(st.integers(1, hidden)) if mode is cb.RNNMode.LSTM else hidden
    dt, mp = draw(st.sampled_from(PRECISIONS))
    lo = draw(st.floats(allow_nan=False))
    hi = draw(st.floats(min_value=lo, allow_nan=False))
    return cb.RNNConfig(
        cell_mode=mode, bias_mode=draw(st.sampled_from(list(cb.RNNBiasMode))),
        dir_mode=draw(st.sampled_from(list(cb.DirectionMode))), input_mode=inp, data_type=dt, math_prec=mp,
        math_type=draw(st.sampled_from(list(cb.MathType))),
        input_size=hidden if inp is cb.RNNInputMode.SKIP_INPUT else draw(st.integers(1, 4096)),
        hidden_size=hidden, proj_size=proj, num_layers=draw(st.integers(1, 64)),
        aux_flags=draw(st.sampled_from([0, 1])), clip_mode=draw(st.sampled_from(list(cb.RNNClipMode))),
        lclip=lo, rclip=hi)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cfg=rnn_configs())
def test_rnn_round_trip_sizes_projection_layers_clip(rnn_desc: cb.RNNDescriptor, cfg: cb.RNNConfig) -> None:
    rnn_desc.set(cfg)
    assert rnn_desc.get() == cfg


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("mode", list(cb.RNNMode))
@pytest.mark.parametrize(("dt", "mp"), [("float", "float"), ("half", "float"), ("bfloat16", "float")])
def test_rnn_round_trip_persistent_algos(rnn_desc: cb.RNNDescriptor, algo, mode, dt: str, mp: str) -> None:
    """The persistent algorithms take fewer configurations (double bias, no projection, float math)."""
    for direction, inp, aux in itertools.product(cb.DirectionMode, cb.RNNInputMode, (0, 1)):
        cfg = cb.RNNConfig(algo=algo, cell_mode=mode, dir_mode=direction, input_mode=inp, data_type=dt,
                           math_prec=mp, input_size=32, hidden_size=32, num_layers=3, aux_flags=aux)
        rnn_desc.set(cfg)
        assert rnn_desc.get() == cfg


def test_unsupported_persistent_configuration_rejected_by_cudnn() -> None:
    new = new_handles()
    cfg = cb.RNNConfig(algo="persist_static", bias_mode="no_bias", input_size=4, hidden_size=4)
    with pytest.raises(cb.CudnnError) as info:
        cb.RNNDescriptor(cfg)
    err = info.value
    assert err.name == "CUDNN_STATUS_NOT_SUPPORTED" and err.function == "cudnnSetRNNDescriptor_v8"
    assert "cuDNN does not support this configuration" in str(err) and "NO_BIAS" in str(err)
    assert new() == {}


CLIPS = [("minmax", -1.5, 2.25), ("minmax", -math.inf, math.inf), ("none", 0.0, 0.0), ("minmax", 3.0, 3.0),
         ("none", -7.0, 7.0)]


@pytest.mark.parametrize(("mode", "lo", "hi"), CLIPS)
def test_clip_round_trip(mode: str, lo: float, hi: float) -> None:
    cfg = cb.RNNConfig(input_size=4, hidden_size=4, clip_mode=mode, lclip=lo, rclip=hi)
    with cb.RNNDescriptor(cfg) as d:
        assert cb.raw.rnn_get_clip(d.ptr) == (int(cfg.clip_mode), lo, hi)
        assert d.get() == cfg


def test_rnn_descriptor_holds_its_dropout_descriptor() -> None:
    with cb.DropoutDescriptor() as drop:
        with cb.RNNDescriptor(cb.RNNConfig(input_size=2, hidden_size=3), dropout=drop) as d:
            assert d.dropout is drop and d.dropout_address() == drop.ptr
        with cb.RNNDescriptor(cb.RNNConfig(input_size=2, hidden_size=3)) as d:
            assert d.dropout is None and d.dropout_address() == 0


def test_rnn_descriptor_type_checks() -> None:
    new = new_handles()
    with pytest.raises(TypeError, match="config must be an RNNConfig"):
        cb.RNNDescriptor({"input_size": 2})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dropout must be a DropoutDescriptor"):
        cb.RNNDescriptor(cb.RNNConfig(input_size=2, hidden_size=3), dropout=5)  # type: ignore[arg-type]
    assert new() == {}


# ---------------------------------------------------------------- RNN data descriptor round trips
@st.composite
def seq_configs(draw) -> cb.SeqDataConfig:
    layout = draw(st.sampled_from(list(cb.RNNDataLayout)))
    t, b = draw(st.integers(1, 300)), draw(st.integers(1, 64))
    packed = layout is cb.RNNDataLayout.SEQ_MAJOR_PACKED
    lengths = draw(st.lists(st.integers(1 if packed else 0, t), min_size=b, max_size=b))
    if packed:  # cuDNN requires non-increasing, non-zero lengths starting at max_seq_length here
        lengths.sort(reverse=True)
        lengths[0] = t
    dt = draw(st.sampled_from(list(cb.config.RNN_DATA_TYPES)))
    return cb.SeqDataConfig(data_type=dt, layout=layout, max_seq_length=t, batch_size=b,
                            vector_size=draw(st.integers(1, 4096)), seq_lengths=lengths,
                            padding_fill=draw(st.floats(allow_nan=False, width=16)))


@settings(max_examples=300, deadline=None)
@given(cfg=seq_configs())
def test_data_descriptor_round_trip(cfg: cb.SeqDataConfig) -> None:
    with cb.RNNDataDescriptor(cfg) as d:
        back = d.get()
    assert back == cfg
    assert back.seq_lengths.dtype == np.int32


@pytest.mark.parametrize("layout", ["seq_major_unpacked", "batch_major_unpacked"])
def test_data_descriptor_zero_lengths(layout: str) -> None:
    cfg = cb.SeqDataConfig(layout=layout, max_seq_length=4, batch_size=5, vector_size=3,
                           seq_lengths=[0, 4, 0, 1, 0], padding_fill=-1.0)
    with cb.RNNDataDescriptor(cfg) as d:
        assert d.get().seq_lengths.tolist() == [0, 4, 0, 1, 0]
        assert d.get() == cfg


def test_data_descriptor_set_again_replaces() -> None:
    a = cb.SeqDataConfig(max_seq_length=4, batch_size=2, vector_size=3, seq_lengths=[4, 1])
    b = cb.SeqDataConfig(data_type="double", max_seq_length=9, batch_size=3, vector_size=1,
                         seq_lengths=[0, 9, 2], padding_fill=2.5)
    with cb.RNNDataDescriptor(a) as d:
        d.set(b)
        assert d.get() == b and d.config is b


def test_data_descriptor_set_lengths_keeps_the_rest_and_checks_the_lengths() -> None:
    a = cb.SeqDataConfig(data_type="double", max_seq_length=9, batch_size=3, vector_size=5,
                         seq_lengths=[9, 1, 4], padding_fill=2.5)
    with cb.RNNDataDescriptor(a) as d:
        d.set_lengths(np.array([0, 9, 2]))
        want = cb.SeqDataConfig(data_type="double", max_seq_length=9, batch_size=3, vector_size=5,
                                seq_lengths=[0, 9, 2], padding_fill=2.5)
        assert d.get() == want and d.config == want and a.seq_lengths.tolist() == [9, 1, 4]
        for bad, match in (([1, 2], r"seq_lengths has shape \(2,\); expected \(batch_size,\) = \(3,\)"),
                           ([1, 10, 2], r"seq_lengths\[1\] = 10; every length must be in 0..max_seq_length"),
                           ([1.5, 2, 2], "seq_lengths must hold integers")):
            with pytest.raises((ValueError, TypeError), match=match):
                d.set_lengths(bad)
        assert d.get() == want, "a refused set_lengths changed the descriptor"
    with cb.RNNDataDescriptor(a) as d:
        d.close()
        with pytest.raises(Exception, match="closed"):
            d.set_lengths([1, 1, 1])


# ---------------------------------------------------------------- tensor descriptor round trips
@st.composite
def tensor_configs(draw) -> cb.TensorConfig:
    dims = tuple(draw(st.lists(st.integers(1, 64), min_size=2, max_size=8)))
    strides = None
    if draw(st.booleans()):  # a padded (non-packed) layout: each stride at least the packed one
        strides, acc = [], 1
        for d in reversed(dims):
            strides.append(acc)
            acc *= d + draw(st.integers(0, 3))
        strides = tuple(reversed(strides))
    dt = draw(st.sampled_from([cb.DataType.FLOAT, cb.DataType.DOUBLE, cb.DataType.HALF, cb.DataType.INT32]))
    assume(dims[0] * (strides[0] if strides else math.prod(dims[1:])) < 2**31)  # cuDNN's int32 indexing
    return cb.TensorConfig(data_type=dt, dims=dims, strides=strides)


@settings(max_examples=300, deadline=None)
@given(cfg=tensor_configs())
def test_tensor_descriptor_round_trip(cfg: cb.TensorConfig) -> None:
    with cb.TensorDescriptor(cfg) as t:
        assert t.get() == cfg


def test_tensor_descriptor_forms_and_size() -> None:
    with cb.TensorDescriptor((2, 3, 4), "double") as t:
        assert t.get() == cb.TensorConfig(data_type="double", dims=(2, 3, 4), strides=(12, 4, 1))
        assert t.size_in_bytes() == 2 * 3 * 4 * 8
    with cb.TensorDescriptor([6, 5, 1], strides=[5, 1, 1]) as t:
        assert t.get().strides == (5, 1, 1)
    with cb.TensorDescriptor() as t, pytest.raises(ValueError, match="has not been set"):
        t.get()


# ---------------------------------------------------------------- cuDNN's own rejections
def test_unsorted_lengths_in_packed_layout_rejected_by_cudnn() -> None:
    new = new_handles()
    cfg = cb.SeqDataConfig(layout="seq_major_packed", max_seq_length=5, batch_size=3, vector_size=2,
                           seq_lengths=[2, 5, 1])
    with pytest.raises(cb.CudnnError) as info:
        cb.RNNDataDescriptor(cfg)
    err = info.value
    assert err.status == 2000 and err.name == "CUDNN_STATUS_BAD_PARAM"
    assert err.function == "cudnnSetRNNDataDescriptor" and "isSortedSequences" in err.detail
    assert str(err).startswith("cudnnSetRNNDataDescriptor failed with CUDNN_STATUS_BAD_PARAM (2000): ")
    assert "isSortedSequences" in str(err)
    assert new() == {}  # the half-built descriptor was freed


def test_zero_length_in_packed_layout_rejected_by_cudnn() -> None:
    cfg = cb.SeqDataConfig(layout="seq_major_packed", max_seq_length=5, batch_size=2, vector_size=2,
                           seq_lengths=[5, 0])
    with pytest.raises(cb.CudnnError, match="minSeqLengthInArray"):
        cb.RNNDataDescriptor(cfg)


def test_zero_stride_rejected_by_cudnn() -> None:
    with pytest.raises(cb.CudnnError, match=r"CUDNN_STATUS_BAD_PARAM \(2000\): .*stride 0") as info:
        cb.TensorDescriptor((2, 3), strides=(0, 1))
    assert info.value.function == "cudnnSetTensorNdDescriptor"


def test_unsupported_configuration_reports_not_supported() -> None:
    with cb.RNNDescriptor(cb.RNNConfig(input_size=2, hidden_size=2)) as d:
        with pytest.raises(cb.CudnnError) as info:  # GRU with projection, bypassing our validation
            cb.raw.set_rnn_descriptor_v8(d.ptr, 0, int(cb.RNNMode.GRU), 2, 0, 0, 0, 0, 0, 4, 8, 4, 1, None, 0)
        assert info.value.name == "CUDNN_STATUS_NOT_SUPPORTED" and "cudnn gave no further detail" in str(
            info.value).lower()


# ---------------------------------------------------------------- dropout descriptor
def test_dropout_descriptor_without_handle() -> None:
    new = new_handles()
    with cb.DropoutDescriptor() as d:
        assert not d.closed
    with pytest.raises(ValueError, match=r"dropout = 0\.5 needs a Handle"):
        cb.DropoutDescriptor(None, 0.5)
    assert new() == {}


# ---------------------------------------------------------------- lifetime and leaks
KINDS = {
    "TensorDescriptor": lambda: cb.TensorDescriptor((2, 3)),
    "RNNDescriptor": lambda: cb.RNNDescriptor(cb.RNNConfig(input_size=2, hidden_size=3)),
    "RNNDataDescriptor": lambda: cb.RNNDataDescriptor(cb.SeqDataConfig(max_seq_length=2, batch_size=2,
                                                                       vector_size=1, seq_lengths=[2, 0])),
    "DropoutDescriptor": lambda: cb.DropoutDescriptor(),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_close_is_idempotent_and_context_manager_closes(kind: str) -> None:
    new = new_handles()
    d = KINDS[kind]()
    assert new() == {kind: 1} and isinstance(d.ptr, int) and int(d) == d.ptr
    d.close()
    d.close()
    assert d.closed and "closed" in repr(d) and new() == {}
    with pytest.raises(ValueError, match=f"{kind} is closed"):
        _ = d.ptr
    with KINDS[kind]() as d2:
        assert not d2.closed
    assert d2.closed and new() == {}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_finalizer_frees_forgotten_objects(kind: str) -> None:
    new = new_handles()
    d = KINDS[kind]()
    assert new() == {kind: 1}
    del d
    gc.collect()
    assert new() == {}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_ten_thousand_create_close_leave_no_live_handles(kind: str) -> None:
    new = new_handles()
    make = KINDS[kind]
    for _ in range(10_000):
        make().close()
    for _ in range(1_000):  # and some left to the finalizer
        make()
    gc.collect()
    assert new() == {}


def test_live_handles_counts_each_kind() -> None:
    new = new_handles()
    objs = [KINDS[k]() for k in sorted(KINDS) for _ in range(3)]
    assert new() == {k: 3 for k in KINDS}
    for o in objs:
        o.close()
    assert new() == {}
