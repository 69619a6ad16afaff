"""Shared fixtures: the ``engine`` fixture runs a numeric test body on every engine and array module.

``ENGINES`` lists the registered CPU engines (``arrayrnn.engines.engines_for("cpu")``) whose module imports
and that accept a float64 LSTM on NumPy: ``"reference"`` and ``"numba"`` (when numba is installed).
``ENGINE_CASES`` adds the array-module dimension (:mod:`support.engine_cases`): every CPU engine on NumPy
always; with a GPU, every GPU engine on CuPy (marked ``gpu``); without one, the cuDNN engine's dry run on
the CuPy stand-in. The fixture's value is an :class:`~support.engine_cases.EngineOnDevice`: a ``str`` equal
to the engine's name (so a body passes it as ``engine=``) that carries ``xp``; ``tests/support/rnn_cases.py``
moves a case's arrays to ``engine.xp`` and keeps the results there.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

# Two settings (docs/guide/install.md). The waiting one (the default here): engine='auto' picks the numba
# engine and waits for its compile, so engine choices do not depend on timing (test_warmup.py runs the
# background compile in child processes of its own). ARRAYRNN_TEST_SETTING=default runs as a user's new
# process does: the background compile on and numba's cache empty (a fresh directory, unless
# NUMBA_CACHE_DIR is given), so 'auto' runs the reference engine until each family has loaded; a test that
# needs 'auto' to have reached numba says so (the ``auto_takes_numba`` fixture), and runs in both settings.
SETTING = os.environ.get("ARRAYRNN_TEST_SETTING", "waiting")
if SETTING == "default":
    os.environ.pop("ARRAYRNN_BACKGROUND_COMPILE", None)
    os.environ.setdefault("NUMBA_CACHE_DIR", tempfile.mkdtemp(prefix="arrayrnn-empty-numba-cache-"))
elif SETTING == "waiting":
    os.environ.setdefault("ARRAYRNN_BACKGROUND_COMPILE", "0")
else:
    raise ValueError(f"ARRAYRNN_TEST_SETTING = {SETTING!r}; expected 'waiting' (or unset) or 'default'")

# the setting is chosen before arrayrnn (and numba, which reads NUMBA_CACHE_DIR) is imported
from support.engine_cases import EngineOnDevice, cpu_engines, dry_run_cases, engine_fixture, gpu_cases  # noqa: E402

import arrayrnn as ar  # noqa: E402
from arrayrnn.engines import forget_choices, thread_count, thresholds  # noqa: E402

ENGINES = cpu_engines()
ENGINE_CASES = (*(EngineOnDevice(name, np) for name in ENGINES), *gpu_cases(), *dry_run_cases())
engine = engine_fixture(list(ENGINE_CASES))


@pytest.fixture(autouse=True)
def _fresh_engine_choices():
    """select_engine remembers its answer per configuration; tests that switch an engine off (monkeypatching
    its check, its library) start from a clean slate."""
    forget_choices()
    yield
    forget_choices()


@pytest.fixture
def auto_takes_numba(monkeypatch):
    """``engine='auto'`` takes the numba engine as if every family had loaded (in the default setting the
    calls then compile on the calling thread, as ``engine='numba'`` does)."""
    from arrayrnn.engines.numba import warmup

    monkeypatch.setattr(warmup, "loaded", lambda call: True)
    forget_choices()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)


@pytest.fixture
def threads(monkeypatch):
    """Sets the engine's thread count for the test (``arrayrnn.set_num_threads``; the engines read it per
    call); restores what was set before, or the default, after. A test that sets the threads exercises their
    splits on its small shapes: every call may split (``MIN_SPLIT_CALL_FMAS = 0``; the rule itself is
    tested in tests/test_loop_threads.py)."""
    monkeypatch.setattr(thread_count, "_explicit", thread_count._explicit)
    monkeypatch.setattr(thresholds, "MIN_SPLIT_CALL_FMAS", 0)
    return ar.set_num_threads


@pytest.fixture
def dynamo_allow_rnn():
    """``torch._dynamo.config.allow_rnn = True`` for the test: ``torch.compile`` then traces ``nn.LSTM`` /
    ``GRU`` / ``RNN`` modules, the drop-ins (their subclasses) included, instead of breaking the graph."""
    import torch._dynamo

    with torch._dynamo.config.patch(allow_rnn=True):
        yield
