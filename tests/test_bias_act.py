"""Fused bias + activation: PyTorch values and gradients, gradient checks, the in-place memory property."""

import tracemalloc

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import arrayrnn as ar
from arrayrnn import activations, ops
from arrayrnn.autodiff import check_grads, vjp

TORCH = {
    "identity": lambda t: t, "relu": F.relu, "leaky_relu": F.leaky_relu, "relu6": F.relu6,
    "hardtanh": F.hardtanh, "elu": F.elu, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
    "gelu": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu, "softplus": F.softplus,
}
NAMES = sorted(TORCH)


def data(dtype=np.float32, batch=(3, 5), n_in=6, n_out=4, seed=0):
    r = np.random.default_rng(seed)
    return (r.standard_normal((n_out, n_in)).astype(dtype), r.standard_normal(batch + (n_in,)).astype(dtype),
            r.standard_normal(n_out).astype(dtype))


def test_every_builtin_activation_is_covered():
    assert set(NAMES) == set(activations.names())


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("name", NAMES)
def test_dense_bias_act_matches_torch_linear(name, bias):
    W, x, b = data()
    b = b if bias else None
    cot = np.random.default_rng(1).standard_normal((3, 5, 4)).astype(np.float32)

    def loss(W, x, b):
        return ops.sum(ar.dense_bias_act(name, W, x, b) * cot)

    args = (W, x, b) if bias else (W, x)
    value, grads = ar.value_and_grad(lambda *a: loss(*a, *(() if bias else (None,))), argnums=tuple(
        range(len(args))))(*args)
    tensors = [torch.from_numpy(a).requires_grad_() for a in args]
    out = TORCH[name](F.linear(tensors[1], tensors[0], tensors[2] if bias else None))
    (out * torch.from_numpy(cot)).sum().backward()
    np.testing.assert_allclose(ar.dense_bias_act(name, W, x, b), out.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(value, (out * torch.from_numpy(cot)).sum().item(), rtol=1e-4, atol=1e-4)
    for g, t in zip(grads, tensors, strict=True):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_bias_act_matches_torch(name):
    _, x, b = data(n_out=6)
    t_x, t_b = torch.from_numpy(x).requires_grad_(), torch.from_numpy(b).requires_grad_()
    out = TORCH[name](t_x + t_b)
    out.sum().backward()
    gx, gb = ar.grad(lambda x, b: ops.sum(ar.bias_act(name, x, b)), argnums=(0, 1))(x, b)
    np.testing.assert_allclose(ar.bias_act(name, x, b), out.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gx, t_x.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gb, t_b.grad.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_gradients_match_central_differences(name):
    W, x, b = data(np.float64, batch=(4,), seed=2)
    x += np.sign(x) * 0.05  # keep clear of the kinks of relu-like activations
    check_grads(lambda W, x, b: ar.dense_bias_act(name, W, x, b), W, x, b)
    check_grads(lambda x, b: ar.bias_act(name, x, b), x[:, :4], b)
    check_grads(lambda x: ar.bias_act(name, x), x)


def test_activation_object_and_parameters():
    W, x, b = data()
    act = activations.get("leaky_relu", negative_slope=0.3)
    expected = F.leaky_relu(F.linear(*(torch.from_numpy(a) for a in (x, W, b))), 0.3)
    np.testing.assert_allclose(ar.dense_bias_act(act, W, x, b), expected.numpy(), rtol=1e-6, atol=1e-6)


# -- memory: the fused forward keeps one buffer, the backward overwrites what it owns ------------------

ROWS, FEATURES = 8192, 256  # the shape of the issue: activation-dominated
OUT_BYTES = ROWS * FEATURES * 4
BLOCKS = 3 * activations.BLOCK_ELEMENTS * 4  # the block-sized temporaries of an activation pass


def peak_bytes(fn):
    """Peak traced allocation (bytes above what was live before) while ``fn`` runs."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        result = fn()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return peak, result


def square_problem():
    r = np.random.default_rng(0)
    return (r.standard_normal((FEATURES, FEATURES)).astype(np.float32) * 0.1,
            r.standard_normal((ROWS, FEATURES)).astype(np.float32), np.zeros(FEATURES, np.float32))


def test_fused_forward_allocates_one_output_buffer():
    W, x, b = square_problem()
    vjp(lambda W, b: ar.dense_bias_act("tanh", W, x, b), W, b)  # warm up
    peak, (out, _) = peak_bytes(lambda: vjp(lambda W, b: ar.dense_bias_act("tanh", W, x, b), W, b))
    assert OUT_BYTES <= peak < OUT_BYTES + BLOCKS
    peak, _ = peak_bytes(lambda: vjp(lambda W, b: ar.dense_bias_act("gelu", W, x, b), W, b))
    assert 2 * OUT_BYTES <= peak < 2 * OUT_BYTES + BLOCKS  # gelu needs its input: pre-activation + output


def test_fused_training_step_peak_is_at_most_07_of_the_composition():
    W, x, b = square_problem()
    fused = ar.value_and_grad(lambda W, b: ops.sum(ar.dense_bias_act("tanh", W, x, b)), argnums=(0, 1))
    composed = ar.value_and_grad(lambda W, b: ops.sum(ops.tanh(x @ W.T + b)), argnums=(0, 1))
    fused_peak, (value, (gW, gb)) = peak_bytes(lambda: fused(W, b))
    composed_peak, (value_c, (gW_c, gb_c)) = peak_bytes(lambda: composed(W, b))
    np.testing.assert_allclose(value, value_c, rtol=1e-5)
    np.testing.assert_allclose(gW, gW_c, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(gb, gb_c, rtol=1e-4, atol=1e-3)
    small = 4 * W.nbytes + BLOCKS + 64 * 1024  # dW, its copies, block temporaries, bookkeeping
    assert fused_peak < 2 * OUT_BYTES + small  # the output, and one buffer for the scaled gradient
    assert composed_peak > 2.9 * OUT_BYTES
    assert fused_peak <= 0.7 * composed_peak


def test_backward_overwrites_an_owned_gradient_instead_of_allocating():
    W, x, b = square_problem()
    scale = np.float32(3.0) * np.ones((ROWS, FEATURES), np.float32)
    # mul's rule returns a fresh buffer (owned), which bias_act's rule then scales in place:
    # live at the peak are the output y and that one gradient buffer
    step = ar.grad(lambda W, b: ops.sum(ar.dense_bias_act("tanh", W, x, b) * scale), argnums=(0, 1))
    step(W, b)
    peak, _ = peak_bytes(lambda: step(W, b))
    assert peak < 2 * OUT_BYTES + 4 * W.nbytes + BLOCKS + 64 * 1024


def test_a_consumed_rule_refuses_to_run_twice():
    W, x, b = data()
    out, vjp_fn = vjp(lambda W: ar.dense_bias_act("tanh", W, x, b), W)
    (gW,) = vjp_fn(np.ones_like(out))
    assert gW.shape == W.shape
    with pytest.raises(RuntimeError, match="dense_bias_act a second time"):
        vjp_fn(np.ones_like(out))


# -- bad inputs ----------------------------------------------------------------------------------------

def test_errors():
    W, x, b = data()
    with pytest.raises(ValueError, match=r"W has shape \(4,\); expected \(out_features, in_features\)"):
        ar.dense_bias_act("tanh", b, x, b)
    with pytest.raises(ValueError, match=r"x has shape \(3, 5, 5\) and W \(4, 6\)"):
        ar.dense_bias_act("tanh", W, x[..., :5], b)
    with pytest.raises(ValueError, match=r"b has shape \(3,\); expected \(4,\)"):
        ar.dense_bias_act("tanh", W, x, b[:3])
    with pytest.raises(TypeError, match="different dtypes"):
        ar.dense_bias_act("tanh", W.astype(np.float64), x, b)
    with pytest.raises(TypeError, match=r"x has dtype int64.*astype"):
        ar.bias_act("relu", np.ones((2, 3), np.int64), None)
    with pytest.raises(ValueError, match=r"b has shape \(4,\); expected \(6,\)"):
        ar.bias_act("relu", x, b)
    with pytest.raises(ValueError, match="x is a scalar"):
        ar.bias_act("relu", np.float32(1.0) * np.ones((), np.float32))
    with pytest.raises(ValueError, match="activation = 'swish'"):
        ar.bias_act("swish", x)
