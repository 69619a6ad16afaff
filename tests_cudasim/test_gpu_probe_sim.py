"""bench/gpu_probe.py's CuPy-engine and guard checks on the CuPy stand-in under numba's CUDA simulator: the
probe `.ci/gpu` runs first on a device is itself known to work (its cuDNN checks run in tests/)."""

from __future__ import annotations

from pathlib import Path

from support import cupy_sim
from support.bench_loader import load_bench

from arrayrnn.engines.cupy.engine import ENGINE

PROBE = Path(__file__).resolve().parent.parent / "bench" / "gpu_probe.py"


def test_the_cupy_engine_and_guard_checks_pass_step_by_step_captured_and_replayed(monkeypatch):
    probe = load_bench(monkeypatch, PROBE)
    report = probe.Report(None)
    with cupy_sim.installed(capture_after=1) as cp:
        probe.cupy_checks(report, cp)
        probe.guard_checks(report, cp, engines=("cupy",))
    ENGINE.kernel.graphs.clear()
    assert [row["check"] for row in report.rows] == [
        "cupy lstm plain", "cupy lstm rdrop+zoneout", "cupy gru plain", "cupy gru rdrop+zoneout",
        "guard cupy"]
    assert all(row["ok"] for row in report.rows), [row for row in report.rows if not row["ok"]]
