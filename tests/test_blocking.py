"""The packed GEMM's K blocking per CPU: the default from L1, the tuning pass, its record by numba's cache.

The bits never depend on the budget (tests/test_packed_gemm.py); here: which budget a process uses, that the
tuning pass keeps the measured best (or the default within noise), and that a missing, corrupt or foreign
record never breaks a call.
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest
from support.fresh_process import run_fresh

from arrayrnn.engines.numba import blocking, gemm_tuning, warmup
from arrayrnn.frontend import compile_ahead


@pytest.fixture
def record(tmp_path, monkeypatch):
    """The tuning record in a temporary directory; the process budget read afresh, restored afterwards."""
    path = tmp_path / blocking.RECORD_NAME
    monkeypatch.setattr(blocking, "record_path", lambda: path)
    monkeypatch.setattr(blocking, "_budget", None)
    yield path
    blocking.reload()


def fake_rates(rates_by_share):
    """A ``_measure`` returning the given GFLOP/s for candidate budgets (by share of L1d), 100 elsewhere."""
    l1 = blocking.l1d_bytes()

    def measure(dtype, rounds):
        return {b: next((r for s, r in rates_by_share.items() if int(s * l1) == b), 100.0)
                for b in gemm_tuning._candidates()}
    return measure


def test_default_is_two_thirds_of_l1_from_the_os_else_sysfs_else_32k(monkeypatch, tmp_path):
    assert blocking.default_budget() == int(blocking.l1d_bytes() * 2 / 3)
    assert blocking.l1d_bytes() > 0

    def refused(name):
        raise ValueError(name)
    monkeypatch.setattr(os, "sysconf", refused)
    sysfs = tmp_path / "size"
    sysfs.write_text("48K\n")
    monkeypatch.setattr(blocking, "_SYSFS_L1D", sysfs)
    assert blocking.l1d_bytes() == 48 * 1024
    monkeypatch.setattr(blocking, "_SYSFS_L1D", tmp_path / "absent")
    assert blocking.l1d_bytes() == blocking.FALLBACK_L1D == 32 * 1024


def test_without_a_record_the_process_uses_the_default(record):
    assert not record.exists()
    assert blocking.tuned_budget() is None
    assert blocking.budget() == blocking.default_budget()


def test_tune_keeps_a_clearly_faster_budget_and_the_process_uses_it(record, monkeypatch):
    monkeypatch.setattr(gemm_tuning, "_measure", fake_rates({1 / 2: 130.0, 2 / 3: 110.0}))
    got = gemm_tuning.tune()
    half = int(blocking.l1d_bytes() / 2)
    assert got["budget"] == half and got["default"] == blocking.default_budget()
    assert blocking.budget() == half
    on_disk = json.loads(record.read_text())
    assert on_disk["version"] == blocking.RECORD_VERSION
    assert on_disk["cpus"][blocking.cpu_key()]["budget"] == half
    blocking.reload()                               # a later process (or a reload) reads it back
    assert blocking.budget() == half


def test_tune_keeps_the_default_unless_beaten_by_more_than_noise(record, monkeypatch):
    monkeypatch.setattr(gemm_tuning, "_measure", fake_rates({1 / 2: 112.0, 2 / 3: 110.0}))  # +1.8%: noise
    assert gemm_tuning.tune()["budget"] == blocking.default_budget()


def test_tune_runs_once_per_cpu_unless_forced(record, monkeypatch):
    monkeypatch.setattr(gemm_tuning, "_measure", fake_rates({0.0: 150.0}))
    assert gemm_tuning.tune()["budget"] == 0

    def must_not_run(dtype, rounds):
        raise AssertionError("measured again although this CPU has a record")
    monkeypatch.setattr(gemm_tuning, "_measure", must_not_run)
    assert gemm_tuning.tune()["budget"] == 0
    monkeypatch.setattr(gemm_tuning, "_measure", fake_rates({2 / 3: 150.0}))
    assert gemm_tuning.tune(force=True)["budget"] == blocking.default_budget()


def test_records_of_other_cpus_are_kept_and_not_used(record, monkeypatch):
    record.write_text(json.dumps({"version": 1, "cpus": {"avx2/znver3/l1d=32768": {"budget": 4096}}}))
    assert blocking.tuned_budget() is None and blocking.budget() == blocking.default_budget()
    monkeypatch.setattr(gemm_tuning, "_measure", fake_rates({1.0: 150.0}))
    gemm_tuning.tune()
    cpus = json.loads(record.read_text())["cpus"]
    assert cpus["avx2/znver3/l1d=32768"] == {"budget": 4096}
    assert cpus[blocking.cpu_key()]["budget"] == blocking.l1d_bytes()


@pytest.mark.parametrize("text", ["{not json", json.dumps([1, 2]), json.dumps({"version": 99, "cpus": {}}),
                                  "CPU", json.dumps({"version": 1, "cpus": {"KEY": {"budget": -5}}}),
                                  json.dumps({"version": 1, "cpus": {"KEY": {"budget": "big"}}}),
                                  json.dumps({"version": 1, "cpus": {"KEY": {"budget": True}}})])
def test_a_bad_record_falls_back_to_the_default_and_is_rewritten(record, monkeypatch, caplog, text):
    record.write_text(text.replace("KEY", blocking.cpu_key()))
    with caplog.at_level(logging.WARNING, logger="arrayrnn.numba"):
        assert blocking.budget() == blocking.default_budget()
    if text.startswith("{not"):
        assert "unreadable" in caplog.text and str(record) in caplog.text
    monkeypatch.setattr(gemm_tuning, "_measure", fake_rates({1 / 2: 150.0}))
    half = int(blocking.l1d_bytes() / 2)
    assert gemm_tuning.tune()["budget"] == half
    assert json.loads(record.read_text())["cpus"][blocking.cpu_key()]["budget"] == half


def test_without_a_writable_cache_the_tuned_budget_serves_this_process(monkeypatch):
    monkeypatch.setattr(blocking, "record_path", lambda: None)
    monkeypatch.setattr(blocking, "_budget", None)
    monkeypatch.setattr(gemm_tuning, "_measure", fake_rates({1 / 3: 150.0}))
    try:
        assert gemm_tuning.tune()["budget"] == int(blocking.l1d_bytes() / 3) == blocking.budget()
    finally:
        blocking.reload()


def test_an_unwritable_record_warns_and_the_process_keeps_the_tuned_budget(record, monkeypatch, caplog):
    record.parent.chmod(0o500)
    monkeypatch.setattr(gemm_tuning, "_measure", fake_rates({1 / 3: 150.0}))
    try:
        with caplog.at_level(logging.WARNING, logger="arrayrnn.numba"):
            got = gemm_tuning.tune()
    finally:
        record.parent.chmod(0o700)
    if os.access(record.parent, os.W_OK) and not record.exists():   # root writes anyway: nothing to check
        assert "could not write the GEMM tuning record" in caplog.text
    assert got["budget"] == blocking.budget() == int(blocking.l1d_bytes() / 3)
    assert not [p for p in record.parent.iterdir() if p.name.startswith(".blocking-")]


def test_the_real_measurement_returns_a_rate_for_every_candidate(record):
    rates = gemm_tuning._measure(np.dtype(np.float32), rounds=1)
    assert sorted(rates) == gemm_tuning._candidates()
    assert all(np.isfinite(r) and r > 0 for r in rates.values())
    assert blocking.default_budget() in rates and 0 in rates


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match=r"bytes_ = -1; expected an int >= 0"):
        with blocking.forced(-1):
            pass
    with pytest.raises(ValueError, match=r"bytes_ = 2.5"):
        with blocking.forced(2.5):
            pass
    with pytest.raises(ValueError, match=r"rounds = 0; expected an int >= 1"):
        gemm_tuning.tune(rounds=0)


def test_forced_restores_the_budget():
    before = blocking.budget()
    with blocking.forced(1234):
        assert blocking.budget() == 1234
    assert blocking.budget() == before


def test_compiling_a_family_tunes_once_per_cpu(monkeypatch):
    seen = []
    monkeypatch.setattr(compile_ahead, "probe_calls", lambda family: [])
    monkeypatch.setattr(warmup, "mark_loaded", lambda family: None)
    monkeypatch.setattr(gemm_tuning, "tune", lambda dtype: seen.append(dtype))
    compile_ahead.compile_family(compile_ahead.Family("gru", "float64", False))
    assert seen == ["float64"]


_FRESH = """
import json, time
import numpy as np
import arrayrnn as ar
from arrayrnn.engines.numba import blocking
spec = ar.RNNSpec(mode="gru", input_size=8, hidden_size=16)
params = ar.PackedParams.init(spec, seed=0)
x = np.ones((3, 2, 8), np.float32)
first = ar.rnn_forward(params, x)
deadline = time.time() + 500
while time.time() < deadline and not (blocking.record_path().exists() and blocking.tuned_budget() is not None
                                      and blocking.budget() == blocking.tuned_budget()):
    ar.rnn_forward(params, x)
    time.sleep(0.5)
last = ar.rnn_forward(params, x)
print(json.dumps({"first": first.engine, "last": last.engine, "tuned": blocking.tuned_budget(),
                  "budget": blocking.budget(), "same": bool(np.allclose(first.y, last.y, atol=1e-6))}))
"""


def test_a_users_fresh_process_tunes_in_the_background_and_uses_the_record(tmp_path):
    """The default setting: background compile on, an empty cache. The first call runs on the reference
    engine; the family's child compiles, tunes and writes the record; this process then runs numba on the
    recorded budget."""
    out = run_fresh(_FRESH, tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["first"] == "reference" and got["last"] == "numba", got
    assert isinstance(got["tuned"], int) and got["budget"] == got["tuned"], got
    assert got["same"], got
