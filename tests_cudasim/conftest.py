"""The CUDA-simulator suite: the cupy engine's numba-CUDA kernels executed on CPU.

Run in its OWN pytest process, with the simulator switched on before numba's CUDA module is imported::

    NUMBA_ENABLE_CUDASIM=1 python -m pytest -q tests_cudasim

(the main ``python -m pytest`` collects only ``tests/``). Without the variable this suite refuses to run,
rather than compiling for a GPU that is not there or silently testing nothing.
"""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        raise pytest.UsageError("tests_cudasim needs numba's CUDA simulator: run it as "
                                "NUMBA_ENABLE_CUDASIM=1 python -m pytest -q tests_cudasim")
    import numba

    if not numba.config.ENABLE_CUDASIM:
        raise pytest.UsageError("NUMBA_ENABLE_CUDASIM=1 is set but numba was configured before it; "
                                "start a fresh process")
