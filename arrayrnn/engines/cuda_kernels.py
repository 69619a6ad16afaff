"""Fused per-step gate kernels of the cupy engine, written with numba's CUDA target.

One kernel launch per step (two for the reset-before GRU and the projected LSTM backward) does all the
elementwise work of a step: activations, the gate formulas of :mod:`.gate_math` (shared with the numba
CPU engine), the new state, the output and the residuals. The per-step GEMMs run outside, on cuBLAS
(:mod:`.cupy_steps`). One thread per ``(row b, unit j)`` of the ``B x H`` step; a kernel gets the whole
``(T, B, .)`` stacks and the step ``t`` plus the number of active rows ``n`` as arguments, so nothing is
sliced or allocated per step. Roughly, for an LSTM step::

    for b < n, j < H:   # in parallel
        i, f, g, o = sig(xw[t,b,i_j] + hh[b,i_j]), ..., tanh(...), sig(...)
        c[b,j] = clip(f*c[b,j] + i*g);  out[b,j] = o*tanh(c[b,j])   # out: y[t] and h, or m (projection)
    for b >= n:          # inactive rows: the gate residuals at t are zeroed (x side was the bias)

The same code runs on the GPU and, with ``NUMBA_ENABLE_CUDASIM=1`` set before numba's CUDA module is
imported, under numba's CUDA simulator on NumPy arrays (that is how CI executes it).
``one`` is 1 in the compute dtype (float32 math never promotes to float64). Every kernel takes ``t, n``
first: the engine packs the other arguments once and rewrites only those two per launch. The engine
compiles the kernels itself, per dtype and argument kinds on first use, once per process
(:mod:`.cuda_launch`: ``numba.cuda.compile_ptx``, then a cubin), not through numba's dispatcher, whose
on-disk cache (``cache=True``) serves only direct launches.
"""

from __future__ import annotations

import importlib
import math

import numba
import numpy as np
from numba import cuda

from . import gate_math as gm
from .gate_math import GRU_N, GRU_R, GRU_RZ_FIRST, GRU_Z, LSTM_F, LSTM_G, LSTM_I, LSTM_O

THREADS = 128  # threads per block of every kernel


def _numpy_removed_alias(*args, **kwargs):  # pragma: no cover - never called, only registered
    raise AttributeError("numpy.row_stack was removed in NumPy 2.5; use numpy.vstack")


def _load_numba_cuda_registries() -> None:
    """Load numba-cuda's NumPy overloads now, lending ``np.row_stack`` a stand-in while they load.

    numba-cuda (0.30.4 and earlier) registers an overload for ``np.row_stack`` when its target first
    compiles a kernel; NumPy 2.5 removed that alias, so every first launch raised AttributeError. The
    stand-in lives only while the module imports (the overload it gets is never reachable from our
    kernels); NumPy is left as it was."""
    if numba.config.ENABLE_CUDASIM or hasattr(np, "row_stack"):
        return
    np.row_stack = _numpy_removed_alias
    try:
        importlib.import_module("numba.cuda.np.arrayobj")  # registers its overloads once, at import
    finally:
        del np.row_stack


_load_numba_cuda_registries()


def launch_shape(elements: int) -> tuple[int, int]:
    """``(blocks, threads)`` covering ``elements`` threads (at least one block)."""
    threads = max(1, min(THREADS, elements))
    return max(1, -(-elements // threads)), threads


# -- activations (per target; the CPU engine has its own vectorisable ones) -----------------------
@cuda.jit(device=True, inline=True)
def _zero_gates(xw, t, b, j, H, gates, one):
    """Zero unit ``j``'s gate entries of an inactive row (the cache contract: finite, zero)."""
    for k in range(gates):
        xw[t, b, k * H + j] = one - one


@cuda.jit(device=True, inline=True)
def sigmoid(one, x):
    return one / (one + math.exp(-x))


@cuda.jit(device=True, inline=True)
def _element(rows, width):
    """``(b, j)`` of this thread in a ``rows x width`` grid, or ``(-1, -1)`` past its end."""
    k = cuda.grid(1)
    if k >= rows * width:
        return -1, -1
    b = k // width
    return b, k - b * width


# -- LSTM pieces shared by the plain and the peephole kernels -------------------------------------
@cuda.jit(device=True, inline=True)
def _lstm_columns(H, j):
    """Unit ``j``'s columns of the i, f, g, o gates in a ``(., ., 4H)`` gate stack."""
    return LSTM_I * H + j, LSTM_F * H + j, LSTM_G * H + j, LSTM_O * H + j


@cuda.jit(device=True, inline=True)
def _store_lstm_forward(xw, c, h, y, m, project, keep, c_all, tanh_c_all, t, b, j, i, f, g, o, cn):
    """The step's gates into ``xw[t]`` (the cache), the new cell ``cn`` into ``c`` (and ``c_all``,
    ``tanh_c_all`` when ``keep``), the output ``o * tanh(cn)`` into ``m`` or ``y[t]`` and ``h``."""
    I, F, G, O = _lstm_columns(c.shape[1], j)
    tc = math.tanh(cn)
    xw[t, b, I] = i
    xw[t, b, F] = f
    xw[t, b, G] = g
    xw[t, b, O] = o
    c[b, j] = cn
    if keep:
        c_all[t, b, j] = cn
        tanh_c_all[t, b, j] = tc
    if project:
        m[b, j] = o * tc
    else:
        y[t, b, j] = o * tc
        h[b, j] = o * tc


@cuda.jit(device=True, inline=True)
def _lstm_output_cotangent(dy, dh, dm, project, t, b, j):
    """The cotangent of the cell output ``o * tanh(c)``: ``dm`` with projection, else ``dy[t] + dh``."""
    return dm[b, j] if project else dy[t, b, j] + dh[b, j]


@cuda.jit(device=True, inline=True)
def _store_lstm_backward(dpre_in, dc, t, b, j, di, df, dg, do, dcp):
    """The gate gradients into ``dpre_in[t]`` and the cell carry ``dcp`` into ``dc``."""
    I, F, G, O = _lstm_columns(dc.shape[1], j)
    dpre_in[t, b, I] = di
    dpre_in[t, b, F] = df
    dpre_in[t, b, G] = dg
    dpre_in[t, b, O] = do
    dc[b, j] = dcp


# -- plain RNN ------------------------------------------------------------------------------------
@cuda.jit(cache=True)
def rnn_forward_step(t, n, one, relu, xw, hh, h, y):
    """``y[t,b] = h[b] = act(xw[t,b] + hh[b])`` for the active rows ``b < n``."""
    b, j = _element(n, h.shape[1])
    if b < 0:
        return
    pre = xw[t, b, j] + hh[b, j]
    zero = one - one
    out = (pre if pre > zero else zero) if relu else math.tanh(pre)
    y[t, b, j] = out
    h[b, j] = out


@cuda.jit(cache=True)
def rnn_backward_step(t, n, one, relu, y, dy, dh, d_pre):
    """``d_pre[t,b] = (dy[t,b] + dh[b]) * act'(y[t,b])``; the GEMM ``dh = d_pre[t] @ W_hh`` follows."""
    b, j = _element(n, dh.shape[1])
    if b < 0:
        return
    d_pre[t, b, j] = gm.rnn_grad(one, relu, y[t, b, j], dy[t, b, j] + dh[b, j])


# -- LSTM -----------------------------------------------------------------------------------------
@cuda.jit(cache=True)
def lstm_forward_step(t, n, one, xw, hh, c, h, y, m, project, keep, c_all, tanh_c_all, lo, hi):
    """Gates over ``xw[t]`` (the cache), ``c`` in place; ``y[t]``/``h`` or, with projection, ``m``."""
    H = c.shape[1]
    b, j = _element(xw.shape[1], H)
    if b < 0:
        return
    I, F, G, O = _lstm_columns(H, j)
    if b >= n:
        _zero_gates(xw, t, b, j, H, 4, one)
        return
    i = sigmoid(one, xw[t, b, I] + hh[b, I])
    f = sigmoid(one, xw[t, b, F] + hh[b, F])
    g = math.tanh(xw[t, b, G] + hh[b, G])
    o = sigmoid(one, xw[t, b, O] + hh[b, O])
    cn = gm.lstm_cell(i, f, g, c[b, j], lo, hi)
    _store_lstm_forward(xw, c, h, y, m, project, keep, c_all, tanh_c_all, t, b, j, i, f, g, o, cn)


@cuda.jit(cache=True)
def add_carry_step(t, n, dy, dh, d_h):
    """Projection: ``d_h[t,b] = dy[t,b] + dh[b]`` (the GEMM ``dm = d_h[t] @ W_hr`` follows)."""
    b, k = _element(n, dh.shape[1])
    if b < 0:
        return
    d_h[t, b, k] = dy[t, b, k] + dh[b, k]


@cuda.jit(cache=True)
def lstm_backward_step(t, n, one, gates, c_all, tanh_c_all, c_prev, dy, dh, dm, project, dc, dpre_in,
                       use_clip, lo, hi):
    """``dpre_in[t]`` and the cell carry ``dc``; the GEMM ``dh = dpre_in[t] @ W_hh`` follows."""
    H = dc.shape[1]
    b, j = _element(n, H)
    if b < 0:
        return
    I, F, G, O = _lstm_columns(H, j)
    dmj = _lstm_output_cotangent(dy, dh, dm, project, t, b, j)
    di, df, dg, do, dcp = gm.lstm_cell_grads(one, gates[t, b, I], gates[t, b, F], gates[t, b, G],
                                             gates[t, b, O], c_all[t, b, j], tanh_c_all[t, b, j],
                                             c_prev[t, b, j], dmj, dc[b, j], use_clip, lo, hi)
    _store_lstm_backward(dpre_in, dc, t, b, j, di, df, dg, do, dcp)


# -- GRU ------------------------------------------------------------------------------------------
@cuda.jit(cache=True)
def gru_forward_step(t, n, one, xw, hh, b_hn, h, y, keep, hn_all):
    """Reset-after: ``hh = h @ W_hh.T`` of this step; gates over ``xw[t]``, ``y[t]``, ``h`` in place."""
    H = h.shape[1]
    b, j = _element(xw.shape[1], H)
    if b < 0:
        return
    R, Z, N = GRU_R * H + j, GRU_Z * H + j, GRU_N * H + j
    if b >= n:
        _zero_gates(xw, t, b, j, H, 3, one)
        return
    r = sigmoid(one, xw[t, b, R] + hh[b, R])
    z = sigmoid(one, xw[t, b, Z] + hh[b, Z])
    hn = hh[b, N] + b_hn[j]
    nn = math.tanh(gm.gru_candidate_input(xw[t, b, N], r, hn))
    out = gm.gru_output(z, nn, h[b, j])
    xw[t, b, R] = r
    xw[t, b, Z] = z
    xw[t, b, N] = nn
    if keep:
        hn_all[t, b, j] = hn
    y[t, b, j] = out
    h[b, j] = out


@cuda.jit(cache=True)
def gru_rz_step(t, n, one, xw, hrz, h, rh):
    """Reset-before, first half: ``r, z`` over ``xw[t]`` and ``rh = r * h`` (``hrz = h @ W_rz.T``)."""
    H = h.shape[1]
    b, j = _element(xw.shape[1], H)
    if b < 0:
        return
    R, Z = GRU_R * H + j, GRU_Z * H + j
    if b >= n:
        _zero_gates(xw, t, b, j, H, 3, one)
        return
    RZ = GRU_RZ_FIRST * H
    r = sigmoid(one, xw[t, b, R] + hrz[b, R - RZ])
    xw[t, b, R] = r
    xw[t, b, Z] = sigmoid(one, xw[t, b, Z] + hrz[b, Z - RZ])
    rh[b, j] = r * h[b, j]


@cuda.jit(cache=True)
def gru_n_step(t, n, xw, hn, h, y):
    """Reset-before, second half: ``n = tanh(xw_n + hn)`` (``hn = (r*h) @ W_hn.T``), ``y[t]``, ``h``."""
    H = h.shape[1]
    b, j = _element(n, H)
    if b < 0:
        return
    N = GRU_N * H + j
    nn = math.tanh(xw[t, b, N] + hn[b, j])
    out = gm.gru_output(xw[t, b, GRU_Z * H + j], nn, h[b, j])
    xw[t, b, N] = nn
    y[t, b, j] = out
    h[b, j] = out


@cuda.jit(cache=True)
def gru_backward_step(t, n, one, reset_after, gates, hn_all, h_prev, dy, dh_gemm, dh_carry, dpre_in, dn_rec,
                      rec, dn_buf, drz):
    """The total ``dh = dy[t] + dh_gemm + dh_carry``; writes ``dpre_in[t]`` (z, n; r too when reset-after),
    ``dh_carry = dh * z``; reset-after: the step's recurrent gradient ``rec (B,3H)`` for the GEMM
    ``dh_gemm = rec @ W_hh`` (its r, z parts are ``dpre_in``'s) and its n part ``dn_rec[t]`` (the one part
    the weight gradient needs apart); reset-before: ``dn_buf`` and the z part of ``drz`` for the two GEMMs
    that follow."""
    H = dh_carry.shape[1]
    b, j = _element(n, H)
    if b < 0:
        return
    R, Z, N = GRU_R * H + j, GRU_Z * H + j, GRU_N * H + j
    r, z, nn = gates[t, b, R], gates[t, b, Z], gates[t, b, N]
    dz, dn, carry = gm.gru_zn_grads(one, z, nn, h_prev[t, b, j], dy[t, b, j] + dh_gemm[b, j] + dh_carry[b, j])
    dpre_in[t, b, Z] = dz
    dpre_in[t, b, N] = dn
    dh_carry[b, j] = carry
    if reset_after:
        dr = gm.sigmoid_grad(one, r, dn * hn_all[t, b, j])
        dpre_in[t, b, R] = dr
        rec[b, R] = dr
        rec[b, Z] = dz
        rec[b, N] = dn * r
        dn_rec[t, b, j] = dn * r
    else:
        dn_buf[b, j] = dn
        drz[b, Z - GRU_RZ_FIRST * H] = dz


@cuda.jit(cache=True)
def gru_r_backward_step(t, n, one, gates, h_prev, drh, dpre_in, dh_carry, drz):
    """Reset-before: ``drh = dn @ W_hn`` (gradient of ``r*h``) gives ``dr``; adds ``drh*r`` to the carry."""
    H = dh_carry.shape[1]
    b, j = _element(n, H)
    if b < 0:
        return
    R = GRU_R * H + j
    r = gates[t, b, R]
    dr = gm.sigmoid_grad(one, r, drh[b, j] * h_prev[t, b, j])
    dpre_in[t, b, R] = dr
    drz[b, R - GRU_RZ_FIRST * H] = dr
    dh_carry[b, j] += drh[b, j] * r


# -- cell variants: peepholes, zoneout ------------------------------------------------------------
@cuda.jit(cache=True)
def lstm_peephole_forward_step(t, n, one, xw, hh, P, c, h, y, m, project, keep, c_all, tanh_c_all, lo, hi):
    """:func:`lstm_forward_step` with peepholes ``P (3, H)`` (rows i, f, o): i and f see ``c_{t-1}``, o the
    new (clipped) cell."""
    H = c.shape[1]
    b, j = _element(xw.shape[1], H)
    if b < 0:
        return
    I, F, G, O = _lstm_columns(H, j)
    if b >= n:
        _zero_gates(xw, t, b, j, H, 4, one)
        return
    c_prev = c[b, j]
    i = sigmoid(one, gm.peephole_input(xw[t, b, I] + hh[b, I], P[0, j], c_prev))
    f = sigmoid(one, gm.peephole_input(xw[t, b, F] + hh[b, F], P[1, j], c_prev))
    g = math.tanh(xw[t, b, G] + hh[b, G])
    cn = gm.lstm_cell(i, f, g, c_prev, lo, hi)
    o = sigmoid(one, gm.peephole_input(xw[t, b, O] + hh[b, O], P[2, j], cn))
    _store_lstm_forward(xw, c, h, y, m, project, keep, c_all, tanh_c_all, t, b, j, i, f, g, o, cn)


@cuda.jit(cache=True)
def lstm_peephole_backward_step(t, n, one, gates, c_all, tanh_c_all, c_prev, P, dy, dh, dm, project, dc,
                                dpre_in, use_clip, lo, hi):
    """:func:`lstm_backward_step` with peepholes ``P (3, H)``."""
    H = dc.shape[1]
    b, j = _element(n, H)
    if b < 0:
        return
    I, F, G, O = _lstm_columns(H, j)
    dmj = _lstm_output_cotangent(dy, dh, dm, project, t, b, j)
    di, df, dg, do, dcp = gm.lstm_peephole_cell_grads(
        one, gates[t, b, I], gates[t, b, F], gates[t, b, G], gates[t, b, O], c_all[t, b, j],
        tanh_c_all[t, b, j], c_prev[t, b, j], dmj, dc[b, j], use_clip, lo, hi, P[0, j], P[1, j], P[2, j])
    _store_lstm_backward(dpre_in, dc, t, b, j, di, df, dg, do, dcp)


@cuda.jit(cache=True)
def zoneout_step(t, n, m, prev, new, y, h):
    """``y[t,b] = h[b] = m[t,b]*prev[b] + (1-m[t,b])*new[t,b]`` (``new`` may be ``y``)."""
    b, j = _element(n, h.shape[1])
    if b < 0:
        return
    v = gm.zoneout(m[t, b, j], prev[b, j], new[t, b, j])
    y[t, b, j] = v
    h[b, j] = v


@cuda.jit(cache=True)
def zoneout_cell_step(t, n, m, prev, c, keep, c_all):
    """``c[b] = m[t,b]*prev[b] + (1-m[t,b])*c[b]`` (the step's new cell), kept in ``c_all[t]``."""
    b, j = _element(n, c.shape[1])
    if b < 0:
        return
    v = gm.zoneout(m[t, b, j], prev[b, j], c[b, j])
    c[b, j] = v
    if keep:
        c_all[t, b, j] = v


@cuda.jit(cache=True)
def zoneout_split_step(t, n, one, m, dy, dh, dy_new, direct):
    """The total cotangent ``dy[t,b] + dh[b]`` of a zoned-out ``h``: ``dy_new[t,b]`` its share of the step's
    own output, ``direct[b]`` that of ``h_{t-1}``; ``dh[b] = 0`` (the step then reads ``dy_new[t] + dh``)."""
    b, j = _element(n, dh.shape[1])
    if b < 0:
        return
    d_new, d_prev = gm.zoneout_grads(one, m[t, b, j], dy[t, b, j] + dh[b, j])
    dy_new[t, b, j] = d_new
    direct[b, j] = d_prev
    dh[b, j] = one - one


@cuda.jit(cache=True)
def cell_carry_step(t, n, one, zone, m, has_seq, dc_seq, dc, direct):
    """The cell's cotangent at step ``t``: ``dc[b] (+ dc_seq[t,b])``; with zoneout split into the step's
    own share (left in ``dc``) and ``c_{t-1}``'s (``direct``)."""
    b, j = _element(n, dc.shape[1])
    if b < 0:
        return
    total = dc[b, j] + dc_seq[t, b, j] if has_seq else dc[b, j]
    if zone:
        d_new, d_prev = gm.zoneout_grads(one, m[t, b, j], total)
        dc[b, j] = d_new
        direct[b, j] = d_prev
    else:
        dc[b, j] = total
