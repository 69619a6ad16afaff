"""The wavefront: a stack's layers or directions side by side on the loop threads (numba engine forward).

A stack has independent work beyond one loop's rows:

- **directions** (from :data:`MIN_ROWS` rows): the two directions of a
  bidirectional layer read the same input and nothing of each other; each runs its input projection and
  its time loop on its own thread (:func:`run_directions`), reading its weights once per step for every
  row of the batch (the rows split has each thread read all of them for half the rows);
- **layers** (8-15 rows, where the column split does not run): in a unidirectional stack,
  layer ``l + 1`` at step ``t`` needs only layer ``l``'s outputs up to ``t``. Time is cut into chunks, and
  chunk ``j`` of layer ``l`` runs beside chunk ``j - 1`` of layer ``l + 1`` (:func:`run_pipeline`).
  Semantics roughly equal to this Python loop, where each layer's chunks run in order on thread
  ``layer % threads`` and a chunk first waits for the same chunk of the layer below::

      for layer in range(L):
          for t0, t1 in chunks:
              xw[layer][t0:t1] = input(layer)[t0:t1] @ W_ih[layer].T + bias[layer]
              loop[layer].run(t0, t1)             # the states carry over to the next chunk

Each task runs on one thread (:func:`.loop_threads.one_thread`) and NumPy's BLAS is held to one thread
meanwhile. Which calls take which schedule: :func:`plan`. The backward of a bidirectional layer runs its
directions side by side too (:func:`backward_directions`); layers go one after the other there.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from ...core.spec import RNNSpec
from ..base import DirectionForward, DirectionWeights
from ..stack import StackBackRun, StackRun
from . import loop_threads, workers
from .loop_threads import MIN_ROWS_PER_THREAD, available_threads, in_parallel, one_thread

Array = Any

# the wavefront runs from this many rows (bench/bench_wavefront.py, ratios to layer by layer: directions
# 0.61-0.94x forward from 8 rows, 0.93-1.00x at 64, training steps 0.70-0.92x; at 1-4 rows up to 1.5x
# slower: the partner core's wake-up and the slower clock of two busy cores cost more than the overlap
# saves on small layers)
MIN_ROWS = 8
# the layer pipeline runs where the column split does not (fill and drain, re-reading W_ih per chunk and
# the two cores' slower clock make it lose to the column split, 1.1-1.5x at 8 rows with H = 512, and to
# the rows split from 16 rows); at 8-12 rows without them: 0.68-0.84x of layer by layer
PIPELINE_LAYERS = True
# a unidirectional stack's time is cut into this many chunks at most (fill and drain of a 2-layer pipeline
# cost 1 / CHUNKS of the sequential time), each of at least MIN_CHUNK_STEPS steps (a chunk's waits,
# projection call and loop launch cost ~tens of microseconds, a small step a few)
CHUNKS = 6
MIN_CHUNK_STEPS = 4


class ChunkedEngine(Protocol):
    """What the wavefront needs of an engine: the direction forward, the input projection of chunks of
    steps into a buffer and a kernel whose forward runs a chunk of steps at a time."""

    kernel: Any

    def run_direction(self, run: StackRun, layer: int, direction: int,
                      layer_input: Array) -> DirectionForward: ...

    def backward_direction(self, back: StackBackRun, layer: int, direction: int, d_layer: Array,
                           layer_input: Array) -> Array: ...

    def input_projector(self, x: Array, w: DirectionWeights) -> Callable[[Array, Array], Array]: ...


def plan(spec: RNNSpec, rows: int, threads: int, backward: bool = False) -> str | None:
    """``"directions"``, ``"layers"`` or ``None`` (layer by layer, each loop with the threads its rows
    allow). From :data:`MIN_ROWS` rows: a bidirectional stack's directions side by side; a unidirectional
    one's layers pipelined below the rows split, unless its LSTM or reset-after GRU steps are large
    enough for the column split. The ``backward`` runs directions side by side only below the rows split:
    there both directions' residuals and ``dx`` would be live at once, a training step's peak memory (S4:
    +50 MiB) for a few percent; it never pipelines layers."""
    if threads < 2 or rows < MIN_ROWS:
        return None
    below_rows_split = rows < 2 * MIN_ROWS_PER_THREAD
    if spec.num_directions == 2:
        return "directions" if below_rows_split or not backward else None
    if not (PIPELINE_LAYERS and spec.num_layers > 1 and below_rows_split) or backward:
        return None
    step_fmas = rows * spec.gate_size * spec.output_size
    columns = _has_column_loop(spec) and step_fmas >= loop_threads.COLUMN_SPLIT_MIN_STEP_FMAS
    return None if columns else "layers"


def _has_column_loop(spec: RNNSpec) -> bool:
    """A column-split loop runs this spec's forward: a plain LSTM or a reset-after GRU (no projection,
    peepholes, zoneout or recurrent dropout; DropConnect only scales ``W_hh``)."""
    variants = spec.proj_size or spec.peepholes or spec.zoneout or spec.zoneout_cell or spec.recurrent_dropout
    return not variants and (spec.mode == "lstm" or (spec.mode == "gru" and spec.reset_after))


def run_directions(engine: ChunkedEngine, run: StackRun) -> list[tuple[DirectionForward, ...]]:
    """Each bidirectional layer's two directions at once, one thread each."""
    layers: list[tuple[DirectionForward, ...]] = []
    layer_input = run.x
    for layer in range(run.params.spec.num_layers):
        outs = _both_directions(engine, run, layer, run.layer_input(layer, layer_input))
        layers.append(outs)
        layer_input = np.concatenate([o.y for o in outs], axis=2)
    return layers


def backward_directions(engine: ChunkedEngine, back: StackBackRun, layer: int, d_layer: Array,
                        layer_input: Array) -> Array:
    """A bidirectional layer's backward with its two directions at once, one thread each; their ``dx``
    summed (each direction writes only its own blocks of the gradients and states)."""
    dx: list[Any] = [None, None]

    def direction(d: int, _: int) -> None:
        with one_thread():
            dx[d] = engine.backward_direction(back, layer, d, d_layer, layer_input)

    in_parallel(direction, [(0, 1), (1, 2)])
    dx[0] += dx[1]
    return dx[0]


def _both_directions(engine: ChunkedEngine, run: StackRun, layer: int,
                     layer_input: Array) -> tuple[DirectionForward, ...]:
    outs: list[Any] = [None, None]

    def direction(d: int, _: int) -> None:
        with one_thread():
            outs[d] = engine.run_direction(run, layer, d, layer_input)

    in_parallel(direction, [(0, 1), (1, 2)])
    return tuple(outs)


def chunk_bounds(steps: int) -> list[tuple[int, int]]:
    """``[t0, t1)`` chunks covering ``[0, steps)``: :data:`CHUNKS` at most, :data:`MIN_CHUNK_STEPS` long
    at least (but one)."""
    chunks = max(1, min(CHUNKS, steps // MIN_CHUNK_STEPS))
    edges = [steps * j // chunks for j in range(chunks + 1)]
    return list(zip(edges[:-1], edges[1:], strict=True))


def run_pipeline(engine: ChunkedEngine, run: StackRun) -> list[tuple[DirectionForward, ...]]:
    """A unidirectional stack's layers pipelined over chunks of time (module doc)."""
    spec = run.params.spec
    T, B = run.x.shape[:2]
    weights = [run.weights(layer, 0) for layer in range(spec.num_layers)]
    loops, inputs, xws = [], [run.x], []
    for layer, w in enumerate(weights):
        xws.append(xw := np.empty((T, B, w.W_hh.shape[0]), run.x.dtype))
        with one_thread():  # each loop runs on one thread: chosen for that
            loops.append(engine.kernel.start_forward(spec, w, xw, run.batch_sizes, run.h0[layer],
                                                     run.c0[layer] if run.c0 is not None else None, False,
                                                     run.keep))
        y = loops[-1].result().y
        inputs.append(y if run.masks is None else np.empty_like(y))
    bounds = chunk_bounds(T)
    projectors = [engine.input_projector(inputs[layer], w) for layer, w in enumerate(weights)]

    def chunk(layer: int, j: int) -> None:
        t0, t1 = bounds[j]
        projectors[layer](inputs[layer][t0:t1], xws[layer][t0:t1])
        loops[layer].run(t0, t1)
        if run.masks is not None and layer + 1 < spec.num_layers:
            y = loops[layer].result().y
            inputs[layer + 1][t0:t1] = run.layer_input(layer + 1, y[t0:t1], slice(t0, t1))

    in_dependency_order(chunk, spec.num_layers, len(bounds), available_threads())
    return [(loop.result(),) for loop in loops]


def in_dependency_order(task: Callable[[int, int], None], layers: int, chunks: int, threads: int) -> None:
    """``task(layer, j)`` for every layer and chunk on up to ``threads`` threads (those free, see
    :mod:`.workers`): layer ``l``'s chunks in order on thread ``l % n``, each after ``task(l - 1, j)`` has
    finished. Every thread walks the diagonals ``l + j`` in order, so no thread waits on one that waits on
    it. A task's error, or an interrupt of the calling thread, stops every thread (the waits are
    released); the error is raised here."""
    done = [[threading.Event() for _ in range(chunks)] for _ in range(layers)]
    failed = threading.Event()

    def worker(first: int, n: int) -> None:
        with one_thread():
            for diagonal in range(layers + chunks - 1):
                for layer in range(first, layers, n):
                    j = diagonal - layer
                    if not 0 <= j < chunks:
                        continue
                    if layer > 0:
                        done[layer - 1][j].wait()
                    if failed.is_set():
                        return
                    task(layer, j)
                    done[layer][j].set()

    def stop() -> None:
        failed.set()
        for events in done:
            for event in events:
                event.set()  # release every waiter; they see `failed` and stop

    def plan(n: int) -> list[Callable[[], None]]:
        return [functools.partial(worker, k, n) for k in range(n)]

    workers.in_parallel(plan, min(threads, layers), cancel=stop)
