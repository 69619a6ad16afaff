"""The packed GEMM's tuning pass: the K-block budget (:mod:`.blocking`) measured on this CPU, once.

Roughly::

    for round in range(rounds):                  # alternated, so a busy moment hits every candidate
        for budget in candidates:                # shares of L1d, the default, and 0 (no blocking)
            time the gate-grouped products of TUNING_SHAPES with a scratch tile carrying `budget`
    keep the fastest (best of rounds) unless the default is within KEEP_DEFAULT_WITHIN of it
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from . import blocking
from .packed_gemm import gemm, new_scratch, pack_b

CANDIDATE_SHARES = (0.0, 1 / 4, 1 / 3, 1 / 2, 2 / 3, 5 / 6, 1.0)   # of L1d; 0: no blocking
KEEP_DEFAULT_WITHIN = 0.03       # a candidate must beat the default by more than this to replace it
# (rows, K, H, G): one thread's share of S1's LSTM and GRU steps (rows split) and of S2's (units split)
TUNING_SHAPES = ((32, 256, 256, 4), (32, 256, 256, 3), (16, 512, 256, 4))


def tune(dtype: Any = np.float32, rounds: int = 5, force: bool = False) -> dict:
    """Time the gate-grouped product at each candidate budget, keep the fastest for this CPU and use it.

    Runs once per CPU (a record already there is returned as it is unless ``force``); about 0.1 s, on
    ``dtype``'s products (the budget is in bytes: one serves both dtypes). The candidates are
    :data:`CANDIDATE_SHARES` of L1d, timed in alternated rounds (best of ``rounds``); the default stays
    unless a candidate beats it by more than :data:`KEEP_DEFAULT_WITHIN`. Returns the record (``budget``,
    ``default``, ``dtype``, ``gflops`` by budget, ``when``); where numba has no writable cache the budget
    serves this process only.
    """
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"tune: rounds = {rounds!r}; expected an int >= 1")
    record = None if force else blocking.tuned_record()
    if record is not None:
        return record
    rates = _measure(np.dtype(dtype), rounds)
    default = blocking.default_budget()
    best = min(rates, key=lambda b: (-rates[b], b != default))
    if rates[best] <= rates[default] * (1 + KEEP_DEFAULT_WITHIN):
        best = default
    record = {"budget": best, "default": default, "dtype": str(np.dtype(dtype)),
              "gflops": {str(b): round(r, 1) for b, r in rates.items()},
              "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
    blocking.write_record(blocking.cpu_key(), record)
    blocking.use(best)
    return record


def _candidates() -> list[int]:
    l1 = blocking.l1d_bytes()
    return sorted({int(share * l1) for share in CANDIDATE_SHARES} | {blocking.default_budget()})


def _measure(dtype: np.dtype, rounds: int) -> dict[int, float]:
    """GFLOP/s of :data:`TUNING_SHAPES`' products together at each candidate budget (one thread, each shape's
    best of ``rounds`` alternated rounds)."""
    budgets = _candidates()
    seconds = dict.fromkeys(budgets, 0.0)
    flops = 0
    for shape in TUNING_SHAPES:
        for b, t in best_times(shape, dtype, budgets, rounds).items():
            seconds[b] += t
        rows, K, H, G = shape
        flops += 2 * rows * K * G * H
    return {b: flops / t / 1e9 for b, t in seconds.items()}


def best_times(shape: tuple[int, int, int, int], dtype: np.dtype, budgets: list[int],
               rounds: int) -> dict[int, float]:
    """Seconds of one ``(rows, K, H, G)`` gate-grouped product at each budget: best of ``rounds`` alternated
    rounds, one thread (bench/bench_gemm_blocking.py prints them for more shapes)."""
    rows, K, H, G = shape
    rng = np.random.default_rng(0)
    a = rng.standard_normal((rows, K)).astype(dtype)
    packed = pack_b(rng.standard_normal((K, G * H)).astype(dtype), G)
    c = np.empty((rows, G * H), dtype)
    scratches = {b: new_scratch(dtype, b) for b in budgets}
    repeats = 8
    best = dict.fromkeys(scratches, np.inf)
    for scratch in scratches.values():
        gemm(a, packed, G, c, False, scratch)        # compiled (or loaded) and warm before timing
    for _ in range(rounds):
        for b, scratch in scratches.items():
            start = time.perf_counter()
            for _ in range(repeats):
                gemm(a, packed, G, c, False, scratch)
            best[b] = min(best[b], (time.perf_counter() - start) / repeats)
    return best
