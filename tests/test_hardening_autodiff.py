"""Issue 12: Python/NumPy conversions of traced values raise instead of silently cutting the graph."""

import math

import numpy as np
import pytest

import arrayrnn as ar


@pytest.mark.parametrize("fn", [
    lambda x: math.exp(x.sum()),
    lambda x: float(x.sum()) * x.sum(),
    lambda x: int(x.sum()) * x.sum(),
])
def test_python_number_conversions_raise(fn):
    with pytest.raises(TypeError, match=r"silently cut the gradient; use arrayrnn.ops"):
        ar.value_and_grad(fn)(np.ones(2))


def test_numpy_ufunc_names_the_ops_function():
    with pytest.raises(TypeError, match=r"np.tanh .*arrayrnn.ops.tanh"):
        ar.value_and_grad(lambda x: np.tanh(x).sum())(np.ones(2))


def test_asarray_keeps_raising():
    with pytest.raises(TypeError, match="cannot become a NumPy array"):
        ar.value_and_grad(lambda x: np.asarray(x).sum())(np.ones(2))


def test_numpy_operands_on_the_left_still_differentiate():
    x0 = np.array([1.0, 2.0])
    a = np.array([3.0, 5.0])
    value, grad = ar.value_and_grad(lambda x: ((a * x) + a - a / x + a ** x).sum() + a @ x)(x0)
    np.testing.assert_allclose(grad, a + a / x0**2 + a**x0 * np.log(a) + a)
    np.testing.assert_allclose(value, (a * x0 + a - a / x0 + a**x0).sum() + a @ x0)
    mask = ar.value_and_grad(lambda x: (x * (a > x)).sum())(x0)[1]
    np.testing.assert_array_equal(mask, a > x0)


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


def test_numpy_integer_argnums_and_axis():
    value, grad = ar.value_and_grad(lambda a, b: ar.ops.sum(a * b, axis=np.int64(0)), argnums=np.int64(1))(
        np.array(2.0), np.array([1.0, 3.0]))
    np.testing.assert_allclose(value, 8.0)
    np.testing.assert_allclose(grad, [2.0, 2.0])


def test_clip_grad_norm_takes_a_numpy_norm_type():
    from arrayrnn import optim
    g = np.array([3.0, 4.0])
    assert optim.clip_grad_norm(g, np.float32(10.0), norm_type=np.float64(2.0)) == 5.0
