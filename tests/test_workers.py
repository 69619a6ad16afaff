"""The engine's worker threads (arrayrnn/engines/numba/workers.py) under concurrency, interrupts and fork.

Each scenario runs tests/support/engine_threads_child.py in its own process with a watchdog (a hang
there spins in compiled code, which no signal interrupts): Python threads calling at once under 3 and 4
engine threads on this machine's cores, with a short switch interval; a column split while another
caller's part holds a worker; a ``KeyboardInterrupt`` raised (``sys.settrace``) at every line, call and
bytecode of the thread modules a call passes, each followed by a correct call; forks while another thread
calls, each child calling the engine. Before issue 34 each of these hung.
"""

from __future__ import annotations

import sys

import pytest
from support.thread_jobs import run_child


@pytest.mark.parametrize("threads", [3, 4])
@pytest.mark.parametrize("callers", [2, 3, 4])
def test_callers_at_once_never_wait_on_each_others_workers(threads, callers):
    run_child("callers", str(callers), "60", threads=threads)


def test_a_column_split_beside_a_busy_worker_runs_on_the_threads_it_has():
    run_child("busy-worker", threads=3, timeout=120)


@pytest.mark.parametrize("case", ["lstm-columns", "gru-columns", "rows", "pipeline", "directions"])
def test_an_interrupt_at_any_line_of_a_hand_off_leaves_the_engine_usable(case):
    out = run_child("interrupts", case)
    assert f"{case}: " in out


@pytest.mark.parametrize("case", ["lstm-columns", "pipeline"])
def test_an_interrupt_at_any_bytecode_of_a_hand_off_leaves_the_engine_usable(case):
    run_child("interrupts", case, "--opcodes", timeout=400)


@pytest.mark.skipif(sys.platform != "linux", reason="os.fork with threads: Linux")
def test_fork_while_another_thread_calls_waits_for_the_call_and_the_child_can_call():
    run_child("fork", timeout=180)
