"""The benchmark's --quick path runs end to end (tiny shapes, one pair; never asserts timings)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_rnn.py"


def test_bench_quick_runs_and_reports_every_engine(capsys, monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_rnn", BENCH)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_rnn", bench)  # dataclasses look their module up there
    spec.loader.exec_module(bench)
    bench.main(["--quick", "--pairs", "1", "--no-memory", "--no-compile", "--modes", "lstm",
                "--shapes", "Q2"])
    out = capsys.readouterr().out
    assert "| Q2 | lstm | forward | numba |" in out
    assert "| Q2 | lstm | train | reference |" in out
    assert "GEMM roofline" in out
