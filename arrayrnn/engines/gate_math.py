"""The scalar gate formulas, written once, shared by the numba CPU kernels and the CUDA kernels.

Every function here is a plain ``@numba.njit`` scalar function on already-activated gate values: the
numba CPU loops (:mod:`.numba.loop_parts` and the cells' loops) call them per element, and the ``@cuda.jit``
kernels (:mod:`.cupy.kernels`) call them as device functions (numba compiles an ``@njit`` function for the
CUDA target when a kernel calls it; the CUDA simulator calls it as is). The activations themselves
(sigmoid, tanh) stay per target: vectorisable polynomials on the CPU, the CUDA math library on the GPU.

``one`` is 1 in the compute dtype, passed in so float32 math never promotes to float64. Semantics
equal :mod:`arrayrnn.engines.cells` (the oracle), per element, with its association
(``d * g * (i * (1 - i))``, ``(dh - dh * z) * (1 - n * n)``: a derivative from the output is one factor, as
in :mod:`arrayrnn.cellmath`), so a built-in cell written through the cell API gives these kernels' bits::

    lstm:  c = clip(f*c_prev + i*g);  h = o * tanh(c)
    gru:   n = tanh(x_n + r * hn) (reset-after) ;  h = (1-z)*n + z*h_prev
    rnn:   d_pre = dh * (1 - y*y) (tanh) or dh * (y > 0) (relu)
    peepholes:  i, f = sig(pre + p*c_prev);  o = sig(pre + p*c)       zoneout:  h = m*h_prev + (1-m)*h~
    layer norm: x = (v - mean) * rstd,  rstd = 1 / sqrt(var + eps);  dv = rstd * (d - mean(d) - x * mean(d*x))
                (var of deviations scaled by 2**-600 where the squares overflow: layer_norm_rstd_rescaled)

(the layer norm's row forms, against which these are tested, are :mod:`.layer_norm`'s).
"""

from __future__ import annotations

import math

from ..core.spec import GATE_NAMES
from .numba_cache import njit

_JIT = dict(cache=True, nogil=True, error_model="numpy", inline="always")

# gate positions along the G*H axis, by name (spec.gate_names order)
_LSTM = {name: k for k, name in enumerate(GATE_NAMES["lstm"])}
_GRU = {name: k for k, name in enumerate(GATE_NAMES["gru"])}
LSTM_I, LSTM_F, LSTM_G, LSTM_O = (_LSTM[n] for n in ("i", "f", "g", "o"))
GRU_R, GRU_Z, GRU_N = (_GRU[n] for n in ("r", "z", "n"))
GRU_RZ_FIRST = min(GRU_R, GRU_Z)  # r and z are adjacent: one GEMM serves both (reset-before GRU)
assert abs(GRU_R - GRU_Z) == 1


# -- LSTM -----------------------------------------------------------------------------------------
@njit(**_JIT)
def lstm_cell(i, f, g, c_prev, lo, hi):
    """The new cell state ``clip(f*c_prev + i*g, lo, hi)`` (``lo, hi = -inf, inf`` without clipping)."""
    c = f * c_prev + i * g
    c = lo if c < lo else c
    return hi if c > hi else c


@njit(**_JIT)
def lstm_cell_grads(one, i, f, g, o, c, tanh_c, c_prev, dm, dc, use_clip, lo, hi):
    """Gradients of one LSTM element: ``(di, df, dg, do, dc_prev)`` (pre-activation gradients).

    ``dm``: d loss / d (o * tanh(c)); ``dc``: the carry from the next step. A clipped cell passes no
    gradient (``use_clip`` and ``c`` outside the open interval ``(lo, hi)``).
    """
    d = dc + lstm_output_grad(one, o, tanh_c, dm)
    di, df, dg, dc_prev = lstm_gate_grads(one, i, f, g, c, c_prev, d, use_clip, lo, hi)
    do = dm * tanh_c * (o * (one - o))
    return di, df, dg, do, dc_prev


@njit(**_JIT)
def lstm_output_grad(one, o, tanh_c, dm):
    """The cotangent of ``u`` in ``h = o * tanh(u)`` from ``dm``, that of ``h``: ``dm * o * (1 - tanh(u)**2)``
    (``u``: the cell, or with layer norm its normalised form ``g_c * LN(c) + b_c``)."""
    return dm * o * (one - tanh_c * tanh_c)


@njit(**_JIT)
def lstm_gate_grads(one, i, f, g, c, c_prev, d, use_clip, lo, hi):
    """``(di, df, dg, dc_prev)`` of one LSTM element from ``d``, the whole cotangent of its new cell ``c``
    (the carry and the output's part; with layer norm the output's part comes through the cell's norm)."""
    inside = (c > lo) & (c < hi)
    d = d if (inside or not use_clip) else d * (one - one)
    di = d * g * (i * (one - i))
    df = d * c_prev * (f * (one - f))
    dg = d * i * (one - g * g)
    return di, df, dg, d * f


# -- GRU ------------------------------------------------------------------------------------------
@njit(**_JIT)
def gru_candidate_input(x_n, r, hn):
    """Reset-after GRU: the argument of the candidate's tanh, ``x_n + r * (W_hn h + b_hn)``."""
    return x_n + r * hn


@njit(**_JIT)
def gru_output(z, n, h_prev):
    """``(1 - z) * n + z * h_prev``."""
    return n + z * (h_prev - n)


@njit(**_JIT)
def gru_zn_grads(one, z, n, h_prev, dh):
    """``(dz, dn, dh_prev part)``: pre-activation gradients of z and n and the direct carry ``dh*z``."""
    dn = (dh - dh * z) * (one - n * n)
    dz = dh * (h_prev - n) * (z * (one - z))
    return dz, dn, dh * z


@njit(**_JIT)
def sigmoid_grad(one, s, upstream):
    """Gradient through ``s = sigmoid(x)``: ``upstream * s * (1 - s)`` (the GRU's r gate)."""
    return upstream * (s * (one - s))


# -- plain RNN ------------------------------------------------------------------------------------
@njit(**_JIT)
def rnn_grad(one, relu, y, dh):
    """Gradient through ``y = act(pre)`` taken from the output."""
    zero = one - one
    slope = (one if y > zero else zero) if relu else one - y * y
    return dh * slope


# -- cell variants (issue 24): peepholes and zoneout ----------------------------------------------
@njit(**_JIT)
def peephole_input(pre, p, c):
    """A peephole gate's pre-activation: ``pre + p * c`` (i, f: ``c = c_{t-1}``; o: ``c = c_t``)."""
    return pre + p * c


@njit(**_JIT)
def lstm_peephole_cell_grads(one, i, f, g, o, c, tanh_c, c_prev, dm, dc, use_clip, lo, hi, p_i, p_f, p_o):
    """:func:`lstm_cell_grads` with peepholes ``p_i, p_f, p_o``: ``o`` also reads ``c`` (its gradient
    joins the cell's before the clip), ``i`` and ``f`` read ``c_prev`` (their gradients join ``dc_prev``)."""
    do = dm * tanh_c * (o * (one - o))
    di, df, dg, do, dc_prev = lstm_cell_grads(one, i, f, g, o, c, tanh_c, c_prev, dm, dc + do * p_o, use_clip,
                                              lo, hi)
    return di, df, dg, do, dc_prev + di * p_i + df * p_f


@njit(**_JIT)
def lstm_norm_unit_grads(one, i, f, g, o, c, tanh_c, c_prev, dm, d_cell, use_clip, lo, hi, p_i, p_f, p_o):
    """``(di, df, dg, do, dc_prev)`` of one element of a layer-normalised LSTM (``h = o * tanh_c``,
    ``tanh_c = tanh(g_c * LN(c) + b_c)``) from its output's cotangent ``dm`` and ``d_cell``, its cell's
    (the carry plus the output's part through the cell's norm); peepholes ``p_i, p_f, p_o`` (zeros
    without) as in :func:`lstm_peephole_cell_grads`."""
    do = sigmoid_grad(one, o, dm * tanh_c)
    di, df, dg, dc_prev = lstm_gate_grads(one, i, f, g, c, c_prev, d_cell + do * p_o, use_clip, lo, hi)
    return di, df, dg, do, dc_prev + di * p_i + df * p_f


@njit(**_JIT)
def zoneout(m, prev, new):
    """The zoned-out state ``m * prev + (1 - m) * new`` (``m``: 0 or 1 in training, the rate in inference)."""
    return new + m * (prev - new)


@njit(**_JIT)
def zoneout_grads(one, m, d):
    """Gradients through :func:`zoneout` of its cotangent ``d``: ``(d new, d prev)``."""
    return (one - m) * d, m * d


# -- layer normalisation (issue 38): one row's statistics and the scalar parts of LN's backward -----------
@njit(**_JIT)
def layer_norm_rstd(one, var, eps):
    """``1 / sqrt(var + eps)`` of a row of variance ``var`` (the mean of its squared deviations)."""
    return one / math.sqrt(var + eps)


# a power of two (scaling by it is exact): a float64 row's squared deviations past float64's range (beyond
# ~1e154) fit once scaled; a float32 row's fit float64 unscaled
LN_RESCALE = 2.0 ** -600


@njit(**_JIT)
def layer_norm_scale(itemsize):
    """The scale of a row's deviations in the rescaled pass, for a row of ``itemsize``-byte floats."""
    return LN_RESCALE if itemsize >= 8 else 1.0


@njit(**_JIT)
def layer_norm_rstd_rescaled(one, scaled_var, scale, eps):
    """``1 / sqrt(var + eps)`` from ``scaled_var``, the float64 mean of the squares of the deviations times
    ``scale`` (:func:`layer_norm_scale`): for a row whose squares overflowed (their sum was ``inf``), where
    :func:`layer_norm_rstd` gave 0 and the normalised row 0 (layer norm is scale-invariant: the right row
    is that of ``v * 1e-150``)."""
    return one * (scale / math.sqrt(scaled_var + float(eps) * scale * scale))


@njit(**_JIT)
def layer_normalized(v, mean, rstd):
    """An element of ``LN(v)``: ``(v - mean) * rstd``."""
    return (v - mean) * rstd


@njit(**_JIT)
def layer_norm_grad(rstd, d, x, mean_d, mean_dx):
    """The cotangent of ``v`` from the cotangent ``d`` of ``x = LN(v)`` and the row's means of ``d`` and of
    ``d * x``: ``rstd * (d - mean_d - x * mean_dx)``."""
    return rstd * (d - mean_d - x * mean_dx)
