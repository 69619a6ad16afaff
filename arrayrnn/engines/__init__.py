"""Engines and :func:`select_engine`, the one place that chooses which engine runs a call.

Every engine is a module of this package exposing ``ENGINE``, an :class:`~arrayrnn.engines.base.Engine`
(see :mod:`arrayrnn.engines.base` for the interface). The known engines and their modules are listed in
:data:`ENGINE_MODULES`; an engine is *registered* when its module is part of the installation, and
*available* when it imports (its optional dependency is installed) and its ``unavailable_reason`` for
the spec and array module is ``None``. Modules are imported lazily, on first selection.

``"auto"``: on CPU the numba engine when it is available, else the reference engine; on GPU cuDNN where
it can run the spec and wants the call (``Engine.auto_ok``: supported configuration, sequence long
enough), else cupy, else the reference engine (which runs on CuPy too).
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

import numpy as np

from ..errors import EngineUnavailableError
from ..spec import RNNSpec
from .base import Engine

ENGINE_MODULES = {
    "reference": "arrayrnn.engines.reference",
    "numba": "arrayrnn.engines.numba_engine",
    "cupy": "arrayrnn.engines.cupy_engine",
    "cudnn": "arrayrnn.engines.cudnn_engine",
}
ENGINE_NAMES = ("auto", *ENGINE_MODULES)
AUTO_ORDER = {"cpu": ("numba", "reference"), "gpu": ("cudnn", "cupy", "reference")}
CPU_ENGINES = ("reference", "numba")

_WHAT_IT_NEEDS = {
    "reference": "nothing beyond NumPy",
    "numba": "the numba package (pip install numba)",
    "cupy": "a CUDA GPU and CuPy (pip install 'arrayrnn[gpu]')",
    "cudnn": "a CUDA GPU, CuPy and libcudnn v9 (pip install 'arrayrnn[gpu]')",
}


def is_registered(name: str) -> bool:
    """Whether engine ``name``'s module is part of this installation (does not import it)."""
    module = ENGINE_MODULES.get(name)
    return module is not None and importlib.util.find_spec(module) is not None


def load_engine(name: str) -> Engine:
    """Import engine ``name`` and return its ``ENGINE``; ``EngineUnavailableError`` if it cannot."""
    _check_name(name)
    module_name = ENGINE_MODULES[name]
    if not is_registered(name):
        raise EngineUnavailableError(f"engine = {name!r} is not part of this installation "
                                     f"(module {module_name} is missing); use engine='auto' or "
                                     "engine='reference'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise EngineUnavailableError(f"engine = {name!r} cannot be imported ({err}); it needs "
                                     f"{_WHAT_IT_NEEDS[name]}, or use engine='auto'") from err
    return module.ENGINE


def engine_unavailable_reason(name: str, spec: RNNSpec, xp: ModuleType) -> str | None:
    """``None`` if engine ``name`` can run ``spec`` on arrays of ``xp``, else why not."""
    try:
        engine = load_engine(name)
    except EngineUnavailableError as err:
        return str(err)
    return engine.unavailable_reason(spec, xp)


def available_engines(spec: RNNSpec, xp: ModuleType = np) -> tuple[str, ...]:
    """Names of the engines that can run ``spec`` on arrays of ``xp`` here."""
    return tuple(name for name in ENGINE_MODULES if engine_unavailable_reason(name, spec, xp) is None)


def select_engine(name: str, spec: RNNSpec, xp: ModuleType, *, seq_len: int | None = None,
                  params_format: str = "canonical") -> Engine:
    """The engine that runs a call: ``name`` itself, or the best available one for ``"auto"``.

    Unknown names are a ``ValueError``; a known engine that cannot run here is an
    ``EngineUnavailableError`` naming what is missing; an engine that cannot read the params' format is a
    ``ValueError`` saying how to convert them.
    """
    _check_name(name)
    if name == "auto":
        return _select_auto(spec, xp, seq_len, params_format)
    engine = load_engine(name)
    reason = engine.unavailable_reason(spec, xp)
    if reason is not None:
        raise EngineUnavailableError(f"engine = {name!r} cannot run here: {reason}")
    if not engine.supports_format(params_format):
        raise ValueError(f"params.format = {params_format!r} but engine = {name!r} reads the canonical "
                         "layout; pass params.to_format('canonical') or choose the engine of that format")
    return engine


def _select_auto(spec: RNNSpec, xp: ModuleType, seq_len: int | None, params_format: str) -> Engine:
    reasons = []
    for candidate in AUTO_ORDER["cpu" if xp is np else "gpu"]:
        reason = engine_unavailable_reason(candidate, spec, xp)
        if reason is not None:
            reasons.append(f"{candidate}: {reason}")
            continue
        engine = load_engine(candidate)
        if engine.supports_format(params_format) and engine.auto_ok(spec, xp, seq_len):
            return engine
    raise EngineUnavailableError("engine = 'auto' found no engine for this call: " + "; ".join(reasons))


def _check_name(name: object) -> None:
    if not isinstance(name, str) or name not in ENGINE_NAMES:
        raise ValueError(f"engine = {name!r}; expected one of {ENGINE_NAMES}")


__all__ = ["CPU_ENGINES", "ENGINE_MODULES", "ENGINE_NAMES", "Engine", "available_engines",
           "engine_unavailable_reason", "is_registered", "load_engine", "select_engine"]
