"""What every cell's compiled time loop is built from: the activations, the row helpers, layer norm's row
passes, the unit groups of a step's product; the loops themselves are :mod:`.lstm_loops`,
:mod:`.gru_loops` and :mod:`.rnn_loops`.

Each ``*_forward_loop`` / ``*_backward_loop`` function runs the WHOLE time loop of one direction for the
rows ``[r0, r1)`` of the length-sorted batch; step ``t`` works on the active rows ``[r0, min(bs[t], r1))``
(variable lengths shrink the per-step product to the active prefix). The per-step products run on the
packed SIMD kernels (:mod:`.packed_gemm`) with the weights packed by the caller. Forward: for each unit
group, its gate-grouped GEMM tiles of ``h @ W_hh.T`` are added into ``xw[t]`` for every row tile
(:func:`unit_groups`: the group's weights are read once per step: with the row tiles outside, a 16-row S2
step read its 4 MB of weights three times and ran 1.4-1.7x slower), then the gate math runs over the
step's full rows, writing the new state, the output and the residuals in place (per unit group, the gate
loop over 16 units did not vectorise). The engine's threads (:mod:`.loop_threads`) give each loop a row
range; the row range stays a run-time argument on purpose: with the bounds known at compile time (0 and
``xw.shape[1]``) LLVM's code for the gate loop ran 3.5x slower here. The column-split forwards
(``*_forward_columns``) split the units instead (:func:`unit_range`, :func:`column_step_end`).

Semantics equal :mod:`arrayrnn.engines.cells` (the oracle). Arguments: a loop takes its row range ``r0,
r1`` (a column split: its part, the number of parts and the barrier's state), named bundles
(:mod:`.bundles`: the sequence, the state, the cell's packed weights and options, the cache or residuals,
the variants' masks, the row buffers), each a plain tuple that the loop unpacks on entry into locals named
like its fields, and ``scratch``, the thread's tile (:func:`.packed_gemm.new_scratch`). Helpers compiled
apart take the same bundles; inlined ones take arrays. An absent array is zero-size, announced by a flag,
so each loop keeps one compiled signature per dtype. Buffers are preallocated by the caller; nothing is
allocated per step. Entries of inactive rows (``b >= bs[t]``) of ``y``, the residuals and the gradient
stacks are set to zero.

The cell variants run in the same loops behind run-time flags, each with its zero-size stand-ins when
off (one signature still): recurrent dropout (the products read ``h * h_mask``, :func:`masked_rows`; their
``dh`` is masked), zoneout (after the step, :func:`zone_rows`; the backward splits each state's cotangent,
:func:`split_zoned`), the LSTM's peepholes, per-step cell cotangents (``return_all_states``). A plain call
runs the code it ran before, plus one untaken branch per step.

Layer norm (``layer_norm=True``; :class:`.NormForward`, :class:`.NormBackward`) runs in the same loops
behind its flag: per step and active row, ``xw[t] = g_ih * LN(x_raw[t]) + b`` (:func:`norm_input`), the
recurrent GEMM into ``raw[t]`` (not into ``xw[t]``), ``xw[t] += g_hh * LN(raw[t])`` (:func:`norm_rows`),
then the cell's gate math. The backward runs each norm back where its cotangent is complete
(:func:`norm_rows_grad`: the GEMM then reads the raw product's cotangent ``d_raw[t]``), the gains' sums per
row in ``acc_*``. The row passes are compiled apart with their sums reassociated (:data:`JIT_SUMS`), so
LLVM vectorises them.

The gate formulas themselves (how activated gates combine into the state, and their derivatives) live
in :mod:`arrayrnn.engines.gate_math` and are shared with the cupy engine's CUDA kernels; numba inlines them
(numba-cuda compiles a kernel's call of an ``@njit`` function apart only with a device present). The
activations below are compiled apart instead, and LLVM inlines them: numba's own inlining typed the
polynomials again at each of their hundreds of call sites, about half of a first compile, for the same
machine code (the same vector instructions and no call left in the loops, issue 45).

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
from .. import step_order
from ..numba_cache import njit
from .packed_gemm import gate_groups
from .simd_ir import prefer_full_vectors, simd_jit

JIT = dict(cache=True, nogil=True, error_model="numpy")
"""The time loops' options (with :func:`.simd_ir.simd_jit`, whose cache is keyed on the SIMD variant)."""
JIT_SUMS = dict(JIT, fastmath={"reassoc"})
"""The layer norm's row passes: their sums vectorise only where LLVM may reassociate them (nothing else in
these functions is reassociated: they call no activation)."""


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


@njit(**JIT)
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


step_time = register_jitable(inline="always")(step_order.step_time)  # the one time-step order


# array-to-array copies go element by element: numba's broadcasting assignment (``a[i:j] = b[i:j]``)
# compiles its shape-mismatch message, about 6 s of every compiling process's first compile (issue 36)
@register_jitable(inline="always")
def copy_row(dst, src):
    for j in range(src.shape[0]):
        dst[j] = src[j]


@register_jitable(inline="always")
def copy_rows(dst, src):
    for i in range(src.shape[0]):
        for j in range(src.shape[1]):
            dst[i, j] = src[i, j]


@register_jitable(inline="always")
def masked_rows(h, h_mask, hm, r0, n):
    """``hm[r0:n] = h[r0:n] * h_mask[r0:n]``: the recurrent-dropout-masked state the step's GEMM reads."""
    for b in range(r0, n):
        hb, mb, out = h[b], h_mask[b], hm[b]
        for j in range(hb.shape[0]):
            out[j] = hb[j] * mb[j]


@register_jitable(inline="always")
def add_masked(src, h_mask, dh, r0, n):
    """``dh[r0:n] += src[r0:n] * h_mask[r0:n]``: a GEMM's gradient of the masked state, into the carry."""
    for b in range(r0, n):
        sb, mb, out = src[b], h_mask[b], dh[b]
        for j in range(sb.shape[0]):
            out[j] += sb[j] * mb[j]


@register_jitable(inline="always")
def scale_rows(dh, h_mask, r0, n):
    for b in range(r0, n):
        db, mb = dh[b], h_mask[b]
        for j in range(db.shape[0]):
            db[j] *= mb[j]


@register_jitable(inline="always")
def zone_rows(m, t, prev, new, r0, n):
    """Zoneout of step ``t``: ``new[r0:n] = m[t] * prev + (1 - m[t]) * new`` (``prev``: the carried state)."""
    for b in range(r0, n):
        mb, pb, nb = m[t, b], prev[b], new[b]
        for j in range(nb.shape[0]):
            nb[j] = gm.zoneout(mb[j], pb[j], nb[j])


@register_jitable(inline="always")
def split_zoned(one, m, t, total, own, carry, r0, n):
    """Zoneout's backward split of the cotangents ``total[r0:n]`` of step ``t``'s state: the step's own
    share ``(1 - m) * total`` into ``own``, the carried share ``m * total`` into ``carry``."""
    for b in range(r0, n):
        mb, tb, ob, cb = m[t, b], total[b], own[b], carry[b]
        for j in range(tb.shape[0]):
            ob[j], cb[j] = gm.zoneout_grads(one, mb[j], tb[j])


@register_jitable(inline="always")
def add_row(a, b, out):
    """``out = a + b`` over a row."""
    for j in range(out.shape[0]):
        out[j] = a[j] + b[j]


@register_jitable(inline="always")
def add_rows(src, dst, r0, n):
    for b in range(r0, n):
        sb, db = src[b], dst[b]
        for j in range(db.shape[0]):
            db[j] += sb[j]


@register_jitable(inline="always")
def dy_plus_dh(dy, t, dh, out, r0, n):
    for b in range(r0, n):
        dyb, dhb, ob = dy[t, b], dh[b], out[b]
        for j in range(ob.shape[0]):
            ob[j] = dyb[j] + dhb[j]


# -- layer normalisation (layer_norm=True) ---------------------------------------------------------
@simd_jit(**JIT_SUMS)
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


@simd_jit(**JIT)  # not JIT_SUMS: reassociation could regroup the scaled squares into an overflowing product
def _rescaled_rstd(one, v, mean, eps):
    """:func:`row_stats`'s rare third pass, for a row whose squared deviations overflowed: the squares of
    the deviations scaled by a power of two, in float64 (:func:`.gate_math.layer_norm_rstd_rescaled`)."""
    scale, wide_mean, scaled = gm.layer_norm_scale(v.itemsize), float(mean), 0.0
    for k in range(v.shape[0]):
        d = (float(v[k]) - wide_mean) * scale
        scaled += d * d
    return gm.layer_norm_rstd_rescaled(one, scaled / v.shape[0], scale, eps)


@simd_jit(**JIT_SUMS)
def norm_rows(t, r0, n, k0, k1, slot, norm, dst, accumulate):
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


@simd_jit(**JIT_SUMS)
def norm_input(t, r0, n, norm, xw):
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


@simd_jit(**JIT)
def zero_idle_raw_grads(t, i0, i1, norm):
    """Rows ``i0 .. i1`` of ``d_raw[t]`` (:class:`.NormBackward`), idle at step ``t``, to zero. A function
    of its own: written in the loops, through an array unpacked inside their ``if norm is not None``
    branch, numba dropped the write (those rows kept ``np.empty``'s bytes)."""
    g_hh, g_c, stats, raw, d_raw, acc_hh, acc_c = norm
    d_raw[t, i0:i1] = 0.0


@simd_jit(**JIT_SUMS)
def norm_rows_grad(t, r0, n, k0, k1, slot, src, norm):
    """The backward of :func:`norm_rows` for rows ``r0 .. n`` of step ``t``: ``d_raw[t, :, k0:k1]``
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


@register_jitable(inline="always")
def unit_groups(src, r0, n, W_p, gates, u0, u1, out, accumulate, scratch):
    """Every gate of unit groups ``u0 .. u1`` for rows ``r0 .. n``: each group's weights read once per step
    (in L1-sized K blocks), for all the row tiles (:func:`.packed_gemm.gate_groups`)."""
    gate_groups(src, r0, n, W_p, gates, u0, u1, out, accumulate, scratch)


@register_jitable(inline="always")
def column_step_end(xw, t, n, j0, j1, H, gates, src, dst, y, keep):
    """The end of a column-split step for units ``j0 .. j1``: active rows' new state from ``y``; idle rows
    carry their state, their ``y`` and (``keep``) their ``gates`` activations in ``xw`` are zero."""
    for b in range(n):
        copy_row(dst[b, j0:j1], y[t, b, j0:j1])
    for b in range(n, dst.shape[0]):
        copy_row(dst[b, j0:j1], src[b, j0:j1])
        y[t, b, j0:j1] = 0.0
        if keep:
            for g in range(gates):
                xw[t, b, g * H + j0:g * H + j1] = 0.0


@register_jitable(inline="always")
def unit_range(part, parts, groups, W, H):
    """Units ``[j0, j1)`` of part ``part`` of ``parts`` when ``groups`` unit groups of ``W`` split evenly."""
    u0, u1 = groups * part // parts, groups * (part + 1) // parts
    return u0, u1, u0 * W, min(H, u1 * W)

