"""Shared fixtures: the ``engine`` fixture runs a numeric test body on every CPU engine that can run here.

``ENGINES`` lists the registered CPU engines (``arrayrnn.engines.CPU_ENGINES``) whose module imports and
that accept a float64 LSTM on NumPy: today ``"reference"``, and ``"numba"`` once its module exists and
numba is installed.
"""

from __future__ import annotations

import numpy as np
import pytest

from arrayrnn import RNNSpec
from arrayrnn.engines import CPU_ENGINES, engine_unavailable_reason

_PROBE = RNNSpec(mode="lstm", input_size=2, hidden_size=3, dtype="float64")
ENGINES = tuple(name for name in CPU_ENGINES if engine_unavailable_reason(name, _PROBE, np) is None)


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    """Name of a CPU engine; every numeric test takes it so it runs on each engine."""
    return request.param


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)
