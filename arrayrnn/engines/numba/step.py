"""One cell step on the numba engine's compiled loops, with the weights packed once.

A sequence call packs ``W_hh`` for every call (:mod:`.engine`); over one step that packing costs
more than the step (``H = 256``: ~0.3 ms against ~0.1 ms). :class:`NumbaStep` packs each matrix the
first time a step needs it and keeps it in the :class:`~.step.StepWeights` the caller holds while the
weights are unchanged. The step then calls the loops of :mod:`.loops` directly, with ``T = 1``,
on the calling thread and without the cell variants (a cell has none): the input projection and every
backward product on the packed GEMM (:mod:`.packed_gemm`), so no BLAS thread pool is woken for a
product of a few rows.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from ...core.spec import RNNSpec
from ..base import DirectionCache, DirectionForward, DirectionGrads
from ..step import StepEngine, StepWeights
from . import loops
from .engine import _absent, _gru_parts, _no_packed
from .packed_gemm import gemm, new_scratch, pack_b

Array = Any
_NO_CLIP = (-np.inf, np.inf)


def _packed(sw: StepWeights, key: str, make: Callable[[], np.ndarray]) -> np.ndarray:
    """``sw.packed[key]``, made by ``make()`` on first use."""
    found = sw.packed.get(key)
    if found is None:
        found = sw.packed[key] = make()
    return found


@functools.cache
def _nothing(dtype: Any, ndim: int) -> np.ndarray:
    """A zero-size stand-in for an argument a plain cell does not use (shared: nothing writes it)."""
    return _absent(dtype, ndim)


@functools.cache
def _batch_sizes(rows: int) -> np.ndarray:
    """The ``batch_sizes`` of one step of ``rows`` rows (shared: the kernels only read it)."""
    return np.array([rows], np.int64)


_per_thread = threading.local()


def _scratch(dtype: Any) -> np.ndarray:
    """This thread's GEMM scratch tile for ``dtype`` (a kernel uses it only while it runs)."""
    tiles = _per_thread.__dict__.setdefault("tiles", {})
    tile = tiles.get(dtype)
    if tile is None:
        tile = tiles[dtype] = new_scratch(dtype)
    return tile


def _rows(a: np.ndarray) -> np.ndarray:
    """``a`` (2-D) with unit inner stride, as the packed GEMM reads it."""
    return a if a.strides[1] == a.itemsize else np.ascontiguousarray(a)


class NumbaStep(StepEngine):
    """:class:`~.step.StepEngine` on the compiled loops, the weights packed once per :class:`StepWeights`.

    The packed matrices are copies: :meth:`holds` compares the weights with the values they were packed
    from (one pass over the buffer, a few times cheaper than packing), so no write is missed, whether
    torch's version counters see it or not (a fused optimizer's step, ``weight.data.copy_``, NumPy).
    """

    def prepare(self, spec: RNNSpec, data: Array, previous: StepWeights | None = None) -> StepWeights:
        sw = super().prepare(spec, data, previous)
        return sw if sw is previous else replace(sw, snapshot=data.copy())

    def holds(self, sw: StepWeights, data: Array) -> bool:
        return super().holds(sw, data) and bool(np.array_equal(sw.snapshot, data))

    # -- the loops' fixed arguments: packed matrices, clip bounds, the absent cell variants ---------------
    def _fixed(self, sw: StepWeights, loop: str) -> tuple[tuple, tuple]:
        """``(head, tail)``: the arguments of the mode's ``loop`` (``"forward"`` / ``"backward"``) that
        depend on the weights only, made on first use (the matrices packed then)."""
        make = self._forward_fixed if loop == "forward" else self._backward_fixed
        return _packed(sw, loop, lambda: make(sw))

    def _forward_fixed(self, sw: StepWeights) -> tuple[tuple, tuple]:
        spec, w, dt = sw.spec, sw.w, sw.params.data.dtype
        a2, a3, nop = _nothing(dt, 2), _nothing(dt, 3), _no_packed(dt)
        if spec.mode == "lstm":
            W_hr_p = pack_b(w.W_hr.T) if w.W_hr is not None else nop
            lo, hi = (dt.type(v) for v in spec.cell_clip or _NO_CLIP)
            return ((pack_b(w.W_hh.T, gates=4), W_hr_p, w.W_hr is not None),
                    (lo, hi, False, a2, a2, False, a3, False, a3, a2, a3, False, a2))
        if spec.mode == "gru":
            H = spec.hidden_size
            b_hn = np.ascontiguousarray(w.inner_bias) if w.inner_bias is not None else np.zeros(H, dt)
            if spec.reset_after:
                weights = (pack_b(w.W_hh.T, gates=3), nop, nop)
            else:
                weights = (nop, *(pack_b(part.T) for part in _gru_parts(spec, w.W_hh)))
            return (*weights, spec.reset_after, b_hn), (False, a2, a2, False, a3)
        return (pack_b(w.W_hh.T), spec.mode == "rnn_relu"), (False, a2, a2, False, a3)

    def _backward_fixed(self, sw: StepWeights) -> tuple[tuple, tuple]:
        spec, w, dt = sw.spec, sw.w, sw.params.data.dtype
        a2, a3, nop = _nothing(dt, 2), _nothing(dt, 3), _no_packed(dt)
        if spec.mode == "lstm":
            W_hr_p = pack_b(w.W_hr) if w.W_hr is not None else nop
            lo, hi = (dt.type(v) for v in spec.cell_clip or _NO_CLIP)
            return ((pack_b(w.W_hh), W_hr_p, w.W_hr is not None),
                    (spec.cell_clip is not None, lo, hi, False, a2, False, a3, False, a3, False, a3, a2, a2,
                     False, a2))
        if spec.mode == "gru":
            if spec.reset_after:
                weights = (pack_b(w.W_hh), nop, nop)
            else:
                weights = (nop, *(pack_b(part) for part in _gru_parts(spec, w.W_hh)))
            return (*weights, spec.reset_after), (False, a2, False, a3, a2)
        return (pack_b(w.W_hh), spec.mode == "rnn_relu"), (False, a2, False, a3, a2)

    # -- forward --------------------------------------------------------------------------------------
    def project(self, sw: StepWeights, x: Array) -> np.ndarray:
        w = sw.w
        xw = np.empty((1, x.shape[0], sw.spec.gate_size), x.dtype)
        if w.input_bias is not None:
            xw[0] = w.input_bias
        W_ih_p = _packed(sw, "W_ih.T", lambda: pack_b(w.W_ih.T))
        gemm(_rows(x), W_ih_p, 1, xw[0], w.input_bias is not None, _scratch(x.dtype))
        return xw

    def run_forward(self, sw: StepWeights, xw: np.ndarray, h: Array, c: Array | None,
                    keep_cache: bool) -> DirectionForward:
        spec, dt = sw.spec, xw.dtype
        B, H = xw.shape[1], spec.hidden_size
        head, tail = self._fixed(sw, "forward")
        bs, y = _batch_sizes(B), np.empty((1, B, spec.output_size), dt)
        h_n = np.array(h, dtype=dt, order="C", copy=True)
        if spec.mode == "lstm":
            c_n = np.array(c, dtype=dt, order="C", copy=True)
            project = sw.w.W_hr is not None
            c_all = np.empty((1, B, H), dt) if keep_cache else _nothing(dt, 3)
            tanh_c_all = np.empty((1, B, H), dt) if project else _nothing(dt, 3)
            loops.lstm_forward_loop(0, B, xw, bs, False, *head, h_n, c_n, y, np.empty((B, H), dt), keep_cache,
                                 c_all, tanh_c_all, *tail, _scratch(dt))
            cache = DirectionCache(gates=xw, c=c_all, tanh_c=tanh_c_all if project else None)
            return DirectionForward(y, h_n, c_n, cache if keep_cache else None)
        if spec.mode == "gru":
            hn_all = np.empty((1, B, H), dt)
            loops.gru_forward_loop(0, B, xw, bs, False, *head, h_n, y, np.empty((B, 3 * H), dt), keep_cache,
                                hn_all, *tail, _scratch(dt))
            cache = DirectionCache(gates=xw, hn=hn_all if spec.reset_after else None)
            return DirectionForward(y, h_n, None, cache if keep_cache else None)
        loops.rnn_forward_loop(0, B, xw, bs, False, *head, h_n, y, *tail, _scratch(dt))
        return DirectionForward(y, h_n, None, DirectionCache() if keep_cache else None)

    # -- backward -------------------------------------------------------------------------------------
    def run_backward(self, sw: StepWeights, fwd: DirectionForward, h: Array, c: Array | None, dh: Array,
                     dc: Array | None) -> DirectionGrads:
        spec, dt, cache = sw.spec, fwd.y.dtype, fwd.cache
        B, H = fwd.y.shape[1], spec.hidden_size
        head, tail = self._fixed(sw, "backward")
        bs, dy = _batch_sizes(B), np.zeros_like(fwd.y)
        dh = np.array(dh, dtype=dt, order="C", copy=True)
        dpre = np.empty((1, B, spec.gate_size), dt)
        if spec.mode == "lstm":
            dc = np.array(dc, dtype=dt, order="C", copy=True)
            project = sw.w.W_hr is not None
            d_h = np.empty((1, B, spec.output_size), dt) if project else _nothing(dt, 3)
            loops.lstm_backward_loop(0, B, cache.gates, cache.c, np.ascontiguousarray(c[None]),
                                  cache.tanh_c if project else _nothing(dt, 3), bs, False, *head, dy, dh, dc,
                                  dpre, d_h, np.empty((B, H), dt), *tail, _scratch(dt))
            return DirectionGrads(dpre, dpre, d_h if project else None, dh, dc)
        if spec.mode == "gru":
            after = spec.reset_after
            dn_rec = np.empty((1, B, H), dt) if after else _nothing(dt, 3)
            rec = np.empty((B, 3 * H), dt) if after else _nothing(dt, 2)
            loops.gru_backward_loop(0, B, cache.gates, cache.hn if after else _nothing(dt, 3),
                                 np.ascontiguousarray(h[None]), bs, False, *head, dy, dh, dpre, dn_rec, rec,
                                 np.empty((B, H), dt), *tail, _scratch(dt))
            return DirectionGrads(dpre, dpre, None, dh, None, dn_rec if after else None)
        loops.rnn_backward_loop(0, B, fwd.y, bs, False, *head, dy, dh, dpre, *tail, _scratch(dt))
        return DirectionGrads(dpre, dpre, None, dh, None)

    def matmul(self, a: Array, b: Array) -> np.ndarray:
        return _product(a, pack_b(b), b.shape[1])

    def input_grad(self, sw: StepWeights, dpre: np.ndarray) -> np.ndarray:
        return _product(dpre, _packed(sw, "W_ih", lambda: pack_b(sw.w.W_ih)), sw.w.W_ih.shape[1])


def _product(a: np.ndarray, packed: np.ndarray, n: int) -> np.ndarray:
    """``a @ b`` (``packed = pack_b(b)``, ``n`` columns) on the packed GEMM, on this thread."""
    out = np.empty((a.shape[0], n), a.dtype)
    gemm(_rows(a), packed, 1, out, False, _scratch(a.dtype))
    return out
