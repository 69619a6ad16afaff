"""Layer normalisation (issue 38) through the adapters: ``arrayrnn.nn``, ``arrayrnn.torch``'s drop-ins and
``ArrayRNN``, the JAX adapter, ``ar.save`` / ``ar.load``, the demo's ``--layer-norm``; and the engine choice.

Oracle: the torch-ops float64 implementation of the issue's formulas (tests/support/layer_norm_oracle.py,
``torch.nn.functional.layer_norm``, not arrayrnn's code): values to 1e-12 and every gradient through
torch's autograd; ``torch.autograd.gradcheck`` / ``gradgradcheck`` (central differences) for the torch-op
path that serves double backward.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from support.layer_norm_oracle import run as run_torch_oracle

import arrayrnn as ar
from arrayrnn import demo, engines
from arrayrnn import nn as arnn
from arrayrnn.engines.cudnn import config as cudnn_config
from arrayrnn.torch import GRU, LSTM, RNN, ArrayRNN

T, B, I, H = 4, 3, 3, 4
LENGTHS = np.array([4, 1, 3])
TOL = dict(rtol=1e-12, atol=1e-12)
DROP_INS = {  # mode, class, constructor options, the spec's own fields
    "lstm-proj-peep": ("lstm", LSTM, dict(proj_size=2, peepholes=True)),
    "gru": ("gru", GRU, {}),
    "rnn_relu": ("rnn_relu", RNN, dict(nonlinearity="relu")),
}


def drop_in(case: str, **extra):
    mode, cls, options = DROP_INS[case]
    torch.manual_seed(3)
    module = cls(I, H, num_layers=2, bidirectional=True, layer_norm=True, dtype=torch.float64, **options,
                 **extra)
    with torch.no_grad():  # gains and shifts away from their ones and zeros, so the test sees them
        for name, p in module.named_parameters():
            if name.startswith("layer_norm"):
                p.add_(0.3 * torch.randn_like(p))
    return module


def spec_of(module) -> ar.RNNSpec:
    return module._spec("float64", float(module.dropout))


def states(spec: ar.RNNSpec):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(T, B, I, generator=g, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(spec.state_shape(B), generator=g, dtype=torch.float64, requires_grad=True)
    c0 = (torch.randn(spec.state_shape(B, cell=True), generator=g, dtype=torch.float64, requires_grad=True)
          if spec.has_cell else None)
    return x, h0, c0


# -- arrayrnn.torch -----------------------------------------------------------------------------------
@pytest.mark.parametrize("case", list(DROP_INS))
def test_drop_in_values_and_every_gradient_equal_the_torch_ops_oracle(case):
    module = drop_in(case)
    spec = spec_of(module)
    assert isinstance(module, getattr(torch.nn, type(module).__name__)) and spec.layer_norm
    x, h0, c0 = states(spec)
    y, hx = module(x, (h0, c0) if c0 is not None else h0, lengths=torch.tensor(LENGTHS))
    h_n, c_n = hx if c0 is not None else (hx, None)
    rng = np.random.default_rng(5)
    cot = {"y": rng.standard_normal(y.shape), "h_n": rng.standard_normal(h_n.shape),
           "c_n": rng.standard_normal(c_n.shape) if c_n is not None else None}
    loss = sum((out * torch.tensor(cot[k])).sum() for k, out in (("y", y), ("h_n", h_n), ("c_n", c_n))
               if out is not None)
    loss.backward()
    params = ar.PackedParams(spec, module.flat.detach().numpy().copy())
    host = [t.detach().numpy() if t is not None else None for t in (x, h0, c0)]
    oracle = run_torch_oracle(params, host[0], LENGTHS, host[1], host[2], 0, False, cot)
    for name, out in (("y", y), ("h_n", h_n), ("c_n", c_n)):
        if out is not None:
            np.testing.assert_allclose(out.detach().numpy(), oracle.outputs[name], **TOL, err_msg=name)
    np.testing.assert_allclose(module.flat_grad.numpy(), oracle.grads["params"], **TOL)
    for name, t in (("x", x), ("h0", h0), ("c0", c0)):
        if t is not None:
            np.testing.assert_allclose(t.grad.numpy(), oracle.grads[name], **TOL, err_msg=name)
    assert np.abs(params.view(1, 1, "g_hh")).min() > 0 and np.abs(oracle.grads["params"]).max() > 0


def test_the_layer_norm_parameters_are_views_of_the_flat_buffer_ones_and_zeros_at_first():
    module = LSTM(I, H, num_layers=2, bidirectional=True, proj_size=2, peepholes=True, layer_norm=True)
    spec = spec_of(module).replace(dtype="float32")
    assert module.flat.numel() == ar.layout_of(spec).size
    params = ar.PackedParams(spec, module.flat.numpy())
    names = {"g_ih": "layer_norm_weight_ih", "g_hh": "layer_norm_weight_hh", "g_c": "layer_norm_weight_c",
             "b_c": "layer_norm_bias_c"}
    for layer in range(2):
        for direction, suffix in ((0, ""), (1, "_reverse")):
            for block, key in names.items():
                w = getattr(module, f"{key}_l{layer}{suffix}")
                assert w.untyped_storage().data_ptr() == module.flat.untyped_storage().data_ptr()
                np.testing.assert_array_equal(w.detach().numpy(), params.view(layer, direction, block))
                np.testing.assert_array_equal(w.detach().numpy(), 0.0 if block == "b_c" else 1.0)
    assert module.layer_norm_weight_hh_l0.shape == (4 * H,) and module.layer_norm_weight_c_l0.shape == (H,)
    assert "layer_norm=True" in repr(module) and "layer_norm_eps" not in repr(module)
    gru = GRU(I, H, layer_norm=True, layer_norm_eps=1e-3)
    assert gru.layer_norm_weight_ih_l0.shape == (3 * H,) and not hasattr(gru, "layer_norm_weight_c_l0")
    assert "layer_norm_eps=0.001" in repr(gru) and spec_of(gru).layer_norm_eps == 1e-3


def test_layer_norm_is_fixed_at_construction_and_bad_values_name_the_argument():
    module = GRU(I, H, layer_norm=True)
    with pytest.raises(AttributeError, match=r"layer_norm = False: the layer_norm weights are fixed"):
        module.layer_norm = False
    with pytest.raises(ValueError, match=r"layer_norm = 1; expected True or False"):
        LSTM(I, H, layer_norm=1)
    with pytest.raises(ValueError, match=r"layer_norm_eps = 0.0; expected a finite float > 0"):
        RNN(I, H, layer_norm=True, layer_norm_eps=0.0)


def test_to_torch_and_from_torch_refuse_with_the_reason_array_rnn_keeps_it():
    module = drop_in("gru")
    with pytest.raises(ValueError, match=r"layer_norm=True; .*nn\.(LSTM|GRU|RNN)"):
        ar.from_torch(module)
    with pytest.raises(ValueError, match=r"layer_norm = True has no PyTorch equivalent"):
        ar.to_torch_state_dict(ar.PackedParams.init(spec_of(module), seed=0))
    array = ArrayRNN.from_torch(module)
    assert array.spec.layer_norm and "layer_norm_weight_hh_l1_reverse" in array.state_dict()
    torch.testing.assert_close(array.flat.detach(), module.flat, rtol=0, atol=0)
    x = torch.randn(T, B, I, dtype=torch.float64)
    torch.testing.assert_close(array(x)[0], module(x)[0], rtol=0, atol=0)


def test_state_dict_and_torch_save_round_trip(tmp_path):
    module = drop_in("lstm-proj-peep")
    other = LSTM(I, H, num_layers=2, bidirectional=True, proj_size=2, peepholes=True, layer_norm=True,
                 dtype=torch.float64)
    other.load_state_dict(module.state_dict())
    torch.testing.assert_close(other.flat, module.flat, rtol=0, atol=0)
    torch.save(module, tmp_path / "module.pt")
    loaded = torch.load(tmp_path / "module.pt", weights_only=True)
    assert loaded.layer_norm and spec_of(loaded) == spec_of(module)
    x = torch.randn(T, B, I, dtype=torch.float64)
    torch.testing.assert_close(loaded(x)[0], module(x)[0], rtol=0, atol=0)


def test_double_backward_runs_the_torch_op_recurrence_to_central_differences():
    """create_graph=True re-runs the forward in torch operations (adapters/torch_recurrence.py, with layer
    norm): gradcheck and gradgradcheck of the reset-before GRU and the LSTM in float64."""
    for module in (ArrayRNN(ar.RNNSpec("gru", 2, 3, reset_after=False, layer_norm=True, dtype="float64"),
                            seed=1),
                   LSTM(2, 3, layer_norm=True, peepholes=True, dtype=torch.float64)):
        x = torch.randn(3, 2, 2, dtype=torch.float64, requires_grad=True)

        def f(x, module=module):
            return module(x)[0]

        assert torch.autograd.gradcheck(f, (x,))
        assert torch.autograd.gradgradcheck(f, (x,))


@pytest.mark.filterwarnings("ignore")
def test_onnx_export_writes_the_normalised_recurrence_in_elementary_operators(tmp_path):
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    module = ArrayRNN(ar.RNNSpec("lstm", 3, 4, bidirectional=True, layer_norm=True, peepholes=True),
                      seed=0).eval()
    with torch.no_grad():
        module.flat.add_(0.1 * torch.randn_like(module.flat))
    x = torch.randn(5, 2, 3)
    path = str(tmp_path / "m.onnx")
    torch.onnx.export(module, (x,), dynamo=True, verbose=False).save(path)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    y, (h, c) = module(x)
    for a, b in zip(got, (y, h, c), strict=True):
        np.testing.assert_allclose(a, b.detach().numpy(), atol=1e-5)


# -- arrayrnn.nn, save / load, the engine choice ---------------------------------------------------------
@pytest.mark.parametrize("layer, fields", [
    (lambda: arnn.LSTM(I, H, 2, bidirectional=True, layer_norm=True, dtype="float64"), dict(mode="lstm")),
    (lambda: arnn.GRU(I, H, reset_after=False, layer_norm=True, layer_norm_eps=1e-3, dtype="float64"),
     dict(mode="gru", reset_after=False, layer_norm_eps=1e-3)),
    (lambda: arnn.RNN(I, H, nonlinearity="relu", layer_norm=True, dtype="float64"), dict(mode="rnn_relu")),
], ids=["lstm", "gru", "rnn"])
def test_nn_layers_take_layer_norm_and_equal_the_oracle(layer, fields):
    layer = layer()
    assert layer.spec.layer_norm and all(getattr(layer.spec, k) == v for k, v in fields.items())
    layer.params.data[:] += 0.2 * np.random.default_rng(0).standard_normal(layer.params.data.shape)
    x = np.random.default_rng(1).standard_normal((T, B, I))
    y, h_n, _ = layer(x, lengths=LENGTHS)
    h0 = np.zeros(layer.spec.state_shape(B))
    c0 = np.zeros(layer.spec.state_shape(B, cell=True)) if layer.spec.has_cell else None
    oracle = run_torch_oracle(layer.params, x, LENGTHS, h0, c0, 0, False, {"y": np.ones_like(y)})
    np.testing.assert_allclose(y, oracle.outputs["y"], **TOL)
    np.testing.assert_allclose(h_n, oracle.outputs["h_n"], **TOL)


def test_nn_layer_refuses_a_bad_layer_norm_value():
    with pytest.raises(ValueError, match=r"layer_norm = 'yes'; expected True or False"):
        arnn.LSTM(I, H, layer_norm="yes")
    with pytest.raises(ValueError, match=r"layer_norm_eps = -1e-05; expected a finite float > 0"):
        arnn.GRU(I, H, layer_norm=True, layer_norm_eps=-1e-5)


def test_save_and_load_round_trip_the_gains(tmp_path):
    spec = ar.RNNSpec("lstm", I, H, 2, bidirectional=True, proj_size=2, layer_norm=True,
                      layer_norm_eps=1e-4)
    params = ar.PackedParams.init(spec, seed=0)
    params.data[:] = np.random.default_rng(2).standard_normal(params.data.shape)
    ar.save(tmp_path / "ln.npz", params)
    loaded = ar.load(tmp_path / "ln.npz")
    assert loaded.spec == spec
    np.testing.assert_array_equal(loaded.data, params.data)
    np.testing.assert_array_equal(loaded.view(1, 1, "b_c"), params.view(1, 1, "b_c"))


@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh"])
def test_auto_takes_the_numba_engine_on_cpu_and_cudnn_gives_its_reason(mode):
    spec = ar.RNNSpec(mode, I, H, layer_norm=True)
    call = engines.probe_call(spec, training=True)
    assert engines.select_engine("auto", call).name == "numba"  # the suites compile in place (conftest)
    assert "layer_norm" in cudnn_config.refusal(spec)


# -- jax -----------------------------------------------------------------------------------------------
def test_jax_adapter_values_and_gradients_equal_the_oracle():
    jax = pytest.importorskip("jax")
    from arrayrnn.jax import rnn

    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        spec = ar.RNNSpec("lstm", I, H, bidirectional=True, peepholes=True, layer_norm=True, dtype="float64")
        params = ar.PackedParams.init(spec, seed=0)
        params.data[:] += 0.2 * np.random.default_rng(3).standard_normal(params.data.shape)
        x = np.random.default_rng(4).standard_normal((T, B, I))

        def loss(p, x):
            y, h_n, c_n = rnn(spec, p, x, LENGTHS)
            return y.sum() + h_n.sum() + c_n.sum()

        value, (d_params, d_x) = jax.value_and_grad(loss, argnums=(0, 1))(params.data, x)
        h0, c0 = np.zeros(spec.state_shape(B)), np.zeros(spec.state_shape(B, cell=True))
        cot = {"y": np.ones((T, B, 2 * H)), "h_n": np.ones(h0.shape), "c_n": np.ones(c0.shape)}
        oracle = run_torch_oracle(params, x, LENGTHS, h0, c0, 0, False, cot)
        expected = sum(oracle.outputs[k].sum() for k in cot)
        np.testing.assert_allclose(float(value), expected, **TOL)
        np.testing.assert_allclose(np.asarray(d_params), oracle.grads["params"], **TOL)
        np.testing.assert_allclose(np.asarray(d_x), oracle.grads["x"], **TOL)
    finally:
        jax.config.update("jax_enable_x64", previous)


# -- the demo ----------------------------------------------------------------------------------------
def test_the_demo_trains_with_and_without_layer_norm_and_saves_it(tmp_path):
    cfg = demo.Config(steps=4, hidden=8, embed=4, batch=4, seq_len=8, lr=1e-2, eval_chars=2048,
                      sample_chars=5, layer_norm=True)
    out = io.StringIO()
    result = demo.run_with_and_without(cfg, save=str(tmp_path / "m.npz"), progress=False, out=out)
    text = out.getvalue()
    assert "== without layer_norm\n" in text and "== with layer_norm=True" in text
    assert result["with"]["losses"] != result["without"]["losses"]
    model, _, loaded = demo.load_model(str(tmp_path / "m.npz"))
    assert loaded == cfg and model.lstm.spec.layer_norm


def test_the_demo_command_line_takes_layer_norm_and_refuses_a_non_bool(monkeypatch):
    with pytest.raises(demo.BadOption, match=r"layer_norm = 1; expected True or False"):
        demo.Config(layer_norm=1)
    seen = []
    monkeypatch.setattr(demo, "run_with_and_without", lambda cfg, **kwargs: seen.append(cfg))
    demo.main(["--layer-norm", "--steps", "1"])
    assert seen[0].layer_norm and seen[0].steps == 1
