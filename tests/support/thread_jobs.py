"""The engine-thread scenarios of tests/support/engine_threads_child.py, each in its own process with a
watchdog (tests/test_workers.py, tests/test_thread_count.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHILD = ROOT / "tests" / "support" / "engine_threads_child.py"


def run_child(*args: str, threads: int | None = 2, timeout: float = 240, **env: str) -> str:
    """Run the child scenario with ``threads`` engine threads (None: the variables unset); its stdout, or a
    failure naming the hang."""
    full = {k: v for k, v in os.environ.items() if k not in ("ARRAYRNN_NUM_THREADS", "NUMBA_NUM_THREADS")}
    if threads is not None:
        full.update(ARRAYRNN_NUM_THREADS=str(threads), NUMBA_NUM_THREADS=str(threads))
    # the scenarios exercise the numba engine's hand-off: the child waits for numba's compile, in either
    # test setting (a new process's first minutes, on the reference engine, are test_warmup's)
    full.update(PYTHONPATH=str(ROOT), ARRAYRNN_BACKGROUND_COMPILE="0", **env)
    try:
        proc = subprocess.run([sys.executable, str(CHILD), *args], cwd=ROOT, env=full, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"{' '.join(args)} with {threads} threads hung (killed after {timeout} s): "
                    f"{(err.stdout or b'')[-2000:]!r}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.splitlines()[-1] == "ok", proc.stdout
    return proc.stdout
