"""Optimizers against torch.optim on the same flat problem; state save/load; clip_grad_norm; errors."""

import math

import numpy as np
import pytest
import torch

import arrayrnn as ar
from arrayrnn import optim

CONFIGS = [
    (optim.SGD, torch.optim.SGD, {"lr": 0.1}),
    (optim.SGD, torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01}),
    (optim.SGD, torch.optim.SGD, {"lr": 0.05, "momentum": 0.8, "nesterov": True, "weight_decay": 0.1}),
    (optim.Adam, torch.optim.Adam, {"lr": 0.01}),
    (optim.Adam, torch.optim.Adam, {"lr": 0.02, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1}),
    (optim.AdamW, torch.optim.AdamW, {"lr": 0.02, "weight_decay": 0.05}),
]


def quadratic_grad(p, A, target):
    """The gradient of 0.5 |A p - target|^2: a problem both libraries can follow step by step."""
    return A.T @ (A @ p - target)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("ours, theirs, kwargs", CONFIGS)
def test_same_trajectory_as_torch(ours, theirs, kwargs, dtype):
    r = np.random.default_rng(0)
    spec = ar.RNNSpec("rnn_tanh", 3, 4, dtype=np.dtype(dtype).name)
    params = ar.PackedParams.init(spec, seed=1)
    n = params.size
    A = r.standard_normal((n, n)).astype(dtype) / math.sqrt(n)
    target = r.standard_normal(n).astype(dtype)
    tensor = torch.from_numpy(params.data.copy()).requires_grad_()
    opt, topt = ours(params, **kwargs), theirs([tensor], **kwargs, foreach=False)
    tol = dict(rtol=1e-12, atol=1e-14) if dtype == np.float64 else dict(rtol=2e-5, atol=2e-6)
    for _ in range(6):
        g = quadratic_grad(params.data, A, target)
        opt.step(ar.PackedParams(spec, g))
        tensor.grad = torch.from_numpy(quadratic_grad(tensor.detach().numpy(), A, target))
        topt.step()
        np.testing.assert_allclose(params.data, tensor.detach().numpy(), **tol)


def test_list_of_buffers_is_updated_in_place():
    a, b = np.ones(3), np.ones((2, 2))
    before = (id(a), id(b))
    opt = optim.SGD([a, b], lr=0.5)
    opt.step([np.ones(3), np.full((2, 2), 2.0)])
    assert (id(a), id(b)) == before
    np.testing.assert_allclose(a, 0.5)
    np.testing.assert_allclose(b, 0.0)


@pytest.mark.parametrize("cls, kwargs", [(optim.Adam, {"lr": 0.1, "weight_decay": 0.01}),
                                         (optim.SGD, {"lr": 0.1, "momentum": 0.9})])
def test_state_round_trip_continues_identically(cls, kwargs, tmp_path):
    r = np.random.default_rng(0)
    grads = [r.standard_normal(5) for _ in range(6)]
    p1 = r.standard_normal(5)
    opt1 = cls(p1, **kwargs)
    for g in grads[:3]:
        opt1.step(g)
    p2 = p1.copy()
    opt2 = cls(p2, lr=123.0)  # hyperparameters come back with the state
    opt2.load_state_dict(opt1.state_dict())
    p3 = p1.copy()
    opt3 = cls(p3)
    opt1.save(tmp_path / "opt.npz")
    opt3.load(tmp_path / "opt.npz")
    for g in grads[3:]:
        for opt in (opt1, opt2, opt3):
            opt.step(g)
    np.testing.assert_array_equal(p2, p1)
    np.testing.assert_array_equal(p3, p1)
    assert opt3.step_count == 6 and opt3.lr == kwargs["lr"]


def test_state_load_errors(tmp_path):
    opt = optim.Adam(np.ones(3))
    opt.step(np.ones(3))
    state = opt.state_dict()
    with pytest.raises(ValueError, match="for optimizer 'Adam'; this one is 'SGD'"):
        optim.SGD(np.ones(3), momentum=0.9).load_state_dict(state)
    with pytest.raises(ValueError, match=r"has shape \(3,\) and dtype float64; expected \(4,\)"):
        optim.Adam(np.ones(4)).load_state_dict(state)
    with pytest.raises(ValueError, match="state for 1 buffers; this optimizer has 2"):
        optim.Adam([np.ones(3), np.ones(3)]).load_state_dict(state)
    damaged = tmp_path / "damaged.npz"
    opt.save(damaged)
    damaged.write_bytes(damaged.read_bytes()[:100])
    with pytest.raises(ValueError, match="not a readable arrayrnn optimizer file"):
        optim.Adam(np.ones(3)).load(damaged)
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, header=np.array('{"format": "other"}'))
    with pytest.raises(ValueError, match="not an arrayrnn optimizer file"):
        optim.Adam(np.ones(3)).load(foreign)


@pytest.mark.parametrize("norm_type", [2.0, math.inf, 1.0])
@pytest.mark.parametrize("max_norm", [0.5, 1000.0])
def test_clip_grad_norm_matches_torch(norm_type, max_norm):
    r = np.random.default_rng(0)
    grads = [r.standard_normal(7), r.standard_normal((3, 4))]
    tensors = [torch.zeros(g.shape, dtype=torch.float64, requires_grad=True) for g in grads]
    for t, g in zip(tensors, grads, strict=True):
        t.grad = torch.from_numpy(g.copy())
    expected = torch.nn.utils.clip_grad_norm_(tensors, max_norm, norm_type=norm_type)
    total = optim.clip_grad_norm(grads, max_norm, norm_type=norm_type)
    assert math.isclose(total, expected.item(), rel_tol=1e-12)
    for g, t in zip(grads, tensors, strict=True):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-12)


def test_errors():
    with pytest.raises(ValueError, match="lr = -1"):
        optim.SGD(np.ones(2), lr=-1)
    with pytest.raises(ValueError, match=r"betas\[1\] = 1.0"):
        optim.Adam(np.ones(2), betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="Nesterov momentum needs momentum > 0"):
        optim.SGD(np.ones(2), nesterov=True)
    with pytest.raises(TypeError, match="params has dtype int64"):
        optim.SGD(np.arange(2))
    with pytest.raises(ValueError, match="params is empty"):
        optim.Adam([])
    opt = optim.Adam([np.ones(2), np.ones(3)])
    with pytest.raises(ValueError, match=r"grads has 1 entry; expected the structure of params \(2 entr"):
        opt.step([np.ones(2)])
    with pytest.raises(ValueError, match=r"grads\[1\] has shape \(2,\); expected"):
        opt.step([np.ones(2), np.ones(2)])
    with pytest.raises(TypeError, match="different dtypes"):
        opt.step([np.ones(2), np.ones(3, np.float32)])
    with pytest.raises(ValueError, match="norm_type = 0"):
        optim.clip_grad_norm(np.ones(2), 1.0, norm_type=0)
