"""pytorch/examples' word_language_model loop on arrayrnn.torch (an integration test), on a small corpus that
ships with Python (the source text of the standard library's ``textwrap`` module).

The model is the example's ``RNNModel`` (embedding, dropout, recurrent stack, dropout, linear decoder, log
softmax), paraphrased, with the recurrent class taken from ``arrayrnn.torch`` (the one-line swap) or from
``torch.nn`` (the oracle). The loop: train (truncated BPTT, repackaged hidden state, gradient clipping,
plain SGD on ``p.data``), save the whole model with ``torch.save``, ``torch.load(weights_only=True)``,
``model.rnn.flatten_parameters()``, evaluate, generate words, export to ONNX and run it in onnxruntime.
"""

from __future__ import annotations

import inspect
import math
import textwrap

import numpy as np
import pytest
import torch
from torch import nn

import arrayrnn.torch as ar_torch

BPTT, BATCH, EMSIZE, NHID, NLAYERS = 12, 4, 16, 24, 2


class RNNModel(nn.Module):
    def __init__(self, rnn_module, rnn_type: str, ntoken: int, dropout: float = 0.2):
        super().__init__()
        self.ntoken, self.rnn_type = ntoken, rnn_type
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, EMSIZE)
        if rnn_type in ("LSTM", "GRU"):
            self.rnn = getattr(rnn_module, rnn_type)(EMSIZE, NHID, NLAYERS)
        else:
            self.rnn = rnn_module.RNN(EMSIZE, NHID, NLAYERS, nonlinearity="tanh")
        self.decoder = nn.Linear(NHID, ntoken)
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, tokens, hidden):
        output, hidden = self.rnn(self.drop(self.encoder(tokens)), hidden)
        decoded = self.decoder(self.drop(output)).view(-1, self.ntoken)
        return nn.functional.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, batch: int):
        weight = next(self.parameters())
        zeros = weight.new_zeros(NLAYERS, batch, NHID)
        return (zeros, zeros.clone()) if self.rnn_type == "LSTM" else zeros


def corpus() -> tuple[torch.Tensor, dict[str, int]]:
    words = inspect.getsource(textwrap).split()[:3000]
    vocab = {w: i for i, w in enumerate(dict.fromkeys(words))}
    ids = torch.tensor([vocab[w] for w in words])
    n = ids.numel() // BATCH
    return ids[: n * BATCH].view(BATCH, -1).t().contiguous(), vocab


def repackage(hidden):
    return hidden.detach() if isinstance(hidden, torch.Tensor) else tuple(repackage(h) for h in hidden)


def train(model: RNNModel, data: torch.Tensor, steps: int, lr: float = 5.0) -> list[float]:
    model.train()
    hidden, losses = model.init_hidden(BATCH), []
    for start in range(0, BPTT * steps, BPTT):
        tokens, targets = data[start:start + BPTT], data[start + 1:start + 1 + BPTT].reshape(-1)
        hidden = repackage(hidden)
        model.zero_grad()
        output, hidden = model(tokens, hidden)
        loss = nn.functional.nll_loss(output, targets)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        losses.append(loss.item())
    return losses


def evaluate(model: RNNModel, data: torch.Tensor) -> float:
    model.eval()
    hidden, total = model.init_hidden(BATCH), 0.0
    with torch.no_grad():
        for start in range(0, data.shape[0] - 1 - BPTT, BPTT):
            tokens, targets = data[start:start + BPTT], data[start + 1:start + 1 + BPTT].reshape(-1)
            output, hidden = model(tokens, hidden)
            total += BPTT * nn.functional.nll_loss(output, targets).item()
    return total / (data.shape[0] - 1)


@pytest.mark.parametrize("rnn_type", ["LSTM", "GRU", "RNN_TANH"])
def test_word_language_model_trains_to_torchs_losses(rnn_type):
    data, vocab = corpus()
    losses = []
    for module in (ar_torch, nn):
        torch.manual_seed(1111)
        model = RNNModel(module, rnn_type, len(vocab)).double()
        losses.append(train(model, data, steps=8))
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-9)
    assert losses[0][-1] < losses[0][0]


def test_word_language_model_save_load_generate_and_export(tmp_path):
    data, vocab = corpus()
    torch.manual_seed(1111)
    model = RNNModel(ar_torch, "LSTM", len(vocab))
    train(model, data, steps=6)
    path = tmp_path / "model.pt"
    with open(path, "wb") as f:
        torch.save(model, f)
    with torch.serialization.safe_globals([RNNModel, nn.Dropout, nn.Embedding, nn.Linear]):
        with open(path, "rb") as f:
            loaded = torch.load(f, weights_only=True)
    loaded.rnn.flatten_parameters()
    assert type(loaded.rnn) is ar_torch.LSTM
    assert math.isclose(evaluate(loaded, data), evaluate(model, data), rel_tol=1e-6)

    # generate, as the example's generate.py: feed the sampled word back in
    torch.manual_seed(3)
    words = list(vocab)
    token, hidden, text = torch.randint(len(vocab), (1, 1)), loaded.init_hidden(1), []
    with torch.no_grad():
        for _ in range(20):
            output, hidden = loaded(token, hidden)
            token.fill_(int(torch.multinomial(output.squeeze().div(1.0).exp(), 1)))
            text.append(words[int(token)])
    assert len(text) == 20

    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    tokens = data[:BPTT, :1]
    program = torch.onnx.export(loaded.eval(), (tokens, loaded.init_hidden(1)), dynamo=True, verbose=False)
    assert [n.op_type for n in program.model_proto.graph.node].count("LSTM") == NLAYERS
    program.save(str(tmp_path / "model.onnx"))
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    h0, c0 = loaded.init_hidden(1)
    got = session.run(None, dict(zip([i.name for i in session.get_inputs()],
                                     (tokens.numpy(), h0.numpy(), c0.numpy()), strict=True)))
    with torch.no_grad():
        want, (h_n, _) = loaded(tokens, (h0, c0))
    np.testing.assert_allclose(got[0], want.numpy(), atol=1e-5)
    np.testing.assert_allclose(got[1], h_n.numpy(), atol=1e-5)
