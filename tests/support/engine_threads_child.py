"""The numba engine's threads under stress, one scenario per process (launched by tests/test_workers.py
and tests/test_thread_count.py with a watchdog; not collected).

    python tests/support/engine_threads_child.py callers CALLERS ITERATIONS
    python tests/support/engine_threads_child.py busy-worker
    python tests/support/engine_threads_child.py interrupts CASE [--opcodes]
    python tests/support/engine_threads_child.py fork
    python tests/support/engine_threads_child.py host-threads SETTING

The engine's thread count comes from the environment the test sets (``ARRAYRNN_NUM_THREADS``, and
``NUMBA_NUM_THREADS`` for the code before issue 34). Every scenario prints ``ok`` as its last line when
every result equalled the one computed by a single caller first; a hang is the watchdog's to catch.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import arrayrnn as ar  # noqa: E402
from arrayrnn.engines import thresholds  # noqa: E402

thresholds.MIN_SPLIT_CALL_FMAS = 0   # small calls split as large ones do: the scenarios are the workers

# shapes whose calls hand parts to the engine's workers (at 2 threads and more)
CASES = {
    # 12 rows, 3.1M multiply-adds per step: the LSTM's units split, a barrier per step
    "lstm-columns": (ar.RNNSpec("lstm", 8, 256), 1, 12),
    # 12 rows, 3.0M: the reset-after GRU's units split
    "gru-columns": (ar.RNNSpec("gru", 8, 290), 1, 12),
    # 16 rows: the rows split between the threads
    "rows": (ar.RNNSpec("lstm", 8, 32), 6, 16),
    # 8 rows, 2 layers: the layers pipelined over chunks of time
    "pipeline": (ar.RNNSpec("gru", 8, 32, num_layers=2), 12, 8),
    # 8 rows, bidirectional: the two directions side by side, forward and backward
    "directions": (ar.RNNSpec("gru", 8, 32, bidirectional=True), 6, 8),
}


def make_call(case: str) -> Callable[[], dict[str, np.ndarray]]:
    """A training call (forward and backward) of ``case``; returns every output."""
    spec, T, B = CASES[case]
    rng = np.random.default_rng(3)
    params = ar.PackedParams.init(spec, seed=1)
    x = rng.standard_normal((T, B, spec.input_size)).astype(np.float32)
    dy = rng.standard_normal((T, B, spec.num_directions * spec.output_size)).astype(np.float32)

    def call() -> dict[str, np.ndarray]:
        res = ar.rnn_forward(params, x, training=True)
        g = ar.rnn_backward(res, dy)
        return {"y": res.y, "h_n": res.h_n, "dx": g.dx, "dparams": g.dparams.data}
    return call


def check(got: dict[str, np.ndarray], expected: dict[str, np.ndarray], what: str) -> None:
    # float32: the number of parts a call gets changes the rounding (docs/guide/threads.md, "Rounding across
    # thread counts")
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5, err_msg=f"{what}: {name}")


# -- callers: threads calling at once -----------------------------------------------------------------
def run_callers(callers: int, iterations: int) -> None:
    sys.setswitchinterval(1e-6)
    calls = {case: make_call(case) for case in CASES}
    expected = {case: call() for case, call in calls.items()}
    errors: list[BaseException] = []

    def caller(k: int) -> None:
        try:
            for i in range(iterations):
                case = "lstm-columns" if i % 2 else list(CASES)[(i // 2 + k) % len(CASES)]
                check(calls[case](), expected[case], f"caller {k}, call {i}, {case}")
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


# -- a worker held by another caller ------------------------------------------------------------------
def run_busy_worker() -> None:
    """One worker stays busy (a part of another caller's call, which waits for this thread) while a
    column split asks for every thread: its barrier must not wait on a part that has no thread."""
    from arrayrnn.engines.numba import loop_threads

    call = make_call("lstm-columns")
    expected = call()
    release, holding = threading.Event(), threading.Event()

    def hold(r0: int, r1: int) -> None:
        if r0:
            holding.set()
            release.wait()

    other = threading.Thread(target=loop_threads.in_parallel, args=(hold, [(0, 1), (1, 2)]))
    other.start()
    holding.wait()
    check(call(), expected, "column split beside a busy worker")
    release.set()
    other.join()
    check(call(), expected, "column split afterwards")


# -- interrupts at every hand-off ---------------------------------------------------------------------
def _traced_files() -> set[str]:
    from arrayrnn.engines.numba import loop_threads, wavefront

    files = {loop_threads.__file__, wavefront.__file__}
    try:
        from arrayrnn.engines.numba import workers
    except ImportError:  # before issue 34
        return files
    return files | {workers.__file__}


class Interrupter:
    """A ``sys.settrace`` function raising ``KeyboardInterrupt`` at the ``at``-th event (call, line, and
    with ``opcodes`` each bytecode) of the engine's thread modules on this thread; ``at = None`` counts."""

    def __init__(self, files: set[str], at: int | None, opcodes: bool):
        self.files, self.at, self.opcodes, self.seen = files, at, opcodes, 0

    def __call__(self, frame, event, arg):
        if frame.f_code.co_filename not in self.files:
            return None
        frame.f_trace_opcodes = self.opcodes
        self._event()
        return self._local

    def _local(self, frame, event, arg):
        if event in ("line", "opcode"):
            self._event()
        return self._local

    def _event(self) -> None:
        self.seen += 1
        if self.seen == self.at:
            raise KeyboardInterrupt(f"injected at event {self.at}")


def _traced(call: Callable[[], object], tracer: Interrupter) -> bool:
    """Run ``call`` under ``tracer``; whether the KeyboardInterrupt reached the caller."""
    sys.settrace(tracer)
    try:
        call()
    except KeyboardInterrupt:
        return True
    finally:
        sys.settrace(None)
    return False


def run_interrupts(case: str, opcodes: bool) -> None:
    """A ``KeyboardInterrupt`` at event 1, 2, ... of a call, each followed by a correct call, until a call
    has fewer events than that (the count varies a little with the workers' timing)."""
    call = make_call(case)
    expected = call()
    files = _traced_files()
    for at in itertools.count(1):
        tracer = Interrupter(files, at, opcodes)
        interrupted = _traced(call, tracer)
        check(call(), expected, f"{case}: the call after an interrupt at event {at}")
        if not interrupted:
            assert tracer.seen < at, f"{case}: the interrupt at event {at} did not reach the caller"
            break
    assert at > 1, "no event in the engine's thread modules"
    _check_no_worker_lost()
    print(f"{case}: {at - 1} interrupts")


def _check_no_worker_lost() -> None:
    """Every helper a call may use is free again once the interrupted calls' parts have ended."""
    from arrayrnn.engines.numba import workers

    deadline = time.monotonic() + 30
    while workers.busy_helpers() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert workers.busy_helpers() == 0, f"{workers.busy_helpers()} helpers still reserved"


# -- fork while other threads call ---------------------------------------------------------------------
def run_fork(forks: int = 12) -> None:
    """A background thread calls the engine without pause (a shape where NumPy's BLAS runs its own
    threads, and one that splits between the engine's workers) while this thread forks; each child
    calls the engine and exits. A fork must never find a call half-way (OpenBLAS's fork handler would
    deadlock on it)."""
    spec = ar.RNNSpec("lstm", 512, 512)
    big = ar.PackedParams.init(spec, seed=0)
    x_blas = np.random.default_rng(0).standard_normal((50, 4, 512)).astype(np.float32)  # BLAS's threads
    split = make_call("rows")
    expected_split = split()
    stop = threading.Event()

    def background() -> None:
        while not stop.is_set():
            ar.rnn_forward(big, x_blas)
            split()

    thread = threading.Thread(target=background)
    thread.start()
    try:
        for k in range(forks):
            time.sleep(0.01 * (k % 4))
            pid = os.fork()
            if pid == 0:
                _child(split, expected_split)
            _wait_child(pid, 60)
    finally:
        stop.set()
        thread.join()


def _child(split: Callable[[], dict[str, np.ndarray]], expected: dict[str, np.ndarray]) -> None:
    status = 1
    try:
        check(split(), expected, "a forked child's call")
        status = 0
    finally:
        os._exit(status)


def _wait_child(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0, f"the child ended with status {status}"
            return
        time.sleep(0.01)
    os.kill(pid, 9)
    raise AssertionError(f"the forked child {pid} hung (killed after {timeout} s)")


# -- the host's thread settings ------------------------------------------------------------------------
def run_host_threads(setting: str) -> None:
    """torch imported first with one thread (``OMP_NUM_THREADS=1`` from the test, or
    ``torch.set_num_threads(1)`` here); the drop-in's calls leave torch's, OpenMP's and OpenBLAS's thread
    counts as they were, and use no more threads than torch's unless ``arrayrnn.set_num_threads`` says
    otherwise (``explicit``: 2)."""
    import threadpoolctl
    import torch

    if setting != "omp":
        torch.set_num_threads(1)
    import arrayrnn.torch as art

    if setting == "explicit":
        ar.set_num_threads(2)
    before = {"torch": torch.get_num_threads(), **_pool_sizes(threadpoolctl)}
    lstm = art.LSTM(16, 32)
    x = torch.randn(6, 64, 16, requires_grad=True)   # 64 rows: the rows split, with 2 threads or more
    lstm(x)[0].sum().backward()
    after = {"torch": torch.get_num_threads(), **_pool_sizes(threadpoolctl)}
    assert after == before, f"thread settings before {before}, after {after}"
    assert before["torch"] == 1, before
    helpers = [t.name for t in threading.enumerate() if t.name.startswith("arrayrnn")]
    if setting == "explicit":
        assert len(helpers) == 1, f"arrayrnn.set_num_threads(2): one helper beside the caller, not {helpers}"
    else:
        assert helpers == [], f"torch has one thread, the engine started {helpers}"


def _pool_sizes(threadpoolctl) -> dict[str, int]:
    return {f"{info['user_api']}:{info['internal_api']}": info["num_threads"]
            for info in threadpoolctl.threadpool_info()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=("callers", "busy-worker", "interrupts", "fork", "host-threads"))
    parser.add_argument("args", nargs="*")
    parser.add_argument("--opcodes", action="store_true")
    args = parser.parse_args()
    if args.scenario == "callers":
        run_callers(int(args.args[0]), int(args.args[1]))
    elif args.scenario == "busy-worker":
        run_busy_worker()
    elif args.scenario == "interrupts":
        run_interrupts(args.args[0], args.opcodes)
    elif args.scenario == "fork":
        run_fork()
    else:
        run_host_threads(args.args[0])
    print("ok")


if __name__ == "__main__":
    main()
