"""The numba engine's compile, off the caller's path: in child processes, then loaded from numba's cache.

A call of ``engine="auto"`` whose compiled loops this process has not loaded yet does not wait for numba.
:meth:`~arrayrnn.engines.numba.engine.NumbaEngine.check` asks :func:`loaded`; while neither the call's
:class:`Path` (its spec, rows, one step or many, phase) nor its whole :class:`Family` is loaded, it
declines (``"auto"`` runs the call on the reference engine, NumPy, at once) and both are queued. One
daemon thread works through the queue, one child process at a time, roughly::

    for job in queue:                          # paths first, at full priority; then families, niced
        signatures = run([python, "-m", "arrayrnn", "warmup", "--path"/"--family", job, "--signatures", "-"])
        for dispatcher, signature in signatures:
            dispatcher.compile(signature)      # numba's on-disk cache: a load, not a compile
        loaded.add(job); forget_choices()      # the next call of the path (family) runs the compiled loops

A path's child runs the call itself, on a few steps
(:func:`~arrayrnn.frontend.compile_ahead.path_probe_calls`), so the loops the caller
needs are compiled first (a part of the family's work: a call without layer norm compiles the loops'
signature whose norm branches numba pruned, bench/RESULTS.md); a family's child runs every probe
(:func:`~arrayrnn.frontend.compile_ahead.probe_calls`: every loop, split and variant the engine has, on
small arrays) at a lower CPU priority (``nice``), so it takes what the caller leaves. A training family
loads its inference calls too.
Each child runs its probes with ``engine="numba"``, so numba compiles each function into its on-disk
cache, and writes the signatures that appeared to its stdout. The compile runs on other cores, holds no
lock of this process (a ``fork`` here never waits for it; a forked child never inherits a compile in
progress) and keeps going when this process exits (it only fills the cache; numba writes cache files
whole, by rename).
Loading holds numba's compiler lock for milliseconds; ``os.fork`` waits for the one load in flight.

``engine="numba"`` named by the caller never declines: it compiles on the calling thread where it must.
:func:`~arrayrnn.frontend.compile_ahead.warmup` (``arrayrnn.warmup``, ``python -m arrayrnn warmup``)
compiles ahead in this process, with a progress bar. ``ARRAYRNN_BACKGROUND_COMPILE=0`` turns the
background compile off (``"auto"`` then takes the numba engine and waits for its compile, as before).

The probe calls run the public API, so they stand above the frontend
(:mod:`arrayrnn.frontend.compile_ahead`); this module keeps what the engine needs: the jobs, the queue, the
child process and the loading. The child names the probes' module on its command line
(``python -m arrayrnn warmup``), not by an import.
"""

from __future__ import annotations

import atexit
import importlib
import json
import logging
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np

from ...core.spec import RNNSpec
from ..in_flight import engine_call
from ..numba_cache import background_enabled, location
from ..thread_count import get_num_threads
from . import blocking, gemm_tuning

KINDS = ("lstm", "gru", "rnn")
DTYPES = ("float32", "float64")
_MODE_KIND = {"lstm": "lstm", "gru": "gru", "rnn_tanh": "rnn", "rnn_relu": "rnn", "rnn": "rnn"}
_log = logging.getLogger("arrayrnn.numba")


class Family(NamedTuple):
    """The compiled code a call needs: its cell kind, dtype, and whether it trains (forward + backward)."""

    kind: str       # "lstm", "gru" or "rnn" (tanh and relu share their loops)
    dtype: str      # "float32" or "float64"
    training: bool

    def text(self) -> str:
        return f"{self.kind}:{self.dtype}:{'training' if self.training else 'forward'}"

    def family(self) -> Family:
        return self

    @classmethod
    def parse(cls, text: str) -> Family:
        parts = text.split(":") if isinstance(text, str) else []
        kind, dtype, phase = parts if len(parts) == 3 else ("", "", "")
        if kind not in KINDS or dtype not in DTYPES or phase not in ("training", "forward"):
            raise ValueError(f"family = {text!r}; expected KIND:DTYPE:PHASE with KIND in {KINDS}, DTYPE in "
                             f"{DTYPES} and PHASE 'forward' or 'training'")
        return cls(kind, dtype, phase == "training")


def family_of(spec: RNNSpec, training: bool) -> Family:
    return Family(_MODE_KIND[spec.mode], np.dtype(spec.dtype).name, bool(training))


class Path(NamedTuple):
    """What one call needs compiled: the loops a call of ``spec`` on ``batch`` rows reaches, whatever its
    length and lengths (one step or many), with ``threads`` engine threads or one."""

    spec: str          # RNNSpec.to_dict() as JSON (hashable, and what the child process is told)
    training: bool
    one_step: bool     # T = 1: rnn_forward's one-step path and the cell step
    batch: int
    zero_length: bool
    all_states: bool
    threads: int

    def text(self) -> str:
        return json.dumps(self._asdict())

    @classmethod
    def parse(cls, text: str) -> Path:
        try:
            fields = json.loads(text)
            path = cls(**fields)
            RNNSpec.from_dict(json.loads(path.spec))
        except (TypeError, ValueError) as err:
            raise ValueError(f"path = {text!r}; expected the JSON of a warmup.Path ({err})") from None
        return path

    def family(self) -> Family:
        return family_of(RNNSpec.from_dict(json.loads(self.spec)), self.training)


def path_of(call: Any, threads: int) -> Path:
    """The :class:`Path` of an engine :class:`~arrayrnn.engines.base.Call`."""
    return Path(json.dumps(call.spec.to_dict(), sort_keys=True), bool(call.training), call.seq_len == 1,
                int(call.batch), bool(call.has_zero_length), bool(call.all_states), int(threads))


# -- the signatures compiled --------------------------------------------------------------------------
Signatures = dict[tuple[str, str], set[tuple]]


def compiled_signatures() -> Signatures:
    """Every signature compiled so far by each of arrayrnn's module-level numba functions."""
    from numba.core.dispatcher import Dispatcher

    found: Signatures = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("arrayrnn.") or module is None:
            continue
        for value in list(vars(module).values()):
            if isinstance(value, Dispatcher) and "<locals>" not in value.py_func.__qualname__:
                key = (value.py_func.__module__, value.py_func.__qualname__)
                found[key] = set(value.signatures)
    return found


def new_signatures(before: Signatures, after: Signatures) -> Signatures:
    added = {key: sigs - before.get(key, set()) for key, sigs in after.items()}
    return {key: sigs for key, sigs in added.items() if sigs}


def load_signatures(signatures: Signatures) -> None:
    """Compile each signature in this process: a load from numba's cache where a child compiled it."""
    for (module, qualname), sigs in signatures.items():
        dispatcher = getattr(importlib.import_module(module), qualname)
        for sig in sigs:
            if sig not in dispatcher.signatures:
                dispatcher.compile(sig)


# -- the background thread ----------------------------------------------------------------------------
Job = Family | Path
_loaded: set[Job] = set()
MAX_PATHS = 8   # per family: beyond that, its calls wait for the whole family (shapes that keep changing)
_NICE = {Path: 0, Family: 10}   # a family's child takes the cores the caller leaves


def mark_loaded(job: Job) -> None:
    """Record ``job`` as loaded in this process (a training family loads its inference calls too)."""
    _loaded.update({job, job._replace(training=False)} if isinstance(job, Family) else {job})


class _Queue:
    """The jobs asked for and the one daemon thread compiling them, one child process at a time (two
    children would race on numba's cache index: numba/core/caching.py, ``IndexDataCacheFile.save``, reads,
    adds and rewrites it), a path before any family."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.waiting: list[Job] = []
        self.asked: set[Job] = set()
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()
        self.done = threading.Condition(self.lock)

    def ask(self, job: Job) -> None:
        with self.lock:  # a training family's probes run the inference calls too (mark_loaded)
            paths = sum(isinstance(j, Path) and j.family() == job.family() for j in self.asked)
            if isinstance(job, Path) and job not in self.asked and paths >= MAX_PATHS:
                return
            if job not in self.waiting and job not in _loaded:
                self.waiting.append(job)
                self.asked.add(job)
            if self.thread is None and self.waiting and not self.stop.is_set():
                self.thread = threading.Thread(target=self._work, name="arrayrnn-numba-compile", daemon=True)
                self.thread.start()

    def _next(self) -> Job:
        return next((job for job in self.waiting if isinstance(job, Path)), self.waiting[0])

    def _work(self) -> None:
        while not self.stop.is_set():
            with self.lock:
                if not self.waiting:
                    self.thread = None
                    return
                job = self._next()
            if job not in _loaded and not (isinstance(job, Path) and job.family() in _loaded):
                _compile_elsewhere(job, self.stop)
            with self.lock:
                self.waiting.remove(job)
                self.done.notify_all()

    def wait(self, job: Job, timeout: float | None = None) -> bool:
        """Wait until ``job`` is loaded (or no longer queued); whether it is loaded."""
        with self.lock:
            self.done.wait_for(lambda: job in _loaded or job not in self.waiting, timeout)
        return job in _loaded


_queue = _Queue()


# the child imports this very package (not one that the working directory may shadow)
_CHILD = ("import os, sys; sys.path.insert(0, sys.argv[1]); "
          "hasattr(os, 'nice') and os.nice(int(sys.argv[4])); from arrayrnn.__main__ import main; "
          "sys.exit(main(['warmup', sys.argv[2], sys.argv[3], '--signatures', '-', '--quiet']))")


def _package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _compile_elsewhere(job: Job, stop: threading.Event) -> None:
    """Compile ``job`` in a child process, load it here, mark it loaded and forget the engine choices."""
    from .. import forget_choices

    flag = "--family" if isinstance(job, Family) else "--path"
    command = [sys.executable, "-c", _CHILD, _package_root(), flag, job.text(), str(_NICE[type(job)])]
    env = {**os.environ, "ARRAYRNN_BACKGROUND_COMPILE": "0"}
    try:  # the signatures come back on the child's stdout: no file to leave behind if this process exits
        child = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                               start_new_session=True, check=False)
        if child.returncode != 0:
            raise RuntimeError(child.stderr.decode(errors="replace").strip().splitlines()[-1:])
        if not stop.is_set():
            with engine_call():  # a fork waits for the imports and loads (..in_flight)
                load_signatures(pickle.loads(child.stdout))
    except Exception as err:  # noqa: BLE001 - the numba engine then compiles on the caller's thread
        what = job.text() if isinstance(job, Family) else f"{job.family().text()} ({job.batch} rows)"
        _log.warning("arrayrnn: the background compile of the numba engine's %s loops failed (%s); "
                     "calls of engine='auto' will compile them when they run", what, err)
    if not stop.is_set():
        mark_loaded(job)
        blocking.reload()   # a family's child tunes the packed GEMM's blocking once per CPU
        forget_choices()


@contextmanager
def probing() -> Iterator[None]:
    """The scope of one probe call: tiny, it must still reach every split loop a large call runs, so its
    plan splits as a large call's would (:func:`.loop_threads.small_calls_split`)."""
    from .loop_threads import small_calls_split  # the engine's threads: not at import

    with small_calls_split():
        yield


def finish_family(family: Family) -> None:
    """What ends a family's compile (ahead, or in the background's child): the packed GEMM's tuning pass,
    once per CPU (:mod:`.gemm_tuning`, ~0.1 s: its products are compiled by then), then the family marked
    loaded."""
    gemm_tuning.tune(family.dtype)
    mark_loaded(family)


def loaded(call: Any) -> bool:
    """Whether this process has the compiled loops of ``call`` (an engine
    :class:`~arrayrnn.engines.base.Call`): its family's, or its path's; if not, both are queued."""
    family = family_of(call.spec, call.training)
    if family in _loaded or not background_enabled():
        return True
    path = path_of(call, get_num_threads())
    if path in _loaded:
        return True
    if location() is not None:  # else a child's compile would be kept nowhere: "auto" stays on reference
        _queue.ask(path)
        _queue.ask(family)
    return False


def wait(spec: RNNSpec, training: bool, timeout: float | None = None) -> bool:
    """Wait for the background compile of ``spec``'s family (queued by :func:`loaded`); whether loaded."""
    return _queue.wait(family_of(spec, training), timeout)


def wait_path(call: Any, timeout: float | None = None) -> bool:
    """Wait for the background compile of ``call``'s path (queued by :func:`loaded`); whether loaded."""
    return _queue.wait(path_of(call, get_num_threads()), timeout)


def _after_fork_in_child() -> None:
    global _queue
    _queue = _Queue()  # the thread stayed in the parent; the child asks again for what it needs


def _at_exit() -> None:
    _queue.stop.set()  # no new load starts; a child process compiling goes on filling the cache


if hasattr(os, "register_at_fork"):  # the fork itself waits for a load in flight (..in_flight)
    os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)


# -- the families a warmup names ------------------------------------------------------------------
def families(modes: RNNSpec | str | Iterable[RNNSpec | str], dtypes: str | Iterable[str],
             training: bool) -> list[Family]:
    """The families of ``modes`` (specs or mode names) x ``dtypes``; errors name the bad argument."""
    modes = [modes] if isinstance(modes, (RNNSpec, str)) else list(modes)
    dtypes = [dtypes] if isinstance(dtypes, str) or not isinstance(dtypes, Iterable) else list(dtypes)
    kinds = []
    for mode in modes:
        name = mode.mode if isinstance(mode, RNNSpec) else mode
        if name not in _MODE_KIND:
            raise ValueError(f"modes contains {mode!r}; expected RNNSpecs or mode names from "
                             f"{tuple(_MODE_KIND)}")
        kinds.append(_MODE_KIND[name])
    names = []
    for dtype in dtypes:
        try:
            names.append(np.dtype(dtype).name)
        except TypeError:
            names.append(repr(dtype))
        if names[-1] not in DTYPES:
            raise ValueError(f"dtypes contains {dtype!r}; expected {DTYPES} (the numba engine's dtypes)")
    if not kinds or not names:
        raise ValueError(f"modes = {modes!r}, dtypes = {dtypes!r}; expected at least one of each")
    return [Family(k, d, training) for k in dict.fromkeys(kinds) for d in dict.fromkeys(names)]
