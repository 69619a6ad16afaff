"""Multi-process jobs of the data-parallel tests (tests/test_distributed*.py): each runs in its own process
group with a timeout; on timeout the whole group is killed and the test fails."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120


def mpiexec() -> str:
    """The ``mpiexec`` beside this Python or on PATH (the test is skipped without mpi4py)."""
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (pip install 'arrayrnn[mpi]')")
    local = Path(sys.executable).parent / "mpiexec"
    found = str(local) if local.exists() else shutil.which("mpiexec")
    assert found, "mpi4py imports but no mpiexec was found next to python or on PATH"
    return found


def run_job(cmd: list[str], timeout: float = TIMEOUT, cwd: Path = ROOT,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd`` in a new session; kill its whole process group on timeout or when done. ``env``: the
    child's environment (default: this one with the repository on PYTHONPATH and one BLAS/OpenMP thread)."""
    if env is None:
        env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not end within {timeout} s (killed); stdout:\n{out[-2000:]}\n"
                    f"stderr:\n{err[-2000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
