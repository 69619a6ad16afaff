"""bench/gpu_host_cupy.py runs end to end on CPU, its paths are the ones it names, and what it counts per call
is the structure each path promises (never asserts timings): numba-cuda's dispatcher launching every step's
kernel, the packed launches doing the same without it, and a replayed graph launching none, with the same
operations at every T."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.bench_loader import load_bench

BENCH = Path(__file__).resolve().parent.parent / "bench" / "gpu_host_cupy.py"


@pytest.fixture
def bench(monkeypatch):
    module = load_bench(monkeypatch, BENCH)
    monkeypatch.setattr(module, "SHAPES", {"short": 3, "long": 8})
    return module


def test_each_path_issues_what_it_promises(bench):
    rows = bench.rows(quick=True)
    by_path: dict[str, dict] = {}
    for r in rows:
        assert r["us_per_call"] > 0 and r["us_per_step"] == pytest.approx(r["us_per_call"] / r["steps"])
        by_path.setdefault(r["engine"], {})[(r["shape"], r["what"])] = r
    assert {"cupy (step by step)", "cupy (graph)"} <= set(by_path)
    assert set(by_path) == {"cupy (step by step)", "cupy (graph)"}  # no other revision unless asked for
    # per step, a forward's kernels, then a training step's (forward and backward): the fused gate kernel and
    # the GEMM's own kernel, as CuPy refuses cuBLAS in a capture (issue 44)
    for (shape, what), r in by_path["cupy (step by step)"].items():
        expected = r["steps"] * (2 if what == "forward" else 4)
        assert r["kernel_launches"] == expected, (shape, what)
    graph = by_path["cupy (graph)"]
    for what in ("forward", "train_step"):
        assert graph[("short", what)]["kernel_launches"] == graph[("long", what)]["kernel_launches"] == 0
        assert graph[("short", what)]["cupy_ops"] == graph[("long", what)]["cupy_ops"]


def test_a_revision_without_the_engine_file_is_refused_by_name(bench):
    """``--before`` names a git revision whose ``arrayrnn/engines/cupy/engine.py`` the row runs; one without
    that file (before the GPU wings' move, or none at all) is an error naming it, never a skipped row."""
    with pytest.raises(ValueError, match=r"--before 0000000: git has no arrayrnn/engines/cupy/engine.py"):
        bench.rows(quick=True, before="0000000")
