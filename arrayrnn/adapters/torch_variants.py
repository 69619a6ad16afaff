"""The cell variants' options of :mod:`arrayrnn.torch`'s modules (``recurrent_dropout``, ``weight_dropout``,
``zoneout``, ``zoneout_cell``, ``peepholes``: :class:`arrayrnn.RNNSpec`'s fields of these names).

Keyword-only extras of the drop-in ``LSTM`` / ``GRU`` / ``RNN`` (off by default, so ``nn.LSTM``'s signature
is unchanged) and of ``ArrayRNN``; validated by :class:`arrayrnn.RNNSpec` itself (its ``ValueError``
names the option, the value and what is allowed).
"""

from __future__ import annotations

from typing import Any

import torch

import arrayrnn as ar

DEFAULTS: dict[str, Any] = {"recurrent_dropout": 0.0, "weight_dropout": 0.0, "zoneout": 0.0,
                            "zoneout_cell": None, "peepholes": False}


def pop_options(kwargs: dict[str, Any], mode: str) -> dict[str, Any]:
    """The variant options taken out of ``kwargs`` (defaults for the absent ones), checked for ``mode``
    (``"lstm"``, ``"gru"``, ``"rnn_tanh"``, ``"rnn_relu"``)."""
    options = {name: kwargs.pop(name, default) for name, default in DEFAULTS.items()}
    ar.RNNSpec(mode=mode, input_size=1, hidden_size=1, **options)  # raises on a bad value
    return options


def extra_repr(options: dict[str, Any]) -> str:
    """``", zoneout=0.1, peepholes=True"``: the options that are on (``""`` when none is)."""
    return "".join(f", {name}={value}" for name, value in options.items() if value)


def peephole_name(layer: int, direction: int) -> str:
    """The key of a layer-direction's peephole weights (``nn.LSTM``'s naming; it has none of its own)."""
    return f"weight_peephole_l{layer}{'_reverse' if direction else ''}"


def add_peepholes(module: torch.nn.RNNBase) -> None:
    """Register ``(3, hidden_size)`` peephole Parameters (rows: gates i, f, o) after each layer-direction's
    other weights in ``module``'s weight lists, where arrayrnn's layout puts the ``"P"`` block."""
    directions = 2 if module.bidirectional else 1
    like = module.weight_ih_l0
    for k, names in enumerate(module._all_weights):
        name = peephole_name(k // directions, k % directions)
        if name in names:
            continue
        module.register_parameter(name, torch.nn.Parameter(like.new_empty((3, module.hidden_size))))
        names.append(name)
    module._flat_weights_names = [name for names in module._all_weights for name in names]
