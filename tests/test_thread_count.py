"""The engine's one thread knob (arrayrnn/engines/thread_count.py): ``arrayrnn.set_num_threads`` and the
``ARRAYRNN_NUM_THREADS`` variable; the host's limits (``OMP_NUM_THREADS``, torch's thread count inside the
drop-in) respected; the host's settings (torch, OpenMP, OpenBLAS) left as they were."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support.thread_jobs import ROOT, run_child

import arrayrnn as ar


@pytest.mark.parametrize("setting, env", [("omp", {"OMP_NUM_THREADS": "1"}), ("torch.set_num_threads", {}),
                                          ("explicit", {})])
def test_the_drop_in_leaves_the_hosts_thread_settings_and_respects_them(setting, env):
    pytest.importorskip("torch")
    run_child("host-threads", setting, threads=None, timeout=180, **env)


def test_set_num_threads_is_the_knob(threads):
    threads(3)
    assert ar.get_num_threads() == 3
    threads(1)
    assert ar.get_num_threads() == 1


@pytest.mark.parametrize("n, exc, message", [
    (0, ValueError, r"n = 0; expected an int >= 1"),
    (-2, ValueError, r"n = -2; expected an int >= 1"),
    (2.0, TypeError, r"n = 2\.0 has type float; expected an int >= 1"),
    (True, TypeError, r"n = True has type bool; expected an int >= 1"),
    (None, TypeError, r"n = None has type NoneType; expected an int >= 1"),
])
def test_set_num_threads_refuses_what_is_not_a_count(n, exc, message):
    before = ar.get_num_threads()
    with pytest.raises(exc, match=message):
        ar.set_num_threads(n)
    assert ar.get_num_threads() == before


def _default_in_child(**env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("ARRAYRNN_NUM_THREADS", "NUMBA_NUM_THREADS", "OMP_NUM_THREADS")}
    return subprocess.run([sys.executable, "-c", "import arrayrnn as ar; print(ar.get_num_threads())"],
                          cwd=ROOT, env={**clean, "PYTHONPATH": str(ROOT), **env}, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("env, expected", [
    ({}, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()),
    ({"ARRAYRNN_NUM_THREADS": "3"}, 3),
    ({"OMP_NUM_THREADS": "1"}, 1),
    ({"OMP_NUM_THREADS": "4,2"}, 4),
    ({"NUMBA_NUM_THREADS": "1"}, 1),
    ({"ARRAYRNN_NUM_THREADS": "5", "OMP_NUM_THREADS": "1"}, 5),
])
def test_the_default_follows_the_documented_variables(env, expected):
    proc = _default_in_child(**env)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) == expected


@pytest.mark.parametrize("value", ["0", "two", "1.5", ""])
def test_a_bad_variable_is_a_clear_error_naming_it(value):
    proc = _default_in_child(ARRAYRNN_NUM_THREADS=value)
    assert proc.returncode != 0
    assert f"ARRAYRNN_NUM_THREADS = {value!r}; expected an int >= 1" in proc.stderr, proc.stderr
