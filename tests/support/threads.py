"""numba's thread count in tests: the marker of tests that need two threads (the ``threads`` fixture that
sets the count lives in ``tests/conftest.py``)."""

from __future__ import annotations

import numba
import pytest

needs_two_threads = pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2,
                                       reason="numba has one thread on this machine (NUMBA_NUM_THREADS=1)")
