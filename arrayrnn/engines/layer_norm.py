"""Layer normalisation inside the recurrence (``RNNSpec(layer_norm=True)``; Ba, Kiros and Hinton 2016, 3.1):
the row formulas, written once against ``xp``, and the stack driver's side of them (the input product).

For one row ``v`` (the whole ``G*H``-wide row of a product, or the ``H``-wide cell state)::

    LN(v) = (v - mean(v)) / sqrt(var(v) + eps)          # var: the biased (population) variance

Semantics of one layer-direction, roughly this Python loop (``@`` as ``x @ W.T``; ``b`` = ``b_ih + b_hh``
where both sit outside a product; every bias is added after the norm, next to its product's gain)::

    for t in steps:
        xn = g_ih * LN(W_ih x_t)                          # (G*H,): every step at once, before the loop
        hn = g_hh * LN(W_hh h_{t-1})                      # (G*H,)
        lstm:       i, f, g, o = gates(xn + hn + b)       # peepholes: i, f read c_{t-1}, o reads c_t
                    c_t = clip(f * c_{t-1} + i * g)       # clip before the norm
                    h_t = o * tanh(g_c * LN(c_t) + b_c)   # then W_hr h_t with a projection
        gru (reset-after):
                    r = sig(xn_r + b_ir + hn_r + b_hr);  z = sig(xn_z + b_iz + hn_z + b_hz)
                    n = tanh(xn_n + b_in + r * (hn_n + b_hn))   # r multiplies the normalised, gained
                                                                # recurrent n part plus its bias b_hn
                    h_t = (1 - z) * n + z * h_{t-1}
        gru (reset-before): the recurrent product comes in two parts, normalised each over its own row
                    (r is a function of the first, so the n part cannot join its statistics):
                    r, z = sig(xn_rz + g_hh_rz * LN(W_hrz h_{t-1}) + b_rz)              # 2H-wide row
                    n = tanh(xn_n + g_hh_n * LN(W_hn (r * h_{t-1})) + b_in + b_hn)      # H-wide row
        rnn:        h_t = act(xn + hn + b)

The gains start at ones and ``b_c`` at zeros (``PackedParams.init``). With recurrent dropout the product
reads ``h_{t-1} * mask``, with DropConnect ``W_hh * mask``; zoneout wraps the step as without the norm.

Residuals (what the backward keeps): the mean and ``1 / sqrt(var + eps)`` of each row normalised inside
the loop, per step and row (``DirectionCache.norm_stats``, 2 elements per normalised row: 4 per step-row
for LSTM and the reset-before GRU, 2 for the reset-after GRU and the plain RNN). On the reference and CuPy
engines nothing is kept of the input product: the backward computes ``W_ih x`` again (one GEMM over every
step, as the forward's) and its statistics; the recurrent products are computed again from ``h_{t-1}`` the
same way, and the cell from the kept ``c``. The numba engine keeps both raw products instead
(``DirectionCache.raw_input``, ``raw_recurrent``: its loops normalise the input side step by step too).

Backward of ``y = g * LN(v) + b`` for one row of width ``N``, with ``x = LN(v)``::

    dg += dy * x;  db += dy;  d = dy * g
    dv = rstd * (d - mean(d) - x * mean(d * x))

The numba and CUDA kernels use the scalar forms of these formulas in :mod:`.gate_math`.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from ..core.backend import get_xp
from .base import DirectionGrads, DirectionWeights, LayerNormWeights
from .gate_math import LN_RESCALE

Array = Any
STAT_MEAN, STAT_RSTD = 0, 1  # the last axis of a statistics array (norm_stats[..., s, :])


# -- one row (the last axis) --------------------------------------------------------------------------
def row_stats(xp: ModuleType, v: Array, eps: float, out: Array | None = None) -> Array:
    """``(..., 2)``: the mean and ``1 / sqrt(var + eps)`` of each row of ``v`` (into ``out`` if given).
    A narrower dtype than float64 is reduced in float64, as the numba loops do: the squares of a float32 row
    near 1e20 overflow float32 (the variance became inf, the outputs were off by 1 or more); a float64 row's
    past ~1e154 overflow float64, and are taken again scaled."""
    stats = xp.empty((*v.shape[:-1], 2), v.dtype) if out is None else out
    wide = v if v.dtype.itemsize >= 8 else v.astype(xp.float64)
    mean = wide.mean(axis=-1)
    centred = wide - mean[..., None]
    stats[..., STAT_MEAN] = mean
    if v.dtype.itemsize < 8:  # float64 squares of a narrower row never overflow
        var = xp.square(centred, out=centred).mean(axis=-1)
        stats[..., STAT_RSTD] = 1.0 / xp.sqrt(var + v.dtype.type(eps))
        return stats
    # float64: deviations past ~1e154 square past its range; those rows take their squares scaled by a power
    # of two (exact), as the kernels' rare pass does (gate_math.layer_norm_rstd_rescaled); no host branch
    scaled = xp.square(centred * LN_RESCALE).mean(axis=-1)
    with np.errstate(over="ignore", divide="ignore"):  # the side xp.where does not take
        var = xp.square(centred, out=centred).mean(axis=-1)
        rescaled = LN_RESCALE / xp.sqrt(scaled + eps * LN_RESCALE * LN_RESCALE)
    stats[..., STAT_RSTD] = xp.where(xp.isinf(var), rescaled, 1.0 / xp.sqrt(var + eps))
    return stats


def normalize(v: Array, stats: Array) -> Array:
    """``LN(v)`` from its statistics (a new array)."""
    return (v - stats[..., STAT_MEAN, None]) * stats[..., STAT_RSTD, None]


def row_grad(d: Array, x: Array, stats: Array) -> Array:
    """The cotangent of ``v`` from the cotangent ``d`` of ``x = LN(v)``: ``rstd * (d - mean(d) - x *
    mean(d * x))`` per row."""
    mean_d = d.mean(axis=-1, keepdims=True)
    mean_dx = (d * x).mean(axis=-1, keepdims=True)
    return stats[..., STAT_RSTD, None] * (d - mean_d - x * mean_dx)


# -- y = gain * LN(v) (+ a shift): what the kernels of the reference engine call per step --------------
def normalized(xp: ModuleType, v: Array, gain: Array, eps: float, stats_out: Array) -> Array:
    """``gain * LN(v)`` over each row of ``v``, its statistics written into ``stats_out`` (``(..., 2)``)."""
    return gain * normalize(v, row_stats(xp, v, eps, out=stats_out))


def normalized_backward(v: Array, stats: Array, gain: Array, dy: Array, d_gain: Array,
                        d_shift: Array) -> Array:
    """The cotangent of ``v`` through ``y = gain * LN(v) + shift`` for ``dy``; adds ``sum(dy * LN(v))``
    into ``d_gain`` and ``sum(dy)`` into ``d_shift`` (over the rows)."""
    x = normalize(v, stats)
    d_gain += (dy * x).sum(axis=0)
    d_shift += dy.sum(axis=0)
    return row_grad(dy * gain, x, stats)


def gain_grads(dy: Array, v: Array, stats: Array) -> tuple[Array, Array]:
    """``(sum(dy * LN(v)), sum(dy))`` over every step and row of ``(T, B, N)`` stacks: the gradients of the
    gain and of the shift beside it (``stats``: ``(T, B, 2)``)."""
    return (dy * normalize(v, stats)).sum(axis=(0, 1)), dy.sum(axis=(0, 1))


def new_gain_grads(xp: ModuleType, spec: Any, dtype: Any) -> dict[str, Array]:
    """Zeroed accumulators of the reductions a kernel returns as ``DirectionGrads.norm``."""
    G, H = spec.gate_size, spec.hidden_size
    acc = {"g_hh": xp.zeros(G, dtype), "b_hh": xp.zeros(G, dtype)}
    if spec.has_cell:
        acc["g_c"], acc["b_c"] = xp.zeros(H, dtype), xp.zeros(H, dtype)
    return acc


# -- the stack driver's side: weights, the input product ----------------------------------------------
def norm_weights(block: Callable[[str], Array | None], bias: Array | None, eps: float) -> LayerNormWeights:
    """A layer-direction's :class:`LayerNormWeights` from ``block(name)`` (its view or None) and the bias
    the plain stack would fold into ``xw``."""
    return LayerNormWeights(g_ih=block("g_ih"), g_hh=block("g_hh"), g_c=block("g_c"), b_c=block("b_c"),
                            bias=bias, eps=eps)


def normalize_input(xw: Array, norm: LayerNormWeights) -> Array:
    """``xw = g_ih * LN(xw) + bias`` in place over every step and row (``xw``: the raw ``W_ih x``)."""
    xp = get_xp(xw)
    stats = row_stats(xp, xw, norm.eps)
    xw -= stats[..., STAT_MEAN, None]
    xw *= stats[..., STAT_RSTD, None]
    xw *= norm.g_ih
    if norm.bias is not None:
        xw += norm.bias
    return xw


Project = Callable[[Array, DirectionWeights], Array]  # (layer_input, w) -> W_ih x (+ w.input_bias)


def input_backward(project: Project, grads: Any, layer: int, direction: int, w: DirectionWeights,
                   g: DirectionGrads, layer_input: Array) -> Array:
    """The backward of one layer-direction's norms, before the driver's hoisted products: ``g_ih``'s
    gradient from the input product (computed again: ``project`` is the engine's input projection,
    ``w.input_bias`` is None) and the kernel's reductions (``g.norm``: ``g_hh``, ``b_hh``, ``g_c``, ``b_c``)
    into ``grads``; returns the cotangent of the raw product ``W_ih x`` (``dW_ih``'s and ``dx``'s operand)."""
    norm = w.norm
    raw = project(layer_input, w)
    stats = row_stats(get_xp(raw), raw, norm.eps)
    x = normalize(raw, stats)
    del raw
    put_grads(grads, layer, direction, {"g_ih": (g.dpre_in * x).sum(axis=(0, 1)), **g.norm})
    return row_grad(g.dpre_in * norm.g_ih, x, stats)


def put_grads(grads: Any, layer: int, direction: int, named: dict[str, Array]) -> None:
    """The gains' (and shifts') gradients ``named`` into their blocks of ``grads`` (``b_hh`` only where the
    layout has it)."""
    for name, value in named.items():
        if grads.layout.has(layer, direction, name):
            grads.view(layer, direction, name)[...] = value
