"""The RNN call wrappers: argument checking that happens before any cuDNN call (no GPU needed).

The calls themselves need a handle, hence a GPU: see test_cudnn_gpu.py. Every case here fails in
argument conversion, so the fake handle address below is never passed to cuDNN.
"""

from __future__ import annotations

import pytest
from support.cudnn import new_handles, requires_cudnn

import cudnn_bindings as cb

pytestmark = requires_cudnn
FAKE_HANDLE = 0x1000  # never reaches cuDNN


@pytest.fixture
def descs():
    with cb.RNNDescriptor(cb.RNNConfig(input_size=3, hidden_size=4)) as rnn, \
            cb.RNNDataDescriptor(cb.SeqDataConfig(max_seq_length=2, batch_size=1, vector_size=3)) as x, \
            cb.RNNDataDescriptor(cb.SeqDataConfig(max_seq_length=2, batch_size=1, vector_size=4)) as y, \
            cb.TensorDescriptor((1, 1, 4)) as h:
        yield {"rnn": rnn, "x": x, "y": y, "h": h}


def _forward_kwargs(d: dict, **over) -> dict:
    kw = dict(fwd_mode="training", dev_seq_lengths=0x2000, x_desc=d["x"], x=0x3000, y_desc=d["y"], y=0x4000,
              h_desc=d["h"], weight_space=0x5000, weight_space_size=64, work_space=0x6000, work_space_size=64,
              reserve_space=0x7000, reserve_space_size=64)
    return {**kw, **over}


def test_handle_must_be_given(descs: dict) -> None:
    with pytest.raises(TypeError, match=r"handle is None; expected a cudnn_bindings\.Handle \(or its int"):
        cb.weight_space_size(None, descs["rnn"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="rnn_desc must be a cudnn_bindings.RNNDescriptor or its int address"):
        cb.weight_space_size(FAKE_HANDLE, "rnn")  # type: ignore[arg-type]


def test_closed_descriptor_is_refused(descs: dict) -> None:
    rnn = cb.RNNDescriptor(cb.RNNConfig(input_size=3, hidden_size=4))
    rnn.close()
    with pytest.raises(ValueError, match="RNNDescriptor is closed"):
        cb.weight_space_size(FAKE_HANDLE, rnn)
    with pytest.raises(ValueError, match="RNNDescriptor is closed"):
        cb.forward(FAKE_HANDLE, rnn, **_forward_kwargs(descs))


@pytest.mark.parametrize(("over", "exc", "match"), [
    ({"fwd_mode": 3}, ValueError, r"fwd_mode = 3; expected one of ForwardMode: INFERENCE \(0\), TRAINING"),
    ({"x": -1}, ValueError, r"x = -0x1; expected 0 \(NULL\) or an address in 0x1000\.\."),
    ({"y": 1.5}, TypeError, r"y must be None or an int address; got 1\.5"),
    ({"weight_space_size": -8}, ValueError, r"weight_space_size = -8"),
    ({"c_desc": 5.0}, TypeError, r"c_desc must be a cudnn_bindings\.TensorDescriptor, its int address or"),
    ({"h_desc": None}, TypeError, r"h_desc is None; expected a cudnn_bindings\.TensorDescriptor"),
])
def test_forward_arguments_checked(descs: dict, over: dict, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        cb.forward(FAKE_HANDLE, descs["rnn"], **_forward_kwargs(descs, **over))


def test_backward_arguments_checked(descs: dict) -> None:
    kw = dict(dev_seq_lengths=0x2000, y_desc=descs["y"], y=0x3000, dy=0x3100, x_desc=descs["x"], dx=-4,
              h_desc=descs["h"], weight_space=0x5000, weight_space_size=64, work_space=0x6000,
              work_space_size=64, reserve_space=0x7000, reserve_space_size=64)
    with pytest.raises(ValueError, match=r"dx = -0x4"):
        cb.backward_data(FAKE_HANDLE, descs["rnn"], **kw)
    wkw = dict(dev_seq_lengths=0x2000, x_desc=descs["x"], x=0x3000, h_desc=descs["h"], y_desc=descs["y"],
               y=0x3100, dweight_space=0x5000, weight_space_size=64, work_space=0x6000, work_space_size=64,
               reserve_space=0x7000, reserve_space_size=64)
    with pytest.raises(ValueError, match=r"add_grad = 'replace'; expected one of WgradMode: ADD \(0\), SET"):
        cb.backward_weights(FAKE_HANDLE, descs["rnn"], add_grad="replace", **wkw)


def test_weight_params_needs_a_base_address(descs: dict) -> None:
    new = new_handles()
    with pytest.raises(ValueError, match=r"weight_space = 0x0; expected an address in 0x1000\.\."):
        cb.weight_params(FAKE_HANDLE, descs["rnn"], 0, 0, weight_space=0, weight_space_size=64)
    assert new() == {}  # the two temporary tensor descriptors were not even created


def test_temp_sizes_and_build_arguments_checked(descs: dict) -> None:
    with pytest.raises(ValueError, match="fwd_mode = 'backward'"):
        cb.temp_space_sizes(FAKE_HANDLE, descs["rnn"], descs["x"], fwd_mode="backward")
    with pytest.raises(ValueError, match=r"mini_batch = 0; expected an integer in 1\.\."):
        cb.build_rnn_dynamic(FAKE_HANDLE, descs["rnn"], 0)


def test_weight_region_size() -> None:
    r = cb.WeightRegion(offset=16, dims=(1, 8, 3), strides=(24, 3, 1), data_type=cb.DataType.FLOAT)
    assert r.size == 24
    assert cb.WeightParams(matrix=r, bias=None).bias is None
