"""RNNConfig, SeqDataConfig, TensorConfig: defaults, coercion and validation (no cuDNN call involved)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import cudnn_bindings as cb
from cudnn_bindings.config import fill_bytes, fill_value


def lstm(**kw) -> cb.RNNConfig:
    return cb.RNNConfig(**{"input_size": 3, "hidden_size": 4, **kw})


def seq(**kw) -> cb.SeqDataConfig:
    return cb.SeqDataConfig(**{"max_seq_length": 5, "batch_size": 3, "vector_size": 2, **kw})


# ---------------------------------------------------------------- RNNConfig
def test_rnn_defaults_follow_the_design() -> None:
    c = lstm()
    assert c.algo is cb.RNNAlgo.STANDARD and c.cell_mode is cb.RNNMode.LSTM
    assert c.bias_mode is cb.RNNBiasMode.DOUBLE_BIAS and c.dir_mode is cb.DirectionMode.UNIDIRECTIONAL
    assert c.input_mode is cb.RNNInputMode.LINEAR_INPUT
    assert c.data_type is cb.DataType.FLOAT and c.math_prec is cb.DataType.FLOAT
    assert c.math_type is cb.MathType.DEFAULT_MATH
    assert c.proj_size == c.hidden_size == 4 and c.num_layers == 1
    assert c.aux_flags == cb.enums.RNN_PADDED_IO_ENABLED and c.padded_io
    assert c.clip_mode is cb.RNNClipMode.NONE and (c.lclip, c.rclip) == (0.0, 0.0)
    assert c.num_directions == 1 and lstm(dir_mode="BIDIRECTIONAL").num_directions == 2


def test_rnn_enum_fields_accept_member_int_or_name() -> None:
    a = lstm(cell_mode=cb.RNNMode.GRU, dir_mode=1, bias_mode="single_rec_bias")
    assert a.cell_mode is cb.RNNMode.GRU and a.dir_mode is cb.DirectionMode.BIDIRECTIONAL
    assert a.bias_mode is cb.RNNBiasMode.SINGLE_REC_BIAS
    assert lstm(cell_mode=np.int64(1)).cell_mode is cb.RNNMode.RNN_TANH


def test_rnn_is_frozen_and_hashable() -> None:
    c = lstm()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.hidden_size = 8  # type: ignore[misc]
    assert hash(c) == hash(lstm()) and c == lstm()


@pytest.mark.parametrize(("kw", "match"), [
    ({"cell_mode": 7}, r"cell_mode = 7; expected one of RNNMode: RNN_RELU \(0\), RNN_TANH \(1\), LSTM \(2\)"),
    ({"cell_mode": "peephole"}, r"cell_mode = 'peephole'; expected one of RNNMode"),
    ({"algo": "count"}, r"algo = RNNAlgo.COUNT; allowed here: STANDARD \(0\)"),
    ({"data_type": "int8"}, r"data_type = DataType.INT8; allowed here: HALF \(2\), BFLOAT16 \(9\), FLOAT"),
    ({"data_type": "double", "math_prec": "float"}, r"math_prec = DataType.FLOAT; allowed here: DOUBLE"),
    ({"data_type": "half", "math_prec": "double"}, r"math_prec = DataType.DOUBLE; allowed here: HALF"),
    ({"math_type": 4}, r"math_type = 4; expected one of MathType"),
    ({"hidden_size": 0}, r"hidden_size = 0; expected an integer in 1\.\.2147483647"),
    ({"input_size": -1}, r"input_size = -1; expected an integer in 1\.\."),
    ({"num_layers": 2**31}, r"num_layers = 2147483648; expected an integer in 1\.\.2147483647"),
    ({"proj_size": 5}, r"proj_size = 5; expected an integer in 1\.\.4"),
    ({"proj_size": 0}, r"proj_size = 0; expected an integer in 1\.\.4"),
    ({"cell_mode": "gru", "proj_size": 2}, r"proj_size = 2 < hidden_size = 4 with cell_mode = GRU; .*LSTM"),
    ({"input_mode": "skip_input"}, r"input_size = 3 with input_mode = SKIP_INPUT; .*== hidden_size"),
    ({"aux_flags": 2}, r"aux_flags = 2; expected an integer in 0\.\.1"),
    ({"clip_mode": 2}, r"clip_mode = 2; expected one of RNNClipMode"),
    ({"lclip": 1.0, "rclip": -1.0}, r"lclip = 1\.0 > rclip = -1\.0; expected lclip <= rclip"),
    ({"lclip": math.nan}, r"lclip = nan; expected a number"),
])
def test_rnn_bad_values_name_field_value_and_allowed(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        lstm(**kw)


@pytest.mark.parametrize("kw", [{"hidden_size": 4.0}, {"hidden_size": True}, {"cell_mode": 2.0},
                                {"cell_mode": None}, {"lclip": "1"}, {"num_layers": "2"}])
def test_rnn_wrong_types_are_type_errors(kw: dict) -> None:
    with pytest.raises(TypeError, match=next(iter(kw))):
        lstm(**kw)


def test_rnn_projection_lstm_only_and_clip_inf() -> None:
    c = lstm(proj_size=2, clip_mode="minmax", lclip=-math.inf, rclip=math.inf)
    assert c.proj_size == 2 and c.lclip == -math.inf


# ---------------------------------------------------------------- SeqDataConfig
def test_seq_defaults_and_full_lengths() -> None:
    s = seq()
    assert s.data_type is cb.DataType.FLOAT and s.layout is cb.RNNDataLayout.SEQ_MAJOR_UNPACKED
    assert s.seq_lengths.dtype == np.int32 and s.seq_lengths.tolist() == [5, 5, 5]
    assert s.padding_fill == 0.0


def test_seq_lengths_copied_int32_read_only() -> None:
    src = np.array([5, 0, 2], dtype=np.int64)
    s = seq(seq_lengths=src)
    src[0] = 1
    assert s.seq_lengths.tolist() == [5, 0, 2] and s.seq_lengths.dtype == np.int32
    with pytest.raises(ValueError, match="read-only"):
        s.seq_lengths[0] = 3


def test_seq_equality_and_hash_compare_contents() -> None:
    assert seq(seq_lengths=[1, 2, 3]) == seq(seq_lengths=(1, 2, 3))
    assert seq(seq_lengths=[1, 2, 3]) != seq(seq_lengths=[1, 2, 4])
    assert hash(seq(seq_lengths=[1, 2, 3])) == hash(seq(seq_lengths=np.array([1, 2, 3])))
    assert seq(padding_fill=math.nan) == seq(padding_fill=math.nan)
    assert "seq_lengths=[5, 5, 5]" in repr(seq())


@pytest.mark.parametrize(("kw", "exc", "match"), [
    ({"seq_lengths": [5, 6, 1]}, ValueError,
     r"seq_lengths\[1\] = 6; every length must be in 0\.\.max_seq_length = 5"),
    ({"seq_lengths": [5, -1, 1]}, ValueError, r"seq_lengths\[1\] = -1; every length must be in 0\.\."),
    ({"seq_lengths": [5, 1]}, ValueError, r"seq_lengths has shape \(2,\); expected \(batch_size,\) = \(3,\)"),
    ({"seq_lengths": [[5, 1, 1]]}, ValueError, r"seq_lengths has shape \(1, 3\)"),
    ({"seq_lengths": [1.0, 2.0, 3.0]}, TypeError, r"seq_lengths must hold integers; got dtype float64"),
    ({"seq_lengths": [True, False, True]}, TypeError, r"seq_lengths must hold integers; got dtype bool"),
    ({"max_seq_length": 0}, ValueError, r"max_seq_length = 0; expected an integer in 1\.\."),
    ({"batch_size": 0, "seq_lengths": []}, ValueError, r"batch_size = 0"),
    ({"vector_size": 2.5}, TypeError, r"vector_size must be an integer"),
    ({"layout": 3}, ValueError, r"layout = 3; expected one of RNNDataLayout: SEQ_MAJOR_UNPACKED \(0\)"),
    ({"data_type": "int32"}, ValueError, r"data_type = DataType.INT32; allowed here"),
    ({"data_type": "half", "padding_fill": 1e6}, ValueError, r"padding_fill = 1000000.0 overflows .* HALF"),
    ({"padding_fill": "0"}, TypeError, r"padding_fill must be a real number"),
])
def test_seq_validation(kw: dict, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        seq(**kw)


@pytest.mark.parametrize(("dt", "value", "stored"), [
    ("float", 1.1, float(np.float32(1.1))), ("double", 1.1, 1.1), ("half", 1.1, float(np.float16(1.1))),
    ("bfloat16", 1.1, 1.1015625), ("bfloat16", -2.0, -2.0), ("half", math.inf, math.inf),
])
def test_padding_fill_is_rounded_to_the_data_type(dt: str, value: float, stored: float) -> None:
    assert seq(data_type=dt, padding_fill=value).padding_fill == stored


@given(st.sampled_from(["half", "float", "double"]), st.floats(allow_nan=False, width=16))
def test_fill_bytes_round_trip(dt: str, value: float) -> None:
    raw = fill_bytes(cb.DataType[dt.upper()], value)
    assert len(raw) == {"double": 8, "float": 4, "half": 2}[dt]
    assert fill_value(cb.DataType[dt.upper()], raw) == value  # every float16 value is exact in all three


@given(st.integers(0, 0xFFFF))
def test_fill_bytes_round_trip_bfloat16(bits: int) -> None:
    value = float(np.array(bits << 16, np.uint32).view(np.float32))
    if math.isnan(value):
        return
    raw = fill_bytes(cb.DataType.BFLOAT16, value)
    assert raw == bits.to_bytes(2, "little") and fill_value(cb.DataType.BFLOAT16, raw) == value


# ---------------------------------------------------------------- TensorConfig
def test_tensor_default_strides_are_packed_row_major() -> None:
    t = cb.TensorConfig(dims=(2, 3, 4))
    assert t.strides == (12, 4, 1) and t.data_type is cb.DataType.FLOAT


@pytest.mark.parametrize(("kw", "exc", "match"), [
    ({"dims": (2,)}, ValueError, r"dims has 1 entries; expected 2\.\.8"),
    ({"dims": (1,) * 9}, ValueError, r"dims has 9 entries; expected 2\.\.8"),
    ({"dims": (2, 0, 1)}, ValueError, r"dims\[1\] = 0; expected an integer in 1\.\."),
    ({"dims": (2, 3), "strides": (1,)}, ValueError, r"strides has 1 entries; expected len\(dims\) = 2"),
    ({"dims": (2, 3), "strides": (3, -1)}, ValueError, r"strides\[1\] = -1; expected an integer in 0\.\."),
    ({"dims": "23"}, TypeError, r"dims must be a sequence of integers"),
    ({"dims": (2, 3.0)}, TypeError, r"dims\[1\] must be an integer"),
])
def test_tensor_validation(kw: dict, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        cb.TensorConfig(**kw)
