"""Shared fixtures: the ``engine`` fixture runs a numeric test body on every engine and array module.

``ENGINES`` lists the registered CPU engines (``arrayrnn.engines.engines_for("cpu")``) whose module imports
and that accept a float64 LSTM on NumPy: ``"reference"`` and ``"numba"`` (when numba is installed).
``ENGINE_CASES`` adds the array-module dimension: every CPU engine on NumPy always, and, when CuPy sees a
GPU, every GPU engine (``engines_for("gpu")``) that accepts the probe on CuPy. The fixture's
value is an :class:`EngineOnDevice`: a ``str`` equal to the engine's name (so a body passes it as
``engine=``) that carries ``xp``; ``tests/support/rnn_cases.py`` moves a case's arrays to ``engine.xp``.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from arrayrnn import RNNSpec
from arrayrnn.engines import engine_unavailable_reason, engines_for, probe_call

_PROBE = RNNSpec(mode="lstm", input_size=2, hidden_size=3, dtype="float64")
ENGINES = tuple(name for name in engines_for("cpu")
                if engine_unavailable_reason(name, probe_call(_PROBE)) is None)


class EngineOnDevice(str):
    """An engine name (the ``str`` value) plus the array module its test runs on (``.xp``)."""

    xp: ModuleType

    def __new__(cls, name: str, xp: ModuleType) -> EngineOnDevice:
        self = super().__new__(cls, name)
        self.xp = xp
        return self

    @property
    def label(self) -> str:
        return f"{str(self)}-{self.xp.__name__}"


def _gpu_module() -> ModuleType | None:
    try:
        import cupy
    except ImportError:
        return None
    try:
        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:  # no driver / no device: CuPy imports but cannot run
        return None


def _engine_cases() -> tuple[EngineOnDevice, ...]:
    cases = [EngineOnDevice(name, np) for name in ENGINES]
    cp = _gpu_module()
    if cp is not None:
        cases += [EngineOnDevice(name, cp) for name in engines_for("gpu")
                  if engine_unavailable_reason(name, probe_call(_PROBE, cp)) is None]
    return tuple(cases)


ENGINE_CASES = _engine_cases()


@pytest.fixture(params=ENGINE_CASES, ids=lambda case: case.label)
def engine(request: pytest.FixtureRequest) -> EngineOnDevice:
    """An engine name on an array module; every numeric test takes it so it runs on each engine."""
    return request.param


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)
