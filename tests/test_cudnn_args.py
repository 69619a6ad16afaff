"""Typed slots refuse the wrong thing before any C call: ints beyond the C type (ctypes would truncate them),
small or negative addresses, owning objects of the wrong kind or closed, None where an object is needed.

No GPU: every case fails in argument checking (cudnn_bindings.args), so the fake addresses never reach cuDNN.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from support.cudnn import requires_cudnn

import cudnn_bindings as cb
from cudnn_bindings import args, raw

pytestmark = requires_cudnn
FAKE_HANDLE = 0x1000  # the lowest address accepted; never reaches cuDNN here


@pytest.fixture
def descs():
    with cb.RNNDescriptor(cb.RNNConfig(input_size=3, hidden_size=4)) as rnn, \
            cb.RNNDataDescriptor(cb.SeqDataConfig(max_seq_length=2, batch_size=1, vector_size=3)) as x, \
            cb.TensorDescriptor((1, 1, 4)) as h:
        yield {"rnn": rnn, "x": x, "h": h}


# ---------------------------------------------------------------- raw: C integer ranges
@pytest.mark.parametrize("status", [2**40, 2**32, 2**31, -2**31 - 1])
def test_error_string_refuses_ints_that_ctypes_would_truncate(status: int) -> None:
    """``c_int(2**40)`` is 0, so the old wrapper answered "CUDNN_STATUS_SUCCESS" for 2**40."""
    with pytest.raises(ValueError, match=rf"get_error_string: status = {status}; expected an integer in "
                                         r"-2147483648\.\.2147483647"):
        raw.get_error_string(status)


def test_error_string_in_range_still_answers() -> None:
    assert raw.get_error_string(2000) == "CUDNN_STATUS_BAD_PARAM"
    assert raw.get_error_string(np.int64(0)) == "CUDNN_STATUS_SUCCESS"
    with pytest.raises(TypeError, match=r"status must be an integer .*; got '2000' \(str\)"):
        raw.get_error_string("2000")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"status must be an integer .*; got True \(bool\)"):
        raw.get_error_string(True)


@pytest.mark.parametrize("max_dims", [0, -1, 9, 2**40])
def test_get_tensor_nd_descriptor_checks_max_dims(descs: dict, max_dims: int) -> None:
    with pytest.raises(ValueError, match=rf"max_dims = {max_dims}; expected an integer in 1\.\.8"):
        raw.get_tensor_nd_descriptor(descs["h"].ptr, max_dims)
    assert raw.get_tensor_nd_descriptor(descs["h"].ptr, 3)[1] == (1, 1, 4)


def test_set_tensor_nd_descriptor_checks_dims_and_strides(descs: dict) -> None:
    ptr = descs["h"].ptr
    with pytest.raises(ValueError, match=r"dims\[1\] = 1099511627776; expected an integer in"):
        raw.set_tensor_nd_descriptor(ptr, 0, (2, 2**40, 1), (1, 1, 1))
    with pytest.raises(ValueError, match=r"strides has 2 entries; expected len\(dims\) = 3"):
        raw.set_tensor_nd_descriptor(ptr, 0, (2, 3, 1), (3, 1))  # the old wrapper zero-filled the third
    with pytest.raises(ValueError, match=r"dims has 9 entries; expected 1\.\.8"):
        raw.set_tensor_nd_descriptor(ptr, 0, (1,) * 9, (1,) * 9)
    with pytest.raises(TypeError, match=r"dims must be a sequence of integers; got 3"):
        raw.set_tensor_nd_descriptor(ptr, 0, 3, (1,))  # type: ignore[arg-type]
    assert descs["h"].get().dims == (1, 1, 4)  # nothing reached cuDNN


@pytest.mark.parametrize(("over", "match"), [
    ({"num_layers": 2**31}, r"num_layers = 2147483648; expected an integer in -2147483648\.\.2147483647"),
    ({"aux_flags": -1}, r"aux_flags = -1; expected an integer in 0\.\.4294967295 \(C uint32_t\)"),
    ({"cell_mode": 2**32 + 2}, r"cell_mode = 4294967298"),
    ({"dropout_desc": 7}, r"dropout_desc = 0x7; expected 0 \(NULL\) or an address in 0x1000"),
])
def test_set_rnn_descriptor_ranges(descs: dict, over: dict, match: str) -> None:
    kw = dict(algo=0, cell_mode=2, bias_mode=2, dir_mode=0, input_mode=0, data_type=0, math_prec=0,
              math_type=0, input_size=3, hidden_size=4, proj_size=4, num_layers=1, dropout_desc=None,
              aux_flags=0)
    before = descs["rnn"].get()
    with pytest.raises(ValueError, match=match):
        raw.set_rnn_descriptor_v8(descs["rnn"].ptr, **{**kw, **over})
    assert descs["rnn"].get() == before


def test_floats_beyond_c_float_and_non_numbers(descs: dict) -> None:
    with cb.DropoutDescriptor() as drop:
        with pytest.raises(ValueError, match=r"dropout = 1e\+39; beyond the range of float"):
            raw.set_dropout_descriptor(drop.ptr, FAKE_HANDLE, 1e39, None, 0, 0)
        with pytest.raises(ValueError, match=r"seed = 18446744073709551616; expected an integer in 0\.\."):
            raw.set_dropout_descriptor(drop.ptr, FAKE_HANDLE, 0.0, None, 0, 2**64)
    with pytest.raises(TypeError, match=r"lclip must be a real number \(double\); got '0'"):
        raw.rnn_set_clip(descs["rnn"].ptr, 0, "0", 1.0)  # type: ignore[arg-type]


# ---------------------------------------------------------------- raw: addresses
@pytest.mark.parametrize(("value", "exc", "match"), [
    (5, ValueError, r"handle = 0x5; expected 0 \(NULL\) or an address in 0x1000\.\.2\*\*64 - 1"),
    (4095, ValueError, r"handle = 0xfff"),
    (-8, ValueError, r"handle = -0x8"),
    (2**64, ValueError, r"handle = 0x10000000000000000"),
    (1.0, TypeError, r"handle must be None or an int address; got 1\.0 \(float\)"),
    ("0x1000", TypeError, r"handle must be None or an int address"),
])
def test_raw_addresses_checked(value: object, exc: type, match: str) -> None:
    """A small int as a handle used to reach cuDNN, which dereferenced it (segfault)."""
    with pytest.raises(exc, match=match):
        raw.get_stream(value)  # type: ignore[arg-type]
    with pytest.raises(exc, match=match):
        raw.destroy(value)  # type: ignore[arg-type]


def test_raw_refuses_an_owning_object_with_a_hint(descs: dict) -> None:
    with pytest.raises(TypeError, match=r"get_tensor_size_in_bytes: desc must be None or an int address; got "
                                        r"<TensorDescriptor .*pass its \.ptr"):
        raw.get_tensor_size_in_bytes(descs["h"])  # type: ignore[arg-type]
    assert raw.get_tensor_size_in_bytes(descs["h"].ptr) == 16


def test_stream_slot_allows_cudas_special_streams() -> None:
    assert args.stream("stream", 1) == 1  # cudaStreamLegacy
    assert args.stream("stream", 2) == 2  # cudaStreamPerThread
    assert args.stream("stream", 0) is None
    with pytest.raises(ValueError, match="stream = 0x3"):
        args.stream("stream", 3)


def test_every_raw_parameter_is_checked() -> None:
    """The mechanism only helps if no wrapper forgets a parameter: each one has a C type from args."""
    unchecked = []
    for name in raw.__all__:
        fn = getattr(raw, name)
        if name == "check":
            continue
        params = [p for p in inspect.signature(fn).parameters if p != "hint"]
        checks = args._checkers(inspect.unwrap(fn))
        unchecked += [f"{name}({p})" for p in params if p not in checks]
        if params:
            assert fn is not inspect.unwrap(fn), f"{name} is not wrapped by args.checked"
    assert not unchecked


# ---------------------------------------------------------------- typed layer: kinds, closed, None
def test_wrong_kind_in_a_typed_slot_is_refused(descs: dict) -> None:
    """A TensorDescriptor as the RNN descriptor used to reach cuDNN (garbage sizes or success)."""
    with pytest.raises(TypeError, match=r"rnn_desc must be a cudnn_bindings\.RNNDescriptor or its int "
                                        r"address; got <TensorDescriptor"):
        cb.weight_space_size(FAKE_HANDLE, descs["h"])
    with pytest.raises(TypeError, match=r"handle must be a cudnn_bindings\.Handle or its int address; got "
                                        r"<TensorDescriptor"):
        cb.weight_space_size(descs["h"], descs["rnn"])
    with pytest.raises(TypeError, match=r"x_desc must be a cudnn_bindings\.RNNDataDescriptor"):
        cb.temp_space_sizes(FAKE_HANDLE, descs["rnn"], descs["h"])
    with pytest.raises(TypeError, match=r"handle must be a cudnn_bindings\.Handle"):
        cb.DropoutDescriptor.states_size(descs["rnn"])


def test_closed_objects_are_refused_naming_the_argument(descs: dict) -> None:
    x = cb.RNNDataDescriptor(cb.SeqDataConfig(max_seq_length=2, batch_size=1, vector_size=3))
    x.close()
    with pytest.raises(ValueError, match=r"x_desc: this RNNDataDescriptor is closed"):
        cb.temp_space_sizes(FAKE_HANDLE, descs["rnn"], x)
    drop = cb.DropoutDescriptor()
    drop.close()
    with pytest.raises(ValueError, match=r"dropout: this DropoutDescriptor is closed"):
        descs["rnn"].set(cb.RNNConfig(input_size=3, hidden_size=4), drop)
    with pytest.raises(ValueError, match="TensorDescriptor is closed"):
        int(_closed_tensor())


def _closed_tensor() -> cb.TensorDescriptor:
    t = cb.TensorDescriptor((2, 2))
    t.close()
    return t


def test_none_where_an_object_is_needed(descs: dict) -> None:
    """These gave AttributeError ('NoneType' object has no attribute 'ptr' / 'data_type')."""
    with pytest.raises(TypeError, match=r"handle is None; expected a cudnn_bindings\.Handle"):
        cb.DropoutDescriptor.states_size(None)  # type: ignore[arg-type]
    with cb.DropoutDescriptor() as drop, pytest.raises(TypeError, match=r"handle is None"):
        drop.get(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"config must be a TensorConfig; got NoneType"):
        descs["h"].set(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"config must be an RNNConfig; got NoneType"):
        descs["rnn"].set(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"config must be a SeqDataConfig; got NoneType"):
        descs["x"].set(None)  # type: ignore[arg-type]


def test_small_int_as_a_typed_handle_is_refused(descs: dict) -> None:
    with pytest.raises(ValueError, match=r"handle = 0x10; expected an address in 0x1000"):
        cb.weight_space_size(16, descs["rnn"])
    with pytest.raises(ValueError, match=r"handle = 0x0; expected an address"):
        cb.weight_space_size(0, descs["rnn"])
    with cb.DropoutDescriptor() as drop, pytest.raises(ValueError, match=r"states = 0x40; expected 0 "):
        drop.set(FAKE_HANDLE, 0.5, states=64, states_size=64)


def test_other_public_entry_points() -> None:
    with pytest.raises(TypeError, match=r"status must be an integer .*; got 'x' \(str\)"):
        cb.check("x", "cudnnFoo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"status = 1099511627776; expected an integer in"):
        cb.check(2**40, "cudnnFoo")
    with pytest.raises(cb.CudnnError, match="CUDNN_STATUS_BAD_PARAM"):
        cb.check(2000, "cudnnFoo")
    with pytest.raises(TypeError, match=r"dropout must be a real number; got 'x'"):
        cb.DropoutDescriptor(None, "x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"dims = \(2, 65536, 65536\) is too large to pack: the outer "
                                         r"stride would be 4294967296 > 2147483647"):
        cb.TensorConfig(dims=(2, 2**16, 2**16))


def test_a_large_batch_has_a_short_repr() -> None:
    """The repr listed every length (a 2**31-row batch printed gigabytes)."""
    cfg = cb.SeqDataConfig(max_seq_length=3, batch_size=1000, vector_size=1)
    assert repr(cfg).endswith("seq_lengths=[3, 3, 3, 3, 3, 3, 3, 3, ... (1000 lengths)])")
    small = cb.SeqDataConfig(max_seq_length=3, batch_size=2, vector_size=1)
    assert repr(small).endswith("seq_lengths=[3, 3])")


@pytest.mark.parametrize(("stream", "exc"), [(5, ValueError), ("s", TypeError)])
def test_handle_checks_its_stream_before_creating(stream: object, exc: type) -> None:
    """Without a GPU cudnnCreate fails: the stream error must come first (with a GPU: no handle made)."""
    with pytest.raises(exc, match="stream"):
        cb.Handle(0, stream=stream)
