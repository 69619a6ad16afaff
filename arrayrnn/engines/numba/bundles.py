"""The compiled loops' arguments, in named bundles: one named tuple per role, its fields written once.

A loop of :mod:`.lstm_loops`, :mod:`.gru_loops` or :mod:`.rnn_loops` takes its row range (or its part of a
column split), a few bundles and the thread's scratch tile, e.g. ``lstm_forward_loop(r0, r1, steps, state,
cell, cache, variants, work, scratch)``. The Python side builds the bundles by name (:mod:`.direction`); a
bundle crosses the call as a plain tuple (:func:`plain`: numba's dispatcher types a plain tuple of arrays in
C, a named tuple in Python, element by element, ~10 us more per call, as much as a batch-1 cell step's loop),
and the loop unpacks it on entry into locals of the same names as the fields, in the fields' order (``xw, bs,
y, reverse = steps``; a test holds every unpack in those modules and :mod:`.loop_parts` to a class below).
Unpacked there, not rebuilt: numba's alias analysis loses the writes made through the arrays of a named tuple
built in compiled code, or of a tuple unpacked inside an inlined helper, and drops them as dead code; helpers
take the arrays. This module is part of the loops' cache key (:data:`.simd_ir.KERNEL_SOURCES`): a change of
fields recompiles them.

Conventions: every array is C-contiguous; an absent array is zero-size (:func:`absent`) and a flag says
whether its feature is on, so a loop keeps one compiled signature per dtype for them. Layer norm is the
exception: off, its bundle is ``None`` and the loops test ``norm is not None``, which numba prunes before
typing, so a loop without it does not compile the norm's helpers (the demo LSTM's training compile: 41 ->
29 s, bench/RESULTS.md); a loop then has two signatures per dtype. Inside such a branch a loop writes the
norm's arrays only through a compiled helper that takes the bundle (``_zero_idle_raw_grads``): numba
dropped a direct write through an array unpacked there. ``(T, ...)`` arrays are indexed by time first, so a
chunk of steps is a slice (:func:`chunk`). ``(B, ...)`` arrays hold every row
of the batch; a row range reads and writes its own rows only.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np

Array = np.ndarray


# -- forward --------------------------------------------------------------------------------------
class Steps(NamedTuple):
    """A forward's sequence: ``xw (T,B,G*H)`` the input side in, overwritten by the gate activations (the
    backward's cache); ``bs (T,)`` int64 batch sizes (step ``t`` runs rows ``b < bs[t]``); ``y
    (T,B,H_out)`` out; ``reverse`` runs ``t = T-1 .. 0``."""

    xw: Array
    bs: Array
    y: Array
    reverse: bool

    def chunk(self, t0: int, t1: int) -> Steps:
        return self._replace(xw=self.xw[t0:t1], bs=self.bs[t0:t1], y=self.y[t0:t1])


class State(NamedTuple):
    """The carried state, in and out: ``h (B,H_out)`` and ``c (B,H)`` (zero-size but for the LSTM)."""

    h: Array
    c: Array


class LSTMCell(NamedTuple):
    """An LSTM's weights as a loop reads them. ``W_hh_p``: ``pack_b(W_hh.T, gates=4)`` (forward) or
    ``pack_b(W_hh)`` (backward); ``W_hr_p`` likewise from ``W_hr`` when ``project``; ``use_clip``: cell
    clipping between ``clip_lo`` and ``clip_hi`` (``-inf``, ``inf`` when off); ``peep``: peepholes
    ``P (3,H)``, rows i, f, o."""

    W_hh_p: Array
    W_hr_p: Array
    project: bool
    use_clip: bool
    clip_lo: Any
    clip_hi: Any
    peep: bool
    P: Array


class GRUCell(NamedTuple):
    """A GRU's weights as a loop reads them. Reset-after: ``W_hh_p`` (``pack_b(W_hh.T, gates=3)`` forward,
    ``pack_b(W_hh)`` backward) and ``b_hn (H,)``, the bias inside ``r * (W_hn h + b_hn)`` (zeros when
    absent); reset-before: ``W_rz_p`` / ``W_n_p``, the r, z rows and the n rows of ``W_hh`` packed apart."""

    W_hh_p: Array
    W_rz_p: Array
    W_n_p: Array
    reset_after: bool
    b_hn: Array


class RNNCell(NamedTuple):
    """A plain RNN's ``W_hh_p`` (``pack_b(W_hh.T)`` forward, ``pack_b(W_hh)`` backward), relu or tanh."""

    W_hh_p: Array
    relu: bool


class CustomCell(NamedTuple):
    """A custom cell's weights as its loops read them (:mod:`.custom_loops`): ``W_hh_p``, ``pack_b(W_hh.T,
    gates=G)`` forward (plain ``pack_b(W_hh.T)`` for more than :data:`.simd_ir.MAX_NV` gates),
    ``pack_b(W_hh)`` backward; ``inner (len(split)*H,)``, the split gates' ``b_hh`` (zeros when absent,
    zero-size without split gates)."""

    W_hh_p: Array
    inner: Array


class ColumnState(NamedTuple):
    """A column split's state: ``h_buf (2,B,H)`` double-buffers ``h`` (step ``s`` reads ``h_buf[s % 2]``
    and writes its units of the other), ``c (B,H)`` the LSTM's cell (zero-size for the GRU)."""

    h_buf: Array
    c: Array


class LSTMCache(NamedTuple):
    """What an LSTM forward keeps for its backward when ``keep`` (else zero-size; ``tanh_c_all`` one step
    of scratch): ``c_all (T,B,H)`` each step's carried cell, ``tanh_c_all (T,B,H)`` its ``tanh``
    (projection only), ``c_cand_all (T,B,H)`` the cell before zoneout (cell zoneout only)."""

    keep: bool
    c_all: Array
    tanh_c_all: Array
    c_cand_all: Array

    def chunk(self, t0: int, t1: int) -> LSTMCache:
        if not self.keep:
            return self
        return self._replace(c_all=self.c_all[t0:t1], tanh_c_all=self.tanh_c_all[t0:t1],
                             c_cand_all=self.c_cand_all[t0:t1])


class GRUCache(NamedTuple):
    """What a reset-after GRU forward keeps when ``keep``: ``hn_all (T,B,H)``, ``W_hn h + b_hn`` (one
    step's worth of scratch otherwise; zero-size for the reset-before GRU)."""

    keep: bool
    hn_all: Array

    def chunk(self, t0: int, t1: int) -> GRUCache:
        return self._replace(hn_all=self.hn_all[t0:t1]) if self.keep else self


class CustomCache(NamedTuple):
    """What a custom cell's forward keeps when ``keep``: ``c_all (T,B,(S-1)*H)`` each step's states besides
    ``h`` (zero-size for one state), ``res_all (T,B,R*H)`` its residuals (one step of scratch otherwise)."""

    keep: bool
    c_all: Array
    res_all: Array

    def chunk(self, t0: int, t1: int) -> CustomCache:
        return self._replace(c_all=self.c_all[t0:t1], res_all=self.res_all[t0:t1]) if self.keep else self


class Variants(NamedTuple):
    """The cell variants' masks (:class:`~arrayrnn.engines.base.CellMasks` of one layer-direction, rows
    sorted): ``masked``: recurrent dropout, ``h_mask (B,H_out)`` multiplies ``h`` where it enters the
    recurrent products; ``zone_h`` / ``zone_c``: zoneout of ``h`` / ``c`` with ``m_h (T,B,H_out)`` /
    ``m_c (T,B,H)``, the weight of the carried state."""

    masked: bool
    h_mask: Array
    zone_h: bool
    m_h: Array
    zone_c: bool
    m_c: Array

    def chunk(self, t0: int, t1: int) -> Variants:
        return self._replace(m_h=self.m_h[t0:t1], m_c=self.m_c[t0:t1])


class ForwardWork(NamedTuple):
    """A forward's row buffers, written and read within a step: ``rows`` (LSTM ``(B,H)``: ``o * tanh(c)``,
    the projection's operand, or ``tanh(c)`` in a column split; GRU ``(B,3H)``: ``h @ W_hh.T``, or ``r * h``
    in its first ``H`` columns); ``hm (B,H_out)``: ``h * h_mask``; ``c_prev (B,H)``: the cell entering
    the step (cell zoneout)."""

    rows: Array
    hm: Array
    c_prev: Array


class NormForward(NamedTuple):
    """Layer normalisation in a forward (``layer_norm=True``; off: ``None`` in its place). ``inputs``: the
    loop normalises the input side too, ``xw[t] = g_ih * LN(x_raw[t]) + bias`` (``x_raw (T,B,G*H)`` the raw
    ``W_ih x``: ``xw`` itself, or kept apart when ``kept``); else ``xw`` arrives normalised. ``g_hh
    (G*H,)`` the recurrent product's gain, ``g_c``, ``b_c (H,)`` the LSTM cell's gain and shift, ``eps``;
    out: ``stats (T,B,S,2)`` the mean and ``1/sqrt(var + eps)`` of each row normalised in the loop, ``raw
    (T,B,G*H)`` each step's raw recurrent product(s) (both one step of scratch unless ``kept``)."""

    kept: bool
    inputs: bool
    g_ih: Array
    bias: Array
    g_hh: Array
    g_c: Array
    b_c: Array
    eps: Any
    stats: Array
    x_raw: Array
    raw: Array

    def chunk(self, t0: int, t1: int) -> NormForward:
        x_raw = self.x_raw[t0:t1] if self.inputs else self.x_raw
        if not self.kept:
            return self._replace(x_raw=x_raw)
        return self._replace(x_raw=x_raw, stats=self.stats[t0:t1], raw=self.raw[t0:t1])


# -- backward -------------------------------------------------------------------------------------
class LSTMResiduals(NamedTuple):
    """An LSTM forward's residuals, read by its backward: ``gates (T,B,4H)`` the activations, ``c_all
    (T,B,H)`` the cell ``tanh`` and the clip saw (before zoneout), ``c_prev (T,B,H)`` the cell entering
    each step, ``tanh_c_all (T,B,H)`` (projection only)."""

    gates: Array
    c_all: Array
    c_prev: Array
    tanh_c_all: Array


class GRUResiduals(NamedTuple):
    """A GRU forward's residuals: ``gates (T,B,3H)`` r, z, n; ``hn_all (T,B,H)`` (reset-after);
    ``h_prev (T,B,H)`` the state entering each step."""

    gates: Array
    hn_all: Array
    h_prev: Array


class CustomResiduals(NamedTuple):
    """A custom cell forward's residuals: ``res_all (T,B,R*H)``, residual ``k`` in columns ``k*H ..
    (k+1)*H``."""

    res_all: Array


class Cotangents(NamedTuple):
    """A backward's carried cotangents, in and out: ``dh (B,H_out)`` (in ``dh_n``, out ``dh0``) and ``dc
    (B,H)`` (``dc_n``, ``dc0``; zero-size but for the LSTM)."""

    dh: Array
    dc: Array


class BackSteps(NamedTuple):
    """A backward's sequence (steps run in the reverse order of the forward's): ``dy (T,B,H_out)`` in;
    ``dpre (T,B,G*H)`` out, the gradient of the pre-activations; ``d_h (T,B,P)`` out, of the projected
    ``h`` (LSTM projection); ``dn_rec (T,B,H)`` out, of ``W_hn h + b_hn`` (reset-after GRU);
    ``dc_seq (T,B,H)`` in, every step's cell cotangent, joining the carry when ``has_seq``."""

    bs: Array
    reverse: bool
    dy: Array
    dpre: Array
    d_h: Array
    dn_rec: Array
    has_seq: bool
    dc_seq: Array


class CustomBackSteps(NamedTuple):
    """A custom cell backward's sequence: ``dy (T,B,H)`` in; ``dpre (T,B,G*H)`` out, the gradient of the
    input side ``xw``; ``dpre_rec (T,B,G*H)`` out, that of ``W_hh h + b_hh`` (``dpre`` itself without split
    gates; a split gate's recurrent part apart); ``dc_seq (T,B,(S-1)*H)`` in, every step's states'
    cotangents besides ``h``, joining the carry when ``has_seq``."""

    bs: Array
    reverse: bool
    dy: Array
    dpre: Array
    dpre_rec: Array
    has_seq: bool
    dc_seq: Array


class BackwardWork(NamedTuple):
    """A backward's row buffers: ``rows`` (LSTM ``(B,H)``: the gradient of ``o * tanh(c)`` under
    projection; reset-after GRU ``(B,3H)``: the step's recurrent-product operand); ``drh (B,H)`` (GRU:
    the gradient of ``r * h``, or a product's before its mask; layer-normalised LSTM: that of ``o *
    tanh(.)`` without projection); ``carry_h (B,H_out)`` / ``carry_c (B,H)``:
    zoneout's carried share of each state's cotangent."""

    rows: Array
    drh: Array
    carry_h: Array
    carry_c: Array


class NormBackward(NamedTuple):
    """Layer normalisation in a backward (off: ``None`` in its place): the gains ``g_hh``,
    ``g_c``; the forward's ``stats (T,B,S,2)`` and ``raw (T,B,G*H)``, every step's raw recurrent
    product(s); out: ``d_raw (T,B,G*H)`` their cotangents (``dpre_rec``), ``acc_hh (B,2,G*H)``, ``acc_c
    (B,2,H)`` per row the sums over steps of ``d * LN(v)`` and ``d`` (the gains' and shifts' gradients,
    ``d`` the cotangent of ``g * LN(v) + shift``)."""

    g_hh: Array
    g_c: Array
    stats: Array
    raw: Array
    d_raw: Array
    acc_hh: Array
    acc_c: Array


Cell = LSTMCell | GRUCell | RNNCell | CustomCell


def plain(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` as a loop takes them: each bundle as a plain tuple, everything else as it is."""
    return tuple(tuple(a) if isinstance(a, tuple) else a for a in args)


def chunk(args: tuple[Any, ...], t0: int, t1: int) -> tuple[Any, ...]:
    """``args`` for steps ``t0 .. t1-1``: every bundle with steps sliced to them."""
    return tuple(a.chunk(t0, t1) if hasattr(a, "chunk") else a for a in args)


# -- stand-ins ------------------------------------------------------------------------------------
@functools.cache
def absent(dtype: Any, ndim: int) -> np.ndarray:
    """A zero-size stand-in for an absent array (shared: it has nothing to write)."""
    return np.empty((0,) * ndim, dtype=dtype)


@functools.cache
def no_variants(dtype: Any) -> Variants:
    """Every variant off."""
    return Variants(False, absent(dtype, 2), False, absent(dtype, 3), False, absent(dtype, 3))

