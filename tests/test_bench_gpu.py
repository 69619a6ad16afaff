"""bench/bench_gpu.py's CPU-checkable parts: which rows it measures and how it pins TF32 (the benchmark itself
needs a GPU; `.ci/gpu` runs it)."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path

import pytest

from arrayrnn.engines.cudnn import config as cudnn_config

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_gpu.py"


@pytest.fixture
def bench(monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_gpu", BENCH)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_gpu", module)
    spec.loader.exec_module(module)
    return module


def test_like_for_like_rows_pin_tf32_off_on_both_sides_and_tf32_rows_allow_it(bench):
    torch = pytest.importorskip("torch")
    torch.backends.cudnn.allow_tf32 = True  # PyTorch's default
    for tf32 in (False, True):
        with bench.precision(tf32=tf32):
            assert torch.backends.cudnn.allow_tf32 is tf32 and torch.backends.cuda.matmul.allow_tf32 is tf32
            assert cudnn_config.allow_tf32 is tf32
    assert torch.backends.cudnn.allow_tf32 is True and cudnn_config.allow_tf32 is False  # restored


def test_tf32_rows_are_separate_and_cudnn_only(bench):
    for quick in (False, True):
        rows = bench.plan(quick)
        fp32 = [r for r in rows if r[3] == "fp32"]
        tf32 = [r for r in rows if r[3] == "tf32"]
        assert {r[0] for r in fp32} == {"cudnn", "cupy"} and {r[0] for r in tf32} == {"cudnn"}
        assert {(r[1], r[2]) for r in tf32} <= {(r[1], r[2]) for r in fp32}
    assert {r[2] for r in bench.plan(True)} == {"S1", "S1-B256", "S3", "S3-B256"}
    assert {r[2] for r in bench.plan(True) if r[3] == "tf32"} == {"S1", "S1-B256", "S3", "S3-B256"}


def test_every_planned_row_is_measured(bench, monkeypatch, capsys):
    """No row is skipped by the bench itself (a check for the GPU wings' files before their move skipped
    every row of an H200 run, 2026-11-30): each planned row reaches the measurement, in its precision."""
    measured = []

    def fake_case(engine, mode, shape, pairs):
        measured.append((engine, mode, shape, cudnn_config.allow_tf32))
        return dict(forward=1.0, train_step=1.0, forward_host_us=1.0, forward_torch_host_us=1.0,
                    train_step_host_us=1.0, train_step_torch_host_us=1.0, algo="-")

    monkeypatch.setattr(bench, "_case", fake_case)
    monkeypatch.setattr(bench, "precision", lambda tf32: _pinned(tf32))
    assert bench.main(["--quick"]) == 0
    shapes = bench._shapes(True)
    assert measured == [(e, m, shapes[n], p == "tf32") for e, m, n, p in bench.plan(True)]
    assert "skipped" not in capsys.readouterr().out


@contextlib.contextmanager
def _pinned(tf32):
    before, cudnn_config.allow_tf32 = cudnn_config.allow_tf32, tf32
    try:
        yield
    finally:
        cudnn_config.allow_tf32 = before


def test_the_timeline_measures_the_union_of_gpu_intervals(bench):
    trace = {"traceEvents": [
        {"cat": "kernel", "ts": 0, "dur": 10}, {"cat": "kernel", "ts": 5, "dur": 10},   # overlap: 0..15
        {"cat": "gpu_memcpy", "ts": 20, "dur": 5}, {"cat": "cpu_op", "ts": 0, "dur": 100},  # host op: ignored
        {"cat": "gpu_memset", "ts": 24, "dur": 2}, {"cat": "kernel", "ts": 30}]}  # no duration: ignored
    assert bench._busy_us(trace) == (21.0, 4)


def test_ci_gpu_phases_are_bounded_to_fit_one_device_call_with_room():
    """`.ci/gpu` runs in one device call (10 minutes at most): each phase under `timeout`, the defaults
    summing to at most 9 minutes less a minute for the install and the versions."""
    import re

    script = (BENCH.parent.parent / ".ci" / "gpu").read_text()
    defaults = {name: int(value) for name, value in re.findall(r"\$\{(\w+_TIMEOUT):-(\d+)\}", script)}
    assert set(defaults) == {"PROBE_TIMEOUT", "TEST_TIMEOUT", "BENCH_TIMEOUT"}
    assert sum(defaults.values()) <= 8 * 60
    phase = re.compile(r"bench/gpu_probe|-m pytest|bench/bench_gpu")
    phases = [line for line in script.splitlines() if phase.search(line) and not line.startswith("#")]
    assert len(phases) == 3 and all(line.startswith("timeout ") for line in phases)
