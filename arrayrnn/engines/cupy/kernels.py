"""Fused per-step gate kernels of the cupy engine, written with numba's CUDA target.

One kernel launch per step (two for the reset-before GRU and the projected LSTM backward) does all the
elementwise work of a step: activations, the gate formulas of :mod:`..gate_math` (shared with the numba
CPU engine), the new state, the output and the residuals. The per-step GEMMs are launches of their own
(:func:`product_step`, not cuBLAS, which CuPy refuses inside the CUDA graph a time loop is captured into).
One thread per ``(row b, unit j)`` of the ``B x H`` step; a kernel gets the whole
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
(:mod:`.launch`: ``numba.cuda.compile_ptx``, then a cubin), not through numba's dispatcher, whose
on-disk cache (``cache=True``) serves only direct launches.
"""

from __future__ import annotations

import importlib
import math

import numba
import numpy as np
from numba import cuda

from .. import gate_math as gm
from ..gate_math import GRU_N, GRU_R, GRU_RZ_FIRST, GRU_Z, LSTM_F, LSTM_G, LSTM_I, LSTM_O

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


def launch_shape(elements: int, block: int | None = None) -> tuple[int, int]:
    """``(blocks, threads)`` covering ``elements`` threads (at least one block); ``block``: blocks of exactly
    that many threads (the layer-norm kernels' block per row)."""
    if block is not None:
        return max(1, -(-elements // block)), block
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


element = _element  # the generated kernels of custom cells (.custom_kernels) share it


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


# -- the step's GEMM -------------------------------------------------------------------------------
PRODUCT_COLUMNS = 32    # output columns per block of the step's GEMM: one warp reads a row of w coalesced
PRODUCT_MAX_SLICES = 8  # warps per block splitting K (a block of at most 256 threads)
PRODUCT_MIN_SLICE = 16  # a warp's share of K, at least (a small K runs one warp, thread per output)
_PRODUCT_PARTIALS = 256  # PRODUCT_COLUMNS * PRODUCT_MAX_SLICES, a literal for cuda.shared.array


assert _PRODUCT_PARTIALS == PRODUCT_COLUMNS * PRODUCT_MAX_SLICES


SIMULATED = bool(numba.config.ENABLE_CUDASIM)


def split_slices(k: int) -> int:
    """Warps splitting a step GEMM's ``K`` on a GPU (its block: ``PRODUCT_COLUMNS`` times that many threads);
    1 below ``K = 2 * PRODUCT_MIN_SLICE``."""
    return max(1, min(PRODUCT_MAX_SLICES, k // PRODUCT_MIN_SLICE))


def product_slices(k: int) -> int:
    """The ``slices`` the engine gives :func:`product_step` for ``K``: :func:`split_slices`, or 1 under
    numba's CUDA simulator, which runs every thread as a Python thread and cannot afford the idle lanes of
    a block per 32 columns (its tests run the split form by asking for it)."""
    return 1 if SIMULATED else split_slices(k)


@cuda.jit(cache=True)
def product_step(t, n, one, a, a_per_step, w, out, out_per_step, slices):
    """``out[s, :n] = a[r, :n] @ w`` (``s``, ``r``: ``t`` if per step, else 0): a step's recurrent GEMM as a
    kernel, because CuPy refuses every cuBLAS call while a stream captures (``cupy_backends/cuda/libs/
    cublas.pyx``, ``setStream``). Sums run in the compute dtype, each term fused (``cuda.fma``: the kernels
    are compiled without contraction, :func:`.launch.compile_ptx`).

    ``slices > 1`` (launched in blocks of ``PRODUCT_COLUMNS * slices`` threads, one per row and 32 columns):
    a block computes ``PRODUCT_COLUMNS`` neighbouring columns of one row ``b``; its warps split ``K`` (warp
    ``s`` sums ``k = s, s + slices, ...``, its lanes reading a row of ``w`` coalesced) and add their partial
    sums through shared memory. One thread per output over the whole ``K`` ran 12.3 us a step at ``K =
    128``, B = 1 on an H200 (a chain of 128 dependent loads); split over 8 warps, 3.9 us. ``slices == 1``:
    one thread per ``(b, j)``, in blocks of any size."""
    width = out.shape[2]
    r = t if a_per_step else 0
    if slices == 1:
        b, j = _element(n, width)
        if b < 0:
            return
        acc = one - one
        for k in range(w.shape[0]):
            acc = cuda.fma(a[r, b, k], w[k, j], acc)
        out[t if out_per_step else 0, b, j] = acc
        return
    groups = (width + PRODUCT_COLUMNS - 1) // PRODUCT_COLUMNS
    block = cuda.blockIdx.x
    b = block // groups
    if b >= n:  # the whole block: no thread waits at the barrier below
        return
    lane, s = cuda.threadIdx.x % PRODUCT_COLUMNS, cuda.threadIdx.x // PRODUCT_COLUMNS
    j = (block - b * groups) * PRODUCT_COLUMNS + lane
    acc = one - one
    if j < width:
        for k in range(s, w.shape[0], slices):
            acc = cuda.fma(a[r, b, k], w[k, j], acc)
    partial = cuda.shared.array(_PRODUCT_PARTIALS, w.dtype)
    partial[cuda.threadIdx.x] = acc
    cuda.syncthreads()
    if s == 0 and j < width:
        total = partial[lane]
        for q in range(1, slices):
            total += partial[q * PRODUCT_COLUMNS + lane]
        out[t if out_per_step else 0, b, j] = total


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


# -- layer normalisation (issue 38): a block of threads per row -------------------------------------------
# A row of a product (G*H wide) or of the cell (H wide) is normalised by one block of ROW_THREADS threads:
# they stride over the row's columns (k = lane, lane + ROW_THREADS, ...), sum in shared memory (a power-of-two
# tree), and every thread gets the sums. Launched over ``rows * ROW_THREADS`` threads in blocks of
# ROW_THREADS (one block per row); ``inv_*`` are ``1 / width`` in the compute dtype (float32 math never
# promotes).
# The simulator runs every CUDA thread as a Python thread: there a row's block is 8 threads, which strides and
# reduces as the GPU's 128 do (a row of H = 4 leaves lanes idle, one of 4H = 16 takes two columns per lane).
ROW_THREADS = 8 if numba.config.ENABLE_CUDASIM else THREADS
_PAIR = 2 * ROW_THREADS  # the shared buffer of two block sums


@cuda.jit(device=True, inline=True)
def _block_sums(buf, lane, a, b):
    """The sums of ``a`` and ``b`` over the block's threads, in every thread (``buf``: ``_PAIR`` shared)."""
    buf[lane] = a
    buf[ROW_THREADS + lane] = b
    cuda.syncthreads()
    step = ROW_THREADS // 2
    while step > 0:
        if lane < step:
            buf[lane] += buf[lane + step]
            buf[ROW_THREADS + lane] += buf[ROW_THREADS + lane + step]
        cuda.syncthreads()
        step //= 2
    sum_a, sum_b = buf[0], buf[ROW_THREADS]
    cuda.syncthreads()  # every thread has read them before the buffer is used again
    return sum_a, sum_b


@cuda.jit(device=True, inline=True)
def _row_stats(one, eps, v, b, lane, wide, out):
    """``(mean, 1 / sqrt(var + eps))`` of the row ``v[b, :]`` in ``v``'s dtype (two passes: the mean, then the
    deviations), reduced in float64 as the numba loops and the reference engine do: a float32 row near 1e20
    squares past float32's range. ``wide``: a float64 ``_PAIR`` shared buffer; ``out``: a local array of
    two in ``v``'s dtype (the conversion)."""
    total = 0.0
    for k in range(lane, v.shape[1], ROW_THREADS):
        total += v[b, k]
    total, _ = _block_sums(wide, lane, total, 0.0)
    mean = total / v.shape[1]
    squares = 0.0
    for k in range(lane, v.shape[1], ROW_THREADS):
        dev = v[b, k] - mean
        squares += dev * dev
    squares, _ = _block_sums(wide, lane, squares, 0.0)
    out[0] = mean
    out[1] = 1.0 / math.sqrt(squares / v.shape[1] + eps)
    if squares == math.inf:  # a float64 row's deviations past ~1e154 (rare; the whole block sees it)
        scale, scaled = gm.LN_RESCALE, 0.0  # the deviations are float64 here whatever v's dtype
        for k in range(lane, v.shape[1], ROW_THREADS):
            dev = (v[b, k] - mean) * scale
            scaled += dev * dev
        scaled, _ = _block_sums(wide, lane, scaled, 0.0)
        out[1] = gm.layer_norm_rstd_rescaled(one, scaled / v.shape[1], scale, eps)
    return out[0], out[1]


@cuda.jit(device=True, inline=True)
def _keep_stats(keep, stats, t, b, slot, lane, mean, rstd):
    if keep and lane == 0:
        stats[t, b, slot, 0] = mean
        stats[t, b, slot, 1] = rstd


@cuda.jit(device=True, inline=True)
def _grad_terms(d, gain, raw, mean, rstd):
    """``(d * gain, d * gain * x)`` with ``x = LN(raw)``: a column's parts of the row sums of the backward."""
    dd = d * gain
    return dd, dd * gm.layer_normalized(raw, mean, rstd)


@cuda.jit(cache=True)
def norm_step(t, n, one, eps, v, g, keep, stats, slot):
    """``v[b] = g * LN(v[b])`` for the active rows ``b < n`` (a block per row; ``v``: a step's recurrent
    product ``(B, W)``), the row's mean and ``1 / std`` into ``stats[t, b, slot]`` when ``keep``."""
    b, lane = cuda.blockIdx.x, cuda.threadIdx.x
    wide = cuda.shared.array(_PAIR, dtype=numba.float64)
    stat = cuda.local.array(2, dtype=v.dtype)
    if b >= n:
        return
    mean, rstd = _row_stats(one, eps, v, b, lane, wide, stat)
    _keep_stats(keep, stats, t, b, slot, lane, mean, rstd)
    for k in range(lane, v.shape[1], ROW_THREADS):
        v[b, k] = g[k] * gm.layer_normalized(v[b, k], mean, rstd)


@cuda.jit(cache=True)
def norm_backward_step(t, n, one, inv_width, src, per_step, g, raw, stats, slot, dst):
    """``dst[t, b]``: the cotangent of the raw product ``raw[t, b]`` through ``g * LN(.)``, from the cotangent
    of the result, ``src[t, b]`` (``per_step``) or ``src[0, b]`` (a step's buffer); a block per active row,
    the statistics from ``stats[t, b, slot]``."""
    b, lane = cuda.blockIdx.x, cuda.threadIdx.x
    buf = cuda.shared.array(_PAIR, dtype=raw.dtype)
    if b >= n:
        return
    s = t if per_step else 0
    mean, rstd = stats[t, b, slot, 0], stats[t, b, slot, 1]
    sum_d, sum_dx = one - one, one - one
    for k in range(lane, raw.shape[2], ROW_THREADS):
        dd, ddx = _grad_terms(src[s, b, k], g[k], raw[t, b, k], mean, rstd)
        sum_d += dd
        sum_dx += ddx
    sum_d, sum_dx = _block_sums(buf, lane, sum_d, sum_dx)
    for k in range(lane, raw.shape[2], ROW_THREADS):
        dd, _ = _grad_terms(src[s, b, k], g[k], raw[t, b, k], mean, rstd)
        x = gm.layer_normalized(raw[t, b, k], mean, rstd)
        dst[t, b, k] = gm.layer_norm_grad(rstd, dd, x, sum_d * inv_width, sum_dx * inv_width)


@cuda.jit(device=True, inline=True)
def _lstm_norm_gates(one, lo, hi, xw, hh, g_hh, P, peep, c, t, b, j, mean, rstd):
    """Unit ``j``'s ``(i, f, g, o, c_new)`` from ``xw[t, b] + g_hh * LN(hh[b])`` (the row's statistics
    ``mean``, ``rstd``); peepholes read ``c`` before its norm."""
    I, F, G, O = _lstm_columns(c.shape[1], j)
    pre_i = xw[t, b, I] + g_hh[I] * gm.layer_normalized(hh[b, I], mean, rstd)
    pre_f = xw[t, b, F] + g_hh[F] * gm.layer_normalized(hh[b, F], mean, rstd)
    pre_g = xw[t, b, G] + g_hh[G] * gm.layer_normalized(hh[b, G], mean, rstd)
    pre_o = xw[t, b, O] + g_hh[O] * gm.layer_normalized(hh[b, O], mean, rstd)
    c_prev = c[b, j]
    if peep:
        pre_i = gm.peephole_input(pre_i, P[0, j], c_prev)
        pre_f = gm.peephole_input(pre_f, P[1, j], c_prev)
    i, f, g = sigmoid(one, pre_i), sigmoid(one, pre_f), math.tanh(pre_g)
    cn = gm.lstm_cell(i, f, g, c_prev, lo, hi)
    if peep:
        pre_o = gm.peephole_input(pre_o, P[2, j], cn)
    return i, f, g, sigmoid(one, pre_o), cn


@cuda.jit(cache=True)
def lstm_norm_forward_step(t, n, one, eps, xw, hh, g_hh, P, peep, g_c, b_c, c, h, y, m,
                           project, keep, c_all, tanh_c_all, stats, lo, hi):
    """The layer-normalised LSTM step of row ``b`` (a block per row): gates over ``xw[t]`` (the cache) from
    ``g_hh * LN(hh)``, ``c`` in place, then ``o * tanh(g_c * LN(c) + b_c)`` into ``y[t]`` and ``h`` (or ``m``
    with projection); statistics into ``stats[t, b]`` (0: the product, 1: the cell). Inactive rows get zero
    gates."""
    b, lane = cuda.blockIdx.x, cuda.threadIdx.x
    H = c.shape[1]
    wide = cuda.shared.array(_PAIR, dtype=numba.float64)
    stat = cuda.local.array(2, dtype=xw.dtype)
    if b >= n:
        for k in range(lane, 4 * H, ROW_THREADS):
            xw[t, b, k] = one - one
        return
    mean, rstd = _row_stats(one, eps, hh, b, lane, wide, stat)
    _keep_stats(keep, stats, t, b, 0, lane, mean, rstd)
    for j in range(lane, H, ROW_THREADS):
        i, f, g, o, cn = _lstm_norm_gates(one, lo, hi, xw, hh, g_hh, P, peep, c, t, b, j, mean, rstd)
        I, F, G, O = _lstm_columns(H, j)
        xw[t, b, I], xw[t, b, F], xw[t, b, G], xw[t, b, O] = i, f, g, o
        c[b, j] = cn
        if keep:
            c_all[t, b, j] = cn
    mean, rstd = _row_stats(one, eps, c, b, lane, wide, stat)
    _keep_stats(keep, stats, t, b, 1, lane, mean, rstd)
    for j in range(lane, H, ROW_THREADS):
        tc = math.tanh(g_c[j] * gm.layer_normalized(c[b, j], mean, rstd) + b_c[j])
        out = xw[t, b, LSTM_O * H + j] * tc
        if keep:
            tanh_c_all[t, b, j] = tc
        if project:
            m[b, j] = out
        else:
            y[t, b, j] = out
            h[b, j] = out


@cuda.jit(device=True, inline=True)
def _lstm_norm_output_grad(one, gates, tanh_c_all, dy, dh, dm, project, t, b, j):
    """``(dmj, du)``: the cotangents of unit ``j``'s output ``o * tanh(u)`` and of ``u = g_c*LN(c) + b_c``."""
    dmj = _lstm_output_cotangent(dy, dh, dm, project, t, b, j)
    o = gates[t, b, LSTM_O * tanh_c_all.shape[2] + j]
    return dmj, gm.lstm_output_grad(one, o, tanh_c_all[t, b, j], dmj)


@cuda.jit(device=True, inline=True)
def _lstm_norm_unit_grads(one, gates, c_all, tanh_c_all, c_prev, P, peep, dmj, d_cell, t, b, j, use_clip, lo,
                          hi):
    """Unit ``j``'s ``(di, df, dg, do, dc_prev)`` from its output's cotangent ``dmj`` and ``d_cell``, that of
    its cell before o's peephole (the carry plus the output's part through the cell's norm)."""
    I, F, G, O = _lstm_columns(c_all.shape[2], j)
    i, f, g, o = gates[t, b, I], gates[t, b, F], gates[t, b, G], gates[t, b, O]
    p_i = p_f = p_o = one - one
    if peep:
        p_i, p_f, p_o = P[0, j], P[1, j], P[2, j]
    return gm.lstm_norm_unit_grads(one, i, f, g, o, c_all[t, b, j], tanh_c_all[t, b, j], c_prev[t, b, j], dmj,
                                   d_cell, use_clip, lo, hi, p_i, p_f, p_o)


@cuda.jit(device=True, inline=True)
def _lstm_norm_cell_sums(one, gates, c_all, tanh_c_all, stats, g_c, dy, dh, dm, project, d_u, t, b, lane,
                         buf):
    """The row sums of the cell norm's backward, ``(sum d, sum d * LN(c))`` with ``d = du * g_c``; each
    unit's ``du`` (the cotangent of ``u``) into ``d_u[t, b]`` (the gradients of ``g_c``, ``b_c``)."""
    mean, rstd = stats[t, b, 1, 0], stats[t, b, 1, 1]
    sum_d, sum_dx = one - one, one - one
    for j in range(lane, c_all.shape[2], ROW_THREADS):
        _, du = _lstm_norm_output_grad(one, gates, tanh_c_all, dy, dh, dm, project, t, b, j)
        d_u[t, b, j] = du
        dd, ddx = _grad_terms(du, g_c[j], c_all[t, b, j], mean, rstd)
        sum_d += dd
        sum_dx += ddx
    return _block_sums(buf, lane, sum_d, sum_dx)


@cuda.jit(device=True, inline=True)
def _unit_product_terms(g_hh, hh_all, t, b, j, H, mean, rstd, di, df, dg, do):
    """Unit ``j``'s four columns' parts of the recurrent product norm's row sums."""
    I, F, G, O = _lstm_columns(H, j)
    a1, b1 = _grad_terms(di, g_hh[I], hh_all[t, b, I], mean, rstd)
    a2, b2 = _grad_terms(df, g_hh[F], hh_all[t, b, F], mean, rstd)
    a3, b3 = _grad_terms(dg, g_hh[G], hh_all[t, b, G], mean, rstd)
    a4, b4 = _grad_terms(do, g_hh[O], hh_all[t, b, O], mean, rstd)
    return a1 + a2 + a3 + a4, b1 + b2 + b3 + b4


@cuda.jit(cache=True)
def lstm_norm_backward_step(t, n, one, inv_gates, inv_hidden, gates, c_all, tanh_c_all, c_prev, hh_all, stats,
                            g_hh, g_c, P, peep, dy, dh, dm, project, dc, dpre_in, d_u, dpre_rec, use_clip, lo,
                            hi):
    """The layer-normalised LSTM step's backward for row ``b`` (a block per active row): through the cell's
    norm, the gates (``dpre_in[t]``, the carry ``dc``), then the recurrent product's norm: ``dpre_rec[t]``,
    the cotangent of the raw ``hh_all[t] = h_{t-1} @ W_hh.T`` (then the GEMM ``dh = dpre_rec[t] @ W_hh``)."""
    b, lane = cuda.blockIdx.x, cuda.threadIdx.x
    H = dc.shape[1]
    buf = cuda.shared.array(_PAIR, dtype=dc.dtype)
    if b >= n:
        return
    sum_d, sum_dx = _lstm_norm_cell_sums(one, gates, c_all, tanh_c_all, stats, g_c, dy, dh, dm, project, d_u,
                                         t, b, lane, buf)
    mean_c, rstd_c = stats[t, b, 1, 0], stats[t, b, 1, 1]
    mean, rstd = stats[t, b, 0, 0], stats[t, b, 0, 1]
    sum_r, sum_rx = one - one, one - one
    for j in range(lane, H, ROW_THREADS):
        dmj, du = _lstm_norm_output_grad(one, gates, tanh_c_all, dy, dh, dm, project, t, b, j)
        dd, _ = _grad_terms(du, g_c[j], c_all[t, b, j], mean_c, rstd_c)
        x = gm.layer_normalized(c_all[t, b, j], mean_c, rstd_c)
        d_cell = dc[b, j] + gm.layer_norm_grad(rstd_c, dd, x, sum_d * inv_hidden, sum_dx * inv_hidden)
        di, df, dg, do, dcp = _lstm_norm_unit_grads(one, gates, c_all, tanh_c_all, c_prev, P, peep, dmj,
                                                    d_cell, t, b, j, use_clip, lo, hi)
        _store_lstm_backward(dpre_in, dc, t, b, j, di, df, dg, do, dcp)
        dr, drx = _unit_product_terms(g_hh, hh_all, t, b, j, H, mean, rstd, di, df, dg, do)
        sum_r += dr
        sum_rx += drx
    sum_r, sum_rx = _block_sums(buf, lane, sum_r, sum_rx)
    for k in range(lane, 4 * H, ROW_THREADS):
        dd, _ = _grad_terms(dpre_in[t, b, k], g_hh[k], hh_all[t, b, k], mean, rstd)
        x = gm.layer_normalized(hh_all[t, b, k], mean, rstd)
        dpre_rec[t, b, k] = gm.layer_norm_grad(rstd, dd, x, sum_r * inv_gates, sum_rx * inv_gates)
