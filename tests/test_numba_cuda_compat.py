"""numba-cuda against the NumPy it runs with, checked without a GPU: kernels compile to PTX on the CPU.

numba-cuda (0.30.4 and earlier) registers an overload for ``np.row_stack`` the first time its target
compiles a kernel; NumPy 2.5 removed that alias, and on a GPU machine with NumPy 2.5 every cupy-engine
launch raised AttributeError. :mod:`arrayrnn.engines.cupy.kernels` loads those registries at import with a
stand-in for the alias. Here, in a fresh interpreter whose NumPy lacks ``row_stack``, importing it first
lets a kernel that uses its device functions compile, and leaves NumPy without the alias.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib.metadata import version

from packaging.version import Version

SCRIPT = textwrap.dedent("""
    import numpy as np
    try:
        import scipy.linalg.cython_blas  # numba-cuda imports it while compiling; load it with NumPy whole
    except ImportError:
        pass
    if hasattr(np, "row_stack"):
        del np.row_stack  # NumPy 2.5 as far as numba-cuda can tell
    import numba
    from numba import cuda

    {prelude}

    def scale(x):
        i = cuda.grid(1)
        if i < x.size:
            x[i] = x[i] * 2.0

    try:
        ptx, _ = cuda.compile_ptx(scale, (numba.float32[:],), cc=(9, 0))
        print("compiled", ".entry" in ptx)
    except AttributeError as err:
        print("failed", err)
    print("row_stack", hasattr(np, "row_stack"))
""")


def _run(prelude: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(prelude=prelude)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_kernels_compile_with_a_numpy_that_lacks_row_stack():
    assert _run("import arrayrnn.engines.cupy.kernels") == "compiled True\nrow_stack False\n"


def test_without_the_stand_in_numba_cuda_fails_there():
    """The case above can fail: the same compile, without importing cuda_kernels first, raises on the
    numba-cuda versions known to register the alias (a later one that stops may compile either way)."""
    out = _run("")
    if Version(version("numba-cuda")) <= Version("0.30.4"):
        assert out.startswith("failed ") and "row_stack" in out, out
    else:
        assert out.endswith("row_stack False\n"), out
