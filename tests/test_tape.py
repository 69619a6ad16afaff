"""The tape: value_and_grad / grad / vjp, argument structures, ownership of buffers, and every bad input."""

import math

import numpy as np
import pytest

import arrayrnn as ar
from arrayrnn import ops
from arrayrnn.autodiff import Meta, Residuals, Traced, check_grads, primitive, vjp


def rng():
    return np.random.default_rng(0)


def test_value_and_grad_of_a_quadratic():
    x = rng().standard_normal(5)
    value, g = ar.value_and_grad(lambda a: ops.sum(a * a))(x)
    np.testing.assert_allclose(value, np.sum(x * x))
    np.testing.assert_allclose(g, 2 * x)
    np.testing.assert_allclose(ar.grad(lambda a: ops.sum(a * a))(x), 2 * x)


def test_argnums_tuple_and_negative_and_has_aux():
    x, y = rng().standard_normal((2, 3))

    def f(a, b):
        return ops.sum(a * b), {"prod": a * b}

    (value, aux), (gx, gy) = ar.value_and_grad(f, argnums=(0, -1), has_aux=True)(x, y)
    np.testing.assert_allclose(value, x @ y)
    assert isinstance(aux["prod"], np.ndarray) and not isinstance(aux["prod"], Traced)
    np.testing.assert_allclose(aux["prod"], x * y)
    np.testing.assert_allclose(gx, y)
    np.testing.assert_allclose(gy, x)
    g, aux = ar.grad(f, argnums=1, has_aux=True)(x, y)
    np.testing.assert_allclose(g, x)


def test_structured_arguments_mirror_their_gradients():
    r = rng()
    tree = {"w": r.standard_normal(3), "pair": [r.standard_normal(2), (r.standard_normal(2),)]}

    def f(t):
        return ops.sum(t["w"] ** 2) + ops.sum(t["pair"][0] * 3) + ops.sum(ops.exp(t["pair"][1][0]))

    g = ar.grad(f)(tree)
    assert isinstance(g, dict) and isinstance(g["pair"], list) and isinstance(g["pair"][1], tuple)
    np.testing.assert_allclose(g["w"], 2 * tree["w"])
    np.testing.assert_allclose(g["pair"][0], np.full(2, 3.0))
    np.testing.assert_allclose(g["pair"][1][0], np.exp(tree["pair"][1][0]))


def test_packed_params_gradient_is_packed_params_with_traced_views():
    spec = ar.RNNSpec("gru", 3, 4, dtype="float64")
    params = ar.PackedParams.init(spec, seed=1)

    def f(p):
        return ops.sum(p.view(0, 0, "W_hh") ** 2) + ops.sum(p.named_views()["l0.fwd.b_ih"])

    g = ar.grad(f)(params)
    assert isinstance(g, ar.PackedParams) and g.spec == spec and g.data.shape == params.data.shape
    expected = np.zeros_like(params.data)
    block = params.layout.block(0, 0, "W_hh")
    expected[block.offset:block.stop] = 2 * params.data[block.offset:block.stop]
    bias = params.layout.block(0, 0, "b_ih")
    expected[bias.offset:bias.stop] = 1.0
    np.testing.assert_allclose(g.data, expected)


def test_unused_argument_gets_zeros_like_jax():
    x, y = rng().standard_normal((2, 4)).astype(np.float32)
    gx, gy = ar.grad(lambda a, b: ops.sum(a * 2), argnums=(0, 1))(x, y)
    np.testing.assert_array_equal(gy, np.zeros_like(y))
    assert gy.dtype == np.float32 and gx.dtype == np.float32
    value, g = ar.value_and_grad(lambda a: np.float64(3.0))(x.astype(np.float64))
    assert value == 3.0
    np.testing.assert_array_equal(g, np.zeros(4))


def test_gradients_are_fresh_writeable_buffers_even_when_rules_share_one():
    x, y = rng().standard_normal((2, 3))
    gx, gy = ar.grad(lambda a, b: ops.sum(a + b), argnums=(0, 1))(x, y)  # add returns g for both
    assert not np.shares_memory(gx, gy)
    assert gx.flags.writeable and gx.flags.c_contiguous
    g = ar.grad(lambda a: ops.sum(a))(x)  # sum's rule gives a read-only broadcast view
    assert g.flags.writeable and g.flags.owndata
    np.testing.assert_array_equal(g, np.ones(3))


def test_same_value_used_twice_accumulates():
    x = rng().standard_normal(4)
    np.testing.assert_allclose(ar.grad(lambda a: ops.sum(a + a + a * a))(x), 2 + 2 * x)


def test_operators_and_numpy_on_the_left():
    x = rng().standard_normal((3, 3))
    c = rng().standard_normal((3, 3)) + 3

    def f(a):
        out = (c + a) * (c - a) / (a ** 2 + 1) + 2 ** a - (1 - a) @ c + c @ a.T - (-a)[0:2].sum(axis=0)[1]
        return (out / c).mean() + (1.0 / (a * a + 1)).sum()

    check_grads(f, x)

    def numpy_on_the_left(a):
        out = c * a + c
        assert isinstance(out, Traced)
        return ops.sum(out)

    np.testing.assert_allclose(ar.grad(numpy_on_the_left)(x), c)


def test_non_scalar_output_is_a_value_error():
    with pytest.raises(ValueError, match=r"shape \(3,\); expected a scalar"):
        ar.value_and_grad(lambda a: a * 2)(np.ones(3))
    with pytest.raises(ValueError, match=r"shape \(1,\)"):
        ar.grad(lambda a: ops.sum(a, keepdims=True))(np.ones(3))


def test_non_array_and_integer_outputs_are_type_errors():
    with pytest.raises(TypeError, match="returned str"):
        ar.value_and_grad(lambda a: "loss")(np.ones(3))
    with pytest.raises(TypeError, match="dtype int64"):
        ar.value_and_grad(lambda a: np.int64(3) * np.ones((), np.int64))(np.ones(3))
    with pytest.raises(TypeError, match="pair"):
        ar.value_and_grad(lambda a: ops.sum(a), has_aux=True)(np.ones(3))


def test_bad_arguments():
    with pytest.raises(TypeError, match="dtype int64"):
        ar.grad(lambda a: ops.sum(a))(np.arange(3))
    with pytest.raises(TypeError, match=r"argument 0\[0\] has type float"):
        ar.grad(lambda a: a)([1.0, 2.0])
    with pytest.raises(TypeError, match="argument 0 has type str"):
        ar.grad(lambda a: a)("x")
    with pytest.raises(ValueError, match=r"argnums = 2.*every argnum must be in -1..0"):
        ar.grad(lambda a: ops.sum(a), argnums=2)(np.ones(2))


def test_nested_differentiation_is_refused_clearly():
    def outer(a):
        return ar.grad(lambda b: ops.sum(a * b))(np.ones(2))

    with pytest.raises(TypeError, match="nested differentiation"):
        ar.grad(lambda a: ops.sum(outer(a)))(np.ones(2))


def test_traced_value_refuses_silent_numpy_conversion():
    def f(a):
        np.asarray(a)
        return ops.sum(a)

    with pytest.raises(TypeError, match="cut the gradient"):
        ar.grad(f)(np.ones(2))


def test_vjp_runs_once_then_refuses():
    x = rng().standard_normal(3)
    out, vjp_fn = vjp(lambda a: ops.tanh(a) * 2, x)
    np.testing.assert_allclose(out, 2 * np.tanh(x))
    (g,) = vjp_fn(np.ones(3))
    np.testing.assert_allclose(g, 2 * (1 - np.tanh(x) ** 2))
    with pytest.raises(RuntimeError, match="a second time"):
        vjp_fn(np.ones(3))
    _, vjp_fn = vjp(lambda a: a * 2, x)
    with pytest.raises(ValueError, match=r"cotangent has shape \(2,\)"):
        vjp_fn(np.ones(2))


def test_custom_primitive_keep_needs_residuals():
    seen = {}

    @primitive(keep=("y",))
    def scaled_square(x, y):
        return Residuals(x * x * y, twice_x=2 * x)

    @scaled_square.defvjp
    def _rule(g, ans, x, y, *, twice_x, needs):
        seen.update(ans=ans, x=x, needs=needs)
        return g * twice_x * y, (g * twice_x * twice_x / 4 if needs[1] else None)

    x, y = rng().standard_normal((2, 4))
    g = ar.grad(lambda a: ops.sum(scaled_square(a, y)))(x)
    np.testing.assert_allclose(g, 2 * x * y)
    assert seen["ans"] is None and isinstance(seen["x"], Meta) and seen["x"].shape == (4,)
    assert seen["needs"] == (True, False)
    check_grads(lambda a, b: scaled_square(a, b), x, y)


def test_primitive_without_rule_and_bad_keep():
    @primitive
    def no_rule(x):
        return x * 1

    assert isinstance(no_rule(np.ones(2)), np.ndarray)  # fine without tracing
    with pytest.raises(NotImplementedError, match="no VJP rule"):
        ar.grad(lambda a: ops.sum(no_rule(a)))(np.ones(2))
    with pytest.raises(ValueError, match="not positional"):
        primitive(lambda x: x, keep=("z",))


def test_traced_keyword_argument_is_refused():
    with pytest.raises(TypeError, match="keyword argument 'y'"):
        ar.grad(lambda a: ops.sum(ops.add(a, y=a)))(np.ones(2))


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
