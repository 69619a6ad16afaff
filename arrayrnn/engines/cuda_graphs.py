"""The cupy engine's time loops as CUDA graphs: captured once per shape, then one graph launch per call.

A :class:`Program` is one direction's time loop on buffers of its own (a per-shape buffer plan):
``load`` copies the call's inputs into its input buffers, ``issue`` enqueues every step (GEMMs and kernel
launches on the current stream, nothing that allocates or waits for the GPU), and the caller copies the
results out of its output buffers. Because the buffers never move, a stream capture of ``issue`` is a graph
that every later call with the same key replays after its ``load``.

:meth:`GraphCache.run` decides per call: on NumPy arrays (numba's CUDA simulator) or with
``use_graphs = False`` the loop is issued step by step; on CuPy the first :data:`CAPTURE_AFTER` calls of a
key are issued step by step (a warm-up: cuBLAS, CuPy's kernels and ours are loaded before any capture, and a
key seen once, such as the lengths of one batch, never costs a capture); the next one captures ``issue`` on
a private non-blocking stream (CuPy's ``Stream.begin_capture``, relaxed mode) and launches the graph on the
caller's stream, as does every call after. A key is the program's shape, lengths, options, the stream and
the device; graphs and their buffers are kept per thread, the :data:`MAX_GRAPHS` most recently used.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Protocol, TypeVar

import numpy as np

CAPTURE_AFTER = 1   # step-by-step calls of a key before its loop is captured
MAX_GRAPHS = 8      # captured graphs (and their programs' buffers) kept per thread, least recently used out
_MAX_SEEN = 64      # keys remembered per thread while they wait for their capture
use_graphs = True   # read at every call; False issues every loop step by step (no capture)


class Program(Protocol):
    def issue(self) -> None: ...


P = TypeVar("P", bound=Program)


class GraphCaptureError(RuntimeError):
    """Capturing a time loop failed (the message says how to run without graphs)."""


class _ThreadState:
    def __init__(self) -> None:
        self.graphs: OrderedDict[Hashable, tuple[Any, Any]] = OrderedDict()  # key -> (program, graph)
        self.seen: OrderedDict[Hashable, int] = OrderedDict()                # key -> step-by-step runs
        self.capture_streams: dict[int, Any] = {}                            # device -> stream


class GraphCache:
    """Programs and their graphs by key, per thread (see the module docstring)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def _state(self) -> _ThreadState:
        state = getattr(self._local, "state", None)
        if state is None:
            state = self._local.state = _ThreadState()
        return state

    def clear(self) -> None:
        """Drop this thread's graphs and their buffers."""
        self._local.state = _ThreadState()

    def graphs(self) -> list[tuple[Hashable, Any]]:
        """This thread's graphs, least recently used first, each with the key its caller gave."""
        return [(key[0], graph) for key, (_, graph) in self._state().graphs.items()]

    def run(self, xp: Any, key: Hashable, build: Callable[[], P], load: Callable[[P], None]) -> P:
        """The program for ``key`` after its loop ran on ``load``'s inputs (its outputs not yet copied)."""
        if xp is np or not use_graphs:
            return _step_by_step(build(), load)
        state, stream = self._state(), xp.cuda.get_current_stream()
        full_key = (key, stream.ptr, xp.cuda.Device().id)
        entry = state.graphs.get(full_key)
        if entry is None:
            runs = state.seen.get(full_key, 0)
            if runs < CAPTURE_AFTER:
                _remember(state.seen, full_key, runs + 1, _MAX_SEEN)
                return _step_by_step(build(), load)
            state.seen.pop(full_key, None)
            program = build()
            entry = (program, self._capture(xp, state, program))
            _remember(state.graphs, full_key, entry, MAX_GRAPHS)
        state.graphs.move_to_end(full_key)
        program, graph = entry
        load(program)
        graph.launch(stream)
        return program

    @staticmethod
    def _capture(xp: Any, state: _ThreadState, program: Program) -> Any:
        device = xp.cuda.Device().id
        stream = state.capture_streams.get(device)
        if stream is None:
            stream = state.capture_streams[device] = xp.cuda.Stream(non_blocking=True)
        try:
            with stream:
                stream.begin_capture()
                try:
                    program.issue()
                except BaseException:
                    _end_failed_capture(stream)
                    raise
                graph = stream.end_capture()
        except Exception as err:
            raise GraphCaptureError(
                "capturing the cupy engine's time loop into a CUDA graph failed: "
                f"{type(err).__name__}: {err}; set arrayrnn.engines.cuda_graphs.use_graphs = False to run it "
                "step by step") from err
        return graph


def _end_failed_capture(stream: Any) -> None:
    """End a capture the loop failed in. CUDA invalidates a capture after a call it refuses, and then
    ``end_capture`` fails too; its error would hide the loop's own."""
    with contextlib.suppress(Exception):
        stream.end_capture()


def _step_by_step(program: P, load: Callable[[P], None]) -> P:
    load(program)
    program.issue()
    return program


def _remember(cache: OrderedDict, key: Hashable, value: Any, limit: int) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > limit:
        cache.popitem(last=False)
