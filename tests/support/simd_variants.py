"""The SIMD variants this CPU can run, and a check run under another one in a subprocess (numba compiles
for one variant per process: ``ARRAYRNN_SIMD`` and numba's target features are read at import)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from llvmlite import binding as llvm

NUMBA_TARGET = {"avx2": {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": "+avx,+avx2,+fma,+sse4.2"},
                "avx512": {}, "portable": {}}

TESTS = Path(__file__).resolve().parent.parent


def runnable_variants() -> list[str]:
    host = {name for name, on in llvm.get_host_cpu_features().items() if on}
    out = ["portable"]
    if {"avx2", "fma"} <= host:
        out.append("avx2")
    if {"avx512f", "fma"} <= host:
        out.append("avx512")
    return out


def errors_in_variant(variant: str, test_module: str) -> tuple[float, float]:
    """``test_module.check_shapes`` for float32 and float64, run in a subprocess compiled for ``variant``."""
    env = dict(os.environ, ARRAYRNN_SIMD=variant, **NUMBA_TARGET[variant])
    code = (f"import sys, numpy as np; sys.path.insert(0, {str(TESTS)!r}); import {test_module} as t; "
            f"from arrayrnn.engines.numba import simd_ir; assert simd_ir.VARIANT == {variant!r}; "
            "print(t.check_shapes(np.float32), t.check_shapes(np.float64))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    err32, err64 = map(float, done.stdout.split())
    return err32, err64
