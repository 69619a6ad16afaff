"""The numba engine's thread choices, measured: one thread, the rows split and the columns split.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_threads.py --rounds 9

For LSTM shapes from batch 1 to 64, a forward and a training step (forward + backward) under three
settings, alternated per round in one process (medians of ``--rounds``; a 50 ms pause and two untimed
calls before each timed one, so every setting starts from the same idle second core):

- ``1 thread``: ``arrayrnn.set_num_threads(1)``: the loops on the calling thread, BLAS with its own threads;
- ``rows``: 2 threads, the column split switched off (``COLUMN_SPLIT_MIN_ROWS`` above every batch): from
  16 rows the loops split the batch rows; below, they run on one thread;
- ``columns``: 2 threads, the column split switched on for every batch below 16 rows: the plain LSTM
  forward splits its hidden units, one barrier per step (from 16 rows, the rows split as in ``rows``).

The engine's default is ``columns`` for 8-15 rows and ``rows`` otherwise
(arrayrnn/engines/thresholds.py), from this benchmark's numbers (bench/RESULTS.md). Ratios < 1:
faster than one thread.

``--small``: short calls from 16 rows (``T`` 1-30, ``H = I`` 64-256), ``1 thread`` against ``2 threads``
(the engine's plan as it is), with each call's multiply-adds (``T * B * 4H * (I + H)``): where a split of
the rows starts to pay (``thresholds.MIN_SPLIT_CALL_FMAS``). These are timed back to back, as a stream or a
training loop calls (:func:`time_batch`: per call over 50 ms after 0.1 s of untimed calls), not after a
pause.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import arrayrnn as ar
from arrayrnn.engines import thresholds

CASES = ((200, 1, 64, 128), (100, 4, 256, 256), (100, 8, 256, 256), (100, 12, 256, 256), (50, 8, 128, 512),
         (50, 16, 128, 512), (100, 64, 256, 256))
SETTINGS = {"1 thread": (1, 8), "rows": (2, 1 << 30), "columns": (2, 0)}  # threads, COLUMN_SPLIT_MIN_ROWS
SMALL_CASES = tuple((T, B, H, H) for H in (64, 128, 256) for B in (16, 64) for T in (1, 4, 10, 30))


def call(params: ar.PackedParams, x: np.ndarray, phase: str) -> None:
    """One numba-engine forward, or a training step (forward + backward) for ``phase="train"``."""
    if phase == "forward":
        ar.rnn_forward(params, x, engine="numba")
        return
    res = ar.rnn_forward(params, x, engine="numba", training=True)
    ar.rnn_backward(res, np.ones_like(res.y))


def time_call(params: ar.PackedParams, x: np.ndarray, phase: str) -> float:
    """Seconds of one :func:`call` after a 50 ms pause and two untimed calls (the second core awake)."""
    time.sleep(0.05)
    call(params, x, phase)
    call(params, x, phase)
    start = time.perf_counter()
    call(params, x, phase)
    return time.perf_counter() - start


def time_batch(params: ar.PackedParams, x: np.ndarray, phase: str) -> float:
    """Seconds per call of back-to-back calls (a stream's, a training loop's): 0.1 s of untimed calls, then
    the mean over calls for at least 50 ms."""
    for clock_end, timed in ((time.perf_counter() + 0.1, False), (None, True)):
        start, calls = time.perf_counter(), 0
        while True:
            call(params, x, phase)
            calls += 1
            now = time.perf_counter()
            if (timed and now - start >= 0.05) or (not timed and now >= clock_end):
                break
    return (now - start) / calls


def measure(T: int, B: int, I: int, H: int, phase: str, rounds: int,
            settings: dict[str, tuple[int, int | None]] = SETTINGS, timer=time_call) -> dict[str, float]:
    params = ar.PackedParams.init(ar.RNNSpec("lstm", I, H), seed=0)
    x = np.random.default_rng(0).standard_normal((T, B, I)).astype(np.float32)
    times: dict[str, list[float]] = {name: [] for name in settings}
    saved = (ar.get_num_threads(), thresholds.COLUMN_SPLIT_MIN_ROWS)
    try:
        for _ in range(rounds):
            for name, (threads, column_min) in settings.items():
                ar.set_num_threads(threads)
                thresholds.COLUMN_SPLIT_MIN_ROWS = saved[1] if column_min is None else column_min
                times[name].append(timer(params, x, phase))
    finally:
        ar.set_num_threads(saved[0])
        thresholds.COLUMN_SPLIT_MIN_ROWS = saved[1]
    return {name: 1e3 * float(np.median(t)) for name, t in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--small", action="store_true", help="short calls: 1 thread against 2 (module doc)")
    args = parser.parse_args(argv)
    if args.small:
        small(args.rounds)
        return
    print("| T, B, I, H | phase | 1 thread ms | rows ms | columns ms | rows / 1 thread "
          "| columns / 1 thread |")
    print("|---|---|---|---|---|---|---|")
    for T, B, I, H in CASES:
        for phase in ("forward", "train"):
            ms = measure(T, B, I, H, phase, args.rounds)
            one = ms["1 thread"]
            print(f"| {T}, {B}, {I}, {H} | {phase} | {one:.2f} | {ms['rows']:.2f} | {ms['columns']:.2f} | "
                  f"{ms['rows'] / one:.2f} | {ms['columns'] / one:.2f} |", flush=True)


def small(rounds: int) -> None:
    """The ``--small`` table: short calls on one thread and on two, the engine's plan as it is."""
    settings = {"1 thread": (1, None), "2 threads": (2, None)}
    print(f"MIN_SPLIT_CALL_FMAS = {getattr(thresholds, 'MIN_SPLIT_CALL_FMAS', None)}")
    print("| T, B, I, H | call FMAs | phase | 1 thread ms | 2 threads ms | 2 / 1 |")
    print("|---|---|---|---|---|---|")
    for T, B, I, H in SMALL_CASES:
        for phase in ("forward", "train"):
            ms = measure(T, B, I, H, phase, rounds, settings, time_batch)
            one, two = ms["1 thread"], ms["2 threads"]
            print(f"| {T}, {B}, {I}, {H} | {T * B * 4 * H * (I + H) / 1e6:.1f}M | {phase} | {one:.3f} | "
                  f"{two:.3f} | {two / one:.2f} |", flush=True)


if __name__ == "__main__":
    main()
