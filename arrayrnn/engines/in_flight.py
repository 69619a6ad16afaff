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
from typing import Any

_calls: weakref.WeakSet[engine_call] = weakref.WeakSet()
_no_fork = threading.Event()        # clear while a fork waits for the calls in flight
_no_fork.set()
_fork_lock = threading.Lock()       # one fork at a time
FORK_POLL_S = 1e-3


class engine_call:  # lower case: used like a function, ``with engine_call():``
    """The scope of one engine call: a fork waits until it has ended (module doc). The call in flight is
    kept by thread ident, weakly (a call whose exit an interrupt skipped ends with its frame). A class, not
    a ``@contextmanager`` generator: it wraps every engine call, a cell step's included (0.8 us less each)."""

    __slots__ = ("ident", "__weakref__")

    def __enter__(self) -> None:
        self.ident = threading.get_ident()
        _calls.add(self)
        while not _no_fork.is_set() and not _inside_another_call(self):
            _calls.discard(self)      # stand aside until the child exists
            _no_fork.wait()
            _calls.add(self)

    def __exit__(self, *exc: object) -> None:
        _calls.discard(self)


def _inside_another_call(call: engine_call) -> bool:
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
