"""Detect in-place writes to a params buffer between ``rnn_forward`` and ``rnn_backward``.

PyTorch raises when a tensor saved for backward was modified in place (its version counter). NumPy and
CuPy arrays have no version counter, so a training forward records the buffer and the backward compares.
Any write that changes a value of ``params.data`` (an optimizer step, ``-=`` on a view, ``params.data[...] =
...``) is detected; a write that leaves every value as it was (NaN as NaN) is harmless.

An inference forward (``training=False``) records the same as a training forward: its backward recomputes
the forward, and the comparison is of what was written, not of outputs, which another engine, algorithm
(cuDNN's inference and training modes), thread split or rounding may compute with other last bits. A
caller that knows no backward will follow (the adapters' inference calls) runs inside :func:`no_backward`,
which records nothing.

- **NumPy** (:class:`HostSnapshot`): a private copy of the flat buffer, compared at the backward, which
  raises there. Exact. The copy is also what the numba engine runs on (:func:`frozen_copy`): nothing writes
  it, so an engine keeps what it derives from it (:mod:`arrayrnn.engines.derived`: the numba engine's packed
  weights), and a later call on a buffer that still holds the same bits reuses the copy and those forms
  (one comparison instead of a copy and the packing). The last copies of the 8 buffers used last are kept.
- **CuPy** (:class:`DeviceFingerprint`): no copy and no waiting for the GPU. The forward adds a 64-bit
  fingerprint of the buffer (:mod:`arrayrnn.core.fingerprint`: one kernel, 16 bytes) into a device slot,
  the backward adds the buffer's fingerprint at that point of the stream into a second slot and copies both
  into pinned host memory without waiting (``cudaMemcpyAsync`` then an event). The comparison is read when
  the event has completed: by :func:`raise_pending` at the start of every later ``rnn_forward`` /
  ``rnn_backward`` (which raises the ``ValueError`` there, naming the backward that saw the change), or by
  :func:`synchronize`, which waits. With ``ARRAYRNN_SYNC_GUARD=1`` the backward itself waits and raises, like
  ``CUDA_LAUNCH_BLOCKING`` for kernel errors. Cost per training step: two kernel launches, one 16-byte copy
  and one event; a write goes undetected with probability about ``2**-64``.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
import weakref
from collections import OrderedDict, deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..core import fingerprint
from ..core.backend import same_bits
from ..engines import freeze_weights

_MESSAGE = ("params.data was modified in place between rnn_forward and rnn_backward (for example an "
            "optimizer step before the backward); the gradient would match neither the old nor the new "
            "weights. Call rnn_backward first, then update the params, or run rnn_forward again.")


class HostSnapshot:
    """A private, frozen copy of a NumPy buffer (``copy``); :meth:`assert_unchanged` raises if the buffer
    changed since."""

    def __init__(self, data: Any):
        self.copy = np.array(data, copy=True)
        self._wrapped: Any = None
        freeze_weights(self.copy, keeper=self)  # the engines' forms of the copy live as long as this

    def params(self, params: Any) -> Any:
        """``params`` (a :class:`~arrayrnn.PackedParams` whose data this copies) over the copy."""
        wrapped = self._wrapped
        if wrapped is None or wrapped.spec != params.spec or wrapped.format != params.format:
            wrapped = self._wrapped = type(params)._wrap(params.spec, self.copy, params.format)
        return wrapped

    def holds(self, data: Any) -> bool:
        """Whether ``data`` has the copy's dtype, shape and bits (then the copy can stand for it)."""
        return same_bits(self.copy, data)

    def assert_unchanged(self, data: Any) -> None:
        # untouched, the common case: one memcmp (equal bits are equal values, no temporary); else the value
        # comparisons (a write of -0.0 over 0.0 changes no value), the plain one 10x cheaper than the
        # NaN-aware one that only a buffer holding NaN needs
        if self.holds(data):
            return
        if not np.array_equal(self.copy, data) and not np.array_equal(self.copy, data, equal_nan=True):
            raise ValueError(_MESSAGE)


_LATEST: OrderedDict[tuple[int, int, str], HostSnapshot] = OrderedDict()  # (address, bytes, dtype) -> copy
_KEEP = 8  # buffers whose last copy is kept (an adapter wraps the same memory in a new view every call)


def frozen_copy(data: np.ndarray) -> HostSnapshot:
    """The private copy of ``data`` that an engine keeping derived weights runs on: the last one made of
    the memory ``data`` views while it still holds the same bits (one comparison), else a new one (one
    copy). The last copies of the :data:`_KEEP` buffers used last are kept; an owning buffer's goes when
    it is freed."""
    place = (data.ctypes.data, data.nbytes, data.dtype.str)
    last = _LATEST.get(place)
    if last is not None and last.holds(data):
        _LATEST.move_to_end(place)
        return last
    snap = HostSnapshot(data)
    if last is None and data.base is None:
        weakref.finalize(data, _LATEST.pop, place, None)
    _LATEST[place] = snap
    _LATEST.move_to_end(place)
    while len(_LATEST) > _KEEP:
        _LATEST.popitem(last=False)
    return snap


class DeviceFingerprint:
    """The fingerprint of a CuPy buffer at the forward; :meth:`assert_unchanged` queues the comparison with
    the buffer's fingerprint at the backward (see the module docstring)."""

    def __init__(self, data: Any, xp: Any):
        self._xp = xp
        self._slots = self._xp.zeros(2, np.uint64)  # [at the forward, at the (first) backward]
        self._fresh = True
        fingerprint.accumulate(data, self._slots, 0, self._xp)

    def assert_unchanged(self, data: Any) -> None:
        slots = self._slots
        if not self._fresh:  # a second backward on one result: a new zeroed slot beside the forward's
            slots = self._xp.zeros(2, np.uint64)
            slots[0:1] = self._slots[0:1]
        self._fresh = False
        fingerprint.accumulate(data, slots, 1, self._xp)
        _queue(_PendingCheck(self._xp, slots))


def _queue(check: _PendingCheck) -> None:
    if os.environ.get("ARRAYRNN_SYNC_GUARD") == "1":
        check.wait()
        check.raise_if_changed(late=False)
        return
    with _LOCK:
        _PENDING.append(check)


def snapshot(data: Any, xp: Any) -> HostSnapshot | DeviceFingerprint | None:
    """What a forward keeps of ``params.data`` (an array of ``xp``): a copy on the host, a fingerprint on
    a GPU; None inside :func:`no_backward`."""
    if _no_backward.get():
        return None
    return frozen_copy(data) if xp is np else DeviceFingerprint(data, xp)


_no_backward: contextvars.ContextVar[bool] = contextvars.ContextVar("arrayrnn_no_backward", default=False)


@contextlib.contextmanager
def no_backward() -> Iterator[None]:
    """Inference forwards inside record nothing of the weights: no backward of theirs will run (an
    adapter's forward without gradients). :func:`assert_unchanged` refuses one that does."""
    token = _no_backward.set(True)
    try:
        yield
    finally:
        _no_backward.reset(token)


def assert_unchanged(record: HostSnapshot | DeviceFingerprint | None, data: Any) -> None:
    """``record`` (from :func:`snapshot`) still matches ``data``; ``ValueError`` if it does not or if the
    forward recorded nothing."""
    if record is None:
        raise ValueError("this result's forward ran inside arrayrnn.frontend.guard.no_backward(), which "
                         "keeps nothing for a backward; run the forward outside it to differentiate it")
    record.assert_unchanged(data)


class _PendingCheck:
    """Both fingerprints on their way into pinned host memory, and the event that says they arrived."""

    def __init__(self, xp: Any, slots: Any, detail: str = ""):
        self._slots, self._detail = slots, detail  # the slots stay alive until the copy has run
        self._memory = xp.cuda.alloc_pinned_memory(16)
        self._host = np.frombuffer(self._memory, np.uint64, 2)
        stream = xp.cuda.get_current_stream()
        xp.cuda.runtime.memcpyAsync(self._host.ctypes.data, slots.data.ptr, 16,
                                    xp.cuda.runtime.memcpyDeviceToHost, stream.ptr)
        self._event = xp.cuda.Event(block=False, disable_timing=True)
        self._event.record(stream)

    @property
    def done(self) -> bool:
        return bool(self._event.done)

    def wait(self) -> None:
        self._event.synchronize()

    def raise_if_changed(self, late: bool) -> None:
        if self._host[0] != self._host[1]:
            raise ValueError(("an earlier rnn_backward (found after it ran, without waiting for the GPU): "
                              if late else "") + _MESSAGE + self._detail)


_PENDING: deque[_PendingCheck] = deque()
_LOCK = threading.Lock()


def raise_pending() -> None:
    """Raise for the first completed comparison that found a change; forget the completed ones; never
    wait. Called at the start of every ``rnn_forward`` and ``rnn_backward``."""
    if not _PENDING:
        return
    with _LOCK:
        done = []
        while _PENDING and _PENDING[0].done:
            done.append(_PENDING.popleft())
    for check in done:
        check.raise_if_changed(late=True)


def synchronize() -> None:
    """Wait for every queued comparison and raise for the first that found a change."""
    with _LOCK:
        checks = list(_PENDING)
        _PENDING.clear()
    for check in checks:
        check.wait()
    for check in checks:
        check.raise_if_changed(late=True)
