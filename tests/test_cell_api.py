"""The custom-cell API (arrayrnn/core/cell_registry.py, cellmath, check_cell) and custom cells on the
reference engine: definitions refused with the cell named, the registry, the spec's sizes, ``ar.check_cell``
finding a wrong backward, the built-ins' twins giving the built-ins' bits, CIFG against a PyTorch loop and
float64 central differences."""

from __future__ import annotations

import re

import numpy as np
import pytest
from support.twin_cells import TWINS, outputs_and_grads, twin_params

import arrayrnn as ar
from arrayrnn import cellmath as cm
from arrayrnn.cells import cifg
from arrayrnn.core.cell_registry import CellDefinitionError


def _tanh_forward(pre, h):
    y = cm.tanh(pre)
    return (y,), (y,)


def _tanh_backward(res, d_new):
    return d_new[0] * cm.dtanh(res[0]), 0.0


def _cell(name="probe_cell", **changes):
    fields = dict(gates=("a",), forward=_tanh_forward, backward=_tanh_backward)
    fields.update(changes)
    return ar.Cell(name, **fields)


@pytest.fixture
def registered():
    """Cells registered by a test, unregistered after it."""
    names = []

    def register(cell, **kw):
        names.append(cell.name)
        return ar.register_cell(cell, **kw)

    yield register
    for name in names:
        if name in ar.registered_cells():
            ar.unregister_cell(name)


# -- definitions ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("changes, words", [
    (dict(name="Upper"), "lowercase identifier"),
    (dict(name="lstm"), "built-in mode"),
    (dict(name="class"), "lowercase identifier"),
    (dict(gates=()), "at least one"),
    (dict(gates=("a", "a")), "distinct"),
    (dict(gates=("a",), states=("c", "h")), "first state must be 'h'"),
    (dict(split=("b",)), "not gates"),
    (dict(forward=3), "expected a function"),
])
def test_bad_definitions_name_the_cell_and_the_fix(changes, words):
    name = changes.pop("name", "probe_cell")
    with pytest.raises(CellDefinitionError, match=words) as info:
        _cell(name, **changes)
    assert repr(name) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_a_forward_of_the_wrong_shape_is_refused():
    with pytest.raises(CellDefinitionError, match=r"'probe_cell': forward returned .*pair"):
        _cell(forward=lambda pre, h: cm.tanh(pre))
    with pytest.raises(CellDefinitionError, match="returned 2 new states; expected 1"):
        _cell(forward=lambda pre, h: ((pre, pre), ()))
    with pytest.raises(CellDefinitionError, match=r"backward returned 1 values; expected a tuple of 2"):
        _cell(backward=lambda res, d: (d[0],))
    with pytest.raises(CellDefinitionError, match="forward failed on float inputs with NameError"):
        _cell(forward=lambda pre, h: ((undefined_name,), ()))  # noqa: F821


def test_argument_names_and_counts():
    cell = TWINS["gru"]
    assert cell.input_names == ("r", "z", "n_x", "n_h")
    assert cell.argument_names == ("r", "z", "n_x", "n_h", "h")
    assert (cell.num_inputs, cell.num_residuals) == (4, 5)
    assert (cell.split_index("n"), cell.split_index("r")) == (0, None)
    assert cifg.CIFG.num_residuals == 5


# -- registry -------------------------------------------------------------------------------------------
def test_registry(registered):
    cell = _cell("probe_registry")
    assert registered(cell) is cell
    assert ar.register_cell(cell) is cell  # the same object again: a no-op
    other = _cell("probe_registry")
    with pytest.raises(ValueError, match="'probe_registry' is already registered; pass replace=True"):
        ar.register_cell(other)
    assert registered(other, replace=True) is other
    assert ar.RNNSpec("probe_registry", 2, 3).custom_cell is other
    assert "cifg" in ar.registered_cells() and "probe_registry" in ar.registered_cells()
    with pytest.raises(TypeError, match="expected an arrayrnn.Cell"):
        ar.register_cell("probe")
    with pytest.raises(ValueError, match="no cell named 'never_registered'"):
        ar.unregister_cell("never_registered")


# -- the spec -------------------------------------------------------------------------------------------
def test_spec_sizes_of_a_custom_cell():
    spec = ar.RNNSpec("cifg", input_size=5, hidden_size=4, num_layers=2, bidirectional=True)
    assert spec.custom_cell is cifg.CIFG and ar.RNNSpec("lstm", 5, 4).custom_cell is None
    assert (spec.gates, spec.gate_names, spec.gate_size, spec.split_gates) == (3, ("f", "g", "o"), 12, ())
    assert spec.has_cell and spec.cell_width == 4 and spec.state_shape(7, cell=True) == (4, 7, 4)
    three = ar.Cell("probe_three", gates=("a",), states=("h", "u", "v"),
                    forward=lambda a, h, u, v: ((cm.tanh(a), u, v), ()),
                    backward=lambda res, d: (d[0], 0.0, d[1], d[2]))
    ar.register_cell(three)
    try:
        s3 = ar.RNNSpec("probe_three", 2, 3)
        assert s3.cell_width == 6 and s3.state_shape(2, cell=True) == (1, 2, 6)
    finally:
        ar.unregister_cell("probe_three")
    assert ar.RNNSpec.from_dict(spec.to_dict()) == spec
    assert ar.RNNSpec("gru", 2, 3).split_gates == ("n",)
    assert ar.RNNSpec("gru", 2, 3, reset_after=False).split_gates == ()


def test_spec_refuses_unknown_modes_and_builtin_only_options():
    with pytest.raises(ValueError, match=r"mode = 'nope'; expected one of .*registered: \(.*'cifg'"):
        ar.RNNSpec("nope", 2, 3)
    with pytest.raises(ValueError, match="zoneout = 0.1 with the custom cell mode = 'cifg'"):
        ar.RNNSpec("cifg", 2, 3, zoneout=0.1)
    with pytest.raises(ValueError, match="layer_norm = True with the custom cell mode = 'cifg'"):
        ar.RNNSpec("cifg", 2, 3, layer_norm=True)
    for field, value in (("proj_size", 1), ("cell_clip", 1.0), ("peepholes", True)):
        with pytest.raises(ValueError, match=f"{field} = .* with mode = 'cifg'"):
            ar.RNNSpec("cifg", 2, 3, **{field: value})


def test_cudnn_declines_custom_cells():
    from arrayrnn.engines.cudnn.config import refusal
    assert "custom cell" in refusal(ar.RNNSpec("cifg", 2, 3))
    assert refusal(ar.RNNSpec("lstm", 2, 3)) is None


# -- check_cell -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("cell", ["cifg", *[c.name for c in TWINS.values()]])
def test_check_cell_accepts_right_backwards(cell):
    errors = ar.check_cell(cell)
    assert set(errors) == set(ar.RNNSpec(cell, 1, 1).custom_cell.argument_names)
    assert max(errors.values()) < 1e-7


def _cifg_backward_wrong_f(res, d_new):
    df, dg, do, dh, dc = cifg.backward(res, d_new)
    return -df, dg, do, dh, dc


def _gru_backward_wrong_n_h(res, d_new):
    *grads, dh = TWINS["gru"].backward(res, d_new)
    grads[3] = grads[3] * 1.001
    return (*grads, dh)


@pytest.mark.parametrize("cell, named", [
    (ar.Cell("probe_wrong", gates=("f", "g", "o"), states=("h", "c"), forward=cifg.forward,
             backward=_cifg_backward_wrong_f), "'f' (forward argument 0)"),
    (ar.Cell("probe_wrong", gates=("r", "z", "n"), split=("n",), forward=TWINS["gru"].forward,
             backward=_gru_backward_wrong_n_h), "'n_h' (forward argument 3)"),
])
def test_check_cell_names_the_first_wrong_cotangent(cell, named):
    expected = re.escape("cell 'probe_wrong': backward's cotangent of " + named)
    with pytest.raises(ar.CellCheckError, match=expected):
        ar.check_cell(cell)


def test_check_cell_refuses_bad_arguments_and_non_finite_forwards():
    with pytest.raises(ValueError, match=r"ranges names \['q'\], not arguments of cell 'cifg'"):
        ar.check_cell("cifg", ranges={"q": (0, 1)})
    with pytest.raises(ValueError, match="cell = 'nope'; expected an arrayrnn.Cell or the name"):
        ar.check_cell("nope")
    log_cell = _cell("probe_log", forward=lambda pre, h: ((cm.log(pre),), (pre,)),
                     backward=lambda res, d: (d[0] / res[0], 0.0))
    with np.errstate(invalid="ignore"):
        with pytest.raises(ar.CellCheckError, match="new 'h' is not finite .* pass ranges="):
            ar.check_cell(log_cell)
    assert ar.check_cell(log_cell, ranges={"a": (0.5, 2.0)})["a"] < 1e-6


# -- custom cells on the reference engine ---------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("mode", list(TWINS))
@pytest.mark.parametrize("variant", [{}, {"recurrent_dropout": 0.3, "weight_dropout": 0.2, "dropout": 0.25}])
def test_twins_give_the_builtin_cells_bits_on_the_reference_engine(mode, dtype, variant):
    spec = ar.RNNSpec(mode, input_size=5, hidden_size=6, num_layers=2, bidirectional=True, dtype=dtype,
                      **variant)
    params = ar.PackedParams.init(spec, seed=3)
    x = np.random.default_rng(1).standard_normal((7, 4, 5)).astype(dtype)
    lengths = np.array([7, 0, 2, 5])
    for training in (False, True):
        builtin = outputs_and_grads(params, x, lengths, training, "reference")
        twin = outputs_and_grads(twin_params(params), x, lengths, training, "reference")
        for a, b in zip(builtin, twin, strict=True):
            assert (a is None and b is None) or np.array_equal(a, b)


def _torch_cifg(W_ih, W_hh, b_ih, b_hh, x, h, c):
    """CIFG from Greff et al.'s equations, one layer, one direction, as a PyTorch autograd loop."""
    import torch
    ys = []
    for t in range(x.shape[0]):
        f, g, o = (x[t] @ W_ih.T + b_ih + h @ W_hh.T + b_hh).chunk(3, dim=1)
        f, g, o = torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
        c = f * c + (1 - f) * g
        h = o * torch.tanh(c)
        ys.append(h)
    return torch.stack(ys), h, c


def test_cifg_against_a_pytorch_loop():
    torch = pytest.importorskip("torch")
    spec = ar.RNNSpec("cifg", input_size=3, hidden_size=5, dtype="float64")
    params = ar.PackedParams.init(spec, seed=2)
    rng = np.random.default_rng(4)
    x, h0, c0 = rng.standard_normal((6, 2, 3)), rng.standard_normal((1, 2, 5)), rng.standard_normal((1, 2, 5))
    r = ar.rnn_forward(params, x, h0=h0, c0=c0, training=True, engine="reference")
    dy = rng.standard_normal(r.y.shape)
    g = ar.rnn_backward(r, dy=dy)
    tensors = [torch.tensor(a, requires_grad=True) for a in
               (*(params.view(0, 0, n) for n in ("W_ih", "W_hh", "b_ih", "b_hh")), x, h0[0], c0[0])]
    y, h_n, c_n = _torch_cifg(*tensors)
    (y * torch.from_numpy(dy)).sum().backward()
    np.testing.assert_allclose(r.y, y.detach().numpy(), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(r.c_n[0], c_n.detach().numpy(), rtol=1e-12, atol=1e-13)
    expected = [t.grad.numpy() for t in tensors]
    got = [g.dparams.view(0, 0, n) for n in ("W_ih", "W_hh", "b_ih", "b_hh")] + [g.dx, g.dh0[0], g.dc0[0]]
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("engine", ["reference", "numba"])
def test_cifg_gradients_against_central_differences(engine):
    spec = ar.RNNSpec("cifg", input_size=2, hidden_size=3, num_layers=2, bidirectional=True, dtype="float64")
    params = ar.PackedParams.init(spec, seed=5)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 3, 2))
    h0, c0 = rng.standard_normal(spec.state_shape(3)), rng.standard_normal(spec.state_shape(3, cell=True))
    lengths = np.array([4, 0, 2])
    dy = rng.standard_normal((4, 3, 6))
    dh_n, dc_n = rng.standard_normal(h0.shape), rng.standard_normal(c0.shape)

    def loss(data, x, h0, c0):
        r = ar.rnn_forward(ar.PackedParams(spec, data), x, lengths=lengths, h0=h0, c0=c0, engine=engine)
        return float((r.y * dy).sum() + (r.h_n * dh_n).sum() + (r.c_n * dc_n).sum())

    r = ar.rnn_forward(params, x, lengths=lengths, h0=h0, c0=c0, training=True, engine=engine)
    g = ar.rnn_backward(r, dy=dy, dh_n=dh_n, dc_n=dc_n)
    args = [params.data, x, h0, c0]
    for k, analytic in enumerate((g.dparams.data, g.dx, g.dh0, g.dc0)):
        for v in rng.standard_normal((3, args[k].size)):
            step = 1e-6 * v.reshape(args[k].shape)
            up = loss(*[a + step if i == k else a for i, a in enumerate(args)])
            down = loss(*[a - step if i == k else a for i, a in enumerate(args)])
            np.testing.assert_allclose((analytic * v.reshape(analytic.shape)).sum(), (up - down) / 2e-6,
                                       rtol=1e-6, atol=1e-8)
