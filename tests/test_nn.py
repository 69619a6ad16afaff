"""Layers: Dense (one packed buffer), Embedding, and the stateless LSTM / GRU / RNN, against PyTorch."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import arrayrnn as ar
from arrayrnn import nn, ops


def test_dense_packs_W_then_b_in_one_buffer_and_matches_torch_linear():
    layer = nn.Dense(5, 3, activation="tanh", seed=1)
    assert layer.params.shape == (3 * 5 + 3,)
    assert np.shares_memory(layer.W, layer.params) and np.shares_memory(layer.b, layer.params)
    np.testing.assert_array_equal(layer.params[:15].reshape(3, 5), layer.W)
    assert np.abs(layer.params).max() <= 1 / np.sqrt(5)
    x = np.random.default_rng(0).standard_normal((2, 4, 5)).astype(np.float32)
    W, b = (torch.from_numpy(a.copy()).requires_grad_() for a in (layer.W, layer.b))
    tx = torch.from_numpy(x).requires_grad_()
    out = torch.tanh(F.linear(tx, W, b))
    (out ** 2).sum().backward()
    np.testing.assert_allclose(layer(x), out.detach().numpy(), rtol=1e-6, atol=1e-6)
    g_params, g_x = ar.grad(lambda p, x: ops.sum(layer.apply(p, x) ** 2), argnums=(0, 1))(layer.params, x)
    np.testing.assert_allclose(g_params, np.concatenate([W.grad.numpy().ravel(), b.grad.numpy()]),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_x, tx.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_dense_without_bias():
    layer = nn.Dense(4, 2, bias=False, dtype="float64")
    assert layer.params.shape == (8,) and layer.b is None
    x = np.ones((3, 4))
    np.testing.assert_allclose(layer(x), x @ layer.W.T)


def test_embedding_gathers_rows_and_accumulates_repeated_ids_like_torch():
    emb = nn.Embedding(6, 3, seed=0)
    ids = np.array([[1, 5, 1], [0, 1, 2]])
    np.testing.assert_array_equal(emb(ids), emb.params[ids])
    t = torch.nn.Embedding(6, 3)
    t.weight.data = torch.from_numpy(emb.params.copy())
    (t(torch.from_numpy(ids)) ** 2).sum().backward()
    g = ar.grad(lambda table: ops.sum(emb.apply(table, ids) ** 2))(emb.params)
    np.testing.assert_allclose(g, t.weight.grad.numpy(), rtol=1e-6)


@pytest.mark.parametrize("layer_cls, kwargs, torch_cls", [
    (nn.LSTM, {}, torch.nn.LSTM),
    (nn.GRU, {}, torch.nn.GRU),
    (nn.RNN, {"nonlinearity": "relu"}, torch.nn.RNN),
])
def test_recurrent_layers_match_torch_modules(layer_cls, kwargs, torch_cls):
    layer = layer_cls(4, 5, 2, bidirectional=True, batch_first=True, seed=2, **kwargs)
    module = torch_cls(4, 5, 2, bidirectional=True, batch_first=True, **kwargs)
    module.load_state_dict(ar.to_torch_state_dict(layer.params))
    x = np.random.default_rng(0).standard_normal((3, 7, 4)).astype(np.float32)
    y, h_n, c_n = layer(x)
    expected = module(torch.from_numpy(x))
    np.testing.assert_allclose(y, expected[0].detach().numpy(), rtol=1e-5, atol=1e-5)
    t_h = expected[1][0] if layer_cls is nn.LSTM else expected[1]
    np.testing.assert_allclose(h_n, t_h.detach().numpy(), rtol=1e-5, atol=1e-5)
    assert (c_n is None) == (layer_cls is not nn.LSTM)


def test_stateless_layer_continues_from_the_state_the_caller_carries():
    lstm = nn.LSTM(3, 4, dtype="float64", seed=5)
    x = np.random.default_rng(1).standard_normal((8, 2, 3))
    y_all, h_all, c_all = lstm(x)
    y1, h, c = lstm(x[:5])
    y2, h, c = lstm(x[5:], h0=h, c0=c)
    np.testing.assert_allclose(np.concatenate([y1, y2]), y_all, rtol=1e-12)
    np.testing.assert_allclose(h, h_all, rtol=1e-12)
    h0, c0 = lstm.initial_state(2)
    assert h0.shape == (1, 2, 4) and c0.shape == (1, 2, 4) and not h0.any()


def test_recurrent_layer_gradient_is_a_packed_params_equal_to_rnn_backward():
    gru = nn.GRU(3, 4, seed=0)
    x = np.random.default_rng(2).standard_normal((5, 2, 3)).astype(np.float32)
    lengths = np.array([5, 2])
    g = ar.grad(lambda p: ops.sum(gru.apply(p, x, lengths)[0]))(gru.params)
    assert isinstance(g, ar.PackedParams) and g.spec == gru.spec
    res = ar.rnn_forward(gru.params, x, lengths=lengths, training=True)
    expected = ar.rnn_backward(res, dy=np.ones_like(res.y))
    np.testing.assert_allclose(g.data, expected.dparams.data, rtol=1e-6, atol=1e-6)


def test_layer_errors():
    with pytest.raises(ValueError, match="in_features = 0"):
        nn.Dense(0, 3)
    with pytest.raises(ValueError, match="embedding_dim = -1"):
        nn.Embedding(3, -1)
    with pytest.raises(ValueError, match="nonlinearity = 'gelu'"):
        nn.RNN(3, 4, nonlinearity="gelu")
    dense = nn.Dense(4, 2)
    with pytest.raises(ValueError, match=r"params has shape \(9,\); expected \(10,\)"):
        dense.apply(np.ones(9, np.float32), np.ones((1, 4), np.float32))
    with pytest.raises(TypeError, match="params has dtype float64; expected float32"):
        dense.apply(np.ones(10), np.ones((1, 4), np.float32))
    with pytest.raises(ValueError, match="index 7 is out of range"):
        nn.Embedding(7, 2)(np.array([7]))
    lstm = nn.LSTM(3, 4)
    with pytest.raises(ValueError, match="expected this layer's spec"):
        lstm.apply(nn.LSTM(3, 5).params, np.ones((2, 1, 3), np.float32))


def test_layers_accept_numpy_integer_sizes():
    dense = ar.nn.Dense(np.int64(3), np.int32(2))
    emb = ar.nn.Embedding(np.int64(5), np.int16(4))
    assert (dense.in_features, dense.out_features) == (3, 2) and type(dense.in_features) is int
    assert emb.params.shape == (5, 4) and type(emb.embedding_dim) is int
    with pytest.raises(ValueError, match="in_features = True"):
        ar.nn.Dense(True, 2)


@pytest.mark.parametrize(("build", "error", "message"), [
    (lambda: nn.Dense(3, 4, dtype="int64"), ValueError, r"dtype = 'int64'; expected one of \('float16'"),
    (lambda: nn.Dense(3, 4, dtype="bogus"), ValueError, r"dtype = 'bogus'; expected one of"),
    (lambda: nn.Embedding(3, 4, dtype="complex64"), ValueError, r"dtype = 'complex64'; expected one of"),
    (lambda: nn.Dense(3, 4, bias="yes"), ValueError, r"bias = 'yes'; expected True or False"),
    (lambda: nn.LSTM(3, 4, engine="bogus"), ValueError, r"LSTM: engine = 'bogus'; expected one of \('auto'"),
    (lambda: nn.GRU(3, 4, engine=3), ValueError, r"GRU: engine = 3; expected one of"),
    (lambda: nn.RNN(3, 4, batch_first="no"), ValueError, r"batch_first = 'no'; expected True or False"),
])
def test_layers_refuse_bad_options_when_built(build, error, message):
    """Used to be accepted: int/complex layers, bias='yes' and batch_first='no' as True, an unknown engine
    until the first call."""
    with pytest.raises(error, match=message):
        build()


def test_embedding_refuses_negative_ids_like_torch():
    """``take`` counts negative ids from the end: id -1 silently gathered the last row."""
    emb = nn.Embedding(5, 2)
    for ids in (np.array([0, -1]), [[-5]], np.array([-2], np.int8)):
        with pytest.raises(ValueError, match=r"Embedding: ids has the entry -\d; expected ids in 0..4"):
            emb(ids)
    torch = pytest.importorskip("torch")
    with pytest.raises(IndexError):                 # the oracle refuses them too
        torch.nn.Embedding(5, 2)(torch.tensor([-1]))
    np.testing.assert_array_equal(emb(np.array([4, 0])), emb.params[[4, 0]])


def test_recurrent_apply_and_initial_state_refuse_bad_arguments():
    lstm = nn.LSTM(3, 4)
    with pytest.raises(TypeError, match=r"LSTM: params has type ndarray; expected a PackedParams"):
        lstm.apply(lstm.params.data, np.ones((2, 1, 3), np.float32))
    for batch in (-1, 2.5, True, "2"):
        with pytest.raises(ValueError, match=rf"batch_size = {batch!r}; expected an integer >= 0"):
            lstm.initial_state(batch)
    h0, c0 = lstm.initial_state(np.int64(2))
    assert h0.shape == c0.shape == (1, 2, 4)
@pytest.mark.parametrize("layer", [
    lambda: nn.LSTM(3, 4, 2, recurrent_dropout=0.3, weight_dropout=0.2, zoneout=0.1, zoneout_cell=0.2,
                    peepholes=True, dtype="float64"),
    lambda: nn.GRU(3, 4, recurrent_dropout=0.3, weight_dropout=0.2, zoneout=0.1, dtype="float64"),
    lambda: nn.RNN(3, 4, nonlinearity="relu", recurrent_dropout=0.3, weight_dropout=0.2, zoneout=0.1,
                   dtype="float64"),
], ids=["lstm", "gru", "rnn"])
def test_layers_expose_the_cell_variants_training_under_differentiation(layer):
    """The options reach the spec; differentiating runs the training masks (seeded), a plain call the
    inference semantics, both equal to rnn_forward with the same options."""
    layer = layer()
    spec = layer.spec
    assert spec.recurrent_dropout == 0.3 and spec.weight_dropout == 0.2 and spec.zoneout == 0.1
    assert spec.peepholes == (spec.mode == "lstm") and spec.zoneout_cell == (0.2 if spec.has_cell else None)
    x = np.random.default_rng(2).standard_normal((5, 2, 3))
    lengths = np.array([5, 2])
    np.testing.assert_allclose(layer(x, lengths)[0], ar.rnn_forward(layer.params, x, lengths).y, rtol=1e-12)
    g = ar.grad(lambda p: ops.sum(layer.apply(p, x, lengths, seed=9)[0]))(layer.params)
    res = ar.rnn_forward(layer.params, x, lengths=lengths, training=True, seed=9)
    expected = ar.rnn_backward(res, dy=np.ones_like(res.y))
    np.testing.assert_allclose(g.data, expected.dparams.data, rtol=1e-10, atol=1e-12)
    inference = ar.rnn_forward(layer.params, x, lengths=lengths, seed=9)
    assert not np.allclose(res.y, inference.y)  # the training masks acted
