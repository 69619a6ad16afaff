"""cudnn_bindings' prepared compute calls: the fixed arguments are checked once like the typed call's, and
a call passes C exactly what the typed call would (same order, same values)."""

from __future__ import annotations

import pytest
from support.cudnn import requires_cudnn

import cudnn_bindings as cb
from cudnn_bindings import _lib

pytestmark = requires_cudnn

ADDR = 0x10000  # a well-formed address; the C functions are replaced by recorders below


@pytest.fixture
def recorded(monkeypatch):
    """Every C compute call's arguments, by function name (the library's functions replaced)."""
    calls: list[tuple[str, tuple]] = []
    real = _lib.function

    def function(name):
        if name in ("cudnnRNNForward", "cudnnRNNBackwardData_v8", "cudnnRNNBackwardWeights_v8"):
            return lambda *args: calls.append((name, args)) or 0
        return real(name)

    monkeypatch.setattr(_lib, "function", function)
    return calls


@pytest.fixture
def descriptors():
    cfg = cb.RNNConfig(cell_mode="lstm", input_size=3, hidden_size=4)
    seq = cb.SeqDataConfig(data_type=cb.DataType.FLOAT, layout=cb.RNNDataLayout.SEQ_MAJOR_UNPACKED,
                           max_seq_length=5, batch_size=2, vector_size=3, seq_lengths=[5, 5])
    out = cb.SeqDataConfig(data_type=cb.DataType.FLOAT, layout=cb.RNNDataLayout.SEQ_MAJOR_UNPACKED,
                           max_seq_length=5, batch_size=2, vector_size=4, seq_lengths=[5, 5])
    with cb.RNNDescriptor(cfg) as rnn, cb.RNNDataDescriptor(seq) as x, cb.RNNDataDescriptor(out) as y, \
            cb.TensorDescriptor((1, 2, 4)) as h:
        yield dict(rnn=rnn, x=x, y=y, h=h)


def test_a_prepared_forward_passes_what_the_typed_forward_passes(recorded, descriptors):
    d = descriptors
    fixed = dict(fwd_mode=cb.ForwardMode.TRAINING, dev_seq_lengths=ADDR, x_desc=d["x"], y_desc=d["y"],
                 h_desc=d["h"], c_desc=d["h"], weight_space_size=100, work_space_size=200,
                 reserve_space_size=300)
    per_call = dict(x=ADDR + 8, y=ADDR + 16, hx=0, hy=ADDR + 24, cx=ADDR + 32, cy=ADDR + 40,
                    weight_space=ADDR + 48, work_space=ADDR + 56, reserve_space=ADDR + 64)
    handle = 0x20000
    cb.forward(handle, d["rnn"], **fixed, **per_call)
    prepared = cb.prepare_forward(d["rnn"], **fixed)
    prepared(handle=handle, **per_call)
    (name1, typed), (name2, fast) = recorded
    assert name1 == name2 == "cudnnRNNForward"
    assert [a or 0 for a in typed] == [a or 0 for a in fast]
    assert prepared.per_call == ("handle", "x", "y", "hx", "hy", "cx", "cy", "weight_space", "work_space",
                                 "reserve_space")


def test_prepared_backward_calls_pass_what_the_typed_calls_pass(recorded, descriptors):
    d = descriptors
    common = dict(dev_seq_lengths=ADDR, x_desc=d["x"], y_desc=d["y"], h_desc=d["h"], weight_space_size=100,
                  work_space_size=200, reserve_space_size=300)
    data = dict(y=ADDR + 8, dy=ADDR + 16, dx=ADDR + 24, hx=0, dhy=0, dhx=ADDR + 32, cx=0, dcy=0,
                dcx=ADDR + 40, weight_space=ADDR + 48, work_space=ADDR + 56, reserve_space=ADDR + 64)
    weights = dict(x=ADDR + 8, hx=0, y=ADDR + 16, dweight_space=ADDR + 24, work_space=ADDR + 32,
                   reserve_space=ADDR + 40)
    cb.backward_data(0x20000, d["rnn"], c_desc=d["h"], **common, **data)
    cb.prepare_backward_data(d["rnn"], c_desc=d["h"], **common)(handle=0x20000, **data)
    cb.backward_weights(0x20000, d["rnn"], **common, **weights)
    cb.prepare_backward_weights(d["rnn"], **common)(handle=0x20000, **weights)
    assert [n for n, _ in recorded] == ["cudnnRNNBackwardData_v8"] * 2 + ["cudnnRNNBackwardWeights_v8"] * 2
    for (_, typed), (_, fast) in zip(recorded[::2], recorded[1::2], strict=True):
        assert [a or 0 for a in typed] == [a or 0 for a in fast]


def test_fixed_arguments_are_checked_when_prepared(descriptors):
    d = descriptors
    good = dict(fwd_mode=cb.ForwardMode.INFERENCE, dev_seq_lengths=ADDR, x_desc=d["x"], y_desc=d["y"],
                h_desc=d["h"], weight_space_size=1, work_space_size=1)
    with pytest.raises(TypeError, match="y_desc must be a cudnn_bindings.RNNDataDescriptor"):
        cb.prepare_forward(d["rnn"], **{**good, "y_desc": d["h"]})
    with pytest.raises(ValueError, match=r"work_space_size = -1; expected an integer in 0\.\."):
        cb.prepare_forward(d["rnn"], **{**good, "work_space_size": -1})
    with pytest.raises(ValueError, match="dev_seq_lengths = 0x10; expected an address"):
        cb.prepare_forward(d["rnn"], **{**good, "dev_seq_lengths": 16})
    with pytest.raises(ValueError, match="fwd_mode = 7; expected one of ForwardMode"):
        cb.prepare_forward(d["rnn"], **{**good, "fwd_mode": 7})


def test_a_call_missing_an_address_names_it(descriptors, recorded):
    d = descriptors
    prepared = cb.prepare_forward(d["rnn"], fwd_mode=cb.ForwardMode.INFERENCE, dev_seq_lengths=ADDR,
                                  x_desc=d["x"], y_desc=d["y"], h_desc=d["h"], weight_space_size=1,
                                  work_space_size=1)
    with pytest.raises(TypeError, match=r"missing \['cx', 'cy'\], unexpected \['c'\]"):
        prepared(handle=ADDR, x=ADDR, y=ADDR, hx=0, hy=ADDR, c=0, weight_space=ADDR, work_space=ADDR,
                 reserve_space=0)
    assert not recorded


def test_a_failing_status_raises_cudnn_error(monkeypatch, descriptors):
    d = descriptors
    real = _lib.function
    monkeypatch.setattr(_lib, "function", lambda name: (lambda *args: 3000) if name == "cudnnRNNForward"
                        else real(name))
    prepared = cb.prepare_forward(d["rnn"], fwd_mode=cb.ForwardMode.INFERENCE, dev_seq_lengths=ADDR,
                                  x_desc=d["x"], y_desc=d["y"], h_desc=d["h"], weight_space_size=1,
                                  work_space_size=1)
    with pytest.raises(cb.CudnnError, match="cudnnRNNForward failed with CUDNN_STATUS_NOT_SUPPORTED"):
        prepared(handle=ADDR, x=ADDR, y=ADDR, hx=0, hy=ADDR, cx=0, cy=0, weight_space=ADDR, work_space=ADDR,
                 reserve_space=0)
