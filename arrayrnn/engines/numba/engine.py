"""The numba engine: the shared stack driver with compiled per-direction time loops (the default on CPU).

The driver (:mod:`arrayrnn.engines.stack`) runs layers x directions and the GEMMs hoisted out of the
time loop (input projections, weight gradients, ``dx``, through NumPy's BLAS; a small input
projection on the packed kernel, :meth:`NumbaEngine.projector`). :class:`NumbaKernel`
replaces the per-direction time loop: the loop itself, the per-step recurrent products and the fused
gate math run in compiled code (:mod:`.lstm_loops`, :mod:`.gru_loops`, :mod:`.rnn_loops`, built from
:mod:`.loop_parts`; their arguments built by :mod:`.direction`) on the engine's
own packed SIMD GEMM (:mod:`.packed_gemm`, :mod:`.simd_ir`). Every recurrent weight (``W_hh``, and
``W_hr`` with projection) is packed in compiled code, once per frozen copy of the weights (:mod:`..derived`:
the frontend runs this engine on one while the weights keep their bits; otherwise once per call):
gate-grouped for the forward (one GEMM tile computes every gate of a group of hidden units; each group's
weights are read once per step for all the rows, then the gate math runs over the step's rows while they
are in L2), plain for the backward's ``dgates @ W_hh``. Buffers are allocated once per call.

Each call is planned once (:mod:`.plan`: threads, schedule, each loop's split, the projection's path),
and the plan travels on the driver's run objects. Threads (:mod:`.loop_threads`, count from
:func:`arrayrnn.get_num_threads`): from 16 rows the time loops split the batch rows between worker
threads (no barrier); the plain LSTM and reset-after GRU forwards of 8-15 rows (the LSTM's to 23) split
their hidden units instead where a step is large enough (one barrier per step); below 8 rows everything
runs on the calling thread. From 8 rows a stack also runs side by side what does not depend on each
other (:mod:`.wavefront`): a bidirectional layer's two directions, or a unidirectional stack's layers
over chunks of time (:meth:`NumbaEngine.start_direction` runs a chunk of steps at a time). While a call's
loops may split, NumPy's BLAS is held to one thread and the hoisted GEMMs split their rows over the same
workers (:meth:`NumbaEngine.matmul`).

Layer norm (``layer_norm=True``): the loops normalise the input side, the recurrent product and the LSTM's
cell per step and row (:mod:`.loop_parts`), the input projection writes the raw product for them; the LSTM's
column split takes whole rows' statistics in each part (three barriers a step), the GRU's does not run; the
backward reads the raw products the forward kept and runs the input side's norm in one compiled pass
(:mod:`.input_norm`).

Compiled code is cached on disk (``cache=True``, keyed on the SIMD variant too). A call of ``"auto"``
never waits for the compile: until the call's loops are loaded, :meth:`NumbaEngine.check` declines it
(the reference engine runs it) while a child process compiles them (:mod:`.warmup`).

Custom cells (:class:`arrayrnn.Cell`) run on their own copy of the loops (:mod:`.custom_loops`), compiled in
this process (a child cannot know a cell registered here, and a generated loop has no disk cache): ``"auto"``
takes this engine for one once its loops for the call's dtype and phase have compiled, by an
``engine="numba"`` call or :func:`arrayrnn.warmup` (``warmup(spec)``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ...core.spec import RNNSpec
from .. import derived, numba_cache
from ..base import (
    Call,
    CellMasks,
    DirectionForward,
    DirectionGrads,
    DirectionWeights,
    StackForward,
    StackGrads,
)
from ..determinism import is_deterministic
from ..layer_norm import put_grads
from ..stack import StackBackRun, StackCache, StackEngine, StackRun
from . import custom_loops, direction, input_norm, warmup, wavefront
from .bundles import Cell
from .direction import LoopCall, cell_of, variants_of
from .loop_threads import (
    available_threads,
    engine_threads,
    in_parallel_split,
    run_columns,
    run_split,
    split_matmul,
    split_rows,
)
from .packed_gemm import gemm, gemm_steps, new_scratch, pack_b
from .plan import DIRECTIONS, LAYERS, NumbaPlan, backward_plan, forward_plan, loop_plan
from .step import NumbaStep
from .wavefront import Projector

Array = Any


class ForwardLoop:
    """One direction's compiled forward loop and its buffers. ``run(t0, t1)`` runs steps ``t0 .. t1-1``
    (the states carry over between chunks; a reverse loop's chunks run from the last one back),
    ``result()`` once every step has run; ``xw`` is the loop's input buffer (a chunk's steps of it need only
    be written before that chunk runs). The rows split over ``threads`` threads per chunk
    (:func:`.loop_threads.run_split`)."""

    def __init__(self, call: LoopCall, rows: int, threads: int, result: DirectionForward):
        self._call, self._rows, self._threads, self._result = call, rows, threads, result

    @property
    def xw(self) -> np.ndarray:
        """The buffer the input projection fills (:func:`.direction.input_buffer`)."""
        return direction.input_buffer(self._call)

    def run(self, t0: int, t1: int) -> None:
        chunk = self._call.chunk(t0, t1)
        run_split(chunk.loop, chunk.plain_args(), chunk.args[0].bs, self._rows, self._threads, self.xw.dtype,
                  tile=chunk.tile)

    def result(self) -> DirectionForward:
        return self._result


class ColumnsLoop(ForwardLoop):
    """:class:`ForwardLoop` of a column-split loop (:func:`.lstm_loops.lstm_forward_columns`,
    :func:`.gru_loops.gru_forward_columns`) over ``parts`` threads: the state lives in ``h[0]`` of its ``(2,
    B, H)`` buffer between chunks."""

    def run(self, t0: int, t1: int) -> None:
        chunk = self._call.chunk(t0, t1)
        # as many parts as threads are free, up to self._threads (run_columns: no part waits for a thread)
        run_columns(chunk.loop, self._threads, chunk.args[0].xw.dtype, *chunk.plain_args())
        if (t1 - t0) % 2:  # the chunk's last step wrote h[1]
            h_buf = chunk.args[1].h_buf
            h_buf[0] = h_buf[1]


def _cell(spec: RNNSpec, w: DirectionWeights, dtype: Any, backward: bool = False) -> Cell:
    """:func:`.direction.cell_of`, packed once per frozen weight buffer (:mod:`..derived`)."""
    return derived.cached(w.W_hh, ("cell", spec, np.dtype(dtype).str, backward),
                          lambda: cell_of(spec, w, dtype, backward))


def _packed_input_weights(w: DirectionWeights) -> np.ndarray:
    """``W_ih.T`` packed for the input projection, once per frozen weight buffer."""
    return derived.cached(w.W_ih, "W_ih.T", lambda: pack_b(w.W_ih.T))


class NumbaKernel:
    """:class:`~arrayrnn.engines.base.DirectionKernel` running the time loop in compiled code, on the threads
    of ``plan`` (a call's :class:`.plan.NumbaPlan`; ``None``: a direction run alone plans for itself)."""

    def __init__(self, plan: NumbaPlan | None = None):
        self.plan = plan

    def _plan(self, spec: RNNSpec, w: DirectionWeights, rows: int, dtype: Any) -> NumbaPlan:
        if self.plan is not None:
            return self.plan
        return loop_plan(spec, rows, dtype, w.variants.names, available_threads())

    # -- forward --------------------------------------------------------------------------------
    def forward(self, spec: RNNSpec, w: DirectionWeights, xw: Array, batch_sizes: np.ndarray, h0: Array,
                c0: Array | None, reverse: bool, keep_cache: bool) -> DirectionForward:
        loop = self.start_forward(spec, w, np.ascontiguousarray(xw), batch_sizes, h0, c0, reverse, keep_cache)
        loop.run(0, xw.shape[0])
        return loop.result()

    def start_forward(self, spec: RNNSpec, w: DirectionWeights, xw: np.ndarray, batch_sizes: np.ndarray,
                      h0: Array, c0: Array | None, reverse: bool, keep_cache: bool,
                      norm_inputs: bool = False) -> ForwardLoop:
        """The forward's buffers and compiled loop, to run a chunk of steps at a time
        (:meth:`ForwardLoop.run`). ``xw``: contiguous ``(T, B, G*H)``, overwritten in place by the
        activations (the cache); with layer norm it arrives normalised, or, ``norm_inputs``, the loop
        normalises its input side (the projection then fills :attr:`ForwardLoop.xw`)."""
        B, dtype = xw.shape[1], xw.dtype
        plan = self._plan(spec, w, B, dtype)
        bs = np.ascontiguousarray(batch_sizes, dtype=np.int64)
        cell = _cell(spec, w, dtype)
        if plan.column_parts > 1 and (w.norm is None or norm_inputs):
            call, result = direction.columns_forward(spec, cell, xw, bs, h0, c0, reverse, keep_cache, w.norm)
            return ColumnsLoop(call, B, plan.column_parts, result)
        call, result = direction.forward(spec, cell, variants_of(w, dtype), xw, bs, h0, c0, reverse,
                                         keep_cache, w.norm, norm_inputs)
        return ForwardLoop(call, B, plan.row_threads, result)

    # -- backward -------------------------------------------------------------------------------
    def backward(self, spec: RNNSpec, w: DirectionWeights, fwd: DirectionForward, h_prev: Array,
                 c_prev: Array | None, dy: Array, dh_n: Array, dc_n: Array | None, batch_sizes: np.ndarray,
                 reverse: bool, dc_seq: Array | None = None) -> DirectionGrads:
        B, dtype = dy.shape[1], np.dtype(fwd.y.dtype)
        bs = np.ascontiguousarray(batch_sizes, dtype=np.int64)
        cell, variants = _cell(spec, w, dtype, backward=True), variants_of(w, dtype)
        norm = direction.norm_backward(w, fwd.cache, dtype)
        call, grads = direction.backward(spec, cell, variants, fwd, h_prev, c_prev, dy, dh_n, dc_n, bs,
                                         reverse, dc_seq, norm)
        run_split(call.loop, call.plain_args(), bs, B, self._plan(spec, w, B, dtype).row_threads, dtype)
        return replace(grads, norm=direction.norm_grads(norm)) if norm is not None else grads


def project_active_rows(x: np.ndarray, w: DirectionWeights, batch_sizes: np.ndarray, out: np.ndarray | None,
                        threads: int) -> np.ndarray:
    """``x @ W_ih.T + input_bias`` on the active rows of each step only (the rest of ``out`` unwritten),
    the packed columns split over up to ``threads`` threads (each reads its part of W_ih once a step, and
    every active row)."""
    T, B, _ = x.shape
    xw = np.empty((T, B, w.W_ih.shape[0]), x.dtype) if out is None else out
    bias = w.input_bias if w.input_bias is not None else np.empty(0, x.dtype)
    packed, a = _packed_input_weights(w), np.ascontiguousarray(x)
    bs = np.ascontiguousarray(batch_sizes, dtype=np.int64)
    in_parallel_split(lambda v0, v1: gemm_steps(v0, v1, a, packed, xw, bias, bs, new_scratch(x.dtype)),
                      lambda n: split_rows(packed.shape[0], n, align=1), threads)
    return xw


def blas_projection(x: np.ndarray, w: DirectionWeights, out: np.ndarray | None) -> np.ndarray:
    """``x @ W_ih.T + input_bias`` on NumPy's BLAS, the rows and the bias's pass split over the call's
    threads (:func:`split_matmul`)."""
    T, B, I = x.shape
    flat_out = None if out is None else out.reshape(T * B, -1)
    return split_matmul(x.reshape(T * B, I), w.W_ih.T, flat_out, bias=w.input_bias).reshape(T, B, -1)


def packed_projector(w: DirectionWeights, rows: int) -> Projector:
    """``x @ W_ih.T + input_bias`` on the packed kernel, this thread, for chunks of steps of ``rows`` rows,
    ``W_ih`` packed once."""
    N = w.W_ih.shape[0]
    packed, scratch = _packed_input_weights(w), new_scratch(w.W_ih.dtype)

    def project(chunk: np.ndarray, out: np.ndarray) -> np.ndarray:
        steps, I = chunk.shape[0], chunk.shape[2]
        xw = out.reshape(steps * rows, N)
        bias = w.input_bias is not None
        if bias:
            xw[...] = w.input_bias
        gemm(np.ascontiguousarray(chunk.reshape(steps * rows, I)), packed, 1, xw, bias, scratch)
        return out

    return project


def _check_custom(call: Call) -> str | None:
    """:meth:`NumbaEngine.check` for a custom cell: ``"auto"`` takes the engine once the cell's loops for
    the call's dtype (and phase) have compiled in this process (no child process can compile a cell
    registered here; :mod:`.custom_loops`), or where ``"auto"`` waits for numba anyway (deterministic mode,
    the background compile off)."""
    spec = call.spec
    dtype = "float32" if spec.dtype == "float16" else spec.dtype  # float16 computes in float32
    if (call.explicit or is_deterministic() or not numba_cache.background_enabled()
            or custom_loops.loaded(spec.custom_cell, dtype, call.training)):
        return None
    return (f"mode = {spec.mode!r} is a custom cell whose compiled loops ({dtype}, "
            f"{'training' if call.training else 'forward'}) this process has not compiled yet, and "
            "engine='auto' never waits for a compile: engine='numba' or arrayrnn.warmup(spec) compiles them "
            "(seconds), and 'auto' takes the numba engine from then on")


class NumbaEngine(StackEngine):
    """The shared stack driver over :class:`NumbaKernel`; NumPy arrays (CPU) only."""

    keeps_derived_weights = True  # its packed weights (_cell, _packed_input_weights)

    def __init__(self) -> None:
        super().__init__("numba", NumbaKernel())

    def check(self, call: Call) -> str | None:
        if call.xp is not np:
            return "the numba engine runs on CPU (NumPy arrays); use engine='cupy' or 'cudnn' on GPU"
        if call.spec.custom_cell is not None:
            return _check_custom(call)
        if not call.explicit and not is_deterministic() and not warmup.loaded(call):
            if numba_cache.location() is None:
                return ("numba has no writable cache directory (set NUMBA_CACHE_DIR); engine='numba' "
                        "compiles in this process")
            return ("its compiled loops for this call are compiling in the background (engine='numba' "
                    "waits for them; arrayrnn.warmup() compiles them ahead)")
        return None

    def kernel_for(self, plan: NumbaPlan | None) -> NumbaKernel:
        return NumbaKernel(plan)

    def own_step_engine(self) -> NumbaStep:
        return NumbaStep(self)

    def matmul(self, a: Array, b: Array, out: Array | None = None) -> Array:
        return split_matmul(a, b, out)

    # -- forward --------------------------------------------------------------------------------
    def forward_sorted(self, params: Any, x: Array, batch_sizes: np.ndarray, h0: Array, c0: Array | None,
                       masks: tuple[Array, ...] | None, keep_cache: bool, cell_masks: CellMasks | None = None,
                       all_states: bool = False, plan: NumbaPlan | None = None) -> StackForward:
        plan = plan or forward_plan(params.spec, x, batch_sizes, cell_masks)
        with engine_threads(plan.threads):
            return super().forward_sorted(params, x, batch_sizes, h0, c0, masks, keep_cache, cell_masks,
                                          all_states, plan)

    def run_layers(self, run: StackRun) -> list[tuple[DirectionForward, ...]]:
        if run.plan.schedule == DIRECTIONS:
            return wavefront.run_directions(self, run)
        if run.plan.schedule == LAYERS:
            return wavefront.run_pipeline(self, run)
        return super().run_layers(run)

    def run_direction(self, run: StackRun, layer: int, direction: int,
                      layer_input: Array) -> DirectionForward:
        w, loop = self.start_direction(run, layer, direction)
        self.projector(run, layer, w)(layer_input, loop.xw)
        loop.run(0, layer_input.shape[0])
        return loop.result()

    def start_direction(self, run: StackRun, layer: int,
                        direction: int) -> tuple[DirectionWeights, ForwardLoop]:
        """One layer-direction's weights and its forward loop, whose input buffer (``loop.xw``) is still to
        be filled."""
        w = run.weights(layer, direction)
        T, B = run.x.shape[:2]
        xw = np.empty((T, B, w.W_hh.shape[0]), run.x.dtype)
        loop = self.kernel_for(run.plan).start_forward(run.params.spec, w, xw, run.batch_sizes,
                                                      *run.states(layer, direction), direction == 1, run.keep,
                                                      norm_inputs=True)
        return w, loop

    def projector(self, run: StackRun, layer: int, w: DirectionWeights, chunks: bool = False) -> Projector:
        """The input projection of layer ``layer`` into a loop's buffer, the path the plan chose: each
        step's active rows (a whole sequence only), the packed kernel (small products) or BLAS; with layer
        norm, the raw product, which the loop normalises."""
        plan = run.plan
        if plan.active_projection and not chunks:
            return lambda x, out: project_active_rows(x, w, run.batch_sizes, out, plan.direction_threads)
        if plan.packed_projection[layer]:
            return packed_projector(w, run.x.shape[1])
        return lambda x, out: blas_projection(x, w, out)

    # -- backward -------------------------------------------------------------------------------
    def backward_sorted(self, cache: StackCache, dy: Array, dh_n: Array, dc_n: Array | None,
                        dh_all: Array | None = None, dc_all: Array | None = None,
                        plan: NumbaPlan | None = None) -> StackGrads:
        plan = plan or backward_plan(cache.params.spec, cache.x.shape[1], steps=cache.x.shape[0])
        with engine_threads(plan.threads, hold_blas=plan.blas_one_thread):
            return super().backward_sorted(cache, dy, dh_n, dc_n, dh_all, dc_all, plan)

    def norm_input_backward(self, back: StackBackRun, layer: int, direction: int, w: DirectionWeights,
                            g: DirectionGrads, fwd: DirectionForward, layer_input: Array) -> Array:
        """From the raw input products the forward kept (:mod:`.input_norm`), in one compiled pass."""
        if fwd.cache.raw_input is None:  # the loop ran on normalised inputs (a direction run alone)
            return super().norm_input_backward(back, layer, direction, w, g, fwd, layer_input)
        d_product, d_gain = input_norm.backward(w.norm, fwd.cache.raw_input, g.dpre_in,
                                                back.cache.batch_sizes, back.plan.direction_threads)
        put_grads(back.grads, layer, direction, {"g_ih": d_gain, **g.norm})
        return d_product

    def backward_layer(self, back: StackBackRun, layer: int, d_layer: Array, layer_input: Array) -> Array:
        if back.plan.schedule == DIRECTIONS:
            return wavefront.backward_directions(self, back, layer, d_layer, layer_input)
        return super().backward_layer(back, layer, d_layer, layer_input)


ENGINE = NumbaEngine()
