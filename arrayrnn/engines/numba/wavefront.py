"""The wavefront: a stack's layers or directions side by side on the loop threads (numba engine forward).

A stack has independent work beyond one loop's rows:

- **directions** (from :data:`~arrayrnn.engines.thresholds.WAVEFRONT_MIN_ROWS` rows): the two directions of a
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

Each task runs on one thread (:func:`.loop_threads.one_thread`; its loops' plan gives them one) and NumPy's
BLAS is held to one thread meanwhile. Which calls take which schedule: :func:`.plan.wavefront_schedule`.
The backward of a bidirectional layer runs its directions side by side too (:func:`backward_directions`);
layers go one after the other there.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from .. import thresholds
from ..base import DirectionForward, DirectionWeights
from ..stack import StackBackRun, StackRun
from . import workers
from .loop_threads import in_parallel, one_thread

Array = Any
Projector = Callable[[Array, Array], Array]   # (steps of a layer's input, out) -> out


class ChunkedEngine(Protocol):
    """What the wavefront needs of an engine: a direction's forward and backward, a direction's loop started
    (its weights and the loop, to run a chunk of steps at a time) and the input projection into its
    buffer."""

    def run_direction(self, run: StackRun, layer: int, direction: int,
                      layer_input: Array) -> DirectionForward: ...

    def backward_direction(self, back: StackBackRun, layer: int, direction: int, d_layer: Array,
                           layer_input: Array) -> Array: ...

    def start_direction(self, run: StackRun, layer: int, direction: int) -> tuple[DirectionWeights, Any]: ...

    def projector(self, run: StackRun, layer: int, w: DirectionWeights,
                  chunks: bool = False) -> Projector: ...


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
    """``[t0, t1)`` chunks covering ``[0, steps)``: :data:`~arrayrnn.engines.thresholds.CHUNKS` at most,
    :data:`~arrayrnn.engines.thresholds.MIN_CHUNK_STEPS` long at least (but one)."""
    chunks = max(1, min(thresholds.CHUNKS, steps // thresholds.MIN_CHUNK_STEPS))
    edges = [steps * j // chunks for j in range(chunks + 1)]
    return list(zip(edges[:-1], edges[1:], strict=True))


def run_pipeline(engine: ChunkedEngine, run: StackRun) -> list[tuple[DirectionForward, ...]]:
    """A unidirectional stack's layers pipelined over chunks of time (module doc); each loop runs on its
    task's thread (the plan gives it one)."""
    spec = run.params.spec
    started = [engine.start_direction(run, layer, 0) for layer in range(spec.num_layers)]
    loops = [loop for _, loop in started]
    inputs = [run.x] + [loop.result().y if run.masks is None else np.empty_like(loop.result().y)
                        for loop in loops[:-1]]
    projectors = [engine.projector(run, layer, w, chunks=True) for layer, (w, _) in enumerate(started)]
    bounds = chunk_bounds(run.x.shape[0])

    def chunk(layer: int, j: int) -> None:
        t0, t1 = bounds[j]
        projectors[layer](inputs[layer][t0:t1], loops[layer].xw[t0:t1])
        loops[layer].run(t0, t1)
        if run.masks is not None and layer + 1 < spec.num_layers:
            y = loops[layer].result().y
            inputs[layer + 1][t0:t1] = run.layer_input(layer + 1, y[t0:t1], slice(t0, t1))

    in_dependency_order(chunk, spec.num_layers, len(bounds), run.plan.threads)
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
