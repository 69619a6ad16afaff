"""The plain RNN's (tanh or relu) compiled time loops, forward and backward: per active row of step ``t``,
``y[t] = act(xw[t] + h @ W_hh.T)`` (the loops' contract is :mod:`.loop_parts`'s)."""

from __future__ import annotations

from numba.extending import register_jitable

from .. import gate_math as gm
from .loop_parts import (
    JIT,
    add_rows,
    copy_rows,
    dy_plus_dh,
    masked_rows,
    norm_input,
    norm_rows,
    norm_rows_grad,
    one_of,
    scale_rows,
    split_zoned,
    step_time,
    tanh,
    unit_groups,
    zero_idle_raw_grads,
    zone_rows,
)
from .packed_gemm import gemm
from .simd_ir import prefer_full_vectors, simd_jit


@register_jitable(inline="always")
def rnn_activation(p, relu, zero):
    """The plain RNN's ``relu(p)`` or ``tanh(p)`` (``zero`` of ``p``'s type)."""
    return (p if p > zero else zero) if relu else tanh(p)


@simd_jit(**JIT)
def rnn_forward_loop(r0, r1, steps, state, cell, variants, work, norm, scratch):
    """``y[t] = act(xw[t] + h @ W_hh.T)`` for rows ``r0 .. r1`` (bundles: :class:`.Steps`, ``xw (T,B,H)``
    used as scratch; :class:`.State` (``h``); :class:`.RNNCell` packed for the forward; :class:`.Variants`;
    :class:`.ForwardWork`). The activation runs on each GEMM tile (one vector of units) as it is written.
    Recurrent dropout: the GEMM reads ``hm = h * h_mask``; zoneout of ``h`` after the step, ``xw[t]`` then
    keeps the step's own output ``h~`` (the backward's residual). Layer norm (:class:`.NormForward`): the
    product into ``raw``, then ``g_hh * LN(.)`` into ``xw[t]``."""
    prefer_full_vectors()
    xw, bs, y, reverse = steps
    h, c = state
    W_hh_p, relu = cell
    masked, h_mask, zone_h, m_h, zone_c, m_c = variants
    rows, hm, c_prev = work
    T, H = xw.shape[0], h.shape[1]
    zero = one_of(xw) * 0
    for s in range(T):
        t = step_time(s, T, reverse)
        n = min(bs[t], r1)
        if n > r0:
            pre = xw[t]
            if masked:
                masked_rows(h, h_mask, hm, r0, n)
            src = hm if masked else h
            if norm is None:
                unit_groups(src, r0, n, W_hh_p, 1, 0, W_hh_p.shape[0], pre, True, scratch)
            else:  # layer norm: the raw product apart, normalised into pre
                kept, inputs, g_ih, bias, g_hh, g_c, b_c, eps, stats, x_raw, raw = norm
                norm_input(t, r0, n, norm, xw)
                unit_groups(src, r0, n, W_hh_p, 1, 0, W_hh_p.shape[0], raw[t if kept else 0], False, scratch)
                norm_rows(t, r0, n, 0, H, 0, norm, pre, True)
            for b in range(r0, n):
                p, yb = pre[b], y[t, b]
                for j in range(H):
                    yb[j] = rnn_activation(p[j], relu, zero)
            if zone_h:
                copy_rows(xw[t, r0:n], y[t, r0:n])
                zone_rows(m_h, t, h, y[t], r0, n)
            copy_rows(h[r0:n], y[t, r0:n])
        y[t, max(n, r0):r1] = 0.0


@simd_jit(**JIT)
def rnn_backward_loop(r0, r1, y, grads, carry, cell, variants, work, norm, scratch):
    """The plain RNN backward of rows ``r0 .. r1``: ``y (T,B,H)`` each step's own output (the forward's
    ``y``, or its ``xw`` under zoneout); bundles :class:`.BackSteps`, ``dpre (T,B,H)`` out;
    :class:`.Cotangents` ``dh``; :class:`.RNNCell` packed for the backward; :class:`.Variants`;
    :class:`.BackwardWork` (``carry_h`` under zoneout). Recurrent dropout: the GEMM's ``dh`` times
    ``h_mask``. Layer norm (:class:`.NormBackward`): the GEMM reads the raw product's cotangent
    (:func:`norm_rows_grad`, into ``d_raw[t]``)."""
    prefer_full_vectors()
    bs, reverse, dy, dpre, d_h, dn_rec, has_seq, dc_seq = grads
    dh, dc = carry
    W_hh_p, relu = cell
    masked, h_mask, zone_h, m_h, zone_c, m_c = variants
    rows, drh, carry_h, carry_c = work
    T, H = y.shape[0], dh.shape[1]
    one = one_of(y)
    for s in range(T):
        t = step_time(T - 1 - s, T, reverse)
        n = min(bs[t], r1)
        if n > r0:
            if zone_h:  # the step's share of dy + dh, read below as dh
                dy_plus_dh(dy, t, dh, dh, r0, n)
                split_zoned(one, m_h, t, dh, dh, carry_h, r0, n)
            for b in range(r0, n):
                yb, dyb, dhb, d = y[t, b], dy[t, b], dh[b], dpre[t, b]
                for j in range(H):
                    d[j] = gm.rnn_grad(one, relu, yb[j], dhb[j] if zone_h else dyb[j] + dhb[j])
            if norm is not None:
                g_hh, g_c, stats, raw, d_raw, acc_hh, acc_c = norm
                norm_rows_grad(t, r0, n, 0, H, 0, dpre[t], norm)
                gemm(d_raw[t, r0:n], W_hh_p, 1, dh[r0:n], False, scratch)
            else:
                gemm(dpre[t, r0:n], W_hh_p, 1, dh[r0:n], False, scratch)
            if masked:
                scale_rows(dh, h_mask, r0, n)
            if zone_h:
                add_rows(carry_h, dh, r0, n)
        dpre[t, max(n, r0):r1] = 0.0
        if norm is not None:
            zero_idle_raw_grads(t, max(n, r0), r1, norm)
