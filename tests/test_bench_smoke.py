"""The benchmark's --quick path runs end to end (tiny shapes, one pair; never asserts timings)."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pytest
from support.bench_loader import load_bench

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_rnn.py"
QUICK = ["--quick", "--pairs", "1", "--no-memory", "--no-compile", "--modes", "lstm", "--shapes", "Q2"]


def _load_bench(monkeypatch, path: Path = BENCH):
    return load_bench(monkeypatch, path)


def _table_row(out: str, prefix: str) -> list[str]:
    line = next(line for line in out.splitlines() if line.startswith(prefix))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_bench_quick_runs_and_reports_every_engine(capsys, monkeypatch):
    bench = _load_bench(monkeypatch)
    bench.main(QUICK)
    out = capsys.readouterr().out
    assert "| Q2 | lstm | forward | numba |" in out
    assert "| Q2 | lstm | train | reference |" in out
    assert "GEMM roofline" in out
    peak = re.search(r"FMA peak: (\d+) GFLOP/s", out)
    assert peak and int(peak.group(1)) > 0  # the peak column divides by it
    of_peak = _table_row(out, "| Q2 | lstm | forward | numba |")[12].split("/")[1]
    assert 0 <= float(of_peak.strip(" %")) <= 100


def test_bench_quick_has_ort_columns_and_writes_the_chart(capsys, monkeypatch, tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("matplotlib")
    bench = _load_bench(monkeypatch)
    chart = tmp_path / "ratios.png"
    bench.main([*QUICK, "--chart", str(chart)])
    out = capsys.readouterr().out
    assert "| ORT ms | vs PyTorch | vs ORT | vs faster |" in out
    forward = _table_row(out, "| Q2 | lstm | forward | numba |")
    assert len(forward) == 16
    ort_ms, vs_ort, diff_ort = float(forward[6]), float(forward[8]), float(forward[15])
    assert ort_ms > 0 and vs_ort > 0
    assert diff_ort < 1e-5  # ORT's output equals ours on the same weights
    # per round ours / min(peers) >= ours / each peer, so the medians keep that order (2-decimal cells)
    assert float(forward[9]) >= max(float(forward[7]), vs_ort) - 0.011
    train = _table_row(out, "| Q2 | lstm | train | numba |")
    assert train[6] == train[8] == train[15] == "n/a"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_runs_when_onnxruntime_is_absent(capsys, monkeypatch):
    bench = _load_bench(monkeypatch)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` now raises ImportError
    bench.main(QUICK)
    out = capsys.readouterr().out
    assert "ONNX Runtime columns n/a" in out
    forward = _table_row(out, "| Q2 | lstm | forward | numba |")
    assert forward[6] == forward[8] == forward[15] == "n/a"
    assert forward[9] == forward[7]  # the faster peer is PyTorch alone


def test_step_profile_runs_and_renders_its_table(capsys, monkeypatch):
    profile = _load_bench(monkeypatch, BENCH.with_name("profile_steps.py"))
    profile.main(["--shapes", "S3", "--modes", "gru", "--repeats", "1"])
    row = _table_row(capsys.readouterr().out, "| S3 | gru | train |")
    assert len(row) == 9 and float(row[3]) > 0   # total, then each part with its share


def test_step_profile_takes_lengths_and_times_a_stack_against_its_layers(capsys, monkeypatch):
    profile = _load_bench(monkeypatch, BENCH.with_name("profile_steps.py"))
    monkeypatch.setattr(profile, "SHAPES", {"S1": (6, 5, 4, 8, False), "S4-layer1": (6, 5, 16, 8, False),
                                            "S5": (6, 5, 4, 8, True)})
    monkeypatch.setattr(profile, "STACKS", {"S4": ((6, 5, 4, 8), 2, True)})
    profile.main(["--shapes", "S1,S4-layer1,S4,S5", "--modes", "lstm", "--repeats", "1"])
    out = capsys.readouterr().out
    assert float(_table_row(out, "| S5 | lstm | train |")[3]) > 0
    whole, parts, ratio = (float(v) for v in _table_row(out, "| S4 | lstm | forward |")[3:6])
    assert whole > 0 and ratio == pytest.approx(whole / parts, abs=0.01)


def test_step_profile_refuses_a_stack_without_its_layers_by_name(capsys, monkeypatch):
    """``--shapes S4`` alone used to time everything and then fail with a KeyError in its table."""
    profile = _load_bench(monkeypatch, BENCH.with_name("profile_steps.py"))
    with pytest.raises(SystemExit) as exit_info:
        profile.main(["--shapes", "S1,S4", "--modes", "lstm", "--repeats", "1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--shapes S4 is compared with its layers S1, S4-layer1" in err
    assert "S4-layer1 is not among --shapes S1,S4; pass --shapes S1,S4-layer1,S4" in err


def test_step_profile_reports_each_loops_roofline(capsys, monkeypatch, threads):
    from arrayrnn.engines import thresholds

    threads(2)
    monkeypatch.setattr(thresholds, "COLUMN_SPLIT_MIN_STEP_FMAS", 0)  # 8 rows, 2+ unit groups: columns
    profile = _load_bench(monkeypatch, BENCH.with_name("profile_steps.py"))
    monkeypatch.setattr(profile, "SHAPES", {"B8": (4, 8, 8, 32, False), "B16": (4, 16, 8, 32, False)})
    profile.main(["--shapes", "B8,B16", "--modes", "lstm,gru", "--repeats", "3"])
    out = capsys.readouterr().out
    expected = {"| B8 | lstm | forward loop |": "columns/2", "| B8 | gru | forward loop |": "columns/2",
                "| B16 | lstm | backward loop |": "rows/2", "| B8 | gru | backward loop |": "1 thread"}
    for prefix, split in expected.items():
        row = _table_row(out, prefix)
        assert len(row) == 13 and row[3].startswith(split)
        peak = float(row[3].split("(")[1].rstrip(")"))   # the FMA peak for the loop's threads
        in_loop, *bounds = row[10:]   # GFLOP/s (share of the peak): product in loop, alone, whole loop
        for cell in bounds:
            rate = float(cell.split()[0])
            assert 0 < rate < 1.5 * peak and math.isfinite(rate)
        # the in-loop time is a difference of noisy tiny steps: "n/a" where it is not positive
        if in_loop == "n/a":
            assert float(row[7]) <= 0
        else:
            assert float(row[7]) >= 0 and 0 < float(in_loop.split()[0]) < math.inf
        assert all(float(v) > 0 for v in (row[5], row[6], row[8].rstrip("*")))  # loop, alone, gate math
        if split == "columns/2":  # gate math from the rows split's loop; barrier alone; beside products
            assert row[8].endswith("*") and all(math.isfinite(float(v)) for v in row[9].split(";"))
        else:
            assert row[9] == f"none ({split.split('/')[0]})"
    assert profile.busy_note({1: 100.0, 2: 120.0}) and not profile.busy_note({1: 100.0, 2: 190.0})


def test_wavefront_bench_forces_the_schedule_it_names_and_runs(capsys, monkeypatch):
    import numpy as np

    import arrayrnn as ar
    from arrayrnn.engines.numba import plan

    def schedule(spec, rows, threads, backward=False):
        if backward:
            return plan.backward_plan(spec, rows, threads).schedule
        x = np.zeros((3, rows, spec.input_size), np.float32)
        return plan.forward_plan(spec, x, np.full(3, rows), None, threads).schedule

    bench = _load_bench(monkeypatch, BENCH.parent / "bench_wavefront.py")
    bi = ar.RNNSpec("gru", 4, 4, num_layers=2, bidirectional=True)
    deep = ar.RNNSpec("gru", 4, 4, num_layers=2)
    with bench._setting("wavefront"):
        assert schedule(bi, 1, 2) == schedule(bi, 64, 2, backward=True) == "directions"
        assert schedule(deep, 64, 2) == "layers" and schedule(deep, 1, 2, backward=True) is None
    with bench._setting("layers"):
        assert schedule(bi, 8, 2) is None and ar.get_num_threads() == 2
    with bench._setting("1 thread"):
        assert ar.get_num_threads() == 1
    assert schedule(bi, 8, 2) == "directions"  # restored
    monkeypatch.setattr(bench, "CASES", ((5, 2, 3, 4),))
    bench.main(["--rounds", "1", "--modes", "gru"])
    out = capsys.readouterr().out
    assert "| gru 2 layers | 5, 2, 3, 4 | forward |" in out
    assert "| gru 2 layers bi | 5, 2, 3, 4 | train |" in out


def test_the_layer_norm_bench_times_the_loop_it_checked(monkeypatch):
    """bench_layer_norm's PyTorch loop computes arrayrnn's layer-normalised LSTM (float64), so its row
    compares the same function."""
    bench = _load_bench(monkeypatch, BENCH.parent / "bench_layer_norm.py")
    assert bench.check_the_loop() < 1e-10


def test_the_guard_bench_runs_and_reports_each_row(capsys, monkeypatch):
    """bench_guard imported a class the guard no longer had; it now runs its rows (one repeat here)."""
    bench = _load_bench(monkeypatch, BENCH.parent / "bench_guard.py")
    monkeypatch.setattr(bench, "_case", lambda T, B, I, H: _small_case(min(T, 3), min(B, 2), 4, 5))
    monkeypatch.setattr(sys, "argv", ["bench_guard", "--repeats", "1"])
    bench.main()
    out = capsys.readouterr().out
    for row in ("| S1 training step", "| guard (snapshot + check", "| S1 inference forward",
                "| T=1 B=1 H=64 inference forward", "| its snapshot ("):
        assert row in out


def _small_case(T, B, I, H):
    import numpy as np

    import arrayrnn as ar

    spec = ar.RNNSpec(mode="lstm", input_size=I, hidden_size=H, dtype="float32")
    return ar.PackedParams.init(spec, seed=0), np.ones((T, B, I), np.float32)


def test_the_streaming_bench_runs_every_row_and_the_two_sides_agree(capsys, monkeypatch):
    bench = _load_bench(monkeypatch, BENCH.parent / "bench_streaming.py")
    monkeypatch.setattr(sys, "argv", ["bench_streaming", "--rounds", "1", "--batch-ms", "1"])
    import torch

    import arrayrnn as ar

    threads = (ar.get_num_threads(), torch.get_num_threads())
    try:
        bench.main()  # sets one thread for both sides
    finally:
        ar.set_num_threads(threads[0])
        torch.set_num_threads(threads[1])
    rows = [line for line in capsys.readouterr().out.splitlines() if ", T = 1" in line]
    assert len(rows) == 16 and sum("train, T = 1" in line for line in rows) == 8
    for line in rows:  # the same weights on both sides: outputs, and the training rows' W_ih gradients
        assert float(line.strip("|").split("|")[-1]) < 1e-5


def test_the_small_calls_bench_times_the_cell_step_rows_it_is_asked_for(capsys, monkeypatch):
    bench = _load_bench(monkeypatch, BENCH.parent / "bench_small_calls.py")
    import torch

    import arrayrnn as ar

    threads = (ar.get_num_threads(), torch.get_num_threads())
    try:
        bench.main(["--only", "cell step", "--sizes", "16,24", "--rounds", "1", "--batch-ms", "1",
                    "--no-warmup"])
    finally:
        ar.set_num_threads(threads[0])
        torch.set_num_threads(threads[1])
    out = capsys.readouterr().out
    rows = [line.strip("|").split("|") for line in out.splitlines() if "cell step" in line]
    shapes = [(r[0].strip(), int(r[2]), int(r[3])) for r in rows]
    assert shapes == [(kind, B, H) for kind in ("cell step", "gru cell step") for H in (16, 24)
                      for B in (1, 8)]  # LSTMCell and GRUCell, B in {1, 8} for each H asked for
    for r in rows:
        assert "<= 1.2" in r[7] and float(r[8]) < 1e-5  # issue 46's target; the sides agree
    assert "(default setting: no warmup)" in out


def test_the_gemm_blocking_bench_times_every_budget_and_tunes(capsys, monkeypatch, tmp_path):
    from arrayrnn.engines.numba import blocking, gemm_tuning

    bench = _load_bench(monkeypatch, BENCH.parent / "bench_gemm_blocking.py")
    monkeypatch.setattr(blocking, "record_path", lambda: tmp_path / blocking.RECORD_NAME)
    try:
        bench.main(["--rounds", "1", "--shapes", "7x40x24x4,3x9x16x3", "--peak", "100"])
    finally:
        blocking.reload()
    out = capsys.readouterr().out
    rows = [_table_row(out, f"| {shape} ") for shape in ("7x40x24x4", "3x9x16x3")]
    assert all(len(r) == 1 + len(gemm_tuning._candidates()) for r in rows)
    assert "tuning pass (forced): keeps" in out and (tmp_path / blocking.RECORD_NAME).exists()
