"""One cell step on the numba engine's compiled loops, with the weights packed once.

A sequence call packs ``W_hh`` for every call (:mod:`.engine`); over one step that packing costs more than the
step (``H = 256``: ~0.3 ms against ~0.1 ms). :class:`NumbaStep` packs each matrix the first time a step needs
it and keeps it in the :class:`~.step.StepWeights` the caller holds while the weights are unchanged. The step
then calls the cell's compiled loops (:mod:`.lstm_loops`, :mod:`.gru_loops`, :mod:`.rnn_loops`, a custom
cell's :mod:`.custom_loops`) directly, with ``T = 1``, on the calling thread and without the cell variants
(a cell has none), through the same loop calls as a sequence (:mod:`.direction`): the input projection and
every backward product on the packed GEMM (:mod:`.packed_gemm`), so no BLAS thread pool is woken for a product
of a few rows. An inference step of a plain built-in cell over few rows packs nothing: it multiplies the
caller's weights as they lie, its products and gate math in one compiled call
(:mod:`.source_step`; BLAS's threaded GEMVs for one row of large weights), and needs no comparison
(:meth:`NumbaStep.steps_from_source`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from ...core.backend import same_bits, same_memory
from ...core.layout import layout_of
from ...core.params import PackedParams
from ...core.spec import RNNSpec
from .. import derived, thresholds
from ..base import DirectionForward, DirectionGrads, DirectionWeights
from ..in_flight import engine_call
from ..stack import direction_weights
from ..step import StepEngine, StepWeights
from . import direction, source_step
from .bundles import Cell, no_variants
from .packed_gemm import gemm, new_scratch, outer, pack_b
from .plan import one_step_on_one_thread
from .source_step import SourceStep

Array = Any


def _packed(sw: StepWeights, key: str, make: Callable[[], Any]) -> Any:
    """``sw.packed[key]``, made by ``make()`` on first use."""
    found = sw.packed.get(key)
    if found is None:
        found = sw.packed[key] = make()
    return found


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

    The step reads a private copy of the caller's weights, and every matrix is packed from that copy:
    :meth:`holds` compares the caller's buffer with it (one pass, a few times cheaper than packing), so no
    write is missed, whether torch's version counters see it or not (a fused optimizer's step,
    ``weight.data.copy_``, NumPy), and a matrix packed later (the backward's, at the first backward) holds
    the same values as the forward's even when the buffer changed and changed back in between.
    """

    def weights_of(self, spec: RNNSpec, data: Array) -> StepWeights:
        """Views of a private copy of ``data``: whatever is packed from them later (the backward's matrices
        at the first backward) holds the values :meth:`holds` compares with, whatever the caller writes
        into ``data`` meanwhile."""
        return replace(super().weights_of(spec, data.copy()), source=data)

    def holds(self, sw: StepWeights, data: Array) -> bool:
        return same_memory(sw.source, data) and same_bits(sw.params.data, data)

    def _cell(self, sw: StepWeights, backward: bool) -> Cell:
        """The cell's packed weights for the forward or the ``backward`` loop, packed on first use."""
        return _packed(sw, "backward" if backward else "forward",
                       lambda: direction.cell_of(sw.spec, sw.w, sw.params.data.dtype, backward))

    # -- forward --------------------------------------------------------------------------------------
    def forward(self, sw: StepWeights, x: Array, h: Array, c: Array | None,
                keep_cache: bool) -> DirectionForward:
        if keep_cache:
            return super().forward(sw, x, h, c, keep_cache)
        with engine_call():  # an inference step: on this thread's kept loop, its buffers reused
            kept = self._kept_loop(sw, x.shape[0], x.dtype)
            if isinstance(kept, SourceStep):
                return kept.run(x, h, c)
            self._project_into(sw, x, kept.xw[0])
            return kept.run(h, c)

    def steps_from_source(self, spec: RNNSpec, rows: int) -> bool:
        """A plain built-in cell (:func:`.source_step.serves`) over few enough rows for its weights' size
        (:data:`.thresholds.SOURCE_STEP_ROWS`): its step (:mod:`.source_step`) reads each weight once, where
        the packed products need the buffer compared with the private copy first (both read whole); over
        more rows the packed GEMM's speed pays for the comparison."""
        return _reads_source(spec, rows, thresholds.SOURCE_STEP_ROWS)

    def serves_one_step(self, spec: RNNSpec, rows: int) -> bool:
        """Where the stack driver would run all of the call on one thread
        (:func:`.plan.one_step_on_one_thread`): the steps skip its per-call Python (the batch order, the
        plan, every loop's buffers and bundles)."""
        return one_step_on_one_thread(spec, rows)

    def project(self, sw: StepWeights, x: Array) -> np.ndarray:
        xw = np.empty((1, x.shape[0], sw.spec.gate_size), x.dtype)
        self._project_into(sw, x, xw[0])
        return xw

    def _kept_loop(self, sw: StepWeights, rows: int, dtype: np.dtype) -> _KeptLoop | SourceStep:
        """This thread's kept one-step loop over ``sw`` for ``rows`` rows (one per thread and weights: a
        call with another batch size makes a new one): the step from the caller's buffer, or the packed
        products' loop."""
        key = ("kept loop", threading.get_ident())
        kept = sw.packed.get(key)
        if kept is None or kept.rows != rows or kept.dtype != dtype:
            spec = sw.spec
            # a frozen buffer's packed forms can never go stale: then the packed products (the stack
            # driver's bits, and a custom cell twin's) cost no comparison to skip
            if self.steps_from_source(spec, rows) and not derived.is_frozen(sw.source):
                kept = SourceStep(spec, _source_views(sw), rows, dtype, sw.source.nbytes)
            else:
                kept = _KeptLoop(spec, self._cell(sw, False), rows, dtype)
            sw.packed[key] = kept
        return kept

    @staticmethod
    def _project_into(sw: StepWeights, x: Array, out: np.ndarray) -> None:
        """``out (B, G*H) = x @ W_ih.T + input_bias`` on the packed GEMM."""
        w = sw.w
        if w.input_bias is not None:
            out[...] = w.input_bias
        W_ih_p = _packed(sw, "W_ih.T", lambda: pack_b(w.W_ih.T))
        gemm(_rows(x), W_ih_p, 1, out, w.input_bias is not None, _scratch(x.dtype))

    def run_forward(self, sw: StepWeights, xw: np.ndarray, h: Array, c: Array | None,
                    keep_cache: bool) -> DirectionForward:
        B, dtype = xw.shape[1], xw.dtype
        call, result = direction.forward(sw.spec, self._cell(sw, False), no_variants(dtype), xw,
                                         _batch_sizes(B), h, c, False, keep_cache)
        call(0, B, _scratch(dtype))
        return result

    # -- backward -------------------------------------------------------------------------------------
    def run_backward(self, sw: StepWeights, fwd: DirectionForward, h: Array, c: Array | None, dh: Array,
                     dc: Array | None) -> DirectionGrads:
        B, dtype = fwd.y.shape[1], fwd.y.dtype
        call, grads = direction.backward(sw.spec, self._cell(sw, True), no_variants(dtype), fwd, h[None],
                                         c[None] if c is not None else None, np.zeros_like(fwd.y), dh, dc,
                                         _batch_sizes(B), False)
        call(0, B, _scratch(dtype))
        return grads

    def matmul(self, a: Array, b: Array, out: np.ndarray | None = None) -> np.ndarray:
        if a.shape[1] == 1:  # a weight gradient of one row
            return outer(a, b, out)
        return _product(a, pack_b(b), b.shape[1], out)

    def input_grad(self, sw: StepWeights, dpre: np.ndarray) -> np.ndarray:
        return _product(dpre, _packed(sw, "W_ih", lambda: pack_b(sw.w.W_ih)), sw.w.W_ih.shape[1])


class _KeptLoop:
    """One step's forward loop without a cache (:func:`.direction.forward`), kept with its buffers by the
    thread that runs it: a call copies the states in, runs the loop and copies the new states out (the
    caller owns what it gets), instead of building the loop's buffers and bundles again."""

    def __init__(self, spec: RNNSpec, cell: Cell, rows: int, dtype: np.dtype):
        xw = np.empty((1, rows, spec.gate_size), dtype)
        h0 = np.zeros((rows, spec.output_size), dtype)
        c0 = np.zeros((rows, spec.cell_width), dtype) if spec.has_cell else None
        call, self._result = direction.forward(spec, cell, no_variants(dtype), xw, _batch_sizes(rows), h0, c0,
                                               False, False)
        self.xw, self.rows, self.dtype = xw, rows, dtype
        self._loop, self._args = call.loop, call.plain_args()

    def run(self, h: Array, c: Array | None) -> DirectionForward:
        state = self._result
        state.h_n[...] = h
        if c is not None:
            state.c_n[...] = c
        self._loop(0, self.rows, *self._args, _scratch(self.dtype))
        h_n = state.h_n.copy()
        return DirectionForward(h_n[None], h_n, state.c_n.copy() if c is not None else None, None)


@functools.lru_cache(maxsize=1024)
def _reads_source(spec: RNNSpec, rows: int, table: tuple[tuple[int, int], ...]) -> bool:
    """:meth:`NumbaStep.steps_from_source` for the thresholds ``table`` (an argument: a test may set
    another; the answer is asked at every step)."""
    if not source_step.serves(spec):
        return False
    nbytes = layout_of(spec).size * np.dtype(spec.dtype).itemsize
    return any(rows <= most and nbytes >= least for most, least in table)


def _source_views(sw: StepWeights) -> DirectionWeights:
    """Views of the caller's buffer ``sw.source`` (they read its values as they are at each call; their
    summed biases are made once and go unused)."""
    return _packed(sw, "source views", lambda: direction_weights(
        PackedParams._wrap(sw.spec, sw.source, "canonical"), 0, 0))


def _product(a: np.ndarray, packed: np.ndarray, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """``a @ b`` (``packed = pack_b(b)``, ``n`` columns) on the packed GEMM, on this thread, into ``out`` (C
    order: a gradient block, written without a temporary) if given."""
    if out is None:
        out = np.empty((a.shape[0], n), a.dtype)
    gemm(_rows(a), packed, 1, out, False, _scratch(a.dtype))
    return out
