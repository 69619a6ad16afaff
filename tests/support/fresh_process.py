"""A script in a new process, as a user's first one runs: background compile on, numba's cache empty."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_fresh(script: str, tmp_path: Path, timeout: float = 900, root: Path = ROOT,
              **env: str) -> subprocess.CompletedProcess:
    """``script`` in a fresh process importing arrayrnn from ``root``, with background compile on and an empty
    numba cache in ``tmp_path`` unless ``env`` says otherwise."""
    env = {**os.environ, "ARRAYRNN_BACKGROUND_COMPILE": "1", "NUMBA_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]), **env}
    return subprocess.run([sys.executable, "-W", "error", "-c", textwrap.dedent(script)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=timeout)
