"""One cell step on the numba engine's compiled loops, with the weights packed once.

A sequence call packs ``W_hh`` for every call (:mod:`.engine`); over one step that packing costs more than the
step (``H = 256``: ~0.3 ms against ~0.1 ms). :class:`NumbaStep` packs each matrix the first time a step needs
it and keeps it in the :class:`~.step.StepWeights` the caller holds while the weights are unchanged. The step
then calls the cell's compiled loops (:mod:`.lstm_loops`, :mod:`.gru_loops`, :mod:`.rnn_loops`, a custom
cell's :mod:`.custom_loops`) directly, with ``T = 1``, on the calling thread and without the cell variants
(a cell has none), through the same loop calls as a sequence (:mod:`.direction`): the input projection and
every backward product on the packed GEMM (:mod:`.packed_gemm`), so no BLAS thread pool is woken for a product
of a few rows.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from ...core.backend import same_memory
from ...core.spec import RNNSpec
from ..base import DirectionForward, DirectionGrads
from ..step import StepEngine, StepWeights
from . import direction
from .bundles import Cell, no_variants
from .packed_gemm import gemm, new_scratch, pack_b

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
        return same_memory(sw.source, data) and bool(np.array_equal(sw.params.data, data))

    def _cell(self, sw: StepWeights, backward: bool) -> Cell:
        """The cell's packed weights for the forward or the ``backward`` loop, packed on first use."""
        return _packed(sw, "backward" if backward else "forward",
                       lambda: direction.cell_of(sw.spec, sw.w, sw.params.data.dtype, backward))

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

    def matmul(self, a: Array, b: Array) -> np.ndarray:
        return _product(a, pack_b(b), b.shape[1])

    def input_grad(self, sw: StepWeights, dpre: np.ndarray) -> np.ndarray:
        return _product(dpre, _packed(sw, "W_ih", lambda: pack_b(sw.w.W_ih)), sw.w.W_ih.shape[1])


def _product(a: np.ndarray, packed: np.ndarray, n: int) -> np.ndarray:
    """``a @ b`` (``packed = pack_b(b)``, ``n`` columns) on the packed GEMM, on this thread."""
    out = np.empty((a.shape[0], n), a.dtype)
    gemm(_rows(a), packed, 1, out, False, _scratch(a.dtype))
    return out
