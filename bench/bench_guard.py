"""Cost of the weight guard (arrayrnn.frontend.guard) as a ratio of the calls that record it, same process.

Training: an S1 LSTM training step (T=100, B=64, I=256, H=256, float32, numba engine:
rnn_forward(training=True) + rnn_backward, the guard included); the guard is HostSnapshot(params.data) +
assert_unchanged(params.data).
Inference (issue 45: an inference forward records the weights too, so its backward compares them instead
of recomputed outputs): the S1 forward, and a T = 1 call at B = 1, H = 64 (the smallest streaming call),
each against the snapshot alone (the copy an inference forward now makes). Prints medians over --repeats
runs. Usage: python -m bench.bench_guard [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import arrayrnn as ar
from arrayrnn.frontend.guard import HostSnapshot


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up (numba compilation, allocations)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _case(T: int, B: int, I: int, H: int) -> tuple[ar.PackedParams, np.ndarray]:
    spec = ar.RNNSpec(mode="lstm", input_size=I, hidden_size=H, dtype="float32")
    x = np.random.default_rng(0).standard_normal((T, B, I)).astype(np.float32)
    return ar.PackedParams.init(spec, seed=0), x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    params, x = _case(100, 64, 256, 256)
    small, x1 = _case(1, 1, 64, 64)

    def step() -> None:
        res = ar.rnn_forward(params, x, training=True, engine="numba")
        ar.rnn_backward(res, dy=np.ones_like(res.y))

    rows = [("S1 training step (forward + backward)", _median_seconds(step, args.repeats), None),
            (f"guard (snapshot + check, {params.data.nbytes / 1e6:.1f} MB)",
             _median_seconds(lambda: HostSnapshot(params.data).assert_unchanged(params.data),
                             args.repeats * 20), 0),
            (f"private copy of x ({x.nbytes / 1e6:.1f} MB)",
             _median_seconds(lambda: np.array(x, copy=True), args.repeats * 20), 0),
            ("S1 inference forward (snapshot included)",
             _median_seconds(lambda: ar.rnn_forward(params, x, engine="numba"), args.repeats), None),
            ("its snapshot", _median_seconds(lambda: HostSnapshot(params.data), args.repeats * 20), 3),
            ("T=1 B=1 H=64 inference forward (snapshot included)",
             _median_seconds(lambda: ar.rnn_forward(small, x1, engine="numba"), args.repeats * 200), None),
            (f"its snapshot ({small.data.nbytes / 1e3:.0f} kB)",
             _median_seconds(lambda: HostSnapshot(small.data), args.repeats * 200), 5)]
    print("| what | median ms | ratio to its call |")
    print("|---|---|---|")
    for name, seconds, base in rows:
        ratio = 1.0 if base is None else seconds / rows[base][1]
        print(f"| {name} | {seconds * 1e3:.3f} | {ratio:.4f} |")


if __name__ == "__main__":
    main()
