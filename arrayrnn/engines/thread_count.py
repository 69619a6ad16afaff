"""How many threads the engine's calls may use: ``arrayrnn.set_num_threads`` or ``ARRAYRNN_NUM_THREADS``.

The one knob, process-wide (like ``torch.set_num_threads``). Until :func:`set_num_threads` is called, the
count comes from the environment, read once: ``ARRAYRNN_NUM_THREADS`` if set; otherwise the smaller of the
limits the host already set, ``OMP_NUM_THREADS`` (its first level) and ``NUMBA_NUM_THREADS`` (this
engine's knob before it had its own); otherwise the CPUs this process may run on. Inside the drop-in
PyTorch modules a count not set explicitly is also held to ``torch.get_num_threads()``
(:func:`at_most`), so a host limited to one thread gets one.

Nothing here starts a thread pool or touches another library's setting: numba's threading layer (whose
OpenMP start-up reset the libgomp pool PyTorch shares) is never launched, and OpenBLAS is held to one
thread only inside a call (:mod:`.loop_threads`) and restored after it.
"""

from __future__ import annotations

import os
import threading

from ..core.spec import check_count

VARIABLE = "ARRAYRNN_NUM_THREADS"
_HOST_LIMITS = ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS")

_explicit: int | None = None          # set_num_threads
_environment: dict[str, int | None] = {}   # read once: "variable" (ARRAYRNN_NUM_THREADS), "host" (the rest)
_cap = threading.local()              # at_most(): a limit for this thread's calls


def set_num_threads(n: int) -> None:
    """Let each engine call use up to ``n`` threads (its own and ``n - 1`` workers), process-wide."""
    global _explicit
    _explicit = check_count("n", n, minimum=1)


def get_num_threads() -> int:
    """The threads an engine call may use (see the module docstring); this thread's :func:`at_most`
    limit applies only to a count not set explicitly."""
    if _explicit is not None:
        return _explicit
    if not _environment:
        _environment.update(variable=_variable(), host=_host_default())
    if _environment["variable"] is not None:
        return _environment["variable"]
    default, cap = _environment["host"], getattr(_cap, "limit", None)
    return default if cap is None else max(1, min(default, cap))


class at_most:  # noqa: N801 - used as a function: ``with at_most(n):``
    """This thread's calls use at most ``limit`` threads unless the count was set explicitly (the drop-in
    modules pass ``torch.get_num_threads()``); a class, not a generator: the drop-in's one-step calls
    enter it on every call."""

    def __init__(self, limit: int):
        self.limit = limit

    def __enter__(self) -> None:
        self.before = getattr(_cap, "limit", None)
        _cap.limit = self.limit

    def __exit__(self, *exc: object) -> None:
        _cap.limit = self.before


def _variable() -> int | None:
    """``ARRAYRNN_NUM_THREADS``, checked, or None when unset."""
    text = os.environ.get(VARIABLE)
    if text is None:
        return None
    if not (text.strip().isdigit() and int(text) >= 1):
        raise ValueError(f"{VARIABLE} = {text!r}; expected an int >= 1 (or unset)")
    return int(text)


def _host_default() -> int:
    limits = [_leading_int(os.environ.get(name, "")) for name in _HOST_LIMITS]
    set_limits = [n for n in limits if n is not None]
    return min(set_limits) if set_limits else _cpus()


def _leading_int(text: str) -> int | None:
    """The first entry of an ``OMP_NUM_THREADS``-style list (``"4,2"`` -> 4), or None if not a count."""
    first = text.split(",")[0].strip()
    return int(first) if first.isdigit() and int(first) >= 1 else None


def _cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1
