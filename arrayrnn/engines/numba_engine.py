"""The numba engine: the shared stack driver with compiled per-direction time loops (the default on CPU).

The driver (:mod:`arrayrnn.engines.stack`) runs layers x directions and every GEMM that can be hoisted
out of the time loop (input projections, weight gradients, ``dx``). :class:`NumbaKernel` replaces the
per-direction time loop: the loop itself, the per-step recurrent GEMM (through NumPy's own BLAS, see
:mod:`.numba_blas`) and the fused gate math run in compiled code (:mod:`.numba_kernels`), with every
buffer allocated once per call and ``W_hh.T`` made contiguous once per call.

Threads: a batch is split into contiguous row chunks balanced by work (sum of lengths), one per numba
thread, each running the whole time loop for its rows with single-threaded BLAS; rows of an RNN never
interact, so no step needs a barrier. Small batches run on one thread (see :func:`row_chunks`).
Compiled code is cached on disk (``cache=True``); the first call in a fresh environment compiles the
kernels for the dtype in use.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from ..spec import RNNSpec
from . import numba_kernels as nk
from .base import DirectionCache, DirectionForward, DirectionGrads, DirectionWeights
from .numba_blas import BlasNotFoundError, blas_binding
from .numba_threading import configure_threading_layer, num_threads, single_threaded_blas
from .stack import StackEngine

Array = Any

MIN_ROWS_PER_THREAD = 16  # below this, one row chunk per thread loses more in BLAS efficiency than it gains

configure_threading_layer()


def row_chunks(batch_sizes: np.ndarray, batch: int, threads: int) -> np.ndarray:
    """Boundaries ``[0, b1, ..., batch]`` of contiguous row chunks with about equal work.

    The work of row ``b`` is its length (the steps where it is active). At most ``threads`` chunks and
    at least :data:`MIN_ROWS_PER_THREAD` rows per chunk; one chunk ``[0, batch]`` when that leaves one.
    """
    chunks = min(threads, batch // MIN_ROWS_PER_THREAD)
    if chunks <= 1:
        return np.array([0, batch], dtype=np.int64)
    steps_at_size = np.bincount(batch_sizes, minlength=batch + 1)       # steps with exactly k active rows
    lengths = np.cumsum(steps_at_size[::-1])[::-1][1:]                  # lengths[b] = steps with > b rows
    work = np.concatenate([[0], np.cumsum(lengths)])
    targets = work[-1] * np.arange(1, chunks) / chunks
    inner = np.searchsorted(work, targets, side="left")
    bounds = np.unique(np.concatenate([[0], np.clip(inner, 1, batch - 1), [batch]]))
    return bounds.astype(np.int64)


def _absent(dtype: Any, ndim: int) -> np.ndarray:
    """A zero-size stand-in for an absent array (keeps one compiled signature per dtype)."""
    return np.empty((0,) * ndim, dtype=dtype)


def _c(a: Array) -> np.ndarray:
    return np.ascontiguousarray(a)


class NumbaKernel:
    """:class:`~arrayrnn.engines.base.DirectionKernel` running the time loop in compiled code."""

    # -- dispatch over row chunks ---------------------------------------------------------------
    @staticmethod
    def _run(rows_fn: Any, chunks_fn: Any, batch_sizes: np.ndarray, batch: int, *args: Any) -> None:
        blas = blas_binding()
        bounds = row_chunks(batch_sizes, batch, num_threads())
        if bounds.size > 2:
            with single_threaded_blas(blas) as limited:
                if limited:
                    chunks_fn(blas.ilp64, bounds, *args)
                    return
        rows_fn(blas.ilp64, 0, batch, *args)

    # -- forward --------------------------------------------------------------------------------
    def forward(self, spec: RNNSpec, w: DirectionWeights, xw: Array, batch_sizes: np.ndarray, h0: Array,
                c0: Array | None, reverse: bool, keep_cache: bool) -> DirectionForward:
        xw = _c(xw)  # the driver's fresh projection; overwritten in place by the activations (the cache)
        T, B, _ = xw.shape
        dtype = xw.dtype
        bs = np.ascontiguousarray(batch_sizes, dtype=np.int64)
        y = np.empty((T, B, spec.output_size), dtype=dtype)
        h = np.array(h0, dtype=dtype, order="C", copy=True)
        W_hhT = _c(w.W_hh.T)
        H = spec.hidden_size
        if spec.mode == "lstm":
            c = np.array(c0, dtype=dtype, order="C", copy=True)
            project = w.W_hr is not None
            W_hrT = _c(w.W_hr.T) if project else _absent(dtype, 2)
            c_all = np.empty((T, B, H), dtype) if keep_cache else _absent(dtype, 3)
            tanh_c_all = np.empty((T if keep_cache else 1, B, H), dtype) if project else _absent(dtype, 3)
            lo, hi = spec.cell_clip if spec.cell_clip is not None else (-np.inf, np.inf)
            self._run(nk.lstm_forward_rows, nk.lstm_forward, bs, B, xw, bs, reverse, W_hhT, W_hrT, project,
                      h, c, y, np.empty((B, H), dtype), keep_cache, c_all, tanh_c_all, dtype.type(lo),
                      dtype.type(hi))
            cache = DirectionCache(gates=xw, c=c_all, tanh_c=tanh_c_all if project else None)
            return DirectionForward(y, h, c, cache if keep_cache else None)
        if spec.mode == "gru":
            keep_hn = keep_cache and spec.reset_after
            hn_all = np.empty((T if keep_hn else 1, B, H), dtype)
            b_hn = _c(w.inner_bias) if w.inner_bias is not None else np.zeros(H, dtype)
            self._run(nk.gru_forward_rows, nk.gru_forward, bs, B, xw, bs, reverse, W_hhT, spec.reset_after,
                      b_hn, h, y, np.empty((B, 3 * H), dtype), keep_hn, hn_all)
            cache = DirectionCache(gates=xw, hn=hn_all if keep_hn else None)
            return DirectionForward(y, h, None, cache if keep_cache else None)
        self._run(nk.rnn_forward_rows, nk.rnn_forward, bs, B, xw, bs, reverse, W_hhT, spec.mode == "rnn_relu",
                  h, y)
        return DirectionForward(y, h, None, DirectionCache() if keep_cache else None)

    # -- backward -------------------------------------------------------------------------------
    def backward(self, spec: RNNSpec, w: DirectionWeights, fwd: DirectionForward, h_prev: Array,
                 c_prev: Array | None, dy: Array, dh_n: Array, dc_n: Array | None, batch_sizes: np.ndarray,
                 reverse: bool) -> DirectionGrads:
        dy = _c(dy)
        T, B, _ = dy.shape
        dtype = dy.dtype
        bs = np.ascontiguousarray(batch_sizes, dtype=np.int64)
        dh = np.array(dh_n, dtype=dtype, order="C", copy=True)
        W_hh = _c(w.W_hh)
        H = spec.hidden_size
        cache = fwd.cache
        if spec.mode == "lstm":
            dc = np.array(dc_n, dtype=dtype, order="C", copy=True)
            project = w.W_hr is not None
            d_ih = np.empty((T, B, spec.gate_size), dtype)
            d_h = np.empty((T, B, spec.output_size), dtype) if project else _absent(dtype, 3)
            use_clip = spec.cell_clip is not None
            lo, hi = spec.cell_clip if use_clip else (-np.inf, np.inf)
            self._run(nk.lstm_backward_rows, nk.lstm_backward, bs, B, _c(cache.gates), _c(cache.c),
                      _c(c_prev), _c(cache.tanh_c) if project else _absent(dtype, 3), bs, reverse, W_hh,
                      _c(w.W_hr) if project else _absent(dtype, 2), project, dy, dh, dc, d_ih, d_h,
                      np.empty((B, H), dtype), use_clip, dtype.type(lo), dtype.type(hi))
            return DirectionGrads(d_ih, d_ih, d_h if project else None, dh, dc)
        if spec.mode == "gru":
            d_ih = np.empty((T, B, spec.gate_size), dtype)
            d_hh = np.empty_like(d_ih) if spec.reset_after else _absent(dtype, 3)
            hn_all = _c(cache.hn) if spec.reset_after else _absent(dtype, 3)
            self._run(nk.gru_backward_rows, nk.gru_backward, bs, B, _c(cache.gates), hn_all, _c(h_prev), bs,
                      reverse, W_hh, spec.reset_after, dy, dh, d_ih, d_hh, np.empty((B, H), dtype))
            return DirectionGrads(d_ih, d_hh if spec.reset_after else d_ih, None, dh, None)
        d_pre = np.empty((T, B, H), dtype)
        self._run(nk.rnn_backward_rows, nk.rnn_backward, bs, B, _c(fwd.y), bs, reverse, W_hh,
                  spec.mode == "rnn_relu", dy, dh, d_pre)
        return DirectionGrads(d_pre, d_pre, None, dh, None)


class NumbaEngine(StackEngine):
    """The shared stack driver over :class:`NumbaKernel`; NumPy arrays (CPU) only."""

    def __init__(self) -> None:
        super().__init__("numba", NumbaKernel())

    def unavailable_reason(self, spec: RNNSpec, xp: ModuleType) -> str | None:
        if xp is not np:
            return "the numba engine runs on CPU (NumPy arrays); use engine='cupy' or 'cudnn' on GPU"
        try:
            blas_binding()
        except BlasNotFoundError as err:
            return f"the numba engine calls NumPy's BLAS from compiled code, but {err}"
        return None


ENGINE = NumbaEngine()
