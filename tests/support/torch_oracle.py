"""PyTorch oracle: the same nn.LSTM / GRU / RNN as a PackedParams, run on the same inputs.

Weights are copied from the params' named views into the module's parameters by PyTorch's names
(``weight_ih_l{l}{_reverse}``, ...). Only configurations PyTorch has are accepted: double or no bias,
reset-after GRU, no cell clipping.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from arrayrnn import PackedParams, RNNSpec

TORCH_NAMES = {"W_ih": "weight_ih", "W_hh": "weight_hh", "b_ih": "bias_ih", "b_hh": "bias_hh",
               "W_hr": "weight_hr"}


def torch_name(layer: int, direction: int, name: str) -> str:
    return f"{TORCH_NAMES[name]}_l{layer}{'_reverse' if direction else ''}"


def torch_module(params: PackedParams, batch_first: bool = False) -> torch.nn.RNNBase:
    spec: RNNSpec = params.spec
    if spec.bias not in ("double", "none") or not spec.reset_after or spec.cell_clip is not None:
        raise ValueError(f"PyTorch has no equivalent of {spec}")
    common = dict(input_size=spec.input_size, hidden_size=spec.hidden_size, num_layers=spec.num_layers,
                  bias=spec.bias == "double", batch_first=batch_first, bidirectional=spec.bidirectional,
                  dropout=0.0)
    if spec.mode == "lstm":
        module = torch.nn.LSTM(proj_size=spec.proj_size, **common)
    elif spec.mode == "gru":
        module = torch.nn.GRU(**common)
    else:
        module = torch.nn.RNN(nonlinearity=spec.mode.removeprefix("rnn_"), **common)
    module = module.to(getattr(torch, spec.dtype))
    state = {torch_name(b.layer, b.direction, b.name): torch.from_numpy(np.array(params.block_view(b)))
             for b in params.layout.blocks}
    module.load_state_dict(state, strict=True)
    return module


@dataclass
class TorchRun:
    y: np.ndarray
    h_n: np.ndarray
    c_n: np.ndarray | None
    dx: np.ndarray
    dh0: np.ndarray
    dc0: np.ndarray | None
    grads: dict[str, np.ndarray]   # by our block key "l0.fwd.W_ih"


def run_torch(params: PackedParams, x: np.ndarray, lengths: np.ndarray | None, h0: np.ndarray,
              c0: np.ndarray | None, dy: np.ndarray, dh_n: np.ndarray, dc_n: np.ndarray | None,
              batch_first: bool = False) -> TorchRun:
    """Forward and backward of the PyTorch module for the loss ``<y, dy> + <h_n, dh_n> + <c_n, dc_n>``."""
    module = torch_module(params, batch_first)
    tx = torch.tensor(x, requires_grad=True)
    th0 = torch.tensor(h0, requires_grad=True)
    tc0 = torch.tensor(c0, requires_grad=True) if c0 is not None else None
    inp = tx
    if lengths is not None:
        inp = pack_padded_sequence(tx, torch.tensor(lengths), batch_first=batch_first, enforce_sorted=False)
    out, state = module(inp, (th0, tc0) if tc0 is not None else th0)
    if lengths is not None:
        total = x.shape[1] if batch_first else x.shape[0]
        out, _ = pad_packed_sequence(out, batch_first=batch_first, total_length=total)
    h_n, c_n = state if tc0 is not None else (state, None)
    loss = (out * torch.tensor(dy)).sum() + (h_n * torch.tensor(dh_n)).sum()
    if c_n is not None:
        loss = loss + (c_n * torch.tensor(dc_n)).sum()
    loss.backward()
    named = dict(module.named_parameters())
    grads = {b.key: named[torch_name(b.layer, b.direction, b.name)].grad.numpy()
             for b in params.layout.blocks}
    return TorchRun(out.detach().numpy(), h_n.detach().numpy(), None if c_n is None else c_n.detach().numpy(),
                    tx.grad.numpy(), th0.grad.numpy(), None if tc0 is None else tc0.grad.numpy(), grads)
