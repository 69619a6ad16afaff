"""The ONE pointwise activation table (``arrayrnn.activations.POINTWISE``): against PyTorch, its users
(cells, ops, the fused bias op), and the numba kernels' own gate math tested against it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from arrayrnn import RNNSpec, activations, ops
from arrayrnn.core.params import PackedParams
from arrayrnn.engines import cells
from arrayrnn.engines.numba import loop_parts
from arrayrnn.engines.pointwise import POINTWISE

TORCH = {"tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu}


def inputs(dtype) -> np.ndarray:
    x = np.random.default_rng(0).standard_normal(500) * 5
    x[:6] = [0.0, -0.0, 40.0, -40.0, 800.0, -800.0]
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(POINTWISE))
def test_forward_and_both_derivatives_match_torch(name, dtype):
    entry, x = POINTWISE[name], inputs(dtype)
    t = torch.from_numpy(x).requires_grad_()
    ty = TORCH[name](t)
    ty.sum().backward()
    tol = dict(rtol=2e-6, atol=1e-7) if dtype == np.float32 else dict(rtol=1e-14, atol=1e-300)
    with np.errstate(all="raise"):
        y = entry(np, x)
        d_out, d_in = entry.d_output(y), entry.d_input(np, x)
    assert y.dtype == d_out.dtype == d_in.dtype == dtype
    np.testing.assert_allclose(y, ty.detach().numpy(), **tol)
    # derivatives are at most 1: 1 - y*y cancels near |y| = 1, so they agree to eps in absolute terms
    d_tol = dict(rtol=tol["rtol"], atol=4 * np.finfo(dtype).eps)
    np.testing.assert_allclose(d_out, t.grad.numpy(), **d_tol)
    np.testing.assert_allclose(d_in, t.grad.numpy(), **d_tol)
    inplace = x.copy()
    entry.forward(np, inplace, inplace)
    np.testing.assert_array_equal(inplace, y)


@pytest.mark.parametrize("name", sorted(POINTWISE))
def test_the_fused_bias_op_the_ops_and_the_cells_use_the_table(name):
    act = activations.get(name)
    assert act.forward_block is POINTWISE[name].forward and act.from_output
    x = inputs(np.float64)
    g = np.random.default_rng(2).standard_normal(x.shape)
    y = POINTWISE[name](np, x)
    scaled = g.copy()
    act.scale_grad(y, scaled)
    np.testing.assert_array_equal(scaled, g * POINTWISE[name].d_output(y))
    np.testing.assert_array_equal(getattr(ops, name)(x), y)
    in_place = {"tanh": cells.tanh_, "sigmoid": cells.sigmoid_, "relu": cells.relu_}[name](np, x.copy())
    np.testing.assert_array_equal(in_place, y)


# -- the numba kernels against the table ----------------------------------------------------------


@pytest.mark.parametrize("dtype, ulps", [(np.float64, 4), (np.float32, 8)])
@pytest.mark.parametrize("kind, name", [(0, "sigmoid"), (1, "tanh")])
def test_numba_activations_match_the_table(kind, name, dtype, ulps):
    x = inputs(dtype)
    out = np.empty_like(x)
    loop_parts.activate(kind, x, out)
    expected = POINTWISE[name](np, x)
    np.testing.assert_allclose(out, expected, rtol=ulps * np.finfo(dtype).eps, atol=16 * np.finfo(dtype).tiny)


def _one_step(spec: RNNSpec, seed: int = 0):
    """One step of the numba kernel (T = 1, forward direction) with its cache and gate gradients."""
    from arrayrnn.engines.numba.engine import NumbaKernel
    from arrayrnn.engines.stack import direction_weights, input_projection

    rng = np.random.default_rng(seed)
    B, H = 3, spec.hidden_size
    params = PackedParams.init(spec, seed=seed)
    w = direction_weights(params, 0, 0)
    x = rng.standard_normal((1, B, spec.input_size))
    h0 = rng.standard_normal((B, spec.output_size))
    c0 = rng.standard_normal((B, H)) if spec.has_cell else None
    bs = np.array([B], dtype=np.int64)
    kernel = NumbaKernel()
    fwd = kernel.forward(spec, w, input_projection(x, w), bs, h0, c0, False, True)
    dy = rng.standard_normal((1, B, spec.output_size))
    dc_n = rng.standard_normal((B, H)) if spec.has_cell else None
    g = kernel.backward(spec, w, fwd, h0[None], c0[None] if c0 is not None else None, dy,
                        np.zeros_like(h0), dc_n, bs, False)
    return fwd, g, dy[0], h0, c0, dc_n


@pytest.mark.parametrize("mode", ["rnn_tanh", "rnn_relu"])
def test_numba_rnn_step_derivative_is_the_tables(mode):
    fwd, g, dy, *_ = _one_step(RNNSpec(mode=mode, input_size=3, hidden_size=5, dtype="float64"))
    act = POINTWISE["tanh" if mode == "rnn_tanh" else "relu"]
    np.testing.assert_allclose(g.dpre_in[0], dy * act.d_output(fwd.y[0]), rtol=1e-14, atol=1e-300)


def test_numba_lstm_step_derivatives_are_the_tables():
    spec = RNNSpec(mode="lstm", input_size=3, hidden_size=4, dtype="float64")
    fwd, g, dy, h0, c0, dc_n = _one_step(spec)
    sig, tanh, H = POINTWISE["sigmoid"], POINTWISE["tanh"], 4
    i, f, gg, o = (fwd.cache.gates[0][:, k * H:(k + 1) * H] for k in range(4))
    tanh_c = tanh(np, fwd.cache.c[0])
    dc = dc_n + dy * o * tanh.d_output(tanh_c)
    expected = np.concatenate([dc * gg * sig.d_output(i), dc * c0 * sig.d_output(f),
                               dc * i * tanh.d_output(gg), dy * tanh_c * sig.d_output(o)], axis=1)
    np.testing.assert_allclose(g.dpre_in[0], expected, rtol=1e-12, atol=1e-15)


def test_numba_gru_step_derivatives_are_the_tables():
    spec = RNNSpec(mode="gru", input_size=3, hidden_size=4, dtype="float64")
    fwd, g, dy, h0, *_ = _one_step(spec)
    sig, tanh, H = POINTWISE["sigmoid"], POINTWISE["tanh"], 4
    r, z, n = (fwd.cache.gates[0][:, k * H:(k + 1) * H] for k in range(3))
    dn = dy * (1 - z) * tanh.d_output(n)
    expected = np.concatenate([dn * fwd.cache.hn[0] * sig.d_output(r), dy * (h0 - n) * sig.d_output(z), dn],
                              axis=1)
    np.testing.assert_allclose(g.dpre_in[0], expected, rtol=1e-12, atol=1e-15)
