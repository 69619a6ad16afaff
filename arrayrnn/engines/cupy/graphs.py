"""The cupy engine's time loops as CUDA graphs: captured once per shape, then one graph launch per call.

A :class:`Program` is one direction's time loop on buffers of its own (a per-shape buffer plan):
``load`` copies the call's inputs into its input buffers, ``issue`` enqueues every step (GEMMs and kernel
launches on the current stream, nothing that allocates or waits for the GPU), and the caller copies the
results out of its output buffers. Because the buffers never move, a stream capture of ``issue`` is a graph
that every later call with the same key replays after its ``load``.

:meth:`GraphCache.run` keeps one program per key and thread, and reuses it: a call with a known key
allocates no loop buffer, step by step or replayed. On NumPy arrays (numba's CUDA simulator) or with
``use_graphs = False`` the loop is issued step by step; on CuPy the first :data:`CAPTURE_AFTER` calls of a
key are issued step by step (a warm-up: CuPy's kernels and ours are loaded before any capture, and a key
seen once, such as the lengths of one batch, never costs a capture); the next one captures ``issue`` on a
private non-blocking stream (CuPy's ``Stream.begin_capture``, relaxed mode) and launches the graph on the
caller's stream, as does every call after. A key is the program's shape, lengths, options, the stream and
the device. What a thread keeps is bounded by the device memory its programs' buffers hold
(:data:`max_bytes`), least recently used out first; the program in use is always kept.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Protocol, TypeVar

import numpy as np

CAPTURE_AFTER = 1       # step-by-step calls of a key before its loop is captured
max_bytes = 1 << 30     # device memory the kept programs of one thread may hold (read at every new key)
use_graphs = True       # read at every call; False issues every loop step by step (no capture)


class Program(Protocol):
    nbytes: int  # device memory its buffers hold

    def issue(self) -> None: ...


P = TypeVar("P", bound=Program)


class GraphCaptureError(RuntimeError):
    """Capturing a time loop failed (the message says how to run without graphs)."""


class _Entry:
    __slots__ = ("program", "graph", "runs")

    def __init__(self, program: Program) -> None:
        self.program, self.graph, self.runs = program, None, 0


class _ThreadState:
    def __init__(self) -> None:
        self.entries: OrderedDict[Hashable, _Entry] = OrderedDict()  # key -> program (and graph)
        self.held = 0                                                  # bytes the programs hold
        self.capture_streams: dict[int, Any] = {}                      # device -> stream

    def keep(self, key: Hashable, entry: _Entry) -> None:
        """``entry`` kept under ``key``; the least recently used go while more than :data:`max_bytes` is
        held (never the newest)."""
        self.entries[key] = entry
        self.held += entry.program.nbytes
        while self.held > max_bytes and len(self.entries) > 1:
            self.drop(next(iter(self.entries)))

    def drop(self, key: Hashable) -> None:
        entry = self.entries.pop(key, None)
        if entry is not None:
            self.held -= entry.program.nbytes


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
        """Drop this thread's programs, their graphs and their buffers."""
        self._local.state = _ThreadState()

    def graphs(self) -> list[tuple[Hashable, Any]]:
        """This thread's graphs, least recently used first, each with the key its caller gave."""
        entries = self._state().entries.items()
        return [(key[0], entry.graph) for key, entry in entries if entry.graph is not None]

    def programs(self) -> list[tuple[Hashable, Program]]:
        """This thread's programs, least recently used first, each with the key its caller gave."""
        return [(key[0], entry.program) for key, entry in self._state().entries.items()]

    def held(self) -> int:
        """Device memory this thread's programs hold, in bytes."""
        return self._state().held

    def run(self, xp: Any, key: Hashable, build: Callable[[], P], load: Callable[[P], None]) -> P:
        """The program for ``key`` after its loop ran on ``load``'s inputs (its outputs not yet copied)."""
        state, graphs = self._state(), xp is not np and use_graphs
        stream = xp.cuda.get_current_stream() if xp is not np else None
        full_key = (key, stream.ptr, xp.cuda.Device().id) if stream is not None else (key, 0, 0)
        entry = state.entries.get(full_key)
        if entry is None:
            entry = _Entry(build())
            state.keep(full_key, entry)
        state.entries.move_to_end(full_key)
        if graphs and entry.graph is None and entry.runs >= CAPTURE_AFTER:
            try:
                entry.graph = self._capture(xp, state, entry.program)
            except GraphCaptureError:
                state.drop(full_key)  # built anew by the next call
                raise
        entry.runs += 1
        load(entry.program)
        if graphs and entry.graph is not None:
            entry.graph.launch(stream)
        else:
            entry.program.issue()
        return entry.program

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
                f"{type(err).__name__}: {err}; set arrayrnn.engines.cupy.graphs.use_graphs = False to run it "
                "step by step") from err
        return graph


def _end_failed_capture(stream: Any) -> None:
    """End a capture the loop failed in. CUDA invalidates a capture after a call it refuses, and then
    ``end_capture`` fails too; its error would hide the loop's own."""
    with contextlib.suppress(Exception):
        stream.end_capture()
