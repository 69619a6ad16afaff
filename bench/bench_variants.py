"""Cost of each cell variant (issue 24) on an S1 LSTM training step, as ratios measured in the same run.

S1: T=100, B=64, I=256, H=256, float32. Per option and engine, the training step
(``rnn_forward(training=True)`` + ``rnn_backward``) with the option against the same engine's step without
it, pairs alternated, medians over ``--repeats`` pairs: on the numba engine (what ``"auto"`` runs on CPU;
an option it declined would print "declined") and, for comparison, on the reference engine; and the plain
step on both engines.
Usage: python -m bench.bench_variants [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import arrayrnn as ar
from arrayrnn.engines import engine_unavailable_reason, probe_call

OPTIONS = {"recurrent_dropout=0.25": dict(recurrent_dropout=0.25),
           "weight_dropout=0.5": dict(weight_dropout=0.5),
           "zoneout=0.1 (h and c)": dict(zoneout=0.1),
           "peepholes": dict(peepholes=True),
           "return_all_states": {}}


def _step(spec: ar.RNNSpec, x: np.ndarray, engine: str, all_states: bool = False):
    params = ar.PackedParams.init(spec, seed=0)

    def run() -> None:
        res = ar.rnn_forward(params, x, training=True, seed=1, engine=engine, return_all_states=all_states)
        ar.rnn_backward(res, dy=np.ones_like(res.y))

    return run


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _paired_medians(a, b, repeats: int) -> tuple[float, float]:
    a(), b()  # warm-up (numba compilation, allocations)
    pairs = [(_seconds(a), _seconds(b)) for _ in range(repeats)]
    return statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    spec = ar.RNNSpec(mode="lstm", input_size=256, hidden_size=256, dtype="float32")
    x = np.random.default_rng(0).standard_normal((100, 64, 256)).astype(np.float32)
    plain = _step(spec, x, "reference")
    numba_s, ref_s = _paired_medians(_step(spec, x, "numba"), plain, args.repeats)
    print("| S1 LSTM training step | median ms | ratio to the same engine's step without the option |")
    print("|---|---|---|")
    print(f"| numba engine, no option | {numba_s * 1e3:.1f} | reference / numba = {ref_s / numba_s:.2f} |")
    for engine in ("numba", "reference"):
        for name, fields in OPTIONS.items():
            all_states = name == "return_all_states"
            variant = spec.replace(**fields)
            if engine_unavailable_reason(engine, probe_call(variant, training=True, all_states=all_states)):
                print(f"| {engine}, {name} | declined | |")
                continue
            with_option = _step(variant, x, engine, all_states=all_states)
            base_s, option_s = _paired_medians(_step(spec, x, engine), with_option, args.repeats)
            print(f"| {engine}, {name} | {option_s * 1e3:.1f} | {option_s / base_s:.3f} |")


if __name__ == "__main__":
    main()
