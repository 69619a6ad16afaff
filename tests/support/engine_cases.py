"""The engines a shared test body runs on, each with the array module it runs on (the ``engine`` fixture).

An :class:`EngineOnDevice` is a ``str`` equal to the engine's name (so a body passes it as ``engine=``) that
carries ``xp``, and, for an engine run on CPU in place of a GPU, the ``stand_in`` that makes that possible
(entered for the duration of each test):

- every CPU engine on NumPy;
- with a GPU, every GPU engine on CuPy (marked ``gpu``, so ``.ci/gpu``'s ``pytest -m gpu`` runs them);
- without a GPU, ``"cudnn"`` on the NumPy-backed CuPy stand-in with cuDNN validating every call and the
  compute calls emulated (:mod:`support.cudnn_dry_run`) where libcudnn loads, and ``"cupy"`` on the stand-in
  under numba's CUDA simulator (:mod:`support.cupy_sim`, the ``tests_cudasim`` run).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from arrayrnn import RNNSpec
from arrayrnn.engines import engine_unavailable_reason, engines_for, probe_call

from . import fake_cupy

_PROBE = RNNSpec(mode="lstm", input_size=2, hidden_size=3, dtype="float64")


class EngineOnDevice(str):
    """An engine name (the ``str`` value), the array module its test runs on (``.xp``) and, for a GPU engine
    run on CPU, the context manager factory that stands in for the GPU (``.stand_in``)."""

    xp: ModuleType
    stand_in: Callable[[], Any] | None
    label: str

    def __new__(cls, name: str, xp: ModuleType, stand_in: Callable[[], Any] | None = None,
                label: str | None = None) -> EngineOnDevice:
        self = super().__new__(cls, name)
        self.xp, self.stand_in = xp, stand_in
        self.label = label or f"{name}-{xp.__name__}"
        return self

    def activate(self) -> contextlib.AbstractContextManager:
        return self.stand_in() if self.stand_in is not None else contextlib.nullcontext()


def cpu_engines() -> tuple[str, ...]:
    """The registered CPU engines that import and accept a float64 LSTM on NumPy."""
    return tuple(name for name in engines_for("cpu")
                 if engine_unavailable_reason(name, probe_call(_PROBE)) is None)


def _gpu_module() -> ModuleType | None:
    try:
        import cupy
    except ImportError:
        return None
    try:
        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:  # no driver / no device: CuPy imports but cannot run
        return None


def gpu_cases() -> list[EngineOnDevice]:
    """Every GPU engine that accepts the probe on CuPy, when CuPy sees a GPU."""
    cp = _gpu_module()
    if cp is None:
        return []
    return [EngineOnDevice(name, cp) for name in engines_for("gpu")
            if engine_unavailable_reason(name, probe_call(_PROBE, cp)) is None]


def dry_run_cases() -> list[EngineOnDevice]:
    """``"cudnn"`` on the CuPy stand-in (the dry run), where libcudnn loads and no GPU is present."""
    import cudnn_bindings as cb

    if _gpu_module() is not None or not cb.is_available():
        return []
    from . import cudnn_dry_run

    return [EngineOnDevice("cudnn", fake_cupy.MODULE, cudnn_dry_run.installed, "cudnn-dryrun")]


def cudasim_cases() -> list[EngineOnDevice]:
    """``"cupy"`` on the CuPy stand-in under numba's CUDA simulator (only in the simulator's process)."""
    from . import cupy_sim

    return [EngineOnDevice("cupy", fake_cupy.MODULE, cupy_sim.installed, "cupy-cudasim")]


def as_params(cases: list[EngineOnDevice]) -> list[Any]:
    """``pytest.param`` per case: the GPU ones marked ``gpu``."""
    return [pytest.param(case, id=case.label,
                         marks=[pytest.mark.gpu] if case.xp is not np and case.stand_in is None else [])
            for case in cases]


def engine_fixture(cases: list[EngineOnDevice]) -> Any:
    """The ``engine`` fixture over ``cases`` (a conftest assigns it to the name ``engine``)."""
    @pytest.fixture(params=as_params(cases), name="engine")
    def engine(request: pytest.FixtureRequest):
        """An engine name on an array module (its stand-in entered for the test, if any); every numeric test
        takes it so it runs on each engine."""
        with request.param.activate():
            yield request.param

    return engine
