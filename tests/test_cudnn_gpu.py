"""GPU tests (marker ``gpu``): handle, stream, dropout, weight space, weight layout, and a tiny LSTM forward
and backward checked against a NumPy reference with central differences (float64).

Skipped with the reason when there is no cuDNN library, no CUDA device, or (for device memory) no CuPy.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from support.cudnn import gpu_reason, new_handles

import cudnn_bindings as cb

REASON = gpu_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(bool(REASON), reason=REASON or "GPU present")]
GATES = {cb.RNNMode.RNN_RELU: 1, cb.RNNMode.RNN_TANH: 1, cb.RNNMode.LSTM: 4, cb.RNNMode.GRU: 3}


@pytest.fixture(scope="module")
def cp():
    return pytest.importorskip("cupy", reason="CuPy is needed for device memory in the cuDNN GPU tests")


@pytest.fixture
def handle(cp):
    new = new_handles()
    with cb.Handle(stream=cp.cuda.get_current_stream()) as h:
        yield h
    assert new() == {}


def test_handle_and_stream() -> None:
    new = new_handles()
    with cb.Handle() as h:
        assert h.ptr and h.device == 0 and h.stream == 0
        assert new() == {"Handle": 1}
        h.set_stream(None)
        assert h.stream == 0
    h.close()
    assert h.closed and new() == {}


def test_handle_binds_a_cupy_stream(cp) -> None:
    stream = cp.cuda.Stream(non_blocking=True)
    with cb.Handle(stream=stream) as h:
        assert h.stream == stream.ptr


def test_handle_on_each_device() -> None:
    for device in range(cb.device_count()):
        with cb.Handle(device=device) as h:
            assert h.device == device
    with pytest.raises(ValueError, match="CUDA device"):
        cb.Handle(device=cb.device_count())


def test_many_handles_leave_none_alive() -> None:
    new = new_handles()
    for _ in range(50):
        cb.Handle().close()
    assert new() == {}


def test_dropout_descriptor_round_trip(cp, handle) -> None:
    size = cb.DropoutDescriptor.states_size(handle)
    states = cp.empty(size, dtype=cp.uint8)
    with cb.DropoutDescriptor(handle, 0.25, states=states.data.ptr, states_size=size, seed=1234) as d:
        p, ptr, seed = d.get(handle)
        assert p == pytest.approx(0.25) and ptr == states.data.ptr and seed == 1234
        cfg = cb.RNNConfig(input_size=4, hidden_size=4, num_layers=2)
        with cb.RNNDescriptor(cfg, dropout=d) as rnn:
            assert rnn.dropout_address() == d.ptr


def _canonical_count(cfg: cb.RNNConfig) -> int:
    g, h, p, d = GATES[cfg.cell_mode], cfg.hidden_size, cfg.proj_size, cfg.num_directions
    nbias = {cb.RNNBiasMode.NO_BIAS: 0, cb.RNNBiasMode.DOUBLE_BIAS: 2}.get(cfg.bias_mode, 1)
    total = 0
    for layer in range(cfg.num_layers):
        inp = cfg.input_size if layer == 0 else d * p
        per_dir = g * h * inp + g * h * p + nbias * g * h + (p * h if p != h else 0)
        total += d * per_dir
    return total


CONFIGS = [cb.RNNConfig(cell_mode=m, bias_mode=b, dir_mode=d, input_size=5, hidden_size=6, num_layers=2,
                        proj_size=3 if (m is cb.RNNMode.LSTM and proj) else None)
           for m, b, d, proj in itertools.product(cb.RNNMode, cb.RNNBiasMode, cb.DirectionMode, (False, True))
           if proj is False or m is cb.RNNMode.LSTM]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.cell_mode.name}-{c.bias_mode.name}-"
                         f"{c.dir_mode.name}-P{c.proj_size}")
def test_weight_space_size_and_layout(cp, handle, cfg: cb.RNNConfig) -> None:
    with cb.RNNDescriptor(cfg) as rnn:
        size = cb.weight_space_size(handle, rnn)
        itemsize = 4
        assert size >= _canonical_count(cfg) * itemsize
        space = cp.empty(size, dtype=cp.uint8)
        regions = _weight_regions(handle, rnn, cfg, space.data.ptr, size)
    covered = sorted((r.offset, r.offset + r.size * itemsize) for r in regions)
    assert covered[0][0] >= 0 and covered[-1][1] <= size
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(covered))  # no overlap
    assert sum(r.size for r in regions) == _canonical_count(cfg)


def _weight_regions(handle, rnn, cfg: cb.RNNConfig, base: int, size: int) -> list[cb.WeightRegion]:
    g, h, p, d = GATES[cfg.cell_mode], cfg.hidden_size, cfg.proj_size, cfg.num_directions
    found = []
    for pseudo in range(cfg.num_layers * d):
        inp = cfg.input_size if pseudo < d else d * p
        ids = list(range(2 * g)) + ([2 * g] if p != h else [])
        for lin in ids:
            wp = cb.weight_params(handle, rnn, pseudo, lin, weight_space=base, weight_space_size=size)
            want_m = {True: h * inp, False: h * p}[lin < g] if lin < 2 * g else p * h
            assert wp.matrix is not None and wp.matrix.size == want_m, (pseudo, lin, wp)
            found.append(wp.matrix)
            has_bias = lin < 2 * g and {cb.RNNBiasMode.NO_BIAS: False, cb.RNNBiasMode.DOUBLE_BIAS: True,
                                        cb.RNNBiasMode.SINGLE_INP_BIAS: lin < g,
                                        cb.RNNBiasMode.SINGLE_REC_BIAS: lin >= g}[cfg.bias_mode]
            assert (wp.bias is not None) == has_bias, (pseudo, lin, wp)
            if wp.bias is not None:
                assert wp.bias.size == h
                found.append(wp.bias)
    return found


# ---------------------------------------------------------------- tiny LSTM forward + backward vs NumPy
T, B, I, H = 3, 2, 3, 4
LENGTHS = [3, 2]


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def _unpack(w: np.ndarray, layout: dict) -> dict:
    return {k: w[o:o + n].reshape(shape) for k, (o, n, shape) in layout.items()}


def _reference(x, hx, cx, w, layout):
    """NumPy LSTM over padded, variable-length sequences (gate order i, f, g, o; double bias)."""
    p = _unpack(w, layout)
    y = np.zeros((T, B, H))
    hy, cy = np.zeros((1, B, H)), np.zeros((1, B, H))
    for b in range(B):
        h, c = hx[0, b], cx[0, b]
        for t in range(LENGTHS[b]):
            z = [p[f"W{k}"] @ x[t, b] + p[f"R{k}"] @ h + p[f"bW{k}"] + p[f"bR{k}"] for k in range(4)]
            i, f, g, o = _sigmoid(z[0]), _sigmoid(z[1]), np.tanh(z[2]), _sigmoid(z[3])
            c = f * c + i * g
            h = o * np.tanh(c)
            y[t, b] = h
        hy[0, b], cy[0, b] = h, c
    return y, hy, cy


def _numeric_grad(f, arr: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    grad = np.zeros_like(arr)
    flat, gflat = arr.reshape(-1), grad.reshape(-1)
    for j in range(flat.size):
        keep = flat[j]
        flat[j] = keep + eps
        up = f()
        flat[j] = keep - eps
        down = f()
        flat[j] = keep
        gflat[j] = (up - down) / (2 * eps)
    return grad


def test_tiny_lstm_forward_and_backward(cp, handle) -> None:
    new = new_handles()
    rng = np.random.default_rng(0)
    f64 = cb.DataType.DOUBLE
    cfg = cb.RNNConfig(cell_mode="lstm", data_type=f64, math_prec=f64, input_size=I, hidden_size=H)
    x_cfg = cb.SeqDataConfig(data_type=f64, max_seq_length=T, batch_size=B, vector_size=I,
                             seq_lengths=LENGTHS)
    y_cfg = dataclasses.replace(x_cfg, vector_size=H)
    with cb.RNNDescriptor(cfg) as rnn, cb.RNNDataDescriptor(x_cfg) as xd, cb.RNNDataDescriptor(y_cfg) as yd, \
            cb.TensorDescriptor((1, B, H), f64) as hd:
        wsize = cb.weight_space_size(handle, rnn)
        w_host = rng.uniform(-0.5, 0.5, wsize // 8)
        w = cp.asarray(w_host)
        layout = {}
        for lin in range(8):
            wp = cb.weight_params(handle, rnn, 0, lin, weight_space=w.data.ptr, weight_space_size=wsize)
            kind, k = ("W", lin) if lin < 4 else ("R", lin - 4)
            cols = I if lin < 4 else H
            layout[f"{kind}{k}"] = (wp.matrix.offset // 8, H * cols, (H, cols))
            layout[f"b{kind}{k}"] = (wp.bias.offset // 8, H, (H,))
        x_host = rng.standard_normal((T, B, I))
        hx_host, cx_host = rng.standard_normal((1, B, H)), rng.standard_normal((1, B, H))
        mask = (np.arange(T)[:, None] < np.array(LENGTHS)[None, :])[..., None]
        dy_host = rng.standard_normal((T, B, H)) * mask
        dhy_host, dcy_host = rng.standard_normal((1, B, H)), rng.standard_normal((1, B, H))

        x, hx, cx = cp.asarray(x_host), cp.asarray(hx_host), cp.asarray(cx_host)
        y, hy, cy = cp.zeros((T, B, H)), cp.zeros((1, B, H)), cp.zeros((1, B, H))
        lengths = cp.asarray(np.array(LENGTHS, dtype=np.int32))
        work_size, reserve_size = cb.temp_space_sizes(handle, rnn, xd, "training")
        work, reserve = cp.empty(max(work_size, 1), cp.uint8), cp.empty(max(reserve_size, 1), cp.uint8)
        common = dict(weight_space=w.data.ptr, weight_space_size=wsize, work_space=work.data.ptr,
                      work_space_size=work_size, reserve_space=reserve.data.ptr,
                      reserve_space_size=reserve_size)
        cb.forward(handle, rnn, fwd_mode="training", dev_seq_lengths=lengths.data.ptr, x_desc=xd,
                   x=x.data.ptr, y_desc=yd, y=y.data.ptr, h_desc=hd, hx=hx.data.ptr, hy=hy.data.ptr,
                   c_desc=hd, cx=cx.data.ptr, cy=cy.data.ptr, **common)
        y_ref, hy_ref, cy_ref = _reference(x_host, hx_host, cx_host, w_host, layout)
        np.testing.assert_allclose(y.get(), y_ref, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(hy.get(), hy_ref, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(cy.get(), cy_ref, rtol=1e-10, atol=1e-12)

        dy, dhy, dcy = cp.asarray(dy_host), cp.asarray(dhy_host), cp.asarray(dcy_host)
        dx, dhx, dcx = cp.zeros_like(x), cp.zeros_like(hx), cp.zeros_like(cx)
        dw = cp.zeros_like(w)
        cb.backward_data(handle, rnn, dev_seq_lengths=lengths.data.ptr, y_desc=yd, y=y.data.ptr,
                         dy=dy.data.ptr, x_desc=xd, dx=dx.data.ptr, h_desc=hd, hx=hx.data.ptr,
                         dhy=dhy.data.ptr, dhx=dhx.data.ptr, c_desc=hd, cx=cx.data.ptr, dcy=dcy.data.ptr,
                         dcx=dcx.data.ptr, **common)
        common.pop("weight_space")
        cb.backward_weights(handle, rnn, add_grad="add", dev_seq_lengths=lengths.data.ptr, x_desc=xd,
                            x=x.data.ptr, h_desc=hd, hx=hx.data.ptr, y_desc=yd, y=y.data.ptr,
                            dweight_space=dw.data.ptr, **common)
        cp.cuda.get_current_stream().synchronize()

    def loss() -> float:
        yr, hr, cr = _reference(x_host, hx_host, cx_host, w_host, layout)
        return float(np.sum(yr * dy_host) + np.sum(hr * dhy_host) + np.sum(cr * dcy_host))

    for got, arr in ((dx, x_host), (dhx, hx_host), (dcx, cx_host), (dw, w_host)):
        np.testing.assert_allclose(got.get(), _numeric_grad(loss, arr), rtol=1e-6, atol=1e-7)
    assert new() == {}  # only the fixture's handle, made before, is alive
