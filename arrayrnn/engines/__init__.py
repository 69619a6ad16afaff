"""Engines, their weight formats, and :func:`select_engine`, the one place that chooses which engine runs.

Every engine is a module exposing ``ENGINE``, an :class:`~arrayrnn.engines.base.Engine` (see
:mod:`arrayrnn.engines.base` for the interface). :data:`ENGINE_MODULES` maps engine names to modules;
:func:`load_engine` imports them lazily, on first use. :func:`register_engine` adds one (tests use it to
register a test-only engine exactly like a built-in one).

**Formats.** A weight format other than ``"canonical"`` belongs to the engine whose ``native_format`` it
is; the format's name is that engine's name (``"cudnn"`` -> the cudnn engine). :func:`engine_for_format`
finds it at call time, so ``params.to_format("cudnn")`` needs no earlier import or registration.

**Selection.** The frontend builds one :class:`~arrayrnn.engines.base.Call` and asks
``Engine.check(call)``. A named engine that cannot run the call raises ``EngineUnavailableError`` with the
engine's reason. ``"auto"`` tries :data:`AUTO_ORDER` (CPU: numba, reference; GPU: cudnn, cupy,
reference) and takes the first that accepts; if none does, the error lists every candidate with its
reason.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import replace
from types import ModuleType

import numpy as np

from ..core.errors import EngineUnavailableError
from ..core.spec import RNNSpec
from .base import Call, Engine

ENGINE_MODULES: dict[str, str | Engine] = {
    "reference": "arrayrnn.engines.reference",
    "numba": "arrayrnn.engines.numba_engine",
    "cupy": "arrayrnn.engines.cupy_engine",
    "cudnn": "arrayrnn.engines.cudnn_engine",
}
ENGINE_NAMES = ("auto", *ENGINE_MODULES)  # the built-in names (registered test engines come on top)
AUTO_ORDER = {"cpu": ("numba", "reference"), "gpu": ("cudnn", "cupy", "reference")}
CPU_ENGINES = ("reference", "numba")
GPU_ENGINES = ("cupy", "cudnn", "reference")

_WHAT_IT_NEEDS = {
    "reference": "nothing beyond NumPy",
    "numba": "the numba package (pip install numba)",
    "cupy": "a CUDA GPU and CuPy (pip install 'arrayrnn[gpu]')",
    "cudnn": "a CUDA GPU, CuPy and libcudnn v9 (pip install 'arrayrnn[gpu]')",
}


def engine_names() -> tuple[str, ...]:
    """Every name ``engine=`` accepts: ``"auto"`` and each registered engine."""
    return ("auto", *ENGINE_MODULES)


def register_engine(name: str, engine: str | Engine) -> None:
    """Register engine ``name``: a module name exposing ``ENGINE`` (imported lazily) or an Engine itself.

    The same mechanism as the built-in engines; its native format (if not canonical) must be ``name``.
    """
    if not isinstance(name, str) or not name or name in ("auto", "canonical"):
        raise ValueError(f"name = {name!r}; expected a non-empty engine name other than 'auto'/'canonical'")
    if not isinstance(engine, (str, Engine)):
        raise TypeError(f"engine has type {type(engine).__name__}; expected a module name or an Engine")
    ENGINE_MODULES[name] = engine


def unregister_engine(name: str) -> None:
    """Remove an engine added by :func:`register_engine` (built-in names cannot be removed)."""
    if name in ENGINE_NAMES:
        raise ValueError(f"name = {name!r} is a built-in engine; only registered engines can be removed")
    ENGINE_MODULES.pop(name, None)


def is_registered(name: str) -> bool:
    """Whether engine ``name``'s module is part of this installation (does not import it)."""
    module = ENGINE_MODULES.get(name)
    if isinstance(module, Engine):
        return True
    return module is not None and importlib.util.find_spec(module) is not None


def load_engine(name: str) -> Engine:
    """Import engine ``name`` and return its ``ENGINE``; ``EngineUnavailableError`` if it cannot."""
    _check_name(name, allow_auto=False)
    module_name = ENGINE_MODULES[name]
    if isinstance(module_name, Engine):
        return module_name
    if not is_registered(name):
        raise EngineUnavailableError(f"engine = {name!r} is not part of this installation "
                                     f"(module {module_name} is missing); use engine='auto' or "
                                     "engine='reference'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        needs = _WHAT_IT_NEEDS.get(name, f"what module {module_name} imports")
        raise EngineUnavailableError(f"engine = {name!r} cannot be imported ({err}); it needs "
                                     f"{needs}, or use engine='auto'") from err
    return module.ENGINE


def engine_for_format(format: str) -> Engine:
    """The engine whose native format is ``format`` (a format is named after its engine)."""
    if not isinstance(format, str) or format == "canonical" or format not in ENGINE_MODULES:
        raise ValueError(f"format = {format!r}; expected 'canonical' or the name of an engine with its "
                         f"own format (one of {tuple(ENGINE_MODULES)})")
    engine = load_engine(format)
    if engine.native_format != format:
        raise ValueError(f"format = {format!r}; engine {format!r} reads the "
                         f"{engine.native_format!r} format, so {format!r} is not a weight format")
    return engine


def probe_call(spec: RNNSpec, xp: ModuleType = np, **fields) -> Call:
    """A :class:`Call` for ``spec`` on ``xp`` with small defaults (T = B = 1, inference), for probing."""
    base = Call(spec=spec, xp=xp, device=None, seq_len=1, batch=1, training=False, dropout=False,
                params_format="canonical", has_zero_length=False, explicit=True)
    return replace(base, **fields)


def engine_unavailable_reason(name: str, call: Call) -> str | None:
    """``None`` if engine ``name`` can run ``call`` here, else why not."""
    try:
        engine = load_engine(name)
    except EngineUnavailableError as err:
        return str(err)
    return engine.check(call)


def available_engines(spec: RNNSpec, xp: ModuleType = np) -> tuple[str, ...]:
    """Names of the engines that can run ``spec`` on arrays of ``xp`` here (a small inference call)."""
    call = probe_call(spec, xp)
    return tuple(name for name in ENGINE_MODULES if engine_unavailable_reason(name, call) is None)


def select_engine(name: str, call: Call) -> Engine:
    """The engine that runs ``call``: ``name`` itself, or the first candidate of ``"auto"`` that accepts.

    Unknown names are a ``ValueError``; a named engine that cannot run the call is an
    ``EngineUnavailableError`` with its reason; ``"auto"`` with no fitting engine is an
    ``EngineUnavailableError`` listing every candidate with its reason.
    """
    _check_name(name, allow_auto=True)
    if not isinstance(call, Call):
        raise TypeError(f"call has type {type(call).__name__}; expected an arrayrnn.engines.base.Call "
                        "(e.g. arrayrnn.engines.probe_call(spec, xp))")
    if name == "auto":
        return _select_auto(replace(call, explicit=False))
    call = replace(call, explicit=True)
    engine = load_engine(name)
    reason = engine.check(call)
    if reason is not None:
        raise EngineUnavailableError(f"engine = {name!r} cannot run this call: {reason}")
    return engine


def _select_auto(call: Call) -> Engine:
    reasons = []
    for candidate in AUTO_ORDER["cpu" if call.xp is np else "gpu"]:
        reason = engine_unavailable_reason(candidate, call)
        if reason is None:
            return load_engine(candidate)
        reasons.append(f"{candidate}: {reason}")
    raise EngineUnavailableError("engine = 'auto' found no engine for this call; " + "; ".join(reasons))


def _check_name(name: object, allow_auto: bool) -> None:
    names = engine_names() if allow_auto else tuple(ENGINE_MODULES)
    if not isinstance(name, str) or name not in names:
        raise ValueError(f"engine = {name!r}; expected one of {names}")


__all__ = ["AUTO_ORDER", "CPU_ENGINES", "Call", "ENGINE_MODULES", "ENGINE_NAMES", "Engine", "GPU_ENGINES",
           "available_engines", "engine_for_format", "engine_names", "engine_unavailable_reason",
           "is_registered", "load_engine", "probe_call", "register_engine", "select_engine",
           "unregister_engine"]
