"""Engine calls in flight, and ``os.fork``: a fork waits until no other thread is inside an engine call
(new calls wait meanwhile) and no numba load is in flight.

Every engine's call on any array module runs inside :func:`engine_call` (the stack driver's
``forward`` / ``backward``, the cell step's): a child never inherits a half-done call (OpenBLAS's own fork
handler deadlocked when another thread was inside a product, and the reference engine, which runs while
numba's loops are still compiling, is all products) nor a reserved worker that is not there
(:mod:`.numba.workers`). Then numba's compiler lock: a load from numba's cache in flight
(:mod:`.numba.warmup`) ends first. In this order, so a call that compiles ends before the fork takes the
lock it needs.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class _Call:
    """A call in flight, on thread ``ident`` (weakly held: a call whose cleanup an interrupt skipped
    ends with its frame)."""

    def __init__(self) -> None:
        self.ident = threading.get_ident()


_calls: weakref.WeakSet[_Call] = weakref.WeakSet()
_no_fork = threading.Event()        # clear while a fork waits for the calls in flight
_no_fork.set()
_fork_lock = threading.Lock()       # one fork at a time
FORK_POLL_S = 1e-3


@contextmanager
def engine_call() -> Iterator[None]:
    """The scope of one engine call: a fork waits until it has ended (module doc)."""
    call = _Call()
    try:
        _calls.add(call)
        while not _no_fork.is_set() and not _inside_another_call(call):
            _calls.discard(call)      # stand aside until the child exists
            _no_fork.wait()
            _calls.add(call)
        yield
    finally:
        _calls.discard(call)


def _inside_another_call(call: _Call) -> bool:
    return any(other.ident == call.ident and other is not call for other in list(_calls))


def _compiler_lock() -> Any:
    module = sys.modules.get("numba.core.compiler_lock")  # not imported: nothing compiled, nothing to hold
    return None if module is None else module.global_compiler_lock


def _before_fork() -> None:
    _fork_lock.acquire()
    _no_fork.clear()
    me = threading.get_ident()
    while any(call.ident != me for call in list(_calls)):
        time.sleep(FORK_POLL_S)
    lock = _compiler_lock()
    if lock is not None:
        lock.acquire()  # a load in flight ends first: a child never inherits numba mid-load


def _release_compiler_lock() -> None:
    lock = _compiler_lock()
    if lock is not None:
        lock.release()


def _after_fork_in_parent() -> None:
    _release_compiler_lock()
    _no_fork.set()
    _fork_lock.release()


def _after_fork_in_child() -> None:
    global _calls, _no_fork, _fork_lock
    _release_compiler_lock()
    _calls, _no_fork, _fork_lock = weakref.WeakSet(), threading.Event(), threading.Lock()
    _no_fork.set()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)
