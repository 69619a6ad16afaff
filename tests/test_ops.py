"""Every op: float64 central-difference gradient checks, PyTorch comparisons for composites, bad inputs."""

import numpy as np
import pytest
import torch

import arrayrnn as ar
from arrayrnn import ops
from arrayrnn.autodiff import check_grads


def normal(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((3, 1, 4), (5, 4)), ((4,), (2, 3, 4)), ((2, 1), ())])
@pytest.mark.parametrize("op", [ops.add, ops.subtract, ops.mul, ops.divide])
def test_binary_elementwise_with_broadcasting(op, shapes):
    x = normal(*shapes[0])
    y = normal(*shapes[1], seed=1) + (3.0 if op is ops.divide else 0.0)
    check_grads(op, x, y)


def test_power_both_arguments_and_scalar_exponent():
    x = np.abs(normal(3, 2)) + 0.5
    check_grads(ops.power, x, normal(2, seed=1))
    check_grads(lambda a: ops.power(a, 2), normal(4))
    check_grads(lambda a: ops.power(a, 3.5), x)
    check_grads(lambda a: 2.0 ** a, normal(3))


def test_python_numbers_and_negative():
    check_grads(lambda a: 3 - a * 2 + 1 / (a * a + 1) - ops.negative(a), normal(5))


@pytest.mark.parametrize("shapes", [((3,), (3,)), ((3,), (3, 4)), ((2, 3), (3,)), ((2, 3), (3, 4)),
                                    ((5, 2, 3), (3, 4)), ((5, 2, 3), (5, 3, 4)), ((2, 3), (5, 3, 4)),
                                    ((1, 2, 3), (4, 3, 2))])
def test_matmul_all_rank_combinations(shapes):
    check_grads(ops.matmul, normal(*shapes[0]), normal(*shapes[1], seed=1))


@pytest.mark.parametrize("axis, keepdims", [(None, False), (0, False), (1, True), ((0, 2), False),
                                           (-1, True)])
@pytest.mark.parametrize("reduce", [ops.sum, ops.mean])
def test_reductions(reduce, axis, keepdims):
    check_grads(lambda a: reduce(a, axis=axis, keepdims=keepdims), normal(2, 3, 4))


def test_shape_ops():
    x = normal(2, 3, 4)
    check_grads(lambda a: ops.reshape(a, 4, -1), x)
    check_grads(lambda a: ops.reshape(a, (6, 4)), x)
    check_grads(lambda a: ops.transpose(a, (2, 0, 1)), x)
    check_grads(lambda a: ops.transpose(a), x)
    check_grads(lambda a: a.T.reshape(-1), x)
    check_grads(lambda a, b: ops.concatenate([a, b, a], axis=1), x, normal(2, 5, 4, seed=1))
    check_grads(lambda a, b: ops.stack([a, b], axis=1), x, normal(2, 3, 4, seed=1))
    check_grads(lambda a: ops.unstack(a, axis=1)[0] * ops.unstack(a, axis=1)[2], x)
    check_grads(lambda a: ops.split(a, [1, 3], axis=2)[1] - ops.split(a, [1, 3], axis=2)[2][..., :2], x)
    check_grads(lambda a: ops.split(a, 3, axis=1)[2], x)  # unused pieces get zeros


def test_unstack_is_one_node_with_one_gradient_buffer():
    x = normal(50, 3)
    g = ar.grad(lambda a: ops.sum(ops.stack([p * 2 for p in ops.unstack(a)])))(x)
    np.testing.assert_allclose(g, np.full_like(x, 2.0))


def test_take_and_indexing_accumulate_repeated_indices():
    x = normal(5, 3)
    ids = np.array([[0, 4], [4, 4]])
    check_grads(lambda a: ops.take(a, ids, axis=0), x)
    check_grads(lambda a: ops.take(a, [2, -1, 2], axis=1), x)
    check_grads(lambda a: ops.take(a, ids), x)
    check_grads(lambda a: a[np.array([1, 1, 3])], x)
    check_grads(lambda a: a[1:, ::2] * a[0, 1] + a[..., None][2, :2, 0], x)
    g = ar.grad(lambda a: ops.sum(ops.take(a, ids, axis=0)))(x)
    np.testing.assert_allclose(g[:, 0], [1, 0, 0, 0, 3])


def test_elementwise_functions():
    x = normal(3, 4)
    for fn in (ops.tanh, ops.sigmoid, ops.exp):
        check_grads(fn, x)
    check_grads(ops.log, np.abs(x) + 0.1)
    check_grads(ops.relu, x + np.sign(x) * 0.01)  # away from the kink


def test_sigmoid_is_stable_far_out():
    x = np.array([-1000.0, -30.0, 0.0, 30.0, 1000.0], dtype=np.float32)
    with np.errstate(all="raise"):
        y = ops.sigmoid(x)
    np.testing.assert_allclose(y, torch.sigmoid(torch.from_numpy(x)).numpy(), rtol=1e-6, atol=0)


def test_softmax_cross_entropy_against_torch_with_ignore_index():
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((4, 6, 7)).astype(np.float32) * 3
    targets = rng.integers(0, 7, (4, 6))
    targets[0, :3] = -100
    targets[2, 5] = -100
    loss, g = ar.value_and_grad(lambda z: ops.softmax_cross_entropy(z, targets, ignore_index=-100))(logits)
    z = torch.from_numpy(logits).requires_grad_()
    expected = torch.nn.functional.cross_entropy(z.reshape(-1, 7), torch.from_numpy(targets).reshape(-1),
                                                 ignore_index=-100)
    expected.backward()
    np.testing.assert_allclose(loss, expected.item(), rtol=1e-6)
    np.testing.assert_allclose(g, z.grad.numpy(), rtol=1e-5, atol=1e-7)
    assert loss.dtype == np.float32 and g.dtype == np.float32
    check_grads(lambda a: ops.softmax_cross_entropy(a, targets, ignore_index=-100), logits.astype(np.float64))


def test_softmax_cross_entropy_all_ignored_is_nan_like_torch():
    logits = normal(2, 3)
    targets = np.array([-1, -1])
    loss, g = ar.value_and_grad(lambda z: ops.softmax_cross_entropy(z, targets))(logits)
    assert np.isnan(loss)
    assert torch.isnan(torch.nn.functional.cross_entropy(torch.from_numpy(logits), torch.tensor([-1, -1]),
                                                         ignore_index=-1))
    np.testing.assert_array_equal(g, np.zeros_like(logits))


def test_mse_against_torch():
    pred, target = normal(3, 5), normal(3, 5, seed=1)
    check_grads(ops.mse, pred, target)
    p = torch.from_numpy(pred).requires_grad_()
    torch.nn.functional.mse_loss(p, torch.from_numpy(target)).backward()
    np.testing.assert_allclose(ar.grad(ops.mse)(pred, target), p.grad.numpy())


# -- the fused RNN node --------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh"])
def test_rnn_node_gradients_match_central_differences(mode):
    spec = ar.RNNSpec(mode, 3, 4, num_layers=2, bidirectional=True, dtype="float64")
    params = ar.PackedParams.init(spec, seed=2)
    x = normal(5, 2, 3)
    h0 = normal(4, 2, 4, seed=1) * 0.5
    lengths = np.array([5, 3])
    if mode == "lstm":
        c0 = normal(4, 2, 4, seed=2) * 0.5
        check_grads(lambda p, a, h, c: ops.rnn(p, a, lengths, h, c), params, x, h0, c0, rtol=1e-5)
    else:
        check_grads(lambda p, a, h: ops.rnn(p, a, lengths, h)[:2], params, x, h0, rtol=1e-5)


def test_rnn_node_equals_rnn_backward_and_is_inference_without_tracing():
    spec = ar.RNNSpec("lstm", 3, 4)
    params = ar.PackedParams.init(spec, seed=0)
    x = normal(6, 2, 3).astype(np.float32)
    y, h_n, c_n = ops.rnn(params, x)
    res = ar.rnn_forward(params, x, training=True)
    np.testing.assert_array_equal(y, res.y)
    dy = normal(6, 2, 4, seed=5).astype(np.float32)

    def loss(p, a):
        out, h, c = ops.rnn(p, a)
        return ops.sum(out * dy) + ops.sum(c)

    gp, gx = ar.grad(loss, argnums=(0, 1))(params, x)
    expected = ar.rnn_backward(res, dy=dy, dc_n=np.ones_like(res.c_n))
    np.testing.assert_allclose(gp.data, expected.dparams.data, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(gx, expected.dx, rtol=1e-6, atol=1e-7)
    assert ops.rnn(ar.PackedParams.init(ar.RNNSpec("gru", 3, 4), seed=0), x)[2] is None


# -- bad inputs ----------------------------------------------------------------------------------------

def test_mixed_dtypes_and_integer_arrays_are_type_errors():
    a32, a64 = np.ones(3, np.float32), np.ones(3)
    with pytest.raises(TypeError, match="different dtypes"):
        ops.add(a32, a64)
    with pytest.raises(TypeError, match="different dtypes"):
        ar.grad(lambda a: ops.sum(a * a64))(a32)
    with pytest.raises(TypeError, match=r"mul: y has dtype int64.*astype"):
        ops.mul(a64, np.arange(3))
    with pytest.raises(TypeError, match="has type str"):
        ops.tanh("x")
    assert ops.mul(a32, np.float64(2.0)).dtype == np.float32  # NumPy scalars do not promote


def test_shape_errors_are_value_errors():
    with pytest.raises(ValueError, match=r"shapes \(3, 4\) and \(5,\) do not broadcast"):
        ops.add(np.ones((3, 4)), np.ones(5))
    with pytest.raises(ValueError, match=r"last axis of a \(4\) must equal the second-to-last axis of b"):
        ops.matmul(np.ones((3, 4)), np.ones((5, 2)))
    with pytest.raises(ValueError, match="a is a scalar"):
        ops.matmul(np.ones(()), np.ones(2))
    with pytest.raises(ValueError, match=r"cannot reshape an array of shape \(2, 3\)"):
        ops.reshape(np.ones((2, 3)), 4, 2)
    with pytest.raises(ValueError, match="axis = 3 is out of range"):
        ops.sum(np.ones((2, 3)), axis=3)
    with pytest.raises(ValueError, match="expected a permutation"):
        ops.transpose(np.ones((2, 3)), (0, 0))
    with pytest.raises(ValueError, match="all must be equal"):
        ops.stack([np.ones(2), np.ones(3)])
    with pytest.raises(TypeError, match="non-empty list"):
        ops.concatenate([])
    with pytest.raises(ValueError, match="do not divide"):
        ops.split(np.ones(5), 2)


def test_index_errors():
    with pytest.raises(ValueError, match="index 5 is out of range for axis 0 of size 5"):
        ops.take(np.ones((5, 2)), np.array([0, 5]), axis=0)
    with pytest.raises(TypeError, match="integer array"):
        ops.take(np.ones(5), np.array([0.0]))


def test_loss_errors():
    logits = np.ones((2, 3))
    with pytest.raises(TypeError, match="targets have dtype float64"):
        ops.softmax_cross_entropy(logits, np.zeros(2))
    with pytest.raises(ValueError, match=r"targets have shape \(3,\); expected logits.shape\[:-1\] = \(2,\)"):
        ops.softmax_cross_entropy(logits, np.zeros(3, int))
    with pytest.raises(ValueError, match=r"targets\[1\] = 3; every target must be in 0..2"):
        ops.softmax_cross_entropy(logits, np.array([0, 3]))
    with pytest.raises(ValueError, match="expected equal shapes"):
        ops.mse(np.ones(3), np.ones((3, 1)))


def test_rnn_errors():
    with pytest.raises(TypeError, match="rnn: params has type ndarray"):
        ops.rnn(np.ones(10), np.ones((2, 1, 3)))
    params = ar.PackedParams.init(ar.RNNSpec("lstm", 3, 4))
    with pytest.raises(ValueError):
        ops.rnn(params, np.ones((2, 3), np.float32))  # 2-D x: rnn_forward refuses it


def test_numpy_integer_argnums_and_axis():
    value, grad = ar.value_and_grad(lambda a, b: ar.ops.sum(a * b, axis=np.int64(0)), argnums=np.int64(1))(
        np.array(2.0), np.array([1.0, 3.0]))
    np.testing.assert_allclose(value, 8.0)
    np.testing.assert_allclose(grad, [2.0, 2.0])
