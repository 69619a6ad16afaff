"""bench/gpu_probe.py on the CPU: its cuDNN and guard checks through the cuDNN dry run (stand-in CuPy, cuDNN
validating every call with a fake handle, the compute calls emulated), so that the probe `.ci/gpu` runs
first on a device is itself known to work (its CuPy-engine checks run in tests_cudasim)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from support.bench_loader import load_bench
from support.cudnn import requires_cudnn

PROBE = Path(__file__).resolve().parent.parent / "bench" / "gpu_probe.py"


@pytest.fixture
def probe(monkeypatch):
    return load_bench(monkeypatch, PROBE)


@requires_cudnn
def test_the_cudnn_and_guard_checks_pass_on_the_dry_run_and_write_each_row(probe, tmp_path):
    from support import cudnn_dry_run

    out = tmp_path / "probe.jsonl"
    report = probe.Report(out)
    with cudnn_dry_run.installed() as cp:
        probe.cudnn_checks(report, cp)
        probe.guard_checks(report, cp, engines=("cudnn",))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == report.rows and len(rows) == 2 * 5 + 1
    assert all(row["ok"] for row in rows), [row for row in rows if not row["ok"]]
    persistent = [row for row in rows if "persist" in row["check"]]
    assert all("cuDNN refused" in row["detail"] for row in persistent)  # the fake handle refuses them


def test_a_failing_check_is_recorded_and_the_next_one_runs(probe, tmp_path):
    report = probe.Report(tmp_path / "probe.jsonl")

    def fails() -> str:
        raise ValueError("broken path")

    report.check("first", fails)
    report.check("second", lambda: "fine")
    assert [(r["check"], r["ok"]) for r in report.rows] == [("first", False), ("second", True)]
    assert report.rows[0]["detail"] == "ValueError: broken path" and "broken path" in report.rows[0]["where"]


def test_without_a_gpu_the_probe_says_so_and_succeeds(probe, capsys):
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here: the probe would look for a device")
    assert probe.main([]) == 0
    assert "no CUDA device with CuPy here" in capsys.readouterr().out
