"""The numba engine: the shared stack driver with compiled per-direction time loops (the default on CPU).

The driver (:mod:`arrayrnn.engines.stack`) runs layers x directions and the GEMMs hoisted out of the
time loop (input projections, weight gradients, ``dx``, through NumPy's BLAS; a small input
projection on the packed kernel, :meth:`NumbaEngine.project_input`). :class:`NumbaKernel`
replaces the per-direction time loop: the loop itself, the per-step recurrent products and the fused
gate math run in compiled code (:mod:`.numba_kernels`) on the engine's own packed SIMD GEMM
(:mod:`.packed_gemm`, :mod:`.simd_ir`). Every recurrent weight (``W_hh``, and ``W_hr`` with
projection) is packed once per call, in compiled code: gate-grouped for the forward (one GEMM tile
computes every gate of a group of hidden units; each group's weights are read once per step for all the
rows, then the gate math runs over the step's rows while they are in L2), plain for the backward's
``dgates @ W_hh``. Buffers are allocated once per call.

Threads (:mod:`.loop_threads`, count from :func:`arrayrnn.get_num_threads`): from 16 rows the time loops
split the batch rows between worker threads (no barrier); the plain LSTM and reset-after GRU forwards of
8-15 rows (the LSTM's to 23) split their hidden units instead where a step is large enough (one barrier
per step); below 8 rows everything runs
on the calling thread. From 8 rows a stack also runs side by side what does not depend on each other
(:mod:`.wavefront`): a bidirectional layer's two directions, or a unidirectional stack's layers over chunks
of time (:meth:`NumbaKernel.start_forward` runs a chunk of steps at a time). While a call's loops may
split, NumPy's BLAS is held to one thread and the hoisted GEMMs split their rows over the same workers
(:meth:`NumbaEngine.matmul`).

Compiled code is cached on disk (``cache=True``, keyed on the SIMD variant too); the first call in a
fresh environment compiles the kernels for the dtype in use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.spec import RNNSpec
from . import numba_kernels as nk
from . import wavefront
from .base import (
    Call,
    DirectionCache,
    DirectionForward,
    DirectionGrads,
    DirectionWeights,
    StackForward,
    StackGrads,
)
from .cells import gate_slice
from .loop_threads import (
    available_threads,
    column_parts,
    engine_threads,
    in_parallel_split,
    run_columns,
    run_split,
    split_matmul,
    split_rows,
)
from .numba_blas import BlasNotFoundError, blas_binding
from .packed_gemm import gemm, gemm_steps, new_scratch, pack_b, vector_lanes
from .simd_ir import ROWS_BY_NV
from .stack import StackBackRun, StackCache, StackEngine, StackRun, input_projection

Array = Any


def _absent(dtype: Any, ndim: int) -> np.ndarray:
    """A zero-size stand-in for an absent array (keeps one compiled signature per dtype)."""
    return np.empty((0,) * ndim, dtype=dtype)


def _no_packed(dtype: Any) -> np.ndarray:
    return np.empty((0, 0, vector_lanes(dtype)), dtype=dtype)


def _c(a: Array) -> np.ndarray:
    return np.ascontiguousarray(a)


def _mask_args(w: DirectionWeights, dtype: Any, B: int, with_buffer: bool = True) -> tuple:
    """The kernels' recurrent-dropout arguments: ``(masked, h_mask[, hm buffer])``, zero-size when off."""
    if w.h_mask is None:
        return (False, _absent(dtype, 2)) + ((_absent(dtype, 2),) if with_buffer else ())
    h_mask = _c(w.h_mask).astype(dtype, copy=False)
    return (True, h_mask) + ((np.empty((B, h_mask.shape[1]), dtype),) if with_buffer else ())


def _zone_args(m: Array | None, dtype: Any, B: int, width: int) -> tuple:
    """The kernels' zoneout arguments of one state: ``(on, m (T,B,width), a (B,width) buffer)``,
    zero-size when off."""
    if m is None:
        return False, _absent(dtype, 3), _absent(dtype, 2)
    return True, _c(m), np.empty((B, width), dtype)


def _peephole_args(w: DirectionWeights, dtype: Any) -> tuple:
    """The LSTM kernels' peephole arguments ``(on, P (3,H))``, zero-size when off."""
    return (False, _absent(dtype, 2)) if w.P is None else (True, _c(w.P))


def _plain(w: DirectionWeights) -> bool:
    """No projection and no cell variant: the forwards the column-split loops run."""
    return (w.W_hr is None and w.h_mask is None and w.zoneout_h is None and w.zoneout_c is None
            and w.P is None)


def _state_buffers(h: np.ndarray) -> np.ndarray:
    """A column-split loop's double-buffered state ``(2, B, H)``, ``h`` in the first."""
    h_buf = np.empty((2, *h.shape), h.dtype)
    h_buf[0] = h
    return h_buf


def _gru_parts(spec: RNNSpec, W_hh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The r, z rows and the n rows of a GRU's ``W_hh`` (the reset-before GRU multiplies them apart)."""
    return W_hh[gate_slice(spec, "r", "z")], W_hh[gate_slice(spec, "n")]


@dataclass(frozen=True, eq=False)
class PerStep:
    """A loop argument indexed by time first: a chunk of steps gets its slice."""

    array: np.ndarray


def _per_step_if(on: bool) -> Callable[[np.ndarray], Any]:
    return PerStep if on else (lambda a: a)


def _chunk(args: tuple, t0: int, t1: int) -> tuple:
    return tuple(a.array[t0:t1] if isinstance(a, PerStep) else a for a in args)


class ForwardLoop:
    """One direction's compiled forward loop and its buffers. ``run(t0, t1)`` runs steps ``t0 .. t1-1``
    (the states carry over between chunks; a reverse loop's chunks run from the last one back),
    ``result()`` once every step has run. The rows split between threads per chunk
    (:func:`.loop_threads.run_split`)."""

    def __init__(self, loop: Callable[..., Any], tile: int, dtype: Any, batch_sizes: np.ndarray, rows: int,
                 args: tuple, result: DirectionForward):
        self._loop, self._tile, self._dtype, self._rows = loop, tile, dtype, rows
        self._bs, self._args, self._result = batch_sizes, args, result

    def run(self, t0: int, t1: int) -> None:
        run_split(self._loop, self._bs[t0:t1], self._rows, self._dtype, *_chunk(self._args, t0, t1),
                  tile=self._tile)

    def result(self) -> DirectionForward:
        return self._result


class ColumnsLoop(ForwardLoop):
    """:class:`ForwardLoop` of a column-split loop (:func:`.numba_kernels.lstm_forward_columns`,
    :func:`.numba_kernels.gru_forward_columns`): the state lives in ``h_buf[0]`` between chunks."""

    def __init__(self, loop: Callable[..., Any], parts: int, dtype: Any, h_buf: np.ndarray, args: tuple,
                 result: DirectionForward):
        super().__init__(loop, 1, dtype, args[1].array, h_buf.shape[1], args, result)
        self._parts, self._h_buf = parts, h_buf

    def run(self, t0: int, t1: int) -> None:
        # as many parts as threads are free, up to self._parts (run_columns: no part waits for a thread)
        run_columns(self._loop, self._parts, self._dtype, *_chunk(self._args, t0, t1))
        if (t1 - t0) % 2:  # the chunk's last step wrote h_buf[1]
            self._h_buf[0] = self._h_buf[1]


class NumbaKernel:
    """:class:`~arrayrnn.engines.base.DirectionKernel` running the time loop in compiled code."""

    # -- forward --------------------------------------------------------------------------------
    def forward(self, spec: RNNSpec, w: DirectionWeights, xw: Array, batch_sizes: np.ndarray, h0: Array,
                c0: Array | None, reverse: bool, keep_cache: bool) -> DirectionForward:
        loop = self.start_forward(spec, w, _c(xw), batch_sizes, h0, c0, reverse, keep_cache)
        loop.run(0, xw.shape[0])
        return loop.result()

    def start_forward(self, spec: RNNSpec, w: DirectionWeights, xw: np.ndarray, batch_sizes: np.ndarray,
                      h0: Array, c0: Array | None, reverse: bool, keep_cache: bool) -> ForwardLoop:
        """The forward's buffers and compiled loop, to run a chunk of steps at a time
        (:meth:`ForwardLoop.run`). ``xw``: contiguous ``(T, B, G*H)``, overwritten in place by the
        activations (the cache); a chunk's rows of it need only be written before that chunk runs."""
        T, B, _ = xw.shape
        dtype = xw.dtype
        bs = np.ascontiguousarray(batch_sizes, dtype=np.int64)
        y = np.empty((T, B, spec.output_size), dtype=dtype)
        h = np.array(h0, dtype=dtype, order="C", copy=True)
        H = spec.hidden_size
        if spec.mode == "lstm":
            c = np.array(c0, dtype=dtype, order="C", copy=True)
            project = w.W_hr is not None
            W_hr_p = pack_b(w.W_hr.T) if project else _no_packed(dtype)
            c_all = np.empty((T, B, H), dtype) if keep_cache else _absent(dtype, 3)
            tanh_c_all = np.empty((T if keep_cache else 1, B, H), dtype) if project else _absent(dtype, 3)
            lo, hi = spec.cell_clip if spec.cell_clip is not None else (-np.inf, np.inf)
            zone_c = _zone_args(w.zoneout_c, dtype, B, H)
            c_cand = np.empty((T, B, H), dtype) if zone_c[0] and keep_cache else _absent(dtype, 3)
            W_hh_p = pack_b(w.W_hh.T, gates=4)
            kept = _per_step_if(keep_cache)
            parts = column_parts(B, W_hh_p.shape[0] // 4, B * w.W_hh.size) if _plain(w) else 1
            if parts > 1:
                h_buf = _state_buffers(h)
                cache = DirectionCache(gates=xw, c=c_all)
                return ColumnsLoop(nk.lstm_forward_columns, parts, dtype, h_buf, (
                    PerStep(xw), PerStep(bs), reverse, W_hh_p, h_buf, c, PerStep(y), np.empty((B, H), dtype),
                    keep_cache, kept(c_all), dtype.type(lo), dtype.type(hi)),
                    DirectionForward(y, h_buf[0], c, cache if keep_cache else None))
            zone_h = _zone_args(w.zoneout_h, dtype, B, spec.output_size)
            cache = DirectionCache(gates=xw, c=c_all, tanh_c=tanh_c_all if project else None,
                                   c_cand=c_cand if zone_c[0] else None)
            return ForwardLoop(nk.lstm_forward_loop, ROWS_BY_NV[4], dtype, bs, B, (
                PerStep(xw), PerStep(bs), reverse, W_hh_p, W_hr_p, project, h, c, PerStep(y),
                np.empty((B, H), dtype), keep_cache, kept(c_all), kept(tanh_c_all), dtype.type(lo),
                dtype.type(hi), *_mask_args(w, dtype, B), zone_h[0], _per_step_if(zone_h[0])(zone_h[1]),
                zone_c[0], _per_step_if(zone_c[0])(zone_c[1]), zone_c[2], kept(c_cand),
                *_peephole_args(w, dtype)), DirectionForward(y, h, c, cache if keep_cache else None))
        if spec.mode == "gru":
            keep_hn = keep_cache and spec.reset_after
            hn_all = np.empty((T if keep_hn else 1, B, H), dtype)
            b_hn = _c(w.inner_bias) if w.inner_bias is not None else np.zeros(H, dtype)
            cache = DirectionCache(gates=xw, hn=hn_all if keep_hn else None)
            if spec.reset_after:
                packed = (pack_b(w.W_hh.T, gates=3), _no_packed(dtype), _no_packed(dtype))
                groups = packed[0].shape[0] // 3
                parts = column_parts(B, groups, B * w.W_hh.size, past_rows_split=False) if _plain(w) else 1
                if parts > 1:
                    h_buf = _state_buffers(h)
                    return ColumnsLoop(nk.gru_forward_columns, parts, dtype, h_buf, (
                        PerStep(xw), PerStep(bs), reverse, packed[0], b_hn, h_buf, PerStep(y),
                        np.empty((B, 3 * H), dtype), keep_hn, _per_step_if(keep_hn)(hn_all)),
                        DirectionForward(y, h_buf[0], None, cache if keep_cache else None))
            else:
                W_rz, W_n = _gru_parts(spec, w.W_hh)
                packed = (_no_packed(dtype), pack_b(W_rz.T), pack_b(W_n.T))
            zone_h = _zone_args(w.zoneout_h, dtype, B, H)
            return ForwardLoop(nk.gru_forward_loop, ROWS_BY_NV[3], dtype, bs, B, (
                PerStep(xw), PerStep(bs), reverse, *packed, spec.reset_after, b_hn, h, PerStep(y),
                np.empty((B, 3 * H), dtype), keep_cache, _per_step_if(keep_hn)(hn_all),
                *_mask_args(w, dtype, B), zone_h[0], _per_step_if(zone_h[0])(zone_h[1])),
                DirectionForward(y, h, None, cache if keep_cache else None))
        zone_h = _zone_args(w.zoneout_h, dtype, B, H)
        cache = DirectionCache(gates=xw if zone_h[0] else None)  # with zoneout: each step's own output
        return ForwardLoop(nk.rnn_forward_loop, ROWS_BY_NV[1], dtype, bs, B, (
            PerStep(xw), PerStep(bs), reverse, pack_b(w.W_hh.T), spec.mode == "rnn_relu", h, PerStep(y),
            *_mask_args(w, dtype, B), zone_h[0], _per_step_if(zone_h[0])(zone_h[1])),
            DirectionForward(y, h, None, cache if keep_cache else None))

    # -- backward -------------------------------------------------------------------------------
    def backward(self, spec: RNNSpec, w: DirectionWeights, fwd: DirectionForward, h_prev: Array,
                 c_prev: Array | None, dy: Array, dh_n: Array, dc_n: Array | None, batch_sizes: np.ndarray,
                 reverse: bool, dc_seq: Array | None = None) -> DirectionGrads:
        dy = _c(dy)
        T, B, _ = dy.shape
        dtype = dy.dtype
        bs = np.ascontiguousarray(batch_sizes, dtype=np.int64)
        dh = np.array(dh_n, dtype=dtype, order="C", copy=True)
        H = spec.hidden_size
        cache = fwd.cache
        masks = _mask_args(w, dtype, B, with_buffer=False)
        zone_h = _zone_args(w.zoneout_h, dtype, B, spec.output_size)
        if spec.mode == "lstm":
            dc = np.array(dc_n, dtype=dtype, order="C", copy=True)
            project = w.W_hr is not None
            dpre_in = np.empty((T, B, spec.gate_size), dtype)
            d_h = np.empty((T, B, spec.output_size), dtype) if project else _absent(dtype, 3)
            use_clip = spec.cell_clip is not None
            lo, hi = spec.cell_clip if use_clip else (-np.inf, np.inf)
            W_hr_p = pack_b(w.W_hr) if project else _no_packed(dtype)
            tanh_c = _c(cache.tanh_c) if project else _absent(dtype, 3)
            seq = (True, _c(dc_seq)) if dc_seq is not None else (False, _absent(dtype, 3))
            zone_c = _zone_args(w.zoneout_c, dtype, B, H)
            cell = cache.c_cand if zone_c[0] else cache.c  # the cell h~ and the clip saw
            run_split(nk.lstm_backward_loop, bs, B, dtype, _c(cache.gates), _c(cell), _c(c_prev), tanh_c, bs,
                      reverse, pack_b(w.W_hh), W_hr_p, project, dy, dh, dc, dpre_in, d_h,
                      np.empty((B, H), dtype), use_clip, dtype.type(lo), dtype.type(hi), *masks, *seq,
                      *zone_h[:2], *zone_c[:2], zone_h[2], zone_c[2], *_peephole_args(w, dtype))
            return DirectionGrads(dpre_in, dpre_in, d_h if project else None, dh, dc)
        if spec.mode == "gru":
            dpre_in = np.empty((T, B, spec.gate_size), dtype)
            dn_rec = np.empty((T, B, H), dtype) if spec.reset_after else _absent(dtype, 3)
            rec = np.empty((B, 3 * H), dtype) if spec.reset_after else _absent(dtype, 2)
            hn_all = _c(cache.hn) if spec.reset_after else _absent(dtype, 3)
            if spec.reset_after:
                packed = (pack_b(w.W_hh), _no_packed(dtype), _no_packed(dtype))
            else:
                W_rz, W_n = _gru_parts(spec, w.W_hh)
                packed = (_no_packed(dtype), pack_b(W_rz), pack_b(W_n))
            drh = np.empty((B, H), dtype)
            run_split(nk.gru_backward_loop, bs, B, dtype, _c(cache.gates), hn_all, _c(h_prev), bs, reverse,
                      *packed, spec.reset_after, dy, dh, dpre_in, dn_rec, rec, drh, *masks, *zone_h)
            return DirectionGrads(dpre_in, dpre_in, None, dh, None, dn_rec if spec.reset_after else None)
        d_pre = np.empty((T, B, H), dtype)
        own_output = cache.gates if zone_h[0] else fwd.y  # with zoneout y is not the step's own output
        run_split(nk.rnn_backward_loop, bs, B, dtype, _c(own_output), bs, reverse, pack_b(w.W_hh),
                  spec.mode == "rnn_relu", dy, dh, d_pre, *masks, *zone_h)
        return DirectionGrads(d_pre, d_pre, None, dh, None)


# below this many multiply-adds the hoisted input projection runs on the packed kernel, one thread: a
# BLAS call that small gains nothing from BLAS's threads, and on a busy machine waiting on them cost
# more than the product (S3: 23 ms for a 200x64 @ 64x512 projection, its time loop 3 ms)
PACKED_PROJECTION_MAX = 1 << 24


# variable lengths: when at most this fraction of the (step, row) entries is active, and a step has at least
# ACTIVE_PROJECTION_MIN_ROWS active rows on average, the input projection runs step by step on each step's
# active rows (the packed kernel, W_ih packed once) instead of one product over every row. S5 (lengths
# uniform in 1..T, about half active): forward 0.75-0.81x; at 2 rows a step on average it lost (up to
# 1.23x at B = 2); wide steps of a small input (B = 32, I = 128, H = 512) broke even (bench/RESULTS.md)
ACTIVE_PROJECTION_MAX_FILL = 0.9
ACTIVE_PROJECTION_MIN_ROWS = 4


def _mostly_padding(x: np.ndarray, batch_sizes: np.ndarray) -> bool:
    T, B, _ = x.shape
    active = int(batch_sizes.sum())
    return active <= ACTIVE_PROJECTION_MAX_FILL * T * B and active >= ACTIVE_PROJECTION_MIN_ROWS * T


def _project_active_rows(x: np.ndarray, w: DirectionWeights, batch_sizes: np.ndarray,
                         out: np.ndarray | None) -> np.ndarray:
    """``x @ W_ih.T + input_bias`` on the active rows of each step only (the rest of ``out`` unwritten),
    the packed columns split over the time loops' threads (each thread reads its part of W_ih once a step,
    and every active row)."""
    T, B, _ = x.shape
    xw = np.empty((T, B, w.W_ih.shape[0]), x.dtype) if out is None else out
    bias = w.input_bias if w.input_bias is not None else np.empty(0, x.dtype)
    packed, a = pack_b(w.W_ih.T), np.ascontiguousarray(x)
    bs = np.ascontiguousarray(batch_sizes, dtype=np.int64)
    in_parallel_split(lambda v0, v1: gemm_steps(v0, v1, a, packed, xw, bias, bs, new_scratch(x.dtype)),
                      lambda n: split_rows(packed.shape[0], n, align=1), available_threads())
    return xw


class NumbaEngine(StackEngine):
    """The shared stack driver over :class:`NumbaKernel`; NumPy arrays (CPU) only."""

    def __init__(self) -> None:
        super().__init__("numba", NumbaKernel())

    def forward_sorted(self, params: Any, x: Array, *args: Any, **kwargs: Any) -> StackForward:
        side_by_side = wavefront.plan(params.spec, x.shape[1], available_threads()) is not None
        with engine_threads(x.shape[1], wavefront=side_by_side):
            return super().forward_sorted(params, x, *args, **kwargs)

    def run_layers(self, run: StackRun) -> list[tuple[DirectionForward, ...]]:
        schedule = wavefront.plan(run.params.spec, run.x.shape[1], available_threads())
        if schedule == "directions":
            return wavefront.run_directions(self, run)
        if schedule == "layers":
            return wavefront.run_pipeline(self, run)
        return super().run_layers(run)

    def backward_sorted(self, cache: StackCache, *args: Any, **kwargs: Any) -> StackGrads:
        rows = cache.x.shape[1]
        side_by_side = wavefront.plan(cache.params.spec, rows, available_threads(), backward=True) is not None
        with engine_threads(rows, wavefront=side_by_side):
            return super().backward_sorted(cache, *args, **kwargs)

    def backward_layer(self, back: StackBackRun, layer: int, d_layer: Array, layer_input: Array) -> Array:
        rows = back.cache.x.shape[1]
        if wavefront.plan(back.cache.params.spec, rows, available_threads(), backward=True) == "directions":
            return wavefront.backward_directions(self, back, layer, d_layer, layer_input)
        return super().backward_layer(back, layer, d_layer, layer_input)

    def matmul(self, a: Array, b: Array) -> Array:
        return split_matmul(a, b)

    def project_input(self, x: Array, w: DirectionWeights, out: Array | None = None,
                      batch_sizes: np.ndarray | None = None) -> Array:
        if (batch_sizes is not None and x.dtype in (np.float32, np.float64)
                and _mostly_padding(x, batch_sizes)):
            return _project_active_rows(x, w, batch_sizes, out)
        return self.input_projector(x, w)(x, out)

    def input_projector(self, x: Array, w: DirectionWeights) -> Callable[[Array, Array | None], Array]:
        """``project_input`` for ``x`` or chunks of its steps, the weights prepared once: small products
        (:data:`PACKED_PROJECTION_MAX`) on the packed kernel, one thread; others on BLAS (split_matmul)."""
        T, B, I = x.shape
        N = w.W_ih.shape[0]
        if T * B * I * N > PACKED_PROJECTION_MAX or x.dtype not in (np.float32, np.float64):
            return lambda chunk, out: input_projection(chunk, w, split_matmul, out)
        packed, scratch = pack_b(w.W_ih.T), new_scratch(x.dtype)

        def packed_projection(chunk: np.ndarray, out: np.ndarray | None) -> np.ndarray:
            steps = chunk.shape[0]
            rows = np.ascontiguousarray(chunk.reshape(steps * B, I))
            xw = np.empty((steps * B, N), x.dtype) if out is None else out.reshape(steps * B, N)
            bias = w.input_bias is not None
            if bias:
                xw[...] = w.input_bias
            gemm(rows, packed, 1, xw, bias, scratch)
            return xw.reshape(steps, B, N)

        return packed_projection

    def check(self, call: Call) -> str | None:
        if call.xp is not np:
            return "the numba engine runs on CPU (NumPy arrays); use engine='cupy' or 'cudnn' on GPU"
        if call.spec.layer_norm:
            return ("layer_norm=True: the numba engine's fused layer-norm kernels are pending (issue 38, "
                    "after the engine's restructuring); use engine='reference', which 'auto' takes on CPU")
        try:
            blas_binding()
        except BlasNotFoundError as err:
            return f"the numba engine calls NumPy's BLAS from compiled code, but {err}"
        return None


ENGINE = NumbaEngine()
