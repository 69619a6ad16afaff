"""The LSTM's compiled time loops: forward (rows or columns split, with or without layer norm) and backward.

The loops' contract (row ranges, bundles, absent arrays, variants, layer norm) is :mod:`.loop_parts`'s;
per active row of step ``t``, roughly::

    xw[t] += h @ W_hh.T                              # per-step GEMM, in place
    i, f, g, o = sig(xw_i), sig(xw_f), tanh(xw_g), sig(xw_o)   # stored over xw[t] (the cache)
    c = clip(f * c + i * g);  h = o * tanh(c)        # h = (o * tanh(c)) @ W_hr.T with projection

Peepholes have their own tile (:func:`_lstm_peephole_tile`) and gate gradients (:func:`_lstm_peephole_grads`);
layer norm adds the cell's norm ``tanh(g_c * LN(c) + b_c)`` (:func:`_lstm_norm_tile`, its column split
:func:`lstm_norm_forward_columns`; backward :func:`_lstm_norm_grads`). :func:`lstm_forward_columns` splits the
units instead of the rows.
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

from .. import gate_math as gm
from ..gate_math import LSTM_F, LSTM_G, LSTM_I, LSTM_O
from ..numba_cache import njit
from .loop_parts import (
    JIT,
    JIT_SUMS,
    add_row,
    add_rows,
    column_step_end,
    copy_row,
    copy_rows,
    dy_plus_dh,
    masked_rows,
    norm_input,
    norm_rows,
    norm_rows_grad,
    one_of,
    row_stats,
    scale_rows,
    sigmoid,
    split_zoned,
    step_time,
    tanh,
    unit_groups,
    unit_range,
    zero_idle_raw_grads,
    zone_rows,
)
from .packed_gemm import gemm
from .simd_ir import prefer_full_vectors, simd_jit
from .spin_barrier import barrier


@register_jitable(inline="always")
def _store_lstm(gi_, gf_, gg_, go_, cb, tc_out, out, j, gi, gf, gg, go, cn, tc):
    """Unit ``j`` of an LSTM step: the activated gates over the pre-activations (the cache), the new cell,
    ``tanh(c)`` and the output ``o * tanh(c)``."""
    gi_[j] = gi
    gf_[j] = gf
    gg_[j] = gg
    go_[j] = go
    cb[j] = cn
    tc_out[j] = tc
    out[j] = go * tc


@register_jitable(inline="always")
def lstm_tile(xw, t, i0, i1, j0, j1, H, c, y, m, project, keep, tanh_c_all, clip_lo, clip_hi):
    """The LSTM gate math of rows ``i0 .. i1``, units ``j0 .. j1`` of step ``t`` (pre-activations in
    ``xw[t]``, just written by the tile's GEMM); ``o * tanh(c)`` into ``y[t]``, or, with ``project``, into
    ``m``. The loop runs over views that start at ``j0``: indexed from ``j0`` directly, LLVM did not
    vectorise it (scalar divisions, several times slower)."""
    for b in range(i0, i1):
        g = xw[t, b]
        gi_, gf_ = g[LSTM_I * H + j0:LSTM_I * H + j1], g[LSTM_F * H + j0:LSTM_F * H + j1]
        gg_, go_ = g[LSTM_G * H + j0:LSTM_G * H + j1], g[LSTM_O * H + j0:LSTM_O * H + j1]
        cb = c[b, j0:j1]
        out = m[b, j0:j1] if project else y[t, b, j0:j1]
        if keep:  # the activated gates over their pre-activations: the backward's residuals
            tc_out = tanh_c_all[t, b, j0:j1] if project else m[b, j0:j1]
            for j in range(j1 - j0):
                gi, gf, gg, go = sigmoid(gi_[j]), sigmoid(gf_[j]), tanh(gg_[j]), sigmoid(go_[j])
                cn = gm.lstm_cell(gi, gf, gg, cb[j], clip_lo, clip_hi)
                _store_lstm(gi_, gf_, gg_, go_, cb, tc_out, out, j, gi, gf, gg, go, cn, tanh(cn))
        else:  # no cache: xw and tanh(c) are scratch, only the cell and the output are stored
            for j in range(j1 - j0):
                gi, gf, gg, go = sigmoid(gi_[j]), sigmoid(gf_[j]), tanh(gg_[j]), sigmoid(go_[j])
                cn = gm.lstm_cell(gi, gf, gg, cb[j], clip_lo, clip_hi)
                cb[j] = cn
                out[j] = go * tanh(cn)


@simd_jit(**JIT)  # keyed on the variant: prefer_full_vectors depends on it
def _lstm_peephole_tile(xw, t, i0, i1, H, c, y, m, project, keep, tanh_c_all, clip_lo, clip_hi, P):
    """:func:`lstm_tile` (all units) with peepholes ``P (3,H)``: ``i``, ``f`` also read the cell entering
    the step, ``o`` the new (clipped) cell. Compiled apart, not inlined: the forward loop that calls it
    once per step then compiles in less time."""
    prefer_full_vectors()
    p_i, p_f, p_o = P[0], P[1], P[2]
    for b in range(i0, i1):
        g = xw[t, b]
        gi_, gf_, gg_, go_ = g[LSTM_I * H:(LSTM_I + 1) * H], g[LSTM_F * H:(LSTM_F + 1) * H], \
            g[LSTM_G * H:(LSTM_G + 1) * H], g[LSTM_O * H:(LSTM_O + 1) * H]
        cb = c[b]
        out = m[b] if project else y[t, b]
        tc_out = tanh_c_all[t if keep else 0, b] if project else m[b]
        for j in range(H):
            gi = sigmoid(gm.peephole_input(gi_[j], p_i[j], cb[j]))
            gf = sigmoid(gm.peephole_input(gf_[j], p_f[j], cb[j]))
            gg = tanh(gg_[j])
            cn = gm.lstm_cell(gi, gf, gg, cb[j], clip_lo, clip_hi)
            go = sigmoid(gm.peephole_input(go_[j], p_o[j], cn))
            tc = tanh(cn)
            _store_lstm(gi_, gf_, gg_, go_, cb, tc_out, out, j, gi, gf, gg, go, cn, tc)


@simd_jit(**JIT)
def _lstm_norm_tile(xw, t, i0, i1, H, c, y, m, project, tanh_c_all, clip_lo, clip_hi, P, norm):
    """:func:`_lstm_peephole_tile` with the cell's norm: ``h = o * tanh(g_c * LN(c) + b_c)`` (``P``: zeros
    without peepholes); ``tanh_c_all`` keeps each step's ``tanh(.)`` (the backward's residual), the cell's
    statistics go into slot 1."""
    prefer_full_vectors()
    kept, inputs, g_ih, bias, g_hh, g_c, b_c, eps, stats, x_raw, raw = norm
    one = one_of(xw)
    ts = t if kept else 0
    p_i, p_f, p_o = P[0], P[1], P[2]
    for b in range(i0, i1):
        g = xw[t, b]
        gi_, gf_, gg_, go_ = g[LSTM_I * H:(LSTM_I + 1) * H], g[LSTM_F * H:(LSTM_F + 1) * H], \
            g[LSTM_G * H:(LSTM_G + 1) * H], g[LSTM_O * H:(LSTM_O + 1) * H]
        cb = c[b]
        for j in range(H):
            gi = sigmoid(gm.peephole_input(gi_[j], p_i[j], cb[j]))
            gf = sigmoid(gm.peephole_input(gf_[j], p_f[j], cb[j]))
            gg = tanh(gg_[j])
            cn = gm.lstm_cell(gi, gf, gg, cb[j], clip_lo, clip_hi)
            gi_[j], gf_[j], gg_[j] = gi, gf, gg
            go_[j] = sigmoid(gm.peephole_input(go_[j], p_o[j], cn))
            cb[j] = cn
        mean, rstd = row_stats(one, cb, eps)
        stats[ts, b, 1, 0] = mean
        stats[ts, b, 1, 1] = rstd
        out, tc_out = m[b] if project else y[t, b], tanh_c_all[ts, b]
        _cell_output(cb, mean, rstd, g_c, b_c, go_, tc_out, out)


@register_jitable(inline="always")
def _cell_output(c, mean, rstd, g_c, b_c, o, tanh_c, out):
    """``tanh_c = tanh(g_c * LN(c) + b_c)`` and ``out = o * tanh_c`` over a row (or its units). Two loops:
    written as one (with the statistics from :func:`row_stats`), LLVM left it scalar, 6x slower."""
    for j in range(c.shape[0]):
        tanh_c[j] = g_c[j] * gm.layer_normalized(c[j], mean, rstd) + b_c[j]
    for j in range(c.shape[0]):
        tc = tanh(tanh_c[j])
        tanh_c[j] = tc
        out[j] = o[j] * tc


@simd_jit(**JIT)
def lstm_forward_loop(r0, r1, steps, state, cell, cache, variants, work, norm, scratch):
    """The LSTM forward of rows ``r0 .. r1`` (bundles: :class:`.Steps`, ``xw (T,B,4H)``; :class:`.State`;
    :class:`.LSTMCell` packed for the forward; :class:`.LSTMCache`; :class:`.Variants`;
    :class:`.ForwardWork`). Per step, per unit group and row tile: the tile's four gates (one GEMM tile)
    and at once their gate math; the projection ``(o * tanh(c)) @ W_hr.T`` from ``rows``. Recurrent
    dropout: the GEMM reads ``hm = h * h_mask``; zoneout after the step (``h~`` reads the cell before
    zoneout, kept in ``c_cand_all``; ``c_prev`` scratch); peepholes: :func:`_lstm_peephole_tile`."""
    prefer_full_vectors()
    xw, bs, y, reverse = steps
    h, c = state
    W_hh_p, W_hr_p, project, use_clip, clip_lo, clip_hi, peep, P = cell
    keep, c_all, tanh_c_all, c_cand_all = cache
    masked, h_mask, zone_h, m_h, zone_c, m_c = variants
    rows, hm, c_prev = work
    T, H = xw.shape[0], c.shape[1]
    for s in range(T):
        t = step_time(s, T, reverse)
        n = min(bs[t], r1)
        if n > r0:
            if masked:
                masked_rows(h, h_mask, hm, r0, n)
            src = hm if masked else h
            if zone_c:
                copy_rows(c_prev[r0:n], c[r0:n])
            if norm is not None:  # layer norm: the raw product apart, normalised into xw[t]; the cell's norm
                kept, inputs, g_ih, bias, g_hh, g_c, b_c, eps, stats, x_raw, raw = norm
                norm_input(t, r0, n, norm, xw)
                unit_groups(src, r0, n, W_hh_p, 4, 0, W_hh_p.shape[0] // 4, raw[t if kept else 0], False,
                             scratch)
                norm_rows(t, r0, n, 0, 4 * H, 0, norm, xw[t], True)
                _lstm_norm_tile(xw, t, r0, n, H, c, y, rows, project, tanh_c_all, clip_lo, clip_hi, P, norm)
            else:
                unit_groups(src, r0, n, W_hh_p, 4, 0, W_hh_p.shape[0] // 4, xw[t], True, scratch)
                if peep:
                    _lstm_peephole_tile(xw, t, r0, n, H, c, y, rows, project, keep, tanh_c_all, clip_lo,
                                        clip_hi, P)
                else:
                    lstm_tile(xw, t, r0, n, 0, H, H, c, y, rows, project, keep, tanh_c_all, clip_lo, clip_hi)
            if zone_c:
                if keep:
                    copy_rows(c_cand_all[t, r0:n], c[r0:n])
                zone_rows(m_c, t, c_prev, c, r0, n)
            if keep:
                for b in range(r0, n):
                    copy_row(c_all[t, b], c[b])
            if project:
                gemm(rows[r0:n], W_hr_p, 1, y[t, r0:n], False, scratch)
            if zone_h:
                zone_rows(m_h, t, h, y[t], r0, n)
            copy_rows(h[r0:n], y[t, r0:n])
        _idle_rows(t, max(n, r0), r1, y, keep, xw, c_all, project or norm is not None, tanh_c_all, zone_c,
                   c_cand_all)


@register_jitable(inline="always")
def _idle_rows(t, i0, i1, y, keep, xw, c_all, tanh_c_kept, tanh_c_all, zone_c, c_cand_all):
    """Rows ``i0 .. i1``, idle at step ``t`` of an LSTM forward: zero output, zero residuals where kept."""
    y[t, i0:i1] = 0.0
    if keep:
        xw[t, i0:i1] = 0.0
        c_all[t, i0:i1] = 0.0
        if tanh_c_kept:
            tanh_c_all[t, i0:i1] = 0.0
        if zone_c:
            c_cand_all[t, i0:i1] = 0.0



@simd_jit(**JIT)
def lstm_forward_columns(part, parts, sync, steps, state, cell, cache, work, scratch):
    """:func:`lstm_forward_loop` (no projection, no cell variants) over the units of one of ``parts``
    threads: each thread computes every row's gates of its unit groups, so it streams only its share of
    ``W_hh`` (the column split; the rows split needs every thread to stream all of it). The threads meet
    once per step (:func:`.spin_barrier.barrier` on ``sync``); :class:`.ColumnState` double-buffers the
    state, so the final state is ``h_buf[T % 2]``. ``rows (B,H)``: scratch for ``tanh(c)``."""
    prefer_full_vectors()
    xw, bs, y, reverse = steps
    h_buf, c = state
    W_hh_p, W_hr_p, project, use_clip, clip_lo, clip_hi, peep, P = cell
    keep, c_all, tanh_c_all, c_cand_all = cache
    rows, hm, c_prev = work
    T, B, H = xw.shape[0], xw.shape[1], c.shape[1]
    u0, u1, j0, j1 = unit_range(part, parts, W_hh_p.shape[0] // 4, W_hh_p.shape[2], H)
    for s in range(T):
        t = step_time(s, T, reverse)
        n = min(bs[t], B)
        src, dst, gates = h_buf[s % 2], h_buf[(s + 1) % 2], xw[t]
        unit_groups(src, 0, n, W_hh_p, 4, u0, u1, gates, True, scratch)
        lstm_tile(xw, t, 0, n, j0, j1, H, c, y, rows, False, keep, c_all, clip_lo, clip_hi)
        column_step_end(xw, t, n, j0, j1, H, 4, src, dst, y, keep)
        if keep:
            for b in range(n):
                copy_row(c_all[t, b, j0:j1], c[b, j0:j1])
            c_all[t, n:, j0:j1] = 0.0
        if not barrier(sync, parts):
            return  # cancelled: the call is failing (loop_threads.run_columns)


@simd_jit(**JIT_SUMS)
def _norm_unit_columns(t, n, j0, j1, H, part, norm, xw, in_stats):
    """Layer norm of a column split's step ``t``, units ``j0 .. j1`` of each of the 4 gates, rows ``0 ..
    n``: ``xw[t] = g_ih * LN(x_raw[t]) + b + g_hh * LN(raw[t])`` in those columns (``in_stats``: the input
    rows' statistics, taken before any part wrote ``xw[t]``); each part takes every row's product
    statistics itself (part 0 keeps them)."""
    prefer_full_vectors()
    kept, inputs, g_ih, bias, g_hh, g_c, b_c, eps, stats, x_raw, raw = norm
    one = one_of(xw)
    ts = t if kept else 0
    for b in range(n):
        r = raw[ts, b]
        mean, rstd = row_stats(one, r, eps)
        if part == 0:
            stats[ts, b, 0, 0] = mean
            stats[ts, b, 0, 1] = rstd
        mean_in, rstd_in = in_stats[b, 0], in_stats[b, 1]
        for k in range(4):
            c0, c1 = k * H + j0, k * H + j1
            out, v, rv = xw[t, b, c0:c1], x_raw[t, b, c0:c1], r[c0:c1]
            gi, bi, gh = g_ih[c0:c1], bias[c0:c1], g_hh[c0:c1]
            for j in range(c1 - c0):
                out[j] = (gi[j] * gm.layer_normalized(v[j], mean_in, rstd_in) + bi[j]
                          + gh[j] * gm.layer_normalized(rv[j], mean, rstd))


@simd_jit(**JIT)
def _lstm_norm_cell_columns(xw, t, n, j0, j1, H, c, clip_lo, clip_hi):
    """The gates and the new cell of units ``j0 .. j1``, rows ``0 .. n`` of a column split's step ``t``."""
    prefer_full_vectors()
    for b in range(n):
        g = xw[t, b]
        gi_, gf_ = g[LSTM_I * H + j0:LSTM_I * H + j1], g[LSTM_F * H + j0:LSTM_F * H + j1]
        gg_, go_ = g[LSTM_G * H + j0:LSTM_G * H + j1], g[LSTM_O * H + j0:LSTM_O * H + j1]
        cb = c[b, j0:j1]
        for j in range(j1 - j0):
            gi, gf, gg = sigmoid(gi_[j]), sigmoid(gf_[j]), tanh(gg_[j])
            gi_[j], gf_[j], gg_[j], go_[j] = gi, gf, gg, sigmoid(go_[j])
            cb[j] = gm.lstm_cell(gi, gf, gg, cb[j], clip_lo, clip_hi)


@simd_jit(**JIT)
def _lstm_norm_output_columns(xw, t, n, j0, j1, H, part, c, y, tanh_c_all, norm):
    """``y[t] = o * tanh(g_c * LN(c) + b_c)`` for units ``j0 .. j1``, rows ``0 .. n``, once every part's
    cell is written (each part takes every row's cell statistics itself; part 0 keeps them)."""
    prefer_full_vectors()
    kept, inputs, g_ih, bias, g_hh, g_c, b_c, eps, stats, x_raw, raw = norm
    one = one_of(xw)
    ts = t if kept else 0
    for b in range(n):
        mean, rstd = row_stats(one, c[b], eps)
        if part == 0:
            stats[ts, b, 1, 0] = mean
            stats[ts, b, 1, 1] = rstd
        go_, tc_out = xw[t, b, LSTM_O * H + j0:LSTM_O * H + j1], tanh_c_all[ts, b, j0:j1]
        _cell_output(c[b, j0:j1], mean, rstd, g_c[j0:j1], b_c[j0:j1], go_, tc_out, y[t, b, j0:j1])


@simd_jit(**JIT)
def lstm_norm_forward_columns(part, parts, sync, steps, state, cell, cache, work, norm, scratch):
    """:func:`lstm_forward_columns` with layer norm (``inputs``: the loop normalises the input side). A
    normalised row needs every unit, so each part takes the statistics of whole rows itself, and the
    parts meet three times a step: after the product (its columns), after the cell, at the end."""
    prefer_full_vectors()
    xw, bs, y, reverse = steps
    h_buf, c = state
    W_hh_p, W_hr_p, project, use_clip, clip_lo, clip_hi, peep, P = cell
    keep, c_all, tanh_c_all, c_cand_all = cache
    rows, hm, c_prev = work
    kept, inputs, g_ih, bias, g_hh, g_c, b_c, eps, stats, x_raw, raw = norm
    T, B, H = xw.shape[0], xw.shape[1], c.shape[1]
    one = one_of(xw)
    u0, u1, j0, j1 = unit_range(part, parts, W_hh_p.shape[0] // 4, W_hh_p.shape[2], H)
    in_stats = np.empty((B, 2), xw.dtype)
    for s in range(T):
        t = step_time(s, T, reverse)
        n = min(bs[t], B)
        src, dst = h_buf[s % 2], h_buf[(s + 1) % 2]
        unit_groups(src, 0, n, W_hh_p, 4, u0, u1, raw[t if kept else 0], False, scratch)
        for b in range(n):
            mean, rstd = row_stats(one, x_raw[t, b], eps)
            in_stats[b, 0] = mean
            in_stats[b, 1] = rstd
        if not barrier(sync, parts):
            return  # cancelled: the call is failing (loop_threads.run_columns)
        _norm_unit_columns(t, n, j0, j1, H, part, norm, xw, in_stats)
        _lstm_norm_cell_columns(xw, t, n, j0, j1, H, c, clip_lo, clip_hi)
        if not barrier(sync, parts):
            return
        _lstm_norm_output_columns(xw, t, n, j0, j1, H, part, c, y, tanh_c_all, norm)
        column_step_end(xw, t, n, j0, j1, H, 4, src, dst, y, keep)
        if keep:
            for b in range(n):
                copy_row(c_all[t, b, j0:j1], c[b, j0:j1])
            c_all[t, n:, j0:j1] = 0.0
            tanh_c_all[t, n:, j0:j1] = 0.0
        if not barrier(sync, parts):
            return


@simd_jit(**JIT)
def lstm_backward_loop(r0, r1, residuals, grads, carry, cell, variants, work, norm, scratch):
    """The LSTM backward of rows ``r0 .. r1``, steps in reverse order of the forward (bundles:
    :class:`.LSTMResiduals`; :class:`.BackSteps`, ``dpre (T,B,4H)`` out; :class:`.Cotangents` ``dh``, ``dc``,
    carried in and out; :class:`.LSTMCell` packed for the backward; :class:`.Variants`;
    :class:`.BackwardWork`). Per step: the carried cotangents' shares (:func:`_lstm_carried_in`), the gate
    gradients (:func:`_lstm_gate_grads`; peepholes: :func:`_lstm_peephole_grads`), ``dh = dpre @ W_hh`` (times
    ``h_mask`` under recurrent dropout), the carried shares of zoneout added back. Layer norm
    (:class:`.NormBackward`): the gate gradients through the cell's norm (:func:`_lstm_norm_grads`), then the
    product's norm (:func:`norm_rows_grad`: ``d_raw[t]``, the raw product's cotangent, is the GEMM's
    operand)."""
    prefer_full_vectors()
    gates, c_all, c_prev, tanh_c_all = residuals
    bs, reverse, dy, dpre, d_h, dn_rec, has_seq, dc_seq = grads
    dh, dc = carry
    W_hh_p, W_hr_p, project, use_clip, clip_lo, clip_hi, peep, P = cell
    masked, h_mask, zone_h, m_h, zone_c, m_c = variants
    rows, drh, carry_h, carry_c = work
    T, H = gates.shape[0], dc.shape[1]
    for s in range(T):
        t = step_time(T - 1 - s, T, reverse)
        n = min(bs[t], r1)
        if n > r0:
            _lstm_carried_in(t, r0, n, grads, carry, cell, variants, work, scratch)
            if norm is not None:
                _lstm_norm_grads(t, r0, n, residuals, grads, carry, cell, variants, work, norm)
            elif peep:
                _lstm_peephole_grads(t, r0, n, residuals, grads, carry, cell, variants, work)
            else:
                _lstm_gate_grads(t, r0, n, gates, c_all, c_prev, tanh_c_all, dy, dh, dc, rows, dpre, project,
                                 zone_h, use_clip, clip_lo, clip_hi, None)
            if zone_c:
                add_rows(carry_c, dc, r0, n)
            if norm is not None:
                g_hh, g_c, stats, raw, d_raw, acc_hh, acc_c = norm
                norm_rows_grad(t, r0, n, 0, 4 * H, 0, dpre[t], norm)
                gemm(d_raw[t, r0:n], W_hh_p, 1, dh[r0:n], False, scratch)
            else:
                gemm(dpre[t, r0:n], W_hh_p, 1, dh[r0:n], False, scratch)
            if masked:
                scale_rows(dh, h_mask, r0, n)
            if zone_h:
                add_rows(carry_h, dh, r0, n)
        dpre[t, max(n, r0):r1] = 0.0
        if project:
            d_h[t, max(n, r0):r1] = 0.0
        if norm is not None:
            zero_idle_raw_grads(t, max(n, r0), r1, norm)


@simd_jit(**JIT_SUMS)
def _lstm_norm_grads(t, r0, n, residuals, grads, carry, cell, variants, work, norm):
    """The gate gradients of step ``t``, rows ``r0 .. n``, through the cell's norm ``tanh(g_c * LN(c) +
    b_c)`` (``tanh_c_all`` holds it): a first pass for the row's sums (and the per-row sums of ``g_c``'s and
    ``b_c``'s gradients, into ``acc_c``), a second for :func:`.gate_math.lstm_norm_unit_grads` (``P``:
    zeros without peepholes), split in two loops (one, LLVM left scalar: 1.7x slower). The output's cotangent
    is first gathered into a row (``rows`` under projection, else ``drh``)."""
    prefer_full_vectors()
    gates, c_all, c_prev, tanh_c_all = residuals
    bs, reverse, dy, dpre, d_h, dn_rec, has_seq, dc_seq = grads
    dh, dc = carry
    W_hh_p, W_hr_p, project, use_clip, clip_lo, clip_hi, peep, P = cell
    masked, h_mask, zone_h, m_h, zone_c, m_c = variants
    rows, drh, carry_h, carry_c = work
    g_hh, g_c, stats, raw, d_raw, acc_hh, acc_c = norm
    H = dc.shape[1]
    one = one_of(dy)
    inv = one / H
    for b in range(r0, n):
        g, d = gates[t, b], dpre[t, b]
        cb, cp, dcb, tcb = c_all[t, b], c_prev[t, b], dc[b], tanh_c_all[t, b]
        dm = rows[b] if project else drh[b]  # the cotangent of o * tanh(.)
        if not project:
            if zone_h:  # dh holds the step's share of dy + dh already
                copy_row(dm, dh[b])
            else:
                add_row(dy[t, b], dh[b], dm)
        go_ = g[LSTM_O * H:(LSTM_O + 1) * H]
        d_gain, d_shift = acc_c[b, 0], acc_c[b, 1]
        mean, rstd = stats[t, b, 1, 0], stats[t, b, 1, 1]
        sum_d, sum_dx = one - one, one - one
        for j in range(H):
            du = gm.lstm_output_grad(one, go_[j], tcb[j], dm[j])  # the cotangent of g_c * LN(c) + b_c
            x = gm.layer_normalized(cb[j], mean, rstd)
            d_gain[j] += du * x
            d_shift[j] += du
            dd = du * g_c[j]
            sum_d += dd
            sum_dx += dd * x
        mean_d, mean_dx = sum_d * inv, sum_dx * inv
        for j in range(H):  # dc: the carry, then the cell's whole cotangent (the output's part joins)
            du = gm.lstm_output_grad(one, go_[j], tcb[j], dm[j])
            x = gm.layer_normalized(cb[j], mean, rstd)
            dcb[j] += gm.layer_norm_grad(rstd, du * g_c[j], x, mean_d, mean_dx)
        for j in range(H):
            gi, gf, gg, go = g[LSTM_I * H + j], g[LSTM_F * H + j], g[LSTM_G * H + j], go_[j]
            p_i, p_f, p_o = P[0, j], P[1, j], P[2, j]
            di, df, dg, do, dcp = gm.lstm_norm_unit_grads(one, gi, gf, gg, go, cb[j], tcb[j], cp[j], dm[j],
                                                          dcb[j], use_clip, clip_lo, clip_hi, p_i, p_f, p_o)
            _store_lstm_grads(d, dcb, j, H, di, df, dg, do, dcp)


@register_jitable(inline="always")
def _store_lstm_grads(d, dcb, j, H, di, df, dg, do, dcp):
    """Unit ``j``'s gate gradients into ``d`` (a row of ``dpre``), the entering cell's into ``dcb``."""
    d[LSTM_I * H + j] = di
    d[LSTM_F * H + j] = df
    d[LSTM_G * H + j] = dg
    d[LSTM_O * H + j] = do
    dcb[j] = dcp


@simd_jit(**JIT)
def _lstm_carried_in(t, r0, n, grads, carry, cell, variants, work, scratch):
    """Step ``t``'s share of the carried cotangents, rows ``r0 .. n``: every step's ``dc_seq`` joins ``dc``;
    zoneout splits ``dc`` and ``dy + dh`` (the step's share, read as ``dh``, or ``d_h`` with projection);
    with projection, ``d_h = dy + dh`` and ``rows = d_h @ W_hr``. Compiled apart (glue, once a step)."""
    prefer_full_vectors()
    bs, reverse, dy, dpre, d_h, dn_rec, has_seq, dc_seq = grads
    dh, dc = carry
    W_hh_p, W_hr_p, project, use_clip, clip_lo, clip_hi, peep, P = cell
    masked, h_mask, zone_h, m_h, zone_c, m_c = variants
    rows, drh, carry_h, carry_c = work
    one = one_of(dy)
    if has_seq:
        add_rows(dc_seq[t], dc, r0, n)
    if zone_c:
        split_zoned(one, m_c, t, dc, dc, carry_c, r0, n)
    if zone_h:
        dy_plus_dh(dy, t, dh, dh, r0, n)
        split_zoned(one, m_h, t, dh, d_h[t] if project else dh, carry_h, r0, n)
    if project:
        if not zone_h:
            dy_plus_dh(dy, t, dh, d_h[t], r0, n)
        gemm(d_h[t, r0:n], W_hr_p, 1, rows[r0:n], False, scratch)


@simd_jit(**JIT)
def _lstm_peephole_grads(t, r0, n, residuals, grads, carry, cell, variants, work):
    """:func:`_lstm_gate_grads` with the peepholes; compiled apart like :func:`_lstm_peephole_tile`."""
    prefer_full_vectors()
    gates, c_all, c_prev, tanh_c_all = residuals
    bs, reverse, dy, dpre, d_h, dn_rec, has_seq, dc_seq = grads
    dh, dc = carry
    W_hh_p, W_hr_p, project, use_clip, clip_lo, clip_hi, peep, P = cell
    masked, h_mask, zone_h, m_h, zone_c, m_c = variants
    rows, drh, carry_h, carry_c = work
    _lstm_gate_grads(t, r0, n, gates, c_all, c_prev, tanh_c_all, dy, dh, dc, rows, dpre, project, zone_h,
                     use_clip, clip_lo, clip_hi, P)


@njit(inline="always")  # numba inlines it before typing: the plain call's None prunes the peephole branch
def _lstm_gate_grads(t, r0, n, gates, c_all, c_prev, tanh_c_all, dy, dh, dc, rows, dpre, project, zone_h,
                     use_clip, clip_lo, clip_hi, peepholes):
    """The gate gradients of step ``t``, rows ``r0 .. n`` (:func:`.gate_math.lstm_cell_grads`; with
    ``peepholes``, the cell's ``P``, :func:`.gate_math.lstm_peephole_cell_grads`): into ``dpre[t]``, the
    entering cell's cotangent into ``dc``. The output's cotangent: ``rows`` (``d_h @ W_hr``) with projection,
    else ``dy[t] + dh`` (``dh`` alone under zoneout: it holds the step's share)."""
    H = dc.shape[1]
    one = one_of(dy)
    for b in range(r0, n):
        g, d = gates[t, b], dpre[t, b]
        cb, cp, dcb = c_all[t, b], c_prev[t, b], dc[b]
        dyb, dhb, dmb = dy[t, b], dh[b], rows[b]
        tcb = tanh_c_all[t, b] if project else cb
        for j in range(H):
            gi, gf = g[LSTM_I * H + j], g[LSTM_F * H + j]
            gg, go = g[LSTM_G * H + j], g[LSTM_O * H + j]
            tc = tcb[j] if project else tanh(cb[j])
            dmj = dmb[j] if project else (dhb[j] if zone_h else dyb[j] + dhb[j])
            if peepholes is None:
                di, df, dg, do, dcp = gm.lstm_cell_grads(one, gi, gf, gg, go, cb[j], tc, cp[j], dmj, dcb[j],
                                                         use_clip, clip_lo, clip_hi)
            else:
                di, df, dg, do, dcp = gm.lstm_peephole_cell_grads(
                    one, gi, gf, gg, go, cb[j], tc, cp[j], dmj, dcb[j], use_clip, clip_lo, clip_hi,
                    peepholes[0, j], peepholes[1, j], peepholes[2, j])
            _store_lstm_grads(d, dcb, j, H, di, df, dg, do, dcp)
