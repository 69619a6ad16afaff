"""Custom cells (issue 47) through every front door: ``rnn_forward`` / ``rnn_backward``, ``cell_step``,
``ar.nn.Recurrent``, ``arrayrnn.torch.ArrayRNN``, ``arrayrnn.jax.rnn``, save / load and the exporters.

Oracles: a built-in mode and its twin written through the cell API (:mod:`support.twin_cells`) give the same
numbers on the same weights, so each front door's built-in result checks its twin's; a three-state cell
(``tri``, states ``h, c, n``: ``c`` of two blocks) is checked against an independent float64 NumPy loop of
its equations and float64 central differences.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from support.twin_cells import twin_params

import arrayrnn as ar
from arrayrnn import cellmath as cm

RTOL, ATOL = 1e-11, 1e-12  # float64; the twins agree to the last bits on the reference engine
EPS = 1e-6


# -- a cell of three states: h, and c = [c | n] of two blocks --------------------------------------------
#     i, f, o = sigmoid(pre);  c' = f c + i;  n' = f n + o;  t = tanh(c' - n');  h' = o t
def tri_forward(i, f, o, h, c, n):
    i, f, o = cm.sigmoid(i), cm.sigmoid(f), cm.sigmoid(o)
    c_new = f * c + i
    n_new = f * n + o
    t = cm.tanh(c_new - n_new)
    return (o * t, c_new, n_new), (i, f, o, c, n, t)


def tri_backward(res, d_new):
    i, f, o, c, n, t = res
    dh, dc, dn = d_new
    d_pre_t = dh * o * cm.dtanh(t)
    dc = dc + d_pre_t
    dn = dn - d_pre_t
    do = dh * t + dn
    return (dc * cm.dsigmoid(i), (dc * c + dn * n) * cm.dsigmoid(f), do * cm.dsigmoid(o), 0.0, dc * f, dn * f)


TRI = ar.register_cell(ar.Cell("tri", gates=("i", "f", "o"), states=("h", "c", "n"), forward=tri_forward,
                               backward=tri_backward), replace=True)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def tri_oracle(params, x, lengths, h0, c0):
    """The ``tri`` stack from its equations, time-major, float64: ``(y, h_n, c_n, c_all)``."""
    spec, H = params.spec, params.spec.hidden_size
    T, B, _ = x.shape
    h_n, c_n, c_all, inp = [], [], [], x
    for layer in range(spec.num_layers):
        outs = []
        for d in range(spec.num_directions):
            k = layer * spec.num_directions + d
            W_ih, W_hh, b_ih, b_hh = (params.view(layer, d, n) for n in ("W_ih", "W_hh", "b_ih", "b_hh"))
            h, c, n = h0[k].copy(), c0[k, :, :H].copy(), c0[k, :, H:].copy()
            y, cs = np.zeros((T, B, H)), np.zeros((T, B, 2 * H))
            for b in range(B):
                steps = range(lengths[b]) if d == 0 else reversed(range(lengths[b]))
                for t in steps:
                    pre = inp[t, b] @ W_ih.T + b_ih + h[b] @ W_hh.T + b_hh
                    i, f, o = sigmoid(pre[:H]), sigmoid(pre[H:2 * H]), sigmoid(pre[2 * H:])
                    c[b], n[b] = f * c[b] + i, f * n[b] + o
                    h[b] = o * np.tanh(c[b] - n[b])
                    y[t, b], cs[t, b] = h[b], np.concatenate([c[b], n[b]])
            outs.append(y)
            h_n.append(h)
            c_n.append(np.concatenate([c, n], axis=1))
            c_all.append(cs)
        inp = np.concatenate(outs, axis=-1)
    return inp, np.stack(h_n), np.stack(c_n), np.stack(c_all)


def central_differences(loss, base):
    """d loss / d base, entry by entry (float64)."""
    flat = base.reshape(-1).copy()
    grad = np.empty_like(flat)
    for j in range(flat.size):
        keep = flat[j]
        flat[j] = keep + EPS
        up = loss(flat.reshape(base.shape).copy())
        flat[j] = keep - EPS
        down = loss(flat.reshape(base.shape).copy())
        flat[j] = keep
        grad[j] = (up - down) / (2 * EPS)
    return grad.reshape(base.shape)


def close(got, want, what=""):
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=what)


def pair(mode, **fields):
    """Float64 params of the built-in ``mode`` and of its twin (the same buffer)."""
    params = ar.PackedParams.init(ar.RNNSpec(mode=mode, input_size=3, hidden_size=4, dtype="float64",
                                             **fields), seed=1)
    return params, twin_params(params)


def inputs(spec, T=5, B=4, seed=0, batch_first=False):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, T, spec.input_size) if batch_first else (T, B, spec.input_size))
    h0 = rng.standard_normal(spec.state_shape(B))
    c0 = rng.standard_normal(spec.state_shape(B, cell=True)) if spec.has_cell else None
    return x, h0, c0


# == 1. rnn_forward / rnn_backward ==========================================================================
OPTIONS = [
    dict(),
    dict(num_layers=2, bidirectional=True, dropout=0.4),
    dict(recurrent_dropout=0.3, weight_dropout=0.2, bidirectional=True),
    dict(bias="single_rec", num_layers=2),
]


@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
@pytest.mark.parametrize("fields", OPTIONS, ids=["plain", "stack_dropout", "variants", "single_bias"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_rnn_twin_equals_builtin(mode, fields, batch_first):
    params, twin = pair(mode, **fields)
    spec = params.spec
    x, h0, c0 = inputs(spec, batch_first=batch_first)
    lengths = np.array([5, 0, 3, 1])
    kw = dict(batch_first=batch_first, training=True, seed=7, return_all_states=True)
    want = ar.rnn_forward(params, x, lengths, h0, c0, engine="reference", **kw)
    got = ar.rnn_forward(twin, x, lengths, h0, c0, **kw)
    assert (got.c_n is None) == (mode != "lstm") and (got.c_all is None) == (mode != "lstm")
    for name in ("y", "h_n", "c_n", "h_all", "c_all"):
        if getattr(want, name) is not None:
            close(getattr(got, name), getattr(want, name), name)
    rng = np.random.default_rng(1)
    cot = {name: rng.standard_normal(getattr(want, name[1:]).shape) for name in ("dy", "dh_n", "dc_n",
                                                                               "dh_all", "dc_all")
           if getattr(want, name[1:]) is not None}
    g_want, g_got = ar.rnn_backward(want, **cot), ar.rnn_backward(got, **cot)
    for name in ("dx", "dh0", "dc0"):
        if getattr(g_want, name) is not None:
            close(getattr(g_got, name), getattr(g_want, name), name)
    close(g_got.dparams.data, g_want.dparams.data, "dparams")
    assert g_got.dparams.spec == twin.spec


def tri_params(**fields):
    spec = ar.RNNSpec(mode="tri", input_size=2, hidden_size=3, dtype="float64", **fields)
    return ar.PackedParams.init(spec, seed=3)


@pytest.mark.parametrize("fields", [dict(), dict(num_layers=2, bidirectional=True)])
def test_rnn_three_state_cell_matches_its_equations(fields):
    params = tri_params(**fields)
    spec = params.spec
    assert spec.cell_width == 2 * spec.hidden_size and spec.has_cell
    x, h0, c0 = inputs(spec, T=4, B=3)
    assert c0.shape == (spec.num_layers * spec.num_directions, 3, 6)
    lengths = np.array([4, 0, 2])
    res = ar.rnn_forward(params, x, lengths, h0, c0, return_all_states=True)
    y, h_n, c_n, c_all = tri_oracle(params, x, lengths, h0, c0)
    close(res.y, y, "y")
    close(res.h_n, h_n, "h_n")
    close(res.c_n, c_n, "c_n")
    close(res.c_all, c_all, "c_all")
    close(res.c_n[:, 1], c0[:, 1], "a zero-length row keeps c0")


def test_rnn_three_state_cell_gradients_match_central_differences():
    params = tri_params(bidirectional=True)
    spec = params.spec
    x, h0, c0 = inputs(spec, T=3, B=2)
    lengths = np.array([3, 2])
    rng = np.random.default_rng(5)
    fwd = ar.rnn_forward(params, x, lengths, h0, c0, training=True, return_all_states=True)
    dy, dh_n, dc_n = (rng.standard_normal(a.shape) for a in (fwd.y, fwd.h_n, fwd.c_n))
    dc_all = rng.standard_normal(fwd.c_all.shape)
    g = ar.rnn_backward(fwd, dy, dh_n, dc_n, dc_all=dc_all)

    def loss(data=params.data, x=x, h0=h0, c0=c0):
        r = ar.rnn_forward(ar.PackedParams(spec, data), x, lengths, h0, c0, return_all_states=True)
        pairs = ((r.y, dy), (r.h_n, dh_n), (r.c_n, dc_n), (r.c_all, dc_all))
        return sum(float(np.sum(a * b)) for a, b in pairs)

    np.testing.assert_allclose(g.dparams.data, central_differences(lambda v: loss(data=v), params.data),
                               rtol=1e-6, atol=1e-8)
    for name, value, grad in (("x", x, g.dx), ("h0", h0, g.dh0), ("c0", c0, g.dc0)):
        np.testing.assert_allclose(grad, central_differences(lambda v, n=name: loss(**{n: v}), value),
                                   rtol=1e-6, atol=1e-8, err_msg=name)


def test_rnn_custom_cell_state_errors():
    _, twin_gru = pair("gru")
    x, h0, _ = inputs(twin_gru.spec)
    with pytest.raises(ValueError, match=r"c0 was given but mode = 'twin_gru' has no cell state \(no state "
                                         r"besides h\); pass c0=None"):
        ar.rnn_forward(twin_gru, x, c0=np.zeros_like(h0))
    res = ar.rnn_forward(twin_gru, x, training=True, return_all_states=True)
    with pytest.raises(ValueError, match="dc_n was given but mode = 'twin_gru' has no cell state"):
        ar.rnn_backward(res, dc_n=np.zeros_like(h0))
    with pytest.raises(ValueError, match="dc_all was given but mode = 'twin_gru' has no cell state"):
        ar.rnn_backward(res, dc_all=np.zeros_like(res.h_all))
    tri = tri_params()
    x, h0, c0 = inputs(tri.spec)
    with pytest.raises(ValueError, match=r"c0 has shape \(1, 4, 3\); expected \(num_layers \* "
                                         r"num_directions, B, spec.cell_width\) = \(1, 4, 6\)"):
        ar.rnn_forward(tri, x, c0=c0[:, :, :3].copy())


# == 2. cell_step / cell_step_backward ======================================================================
@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_relu"])
def test_cell_step_twin_equals_builtin(mode):
    params, twin = pair(mode)
    rng = np.random.default_rng(2)
    x, h = rng.standard_normal((3, 3)), rng.standard_normal((3, 4))
    c = rng.standard_normal((3, 4)) if mode == "lstm" else None
    want = ar.cell_step(params, x, h, c, training=True, engine="reference")
    got = ar.cell_step(twin, x, h, c, training=True)
    close(got.h, want.h, "h")
    assert (got.c is None) == (c is None)
    if c is not None:
        close(got.c, want.c, "c")
    dh, dc = rng.standard_normal((3, 4)), rng.standard_normal((3, 4)) if c is not None else None
    g_want, g_got = ar.cell_step_backward(want, dh, dc), ar.cell_step_backward(got, dh, dc)
    for name in ("dx", "dh", "dc"):
        if getattr(g_want, name) is not None:
            close(getattr(g_got, name), getattr(g_want, name), name)
    close(g_got.dparams.data, g_want.dparams.data, "dparams")


def test_cell_step_three_state_cell():
    params = tri_params()
    spec = params.spec
    rng = np.random.default_rng(4)
    x, h, c = rng.standard_normal((2, 2)), rng.standard_normal((2, 3)), rng.standard_normal((2, 6))
    step = ar.cell_step(params, x, h, c, training=True)
    _, h_n, c_n, _ = tri_oracle(params, x[None], np.array([1, 1]), h[None], c[None])
    close(step.h, h_n[0], "h")
    close(step.c, c_n[0], "c")
    dh, dc = rng.standard_normal((2, 3)), rng.standard_normal((2, 6))
    g = ar.cell_step_backward(step, dh, dc)

    def loss(data=params.data, x=x, h=h, c=c):
        r = ar.cell_step(ar.PackedParams(spec, data), x, h, c)
        return float(np.sum(r.h * dh) + np.sum(r.c * dc))

    np.testing.assert_allclose(g.dparams.data, central_differences(lambda v: loss(data=v), params.data),
                               rtol=1e-6, atol=1e-8)
    for name, value, grad in (("x", x, g.dx), ("h", h, g.dh), ("c", c, g.dc)):
        np.testing.assert_allclose(grad, central_differences(lambda v, n=name: loss(**{n: v}), value),
                                   rtol=1e-6, atol=1e-8, err_msg=name)
    with pytest.raises(ValueError, match=r"c has shape \(2, 3\); expected \(B, spec.cell_width\) = \(2, 6\)"):
        ar.cell_step(params, x, h, c[:, :3].copy())
    zero = ar.cell_step(params, x, h)  # c = None: zeros of cell_width
    close(zero.c, ar.cell_step(params, x, h, np.zeros((2, 6))).c, "c = None means zeros")


def test_cell_step_single_state_cell_refuses_c():
    _, twin = pair("rnn_tanh")
    with pytest.raises(ValueError, match=r"c was given but mode = 'twin_rnn_tanh' has no cell state"):
        ar.cell_step(twin, np.ones((2, 3)), c=np.ones((2, 4)))
    step = ar.cell_step(twin, np.ones((2, 3)), training=True)
    with pytest.raises(ValueError, match=r"dc was given but mode = 'twin_rnn_tanh' has no cell state"):
        ar.cell_step_backward(step, dc=np.ones((2, 4)))


# == 3. ar.nn.Recurrent =====================================================================================
def test_nn_recurrent_twin_equals_lstm_layer_and_its_gradient():
    lstm = ar.nn.LSTM(3, 4, num_layers=2, bidirectional=True, dtype="float64", seed=3, engine="reference")
    layer = ar.nn.Recurrent("twin_lstm", 3, 4, num_layers=2, bidirectional=True, dtype="float64")
    layer.params = twin_params(lstm.params)
    x, h0, c0 = inputs(lstm.spec)
    lengths = np.array([5, 2, 0, 4])
    for got, want in zip(layer(x, lengths, h0, c0), lstm(x, lengths, h0, c0), strict=True):
        close(got, want)

    def loss_of(model):
        def loss(p, x, h0, c0):
            y, h_n, c_n = model.apply(p, x, lengths, h0, c0)
            return ar.ops.sum(y * y) + ar.ops.sum(h_n) + ar.ops.sum(c_n * c_n)
        return loss

    g_want = ar.grad(loss_of(lstm), argnums=(0, 1, 2, 3))(lstm.params, x, h0, c0)
    g_got = ar.grad(loss_of(layer), argnums=(0, 1, 2, 3))(layer.params, x, h0, c0)
    close(g_got[0].data, g_want[0].data, "dparams")
    for k in (1, 2, 3):
        close(g_got[k], g_want[k])


def test_nn_recurrent_carries_a_three_state_cell_state():
    layer = ar.nn.Recurrent("tri", 2, 3, dtype="float64", batch_first=True)
    assert layer.spec.mode == "tri" and "tri" in repr(layer)
    h0, c0 = layer.initial_state(2)
    assert h0.shape == (1, 2, 3) and c0.shape == (1, 2, 6)
    x = np.random.default_rng(0).standard_normal((2, 6, 2))
    y, h_n, c_n = layer(x)
    y1, h1, c1 = layer(x[:, :4])
    y2, h2, c2 = layer(x[:, 4:], h0=h1, c0=c1)  # the state carried over: the same as one call
    close(np.concatenate([y1, y2], axis=1), y)
    close(h2, h_n)
    close(c2, c_n)
    _, twin_gru = pair("gru")
    _, _, none = ar.nn.Recurrent("twin_gru", 3, 4)(np.ones((2, 1, 3), np.float32))
    assert none is None


def test_nn_recurrent_errors():
    with pytest.raises(ValueError, match=r"mode = 'no_such_cell'; expected one of .* registered with "
                                         r"arrayrnn.register_cell \(registered: .*'tri'"):
        ar.nn.Recurrent("no_such_cell", 3, 4)
    with pytest.raises(TypeError, match=r"Recurrent: mode = 3 has type int; expected a str"):
        ar.nn.Recurrent(3, 3, 4)
    with pytest.raises(ValueError, match=r"zoneout"):
        ar.RNNSpec("tri", 2, 3, zoneout=0.1)  # the spec refuses it; Recurrent does not take it at all


# == 4. arrayrnn.torch.ArrayRNN =============================================================================
@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def torch_pair(torch, mode, **kw):
    from arrayrnn.torch import ArrayRNN

    builtin = ArrayRNN(mode, 3, 4, dtype=torch.float64, seed=2, **kw)
    twin = ArrayRNN(twin_params(ar.PackedParams(builtin.spec, builtin.flat.detach().numpy())).spec, seed=0)
    twin.batch_first = builtin.batch_first
    with torch.no_grad():
        twin.flat.copy_(builtin.flat)
    return builtin, twin


def leaves(torch, *arrays):
    return [torch.tensor(a, requires_grad=True) for a in arrays]


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_torch_array_rnn_twin_equals_builtin(torch, mode):
    builtin, twin = torch_pair(torch, mode, num_layers=2, bidirectional=True, batch_first=True)
    x, h0, c0 = inputs(builtin.spec, batch_first=True)
    lengths = torch.tensor([5, 0, 3, 2])
    results = []
    for module in (builtin, twin):
        xs = leaves(torch, x, h0, *([c0] if c0 is not None else []))
        hx = (xs[1], xs[2]) if mode == "lstm" else xs[1]
        y, state = module(xs[0], hx, lengths=lengths, engine="reference" if module is builtin else "auto")
        h_n, c_n = state if mode == "lstm" else (state, None)
        assert isinstance(state, tuple) == (mode == "lstm")
        loss = (y * y).sum() + h_n.sum() + (c_n.pow(3).sum() if c_n is not None else 0)
        loss.backward()
        states = [h_n] + ([c_n] if c_n is not None else [])
        results.append([y, *states, *(t.grad for t in xs), module.flat.grad])
    for got, want in zip(results[1], results[0], strict=True):
        close(got.detach().numpy(), want.detach().numpy())


def test_torch_array_rnn_three_state_cell(torch):
    from arrayrnn.torch import ArrayRNN

    model = ArrayRNN("tri", 2, 3, bidirectional=True, dtype=torch.float64, seed=0)
    assert model.mode == "tri" and list(model.state_dict()) == ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0",
                                                                "bias_hh_l0", "weight_ih_l0_reverse",
                                                                "weight_hh_l0_reverse", "bias_ih_l0_reverse",
                                                                "bias_hh_l0_reverse"]
    x, h0, c0 = inputs(model.spec, T=3, B=2)
    lengths = torch.tensor([3, 1])
    y, (h_n, c_n) = model(torch.tensor(x), (torch.tensor(h0), torch.tensor(c0)), lengths=lengths)
    want = tri_oracle(ar.PackedParams(model.spec, model.flat.detach().numpy()), x, lengths.numpy(), h0, c0)
    for got, oracle in zip((y, h_n, c_n), want, strict=False):
        close(got.detach().numpy(), oracle)

    def run(flat, x, h0, c0):
        y, (h_n, c_n) = torch.func.functional_call(model, {"flat": flat}, (x, (h0, c0)),
                                                   {"lengths": lengths})
        return y, h_n, c_n

    args = [model.flat.detach().clone().requires_grad_()] + leaves(torch, x, h0, c0)
    assert torch.autograd.gradcheck(run, args, eps=EPS, atol=1e-7, rtol=1e-6)


def test_torch_array_rnn_custom_cell_edges_and_errors(torch):
    from arrayrnn.torch import ArrayRNN

    model = ArrayRNN("tri", 2, 3, num_layers=2, seed=0)
    y, (h_n, c_n) = model(torch.zeros(4, 0, 2))  # an empty batch: empty outputs, no cell call
    assert tuple(y.shape) == (4, 0, 3) and tuple(h_n.shape) == (2, 0, 3) and tuple(c_n.shape) == (2, 0, 6)
    with pytest.raises(TypeError, match=r"hx has type Tensor; expected \(h0, c0\) for the cell 'tri' "
                                        r"\(states \('h', 'c', 'n'\)"):
        model(torch.zeros(4, 1, 2), torch.zeros(2, 1, 3))
    with pytest.raises(ValueError, match=r"mode = 'nope'; expected an RNNSpec, one of .* or the name of a "
                                         r"cell registered with arrayrnn.register_cell \(registered: "
                                         r".*'tri'"):
        ArrayRNN("nope", 2, 3)
    x = torch.ones(2, 1, 2, requires_grad=True)
    y, _ = model(x)
    with pytest.raises(ValueError, match=r"mode = 'tri' is a custom cell: the torch-op recurrence .* "
                                         r"create_graph=True for gradients of gradients"):
        torch.autograd.grad(y.sum(), x, create_graph=True)
    (g,) = torch.autograd.grad(model(x)[0].sum(), x)  # first order runs
    assert tuple(g.shape) == (2, 1, 2)
    single = ArrayRNN("twin_rnn_tanh", 2, 3, seed=0)
    y, h_n = single(torch.ones(2, 1, 2))
    assert isinstance(h_n, torch.Tensor) and tuple(h_n.shape) == (1, 1, 3)


@pytest.mark.filterwarnings("ignore")  # the exporters' own deprecation and tracer warnings
@pytest.mark.parametrize("dynamo", [False, True])
def test_onnx_export_refuses_a_custom_cell(torch, tmp_path, dynamo):
    pytest.importorskip("onnx")
    from arrayrnn import onnx as ar_onnx
    from arrayrnn.torch import ArrayRNN

    message = r"mode = 'tri' is a custom cell \(arrayrnn.register_cell\); ONNX has LSTM, GRU and RNN "
    with pytest.raises(ValueError, match=message):
        ar_onnx.export(tri_params(), tmp_path / "tri.onnx")
    model = ArrayRNN("tri", 2, 3, seed=0).eval()
    with pytest.raises(Exception, match=message):
        torch.onnx.export(model, (torch.ones(4, 1, 2),), str(tmp_path / "tri_torch.onnx"), dynamo=dynamo)
    assert not (tmp_path / "tri.onnx").exists() and not (tmp_path / "tri_torch.onnx").exists()


# == 5. arrayrnn.jax.rnn ====================================================================================
@pytest.fixture
def jax():
    jax = pytest.importorskip("jax")
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield jax
    jax.config.update("jax_enable_x64", previous)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_jax_twin_equals_builtin_and_grad(jax, mode):
    from arrayrnn.jax import rnn

    params, twin = pair(mode, num_layers=2, bidirectional=True)
    x, h0, c0 = inputs(params.spec)
    lengths = np.array([5, 0, 3, 2])

    def loss(spec):
        def f(flat, x, h0, c0):
            y, h_n, c_n = rnn(spec, flat, x, lengths, h0, c0)
            return (y * y).sum() + h_n.sum() + ((c_n ** 3).sum() if c_n is not None else 0.0)
        return f

    args = (params.data, x, h0, c0)
    argnums = (0, 1, 2, 3) if mode == "lstm" else (0, 1, 2)
    for got, want in zip(rnn(twin.spec, *args[:2], lengths, *args[2:]), rnn(params.spec, *args[:2], lengths,
                                                                           *args[2:]), strict=True):
        assert (got is None) == (want is None)
        if want is not None:
            close(np.asarray(got), np.asarray(want))
    g_got = jax.grad(loss(twin.spec), argnums)(*args)
    g_want = jax.grad(loss(params.spec), argnums)(*args)
    for got, want in zip(g_got, g_want, strict=True):
        close(np.asarray(got), np.asarray(want))


def test_jax_three_state_cell(jax):
    from arrayrnn.jax import rnn

    params = tri_params()
    spec = params.spec
    x, h0, c0 = inputs(spec, T=3, B=2)
    lengths = np.array([3, 1])
    y, h_n, c_n = jax.jit(lambda p, x, h0, c0: rnn(spec, p, x, lengths, h0, c0))(params.data, x, h0, c0)
    assert c_n.shape == (1, 2, 6)
    for got, want in zip((y, h_n, c_n), tri_oracle(params, x, lengths, h0, c0), strict=False):
        close(np.asarray(got), want)
    rng = np.random.default_rng(0)
    dy, dh, dc = (rng.standard_normal(a.shape) for a in (y, h_n, c_n))
    grads = jax.grad(lambda *a: sum((o * d).sum() for o, d in zip(rnn(spec, a[0], a[1], lengths, *a[2:]),
                                                                   (dy, dh, dc), strict=True)),
                     argnums=(0, 1, 2, 3))(params.data, x, h0, c0)
    g = ar.rnn_backward(ar.rnn_forward(params, x, lengths, h0, c0, training=True), dy, dh, dc)
    for got, want in zip(grads, (g.dparams.data, g.dx, g.dh0, g.dc0), strict=True):
        close(np.asarray(got), want)
    with pytest.raises(ValueError, match=r"c0 has shape \(1, 2, 3\); expected \(1, 2, 6\)"):
        rnn(spec, params.data, x, lengths, h0, c0[:, :, :3])
    _, twin_gru = pair("gru")
    x, h0, _ = inputs(twin_gru.spec)
    with pytest.raises(ValueError, match=r"c0 was given for mode = 'twin_gru', which has no cell state"):
        rnn(twin_gru.spec, twin_gru.data, x, c0=h0)


# == 6. save / load, torch interop ==========================================================================
def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_save_load_of_a_custom_cell(tmp_path):
    cell = ar.register_cell(ar.Cell("tmp_saved_cell", gates=TRI.gates, states=TRI.states, forward=tri_forward,
                                    backward=tri_backward))
    try:
        params = ar.PackedParams.init(ar.RNNSpec("tmp_saved_cell", 2, 3, num_layers=2), seed=0)
        path = tmp_path / "cell.npz"
        ar.save(path, params)
        back = ar.load(path)
        assert back.spec == params.spec and np.array_equal(back.data, params.data)
        digest = _digest(path)
        ar.unregister_cell("tmp_saved_cell")
        with pytest.raises(ValueError, match=r"cell.npz: the file holds a stack of the cell mode = "
                                             r"'tmp_saved_cell', which is not registered \(registered: .*\); "
                                             r"register it before loading: import the module"):
            ar.load(path)
        assert _digest(path) == digest  # the refused load left the file as it was
        ar.register_cell(cell)
        assert np.array_equal(ar.load(path).data, params.data)  # registered again: it loads
    finally:
        if "tmp_saved_cell" in ar.registered_cells():
            ar.unregister_cell("tmp_saved_cell")


def test_load_refuses_another_definition_under_the_same_name(tmp_path):
    first = ar.register_cell(ar.Cell("tmp_redefined", gates=("i", "f", "o"), states=("h", "c", "n"),
                                     forward=tri_forward, backward=tri_backward))
    path = tmp_path / "cell.npz"
    try:
        ar.save(path, ar.PackedParams.init(ar.RNNSpec("tmp_redefined", 2, 3), seed=0))

        def forward(a, b, o, h, c, n):
            return tri_forward(a, b, o, h, c, n)

        ar.register_cell(ar.Cell("tmp_redefined", gates=("a", "b", "o"), states=("h", "c", "n"),
                                 forward=forward, backward=tri_backward), replace=True)
        with pytest.raises(ValueError, match=r"the file was saved with the cell 'tmp_redefined' of "
                                             r".*'gates': \['i', 'f', 'o'\].*; the cell registered as "
                                             r"'tmp_redefined' now has .*'gates': \['a', 'b', 'o'\].*"
                                             r"register the definition"):
            ar.load(path)
        ar.register_cell(first, replace=True)
        ar.load(path)
    finally:
        ar.unregister_cell("tmp_redefined")


def test_to_torch_state_dict_refuses_a_custom_cell(torch):
    with pytest.raises(ValueError, match=r"mode = 'tri' is a custom cell \(arrayrnn.register_cell\); "
                                         r"torch.nn has no module that computes it"):
        ar.to_torch_state_dict(tri_params())
