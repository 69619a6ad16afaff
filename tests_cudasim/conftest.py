"""The CUDA-simulator suite: the cupy engine's numba-CUDA kernels executed on CPU.

Run in its OWN pytest process, with the simulator switched on before numba's CUDA module is imported::

    NUMBA_ENABLE_CUDASIM=1 python -m pytest -q tests_cudasim

(the main ``python -m pytest`` collects only ``tests/``). Without the variable this suite refuses to run,
rather than compiling for a GPU that is not there or silently testing nothing.

The ``engine`` fixture here is the cupy engine on the CuPy stand-in under the simulator
(:func:`support.engine_cases.cudasim_cases`), for the shared suites of ``tests/`` that
``test_shared_suites.py`` collects again; ``tests/`` is put on ``sys.path`` for their ``support`` helpers.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
os.environ.setdefault("ARRAYRNN_BACKGROUND_COMPILE", "0")  # engine='auto' waits for numba, as in tests/


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        raise pytest.UsageError("tests_cudasim needs numba's CUDA simulator: run it as "
                                "NUMBA_ENABLE_CUDASIM=1 python -m pytest -q tests_cudasim")
    import numba

    if not numba.config.ENABLE_CUDASIM:
        raise pytest.UsageError("NUMBA_ENABLE_CUDASIM=1 is set but numba was configured before it; "
                                "start a fresh process")


def _engine():
    from support.engine_cases import cudasim_cases, engine_fixture

    return engine_fixture(cudasim_cases())


engine = _engine()  # the cupy engine on stand-in CuPy arrays, its kernels in the simulator


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)


@pytest.fixture(autouse=True)
def _fresh_engine_choices():
    """select_engine remembers its answer per configuration; each test starts from a clean slate."""
    from arrayrnn.engines import forget_choices

    forget_choices()
    yield
    forget_choices()
