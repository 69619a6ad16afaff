"""The torch-ops oracle of layer normalisation inside the recurrence (issue 38), float64, written from the
issue's formulas with ``torch.nn.functional.layer_norm`` (not from arrayrnn's code):

    LN(v) = (v - mean(v)) / sqrt(var(v) + eps)    over the whole row of one product (or of c)
    LSTM:  pre = g_ih * LN(W_ih x) + g_hh * LN(W_hh h) + b_ih + b_hh;  c = clip(f*c + i*g)
           h = o * tanh(g_c * LN(c) + b_c)         (then W_hr h); peepholes read c before the norm
    GRU:   LN of the 3H input and 3H recurrent products, each with its gain, then the usual gates;
           reset-after: n = tanh(xn_n + b_in + r * (hn_n + b_hn)); reset-before: the recurrent product's
           r, z part and n part W_hn (r * h), each normalised over its own row
    RNN:   h = act(g_ih * LN(W_ih x) + g_hh * LN(W_hh h) + b)

with every option the stack has: the public masks of ``ar.cell_masks`` (recurrent dropout, DropConnect,
zoneout) and the inter-layer dropout masks, per-row lengths (a row's state moves only while ``t <
len_b``, so the reverse direction starts at ``len_b - 1``), initial states and every layer's states.
``run`` returns the outputs and, through ``torch.autograd``, the gradient of ``<outputs, cotangents>``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

import arrayrnn as ar
from arrayrnn.frontend.dropout import dropout_masks

_T = torch.Tensor


def _tensor(a: Any) -> _T | None:
    return None if a is None else torch.tensor(np.asarray(a), dtype=torch.float64)


def _ln(v: _T, eps: float) -> _T:
    return F.layer_norm(v, (v.shape[-1],), eps=eps)


def _blocks(flat: _T, spec: ar.RNNSpec, layer: int, direction: int) -> dict[str, _T | None]:
    """Every block of one layer-direction as a view of ``flat`` (None where absent)."""
    layout = ar.layout_of(spec)
    names = ("W_ih", "W_hh", "b_ih", "b_hh", "W_hr", "P", "g_ih", "g_hh", "g_c", "b_c")
    out = {}
    for name in names:
        if layout.has(layer, direction, name):
            b = layout.block(layer, direction, name)
            out[name] = flat[b.offset:b.stop].view(b.shape)
        else:
            out[name] = None
    return out


def _plus(a: _T, b: _T | None) -> _T:
    return a if b is None else a + b


def _lstm(spec, w, xn, h_rec, c, eps):
    pre = _plus(_plus(xn + w["g_hh"] * _ln(h_rec @ w["W_hh"].T, eps), w["b_ih"]), w["b_hh"])
    i, f, g, o = pre.chunk(4, dim=-1)
    if w["P"] is not None:
        i, f = i + w["P"][0] * c, f + w["P"][1] * c
    c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    if spec.cell_clip is not None:
        c_new = torch.clamp(c_new, *spec.cell_clip)
    if w["P"] is not None:
        o = o + w["P"][2] * c_new
    h_new = torch.sigmoid(o) * torch.tanh(w["g_c"] * _ln(c_new, eps) + w["b_c"])
    if w["W_hr"] is not None:
        h_new = h_new @ w["W_hr"].T
    return h_new, c_new


def _gru(spec, w, xn, h_rec, h, eps):
    H = spec.hidden_size
    b_ih = w["b_ih"] if w["b_ih"] is not None else torch.zeros(3 * H, dtype=torch.float64)
    b_hh = w["b_hh"] if w["b_hh"] is not None else torch.zeros(3 * H, dtype=torch.float64)
    x_r, x_z, x_n = (xn + b_ih).chunk(3, dim=-1)
    b_r, b_z, b_n = b_hh.chunk(3)
    g_r, g_z, g_n = w["g_hh"].chunk(3)
    W_r, W_z, W_n = w["W_hh"].chunk(3, dim=0)
    if spec.reset_after:
        h_r, h_z, h_n = (w["g_hh"] * _ln(h_rec @ w["W_hh"].T, eps)).chunk(3, dim=-1)
        r, z = torch.sigmoid(x_r + h_r + b_r), torch.sigmoid(x_z + h_z + b_z)
        n = torch.tanh(x_n + r * (h_n + b_n))
    else:
        rz = torch.cat([g_r, g_z]) * _ln(h_rec @ torch.cat([W_r, W_z]).T, eps)
        h_r, h_z = rz.chunk(2, dim=-1)
        r, z = torch.sigmoid(x_r + h_r + b_r), torch.sigmoid(x_z + h_z + b_z)
        n = torch.tanh(x_n + g_n * _ln((r * h_rec) @ W_n.T, eps) + b_n)
    return (1 - z) * n + z * h


def _rnn(spec, w, xn, h_rec, eps):
    pre = _plus(_plus(xn + w["g_hh"] * _ln(h_rec @ w["W_hh"].T, eps), w["b_ih"]), w["b_hh"])
    return torch.tanh(pre) if spec.mode == "rnn_tanh" else torch.relu(pre)


def _direction(spec, w, inp, active, h, c, masks, k, reverse):
    """One layer-direction over every step: ``(ys, cs, h, c)``."""
    eps = spec.layer_norm_eps
    T = inp.shape[0]
    if masks is not None and masks.weight is not None:
        w = dict(w, W_hh=w["W_hh"] * _tensor(masks.weight[k]))
    rec = _tensor(masks.recurrent[k]) if masks is not None and masks.recurrent is not None else None
    m_h = _tensor(masks.zoneout_h[k]) if masks is not None and masks.zoneout_h is not None else None
    m_c = _tensor(masks.zoneout_c[k]) if masks is not None and masks.zoneout_c is not None else None
    xn = w["g_ih"] * _ln(inp @ w["W_ih"].T, eps)     # every step at once
    ys, cs = [None] * T, [None] * T
    for t in (range(T - 1, -1, -1) if reverse else range(T)):
        h_rec = h * rec if rec is not None else h
        c_step = None
        if spec.mode == "lstm":
            h_step, c_step = _lstm(spec, w, xn[t], h_rec, c, eps)
        elif spec.mode == "gru":
            h_step = _gru(spec, w, xn[t], h_rec, h, eps)
        else:
            h_step = _rnn(spec, w, xn[t], h_rec, eps)
        if m_h is not None:
            h_step = m_h[t] * h + (1 - m_h[t]) * h_step
        a = active[t]
        ys[t] = a * h_step
        h = a * h_step + (1 - a) * h
        if c_step is not None:
            if m_c is not None:
                c_step = m_c[t] * c + (1 - m_c[t]) * c_step
            cs[t] = a * c_step
            c = a * c_step + (1 - a) * c
    return torch.stack(ys), (torch.stack(cs) if c_step is not None else None), h, c


@dataclass
class OracleRun:
    outputs: dict[str, np.ndarray | None]   # y, h_n, c_n, h_all, c_all
    grads: dict[str, np.ndarray | None]     # params (flat), x, h0, c0


def run(params: ar.PackedParams, x: np.ndarray, lengths: np.ndarray | None, h0: np.ndarray,
        c0: np.ndarray | None, seed: int, training: bool,
        cotangents: dict[str, np.ndarray | None]) -> OracleRun:
    """The stack's outputs and the gradients of ``sum(<outputs[name], cotangents[name]>)`` (``x``
    time-major)."""
    spec = params.spec
    T, B = x.shape[:2]
    L, D = spec.num_layers, spec.num_directions
    flat, xt, h0t = (_tensor(a).requires_grad_() for a in (params.data, x, h0))
    c0t = _tensor(c0).requires_grad_() if spec.has_cell else None
    lengths = np.full(B, T) if lengths is None else np.asarray(lengths)
    active = _tensor((np.arange(T)[:, None] < lengths[None, :])[:, :, None].astype(float))
    masks = ar.cell_masks(spec, seed, B, T, training=training)
    inter = dropout_masks(spec, T, B, seed) if training else None
    inp, h_n, c_n, h_all, c_all = xt, [], [], [], []
    for layer in range(L):
        if layer and inter is not None:
            inp = inp * _tensor(inter[layer - 1])
        outs = []
        for direction in range(D):
            k = layer * D + direction
            w = _blocks(flat, spec, layer, direction)
            c_init = c0t[k] if c0t is not None else None
            ys, cs, h, c = _direction(spec, w, inp, active, h0t[k], c_init, masks, k, direction == 1)
            outs.append(ys)
            h_n.append(h)
            c_n.append(c)
            h_all.append(ys)
            c_all.append(cs)
        inp = torch.cat(outs, dim=-1)
    cell = spec.has_cell
    out = {"y": inp, "h_n": torch.stack(h_n), "h_all": torch.stack(h_all),
           "c_n": torch.stack(c_n) if cell else None, "c_all": torch.stack(c_all) if cell else None}
    loss = sum((out[name] * _tensor(value)).sum() for name, value in cotangents.items() if value is not None)
    inputs = [flat, xt, h0t] + ([c0t] if c0t is not None else [])
    grads = torch.autograd.grad(loss, inputs, allow_unused=True)
    named = dict(zip(["params", "x", "h0", "c0"], grads, strict=False))
    as_np = {name: (g.numpy() if g is not None else None) for name, g in named.items()}
    return OracleRun({k: v.detach().numpy() if v is not None else None for k, v in out.items()}, as_np)
