"""Engines, their weight formats, and :func:`select_engine`, the one place that chooses which engine runs.

Every engine is a module exposing ``ENGINE``, an :class:`~arrayrnn.engines.base.Engine` (see
:mod:`arrayrnn.engines.base` for the interface), described by ONE :class:`EngineRecord` in
:data:`REGISTRY`: where it lives, which arrays it runs on, what it needs, and its rank among the
candidates of ``"auto"``. :func:`load_engine` imports an engine's module lazily, on first use;
:func:`register_engine` adds one exactly like a built-in (tests register test-only engines this way).

**Formats.** A weight format other than ``"canonical"`` belongs to the engine whose ``native_format`` it
is; the format's name is that engine's name (``"cudnn"`` -> the cudnn engine). The frontend converts
through the engine object it selected; only the public ``params.to_format("<name>")`` looks an engine up
by its format's name (:func:`engine_for_format`, handed to :mod:`arrayrnn.core.params` at import, so the
data model never imports an engine).

**Selection.** The frontend builds one :class:`~arrayrnn.engines.base.Call` and asks
``Engine.check(call)``. A named engine that cannot run the call raises ``EngineUnavailableError`` with the
engine's reason. ``"auto"`` tries the engines that run on the call's arrays in rank order (CPU: numba,
reference; GPU: cudnn, cupy, reference) and takes the first that accepts; if none does, the error lists
every candidate with its reason.

**The seam.** The layers above (frontend, adapters) reach the engines through this module and the data
types of :mod:`.base`: :func:`select_engine`, :func:`probe_call`, for one cell step
:func:`~.step.step_engine` (the engine's own step engine, else the shared :class:`~.step.StepEngine`), and
for a one-step call :func:`~.one_step.serves_one_step` / :func:`~.one_step.one_step_forward`;
``tests/test_import_graph.py`` pins it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from types import ModuleType

import numpy as np

from ..core import params as _params
from ..core.errors import EngineUnavailableError
from ..core.spec import RNNSpec
from .base import Call, DirectionForward, Engine
from .derived import freeze as freeze_weights
from .in_flight import engine_call
from .one_step import one_step_forward, serves_one_step
from .step import StepEngine, StepWeights, check_cell_spec, step_engine


@dataclass(frozen=True)
class EngineRecord:
    """Everything the registry knows of one engine before importing it."""

    name: str
    source: str | Engine          # a module exposing ENGINE (imported on first use), or the engine itself
    devices: tuple[str, ...]      # "cpu" (NumPy arrays), "gpu" (CuPy arrays)
    needs: str = ""               # what it needs, for the error when its module cannot be imported
    auto_rank: int | None = None  # its place among "auto"'s candidates (lower first); None: named only
    builtin: bool = False


_BUILTINS = (
    EngineRecord("reference", "arrayrnn.engines.reference", ("cpu", "gpu"), "nothing beyond NumPy",
                 auto_rank=90, builtin=True),
    EngineRecord("numba", "arrayrnn.engines.numba.engine", ("cpu",),
                 "the numba package (pip install numba)", auto_rank=20, builtin=True),
    EngineRecord("cupy", "arrayrnn.engines.cupy.engine", ("gpu",),
                 "a CUDA GPU and CuPy (pip install 'arrayrnn[gpu]')", auto_rank=20, builtin=True),
    EngineRecord("cudnn", "arrayrnn.engines.cudnn.engine", ("gpu",),
                 "a CUDA GPU, CuPy and libcudnn v9 (pip install 'arrayrnn[gpu]')", auto_rank=10,
                 builtin=True),
)
REGISTRY: dict[str, EngineRecord] = {record.name: record for record in _BUILTINS}
_RESERVED = ("auto", "canonical")
_DEVICES = ("cpu", "gpu")


def engine_names() -> tuple[str, ...]:
    """Every name ``engine=`` accepts: ``"auto"`` and each registered engine."""
    return ("auto", *REGISTRY)


def auto_order(device: str) -> tuple[str, ...]:
    """The candidates of ``"auto"`` for arrays on ``device`` (``"cpu"`` or ``"gpu"``), first to last."""
    ranked = [r for r in REGISTRY.values() if device in r.devices and r.auto_rank is not None]
    return tuple(r.name for r in sorted(ranked, key=lambda r: r.auto_rank))


def engines_for(device: str) -> tuple[str, ...]:
    """Every registered engine that runs on arrays of ``device`` (``"cpu"`` or ``"gpu"``)."""
    return tuple(name for name, record in REGISTRY.items() if device in record.devices)


def register_engine(name: str, engine: str | Engine, *, devices: tuple[str, ...] = ("cpu",),
                    auto_rank: int | None = None, needs: str = "") -> None:
    """Register engine ``name``: a module name exposing ``ENGINE`` (imported lazily) or an Engine itself.

    The same mechanism as the built-in engines; its native format (if not canonical) must be ``name``.
    ``auto_rank`` makes it a candidate of ``"auto"`` (built-ins: cudnn 10, cupy and numba 20, reference
    90). Built-in names cannot be replaced; registering a name again replaces that registration.
    """
    if not isinstance(name, str) or not name or name in _RESERVED:
        raise ValueError(f"name = {name!r}; expected a non-empty engine name other than 'auto'/'canonical'")
    record = REGISTRY.get(name)
    if record is not None and record.builtin:
        raise ValueError(f"name = {name!r} is a built-in engine; register yours under another name")
    if not isinstance(engine, (str, Engine)):
        raise TypeError(f"engine has type {type(engine).__name__}; expected a module name or an Engine")
    bad = [d for d in devices if d not in _DEVICES] if isinstance(devices, tuple) else devices
    if bad or not devices:
        raise ValueError(f"devices = {devices!r}; expected a non-empty tuple drawn from {_DEVICES}")
    if auto_rank is not None and (isinstance(auto_rank, bool) or not isinstance(auto_rank, int)):
        raise TypeError(f"auto_rank = {auto_rank!r}; expected None or an int")
    REGISTRY[name] = EngineRecord(name, engine, devices, needs, auto_rank)
    forget_choices()


def unregister_engine(name: str) -> None:
    """Remove an engine added by :func:`register_engine` (built-in engines cannot be removed)."""
    record = REGISTRY.get(name)
    if record is not None and record.builtin:
        raise ValueError(f"name = {name!r} is a built-in engine; only registered engines can be removed")
    REGISTRY.pop(name, None)
    forget_choices()


def load_engine(name: str) -> Engine:
    """Import engine ``name`` and return its ``ENGINE``; ``EngineUnavailableError`` if it cannot."""
    _check_name(name, allow_auto=False)
    record = REGISTRY[name]
    if isinstance(record.source, Engine):
        return record.source
    try:
        with engine_call():  # a fork waits for the import: a child would wait for its module lock forever
            module = importlib.import_module(record.source)
    except ModuleNotFoundError as err:
        if err.name is not None and (record.source + ".").startswith(err.name + "."):
            raise EngineUnavailableError(f"engine = {name!r} is not part of this installation (module "
                                         f"{record.source} is missing); use engine='auto' or "
                                         "engine='reference'") from err
        raise _cannot_import(record, err) from err
    except ImportError as err:
        raise _cannot_import(record, err) from err
    engine = getattr(module, "ENGINE", None)
    if not isinstance(engine, Engine):
        raise EngineUnavailableError(f"engine = {name!r}: module {record.source} has no ENGINE (an "
                                     f"arrayrnn.engines.base.Engine; it has {type(engine).__name__}); "
                                     "fix the module or register the Engine object itself")
    return engine


def _cannot_import(record: EngineRecord, err: ImportError) -> EngineUnavailableError:
    needs = record.needs or f"what module {record.source} imports"
    return EngineUnavailableError(f"engine = {record.name!r} cannot be imported ({err}); it needs {needs}, "
                                  "or use engine='auto'")


def engine_for_format(format: str) -> Engine:
    """The engine whose native format is ``format`` (a format is named after its engine)."""
    if format == "canonical":
        raise ValueError("format = 'canonical' belongs to no engine: every engine reads it; pass the name "
                         "of an engine's own format instead")
    if not isinstance(format, str) or format not in REGISTRY:
        raise ValueError(f"format = {format!r}; expected 'canonical' or the name of an engine with its "
                         f"own format (one of {tuple(REGISTRY)})")
    engine = load_engine(format)
    if engine.native_format != format:
        raise ValueError(f"format = {format!r}; engine {format!r} reads the "
                         f"{engine.native_format!r} format, so {format!r} is not a weight format")
    return engine


def probe_call(spec: RNNSpec, xp: ModuleType = np, **fields) -> Call:
    """A :class:`Call` for ``spec`` on ``xp`` with small defaults (T = B = 1, inference), for probing."""
    base = Call(spec=spec, xp=xp, device=None, seq_len=1, batch=1, training=False, params_format="canonical",
                has_zero_length=False, explicit=True)
    return replace(base, **fields)


def engine_unavailable_reason(name: str, call: Call) -> str | None:
    """``None`` if engine ``name`` can run ``call`` here, else why not."""
    return _try(name, call)[1]


def available_engines(spec: RNNSpec, xp: ModuleType = np) -> tuple[str, ...]:
    """Names of the engines that can run ``spec`` on arrays of ``xp`` here (a small inference call)."""
    call = probe_call(spec, xp)
    return tuple(name for name in REGISTRY if engine_unavailable_reason(name, call) is None)


def select_engine(name: str, call: Call) -> Engine:
    """The engine that runs ``call``: ``name`` itself, or the first candidate of ``"auto"`` that accepts.

    Sets ``call.explicit`` (whether the user named the engine) before asking. Unknown names are a
    ``ValueError``; a named engine that cannot run the call is an ``EngineUnavailableError`` with its
    reason; ``"auto"`` with no fitting engine is an ``EngineUnavailableError`` listing every candidate
    with its reason.
    """
    try:
        return _CHOICES[name, call]  # a repeated configuration: one dict lookup
    except (KeyError, TypeError):  # TypeError: an unhashable call, refused below
        pass
    _check_name(name, allow_auto=True)
    if not isinstance(call, Call):
        raise TypeError(f"call has type {type(call).__name__}; expected an arrayrnn.engines.base.Call "
                        "(e.g. arrayrnn.engines.probe_call(spec, xp))")
    if name == "auto":
        engine = _select_auto(replace(call, explicit=False))
    else:
        engine = load_engine(name)
        reason = engine.check(replace(call, explicit=True))
        if reason is not None:
            raise EngineUnavailableError(f"engine = {name!r} cannot run this call: {reason}")
    if len(_CHOICES) >= _MAX_CHOICES:
        _CHOICES.clear()
    _CHOICES[name, call] = engine
    return engine


# select_engine's answers per (name, call); an engine whose answer may change for the same call (a compile
# finished, a setting read at check time) calls forget_choices() when it does
_CHOICES: dict[tuple[str, Call], Engine] = {}
_MAX_CHOICES = 1024
_epoch = 0


def forget_choices() -> None:
    """Forget every remembered :func:`select_engine` answer (registrations and engines whose answer changed
    call this)."""
    global _epoch
    _CHOICES.clear()
    _epoch += 1


def choices_epoch() -> int:
    """A number that changes whenever :func:`select_engine`'s answers may have changed (each
    :func:`forget_choices`): a caller that keeps an engine it was given (a cell module's step) asks again
    when it moved, so a call that began on the reference engine moves to numba once numba has loaded."""
    return _epoch


def _select_auto(call: Call) -> Engine:
    reasons = []
    for candidate in auto_order("cpu" if call.xp is np else "gpu"):
        engine, reason = _try(candidate, call)
        if reason is None:
            return engine
        reasons.append(f"{candidate}: {reason}")
    raise EngineUnavailableError("engine = 'auto' found no engine for this call; " + "; ".join(reasons))


def _try(name: str, call: Call) -> tuple[Engine | None, str | None]:
    """The engine and ``None``, or ``None`` and why it cannot run ``call`` (loaded once)."""
    try:
        engine = load_engine(name)
    except EngineUnavailableError as err:
        return None, str(err)
    reason = engine.check(call)
    return (engine, None) if reason is None else (None, reason)


def _check_name(name: object, allow_auto: bool) -> None:
    names = engine_names() if allow_auto else tuple(REGISTRY)
    if not isinstance(name, str) or name not in names:
        raise ValueError(f"engine = {name!r}; expected one of {names}")


_params.set_format_lookup(engine_for_format)

__all__ = ["REGISTRY", "Call", "DirectionForward", "Engine", "EngineRecord", "StepEngine", "StepWeights",
           "auto_order", "available_engines", "check_cell_spec", "choices_epoch", "engine_for_format",
           "engine_names", "engine_unavailable_reason", "engines_for", "forget_choices", "freeze_weights",
           "load_engine", "one_step_forward", "probe_call", "register_engine", "select_engine",
           "serves_one_step", "step_engine", "unregister_engine"]
