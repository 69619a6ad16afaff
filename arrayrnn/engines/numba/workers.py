"""The engine's worker threads: each part of a call gets a thread that starts it at once, or the call has
fewer parts; an interrupt cancels a call's parts; a fork waits for the calls in flight.

**Reservation.** A call that splits its work asks :func:`in_parallel` for ``wanted`` threads. It takes
the idle workers it may (at most ``get_num_threads() - 1`` workers busy at once, process-wide; workers start
on demand up to that count), then asks the call's ``plan(parts)`` for that many parts: part 0 runs on the
calling thread, each other part on a worker reserved for it alone, which starts it at once. A part never
waits in a queue behind another call's parts, so parts that meet at a barrier always all run (before,
every call queued its parts on one shared pool, and two calls' spinning parts could each hold a worker the
other needed). With no idle worker a call runs on its own thread. Semantics roughly::

    helpers = [idle.pop() for _ in range(min(wanted - 1, len(idle), limit - busy))]
    jobs = plan(1 + len(helpers))
    for worker, job in zip(helpers, jobs[1:]): worker runs job      # spare helpers go back to idle
    jobs[0]()
    wait for jobs[1:]; raise the first error

**Interrupts.** If the caller's part fails or a ``KeyboardInterrupt`` arrives anywhere from the
reservation to the end of part 0, every reserved helper that got no part goes back to idle, the call's
``cancel()`` makes its started parts return (a barrier, a pipeline's waits), and the call waits for them
before it raises. A worker's failure cancels the call's parts too and is raised in the caller once every
part has ended. The calling thread never takes a lock here (a ``with lock:`` left by an exception at the
wrong bytecode stays locked): each change of shared state is ONE call into C (``deque.popleft`` through
``list.extend``, every hand-off and its record through one ``deque(map(...))``), which an interrupt
cannot split, and whose record the cleanup reads.

**fork.** Every engine call runs inside :func:`..in_flight.engine_call`: a fork waits until no other
thread is inside a call (new calls wait meanwhile), so a child never inherits a reserved worker that is not
there; the child starts with no workers and makes its own (:func:`_crew`).
"""

from __future__ import annotations

import operator
import os
import queue
import threading
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from itertools import islice
from typing import Any

from ..in_flight import engine_call  # noqa: F401 - the scope of a call; re-exported for loop_threads
from ..thread_count import get_num_threads

Job = Callable[[], Any]
Plan = Callable[[int], Sequence[Job]]   # parts -> at most that many jobs, the first for the caller
Inbox = queue.SimpleQueue               # a worker, as the queue it takes its messages from


def _all_in_one_step(calls: list[Callable[[], Any]]) -> None:
    """Call each of ``calls`` (C functions) inside one C-level loop: no bytecode runs between them, so
    no interrupt can fall between two of them."""
    deque(map(operator.call, calls), maxlen=0)


class _Gang:
    """One call's parts: the workers reserved for it, the jobs, the parts handed out, their ends."""

    def __init__(self, cancel: Callable[[], None] | None):
        self.helpers: list[Inbox] = []
        self.jobs: Sequence[Job] = ()
        self.handed: int | None = None   # jobs handed to helpers (set with the hand-off itself)
        self.cancel_parts = cancel
        self.cancelled = False
        self.error: BaseException | None = None
        self.ended: queue.SimpleQueue = queue.SimpleQueue()   # one item per part that has ended

    def hand_out(self, jobs: Sequence[Job]) -> None:
        """Jobs 1.. to the helpers, ``None`` (go back) to the spare ones, and the record: one step."""
        if not 1 <= len(jobs) <= 1 + len(self.helpers):
            raise RuntimeError(f"plan({1 + len(self.helpers)}) gave {len(jobs)} jobs")  # an engine bug
        self.jobs = jobs
        messages = [(self, part) for part in range(1, len(jobs))]
        messages += [None] * (len(self.helpers) - len(messages))
        _all_in_one_step([partial(inbox.put, m) for inbox, m in zip(self.helpers, messages, strict=True)]
                         + [partial(setattr, self, "handed", len(jobs) - 1)])

    def abandon(self) -> None:
        """After the caller's failure or interrupt: spare helpers back, started parts cancelled and
        waited for."""
        if self.handed is None:
            _all_in_one_step([partial(inbox.put, None) for inbox in self.helpers]
                             + [partial(setattr, self, "handed", 0)])
        self.cancel()
        self.wait()

    def run(self, part: int) -> None:
        """Part ``part`` on a worker; a failure cancels the others and is kept for the caller."""
        try:
            if not self.cancelled:
                self.jobs[part]()
        except BaseException as err:  # noqa: BLE001 - raised in the caller (in_parallel)
            if self.error is None:
                self.error = err
            self.cancel()

    def wait(self) -> None:
        for _ in range(self.handed or 0):
            self.ended.get()

    def cancel(self) -> None:
        self.cancelled = True
        if self.cancel_parts is not None:
            self.cancel_parts()


class _Crew:
    """The process's workers: ``idle`` holds the inboxes of those waiting for a message, ``everyone`` all
    of them. A worker takes one message at a time (a part, or ``None``), then goes back to ``idle``."""

    def __init__(self) -> None:
        self.idle: deque[Inbox] = deque()
        self.everyone: list[Inbox] = []
        self.spawning = threading.Lock()   # one caller starts workers at a time (taken without waiting)

    def reserve(self, gang: _Gang, wanted: int, limit: int) -> None:
        """Move up to ``wanted`` idle workers into ``gang.helpers``, keeping at most ``limit`` busy."""
        self._grow(wanted, limit)
        take = max(0, min(wanted, limit - (len(self.everyone) - len(self.idle))))
        try:
            gang.helpers.extend(islice(iter(self.idle.popleft, None), take))   # one step per worker taken
        except IndexError:   # another caller took the last idle ones meanwhile
            pass

    def _grow(self, wanted: int, limit: int) -> None:
        """Start workers while fewer than ``wanted`` are idle, at most ``limit`` in all. Callers checking at
        once each started one (4 callers under 2 threads: up to 4 workers beside them, not 1); the caller
        that finds another starting workers leaves it the work and takes what is idle: nobody waits (a
        lock an interrupt left taken only stops the crew growing)."""
        if not self.spawning.acquire(blocking=False):
            return
        try:
            while len(self.idle) < wanted and len(self.everyone) < limit:
                self._spawn()
        finally:
            self.spawning.release()

    def busy(self) -> int:
        return len(self.everyone) - len(self.idle)

    def _spawn(self) -> None:
        ready = threading.Event()
        threading.Thread(target=self._work, args=(ready,), name=f"arrayrnn-worker-{len(self.everyone) + 1}",
                         daemon=True).start()
        ready.wait()

    def _work(self, ready: threading.Event) -> None:
        inbox: Inbox = queue.SimpleQueue()
        self.everyone.append(inbox)
        self.idle.append(inbox)
        ready.set()
        while True:
            self._take(inbox, inbox.get())

    def _take(self, inbox: Inbox, message: tuple[_Gang, int] | None) -> None:
        """One message: run the part, go back to idle, tell the caller (whose next call may use this
        worker). A function of its own, so nothing of the call (its arrays) outlives it here."""
        if message is None:
            self.idle.append(inbox)
            return
        gang, part = message
        gang.run(part)
        self.idle.append(inbox)
        gang.ended.put(part)


def in_parallel(plan: Plan, wanted: int, cancel: Callable[[], None] | None = None) -> None:
    """Run ``plan(parts)``'s jobs at once, each on its own thread, the first on this one, where ``parts``
    is at most ``wanted``: as many threads as are free now (module doc). ``cancel()`` (idempotent, from
    any thread) must make every started job return soon, whichever others never start. Waits for every
    started job; raises the caller's error, else the first worker's."""
    if wanted <= 1:  # one part, on this thread: nothing to reserve, hand out or wait for (a small call)
        jobs = plan(1)
        if len(jobs) != 1:
            raise RuntimeError(f"plan(1) gave {len(jobs)} jobs")  # an engine bug
        jobs[0]()
        return
    gang = _Gang(cancel)
    try:
        _crew().reserve(gang, wanted - 1, get_num_threads() - 1)
        gang.hand_out(plan(1 + len(gang.helpers)))
        gang.jobs[0]()
    except BaseException:
        gang.abandon()
        raise
    gang.wait()
    if gang.error is not None:
        raise gang.error


def busy_helpers() -> int:
    """Workers running a part or reserved for one now (none once every call has ended)."""
    return _crew().busy()


_state: dict[str, Any] = {}


def _crew() -> _Crew:
    """The process's crew (a new one in a forked child: the workers stayed in the parent)."""
    if _state.get("pid") != os.getpid():
        _state.update(crew=_Crew(), pid=os.getpid())
    return _state["crew"]
