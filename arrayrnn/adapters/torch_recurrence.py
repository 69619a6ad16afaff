"""The recurrence written in torch operations: the differentiable path of :mod:`arrayrnn.torch`.

The fused engines compute the forward and a hand-written BPTT; neither is itself differentiable. This
module computes the same function (every :class:`arrayrnn.RNNSpec`: modes, bias modes, reset-before GRU,
projection, cell clipping, peepholes, layer normalisation, per-row lengths, inter-layer dropout masks; not
zoneout, recurrent or weight dropout, which are refused) with torch operations under
autograd, for the cases the engines do not serve:

- double backward: a backward called with ``create_graph=True`` re-runs the forward here and
  differentiates it (:func:`torch.autograd.grad` with ``create_graph=True``), so gradients of gradients
  exist. Cost: one more forward of ``T * L * D`` small per-step torch ops and the autograd graph of
  it, kept until the second backward; first-order calls never come here;
- an empty batch (``B = 0``), tensors on the ``meta`` device (shapes only), and ``dropout = 1`` in
  training mode (every inter-layer activation dropped; the masks are all zero).

Semantics, per row ``b`` with length ``len_b`` (``T`` when no lengths are given), equal
:func:`arrayrnn.rnn_forward`; roughly::

    for l in layers:                    # input of l > 0: output of l - 1 times masks[l - 1]
        for d in directions:            # d = 1 runs t = T - 1 .. 0; steps t >= len_b leave the state
            h, c = h0[l*D+d], c0[l*D+d]
            for t in steps: h, c = cell(x_l[t], h, c) where t < len_b;  y_l[t, :, d] = h or 0
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

import arrayrnn as ar
from arrayrnn.core.layout import BLOCK_NAMES, PEEPHOLE_GATES

_Tensor = torch.Tensor


def run(spec: ar.RNNSpec, flat: _Tensor, x: _Tensor, lengths: _Tensor | None, h0: _Tensor | None,
        c0: _Tensor | None, batch_first: bool = False,
        masks: Sequence[_Tensor] | None = None) -> tuple[_Tensor, _Tensor, _Tensor | None]:
    """``(y, h_n, c_n)`` of the stack ``spec`` with canonical weights ``flat`` (``c_n`` None unless LSTM).

    ``x``: ``(T, B, I)`` (``(B, T, I)`` with ``batch_first``); ``lengths``: ``(B,)`` integers or None;
    ``h0`` / ``c0``: ``(L*D, B, H_out)`` / ``(L*D, B, H)`` or None (zeros); ``masks``: ``L - 1`` tensors
    ``(T, B, D*H_out)`` multiplying the inputs of layers 1.., or None.
    """
    if batch_first:
        x = x.transpose(0, 1)
    T, B = x.shape[0], x.shape[1]
    if spec.custom_cell is not None and B == 0 and x.device.type != "meta":
        return _no_rows(spec, x, h0, c0, batch_first)
    _check_supported(spec)
    views = block_views(spec, flat)
    valid = _valid_steps(lengths, T, B, x.device)
    h0 = h0 if h0 is not None else x.new_zeros(spec.state_shape(B))
    if spec.has_cell and c0 is None:
        c0 = x.new_zeros(spec.state_shape(B, cell=True))
    h_n, c_n, inp = [], [], x
    for layer in range(spec.num_layers):
        if layer and masks is not None:
            inp = inp * masks[layer - 1]
        outputs = []
        for direction in range(spec.num_directions):
            k = layer * spec.num_directions + direction
            y, h, c = _direction(spec, views, layer, direction, inp, valid, h0[k],
                                 c0[k] if spec.has_cell else None)
            outputs.append(y)
            h_n.append(h)
            c_n.append(c)
        inp = torch.cat(outputs, dim=-1)
    y = inp.transpose(0, 1) if batch_first else inp
    return y, torch.stack(h_n), (torch.stack(c_n) if spec.has_cell else None)


def _no_rows(spec: ar.RNNSpec, x: _Tensor, h0: _Tensor | None, c0: _Tensor | None,
             batch_first: bool) -> tuple[_Tensor, _Tensor, _Tensor | None]:
    """A custom cell's ``(y, h_n, c_n)`` for a batch of no rows: empty (the cell is never called)."""
    T = x.shape[0]
    y = x.new_zeros((T, 0, spec.num_directions * spec.output_size))
    h_n = h0 * 1 if h0 is not None else x.new_zeros(spec.state_shape(0))
    c_n = None
    if spec.has_cell:
        c_n = c0 * 1 if c0 is not None else x.new_zeros(spec.state_shape(0, cell=True))
    return (y.transpose(0, 1) if batch_first else y), h_n, c_n


def _check_supported(spec: ar.RNNSpec) -> None:
    """The cell variants written here: peepholes; not zoneout, recurrent or weight dropout; the built-in
    cells only (a custom cell's functions run on arrays, not on torch's autograd tensors)."""
    if spec.custom_cell is not None:
        raise ValueError(f"mode = {spec.mode!r} is a custom cell: the torch-op recurrence of arrayrnn.torch "
                         "(a backward with create_graph=True for gradients of gradients, meta tensors, "
                         "torch.func transforms, dropout = 1 in training) runs the built-in cells only; take "
                         "first-order gradients (create_graph=False) outside torch.func, on real tensors, "
                         "with dropout < 1")
    unsupported = {name: getattr(spec, name) for name in ("zoneout", "zoneout_cell", "recurrent_dropout",
                                                          "weight_dropout") if getattr(spec, name, 0)}
    if unsupported:
        raise ValueError(f"{unsupported}: the torch-op recurrence of arrayrnn.torch (gradients of gradients, "
                         "an empty batch, meta tensors, torch.func transforms, dropout = 1, ONNX export in "
                         "elementary operators) has no zoneout, recurrent or weight dropout; use a spec "
                         "without them for these calls")


def block_views(spec: ar.RNNSpec, flat: _Tensor) -> dict[tuple[int, int, str], _Tensor]:
    return {(b.layer, b.direction, b.name): flat[b.offset:b.stop].view(b.shape)
            for b in ar.layout_of(spec).blocks}


def _valid_steps(lengths: _Tensor | None, T: int, B: int, device: torch.device) -> _Tensor | None:
    """``(T, B, 1)`` bool: step ``t`` of row ``b`` is inside the row; None when every row has ``T`` steps."""
    if lengths is None:
        return None
    steps = torch.arange(T, device=device)[:, None]
    return (steps < lengths.to(device=device, dtype=torch.int64)[None, :])[:, :, None]


def _direction(spec: ar.RNNSpec, views: dict, layer: int, direction: int, inp: _Tensor,
               valid: _Tensor | None, h: _Tensor, c: _Tensor | None):
    block = {name: views.get((layer, direction, name)) for name in BLOCK_NAMES}
    pre_in = _normed(spec, block["g_ih"], inp @ block["W_ih"].T)  # hoisted out of the loop, as in the engines
    if block["b_ih"] is not None:
        pre_in = pre_in + block["b_ih"]
    steps = range(inp.shape[0]) if direction == 0 else range(inp.shape[0] - 1, -1, -1)
    ys: list[_Tensor | None] = [None] * inp.shape[0]
    for t in steps:
        h_new, c_new = _cell(spec, block, pre_in[t], h, c)
        if valid is None:
            h, c, ys[t] = h_new, c_new, h_new
        else:
            keep = valid[t]
            h = torch.where(keep, h_new, h)
            c = torch.where(keep, c_new, c) if c is not None else None
            ys[t] = torch.where(keep, h_new, torch.zeros_like(h_new))
    return torch.stack(ys), h, c


def _cell(spec: ar.RNNSpec, block: dict, pre_in: _Tensor, h: _Tensor, c: _Tensor | None):
    """One step: ``(h', c')`` from the input pre-activation ``pre_in = x W_ih^T + b_ih``."""
    if spec.mode == "gru":
        return _gru(spec, block, pre_in, h), None
    pre = pre_in + _recurrent(spec, block, h)
    if spec.mode == "rnn_tanh":
        return torch.tanh(pre), None
    if spec.mode == "rnn_relu":
        return torch.relu(pre), None
    gates = dict(zip(spec.gate_names, pre.chunk(spec.gates, dim=-1), strict=True))
    peep = dict(zip(PEEPHOLE_GATES, block["P"], strict=True)) if block.get("P") is not None else None
    if peep is not None:  # i and f see the previous cell state, o the new one
        gates["i"], gates["f"] = gates["i"] + peep["i"] * c, gates["f"] + peep["f"] * c
    c_new = torch.sigmoid(gates["f"]) * c + torch.sigmoid(gates["i"]) * torch.tanh(gates["g"])
    if spec.cell_clip is not None:
        c_new = torch.clamp(c_new, *spec.cell_clip)
    o = gates["o"] + peep["o"] * c_new if peep is not None else gates["o"]
    h_new = torch.sigmoid(o) * torch.tanh(_normed_cell(spec, block, c_new))
    if block["W_hr"] is not None:
        h_new = h_new @ block["W_hr"].T
    return h_new, c_new


def _recurrent(spec: ar.RNNSpec, block: dict, h: _Tensor) -> _Tensor:
    pre = _normed(spec, block["g_hh"], h @ block["W_hh"].T)
    return pre + block["b_hh"] if block["b_hh"] is not None else pre


def _normed(spec: ar.RNNSpec, gain: _Tensor | None, product: _Tensor) -> _Tensor:
    """``gain * LN(product)`` over the whole row with ``layer_norm`` (``product`` as it is without)."""
    if not spec.layer_norm:
        return product
    return gain * F.layer_norm(product, (product.shape[-1],), eps=spec.layer_norm_eps)


def _normed_cell(spec: ar.RNNSpec, block: dict, c: _Tensor) -> _Tensor:
    """What the LSTM's output squashes: ``c``, or ``g_c * LN(c) + b_c`` with ``layer_norm``."""
    return _normed(spec, block["g_c"], c) + block["b_c"] if spec.layer_norm else c


def _gru(spec: ar.RNNSpec, block: dict, pre_in: _Tensor, h: _Tensor) -> _Tensor:
    x_gates = dict(zip(spec.gate_names, pre_in.chunk(3, dim=-1), strict=True))
    if spec.reset_after:  # n = tanh(W_in x + b_in + r * (W_hn h + b_hn))
        h_gates = dict(zip(spec.gate_names, _recurrent(spec, block, h).chunk(3, dim=-1), strict=True))
        r = torch.sigmoid(x_gates["r"] + h_gates["r"])
        z = torch.sigmoid(x_gates["z"] + h_gates["z"])
        n = torch.tanh(x_gates["n"] + r * h_gates["n"])
    else:  # reset-before: n = tanh(W_in x + b_in + W_hn (r * h) + b_hn); with layer norm the r, z part
        H = spec.hidden_size          # and the n part each normalised over its own row
        g_hh, b_hh = block["g_hh"], block["b_hh"]
        g_rz, g_n = (g_hh[:2 * H], g_hh[2 * H:]) if g_hh is not None else (None, None)
        b_rz, b_n = (b_hh[:2 * H], b_hh[2 * H:]) if b_hh is not None else (0.0, 0.0)
        rz = _normed(spec, g_rz, h @ block["W_hh"][:2 * H].T) + b_rz
        r = torch.sigmoid(x_gates["r"] + rz[..., :H])
        z = torch.sigmoid(x_gates["z"] + rz[..., H:])
        n = torch.tanh(x_gates["n"] + _normed(spec, g_n, (r * h) @ block["W_hh"][2 * H:].T) + b_n)
    return (1 - z) * n + z * h
