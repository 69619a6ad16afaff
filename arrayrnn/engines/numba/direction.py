"""One direction's compiled loop, ready to run: its buffers, its named bundles (:mod:`.bundles`) and its
results, for a whole sequence (:class:`.engine.NumbaKernel`) and for one cell step (:class:`.step.NumbaStep`)
alike: both build their loop calls here.

:func:`cell_of` packs a direction's recurrent weights (once per call; a cell step keeps them between
steps) and :func:`variants_of` takes its masks; :func:`forward`, :func:`columns_forward` and :func:`backward`
allocate the buffers of one run and return a :class:`LoopCall` with the results it will fill. With layer
norm (``w.norm``), :func:`norm_forward` and :func:`norm_backward` make the loops'
:class:`.bundles.NormForward` and :class:`.bundles.NormBackward`; the forward keeps the raw products, which
the backward reads instead of computing them again.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ...core.spec import RNNSpec
from ..base import DirectionCache, DirectionForward, DirectionGrads, DirectionWeights, LayerNormWeights
from ..cells import gate_slice
from . import bundles as bd
from . import custom_loops, gru_loops, lstm_loops, rnn_loops
from .bundles import absent
from .packed_gemm import pack_b, vector_lanes
from .simd_ir import MAX_NV, ROWS_BY_NV

Array = Any


@dataclass(frozen=True, eq=False)
class LoopCall:
    """A compiled loop and its arguments between the row range (or a column split's part) and the scratch
    tile; ``tile``: the rows of the loop's GEMM tile (a row range's bounds round to it)."""

    loop: Callable[..., Any]
    args: tuple[Any, ...]
    tile: int = 1

    def chunk(self, t0: int, t1: int) -> LoopCall:
        """This call for steps ``t0 .. t1-1`` (the states carry over between chunks); itself for every
        step."""
        if t0 == 0 and t1 == len(self.args[0].xw):
            return self
        return replace(self, args=bd.chunk(self.args, t0, t1))

    @functools.cached_property
    def _plain(self) -> tuple[Any, ...]:
        return bd.plain(self.args)

    def plain_args(self) -> tuple[Any, ...]:
        """The arguments as the loop takes them (:func:`.bundles.plain`)."""
        return self._plain

    def __call__(self, r0: int, r1: int, scratch: np.ndarray) -> None:
        """Rows ``r0 .. r1`` on this thread."""
        self.loop(r0, r1, *self.plain_args(), scratch)


@functools.cache
def no_packed(dtype: Any) -> np.ndarray:
    """Zero-size packed weights (an absent matrix)."""
    return np.empty((0, 0, vector_lanes(dtype)), dtype=dtype)


def _c(a: Array) -> np.ndarray:
    return np.ascontiguousarray(a)


def _copy(a: Array, dtype: Any) -> np.ndarray:
    """A contiguous copy: a state the loop carries in place."""
    return np.array(a, dtype=dtype, order="C", copy=True)


# -- the cell and its variants ----------------------------------------------------------------------
def cell_of(spec: RNNSpec, w: DirectionWeights, dtype: Any, backward: bool = False) -> bd.Cell:
    """``w``'s recurrent weights packed for the forward loops (``h @ W.T``, gate-grouped) or the
    ``backward`` ones (``d @ W``), with the mode's options."""
    def packed(W: Array, gates: int = 1) -> np.ndarray:
        return pack_b(W) if backward else pack_b(W.T, gates=gates)

    dtype = np.dtype(dtype)
    if spec.custom_cell is not None:  # gate-grouped up to MAX_NV gates (the product's tile), else plain
        grouped = spec.gates if spec.gates <= MAX_NV else 1
        split = len(spec.split_gates) * spec.hidden_size
        inner = _c(w.inner_bias) if w.inner_bias is not None else np.zeros(split, dtype)
        return bd.CustomCell(packed(w.W_hh, gates=grouped), inner)
    if spec.mode == "lstm":
        lo, hi = spec.cell_clip if spec.cell_clip is not None else (-np.inf, np.inf)
        W_hr_p = packed(w.W_hr) if w.W_hr is not None else no_packed(dtype)
        P = _c(w.P) if w.P is not None else absent(dtype, 2)
        if w.P is None and w.norm is not None:  # the layer-normalised loops always read P
            P = np.zeros((3, spec.hidden_size), dtype)
        return bd.LSTMCell(packed(w.W_hh, gates=4), W_hr_p, w.W_hr is not None, spec.cell_clip is not None,
                           dtype.type(lo), dtype.type(hi), w.P is not None, P)
    if spec.mode == "gru":
        b_hn = _c(w.inner_bias) if w.inner_bias is not None else np.zeros(spec.hidden_size, dtype)
        if spec.reset_after:
            return bd.GRUCell(packed(w.W_hh, gates=3), no_packed(dtype), no_packed(dtype), True, b_hn)
        W_rz, W_n = w.W_hh[gate_slice(spec, "r", "z")], w.W_hh[gate_slice(spec, "n")]
        return bd.GRUCell(no_packed(dtype), packed(W_rz), packed(W_n), False, b_hn)
    return bd.RNNCell(packed(w.W_hh), spec.mode == "rnn_relu")


def variants_of(w: DirectionWeights, dtype: Any) -> bd.Variants:
    """``w``'s cell-variant masks (recurrent dropout, zoneout), zero-size where off."""
    on = w.variants
    if not on.names:
        return bd.no_variants(dtype)

    def mask(m: Array | None, ndim: int) -> np.ndarray:
        return absent(dtype, ndim) if m is None else _c(m).astype(dtype, copy=False)

    return bd.Variants(on.recurrent, mask(w.h_mask, 2), on.zoneout_h, mask(w.zoneout_h, 3), on.zoneout_c,
                       mask(w.zoneout_c, 3))


def _rows_if(on: bool, B: int, width: int, dtype: Any) -> np.ndarray:
    """A ``(B, width)`` row buffer where its feature is ``on``, else zero-size."""
    return np.empty((B, width), dtype) if on else absent(dtype, 2)


def _steps_if(on: bool, T: int, B: int, width: int, dtype: Any) -> np.ndarray:
    """A ``(T, B, width)`` stack where it is kept (``on``), else zero-size."""
    return np.empty((T, B, width), dtype) if on else absent(dtype, 3)


# -- layer normalisation ----------------------------------------------------------------------------
def norm_forward(spec: RNNSpec, norm: LayerNormWeights | None, xw: np.ndarray, keep: bool,
                 inputs: bool) -> bd.NormForward | None:
    """A forward's :class:`.bundles.NormForward` (``None`` without ``norm``). ``inputs``: the loop normalises
    the input side (``xw`` then receives the raw ``W_ih x``, into the bundle's ``x_raw``: a kept buffer of
    its own when ``keep``, else ``xw`` itself). Kept (``keep``): the statistics (zeroed: idle rows keep
    zeros), the raw recurrent products and the raw input products, which the backward reads."""
    dtype = xw.dtype
    if norm is None:
        return None
    T, B, G = xw.shape
    steps = T if keep else 1
    vector = absent(dtype, 1)
    g_c, b_c = (_c(a) if a is not None else vector for a in (norm.g_c, norm.b_c))
    x_raw = (np.empty_like(xw) if keep else xw) if inputs else absent(dtype, 3)
    bias = _c(norm.bias) if norm.bias is not None else np.zeros(G, dtype)
    return bd.NormForward(keep, inputs, _c(norm.g_ih), bias, _c(norm.g_hh), g_c, b_c,
                          dtype.type(norm.eps), np.zeros((steps, B, spec.norms_per_step, 2), dtype), x_raw,
                          np.empty((steps, B, G), dtype))


def norm_backward(w: DirectionWeights, cache: DirectionCache, dtype: Any) -> bd.NormBackward | None:
    """A backward's :class:`.bundles.NormBackward` (``None`` without ``w.norm``), on the forward's kept
    statistics and raw recurrent products."""
    if w.norm is None:
        return None
    T, B, G = cache.raw_recurrent.shape
    H = w.norm.g_c.shape[0] if w.norm.g_c is not None else 0
    acc_c = np.zeros((B, 2, H), dtype) if H else absent(dtype, 3)
    g_c = _c(w.norm.g_c) if H else absent(dtype, 1)
    return bd.NormBackward(_c(w.norm.g_hh), g_c, cache.norm_stats, cache.raw_recurrent,
                           np.empty((T, B, G), dtype), np.zeros((B, 2, G), dtype), acc_c)


def norm_grads(norm: bd.NormBackward) -> dict[str, np.ndarray]:
    """``DirectionGrads.norm`` from the per-row sums of a backward whose loop has run."""
    grads = {"g_hh": norm.acc_hh[:, 0].sum(axis=0), "b_hh": norm.acc_hh[:, 1].sum(axis=0)}
    if norm.acc_c.size:
        grads["g_c"], grads["b_c"] = norm.acc_c[:, 0].sum(axis=0), norm.acc_c[:, 1].sum(axis=0)
    return grads


# -- forward ----------------------------------------------------------------------------------------
def forward(spec: RNNSpec, cell: bd.Cell, variants: bd.Variants, xw: np.ndarray, batch_sizes: np.ndarray,
            h0: Array, c0: Array | None, reverse: bool, keep: bool, norm: LayerNormWeights | None = None,
            norm_inputs: bool = False) -> tuple[LoopCall, DirectionForward]:
    """The forward loop over ``xw (T, B, G*H)`` (contiguous; overwritten by the activations, the cache),
    ``batch_sizes`` int64; ``h0``, ``c0`` are copied (the loop carries the state in place). With layer
    ``norm``, ``xw`` arrives normalised (:func:`.layer_norm.normalize_input`), or raw when
    ``norm_inputs`` (the loop normalises it; fill the bundle's ``x_raw``, :func:`input_buffer`)."""
    T, B, _ = xw.shape
    dtype, H = xw.dtype, spec.hidden_size
    steps = bd.Steps(xw, batch_sizes, np.empty((T, B, spec.output_size), dtype), reverse)
    h = _copy(h0, dtype)
    masked_h = _rows_if(variants.masked, B, spec.output_size, dtype)
    if spec.custom_cell is not None:
        return _custom_forward(spec, cell, variants, steps, h, c0, masked_h, keep)
    ln = norm_forward(spec, norm, xw, keep, norm_inputs)
    kept = _kept_norm(ln)
    if spec.mode == "lstm":
        return _lstm_forward(spec, cell, variants, steps, h, _copy(c0, dtype), masked_h, keep, ln)
    if spec.mode == "gru":
        hn = np.empty((T if keep else 1, B, H), dtype) if cell.reset_after else absent(dtype, 3)
        work = bd.ForwardWork(np.empty((B, 3 * H), dtype), masked_h, absent(dtype, 2))
        args = (steps, bd.State(h, absent(dtype, 2)), cell, bd.GRUCache(keep, hn), variants, work, ln)
        cache = DirectionCache(gates=xw, hn=hn if keep and cell.reset_after else None, **kept)
        return (LoopCall(gru_loops.gru_forward_loop, args, ROWS_BY_NV[3]),
                DirectionForward(steps.y, h, None, cache if keep else None))
    work = bd.ForwardWork(absent(dtype, 2), masked_h, absent(dtype, 2))
    args = (steps, bd.State(h, absent(dtype, 2)), cell, variants, work, ln)
    # with zoneout, xw keeps each step's own output
    cache = DirectionCache(gates=xw if variants.zone_h else None, **kept)
    return (LoopCall(rnn_loops.rnn_forward_loop, args, ROWS_BY_NV[1]),
            DirectionForward(steps.y, h, None, cache if keep else None))


def _custom_forward(spec: RNNSpec, cell: bd.CustomCell, variants: bd.Variants, steps: bd.Steps, h: np.ndarray,
                    c0: Array | None, masked_h: np.ndarray, keep: bool) -> tuple[LoopCall, DirectionForward]:
    """A custom cell's forward (:mod:`.custom_loops`): its states besides ``h`` in ``c``, its residuals in
    the cache's ``residuals`` (one step of scratch unless ``keep``), the product apart with split gates."""
    T, B, _ = steps.xw.shape
    dtype, H = steps.xw.dtype, spec.hidden_size
    loops = custom_loops.compiled(spec.custom_cell)
    c = _copy(c0, dtype) if spec.has_cell else absent(dtype, 2)
    kept = bd.CustomCache(keep, _steps_if(keep and spec.has_cell, T, B, spec.cell_width, dtype),
                          np.empty((T if keep else 1, B, loops.cell.num_residuals * H), dtype))
    work = bd.ForwardWork(_rows_if(bool(spec.split_gates), B, spec.gate_size, dtype), masked_h,
                          absent(dtype, 2))
    call = LoopCall(loops.forward_loop, (steps, bd.State(h, c), cell, kept, variants, work),
                    ROWS_BY_NV[spec.gates] if loops.grouped else 1)
    loops.prepare(call.loop, call.plain_args(), dtype)
    cache = DirectionCache(residuals=kept.res_all, c=kept.c_all if spec.has_cell else None)
    return call, DirectionForward(steps.y, h, c if spec.has_cell else None, cache if keep else None)


def input_buffer(call: LoopCall) -> np.ndarray:
    """The buffer a forward loop's input projection fills: ``xw``, or the raw products the loop
    normalises."""
    norm = call.args[-1]
    return norm.x_raw if isinstance(norm, bd.NormForward) and norm.inputs else call.args[0].xw


def _kept_norm(ln: bd.NormForward | None) -> dict[str, np.ndarray]:
    """The cache's layer-norm residuals (none without layer norm or when not kept)."""
    if ln is None or not ln.kept:
        return {}
    return {"norm_stats": ln.stats, "raw_recurrent": ln.raw, "raw_input": ln.x_raw if ln.inputs else None}


def _lstm_forward(spec: RNNSpec, cell: bd.LSTMCell, variants: bd.Variants, steps: bd.Steps, h: np.ndarray,
                  c: np.ndarray, masked_h: np.ndarray, keep: bool,
                  ln: bd.NormForward | None) -> tuple[LoopCall, DirectionForward]:
    T, B, _ = steps.xw.shape
    dtype, H = steps.xw.dtype, spec.hidden_size
    with_tanh_c = cell.project or ln is not None  # kept for the backward (else one step of scratch)
    tanh_c = np.empty((T if keep else 1, B, H), dtype) if with_tanh_c else absent(dtype, 3)
    kept = bd.LSTMCache(keep, _steps_if(keep, T, B, H, dtype), tanh_c,
                        _steps_if(keep and variants.zone_c, T, B, H, dtype))
    work = bd.ForwardWork(np.empty((B, H), dtype), masked_h, _rows_if(variants.zone_c, B, H, dtype))
    args = (steps, bd.State(h, c), cell, kept, variants, work, ln)
    cache = DirectionCache(gates=steps.xw, c=kept.c_all, tanh_c=tanh_c if with_tanh_c else None,
                           c_cand=kept.c_cand_all if variants.zone_c else None, **_kept_norm(ln))
    return (LoopCall(lstm_loops.lstm_forward_loop, args, ROWS_BY_NV[4]),
            DirectionForward(steps.y, h, c, cache if keep else None))


def columns_forward(spec: RNNSpec, cell: bd.LSTMCell | bd.GRUCell, xw: np.ndarray, batch_sizes: np.ndarray,
                    h0: Array, c0: Array | None, reverse: bool, keep: bool,
                    norm: LayerNormWeights | None = None) -> tuple[LoopCall, DirectionForward]:
    """The column-split forward (:func:`.lstm_loops.lstm_forward_columns`,
    :func:`.gru_loops.gru_forward_columns`, with layer ``norm`` :func:`.lstm_loops.lstm_norm_forward_columns`,
    which normalises the input side; no projection, peepholes, recurrent dropout or zoneout). The state is
    double-buffered, ``(2, B, H)``: the result's ``h_n`` is its first half, where :class:`.engine.ColumnsLoop`
    leaves it after a chunk."""
    T, B, _ = xw.shape
    dtype, H = xw.dtype, spec.hidden_size
    steps = bd.Steps(xw, batch_sizes, np.empty((T, B, H), dtype), reverse)
    h_buf = np.empty((2, B, H), dtype)
    h_buf[0] = h0
    if norm is not None:
        return _lstm_norm_columns(spec, cell, steps, h_buf, _copy(c0, dtype), keep, norm)
    if spec.mode == "lstm":
        c = _copy(c0, dtype)
        kept = bd.LSTMCache(keep, _steps_if(keep, T, B, H, dtype), absent(dtype, 3), absent(dtype, 3))
        work = bd.ForwardWork(np.empty((B, H), dtype), absent(dtype, 2), absent(dtype, 2))
        args = (steps, bd.ColumnState(h_buf, c), cell, kept, work)
        cache = DirectionCache(gates=xw, c=kept.c_all)
        return LoopCall(lstm_loops.lstm_forward_columns, args), DirectionForward(steps.y, h_buf[0], c,
                                                                             cache if keep else None)
    hn = np.empty((T if keep else 1, B, H), dtype)
    args = (steps, bd.ColumnState(h_buf, absent(dtype, 2)), cell, bd.GRUCache(keep, hn),
            bd.ForwardWork(np.empty((B, 3 * H), dtype), absent(dtype, 2), absent(dtype, 2)))
    cache = DirectionCache(gates=xw, hn=hn if keep else None)
    return LoopCall(gru_loops.gru_forward_columns, args), DirectionForward(steps.y, h_buf[0], None,
                                                                        cache if keep else None)


def _lstm_norm_columns(spec: RNNSpec, cell: bd.LSTMCell, steps: bd.Steps, h_buf: np.ndarray, c: np.ndarray,
                       keep: bool, norm: LayerNormWeights) -> tuple[LoopCall, DirectionForward]:
    T, B, _ = steps.xw.shape
    dtype, H = steps.xw.dtype, spec.hidden_size
    ln = norm_forward(spec, norm, steps.xw, keep, inputs=True)
    kept = bd.LSTMCache(keep, _steps_if(keep, T, B, H, dtype), np.empty((T if keep else 1, B, H), dtype),
                        absent(dtype, 3))
    work = bd.ForwardWork(absent(dtype, 2), absent(dtype, 2), absent(dtype, 2))
    args = (steps, bd.ColumnState(h_buf, c), cell, kept, work, ln)
    cache = DirectionCache(gates=steps.xw, c=kept.c_all, tanh_c=kept.tanh_c_all, **_kept_norm(ln))
    return (LoopCall(lstm_loops.lstm_norm_forward_columns, args),
            DirectionForward(steps.y, h_buf[0], c, cache if keep else None))


# -- backward ---------------------------------------------------------------------------------------
def backward(spec: RNNSpec, cell: bd.Cell, variants: bd.Variants, fwd: DirectionForward, h_prev: Array,
             c_prev: Array | None, dy: Array, dh_n: Array, dc_n: Array | None, batch_sizes: np.ndarray,
             reverse: bool, dc_seq: Array | None = None,
             norm: bd.NormBackward | None = None) -> tuple[LoopCall, DirectionGrads]:
    """The backward loop of the forward ``fwd`` (with its cache); ``h_prev``, ``c_prev``: the states
    entering each step; ``dh_n``, ``dc_n`` are copied (the loop carries the cotangents in place); ``norm``
    from :func:`norm_backward` with layer norm."""
    dy = _c(dy)
    if spec.custom_cell is not None:
        return _custom_backward(spec, cell, variants, fwd, dy, dh_n, dc_n, batch_sizes, reverse, dc_seq)
    T, B, _ = dy.shape
    dtype, H, G = dy.dtype, spec.hidden_size, spec.gates
    d_h = _steps_if(spec.proj_size > 0, T, B, spec.output_size, dtype)
    dn_rec = _steps_if(spec.mode == "gru" and spec.reset_after and norm is None, T, B, H, dtype)
    seq = (True, _c(dc_seq)) if dc_seq is not None else (False, absent(dtype, 3))
    grads = bd.BackSteps(batch_sizes, reverse, dy, np.empty((T, B, G * H), dtype), d_h, dn_rec, *seq)
    dh = _copy(dh_n, dtype)
    carry_h = _rows_if(variants.zone_h, B, spec.output_size, dtype)
    if spec.mode == "lstm":
        return _lstm_backward(cell, variants, fwd.cache, c_prev, grads, dh, _copy(dc_n, dtype), carry_h, norm)
    dpre_rec = norm.d_raw if norm is not None else grads.dpre  # with layer norm: the raw product's cotangent
    if spec.mode == "gru":
        after = spec.reset_after
        residuals = bd.GRUResiduals(_c(fwd.cache.gates), _c(fwd.cache.hn) if after else absent(dtype, 3),
                                    _c(h_prev))
        work = bd.BackwardWork(_rows_if(after, B, 3 * H, dtype), np.empty((B, H), dtype), carry_h,
                               absent(dtype, 2))
        args = (residuals, grads, bd.Cotangents(dh, absent(dtype, 2)), cell, variants, work, norm)
        dn = dn_rec if after and norm is None else None
        return (LoopCall(gru_loops.gru_backward_loop, args),
                DirectionGrads(grads.dpre, dpre_rec, None, dh, None, dn))
    own_output = fwd.cache.gates if variants.zone_h else fwd.y  # with zoneout y is not the step's own output
    work = bd.BackwardWork(absent(dtype, 2), absent(dtype, 2), carry_h, absent(dtype, 2))
    args = (_c(own_output), grads, bd.Cotangents(dh, absent(dtype, 2)), cell, variants, work, norm)
    return LoopCall(rnn_loops.rnn_backward_loop, args), DirectionGrads(grads.dpre, dpre_rec, None, dh, None)


def _custom_backward(spec: RNNSpec, cell: bd.CustomCell, variants: bd.Variants, fwd: DirectionForward,
                     dy: np.ndarray, dh_n: Array, dc_n: Array | None, batch_sizes: np.ndarray, reverse: bool,
                     dc_seq: Array | None) -> tuple[LoopCall, DirectionGrads]:
    """A custom cell's backward (:mod:`.custom_loops`) on its forward's residuals; ``dpre_rec`` apart only
    with split gates."""
    T, B, _ = dy.shape
    dtype = dy.dtype
    loops = custom_loops.compiled(spec.custom_cell)
    dpre = np.empty((T, B, spec.gate_size), dtype)
    dpre_rec = np.empty_like(dpre) if spec.split_gates else dpre
    seq = (True, _c(dc_seq)) if dc_seq is not None else (False, absent(dtype, 3))
    grads = bd.CustomBackSteps(batch_sizes, reverse, dy, dpre, dpre_rec, *seq)
    dh = _copy(dh_n, dtype)
    dc = _copy(dc_n, dtype) if spec.has_cell else absent(dtype, 2)
    work = bd.BackwardWork(absent(dtype, 2), _rows_if(variants.masked, B, spec.output_size, dtype),
                           absent(dtype, 2), absent(dtype, 2))
    args = (bd.CustomResiduals(_c(fwd.cache.residuals)), grads, bd.Cotangents(dh, dc), cell, variants, work)
    call = LoopCall(loops.backward_loop, args)
    loops.prepare(call.loop, call.plain_args(), dtype)
    return call, DirectionGrads(dpre, dpre_rec, None, dh, dc if spec.has_cell else None)


def _lstm_backward(cell: bd.LSTMCell, variants: bd.Variants, cache: DirectionCache, c_prev: Array,
                   grads: bd.BackSteps, dh: np.ndarray, dc: np.ndarray, carry_h: np.ndarray,
                   norm: bd.NormBackward | None) -> tuple[LoopCall, DirectionGrads]:
    B, H = dc.shape
    dtype = dc.dtype
    cell_seen = cache.c_cand if variants.zone_c else cache.c  # the cell h~ and the clip saw
    residuals = bd.LSTMResiduals(_c(cache.gates), _c(cell_seen), _c(c_prev),
                                 _c(cache.tanh_c) if cell.project or norm is not None else absent(dtype, 3))
    work = bd.BackwardWork(np.empty((B, H), dtype), _rows_if(norm is not None, B, H, dtype), carry_h,
                           _rows_if(variants.zone_c, B, H, dtype))
    args = (residuals, grads, bd.Cotangents(dh, dc), cell, variants, work, norm)
    return (LoopCall(lstm_loops.lstm_backward_loop, args),
            DirectionGrads(grads.dpre, norm.d_raw if norm is not None else grads.dpre,
                           grads.d_h if cell.project else None, dh, dc))

