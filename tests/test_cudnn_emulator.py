"""The dry run's own parts, checked before they are trusted (tests/support/fake_cupy.py, cudnn_emulator.py,
cudnn_dry_run.py): the CuPy stand-in refuses to mix with NumPy like CuPy; cuDNN's fake-handle validation
accepts a good call and rejects a bad one with its reason; the float64 emulation of cudnnRNNForward /
BackwardData_v8 / BackwardWeights_v8 equals PyTorch (weights placed through cudnnGetRNNWeightParams and the
linLayerID table of the cuDNN docs, not through arrayrnn's index map) and refuses what the docs forbid."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from support.cudnn import requires_cudnn
from support.rnn_cases import make_case
from support.torch_oracle import run_torch

import arrayrnn as ar
import cudnn_bindings as cb

pytestmark = requires_cudnn


@pytest.fixture(scope="module")
def dry():
    from support import cudnn_dry_run

    return cudnn_dry_run


# -- the CuPy stand-in ----------------------------------------------------------------------------
def test_stand_in_does_not_mix_with_numpy_arrays():
    from support import fake_cupy

    with fake_cupy.installed() as cp:
        a, host = cp.ones((2, 3)), np.ones((2, 3))
        for mixed in (lambda: a + host, lambda: host * a, lambda: cp.concatenate([a, host]),
                      lambda: cp.where(a > 0, host, 0.0), lambda: np.asarray(a)):
            with pytest.raises(TypeError):
                mixed()
        with pytest.raises(ValueError, match="non-scalar numpy.ndarray cannot be used for fill"):
            a[...] = host
        with pytest.raises(TypeError, match="different devices"):
            ar.rnn_forward(ar.PackedParams.init(ar.RNNSpec("gru", 3, 2, dtype="float64"), xp=cp), host[None])
        assert isinstance(a.sum(), cp.ndarray) and float(a.sum()) == 6.0   # reductions stay on the device
        assert np.isnan(cp.empty(3).get()).all()                          # stale memory, not zeros
        assert a.data.ptr == a.__cuda_array_interface__["data"][0] != 0 and cp.empty(0).data.ptr == 0
        assert fake_cupy.device_memory_covers(a[1].data.ptr, 24)
        assert not fake_cupy.device_memory_covers(a[1].data.ptr, 25)
        assert not fake_cupy.device_memory_covers(host.ctypes.data, 8)


# -- cuDNN's validation with the fake handle ------------------------------------------------------
def _descriptors(config: cb.RNNConfig, T: int, lengths, layout=cb.RNNDataLayout.SEQ_MAJOR_UNPACKED):
    B, D = len(lengths), config.num_directions

    def seq(width: int) -> cb.RNNDataDescriptor:
        return cb.RNNDataDescriptor(cb.SeqDataConfig(data_type=config.data_type, layout=layout,
                                                     max_seq_length=T, batch_size=B, vector_size=width,
                                                     seq_lengths=lengths))

    states = config.num_layers * D
    return (seq(config.input_size), seq(D * config.proj_size),
            cb.TensorDescriptor((states, B, config.proj_size), config.data_type),
            cb.TensorDescriptor((states, B, config.hidden_size), config.data_type))


def _buffers(config, T, B, work, reserve, weight_bytes):
    itemsize = np.dtype(_NP[config.data_type]).itemsize
    D, L = config.num_directions, config.num_layers
    sizes = dict(x=T * B * config.input_size, y=T * B * D * config.proj_size,
                 h=L * D * B * config.proj_size, c=L * D * B * config.hidden_size)
    bufs = {k: np.zeros(n * itemsize + 8, np.uint8) for k, n in sizes.items()}
    bufs.update(w=np.zeros(weight_bytes, np.uint8), work=np.zeros(work + 8, np.uint8),
                reserve=np.zeros(reserve + 8, np.uint8), lengths=np.zeros(4 * B, np.uint8))
    return bufs, {k: v.ctypes.data for k, v in bufs.items()}


_NP = {cb.DataType.FLOAT: np.float32, cb.DataType.DOUBLE: np.float64, cb.DataType.HALF: np.float16}


def _forward_args(dry, config, T, lengths, layout=cb.RNNDataLayout.SEQ_MAJOR_UNPACKED):
    desc = cb.RNNDescriptor(config)
    x_desc, y_desc, h_desc, c_desc = _descriptors(config, T, lengths, layout)
    handle = dry.FakeHandle()
    weight_bytes = dry.BINDINGS.weight_space_size(handle, desc)
    work, reserve = dry.BINDINGS.temp_space_sizes(handle, desc, x_desc, cb.ForwardMode.TRAINING)
    bufs, p = _buffers(config, T, len(lengths), work, reserve, weight_bytes)
    kw = dict(fwd_mode=cb.ForwardMode.TRAINING, dev_seq_lengths=p["lengths"], x_desc=x_desc, x=p["x"],
              y_desc=y_desc, y=p["y"], h_desc=h_desc, hx=p["h"], hy=p["h"], c_desc=c_desc, cx=p["c"],
              cy=p["c"], weight_space=p["w"], weight_space_size=weight_bytes, work_space=p["work"],
              work_space_size=work, reserve_space=p["reserve"], reserve_space_size=reserve)
    return handle, desc, kw, (bufs, x_desc, y_desc, h_desc, c_desc)


LSTM = cb.RNNConfig(cell_mode=cb.RNNMode.LSTM, input_size=3, hidden_size=5, proj_size=4, num_layers=2,
                    dir_mode=cb.DirectionMode.BIDIRECTIONAL, data_type=cb.DataType.FLOAT,
                    math_prec=cb.DataType.FLOAT)


def test_validation_accepts_a_good_call_and_rejects_bad_ones_with_the_reason(dry):
    handle, desc, kw, keep = _forward_args(dry, LSTM, 5, np.array([5, 2, 3], np.int32))
    before = dry.STATS["cudnnRNNForward"]
    dry.validate("cudnnRNNForward", cb.forward, handle, desc, **kw)
    assert dry.STATS["cudnnRNNForward"] == before + 1
    with pytest.raises(dry.CudnnRejected, match=r"cudnnRNNForward with BAD_PARAM \(2000\)"):
        dry.validate("cudnnRNNForward", cb.forward, handle, desc, **{**kw, "weight_space_size":
                                                                      kw["weight_space_size"] - 4})
    wrong_h = cb.TensorDescriptor((4, 3, 5), cb.DataType.FLOAT)  # hiddenSize where projSize belongs
    with pytest.raises(dry.CudnnRejected, match=r"hxDesc->dimA\[2\] != rnnDesc->projSize"):
        dry.validate("cudnnRNNForward", cb.forward, handle, desc, **{**kw, "h_desc": wrong_h})


def test_batch_major_without_padding_is_validated_through_its_twin(dry):
    """cuDNN 9.24's host code divides by zero on the fake handle there (SIGFPE in the child); the twin with
    one step of padding is validated instead, and still rejects a bad argument."""
    lengths = np.array([5, 5, 5], np.int32)
    handle, desc, kw, keep = _forward_args(dry, LSTM, 5, lengths, cb.RNNDataLayout.BATCH_MAJOR_UNPACKED)
    outcome = dry.in_child(lambda: cb.forward(handle, desc, **kw))
    if outcome[0] != "signal":
        pytest.fail(f"cuDNN no longer crashes here ({outcome}): drop the twin from cudnn_dry_run.validate")
    twins = dry.STATS["twin"]
    dry.validate("cudnnRNNForward", cb.forward, handle, desc, **kw)
    assert dry.STATS["twin"] == twins + 1
    with pytest.raises(dry.CudnnRejected, match="BAD_PARAM"):
        dry.validate("cudnnRNNForward", cb.forward, handle, desc, **{**kw, "reserve_space_size": 1})


# -- the emulation against PyTorch ----------------------------------------------------------------
MODES = {"lstm": cb.RNNMode.LSTM, "gru": cb.RNNMode.GRU, "rnn_tanh": cb.RNNMode.RNN_TANH,
         "rnn_relu": cb.RNNMode.RNN_RELU}
# cudnnGetRNNWeightParams (cuDNN API reference): linLayerID 0..G-1 go with the layer input, G..2G-1 with the
# hidden state, gates in the order LSTM i, f, c~, o / GRU r, u, h~ (= PyTorch's row blocks), 8: projection
TORCH_BLOCK = {"ih": ("W_ih", "b_ih"), "hh": ("W_hh", "b_hh")}


def _place(params: ar.PackedParams, regions, space: np.ndarray) -> None:
    """Write canonical (PyTorch-ordered) blocks into a cuDNN weight space at cuDNN's reported regions."""
    spec, H, G = params.spec, params.spec.hidden_size, params.spec.gates
    for layer, d in itertools.product(range(spec.num_layers), range(spec.num_directions)):
        pseudo = layer * spec.num_directions + d
        for side, k in itertools.product(("ih", "hh"), range(G)):
            lin = k if side == "ih" else G + k
            region = regions(pseudo, lin)
            w_name, b_name = TORCH_BLOCK[side]
            _write(space, region.matrix, params.view(layer, d, w_name)[k * H:(k + 1) * H])
            if params.layout.has(layer, d, b_name):
                _write(space, region.bias, params.view(layer, d, b_name)[k * H:(k + 1) * H])
        if spec.proj_size:
            _write(space, regions(pseudo, 8).matrix, params.view(layer, d, "W_hr"))


def _write(space: np.ndarray, region: cb.WeightRegion, values: np.ndarray) -> None:
    itemsize = space.itemsize
    assert region.offset % itemsize == 0 and region.strides[-1] == 1
    rows = values.reshape(region.dims[-2], -1)
    for r in range(rows.shape[0]):
        start = region.offset // itemsize + r * region.strides[-2]
        space[start:start + rows.shape[1]] = rows[r]


@pytest.mark.parametrize("mode, bias, proj", [("lstm", "double", 3), ("lstm", "none", 0),
                                              ("gru", "double", 0), ("rnn_tanh", "double", 0),
                                              ("rnn_relu", "none", 0)])
@pytest.mark.parametrize("batch_first", [False, True])
def test_emulation_equals_pytorch(dry, mode, bias, proj, batch_first):
    from support.cudnn_emulator import Emulator, Memory

    spec = ar.RNNSpec(mode=mode, input_size=3, hidden_size=5, num_layers=2, bidirectional=True, bias=bias,
                      proj_size=proj, dtype="float64")
    T, B = 6, 4
    case = make_case(spec, T, B, seed=7, lengths="unsorted", batch_first=batch_first)
    lengths = case.lengths.astype(np.int32)
    config = cb.RNNConfig(cell_mode=MODES[mode], bias_mode={"double": cb.RNNBiasMode.DOUBLE_BIAS,
                                                            "none": cb.RNNBiasMode.NO_BIAS}[bias],
                          dir_mode=cb.DirectionMode.BIDIRECTIONAL, data_type=cb.DataType.DOUBLE,
                          math_prec=cb.DataType.DOUBLE, input_size=3, hidden_size=5, proj_size=proj or 5,
                          num_layers=2)
    layout = cb.RNNDataLayout.BATCH_MAJOR_UNPACKED if batch_first else cb.RNNDataLayout.SEQ_MAJOR_UNPACKED
    handle, desc, kw, (bufs, *_) = _forward_args(dry, config, T, lengths, layout)
    regions = dry._region_lookup(desc, kw["weight_space_size"])
    _place(case.params, regions, bufs["w"].view(np.float64))
    for name, value in (("x", case.x), ("h", case.h0), ("c", case.c0), ("lengths", lengths)):
        if value is not None:
            bufs[name][:value.nbytes] = np.ascontiguousarray(value).view(np.uint8).ravel()
    kw.update(hy=_scratch(bufs, "hy", case.h0), cy=_scratch(bufs, "cy", case.c0))
    if mode != "lstm":
        kw.update(c_desc=None, cx=0, cy=0)
    emulator = Emulator(Memory(), lambda d, size: regions)
    emulator.forward(handle, desc, **kw)
    ref = run_torch(case.params, case.x, case.lengths, case.h0, case.c0, case.dy, case.dh_n, case.dc_n,
                    batch_first=batch_first)
    y = _array(bufs["y"], case.dy.shape)
    valid = _valid(lengths, T, batch_first)
    np.testing.assert_allclose(y[valid], ref.y[valid], rtol=1e-12, atol=1e-13)
    assert not y[~valid].any()  # paddingFill = 0
    np.testing.assert_allclose(_array(bufs["hy"], case.h0.shape), ref.h_n, rtol=1e-12, atol=1e-13)
    if mode == "lstm":
        np.testing.assert_allclose(_array(bufs["cy"], case.c0.shape), ref.c_n, rtol=1e-12, atol=1e-13)

    grads = _backward(emulator, handle, desc, kw, bufs, case, mode == "lstm")
    np.testing.assert_allclose(grads["dx"][valid], ref.dx[valid], rtol=1e-11, atol=1e-12)
    assert np.isnan(grads["dx"][~valid]).all()  # the padding of dx is never written
    np.testing.assert_allclose(grads["dh0"], ref.dh0, rtol=1e-11, atol=1e-12)
    if mode == "lstm":
        np.testing.assert_allclose(grads["dc0"], ref.dc0, rtol=1e-11, atol=1e-12)
    dw = ar.PackedParams.zeros(spec)
    dspace = grads["dw"]
    _gather(dw, regions, dspace)
    for key, view in dw.named_views().items():
        np.testing.assert_allclose(view, ref.grads[key], rtol=1e-11, atol=1e-12, err_msg=key)


def _scratch(bufs, name, like):
    if like is None:
        return 0
    bufs[name] = np.zeros(like.nbytes, np.uint8)
    return bufs[name].ctypes.data


def _array(buf: np.ndarray, shape) -> np.ndarray:
    return buf[:int(np.prod(shape)) * 8].view(np.float64).reshape(shape)


def _valid(lengths, T, batch_first):
    valid = np.arange(T)[:, None] < lengths[None, :]
    return valid.T if batch_first else valid


def _backward(emulator, handle, desc, kw, bufs, case, lstm):
    dx = np.full(case.x.size, np.nan)
    dh0, dc0 = np.zeros(case.h0.size), (np.zeros(case.c0.size) if lstm else None)
    dy, dh_n = np.ascontiguousarray(case.dy), np.ascontiguousarray(case.dh_n)
    dc_n = np.ascontiguousarray(case.dc_n) if lstm else None
    common = {k: kw[k] for k in ("dev_seq_lengths", "y_desc", "x_desc", "h_desc", "weight_space_size",
                                 "work_space", "work_space_size", "reserve_space", "reserve_space_size")}
    emulator.backward_data(handle, desc, y=kw["y"], dy=dy.ctypes.data, dx=dx.ctypes.data, hx=kw["hx"],
                           dhy=dh_n.ctypes.data, dhx=dh0.ctypes.data, c_desc=kw["c_desc"], cx=kw["cx"],
                           dcy=dc_n.ctypes.data if lstm else 0, dcx=dc0.ctypes.data if lstm else 0,
                           weight_space=kw["weight_space"], **common)
    dw = np.zeros(kw["weight_space_size"] // 8)
    emulator.backward_weights(handle, desc, add_grad=cb.WgradMode.ADD, x=kw["x"], hx=kw["hx"], y=kw["y"],
                              dweight_space=dw.ctypes.data, **common)
    return dict(dx=dx.reshape(case.x.shape), dh0=dh0.reshape(case.h0.shape),
                dc0=None if dc0 is None else dc0.reshape(case.c0.shape), dw=dw)


def _gather(params: ar.PackedParams, regions, space: np.ndarray) -> None:
    spec, H, G = params.spec, params.spec.hidden_size, params.spec.gates
    for layer, d in itertools.product(range(spec.num_layers), range(spec.num_directions)):
        pseudo = layer * spec.num_directions + d
        for side, k in itertools.product(("ih", "hh"), range(G)):
            region = regions(pseudo, k if side == "ih" else G + k)
            w_name, b_name = TORCH_BLOCK[side]
            params.view(layer, d, w_name)[k * H:(k + 1) * H] = _read(space, region.matrix)
            if params.layout.has(layer, d, b_name):
                params.view(layer, d, b_name)[k * H:(k + 1) * H] = _read(space, region.bias).ravel()
        if spec.proj_size:
            params.view(layer, d, "W_hr")[...] = _read(space, regions(pseudo, 8).matrix)


def _read(space: np.ndarray, region: cb.WeightRegion) -> np.ndarray:
    rows, cols = region.dims[-2], region.dims[-1]
    start = region.offset // space.itemsize
    return np.stack([space[start + r * region.strides[-2]:][:cols] for r in range(rows)])


def test_emulation_refuses_what_the_docs_forbid(dry):
    from support.cudnn_emulator import EmulationError, Emulator, Memory

    config = LSTM
    lengths = np.array([5, 2, 3], np.int32)
    handle, desc, kw, (bufs, *_) = _forward_args(dry, config, 5, lengths)
    regions = dry._region_lookup(desc, kw["weight_space_size"])
    bufs["lengths"][:12] = lengths.view(np.uint8)
    emulator = Emulator(Memory(), lambda d, size: regions)
    common = {k: kw[k] for k in ("dev_seq_lengths", "x_desc", "h_desc", "weight_space_size", "work_space",
                                 "work_space_size", "reserve_space", "reserve_space_size")}
    with pytest.raises(EmulationError, match="does not hold a TRAINING forward"):
        emulator.backward_weights(handle, desc, add_grad=cb.WgradMode.ADD, x=kw["x"], y_desc=kw["y_desc"],
                                  y=kw["y"], dweight_space=kw["weight_space"], **common)
    emulator.forward(handle, desc, **kw)
    with pytest.raises(EmulationError, match="before cudnnRNNBackwardData_v8"):
        emulator.backward_weights(handle, desc, add_grad=cb.WgradMode.ADD, x=kw["x"], y_desc=kw["y_desc"],
                                  y=kw["y"], dweight_space=kw["weight_space"], **common)
    with pytest.raises(EmulationError, match="supports only CUDNN_WGRAD_MODE_ADD"):
        emulator.backward_weights(handle, desc, add_grad=cb.WgradMode.SET, x=kw["x"], y_desc=kw["y_desc"],
                                  y=kw["y"], dweight_space=kw["weight_space"], **common)
    bufs["lengths"][:4] = np.array([4], np.int32).view(np.uint8)
    with pytest.raises(EmulationError, match=r"devSeqLengths = \[4, 2, 3\] differ"):
        emulator.forward(handle, desc, **kw)
    with pytest.raises(EmulationError, match="do not lie inside one live CuPy array"):
        dry.DeviceMemory().check(kw["x"], 8, "x")
