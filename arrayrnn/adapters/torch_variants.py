"""The cell variants' options of :mod:`arrayrnn.torch`'s modules (``recurrent_dropout``, ``weight_dropout``,
``zoneout``, ``zoneout_cell``, ``peepholes``, ``layer_norm``, ``layer_norm_eps``: :class:`arrayrnn.RNNSpec`'s
fields of these names).

Peepholes and layer normalisation add Parameters ``nn.LSTM`` has not, registered after each
layer-direction's other weights (arrayrnn's layout order, so they are views of the one flat buffer too):
``weight_peephole_l0`` ``(3, H)``; ``layer_norm_weight_ih_l0``, ``layer_norm_weight_hh_l0`` ``(G*H,)``
(the products' gains, initialised to ones) and, LSTM, ``layer_norm_weight_c_l0``, ``layer_norm_bias_c_l0``
``(H,)`` (the cell's gain and shift: ones, zeros); ``_reverse`` suffixes as ``nn.LSTM``'s.

Keyword-only extras of the drop-in ``LSTM`` / ``GRU`` / ``RNN`` (off by default, so ``nn.LSTM``'s signature
is unchanged) and of ``ArrayRNN``; validated by :class:`arrayrnn.RNNSpec` itself (its ``ValueError``
names the option, the value and what is allowed).
"""

from __future__ import annotations

from typing import Any

import torch

import arrayrnn as ar

DEFAULTS: dict[str, Any] = {"recurrent_dropout": 0.0, "weight_dropout": 0.0, "zoneout": 0.0,
                            "zoneout_cell": None, "peepholes": False, "layer_norm": False,
                            "layer_norm_eps": 1e-5}
FIXED = ("peepholes", "layer_norm")  # they add weights: fixed at construction
EXTRA_NAMES = {"P": "weight_peephole", "g_ih": "layer_norm_weight_ih", "g_hh": "layer_norm_weight_hh",
                "g_c": "layer_norm_weight_c", "b_c": "layer_norm_bias_c"}


def pop_options(kwargs: dict[str, Any], mode: str) -> dict[str, Any]:
    """The variant options taken out of ``kwargs`` (defaults for the absent ones), checked for ``mode``
    (``"lstm"``, ``"gru"``, ``"rnn_tanh"``, ``"rnn_relu"``)."""
    options = {name: kwargs.pop(name, default) for name, default in DEFAULTS.items()}
    ar.RNNSpec(mode=mode, input_size=1, hidden_size=1, **options)  # raises on a bad value
    return options


def changed(options: dict[str, Any]) -> dict[str, Any]:
    """The options that differ from their defaults."""
    return {name: value for name, value in options.items() if value != DEFAULTS[name]}


def extra_repr(options: dict[str, Any]) -> str:
    """``", zoneout=0.1, peepholes=True"``: the options that differ from their defaults (``""`` if none)."""
    return "".join(f", {name}={value}" for name, value in changed(options).items())


def extra_name(block: str, layer: int, direction: int) -> str:
    """The key of a layer-direction's block that ``nn.LSTM`` has not (``"P"``, ``"g_ih"``, ``"g_hh"``,
    ``"g_c"``, ``"b_c"``): ``weight_peephole_l0``, ``layer_norm_weight_hh_l1_reverse``, ..."""
    return f"{EXTRA_NAMES[block]}_l{layer}{'_reverse' if direction else ''}"


def _extra_shapes(module: torch.nn.RNNBase) -> dict[str, tuple[int, ...]]:
    """The extra blocks of ``module`` (its ``peepholes`` and ``layer_norm``), in arrayrnn's layout order."""
    H = module.hidden_size
    G = H * {"LSTM": 4, "GRU": 3}.get(module.mode, 1)  # nn.RNNBase's modes: LSTM, GRU, RNN_TANH, RNN_RELU
    shapes: dict[str, tuple[int, ...]] = {"P": (3, H)} if module.__dict__.get("peepholes") else {}
    if module.__dict__.get("layer_norm"):
        shapes.update(g_ih=(G,), g_hh=(G,))
        if module.mode == "LSTM":
            shapes.update(g_c=(H,), b_c=(H,))
    return shapes


def add_extra_weights(module: torch.nn.RNNBase) -> None:
    """Register the peephole (rows: gates i, f, o) and layer-norm Parameters after each layer-direction's
    other weights in ``module``'s weight lists, where arrayrnn's layout puts those blocks."""
    directions = 2 if module.bidirectional else 1
    like = module.weight_ih_l0
    for k, names in enumerate(module._all_weights):
        for block, shape in _extra_shapes(module).items():
            name = extra_name(block, k // directions, k % directions)
            if name not in names:
                module.register_parameter(name, torch.nn.Parameter(like.new_empty(shape)))
                names.append(name)
    module._flat_weights_names = [name for names in module._all_weights for name in names]


def init_layer_norm(module: torch.nn.RNNBase) -> None:
    """The layer-norm gains to ones and the cell's shift to zeros (after ``reset_parameters``' uniform)."""
    if not module.__dict__.get("layer_norm"):
        return
    directions = 2 if module.bidirectional else 1
    with torch.no_grad():
        for k in range(len(module._all_weights)):
            for block in _extra_shapes(module):
                if block != "P":
                    getattr(module, extra_name(block, k // directions, k % directions)).fill_(
                        0.0 if block == "b_c" else 1.0)
