"""Optimizers against torch.optim on the same flat problem; state save/load; clip_grad_norm; errors."""

import json
import math
import re

import numpy as np
import pytest
import torch

import arrayrnn as ar
from arrayrnn import optim
from arrayrnn.core import npzfile

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
    with pytest.raises(ValueError, match="not a readable arrayrnn-optimizer file"):
        optim.Adam(np.ones(3)).load(damaged)
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, header=np.array('{"format": "other"}'))
    with pytest.raises(ValueError, match=r"foreign.npz: file kind = 'other'; expected 'arrayrnn-optimizer'"):
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


@pytest.mark.parametrize("make", [lambda v: optim.SGD(np.ones(2), lr=v),
                                  lambda v: optim.SGD(np.ones(2), momentum=v),
                                  lambda v: optim.Adam(np.ones(2), eps=v),
                                  lambda v: optim.Adam(np.ones(2), weight_decay=v),
                                  lambda v: optim.Adam(np.ones(2), betas=(v, 0.9)),
                                  lambda v: optim.clip_grad_norm([np.ones(2)], v)])
@pytest.mark.parametrize("value, shown", [(10**400, r"1\.000e\+400 \(an int of 401 digits\)"),
                                          (float("nan"), "nan"), (float("inf"), "inf"), (True, "True")])
def test_numbers_out_of_floats_range_are_the_arguments_value_error(make, value, shown):
    """10**400 raised OverflowError from float() before (issue 45's audit)."""
    with pytest.raises(ValueError, match=rf" = {shown}; expected a number in "):
        make(value)


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


def test_numpy_scalars_are_accepted_by_optimizers():
    p = np.ones(3)
    optim.SGD(p, lr=np.float32(0.5), momentum=np.float64(0.0)).step(np.ones(3))
    np.testing.assert_array_equal(p, np.full(3, 0.5))
    optim.Adam(np.ones(3), lr=np.float32(0.01), betas=(np.float32(0.9), np.float64(0.99)))


def test_adam_step_on_a_read_only_buffer_changes_no_state():
    p = np.ones(3)
    opt = optim.Adam(p)
    p.flags.writeable = False
    with pytest.raises(ValueError, match="params is a read-only buffer"):
        opt.step(np.ones(3))
    assert opt.step_count == 0
    np.testing.assert_array_equal(opt.state[0]["exp_avg"], 0.0)


@pytest.mark.parametrize("ours, _, kwargs", CONFIGS)
def test_cupy_buffers_step_like_numpy(ours, _, kwargs):
    """CuPy's ``flags`` has no ``writeable`` (a GPU run found the read-only check asking for it); on the
    CuPy stand-in, whose flags are CuPy's, a step updates the buffer as it does on NumPy."""
    from support import fake_cupy

    rng = np.random.default_rng(0)
    p, grads = rng.standard_normal(5), [rng.standard_normal(5) for _ in range(3)]
    want = p.copy()
    host = ours(want, **kwargs)
    with fake_cupy.installed() as cp:
        got = cp.asarray(p)
        dev = ours(got, **kwargs)
        for g in grads:
            host.step(g)
            dev.step(cp.asarray(g))
        np.testing.assert_allclose(cp.asnumpy(got), want, rtol=1e-14, atol=0)


def test_a_gradient_of_another_dtype_changes_no_state():
    opt = optim.Adam(np.ones(3, dtype=np.float32))
    with pytest.raises(TypeError, match="different dtypes"):
        opt.step(np.ones(3))
    assert opt.step_count == 0


@pytest.mark.parametrize("change, message", [
    (lambda h: h.pop("type"), "optimizer None"),
    (lambda h: h["hyperparameters"].update(momentum=0.9), "unknown entries"),
    (lambda h: h.update(hyperparameters=[1]), "hyperparameters"),
    (lambda h: h.update(names="exp_avg"), "names"),
    (lambda h: h.update(names=[["nope"]]), r"missing: \['state/0/nope'\], unexpected: \['state/0/exp_avg'"),
    (lambda h: h.update(step="3"), "step"),
    (lambda h: h["hyperparameters"].update(lr="x"), "lr"),
])
def test_forged_optimizer_headers_are_value_errors_and_change_nothing(tmp_path, change, message):
    source = optim.Adam(np.ones(3))
    source.step(np.ones(3))
    path = tmp_path / "opt.npz"
    source.save(path)
    header, arrays = npzfile.read(path, optim.KIND, optim.VERSIONS)
    change(header)
    _forge(path, header, arrays)
    target = optim.Adam(np.ones(3), lr=0.5)
    before = (target.step_count, target.lr, target.state[0]["exp_avg"].copy())
    with pytest.raises(ValueError, match=message):
        target.load(path)
    assert (target.step_count, target.lr) == before[:2]
    np.testing.assert_array_equal(target.state[0]["exp_avg"], before[2])


def test_an_optimizer_header_that_is_a_json_list(tmp_path):
    path = tmp_path / "opt.npz"
    np.savez(path, header=np.frombuffer(json.dumps([1, 2]).encode(), dtype=np.uint8))
    with pytest.raises(ValueError, match="JSON list"):
        optim.Adam(np.ones(3)).load(path)


def test_optimizer_file_byte_flips_are_value_errors(tmp_path):
    opt = optim.Adam(np.ones(3))
    opt.step(np.ones(3))
    path = tmp_path / "opt.npz"
    opt.save(path)
    raw = path.read_bytes()
    for where in range(0, len(raw), 3):
        flipped = bytearray(raw)
        flipped[where] ^= 0x5A
        path.write_bytes(bytes(flipped))
        target = optim.Adam(np.ones(3))
        try:
            target.load(path)
        except ValueError:
            assert target.step_count == 0  # a refused file changes nothing
            continue
        # an undetected flip must have hit a byte nobody reads: the state is the saved one
        assert target.step_count == opt.step_count
        for key in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_array_equal(target.state[0][key], opt.state[0][key])


def _forge(path, header, arrays):
    kind, version = header.pop("format"), header.pop("version")
    npzfile.write(path, kind, version, header, arrays)


def test_clip_grad_norm_takes_a_numpy_norm_type():
    from arrayrnn import optim
    g = np.array([3.0, 4.0])
    assert optim.clip_grad_norm(g, np.float32(10.0), norm_type=np.float64(2.0)) == 5.0


def test_load_errors_name_the_file(tmp_path):
    """Errors found while restoring the state (after the file was read) did not name the file."""
    path = tmp_path / "opt.npz"
    opt = optim.Adam(np.ones(3))
    opt.step(np.ones(3))
    opt.save(path)
    with pytest.raises(ValueError, match=rf"^{path}: holds state for 1 buffers; this optimizer has 2"):
        optim.Adam([np.ones(3), np.ones(3)]).load(path)
    with pytest.raises(ValueError, match=rf"^{path}: member 'state/0/exp_avg' declares shape \(3,\) and "
                                         r"dtype float64; expected shape \(4,\) and dtype float64"):
        optim.Adam(np.ones(4)).load(path)
    with pytest.raises(ValueError, match=rf"^{path}: state_dict is for optimizer 'Adam'; this one is 'SGD'"):
        optim.SGD(np.ones(3), momentum=0.9).load(path)
    with pytest.raises(ValueError, match=rf"^{path}: member 'state/0/exp_avg' declares shape \(3,\) and "
                                         r"dtype float64; expected shape \(3,\) and dtype float32"):
        optim.Adam(np.ones(3, np.float32)).load(path)


def test_params_that_cannot_be_updated_in_place_are_refused():
    """A NumPy scalar was accepted (a copy was updated: nothing changed); a buffer listed twice took two
    updates per step (PyTorch warns about it)."""
    with pytest.raises(TypeError, match=r"params is a NumPy scalar \(float64\), which cannot be updated"):
        optim.SGD(np.float64(1.0), lr=0.1)
    w = np.ones(3)
    with pytest.raises(ValueError, match=r"params\[2\] is the same buffer as params\[0\]; expected each "):
        optim.Adam([w, np.ones(3), w])
    flat = np.ones(6)
    optim.SGD([flat[:3], flat[3:]], lr=0.1)          # disjoint views of one buffer are fine


@pytest.mark.parametrize("bad", ["x", float("nan"), -1.0, math.inf, None, True])
def test_a_bad_learning_rate_set_between_steps_is_refused(bad):
    """``opt.lr = ...`` (a schedule) was not checked: NaN turned every parameter into NaN at the next step."""
    w = np.ones(3)
    opt = optim.SGD([w], lr=0.1)
    with pytest.raises(ValueError, match=rf"lr = {re.escape(repr(bad))}; expected a number in \[0.0, inf\]"):
        opt.lr = bad
    opt.step([np.ones(3)])
    np.testing.assert_allclose(w, 0.9)


def test_state_dict_entries_and_step_range_are_checked():
    """A dict that is not a state_dict said "state_dict is for optimizer None"; a step of 2**70 was taken
    (and could not be saved as int64)."""
    opt = optim.Adam(np.ones(3))
    with pytest.raises(ValueError, match=r"state_dict has entries \['x'\]; expected \['hyperparameters', "
                                         r"'state', 'step', 'type'\]"):
        opt.load_state_dict({"x": 1})
    state = opt.state_dict()
    with pytest.raises(ValueError, match=r"state_dict\['step'\] = 1180591620717411303424; expected an "
                                         r"integer in \[0, 2\*\*63\)"):
        opt.load_state_dict({**state, "step": 2**70})
    opt.load_state_dict({**state, "step": 2**63 - 1})
    assert opt.step_count == 2**63 - 1


@pytest.mark.parametrize("cls, kwargs", [(optim.SGD, {"lr": 0.5, "momentum": 0.25, "nesterov": True}),
                                         (optim.Adam, {"lr": 0.25, "betas": (0.5, 0.75), "eps": 1e-3}),
                                         (optim.AdamW, {"weight_decay": 0.125})])
def test_the_broadcast_form_of_the_hyperparameters_round_trips(cls, kwargs):
    """What broadcast_from_root sends of an optimizer besides its buffers (issue 34: lr, betas, ... stayed
    behind on the root)."""
    source, target = cls(np.ones(3), **kwargs), cls(np.ones(3))
    target._load_hyperparameter_vector(source._hyperparameter_vector(), "rank 0's optimizer")
    assert target.state_dict()["hyperparameters"] == source.state_dict()["hyperparameters"]


def test_the_broadcast_hyperparameters_of_another_type_or_bad_values_are_refused():
    adam = optim.Adam(np.ones(3))
    with pytest.raises(ValueError, match="rank 0's optimizer holds the hyperparameters of another optimizer "
                                         "type; this one is Adam"):
        adam._load_hyperparameter_vector(optim.AdamW(np.ones(3))._hyperparameter_vector(), "rank 0's "
                                         "optimizer")
    vector = adam._hyperparameter_vector()
    vector[-1] = -1.0   # weight_decay
    with pytest.raises(ValueError, match=r"weight_decay = -1\.0; expected a number in \[0\.0, inf\]"):
        adam._load_hyperparameter_vector(vector, "rank 0's optimizer")
    assert adam.weight_decay == 0.0
