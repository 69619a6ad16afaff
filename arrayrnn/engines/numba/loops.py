"""Compiled time loops of the numba engine: per-step packed GEMM plus fused gate math, forward and backward.

Each ``*_forward_loop`` / ``*_backward_loop`` function runs the WHOLE time loop of one direction for the
rows ``[r0, r1)`` of the length-sorted batch; step ``t`` works on the active rows ``[r0, min(bs[t], r1))``
(variable lengths shrink the per-step product to the active prefix). The per-step products run on the
packed SIMD kernels (:mod:`.packed_gemm`) with the weights packed by the caller. Forward: for each unit
group, its gate-grouped GEMM tiles of ``h @ W_hh.T`` are added into ``xw[t]`` for every row tile (the
group's weights are read once per step: with the row tiles outside, a 16-row S2 step read its 4 MB of
weights three times and ran 1.4-1.7x slower), then the gate math runs over the step's full rows, writing the
new state, the output and the residuals in place (per unit group, the gate loop over 16 units did not
vectorise). The engine's threads (:mod:`.loop_threads`) give each loop a row range; the row range stays
a run-time argument on purpose: with the bounds known at compile time (0 and ``xw.shape[1]``) LLVM's
code for the gate loop ran 3.5x slower here. :func:`lstm_forward_columns` splits the units instead.

Semantics equal :mod:`arrayrnn.engines.cells` (the oracle); per active row of step ``t`` of an LSTM, roughly::

    xw[t] += h @ W_hh.T                              # per-step GEMM, in place
    i, f, g, o = sig(xw_i), sig(xw_f), tanh(xw_g), sig(xw_o)   # stored over xw[t] (the cache)
    c = clip(f * c + i * g);  h = o * tanh(c)        # h = (o * tanh(c)) @ W_hr.T with projection

Arguments: a loop takes its row range ``r0, r1`` (a column split: its part, the number of parts and the
barrier's state), named bundles (:mod:`.bundles`: the sequence, the state, the cell's packed weights and
options, the cache or residuals, the variants' masks, the row buffers), each a plain tuple that the loop
unpacks on entry into locals named like its fields, and ``scratch``, the thread's tile
(:func:`.packed_gemm.new_scratch`). Helpers compiled apart take the same bundles; inlined ones take arrays.
An absent array is zero-size, announced by a flag, so each loop keeps one compiled signature per dtype.
Buffers are preallocated by the caller; nothing is allocated per step. Entries of inactive rows (``b >=
bs[t]``) of ``y``, the residuals and the gradient stacks are set to zero.

The cell variants run in the same loops behind run-time flags, each with its zero-size stand-ins when
off (one signature still): recurrent dropout (the products read ``h * h_mask``, their ``dh`` is masked),
zoneout (after the step; the backward splits each state's cotangent with :func:`.gate_math.zoneout_grads`),
peepholes (their own LSTM tile and backward loop), per-step cell cotangents (``return_all_states``). A
plain call runs the code it ran before, plus one untaken branch per step.

Layer norm (``layer_norm=True``; :class:`.NormForward`, :class:`.NormBackward`) runs in the same loops
behind its flag: per step and active row, ``xw[t] = g_ih * LN(x_raw[t]) + b`` (:func:`_norm_input`), the
recurrent GEMM into ``raw[t]`` (not into ``xw[t]``), ``xw[t] += g_hh * LN(raw[t])`` (:func:`_norm_rows`;
the reset-after GRU's into ``rows``, the reset-before GRU's two parts each over its own row), then the gate
math (the LSTM's with ``tanh(g_c * LN(c) + b_c)``, :func:`_lstm_norm_tile`; its column split:
:func:`lstm_norm_forward_columns`). The backward runs each norm
back where its cotangent is complete (:func:`_lstm_norm_grads`, :func:`_norm_rows_grad`: the GEMM then reads
the raw product's cotangent ``d_raw[t]``), the gains' sums per row in ``acc_*``. The row passes are compiled
apart with their sums reassociated (:data:`_JIT_SUMS`), so LLVM vectorises them.

The gate formulas themselves (how activated gates combine into the state, and their derivatives) live
in :mod:`.gate_math` and are shared with the cupy engine's CUDA kernels; numba inlines them (numba-cuda
compiles a kernel's call of an ``@njit`` function apart only with a device present). The activations below
are compiled apart instead, and LLVM inlines them: numba's own inlining typed the polynomials again at each
of their hundreds of call sites, about half of a first compile, for the same machine code (the same vector
instructions and no call left in the loops, issue 45).

Activations: float64 uses libm (``math.exp``/``math.tanh``); float32 uses branch-free formulas built
on :func:`_exp_f32` that LLVM vectorises (numba has no vector libm here), accurate to a few ulp.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload, register_jitable

from .. import gate_math as gm
from ..gate_math import GRU_N, GRU_R, GRU_RZ_FIRST, GRU_Z, LSTM_F, LSTM_G, LSTM_I, LSTM_O
from ..numba_cache import njit
from ..step_order import step_time
from .packed_gemm import gate_group, gemm
from .simd_ir import ROWS_BY_NV, prefer_full_vectors, simd_jit
from .spin_barrier import barrier

_JIT = dict(cache=True, nogil=True, error_model="numpy")
# the layer norm's row passes: their sums vectorise only where LLVM may reassociate them (nothing else in
# these functions is reassociated: they call no activation)
_JIT_SUMS = dict(_JIT, fastmath={"reassoc"})
# the time loops reach the SIMD kernels: their cache is keyed on the variant (simd_ir.simd_jit)


# -- activations ----------------------------------------------------------------------------------
@intrinsic
def _int32_bits_as_float32(typingctx, bits):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.int32), codegen


_LOG2E = np.float32(1.4426950408889634)
_LN2_HI = np.float32(0.693359375)       # ln 2 split in two for an exact first reduction step
_LN2_LO = np.float32(-2.12194440e-4)


@register_jitable
def _exp_f32(x):
    """exp(x) for float32 without libm: x = n ln2 + r, |r| <= ln2/2, degree-7 Taylor, 2^n from bits."""
    x = min(max(x, np.float32(-87.0)), np.float32(87.0))
    n = np.floor(x * _LOG2E + np.float32(0.5))
    r = x - n * _LN2_HI - n * _LN2_LO
    p = np.float32(1.0 / 5040.0)
    p = p * r + np.float32(1.0 / 720.0)
    p = p * r + np.float32(1.0 / 120.0)
    p = p * r + np.float32(1.0 / 24.0)
    p = p * r + np.float32(1.0 / 6.0)
    p = p * r + np.float32(0.5)
    p = p * r + np.float32(1.0)
    p = p * r + np.float32(1.0)
    return p * _int32_bits_as_float32(np.int32((np.int32(n) + 127) << 23))


@register_jitable
def _tanh_f32(x):
    """tanh: odd Taylor polynomial below |x| = 0.4, (1 - e)/(1 + e) with e = exp(-2|x|) above."""
    ax = abs(x)
    e = _exp_f32(np.float32(-2.0) * ax)
    big = (np.float32(1.0) - e) / (np.float32(1.0) + e)
    big = big if x >= np.float32(0.0) else -big
    x2 = x * x
    p = np.float32(21844.0 / 6081075.0)
    p = p * x2 - np.float32(1382.0 / 155925.0)
    p = p * x2 + np.float32(62.0 / 2835.0)
    p = p * x2 - np.float32(17.0 / 315.0)
    p = p * x2 + np.float32(2.0 / 15.0)
    p = p * x2 - np.float32(1.0 / 3.0)
    small = x + x * x2 * p
    return small if ax < np.float32(0.4) else big


def sigmoid(x):
    """1 / (1 + exp(-x)), compiled per float type."""


def tanh(x):
    """tanh(x), compiled per float type."""


@register_jitable
def _sigmoid_f64(x):
    e = math.exp(-abs(x))  # never overflows; both branches keep full relative accuracy
    s = 1.0 / (1.0 + e)
    return s if x >= 0.0 else e * s


@overload(sigmoid)
def _sigmoid_impl(x):
    if x == types.float32:
        return lambda x: np.float32(1.0) / (np.float32(1.0) + _exp_f32(-x))
    return lambda x: _sigmoid_f64(x)


@overload(tanh)
def _tanh_impl(x):
    if x == types.float32:
        return lambda x: _tanh_f32(x)
    return lambda x: math.tanh(x)


@njit(**_JIT)
def activate(kind, x, out):
    """Test hook: ``out = sigmoid(x)`` (kind 0) or ``tanh(x)`` (kind 1), elementwise over 1-D arrays."""
    for j in range(x.shape[0]):
        out[j] = sigmoid(x[j]) if kind == 0 else tanh(x[j])


# -- helpers --------------------------------------------------------------------------------------
def one_of(a):
    """1 in the dtype of array ``a`` (a bare ``1.0`` would promote float32 math to float64)."""


@overload(one_of, inline="always")
def _one_of_impl(a):
    real = np.float32 if a.dtype == types.float32 else np.float64
    return lambda a: real(1.0)


_step_time = register_jitable(inline="always")(step_time)  # the one time-step order (.step_order)


# array-to-array copies go element by element: numba's broadcasting assignment (``a[i:j] = b[i:j]``)
# compiles its shape-mismatch message, about 6 s of every compiling process's first compile (issue 36)
@register_jitable(inline="always")
def _copy_row(dst, src):
    for j in range(src.shape[0]):
        dst[j] = src[j]


@register_jitable(inline="always")
def _copy_rows(dst, src):
    for i in range(src.shape[0]):
        for j in range(src.shape[1]):
            dst[i, j] = src[i, j]


@register_jitable(inline="always")
def _masked_rows(h, h_mask, hm, r0, n):
    """``hm[r0:n] = h[r0:n] * h_mask[r0:n]``: the recurrent-dropout-masked state the step's GEMM reads."""
    for b in range(r0, n):
        hb, mb, out = h[b], h_mask[b], hm[b]
        for j in range(hb.shape[0]):
            out[j] = hb[j] * mb[j]


@register_jitable(inline="always")
def _add_masked(src, h_mask, dh, r0, n):
    """``dh[r0:n] += src[r0:n] * h_mask[r0:n]``: a GEMM's gradient of the masked state, into the carry."""
    for b in range(r0, n):
        sb, mb, out = src[b], h_mask[b], dh[b]
        for j in range(sb.shape[0]):
            out[j] += sb[j] * mb[j]


@register_jitable(inline="always")
def _scale_rows(dh, h_mask, r0, n):
    for b in range(r0, n):
        db, mb = dh[b], h_mask[b]
        for j in range(db.shape[0]):
            db[j] *= mb[j]


@register_jitable(inline="always")
def _zone_rows(m, t, prev, new, r0, n):
    """Zoneout of step ``t``: ``new[r0:n] = m[t] * prev + (1 - m[t]) * new`` (``prev``: the carried state)."""
    for b in range(r0, n):
        mb, pb, nb = m[t, b], prev[b], new[b]
        for j in range(nb.shape[0]):
            nb[j] = gm.zoneout(mb[j], pb[j], nb[j])


@register_jitable(inline="always")
def _split_zoned(one, m, t, total, own, carry, r0, n):
    """Zoneout's backward split of the cotangents ``total[r0:n]`` of step ``t``'s state: the step's own
    share ``(1 - m) * total`` into ``own``, the carried share ``m * total`` into ``carry``."""
    for b in range(r0, n):
        mb, tb, ob, cb = m[t, b], total[b], own[b], carry[b]
        for j in range(tb.shape[0]):
            ob[j], cb[j] = gm.zoneout_grads(one, mb[j], tb[j])


@register_jitable(inline="always")
def _add_row(a, b, out):
    """``out = a + b`` over a row."""
    for j in range(out.shape[0]):
        out[j] = a[j] + b[j]


@register_jitable(inline="always")
def _add_rows(src, dst, r0, n):
    for b in range(r0, n):
        sb, db = src[b], dst[b]
        for j in range(db.shape[0]):
            db[j] += sb[j]


@register_jitable(inline="always")
def _dy_plus_dh(dy, t, dh, out, r0, n):
    for b in range(r0, n):
        dyb, dhb, ob = dy[t, b], dh[b], out[b]
        for j in range(ob.shape[0]):
            ob[j] = dyb[j] + dhb[j]


# -- layer normalisation (layer_norm=True) ---------------------------------------------------------
@simd_jit(**_JIT_SUMS)
def row_stats(one, v, eps):
    """``(mean, 1 / sqrt(var + eps))`` of the row ``v`` (two passes: the row is in L1)."""
    prefer_full_vectors()
    inv = one / v.shape[0]
    total = one - one
    for k in range(v.shape[0]):
        total += v[k]
    mean = total * inv
    squares = one - one
    for k in range(v.shape[0]):
        d = v[k] - mean
        squares += d * d
    if squares == np.inf:  # deviations past the dtype's range squared (rare)
        return mean, _rescaled_rstd(one, v, mean, eps)
    return mean, gm.layer_norm_rstd(one, squares * inv, eps)


@simd_jit(**_JIT)  # not _JIT_SUMS: reassociation could regroup the scaled squares into an overflowing product
def _rescaled_rstd(one, v, mean, eps):
    """:func:`row_stats`'s rare third pass, for a row whose squared deviations overflowed: the squares of
    the deviations scaled by a power of two, in float64 (:func:`.gate_math.layer_norm_rstd_rescaled`)."""
    scale, wide_mean, scaled = gm.layer_norm_scale(v.itemsize), float(mean), 0.0
    for k in range(v.shape[0]):
        d = (float(v[k]) - wide_mean) * scale
        scaled += d * d
    return gm.layer_norm_rstd_rescaled(one, scaled / v.shape[0], scale, eps)


@simd_jit(**_JIT_SUMS)
def _norm_rows(t, r0, n, k0, k1, slot, norm, dst, accumulate):
    """Rows ``r0 .. n`` of step ``t``: ``dst[:, k0:k1] (+)= g_hh * LN(raw[t])`` over columns ``k0 .. k1`` of
    the raw product (:class:`.NormForward`), each row's statistics into ``stats[t, :, slot]``."""
    prefer_full_vectors()
    kept, inputs, g_ih, bias, g_hh, g_c, b_c, eps, stats, x_raw, raw = norm
    one = one_of(raw)
    ts = t if kept else 0
    g = g_hh[k0:k1]
    for b in range(r0, n):
        v, out = raw[ts, b, k0:k1], dst[b, k0:k1]
        mean, rstd = row_stats(one, v, eps)
        stats[ts, b, slot, 0] = mean
        stats[ts, b, slot, 1] = rstd
        if accumulate:
            for k in range(k1 - k0):
                out[k] += g[k] * gm.layer_normalized(v[k], mean, rstd)
        else:
            for k in range(k1 - k0):
                out[k] = g[k] * gm.layer_normalized(v[k], mean, rstd)


@simd_jit(**_JIT_SUMS)
def _norm_input(t, r0, n, norm, xw):
    """Rows ``r0 .. n`` of step ``t``, when the loop normalises the input side (``inputs``): ``xw[t] = g_ih
    * LN(x_raw[t]) + bias`` (``x_raw`` may be ``xw`` itself)."""
    prefer_full_vectors()
    kept, inputs, g_ih, bias, g_hh, g_c, b_c, eps, stats, x_raw, raw = norm
    if not inputs:
        return
    one = one_of(xw)
    for b in range(r0, n):
        v, out = x_raw[t, b], xw[t, b]
        mean, rstd = row_stats(one, v, eps)
        for k in range(v.shape[0]):
            out[k] = g_ih[k] * gm.layer_normalized(v[k], mean, rstd) + bias[k]


@simd_jit(**_JIT)
def _zero_idle_raw_grads(t, i0, i1, norm):
    """Rows ``i0 .. i1`` of ``d_raw[t]`` (:class:`.NormBackward`), idle at step ``t``, to zero. A function
    of its own: written in the loops, through an array unpacked inside their ``if norm is not None``
    branch, numba dropped the write (those rows kept ``np.empty``'s bytes)."""
    g_hh, g_c, stats, raw, d_raw, acc_hh, acc_c = norm
    d_raw[t, i0:i1] = 0.0


@simd_jit(**_JIT_SUMS)
def _norm_rows_grad(t, r0, n, k0, k1, slot, src, norm):
    """The backward of :func:`_norm_rows` for rows ``r0 .. n`` of step ``t``: ``d_raw[t, :, k0:k1]``
    (:class:`.NormBackward`), the cotangent of ``raw[t]``, from ``src[:, k0:k1]``, that of ``g_hh *
    LN(raw) + b_hh``; the per-row sums of the gain's and the shift's gradients into ``acc_hh``."""
    prefer_full_vectors()
    g_hh, g_c, stats, raw, d_raw, acc_hh, acc_c = norm
    one = one_of(raw)
    inv = one / (k1 - k0)
    g = g_hh[k0:k1]
    for b in range(r0, n):
        v, d, dv = raw[t, b, k0:k1], src[b, k0:k1], d_raw[t, b, k0:k1]
        d_gain, d_shift = acc_hh[b, 0, k0:k1], acc_hh[b, 1, k0:k1]
        mean, rstd = stats[t, b, slot, 0], stats[t, b, slot, 1]
        sum_d, sum_dx = one - one, one - one
        for k in range(k1 - k0):
            x = gm.layer_normalized(v[k], mean, rstd)
            d_gain[k] += d[k] * x
            d_shift[k] += d[k]
            dd = d[k] * g[k]
            sum_d += dd
            sum_dx += dd * x
        mean_d, mean_dx = sum_d * inv, sum_dx * inv
        for k in range(k1 - k0):
            x = gm.layer_normalized(v[k], mean, rstd)
            dv[k] = gm.layer_norm_grad(rstd, d[k] * g[k], x, mean_d, mean_dx)


# -- LSTM -----------------------------------------------------------------------------------------
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
def _lstm_tile(xw, t, i0, i1, j0, j1, H, c, y, m, project, keep, tanh_c_all, clip_lo, clip_hi):
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
        tc_out = tanh_c_all[t if keep else 0, b, j0:j1] if project else m[b, j0:j1]
        for j in range(j1 - j0):
            gi = sigmoid(gi_[j])
            gf = sigmoid(gf_[j])
            gg = tanh(gg_[j])
            go = sigmoid(go_[j])
            cn = gm.lstm_cell(gi, gf, gg, cb[j], clip_lo, clip_hi)
            tc = tanh(cn)
            _store_lstm(gi_, gf_, gg_, go_, cb, tc_out, out, j, gi, gf, gg, go, cn, tc)


@simd_jit(**_JIT)  # keyed on the variant: prefer_full_vectors depends on it
def _lstm_peephole_tile(xw, t, i0, i1, H, c, y, m, project, keep, tanh_c_all, clip_lo, clip_hi, P):
    """:func:`_lstm_tile` (all units) with peepholes ``P (3,H)``: ``i``, ``f`` also read the cell entering
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


@simd_jit(**_JIT)
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


@simd_jit(**_JIT)
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
        t = _step_time(s, T, reverse)
        n = min(bs[t], r1)
        if n > r0:
            if masked:
                _masked_rows(h, h_mask, hm, r0, n)
            src = hm if masked else h
            if zone_c:
                _copy_rows(c_prev[r0:n], c[r0:n])
            if norm is not None:  # layer norm: the raw product apart, normalised into xw[t]; the cell's norm
                kept, inputs, g_ih, bias, g_hh, g_c, b_c, eps, stats, x_raw, raw = norm
                _norm_input(t, r0, n, norm, xw)
                _unit_groups(src, r0, n, W_hh_p, 4, 0, W_hh_p.shape[0] // 4, raw[t if kept else 0], False,
                             scratch)
                _norm_rows(t, r0, n, 0, 4 * H, 0, norm, xw[t], True)
                _lstm_norm_tile(xw, t, r0, n, H, c, y, rows, project, tanh_c_all, clip_lo, clip_hi, P, norm)
            else:
                _unit_groups(src, r0, n, W_hh_p, 4, 0, W_hh_p.shape[0] // 4, xw[t], True, scratch)
                if peep:
                    _lstm_peephole_tile(xw, t, r0, n, H, c, y, rows, project, keep, tanh_c_all, clip_lo,
                                        clip_hi, P)
                else:
                    _lstm_tile(xw, t, r0, n, 0, H, H, c, y, rows, project, keep, tanh_c_all, clip_lo, clip_hi)
            if zone_c:
                if keep:
                    _copy_rows(c_cand_all[t, r0:n], c[r0:n])
                _zone_rows(m_c, t, c_prev, c, r0, n)
            if keep:
                for b in range(r0, n):
                    _copy_row(c_all[t, b], c[b])
            if project:
                gemm(rows[r0:n], W_hr_p, 1, y[t, r0:n], False, scratch)
            if zone_h:
                _zone_rows(m_h, t, h, y[t], r0, n)
            _copy_rows(h[r0:n], y[t, r0:n])
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


@register_jitable(inline="always")
def _unit_groups(src, r0, n, W_p, gates, u0, u1, out, accumulate, scratch):
    """Every gate of unit groups ``u0 .. u1`` for rows ``r0 .. n``: each group's weights read once per step,
    for all the row tiles (:func:`.packed_gemm.gate_group`)."""
    mr_max = ROWS_BY_NV[gates]
    for u in range(u0, u1):
        for i0 in range(r0, n, mr_max):
            gate_group(src, i0, min(mr_max, n - i0), W_p, gates, u, out, accumulate, scratch)


@register_jitable(inline="always")
def _column_step_end(xw, t, n, j0, j1, H, gates, src, dst, y, keep):
    """The end of a column-split step for units ``j0 .. j1``: active rows' new state from ``y``; idle rows
    carry their state, their ``y`` and (``keep``) their ``gates`` activations in ``xw`` are zero."""
    for b in range(n):
        _copy_row(dst[b, j0:j1], y[t, b, j0:j1])
    for b in range(n, dst.shape[0]):
        _copy_row(dst[b, j0:j1], src[b, j0:j1])
        y[t, b, j0:j1] = 0.0
        if keep:
            for g in range(gates):
                xw[t, b, g * H + j0:g * H + j1] = 0.0


@register_jitable(inline="always")
def unit_range(part, parts, groups, W, H):
    """Units ``[j0, j1)`` of part ``part`` of ``parts`` when ``groups`` unit groups of ``W`` split evenly."""
    u0, u1 = groups * part // parts, groups * (part + 1) // parts
    return u0, u1, u0 * W, min(H, u1 * W)


@simd_jit(**_JIT)
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
        t = _step_time(s, T, reverse)
        n = min(bs[t], B)
        src, dst, gates = h_buf[s % 2], h_buf[(s + 1) % 2], xw[t]
        _unit_groups(src, 0, n, W_hh_p, 4, u0, u1, gates, True, scratch)
        _lstm_tile(xw, t, 0, n, j0, j1, H, c, y, rows, False, keep, c_all, clip_lo, clip_hi)
        _column_step_end(xw, t, n, j0, j1, H, 4, src, dst, y, keep)
        if keep:
            for b in range(n):
                _copy_row(c_all[t, b, j0:j1], c[b, j0:j1])
            c_all[t, n:, j0:j1] = 0.0
        if not barrier(sync, parts):
            return  # cancelled: the call is failing (loop_threads.run_columns)


@simd_jit(**_JIT_SUMS)
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


@simd_jit(**_JIT)
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


@simd_jit(**_JIT)
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


@simd_jit(**_JIT)
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
        t = _step_time(s, T, reverse)
        n = min(bs[t], B)
        src, dst = h_buf[s % 2], h_buf[(s + 1) % 2]
        _unit_groups(src, 0, n, W_hh_p, 4, u0, u1, raw[t if kept else 0], False, scratch)
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
        _column_step_end(xw, t, n, j0, j1, H, 4, src, dst, y, keep)
        if keep:
            for b in range(n):
                _copy_row(c_all[t, b, j0:j1], c[b, j0:j1])
            c_all[t, n:, j0:j1] = 0.0
            tanh_c_all[t, n:, j0:j1] = 0.0
        if not barrier(sync, parts):
            return


@simd_jit(**_JIT)
def lstm_backward_loop(r0, r1, residuals, grads, carry, cell, variants, work, norm, scratch):
    """The LSTM backward of rows ``r0 .. r1``, steps in reverse order of the forward (bundles:
    :class:`.LSTMResiduals`; :class:`.BackSteps`, ``dpre (T,B,4H)`` out; :class:`.Cotangents` ``dh``,
    ``dc``, carried in and out; :class:`.LSTMCell` packed for the backward; :class:`.Variants`;
    :class:`.BackwardWork`). Per step: the carried cotangents' shares (:func:`_lstm_carried_in`), the
    gate gradients (peepholes: :func:`_lstm_peephole_grads`), ``dh = dpre @ W_hh`` (times ``h_mask``
    under recurrent dropout), the carried shares of zoneout added back. Layer norm (:class:`.NormBackward`):
    the gate gradients through the cell's norm (:func:`_lstm_norm_grads`), then the product's norm
    (:func:`_norm_rows_grad`: ``d_raw[t]``, the raw product's cotangent, is the GEMM's operand)."""
    prefer_full_vectors()
    gates, c_all, c_prev, tanh_c_all = residuals
    bs, reverse, dy, dpre, d_h, dn_rec, has_seq, dc_seq = grads
    dh, dc = carry
    W_hh_p, W_hr_p, project, use_clip, clip_lo, clip_hi, peep, P = cell
    masked, h_mask, zone_h, m_h, zone_c, m_c = variants
    rows, drh, carry_h, carry_c = work
    T, H = gates.shape[0], dc.shape[1]
    one = one_of(gates)
    for s in range(T):
        t = _step_time(T - 1 - s, T, reverse)
        n = min(bs[t], r1)
        if n > r0:
            _lstm_carried_in(t, r0, n, grads, carry, cell, variants, work, scratch)
            if norm is not None:
                _lstm_norm_grads(t, r0, n, residuals, grads, carry, cell, variants, work, norm)
            elif peep:
                _lstm_peephole_grads(t, r0, n, residuals, grads, carry, cell, variants, work)
            else:
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
                        di, df, dg, do, dcp = gm.lstm_cell_grads(one, gi, gf, gg, go, cb[j], tc, cp[j], dmj,
                                                                 dcb[j], use_clip, clip_lo, clip_hi)
                        _store_lstm_grads(d, dcb, j, H, di, df, dg, do, dcp)
            if zone_c:
                _add_rows(carry_c, dc, r0, n)
            if norm is not None:
                g_hh, g_c, stats, raw, d_raw, acc_hh, acc_c = norm
                _norm_rows_grad(t, r0, n, 0, 4 * H, 0, dpre[t], norm)
                gemm(d_raw[t, r0:n], W_hh_p, 1, dh[r0:n], False, scratch)
            else:
                gemm(dpre[t, r0:n], W_hh_p, 1, dh[r0:n], False, scratch)
            if masked:
                _scale_rows(dh, h_mask, r0, n)
            if zone_h:
                _add_rows(carry_h, dh, r0, n)
        dpre[t, max(n, r0):r1] = 0.0
        if project:
            d_h[t, max(n, r0):r1] = 0.0
        if norm is not None:
            _zero_idle_raw_grads(t, max(n, r0), r1, norm)


@simd_jit(**_JIT_SUMS)
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
                _copy_row(dm, dh[b])
            else:
                _add_row(dy[t, b], dh[b], dm)
        go_ = g[LSTM_O * H:(LSTM_O + 1) * H]
        d_gain, d_shift = acc_c[b, 0], acc_c[b, 1]
        mean, rstd = stats[t, b, 1, 0], stats[t, b, 1, 1]
        sum_d, sum_dx = one - one, one - one
        for j in range(H):
            du = dm[j] * go_[j] * (one - tcb[j] * tcb[j])  # the cotangent of g_c * LN(c) + b_c
            x = gm.layer_normalized(cb[j], mean, rstd)
            d_gain[j] += du * x
            d_shift[j] += du
            dd = du * g_c[j]
            sum_d += dd
            sum_dx += dd * x
        mean_d, mean_dx = sum_d * inv, sum_dx * inv
        for j in range(H):  # dc: the carry, then the cell's whole cotangent (the output's part joins)
            du = dm[j] * go_[j] * (one - tcb[j] * tcb[j])
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


@simd_jit(**_JIT)
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
        _add_rows(dc_seq[t], dc, r0, n)
    if zone_c:
        _split_zoned(one, m_c, t, dc, dc, carry_c, r0, n)
    if zone_h:
        _dy_plus_dh(dy, t, dh, dh, r0, n)
        _split_zoned(one, m_h, t, dh, d_h[t] if project else dh, carry_h, r0, n)
    if project:
        if not zone_h:
            _dy_plus_dh(dy, t, dh, d_h[t], r0, n)
        gemm(d_h[t, r0:n], W_hr_p, 1, rows[r0:n], False, scratch)


@simd_jit(**_JIT)
def _lstm_peephole_grads(t, r0, n, residuals, grads, carry, cell, variants, work):
    """The gate gradients of step ``t``, rows ``r0 .. n``, with peepholes
    (:func:`.gate_math.lstm_peephole_cell_grads`); compiled apart like :func:`_lstm_peephole_tile`."""
    prefer_full_vectors()
    gates, c_all, c_prev, tanh_c_all = residuals
    bs, reverse, dy, dpre, d_h, dn_rec, has_seq, dc_seq = grads
    dh, dc = carry
    W_hh_p, W_hr_p, project, use_clip, clip_lo, clip_hi, peep, P = cell
    masked, h_mask, zone_h, m_h, zone_c, m_c = variants
    rows, drh, carry_h, carry_c = work
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
            di, df, dg, do, dcp = gm.lstm_peephole_cell_grads(
                one, gi, gf, gg, go, cb[j], tc, cp[j], dmj, dcb[j], use_clip, clip_lo, clip_hi, P[0, j],
                P[1, j], P[2, j])
            _store_lstm_grads(d, dcb, j, H, di, df, dg, do, dcp)


# -- GRU ------------------------------------------------------------------------------------------
@register_jitable(inline="always")
def _gru_after_tile(xw, t, i0, i1, j0, j1, H, h, hh, b_hn, y, hn_all, keep):
    """Reset-after GRU gate math of rows ``i0 .. i1``, units ``j0 .. j1`` (``hh = h @ W_hh.T`` there);
    over views that start at ``j0`` (see :func:`_lstm_tile`)."""
    R, Z, N = GRU_R * H, GRU_Z * H, GRU_N * H
    bias = b_hn[j0:j1]
    for b in range(i0, i1):
        g, q = xw[t, b], hh[b]
        gr, gz, gn = g[R + j0:R + j1], g[Z + j0:Z + j1], g[N + j0:N + j1]
        qr, qz, qn = q[R + j0:R + j1], q[Z + j0:Z + j1], q[N + j0:N + j1]
        hb, yb = h[b, j0:j1], y[t, b, j0:j1]
        hn_out = hn_all[t if keep else 0, b, j0:j1]
        for j in range(j1 - j0):
            r = sigmoid(gr[j] + qr[j])
            z = sigmoid(gz[j] + qz[j])
            hn = qn[j] + bias[j]
            nn = tanh(gm.gru_candidate_input(gn[j], r, hn))
            gr[j] = r
            gz[j] = z
            gn[j] = nn
            hn_out[j] = hn
            yb[j] = gm.gru_output(z, nn, hb[j])


@simd_jit(**_JIT)
def gru_forward_columns(part, parts, sync, steps, state, cell, cache, work, scratch):
    """:func:`gru_forward_loop` (reset-after, no cell variants) over the units of one of ``parts`` threads,
    the column split of :func:`lstm_forward_columns` (:class:`.ColumnState` likewise). ``rows (B,3H)``:
    scratch the parts share, each writing and reading only its units' columns."""
    prefer_full_vectors()
    xw, bs, y, reverse = steps
    h_buf, c = state
    W_hh_p, W_rz_p, W_n_p, reset_after, b_hn = cell
    keep, hn_all = cache
    rows, hm, c_prev = work
    T, B, H = xw.shape[0], xw.shape[1], h_buf.shape[2]
    u0, u1, j0, j1 = unit_range(part, parts, W_hh_p.shape[0] // 3, W_hh_p.shape[2], H)
    for s in range(T):
        t = _step_time(s, T, reverse)
        n = min(bs[t], B)
        src, dst = h_buf[s % 2], h_buf[(s + 1) % 2]
        _unit_groups(src, 0, n, W_hh_p, 3, u0, u1, rows, False, scratch)
        _gru_after_tile(xw, t, 0, n, j0, j1, H, src, rows, b_hn, y, hn_all, keep)
        _column_step_end(xw, t, n, j0, j1, H, 3, src, dst, y, keep)
        if keep:
            hn_all[t, n:, j0:j1] = 0.0
        if not barrier(sync, parts):
            return  # cancelled: the call is failing (loop_threads.run_columns)


@simd_jit(**_JIT)
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
        t = _step_time(s, T, reverse)
        n = min(bs[t], r1)
        if n > r0:
            if masked:
                _masked_rows(h, h_mask, hm, r0, n)
            if norm is not None:
                _norm_input(t, r0, n, norm, xw)
            if reset_after:
                product = rows
                if norm is not None:  # the raw product apart, normalised into rows
                    kept, inputs, g_ih, bias, g_hh, g_c, b_c, eps, stats, x_raw, raw = norm
                    product = raw[t if kept else 0]
                _unit_groups(hm if masked else h, r0, n, W_hh_p, 3, 0, W_hh_p.shape[0] // 3, product, False,
                             scratch)
                if norm is not None:
                    _norm_rows(t, r0, n, 0, 3 * H, 0, norm, rows, False)
                _gru_after_tile(xw, t, r0, n, 0, H, H, h, rows, b_hn, y, hn_all, keep)
            else:
                _gru_before_step(t, r0, n, steps, state, cell, variants, work, norm, scratch)
            if zone_h:
                _zone_rows(m_h, t, h, y[t], r0, n)
            _copy_rows(h[r0:n], y[t, r0:n])
        y[t, max(n, r0):r1] = 0.0
        if keep:
            xw[t, max(n, r0):r1] = 0.0
            if reset_after:
                hn_all[t, max(n, r0):r1] = 0.0


@simd_jit(**_JIT)
def _gru_before_step(t, r0, n, steps, state, cell, variants, work, norm, scratch):
    """A reset-before GRU step, rows ``r0 .. n``: the r, z product and gates, ``r * h`` (of the masked ``h``
    under recurrent dropout) into ``rows``, its n product, the output. Compiled apart, like
    :func:`_lstm_peephole_tile`."""
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
        _norm_rows(t, r0, n, RZ, RZ + 2 * H, 0, norm, xw[t], True)
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
        _norm_rows(t, r0, n, N, N + H, 1, norm, xw[t], True)
    else:
        gemm(rows[r0:n, :H], W_n_p, 1, xw[t, r0:n, N:N + H], True, scratch)
    for b in range(r0, n):
        g, hb, yb = xw[t, b], h[b], y[t, b]
        for j in range(H):
            nn = tanh(g[N + j])
            z = g[Z + j]
            g[N + j] = nn
            yb[j] = gm.gru_output(z, nn, hb[j])


@simd_jit(**_JIT)
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
        t = _step_time(T - 1 - s, T, reverse)
        n = min(bs[t], r1)
        if n > r0:
            if zone_h:  # the step's share of dy + dh, read below as dh
                _dy_plus_dh(dy, t, dh, dh, r0, n)
                _split_zoned(one, m_h, t, dh, dh, carry_h, r0, n)
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
                _add_rows(carry_h, dh, r0, n)
        dpre[t, max(n, r0):r1] = 0.0
        if norm is not None:
            _zero_idle_raw_grads(t, max(n, r0), r1, norm)
        elif reset_after:
            dn_rec[t, max(n, r0):r1] = 0.0


@simd_jit(**_JIT)
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
            _copy_row(dn_rec[t, b], e[N:N + H])
    operand = rows  # the GEMM's; with layer norm the raw product's cotangent
    if norm is not None:
        g_hh, g_c, stats, raw, d_raw, acc_hh, acc_c = norm
        _norm_rows_grad(t, r0, n, 0, 3 * H, 0, rows, norm)
        operand = d_raw[t]
    if masked:
        gemm(operand[r0:n], W_hh_p, 1, drh[r0:n], False, scratch)
        _add_masked(drh, h_mask, dh, r0, n)
    else:
        gemm(operand[r0:n], W_hh_p, 1, dh[r0:n], True, scratch)


@simd_jit(**_JIT)
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
        _norm_rows_grad(t, r0, n, N, N + H, 1, dpre[t], norm)
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
            _norm_rows_grad(t, r0, n, RZ, RZ + 2 * H, 0, dpre[t], norm)
        gemm(operand[r0:n, RZ:RZ + 2 * H], W_rz_p, 1, drh[r0:n], True, scratch)
        _add_masked(drh, h_mask, dh, r0, n)
        return
    for b in range(r0, n):
        g, hp, d, q, dhb = gates[t, b], h_prev[t, b], dpre[t, b], drh[b], dh[b]
        for j in range(H):
            r = g[R + j]
            d[R + j] = gm.sigmoid_grad(one, r, q[j] * hp[j])
            dhb[j] += q[j] * r
    if norm is not None:
        _norm_rows_grad(t, r0, n, RZ, RZ + 2 * H, 0, dpre[t], norm)
    gemm(operand[r0:n, RZ:RZ + 2 * H], W_rz_p, 1, dh[r0:n], True, scratch)


# -- plain RNN (tanh or relu) ---------------------------------------------------------------------
@simd_jit(**_JIT)
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
        t = _step_time(s, T, reverse)
        n = min(bs[t], r1)
        if n > r0:
            pre = xw[t]
            if masked:
                _masked_rows(h, h_mask, hm, r0, n)
            src = hm if masked else h
            if norm is None:
                _unit_groups(src, r0, n, W_hh_p, 1, 0, W_hh_p.shape[0], pre, True, scratch)
            else:  # layer norm: the raw product apart, normalised into pre
                kept, inputs, g_ih, bias, g_hh, g_c, b_c, eps, stats, x_raw, raw = norm
                _norm_input(t, r0, n, norm, xw)
                _unit_groups(src, r0, n, W_hh_p, 1, 0, W_hh_p.shape[0], raw[t if kept else 0], False, scratch)
                _norm_rows(t, r0, n, 0, H, 0, norm, pre, True)
            for b in range(r0, n):
                p, yb = pre[b], y[t, b]
                for j in range(H):
                    yb[j] = (p[j] if p[j] > zero else zero) if relu else tanh(p[j])
            if zone_h:
                _copy_rows(xw[t, r0:n], y[t, r0:n])
                _zone_rows(m_h, t, h, y[t], r0, n)
            _copy_rows(h[r0:n], y[t, r0:n])
        y[t, max(n, r0):r1] = 0.0


@simd_jit(**_JIT)
def rnn_backward_loop(r0, r1, y, grads, carry, cell, variants, work, norm, scratch):
    """The plain RNN backward of rows ``r0 .. r1``: ``y (T,B,H)`` each step's own output (the forward's
    ``y``, or its ``xw`` under zoneout); bundles :class:`.BackSteps`, ``dpre (T,B,H)`` out;
    :class:`.Cotangents` ``dh``; :class:`.RNNCell` packed for the backward; :class:`.Variants`;
    :class:`.BackwardWork` (``carry_h`` under zoneout). Recurrent dropout: the GEMM's ``dh`` times
    ``h_mask``. Layer norm (:class:`.NormBackward`): the GEMM reads the raw product's cotangent
    (:func:`_norm_rows_grad`, into ``d_raw[t]``)."""
    prefer_full_vectors()
    bs, reverse, dy, dpre, d_h, dn_rec, has_seq, dc_seq = grads
    dh, dc = carry
    W_hh_p, relu = cell
    masked, h_mask, zone_h, m_h, zone_c, m_c = variants
    rows, drh, carry_h, carry_c = work
    T, H = y.shape[0], dh.shape[1]
    one = one_of(y)
    for s in range(T):
        t = _step_time(T - 1 - s, T, reverse)
        n = min(bs[t], r1)
        if n > r0:
            if zone_h:  # the step's share of dy + dh, read below as dh
                _dy_plus_dh(dy, t, dh, dh, r0, n)
                _split_zoned(one, m_h, t, dh, dh, carry_h, r0, n)
            for b in range(r0, n):
                yb, dyb, dhb, d = y[t, b], dy[t, b], dh[b], dpre[t, b]
                for j in range(H):
                    d[j] = gm.rnn_grad(one, relu, yb[j], dhb[j] if zone_h else dyb[j] + dhb[j])
            if norm is not None:
                g_hh, g_c, stats, raw, d_raw, acc_hh, acc_c = norm
                _norm_rows_grad(t, r0, n, 0, H, 0, dpre[t], norm)
                gemm(d_raw[t, r0:n], W_hh_p, 1, dh[r0:n], False, scratch)
            else:
                gemm(dpre[t, r0:n], W_hh_p, 1, dh[r0:n], False, scratch)
            if masked:
                _scale_rows(dh, h_mask, r0, n)
            if zone_h:
                _add_rows(carry_h, dh, r0, n)
        dpre[t, max(n, r0):r1] = 0.0
        if norm is not None:
            _zero_idle_raw_grads(t, max(n, r0), r1, norm)
