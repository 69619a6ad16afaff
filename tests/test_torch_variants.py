"""The cell variants (recurrent dropout, DropConnect, zoneout, peepholes) on arrayrnn.torch's modules.

Oracles: ``ar.rnn_forward`` / ``ar.rnn_backward`` on the reference engine with the seed the module drew
from torch's generator (so the masks ``ar.cell_masks`` documents), and float64 finite differences
(``torch.autograd.gradcheck``) for the deterministic cases (peepholes, eval-mode zoneout).
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

import arrayrnn as ar
from arrayrnn.torch import GRU, LSTM, RNN, ArrayRNN

CLASSES = {"lstm": LSTM, "gru": GRU, "rnn_tanh": RNN}
T, B, I, H = 5, 3, 4, 3


@pytest.fixture(autouse=True)
def fresh_compiler_caches():
    yield
    torch.compiler.reset()


def variants(mode: str) -> dict:
    """Every variant the mode has, on."""
    options = {"recurrent_dropout": 0.3, "weight_dropout": 0.4, "zoneout": 0.25}
    if mode == "lstm":
        options.update(zoneout_cell=0.15, peepholes=True)
    return options


def build(mode: str, **options):
    torch.manual_seed(1)
    return CLASSES[mode](I, H, num_layers=2, bidirectional=True, dropout=0.2, dtype=torch.float64, **options)


def inputs(mode: str, requires_grad: bool = True):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(T, B, I, generator=g, dtype=torch.float64, requires_grad=requires_grad)
    h0 = torch.randn(4, B, H, generator=g, dtype=torch.float64, requires_grad=requires_grad)
    c0 = torch.randn(4, B, H, generator=g, dtype=torch.float64, requires_grad=requires_grad)
    return x, h0, (c0 if mode == "lstm" else None)


def call(module, x, h0, c0, lengths=None):
    hx = (h0, c0) if c0 is not None else h0
    y, states = module(x, hx, lengths=lengths)
    h_n, c_n = states if c0 is not None else (states, None)
    return y, h_n, c_n


def oracle(module, mode, x, h0, c0, training, seed, lengths, cotangents):
    """rnn_forward / rnn_backward on the reference engine with the module's weights and ``seed``."""
    spec = ar.RNNSpec(mode=mode, input_size=I, hidden_size=H, num_layers=2, bidirectional=True, dropout=0.2,
                      dtype="float64", **variants(mode))
    if not training:  # eval mode: the dropouts are off, zoneout is its expectation
        spec = spec.replace(dropout=0.0, recurrent_dropout=0.0, weight_dropout=0.0)
    params = ar.PackedParams(spec, module.flat.numpy().copy())
    host = [t.detach().numpy() if t is not None else None for t in (x, h0, c0)]
    res = ar.rnn_forward(params, host[0], lengths, host[1], host[2], training=training, seed=seed,
                         engine="reference")
    dy, dh, dc = (t.numpy() if t is not None else None for t in cotangents)
    return res, ar.rnn_backward(res, dy, dh, dc)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("mode", list(CLASSES))
def test_outputs_and_every_gradient_equal_rnn_forward_backward(mode, training):
    module = build(mode, **variants(mode)).train(training)
    x, h0, c0 = inputs(mode)
    lengths = np.array([T, 2, 4])
    torch.manual_seed(7)
    y, h_n, c_n = call(module, x, h0, c0, torch.as_tensor(lengths))
    torch.manual_seed(7)  # the seed the module drew: torch's generator reproduces the call
    seed = int(torch.randint(0, 2**31 - 1, ())) if training else None
    g = torch.Generator().manual_seed(3)
    cot = [torch.randn(t.shape, generator=g, dtype=torch.float64) if t is not None else None
           for t in (y, h_n, c_n)]
    torch.autograd.backward([t for t in (y, h_n, c_n) if t is not None],
                            [c for c in cot if c is not None])
    res, grads = oracle(module, mode, x, h0, c0, training, seed, lengths, cot)
    np.testing.assert_allclose(y.detach().numpy(), res.y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(h_n.detach().numpy(), res.h_n, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(x.grad.numpy(), grads.dx, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(h0.grad.numpy(), grads.dh0, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(module.flat_grad.numpy(), grads.dparams.data, rtol=1e-10, atol=1e-12)
    for layer, direction in [(0, 0), (0, 1), (1, 0), (1, 1)]:
        suffix = f"l{layer}{'_reverse' if direction else ''}"
        np.testing.assert_allclose(getattr(module, f"weight_hh_{suffix}").grad.numpy(),
                                   grads.dparams.view(layer, direction, "W_hh"), rtol=1e-10, atol=1e-12)
        if mode == "lstm":
            np.testing.assert_allclose(getattr(module, f"weight_peephole_{suffix}").grad.numpy(),
                                       grads.dparams.view(layer, direction, "P"), rtol=1e-10, atol=1e-12)
    if mode == "lstm":
        np.testing.assert_allclose(c_n.detach().numpy(), res.c_n, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(c0.grad.numpy(), grads.dc0, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("option", ["recurrent_dropout", "weight_dropout", "zoneout"])
def test_one_layer_without_dropout_still_draws_its_seed_from_torch(option):
    """The seed is drawn for every training-time variant, not only for inter-layer dropout (before: a
    one-layer module left the seed to arrayrnn, and torch.manual_seed did not reproduce the call)."""
    module = GRU(I, H, dtype=torch.float64, **{option: 0.5})
    x = inputs("gru", requires_grad=False)[0]
    torch.manual_seed(0)
    first = module(x)[0]
    torch.manual_seed(0)
    assert torch.equal(module(x)[0], first)
    assert not torch.equal(module(x)[0], first)  # a new seed, new masks
    assert not torch.allclose(module.eval()(x)[0], first)


def test_eval_zoneout_with_a_backward_is_the_inference_result_and_its_gradient():
    """An eval-mode forward that a backward follows keeps its cache with training=True; with zoneout that
    drew training masks (0/1) instead of the expectation (before the fix: a different result)."""
    module = build("lstm", zoneout=0.4, zoneout_cell=0.3).eval()
    x, h0, c0 = inputs("lstm")
    with torch.no_grad():
        expected = call(module, x, h0, c0)
    y, h_n, c_n = call(module, x, h0, c0)  # inputs require grad: the cache-keeping path
    for got, want in zip((y, h_n, c_n), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    spec = ar.RNNSpec(mode="lstm", input_size=I, hidden_size=H, num_layers=2, bidirectional=True,
                      dtype="float64", zoneout=0.4, zoneout_cell=0.3)
    params = ar.PackedParams(spec, module.flat.numpy().copy())
    host = [t.detach().numpy() for t in (x, h0, c0)]
    res = ar.rnn_forward(params, *host[:1], None, *host[1:], engine="reference")
    np.testing.assert_allclose(y.detach().numpy(), res.y, rtol=1e-12, atol=1e-12)
    y.sum().backward()
    grads = ar.rnn_backward(res, np.ones_like(res.y))
    np.testing.assert_allclose(x.grad.numpy(), grads.dx, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(module.flat_grad.numpy(), grads.dparams.data, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("options", [{"peepholes": True}, {"zoneout": 0.3, "zoneout_cell": 0.2},
                                     {"peepholes": True, "zoneout": 0.3, "recurrent_dropout": 0.5,
                                      "weight_dropout": 0.5}], ids=["peepholes", "zoneout", "all"])
def test_gradcheck_deterministic_cases(options):
    """Eval mode: peepholes and zoneout's expectation are deterministic (the dropouts are off)."""
    torch.manual_seed(1)
    module = LSTM(2, 2, num_layers=2, bidirectional=True, dtype=torch.float64, **options).eval()
    names = module._flat_weights_names
    assert any("peephole" in n for n in names) == bool(options.get("peepholes"))
    g = torch.Generator().manual_seed(4)
    x, h0, c0 = (torch.randn(shape, generator=g, dtype=torch.float64, requires_grad=True)
                 for shape in ((3, 2, 2), (4, 2, 2), (4, 2, 2)))

    def outputs(x, h0, c0, weights):
        parameters = dict(zip(names, weights, strict=True))
        y, (h_n, c_n) = torch.func.functional_call(module, parameters, (x, (h0, c0)))
        return y, h_n, c_n

    own = [getattr(module, n) for n in names]
    assert torch.autograd.gradcheck(lambda x, h0, c0: outputs(x, h0, c0, own), (x, h0, c0))
    weights = tuple(w.detach().clone().requires_grad_() for w in own)
    assert torch.autograd.gradcheck(lambda *ws: outputs(x.detach(), h0.detach(), c0.detach(), ws), weights)


@pytest.mark.parametrize("cls,kwargs,match", [
    (LSTM, {"recurrent_dropout": -0.1}, "recurrent_dropout = -0.1"),
    (GRU, {"weight_dropout": 1.0}, "weight_dropout = 1.0"),
    (RNN, {"zoneout": 1.5}, "zoneout = 1.5"),
    (LSTM, {"zoneout_cell": -1}, "zoneout_cell = -1"),
    (GRU, {"peepholes": True}, "peepholes = True with mode = 'gru'"),
    (RNN, {"peepholes": True}, "peepholes = True with mode = 'rnn_tanh'"),
    (GRU, {"zoneout_cell": 0.2}, "zoneout_cell = 0.2"),
    (LSTM, {"peepholes": 1}, "peepholes = 1"),
])
def test_bad_values_name_the_argument(cls, kwargs, match):
    with pytest.raises(ValueError, match=match.replace("(", r"\(")):
        cls(I, H, **kwargs)
    mode = {LSTM: "lstm", GRU: "gru", RNN: "rnn"}[cls]
    with pytest.raises(ValueError, match=match.replace("(", r"\(")):
        ArrayRNN(mode, I, H, **kwargs)


def test_unknown_keyword_and_spec_with_options_are_refused():
    with pytest.raises(TypeError, match="zonout"):
        ArrayRNN("lstm", I, H, zonout=0.1)
    with pytest.raises(ValueError, match="peepholes"):
        ArrayRNN(ar.RNNSpec(mode="lstm", input_size=I, hidden_size=H), peepholes=True)


def test_peepholes_are_views_of_the_one_flat_buffer_in_the_layout_order():
    module = LSTM(I, H, num_layers=2, bidirectional=True, proj_size=2, peepholes=True)
    spec = ar.RNNSpec(mode="lstm", input_size=I, hidden_size=H, num_layers=2, bidirectional=True, proj_size=2,
                      peepholes=True)
    assert module.flat.numel() == ar.layout_of(spec).size
    params = ar.PackedParams(spec, module.flat.numpy())
    for layer in range(2):
        for direction, suffix in ((0, ""), (1, "_reverse")):
            w = getattr(module, f"weight_peephole_l{layer}{suffix}")
            assert w.shape == (3, H)
            assert w.untyped_storage().data_ptr() == module.flat.untyped_storage().data_ptr()
            np.testing.assert_array_equal(w.detach().numpy(), params.view(layer, direction, "P"))
    assert "peepholes=True" in repr(module) and "zoneout" not in repr(module)
    assert repr(GRU(I, H, num_layers=2)) == repr(torch.nn.GRU(I, H, num_layers=2))  # nothing added when off


def test_the_options_survive_state_dict_and_save_load():
    module = build("lstm", **variants("lstm"))
    assert {f"weight_peephole_l{k}" for k in ("0", "0_reverse", "1", "1_reverse")} <= set(module.state_dict())
    other = build("lstm", **variants("lstm"))
    with torch.no_grad():
        other.flat.zero_()
    other.load_state_dict(module.state_dict())
    torch.testing.assert_close(other.flat, module.flat, rtol=0, atol=0)
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    assert {n: getattr(loaded, n) for n in variants("lstm")} == variants("lstm")
    x, h0, c0 = inputs("lstm", requires_grad=False)
    torch.manual_seed(5)
    first = call(module, x, h0, c0)
    torch.manual_seed(5)
    second = call(loaded, x, h0, c0)
    for a, b in zip(first, second, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    array = ArrayRNN("gru", I, H, zoneout=0.2, recurrent_dropout=0.1, seed=0)
    buffer = io.BytesIO()
    torch.save(array, buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True).spec.zoneout == 0.2


def test_array_rnn_takes_the_options_and_draws_its_seed_from_torch():
    module = ArrayRNN("lstm", I, H, peepholes=True, weight_dropout=0.5, seed=0, dtype=torch.float64)
    assert module.spec.peepholes and module.spec.weight_dropout == 0.5
    assert "weight_peephole_l0" in module.state_dict()
    x = torch.randn(T, B, I, dtype=torch.float64)
    torch.manual_seed(3)
    first = module(x)[0]
    torch.manual_seed(3)
    torch.testing.assert_close(module(x)[0], first, rtol=0, atol=0)
    seed = (torch.manual_seed(3), int(torch.randint(0, 2**31 - 1, ())))[1]
    res = ar.rnn_forward(ar.PackedParams(module.spec, module.flat.detach().numpy().copy()), x.numpy(),
                         training=True, seed=seed, engine="reference")
    np.testing.assert_allclose(first.detach().numpy(), res.y, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.usefixtures("dynamo_allow_rnn")
def test_torch_compile_runs_the_variants(training):
    """torch.compile sees the custom op (fullgraph: no graph break); the same seed gives the eager result and
    gradients (its backward op recomputes the forward: in eval mode with zoneout, as inference)."""
    module = build("lstm", **variants("lstm")).train(training)
    x, h0, c0 = inputs("lstm")
    compiled = torch.compile(module, backend="eager", fullgraph=True)
    results = []
    for run in (compiled, module):
        torch.manual_seed(9)
        y = run(x, (h0, c0))[0]
        results.append((y, *torch.autograd.grad(y.sum(), (x, h0, module.weight_peephole_l1))))
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("transform", ["double_backward", "func_grad"])
def test_the_torch_op_path_refuses_training_time_variants(transform):
    module = build("gru", recurrent_dropout=0.3)
    x, h0, _ = inputs("gru")
    with pytest.raises(ValueError, match="recurrent_dropout.*no zoneout, recurrent or weight dropout"):
        if transform == "double_backward":
            y = module(x, h0)[0]
            (gx,) = torch.autograd.grad(y.sum(), x, create_graph=True)
            gx.sum().backward()
        else:
            torch.func.grad(lambda x: module(x, h0)[0].sum())(x.detach())


def test_eval_mode_dropouts_are_off_on_the_torch_op_path():
    """Eval mode computes without recurrent / weight dropout, so the torch-op path (double backward) runs."""
    module = build("gru", recurrent_dropout=0.3, weight_dropout=0.3).eval()
    x, h0, _ = inputs("gru")
    y = module(x, h0)[0]
    (gx,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    plain = build("gru").eval()
    y_plain = plain(x, h0)[0]
    (gx_plain,) = torch.autograd.grad(y_plain.sum(), x, create_graph=True)
    torch.testing.assert_close(gx, gx_plain, rtol=0, atol=1e-13)
    torch.testing.assert_close(y, y_plain, rtol=0, atol=0)


def test_array_rnn_from_a_drop_in_keeps_its_variants_and_peepholes():
    module = build("lstm", **variants("lstm"))
    array = ArrayRNN.from_torch(module)
    assert {name: getattr(array.spec, name) for name in variants("lstm")} == variants("lstm")
    torch.testing.assert_close(array.flat.detach(), module.flat, rtol=0, atol=0)
    x, h0, c0 = inputs("lstm", requires_grad=False)
    for training in (True, False):
        module.train(training), array.train(training)
        torch.manual_seed(4)
        want = call(module, x, h0, c0)
        torch.manual_seed(4)
        y, (h_n, c_n) = array(x, (h0, c0))
        for got, expected in zip((y, h_n, c_n), want, strict=True):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_the_dropouts_and_zoneout_may_be_reassigned_but_not_peepholes():
    module = GRU(I, H, dtype=torch.float64)
    x = inputs("gru", requires_grad=False)[0]
    plain = module(x)[0]
    module.zoneout = 0.5
    assert "zoneout=0.5" in repr(module)
    assert not torch.allclose(module.eval()(x)[0], plain)
    with pytest.raises(AttributeError, match="peepholes = True"):
        LSTM(I, H).peepholes = True
