"""Threads for the numba engine's time loops: the rows or the units of a step split between persistent
worker threads. How many, and which split, a call's plan decides (:mod:`.plan`); this module runs them.

Rows split (:func:`run_split`, every loop). Rows of a direction's batch never interact inside its time loop
(each row's state feeds only its own next step), so every compiled loop (:mod:`.loop_parts`) takes a row range
``[r0, r1)`` and runs the whole sequence for it, with no barrier at all: the threads meet once, when the
call returns. The loops release the GIL (``nogil=True``) and write disjoint rows of the shared buffers;
each thread gets its own scratch tile. Semantics roughly equal to this Python loop, run concurrently::

    for r0, r1 in row_ranges(batch_sizes, threads):
        loop(r0, r1, *args, new_scratch(dtype))

Rows are split by work, not by count: the batch is sorted by length (longest first), so a row's work
is its length, and the first range holds fewer, longer rows. A range boundary is rounded to the
loop's row tile when that keeps the balance (a partial tile runs below the kernel's peak).

Columns split (:func:`run_columns`, the plain LSTM and reset-after GRU forwards the plan gives
``column_parts``): each thread computes every row's gates of its share of the hidden units, so it streams
only its share of ``W_hh``; the threads meet at a spinning barrier (:mod:`.spin_barrier`) once per step,
since the next step reads every unit of the state.

A call asks for its plan's threads and gets the threads that are free (:mod:`.workers`: each part on a
thread that starts it at once, fewer parts while other callers hold the workers); the ranges are cut for
the threads it got.

BLAS: a call whose plan has more than one thread runs inside :func:`engine_threads`, which holds NumPy's
BLAS to one thread and splits the hoisted products' rows over the same workers instead
(:func:`split_matmul`). Left at its own threads, OpenBLAS's workers spin-wait for ~0.1 s after every
product on the core the time loop's second thread needs (measured, S1 LSTM forward: 2 loop threads beside
2 OpenBLAS threads ran no faster than 1; with OpenBLAS at 1 thread they ran 1.3x faster), and a barrier
would wait on that core every step. Other Python threads calling NumPy's BLAS during such a call get
one thread too.
"""
from __future__ import annotations

import contextlib
import functools
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import threadpoolctl

from ..determinism import is_deterministic
from ..thread_count import get_num_threads
from . import workers
from .packed_gemm import new_scratch, outer
from .spin_barrier import cancel_barrier, new_sync

# gemm_threads: the threads split_matmul uses in this thread's current call; one_thread: see one_thread()
_state = threading.local()


def available_threads() -> int:
    """:func:`arrayrnn.get_num_threads`, or 1 inside :func:`one_thread` or with
    :func:`arrayrnn.set_deterministic` on."""
    return 1 if getattr(_state, "one_thread", False) or is_deterministic() else get_num_threads()


@contextmanager
def small_calls_split() -> Iterator[None]:
    """Calls this thread makes inside plan their splits as large ones do, however few their multiply-adds
    (:func:`.plan.available_to`): the compile-ahead probes, tiny calls that must reach every split loop."""
    before = getattr(_state, "small_calls_split", False)
    try:
        _state.small_calls_split = True
        yield
    finally:
        _state.small_calls_split = before


def small_calls_split_here() -> bool:
    """Whether this thread is inside :func:`small_calls_split`."""
    return getattr(_state, "small_calls_split", False)


@contextmanager
def one_thread() -> Iterator[None]:
    """Everything of the engine this thread runs inside stays on this thread (a wavefront task: the
    other threads run other layers or directions)."""
    before = getattr(_state, "one_thread", False), gemm_threads()
    try:
        _state.one_thread, _state.gemm_threads = True, 1
        yield
    finally:
        _state.one_thread, _state.gemm_threads = before


def row_ranges(batch_sizes: np.ndarray, rows: int, threads: int, tile: int = 1) -> list[tuple[int, int]]:
    """``threads`` contiguous ranges of ``[0, rows)`` with about equal work (row ``b`` works on each step
    ``t`` with ``batch_sizes[t] > b``); boundaries on multiples of ``tile`` where that moves them by less
    than half a tile's work. Empty ranges are dropped."""
    work = (np.asarray(batch_sizes)[None, :] > np.arange(rows)[:, None]).sum(axis=1)
    cumulative = np.cumsum(work)
    total = int(cumulative[-1]) if rows else 0
    bounds = [0]
    for k in range(1, threads):
        cut = int(np.searchsorted(cumulative, total * k / threads)) + 1
        rounded = int(round(cut / tile)) * tile
        if tile > 1 and abs(rounded - cut) <= tile // 2:
            cut = rounded
        bounds.append(min(max(cut, bounds[-1]), rows))
    bounds.append(rows)
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


def run_columns(loop: Callable[..., Any], parts: int, dtype: Any, *args: Any) -> None:
    """``loop(part, n, sync, *args, scratch)`` for ``part < n``, all at once, ``n`` the threads free of the
    ``parts`` asked for (the column split: the parts meet at a barrier every step, so each has its own
    thread; the calling thread runs part 0). An interrupt or error cancels the barrier: every part returns."""
    sync = new_sync()

    def plan(n: int) -> list[Callable[[], Any]]:
        return [functools.partial(loop, part, n, sync, *args, new_scratch(dtype)) for part in range(n)]

    workers.in_parallel(plan, parts, cancel=lambda: cancel_barrier(sync))


def run_split(loop: Callable[..., Any], args: tuple[Any, ...], batch_sizes: np.ndarray, rows: int,
              threads: int, dtype: Any, tile: int = 1) -> None:
    """``loop(r0, r1, *args, scratch)`` over the row ranges of :func:`row_ranges` for the threads free of
    ``threads``, one per thread; the calling thread runs the first. Waits for every range before returning
    or raising."""
    if threads <= 1:  # every row on this thread (row_ranges' one range), without the split's planning
        loop(0, rows, *args, new_scratch(dtype))
        return
    in_parallel_split(lambda r0, r1: loop(r0, r1, *args, new_scratch(dtype)),
                      lambda n: row_ranges(batch_sizes, rows, n, tile), threads)


def split_rows(rows: int, parts: int, align: int = 16) -> list[tuple[int, int]]:
    """``parts`` contiguous, about equal ranges of ``[0, rows)``, inner bounds on multiples of ``align``."""
    step = -(-rows // parts)
    step = -(-step // align) * align
    return [(r0, min(rows, r0 + step)) for r0 in range(0, rows, step)] if rows else []


def in_parallel(fn: Callable[[int, int], Any], ranges: list[tuple[int, int]]) -> None:
    """``fn(r0, r1)`` for every range (independent of each other), each on its own thread where one is
    free, the first on the calling thread; with fewer threads free, a thread runs several in turn. Waits
    for every range before returning or raising."""
    def plan(n: int) -> list[Callable[[], None]]:
        return [functools.partial(_in_turn, fn, ranges[k::n]) for k in range(min(n, len(ranges)) or 1)]

    workers.in_parallel(plan, len(ranges))


def in_parallel_split(fn: Callable[[int, int], Any], split: Callable[[int], list[tuple[int, int]]],
                      wanted: int) -> None:
    """``fn(r0, r1)`` over ``split(n)``'s ranges, one per thread, ``n`` the threads free of ``wanted``."""
    workers.in_parallel(lambda n: [functools.partial(fn, r0, r1) for r0, r1 in split(n) or [(0, 0)]], wanted)


def _in_turn(fn: Callable[[int, int], Any], ranges: list[tuple[int, int]]) -> None:
    for r0, r1 in ranges:
        fn(r0, r1)



def gemm_threads() -> int:
    return getattr(_state, "gemm_threads", 1)


def split_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None,
                 bias: np.ndarray | None = None) -> np.ndarray:
    """``a @ b`` (2-D, into ``out`` if given), ``+ bias`` (``(N,)``) if given, with the rows of ``a`` split
    over :func:`gemm_threads` threads, each one BLAS call (NumPy releases the GIL in it) and its rows' bias
    (the bias pass over a large product is memory-bound: split, it runs on both cores' bandwidth); one
    call when a share would be small."""
    threads = gemm_threads()
    M = a.shape[0]
    if threads > 1 and M >= 64 * threads:
        if out is None:
            out = np.empty((M, b.shape[1]), np.result_type(a, b))
        in_parallel_split(functools.partial(_share, a, b, out, bias), lambda n: split_rows(M, n), threads)
        return out
    out = _matmul(a, b, out)
    if bias is not None:
        out += bias
    return out


def _matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    if a.shape[1] == 1:  # an outer product (one (step, row) pair, or an input of width 1)
        return outer(a, b, out)
    return np.matmul(a, b, out=out)


def _share(a: np.ndarray, b: np.ndarray, out: np.ndarray, bias: np.ndarray | None, r0: int, r1: int) -> None:
    """Rows ``r0 .. r1`` of :func:`split_matmul`."""
    _matmul(a[r0:r1], b, out[r0:r1])
    if bias is not None:
        out[r0:r1] += bias


@functools.cache
def _blas_controller(pid: int) -> threadpoolctl.ThreadpoolController:
    return threadpoolctl.ThreadpoolController().select(user_api="blas")


class _Holder:
    """One call holding NumPy's BLAS to one thread (weakly held: one whose cleanup an interrupt skipped
    lets go with its frame)."""


_blas_holders: weakref.WeakSet[_Holder] = weakref.WeakSet()
_blas_saved: list[int] = []               # the counts to restore, while held
_blas_lock = threading.Lock()


@contextmanager
def _blas_single_threaded() -> Iterator[None]:
    """NumPy's BLAS at one thread while any caller is inside, its own counts back when the last leaves."""
    holder = _Holder()
    try:
        _blas_holders.add(holder)
        _settle_blas()
        yield
    finally:
        _blas_holders.discard(holder)
        _settle_blas()


def _settle_blas() -> None:
    """Make BLAS's thread count follow the holders (one thread while any, the saved counts when none).
    A caller that finds another one settling leaves it the work, and that one looks again once done:
    nobody waits here, so no lock left taken by an interrupt can hang a call."""
    libs = _blas_controller(os.getpid()).lib_controllers
    while _blas_lock.acquire(blocking=False):
        try:
            if _blas_holders and not _blas_saved:
                _blas_saved.extend(lib.num_threads for lib in libs)
                for lib in libs:
                    lib.set_num_threads(1)
            elif not _blas_holders and _blas_saved:
                for lib, n in zip(libs, _blas_saved, strict=True):
                    lib.set_num_threads(n)
                _blas_saved.clear()
        finally:
            _blas_lock.release()
        if bool(_blas_holders) == bool(_blas_saved):
            return


@contextmanager
def engine_threads(threads: int, hold_blas: bool = False) -> Iterator[int]:
    """The scope of one engine call that may split over ``threads`` threads (its plan's): yields them; with
    more than one, BLAS is held to one thread and :func:`split_matmul` splits the products (module doc).
    With one, BLAS keeps its own threads unless ``hold_blas`` (a small call's products, where BLAS's
    threads only wait)."""
    with workers.engine_call():
        if threads == 1:
            with _blas_single_threaded() if hold_blas else contextlib.nullcontext():
                yield 1
            return
        before = gemm_threads()
        try:
            with _blas_single_threaded():
                _state.gemm_threads = threads
                yield threads
        finally:
            _state.gemm_threads = before
