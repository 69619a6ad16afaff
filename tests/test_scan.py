"""``ar.scan``: an LSTM cell written with ``ar.ops`` against the fused engine; reverse, trees, errors."""

import numpy as np
import pytest

import arrayrnn as ar
from arrayrnn import ops
from arrayrnn.autodiff import check_grads

T, B, I, H = 6, 3, 4, 5


def lstm_cell(params):
    """A plain LSTM cell (gate order i, f, g, o) reading the packed weights through their views."""
    W_ih, W_hh = params.view(0, 0, "W_ih"), params.view(0, 0, "W_hh")
    bias = params.view(0, 0, "b_ih") + params.view(0, 0, "b_hh")

    def cell(carry, x):
        h, c = carry
        gates = x @ W_ih.T + h @ W_hh.T + bias
        i, f, g, o = ops.split(gates, 4, axis=-1)
        c = ops.sigmoid(f) * c + ops.sigmoid(i) * ops.tanh(g)
        h = ops.sigmoid(o) * ops.tanh(c)
        return (h, c), h

    return cell


def problem(dtype="float64"):
    spec = ar.RNNSpec("lstm", I, H, dtype=dtype)
    params = ar.PackedParams.init(spec, seed=3)
    r = np.random.default_rng(0)
    x, h0, c0 = (r.standard_normal(s).astype(dtype) for s in ((T, B, I), (B, H), (B, H)))
    return params, x, h0, c0


def test_scan_lstm_cell_matches_the_fused_engine_values_and_gradients():
    params, x, h0, c0 = problem()
    dy = np.random.default_rng(1).standard_normal((T, B, H))

    def scanned(p, x, h0, c0):
        (h, c), ys = ar.scan(lstm_cell(p), (h0, c0), x)
        return ops.sum(ys * dy) + ops.sum(h * c)

    def fused(p, x, h0, c0):
        ys, h_n, c_n = ops.rnn(p, x, h0=h0[None], c0=c0[None])
        return ops.sum(ys * dy) + ops.sum(h_n * c_n)

    res = ar.rnn_forward(params, x, h0=h0[None], c0=c0[None])
    (h, c), ys = ar.scan(lstm_cell(params), (h0, c0), x)
    np.testing.assert_allclose(ys, res.y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(h, res.h_n[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(c, res.c_n[0], rtol=1e-12, atol=1e-12)
    argnums = (0, 1, 2, 3)
    v_scan, g_scan = ar.value_and_grad(scanned, argnums)(params, x, h0, c0)
    v_fused, g_fused = ar.value_and_grad(fused, argnums)(params, x, h0, c0)
    np.testing.assert_allclose(v_scan, v_fused, rtol=1e-12)
    np.testing.assert_allclose(g_scan[0].data, g_fused[0].data, rtol=1e-9, atol=1e-11)
    for a, b in zip(g_scan[1:], g_fused[1:], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-11)


def test_scan_gradients_match_central_differences():
    params, x, h0, c0 = problem()
    check_grads(lambda p, x, h, c: ar.scan(lstm_cell(p), (h, c), x)[1], params, x, h0, c0)


def test_reverse_scan_keeps_outputs_in_input_order():
    xs = np.arange(5.0)

    def running_sum(carry, x):
        return carry + x, carry + x

    total, ys = ar.scan(running_sum, np.zeros(()), xs, reverse=True)
    np.testing.assert_allclose(ys, np.cumsum(xs[::-1])[::-1])
    assert float(total) == 10.0
    check_grads(lambda a: ar.scan(lambda c, x: (c * x + 1, c * c), a[0], a, reverse=True)[1], xs / 5 + 0.1)


def test_tree_carry_and_xs_and_none_outputs():
    xs = {"a": np.ones((4, 2)), "b": np.arange(4.0)}

    def cell(carry, x):
        return {"s": carry["s"] + x["a"] * x["b"], "n": carry["n"] + 1.0}, None

    carry, ys = ar.scan(cell, {"s": np.zeros(2), "n": np.zeros(())}, xs)
    assert ys is None
    np.testing.assert_allclose(carry["s"], [6.0, 6.0])
    carry, ys = ar.scan(lambda c, _: (c * 2, c), np.ones(()), None, length=3)
    np.testing.assert_allclose(ys, [1.0, 2.0, 4.0])


def test_errors():
    with pytest.raises(ValueError, match=r"at step 0 cell_fn returned a carry .*\(2,\)"):
        ar.scan(lambda c, x: (ops.concatenate([c, c]), x), np.ones(1), np.ones((3, 1)))
    with pytest.raises(TypeError, match="expected a pair"):
        ar.scan(lambda c, x: c, np.ones(1), np.ones((3, 1)))
    with pytest.raises(ValueError, match=r"leading lengths \[2, 3\]"):
        ar.scan(lambda c, x: (c, None), np.ones(1), (np.ones((3, 1)), np.ones((2, 1))))
    with pytest.raises(ValueError, match="pass length="):
        ar.scan(lambda c, x: (c, None), np.ones(1), None)
    with pytest.raises(ValueError, match="scalar leaf"):
        ar.scan(lambda c, x: (c, None), np.ones(1), np.ones(()))


def test_scan_over_zero_steps_returns_empty_outputs_shaped_like_the_cell_outputs():
    W = np.arange(6.0).reshape(2, 3)

    def cell(h, x):
        h = ar.ops.tanh(x @ W + h)
        return h, (h, ar.ops.sum(h))

    carry = np.ones(3)
    final, (ys, sums) = ar.scan(cell, carry, np.zeros((0, 2)))
    assert final is carry
    assert ys.shape == (0, 3) and ys.dtype == np.float64 and sums.shape == (0,)
    final, ys = ar.scan(lambda c, x: (c, None), carry, None, length=0)
    assert ys is None
    grad = ar.grad(lambda h: ar.ops.sum(ar.scan(cell, h, np.zeros((0, 2)))[0] * 2.0))(carry)
    np.testing.assert_array_equal(grad, np.full(3, 2.0))
