"""Cost of the weight guard (arrayrnn.frontend.guard) as a ratio of an S1 LSTM training step, same process.

S1: T=100, B=64, I=256, H=256, float32, numba engine. The step is rnn_forward(training=True) +
rnn_backward (which includes the guard); the guard is WeightSnapshot(params.data) + check(params.data).
Prints medians over --repeats runs. Usage: python -m bench.bench_guard [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import arrayrnn as ar
from arrayrnn.frontend.guard import WeightSnapshot


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up (numba compilation, allocations)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    spec = ar.RNNSpec(mode="lstm", input_size=256, hidden_size=256, dtype="float32")
    params = ar.PackedParams.init(spec, seed=0)
    x = np.random.default_rng(0).standard_normal((100, 64, 256)).astype(np.float32)

    def step() -> None:
        res = ar.rnn_forward(params, x, training=True, engine="numba")
        ar.rnn_backward(res, dy=np.ones_like(res.y))

    def guard() -> None:
        WeightSnapshot(params.data).assert_unchanged(params.data)

    def copy_x() -> None:
        np.array(x, copy=True)

    step_s = _median_seconds(step, args.repeats)
    guard_s = _median_seconds(guard, args.repeats * 20)
    copy_s = _median_seconds(copy_x, args.repeats * 20)
    print("| what | median ms | ratio to step |")
    print("|---|---|---|")
    print(f"| S1 training step (forward + backward) | {step_s * 1e3:.2f} | 1.000 |")
    print(f"| guard (snapshot + check, {params.data.nbytes / 1e6:.1f} MB) | {guard_s * 1e3:.3f} | "
          f"{guard_s / step_s:.4f} |")
    print(f"| private copy of x ({x.nbytes / 1e6:.1f} MB) | {copy_s * 1e3:.3f} | {copy_s / step_s:.4f} |")


if __name__ == "__main__":
    main()
