"""A plain recurrent stack written with ``ar.ops`` under ``ar.scan``, with the public masks
(``ar.cell_masks``, the inter-layer ``dropout_masks``): the oracle of the cell variants (recurrent dropout,
DropConnect, zoneout, peepholes), of layer normalisation (issue 38's formulas: ``LN`` below) and of
``return_all_states``.

Straight from the "roughly this Python loop" of docs/guide/cells.md and docs/guide/layer_norm.md: one
``scan`` per layer and direction over the whole batch; a row's state is updated only while ``t < len_b``
(``h = a*h_new + (1-a)*h`` with ``a`` the row's activity), so the reverse direction starts at ``len_b - 1``
from its initial state and outputs past a row's end are zero. No cell clipping (the finite-difference checks
cover that combination).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import arrayrnn as ar
from arrayrnn import ops
from arrayrnn.frontend.dropout import dropout_masks


def _view(params: Any, layer: int, direction: int, name: str) -> Any:
    present = ar.layout_of(params.spec).has(layer, direction, name)
    return params.view(layer, direction, name) if present else None


def LN(v: Any, eps: float) -> Any:  # noqa: N802 - the formula's name
    """``(v - mean(v)) / sqrt(var(v) + eps)`` over the last axis."""
    centred = v - ops.mean(v, axis=-1, keepdims=True)
    return centred * (ops.mean(centred * centred, axis=-1, keepdims=True) + eps) ** -0.5


def _norms(params: Any, layer: int, direction: int) -> tuple[Callable[..., Any], Callable[[Any], Any]]:
    """``(norm, cell)``: ``norm(v, gain, cols)`` is ``gain[cols] * LN(v)`` (``v`` itself without layer norm),
    ``cell(c)`` the LSTM's ``tanh(g_c * LN(c) + b_c)`` (``tanh(c)`` without)."""
    spec = params.spec
    if not spec.layer_norm:
        return (lambda v, gain, cols=slice(None): v), ops.tanh
    eps = spec.layer_norm_eps
    gains = {name: _view(params, layer, direction, name) for name in ("g_ih", "g_hh", "g_c", "b_c")}

    def norm(v, gain, cols=slice(None)):
        return gains[gain][cols] * LN(v, eps)

    def cell(c):
        return ops.tanh(gains["g_c"] * LN(c, eps) + gains["b_c"])

    return norm, cell


def _cell(spec: ar.RNNSpec, params: Any, layer: int, direction: int, masks: Any):
    k = layer * spec.num_directions + direction
    H = spec.hidden_size
    W_ih, W_hh = params.view(layer, direction, "W_ih"), params.view(layer, direction, "W_hh")
    b_ih, b_hh = _view(params, layer, direction, "b_ih"), _view(params, layer, direction, "b_hh")
    W_hr, P = _view(params, layer, direction, "W_hr"), _view(params, layer, direction, "P")
    if masks is not None and masks.weight is not None:
        W_hh = W_hh * masks.weight[k]
    rec = masks.recurrent[k] if masks is not None and masks.recurrent is not None else None
    norm, cell = _norms(params, layer, direction)

    def affine(x, W, b, gain="g_hh"):
        out = norm(x @ ops.transpose(W), gain)
        return out + b if b is not None else out

    def step(carry, inputs):
        h, c = carry
        x, a, m_h, m_c = inputs
        h_rec = h * rec if rec is not None else h
        gi = affine(x, W_ih, b_ih, "g_ih")
        c_step = None
        if spec.mode == "lstm":
            gates = gi + affine(h_rec, W_hh, b_hh)
            i, f, g, o = ops.split(gates, 4, axis=-1)
            if P is not None:
                i, f = i + P[0] * c, f + P[1] * c
            c_step = ops.sigmoid(f) * c + ops.sigmoid(i) * ops.tanh(g)
            if P is not None:
                o = o + P[2] * c_step
            h_step = ops.sigmoid(o) * cell(c_step)
            if W_hr is not None:
                h_step = h_step @ ops.transpose(W_hr)
        elif spec.mode == "gru":
            gi_r, gi_z, gi_n = ops.split(gi, 3, axis=-1)
            if spec.reset_after:
                gh_r, gh_z, gh_n = ops.split(affine(h_rec, W_hh, b_hh), 3, axis=-1)
                r, z = ops.sigmoid(gi_r + gh_r), ops.sigmoid(gi_z + gh_z)
                n = ops.tanh(gi_n + r * gh_n)
            else:  # with layer norm the r, z part and the n part, each over its own row
                b_r, b_z, b_n = ops.split(b_hh, 3) if b_hh is not None else (0.0, 0.0, 0.0)
                gh_rz = norm(h_rec @ ops.transpose(W_hh[:2 * H]), "g_hh", slice(0, 2 * H))
                gh_r, gh_z = ops.split(gh_rz, 2, axis=-1)
                r, z = ops.sigmoid(gi_r + gh_r + b_r), ops.sigmoid(gi_z + gh_z + b_z)
                gh_n = norm((r * h_rec) @ ops.transpose(W_hh[2 * H:]), "g_hh", slice(2 * H, None))
                n = ops.tanh(gi_n + gh_n + b_n)
            h_step = (1.0 - z) * n + z * h
        else:
            pre = gi + affine(h_rec, W_hh, b_hh)
            h_step = ops.tanh(pre) if spec.mode == "rnn_tanh" else ops.relu(pre)
        h_new = m_h * h + (1.0 - m_h) * h_step
        new_h = a * h_new + (1.0 - a) * h
        if c_step is None:
            return (new_h, c), (a * h_new, a * 0.0)
        c_new = m_c * c + (1.0 - m_c) * c_step
        return (new_h, a * c_new + (1.0 - a) * c), (a * h_new, a * c_new)

    return step


def run_oracle(params: Any, x: Any, lengths: np.ndarray | None, h0: Any, c0: Any, seed: int,
               training: bool) -> dict[str, Any]:
    """``{"y", "h_n", "c_n", "h_all", "c_all"}`` of the stack (``c_*`` ``None`` without a cell state);
    ``params``, ``x``, ``h0``, ``c0`` may be traced values."""
    spec = params.spec
    T, B = x.shape[:2]
    L, D = spec.num_layers, spec.num_directions
    lengths = np.full(B, T) if lengths is None else np.asarray(lengths)
    active = (np.arange(T)[:, None] < lengths[None, :]).astype(spec.dtype)[:, :, None]   # (T, B, 1)
    masks = ar.cell_masks(spec, seed, B, T, training=training)
    inter = dropout_masks(spec, T, B, seed) if training else None
    zeros_h = np.zeros((T, B, spec.output_size), spec.dtype)
    zeros_c = np.zeros((T, B, spec.hidden_size), spec.dtype)
    layer_input, h_n, c_n, h_all, c_all = x, [], [], [], []
    for layer in range(L):
        if layer and inter is not None:
            layer_input = layer_input * inter[layer - 1]
        outs = []
        for direction in range(D):
            k = layer * D + direction
            m_h = masks.zoneout_h[k] if masks is not None and masks.zoneout_h is not None else zeros_h
            m_c = masks.zoneout_c[k] if masks is not None and masks.zoneout_c is not None else zeros_c
            c_init = c0[k] if c0 is not None else zeros_c[0]
            (h, c), (ys, cs) = ar.scan(_cell(spec, params, layer, direction, masks), (h0[k], c_init),
                                       (layer_input, active, m_h, m_c), reverse=direction == 1)
            outs.append(ys)
            h_n.append(h)
            c_n.append(c)
            h_all.append(ys)
            c_all.append(cs)
        layer_input = outs[0] if D == 1 else ops.concatenate(outs, axis=2)
    cell = spec.has_cell
    return {"y": layer_input, "h_n": ops.stack(h_n), "c_n": ops.stack(c_n) if cell else None,
            "h_all": ops.stack(h_all), "c_all": ops.stack(c_all) if cell else None}
