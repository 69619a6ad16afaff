"""Exact weight interop with PyTorch's ``nn.RNN`` / ``nn.LSTM`` / ``nn.GRU``. torch is imported lazily.

The canonical layout is PyTorch's parameter order, so import and export are copies block by block,
with names mapped ``W_ih`` <-> ``weight_ih_l{layer}{_reverse}`` and so on.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .backend import to_host
from .layout import Block, layout_of
from .params import PackedParams
from .spec import RNNSpec

TORCH_NAMES = {"W_ih": "weight_ih", "W_hh": "weight_hh", "b_ih": "bias_ih", "b_hh": "bias_hh",
               "W_hr": "weight_hr"}
_TORCH_MODES = {"LSTM": "lstm", "GRU": "gru", "RNN_TANH": "rnn_tanh", "RNN_RELU": "rnn_relu"}


def torch_key(block: Block) -> str:
    """PyTorch's ``state_dict`` key of a canonical block: ``l1.rev.W_hh`` -> ``weight_hh_l1_reverse``."""
    return f"{TORCH_NAMES[block.name]}_l{block.layer}{'_reverse' if block.direction else ''}"


def spec_from_torch(module: Any) -> RNNSpec:
    """The :class:`RNNSpec` of a ``torch.nn.RNN/LSTM/GRU`` module."""
    mode = _TORCH_MODES.get(getattr(module, "mode", None))
    if mode is None:
        raise TypeError(f"module has type {type(module).__name__}; expected torch.nn.RNN, LSTM or GRU")
    dtype = next(module.parameters()).dtype
    return RNNSpec(mode=mode, input_size=module.input_size, hidden_size=module.hidden_size,
                   num_layers=module.num_layers, bidirectional=module.bidirectional, bias=module.bias,
                   proj_size=getattr(module, "proj_size", 0), dropout=float(module.dropout),
                   dtype=str(dtype).removeprefix("torch."))


def from_torch(module: Any) -> PackedParams:
    """Copy a PyTorch RNN module's weights into a new canonical :class:`PackedParams` on the host.

    Bit-exact: every block equals the module's parameter of the same name. ``batch_first`` is a call
    option here (``rnn_forward(..., batch_first=True)``), not part of the weights.
    """
    spec = spec_from_torch(module)
    state = module.state_dict()
    params = PackedParams.zeros(spec)
    for block in params.layout.blocks:
        tensor = state[torch_key(block)]
        params.block_view(block)[...] = tensor.detach().cpu().numpy().reshape(block.shape)
    return params


def to_torch_state_dict(params: PackedParams) -> dict[str, Any]:
    """``{torch key: tensor}`` loadable with ``module.load_state_dict`` into the matching module.

    Keys, shapes and order equal ``module.state_dict()``. Configurations PyTorch cannot express
    (single-bias modes, reset-before GRU, cell clipping) raise ``ValueError`` rather than export
    weights that would compute something else there.
    """
    import torch

    spec = params.spec
    _check_torch_expressible(spec)
    host = to_host(params.to_format("canonical").data)
    layout = layout_of(spec)
    return {torch_key(b): torch.from_numpy(np.array(host[b.offset:b.stop]).reshape(b.shape))
            for b in layout.blocks}


def _check_torch_expressible(spec: RNNSpec) -> None:
    if spec.bias in ("single_inp", "single_rec"):
        raise ValueError(f"bias = {spec.bias!r} has no PyTorch equivalent; PyTorch has bias=True "
                         "(double) or bias=False (none)")
    if not spec.reset_after:
        raise ValueError("reset_after = False (reset-before GRU) has no PyTorch equivalent; "
                         "PyTorch's GRU is reset_after=True")
    if spec.cell_clip is not None:
        raise ValueError(f"cell_clip = {spec.cell_clip} has no PyTorch equivalent; "
                         "the module would compute something else")
