"""How many threads the engine's calls may use: ``arrayrnn.set_num_threads`` or ``ARRAYRNN_NUM_THREADS``.

The one knob, process-wide (like ``torch.set_num_threads``). Until :func:`set_num_threads` is called, the
count comes from the environment, read once: ``ARRAYRNN_NUM_THREADS`` if set; otherwise the smaller of the
limits the host already set, ``OMP_NUM_THREADS`` (its first level) and ``NUMBA_NUM_THREADS`` (this
engine's knob before it had its own); otherwise the CPUs this process may run on. A count is ASCII digits,
at least 1, spaces around it allowed (``" 4 "``); a host limit is read as libgomp reads ``OMP_NUM_THREADS``
(a comma-separated list of counts, ``"4,2"`` -> 4), and one that is not (``"²"``, ``"0"``, ``"-1"``) is
ignored with a ``RuntimeWarning``, as libgomp ignores it; a bad ``ARRAYRNN_NUM_THREADS`` is a ``ValueError``.
Inside the drop-in PyTorch modules a count not set explicitly is also held to ``torch.get_num_threads()``
(:func:`at_most`), so a host limited to one thread gets one.

Nothing here starts a thread pool or touches another library's setting: numba's threading layer (whose
OpenMP start-up reset the libgomp pool PyTorch shares) is never launched, and OpenBLAS is held to one
thread only inside a call (:mod:`.loop_threads`) and restored after it.
"""

from __future__ import annotations

import os
import threading
import warnings

from ..core.spec import check_count

VARIABLE = "ARRAYRNN_NUM_THREADS"
_HOST_LIMITS = ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS")

_explicit: int | None = None          # set_num_threads
_environment: dict[str, int | None] = {}   # read once: "variable" (ARRAYRNN_NUM_THREADS), "host" (the rest)
_cap = threading.local()              # at_most(): a limit for this thread's calls


def set_num_threads(n: int) -> None:
    """Let each engine call use up to ``n`` threads (its own and ``n - 1`` workers), process-wide.

    Like ``torch.set_num_threads``; it overrides ``ARRAYRNN_NUM_THREADS`` and the host's limits
    (``OMP_NUM_THREADS``, ``NUMBA_NUM_THREADS``). No thread pool is started here.

    Parameters
    ----------
    n : int
        At least 1.

    Raises
    ------
    ValueError
        ``n`` below 1.
    TypeError
        ``n`` not an integer.

    Examples
    --------
    >>> import arrayrnn as ar
    >>> before = ar.get_num_threads()
    >>> ar.set_num_threads(2)
    >>> ar.get_num_threads()
    2
    >>> ar.set_num_threads(before)
    """
    global _explicit
    _explicit = check_count("n", n, minimum=1)


def get_num_threads() -> int:
    """The threads an engine call may use.

    Set by :func:`set_num_threads`, else read once from ``ARRAYRNN_NUM_THREADS``, else the smaller of
    ``OMP_NUM_THREADS`` and ``NUMBA_NUM_THREADS``, else the CPUs this process may run on. Inside the drop-in
    PyTorch modules a count not set explicitly is also held to ``torch.get_num_threads()``.

    Returns
    -------
    int
        At least 1.

    Raises
    ------
    ValueError
        A malformed ``ARRAYRNN_NUM_THREADS``.

    Examples
    --------
    >>> import arrayrnn as ar
    >>> ar.get_num_threads() >= 1
    True
    """
    if _explicit is not None:
        return _explicit
    if not _environment:
        variable = _variable()
        _environment.update(variable=variable, host=_host_default() if variable is None else None)
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
    count = _count(text)
    if count is None:
        raise ValueError(f"{VARIABLE} = {text!r}; expected an int >= 1 (or unset)")
    return count


def _host_default() -> int:
    limits = [_host_limit(name) for name in _HOST_LIMITS]
    set_limits = [n for n in limits if n is not None]
    return min(set_limits) if set_limits else _cpus()


def _host_limit(name: str) -> int | None:
    """The first entry of the ``OMP_NUM_THREADS``-style list in ``name`` (``"4,2"`` -> 4); None if unset,
    blank, or not such a list (then with a warning: the host's own parser may read it another way, but
    this engine cannot, and refusing would break every call over another library's setting)."""
    text = os.environ.get(name, "")
    if not text.strip():
        return None
    counts = [_count(entry) for entry in text.split(",")]
    if None in counts:
        warnings.warn(f"{name} = {text!r} is not a thread count (expected an int >= 1 or a list such as "
                      f"'4,2'); arrayrnn ignores it", RuntimeWarning, stacklevel=3)
        return None
    return counts[0]


_DIGITS = frozenset("0123456789")


def _count(text: str) -> int | None:
    """``text`` as a count >= 1: ASCII digits, spaces around them allowed; else None (``str.isdigit`` and
    ``int`` take other scripts' digits, ``"²"`` passes the first and fails the second)."""
    digits = text.strip(" \t\n\r\f\v")
    if not digits or not set(digits) <= _DIGITS:
        return None
    count = int(digits)
    return count if count >= 1 else None


def _cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1
