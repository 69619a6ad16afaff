"""The GRU's compiled time loops: forward (reset-after and reset-before; the reset-after one also split by
columns) and backward.

The loops' contract (row ranges, bundles, absent arrays, variants, layer norm) is :mod:`.loop_parts`'s;
per active row of step ``t`` of the default (reset-after) GRU, roughly::

    rows = h @ W_hh.T                                # per-step GEMM (r, z, n parts)
    r, z = sig(xw_r + rows_r), sig(xw_z + rows_z)
    n = tanh(xw_n + r * (rows_n + b_hn));  h = (1 - z) * n + z * h

The reset-before GRU's n product needs every unit's ``r * h`` first (:func:`_gru_before_step`).
"""

from __future__ import annotations

from numba.extending import register_jitable

from .. import gate_math as gm
from ..gate_math import GRU_N, GRU_R, GRU_RZ_FIRST, GRU_Z
from .loop_parts import (
    JIT,
    add_masked,
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
def gru_after_tile(xw, t, i0, i1, j0, j1, H, h, hh, b_hn, y, hn_all, keep):
    """Reset-after GRU gate math of rows ``i0 .. i1``, units ``j0 .. j1`` (``hh = h @ W_hh.T`` there);
    over views that start at ``j0`` (see :func:`.lstm_loops.lstm_tile`)."""
    R, Z, N = GRU_R * H, GRU_Z * H, GRU_N * H
    bias = b_hn[j0:j1]
    for b in range(i0, i1):
        g, q = xw[t, b], hh[b]
        gr, gz, gn = g[R + j0:R + j1], g[Z + j0:Z + j1], g[N + j0:N + j1]
        qr, qz, qn = q[R + j0:R + j1], q[Z + j0:Z + j1], q[N + j0:N + j1]
        hb, yb = h[b, j0:j1], y[t, b, j0:j1]
        if keep:  # the activated gates over their pre-activations, W_hn h + b_hn: the backward's residuals
            hn_out = hn_all[t, b, j0:j1]
            for j in range(j1 - j0):
                r, z, hn = sigmoid(gr[j] + qr[j]), sigmoid(gz[j] + qz[j]), qn[j] + bias[j]
                nn = tanh(gm.gru_candidate_input(gn[j], r, hn))
                gr[j], gz[j], gn[j], hn_out[j] = r, z, nn, hn
                yb[j] = gm.gru_output(z, nn, hb[j])
        else:  # no cache: xw and hn_all are scratch, only the output is stored
            for j in range(j1 - j0):
                r, z, hn = sigmoid(gr[j] + qr[j]), sigmoid(gz[j] + qz[j]), qn[j] + bias[j]
                nn = tanh(gm.gru_candidate_input(gn[j], r, hn))
                yb[j] = gm.gru_output(z, nn, hb[j])


@simd_jit(**JIT)
def gru_forward_columns(part, parts, sync, steps, state, cell, cache, work, scratch):
    """:func:`gru_forward_loop` (reset-after, no cell variants) over the units of one of ``parts`` threads,
    the column split of :func:`.lstm_loops.lstm_forward_columns` (:class:`.ColumnState` likewise). ``rows
    (B,3H)``: scratch the parts share, each writing and reading only its units' columns."""
    prefer_full_vectors()
    xw, bs, y, reverse = steps
    h_buf, c = state
    W_hh_p, W_rz_p, W_n_p, reset_after, b_hn = cell
    keep, hn_all = cache
    rows, hm, c_prev = work
    T, B, H = xw.shape[0], xw.shape[1], h_buf.shape[2]
    u0, u1, j0, j1 = unit_range(part, parts, W_hh_p.shape[0] // 3, W_hh_p.shape[2], H)
    for s in range(T):
        t = step_time(s, T, reverse)
        n = min(bs[t], B)
        src, dst = h_buf[s % 2], h_buf[(s + 1) % 2]
        unit_groups(src, 0, n, W_hh_p, 3, u0, u1, rows, False, scratch)
        gru_after_tile(xw, t, 0, n, j0, j1, H, src, rows, b_hn, y, hn_all, keep)
        column_step_end(xw, t, n, j0, j1, H, 3, src, dst, y, keep)
        if keep:
            hn_all[t, n:, j0:j1] = 0.0
        if not barrier(sync, parts):
            return  # cancelled: the call is failing (loop_threads.run_columns)


@simd_jit(**JIT)
def gru_forward_loop(r0, r1, steps, state, cell, cache, variants, work, norm, scratch):
    """The GRU forward of rows ``r0 .. r1`` (bundles: :class:`.Steps`, ``xw (T,B,3H)`` overwritten by r, z,
    n; :class:`.State` (``h``); :class:`.GRUCell` packed for the forward; :class:`.GRUCache` (reset-after:
    ``hn_all`` keeps ``W_hn h + b_hn``); :class:`.Variants`; :class:`.ForwardWork`, ``rows (B,3H)``).
    Reset-after: one fused tile per unit group and row tile. Reset-before (:func:`_gru_before_step`): the
    n product needs every unit's ``r * h`` first, so it runs after the r, z product. Recurrent dropout: the
    products read ``hm = h * h_mask`` (``z * h`` keeps the carried ``h``); zoneout of ``h`` after the step.
    Layer norm (:class:`.NormForward`): each product into ``raw``, then ``g_hh * LN(.)`` where the plain
    product would go (reset-after: ``rows``, which the tile reads)."""
    prefer_full_vectors()
    xw, bs, y, reverse = steps
    h, c = state
    W_hh_p, W_rz_p, W_n_p, reset_after, b_hn = cell
    keep, hn_all = cache
    masked, h_mask, zone_h, m_h, zone_c, m_c = variants
    rows, hm, c_prev = work
    T, H = xw.shape[0], h.shape[1]
    for s in range(T):
        t = step_time(s, T, reverse)
        n = min(bs[t], r1)
        if n > r0:
            if masked:
                masked_rows(h, h_mask, hm, r0, n)
            if norm is not None:
                norm_input(t, r0, n, norm, xw)
            if reset_after:
                product = rows
                if norm is not None:  # the raw product apart, normalised into rows
                    kept, inputs, g_ih, bias, g_hh, g_c, b_c, eps, stats, x_raw, raw = norm
                    product = raw[t if kept else 0]
                unit_groups(hm if masked else h, r0, n, W_hh_p, 3, 0, W_hh_p.shape[0] // 3, product, False,
                             scratch)
                if norm is not None:
                    norm_rows(t, r0, n, 0, 3 * H, 0, norm, rows, False)
                gru_after_tile(xw, t, r0, n, 0, H, H, h, rows, b_hn, y, hn_all, keep)
            else:
                _gru_before_step(t, r0, n, steps, state, cell, variants, work, norm, scratch)
            if zone_h:
                zone_rows(m_h, t, h, y[t], r0, n)
            copy_rows(h[r0:n], y[t, r0:n])
        y[t, max(n, r0):r1] = 0.0
        if keep:
            xw[t, max(n, r0):r1] = 0.0
            if reset_after:
                hn_all[t, max(n, r0):r1] = 0.0


@simd_jit(**JIT)
def _gru_before_step(t, r0, n, steps, state, cell, variants, work, norm, scratch):
    """A reset-before GRU step, rows ``r0 .. n``: the r, z product and gates, ``r * h`` (of the masked ``h``
    under recurrent dropout) into ``rows``, its n product, the output. Compiled apart, like
    :func:`.lstm_loops._lstm_peephole_tile`."""
    prefer_full_vectors()
    xw, bs, y, reverse = steps
    h, c = state
    W_hh_p, W_rz_p, W_n_p, reset_after, b_hn = cell
    masked, h_mask, zone_h, m_h, zone_c, m_c = variants
    rows, hm, c_prev = work
    H = h.shape[1]
    R, Z, N, RZ = GRU_R * H, GRU_Z * H, GRU_N * H, GRU_RZ_FIRST * H
    src = hm if masked else h
    if norm is not None:  # layer norm: each product over its own row (r, z in slot 0, n in slot 1)
        kept, inputs, g_ih, bias, g_hh, g_c, b_c, eps, stats, x_raw, raw = norm
        gemm(src[r0:n], W_rz_p, 1, raw[t if kept else 0, r0:n, RZ:RZ + 2 * H], False, scratch)
        norm_rows(t, r0, n, RZ, RZ + 2 * H, 0, norm, xw[t], True)
    else:
        gemm(src[r0:n], W_rz_p, 1, xw[t, r0:n, RZ:RZ + 2 * H], True, scratch)
    for b in range(r0, n):
        g, hb, q = xw[t, b], src[b], rows[b]
        for j in range(H):
            r = sigmoid(g[R + j])
            g[R + j] = r
            g[Z + j] = sigmoid(g[Z + j])
            q[j] = r * hb[j]
    if norm is not None:
        kept, inputs, g_ih, bias, g_hh, g_c, b_c, eps, stats, x_raw, raw = norm
        gemm(rows[r0:n, :H], W_n_p, 1, raw[t if kept else 0, r0:n, N:N + H], False, scratch)
        norm_rows(t, r0, n, N, N + H, 1, norm, xw[t], True)
    else:
        gemm(rows[r0:n, :H], W_n_p, 1, xw[t, r0:n, N:N + H], True, scratch)
    for b in range(r0, n):
        g, hb, yb = xw[t, b], h[b], y[t, b]
        for j in range(H):
            nn = tanh(g[N + j])
            z = g[Z + j]
            g[N + j] = nn
            yb[j] = gm.gru_output(z, nn, hb[j])


@simd_jit(**JIT)
def gru_backward_loop(r0, r1, residuals, grads, carry, cell, variants, work, norm, scratch):
    """The GRU backward of rows ``r0 .. r1`` (bundles: :class:`.GRUResiduals`; :class:`.BackSteps`,
    ``dpre (T,B,3H)`` out and, reset-after, ``dn_rec (T,B,H)``, the n part of the gradient of ``W_hh h +
    b_hh`` (``dpre``'s times r; its r, z parts are ``dpre``'s); :class:`.Cotangents` ``dh``;
    :class:`.GRUCell` packed for the backward; :class:`.Variants`; :class:`.BackwardWork`). Per step: the z
    and n gradients, then the r gradient and the recurrent products (:func:`_gru_after_grads`,
    :func:`_gru_before_grads`). Recurrent dropout: the products' share of ``dh`` times ``h_mask``;
    zoneout: ``dy + dh`` splits into the step's share and the carried share (``carry_h``, added after).
    Layer norm (:class:`.NormBackward`): each product's operand through its norm first (``d_raw[t]``, the
    raw product's cotangent, is the GEMM's operand; no ``dn_rec``)."""
    prefer_full_vectors()
    gates, hn_all, h_prev = residuals
    bs, reverse, dy, dpre, d_h, dn_rec, has_seq, dc_seq = grads
    dh, dc = carry
    W_hh_p, W_rz_p, W_n_p, reset_after, b_hn = cell
    masked, h_mask, zone_h, m_h, zone_c, m_c = variants
    rows, drh, carry_h, carry_c = work
    T, H = gates.shape[0], dh.shape[1]
    Z, N = GRU_Z * H, GRU_N * H
    one = one_of(gates)
    for s in range(T):
        t = step_time(T - 1 - s, T, reverse)
        n = min(bs[t], r1)
        if n > r0:
            if zone_h:  # the step's share of dy + dh, read below as dh
                dy_plus_dh(dy, t, dh, dh, r0, n)
                split_zoned(one, m_h, t, dh, dh, carry_h, r0, n)
            for b in range(r0, n):
                g, hp, dyb, dhb, d = gates[t, b], h_prev[t, b], dy[t, b], dh[b], dpre[t, b]
                for j in range(H):
                    z, nn = g[Z + j], g[N + j]
                    dhj = dhb[j] if zone_h else dyb[j] + dhb[j]
                    dz, dn, carried = gm.gru_zn_grads(one, z, nn, hp[j], dhj)
                    d[N + j] = dn
                    d[Z + j] = dz
                    dhb[j] = carried
            if reset_after:
                _gru_after_grads(t, r0, n, residuals, grads, carry, cell, variants, work, norm, scratch)
            else:
                _gru_before_grads(t, r0, n, residuals, grads, carry, cell, variants, work, norm, scratch)
            if zone_h:
                add_rows(carry_h, dh, r0, n)
        dpre[t, max(n, r0):r1] = 0.0
        if norm is not None:
            zero_idle_raw_grads(t, max(n, r0), r1, norm)
        elif reset_after:
            dn_rec[t, max(n, r0):r1] = 0.0


@simd_jit(**JIT)
def _gru_after_grads(t, r0, n, residuals, grads, carry, cell, variants, work, norm, scratch):
    """Reset-after, step ``t``, rows ``r0 .. n``: the r gradient, the product's operand ``rows`` (and
    ``dn_rec``), then ``dh += rows @ W_hh`` (through ``drh`` and ``h_mask`` under recurrent dropout)."""
    prefer_full_vectors()
    gates, hn_all, h_prev = residuals
    bs, reverse, dy, dpre, d_h, dn_rec, has_seq, dc_seq = grads
    dh, dc = carry
    W_hh_p, W_rz_p, W_n_p, reset_after, b_hn = cell
    masked, h_mask, zone_h, m_h, zone_c, m_c = variants
    rows, drh, carry_h, carry_c = work
    H = dh.shape[1]
    R, Z, N = GRU_R * H, GRU_Z * H, GRU_N * H
    one = one_of(dh)
    for b in range(r0, n):
        g, hnb, d, e = gates[t, b], hn_all[t, b], dpre[t, b], rows[b]
        for j in range(H):
            r = g[R + j]
            dr = gm.sigmoid_grad(one, r, d[N + j] * hnb[j])
            d[R + j] = dr
            e[R + j] = dr
            e[Z + j] = d[Z + j]
            e[N + j] = d[N + j] * r
        if norm is None:
            copy_row(dn_rec[t, b], e[N:N + H])
    operand = rows  # the GEMM's; with layer norm the raw product's cotangent
    if norm is not None:
        g_hh, g_c, stats, raw, d_raw, acc_hh, acc_c = norm
        norm_rows_grad(t, r0, n, 0, 3 * H, 0, rows, norm)
        operand = d_raw[t]
    if masked:
        gemm(operand[r0:n], W_hh_p, 1, drh[r0:n], False, scratch)
        add_masked(drh, h_mask, dh, r0, n)
    else:
        gemm(operand[r0:n], W_hh_p, 1, dh[r0:n], True, scratch)


@simd_jit(**JIT)
def _gru_before_grads(t, r0, n, residuals, grads, carry, cell, variants, work, norm, scratch):
    """Reset-before, step ``t``, rows ``r0 .. n``: ``drh``, the gradient of ``r * h`` through the n rows; the
    r gradient; the r, z rows' share and ``r * drh`` into ``dh`` (through ``h_mask`` under recurrent
    dropout)."""
    prefer_full_vectors()
    gates, hn_all, h_prev = residuals
    bs, reverse, dy, dpre, d_h, dn_rec, has_seq, dc_seq = grads
    dh, dc = carry
    W_hh_p, W_rz_p, W_n_p, reset_after, b_hn = cell
    masked, h_mask, zone_h, m_h, zone_c, m_c = variants
    rows, drh, carry_h, carry_c = work
    H = dh.shape[1]
    R, N, RZ = GRU_R * H, GRU_N * H, GRU_RZ_FIRST * H
    one = one_of(dh)
    operand = dpre[t]  # each product's GEMM's; with layer norm the raw product's cotangent
    if norm is not None:
        g_hh, g_c, stats, raw, d_raw, acc_hh, acc_c = norm
        norm_rows_grad(t, r0, n, N, N + H, 1, dpre[t], norm)
        operand = d_raw[t]
    gemm(operand[r0:n, N:N + H], W_n_p, 1, drh[r0:n], False, scratch)
    if masked:
        for b in range(r0, n):
            g, hp, d, q, mb = gates[t, b], h_prev[t, b], dpre[t, b], drh[b], h_mask[b]
            for j in range(H):
                r = g[R + j]
                d[R + j] = gm.sigmoid_grad(one, r, q[j] * hp[j] * mb[j])
                q[j] *= r  # now the gradient of the masked h through r * h
        if norm is not None:
            norm_rows_grad(t, r0, n, RZ, RZ + 2 * H, 0, dpre[t], norm)
        gemm(operand[r0:n, RZ:RZ + 2 * H], W_rz_p, 1, drh[r0:n], True, scratch)
        add_masked(drh, h_mask, dh, r0, n)
        return
    for b in range(r0, n):
        g, hp, d, q, dhb = gates[t, b], h_prev[t, b], dpre[t, b], drh[b], dh[b]
        for j in range(H):
            r = g[R + j]
            d[R + j] = gm.sigmoid_grad(one, r, q[j] * hp[j])
            dhb[j] += q[j] * r
    if norm is not None:
        norm_rows_grad(t, r0, n, RZ, RZ + 2 * H, 0, dpre[t], norm)
    gemm(operand[r0:n, RZ:RZ + 2 * H], W_rz_p, 1, dh[r0:n], True, scratch)
