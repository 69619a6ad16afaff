"""The numba engine's wavefront, measured: stacks layer by layer against layers or directions side by side.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_wavefront.py --rounds 9

For 2-layer LSTM and GRU stacks (unidirectional: the layers pipelined over chunks of time; bidirectional:
the two directions of each layer side by side) from batch 1 to 64, a forward and a training step, under
three settings alternated per round in one process (medians of ``--rounds``; a 50 ms pause and two untimed
calls before each timed one):

- ``1 thread``: ``arrayrnn.set_num_threads(1)``;
- ``layers``: 2 threads, no wavefront: layer by layer, each loop with the threads its rows allow (the
  rows split from 16 rows, the LSTM column split at 8-15 rows with large steps);
- ``wavefront``: 2 threads, the stack's wavefront forced on at every batch (the engine's default: the
  directions side by side from 4 rows, the layer pipeline off;
  :func:`arrayrnn.engines.numba.plan.wavefront_schedule`).

Ratios < 1: faster than one thread. In ``wavefront`` a bidirectional layer's backward runs its directions
side by side too (the engine's default: below 16 rows only); a unidirectional stack's backward runs layer
by layer in every setting.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_threads import time_call  # noqa: E402

import arrayrnn as ar  # noqa: E402
from arrayrnn.engines.numba import plan  # noqa: E402

CASES = ((100, 1, 256, 256), (100, 4, 256, 256), (100, 8, 256, 256), (100, 12, 256, 256),
         (50, 8, 128, 512), (50, 16, 128, 512), (100, 64, 256, 256))
SETTINGS = ("1 thread", "layers", "wavefront")


def _forced(setting: str) -> Callable[..., str | None]:
    """``plan.wavefront_schedule`` for ``setting``: the stack's wavefront at every batch (the backward: a
    bidirectional layer's directions), or never."""
    def schedule(spec: ar.RNNSpec, rows: int, threads: int, columns: bool = False,
                 backward: bool = False) -> str | None:
        if setting != "wavefront" or threads < 2:
            return None
        if spec.bidirectional:
            return "directions"
        return None if backward else "layers"
    return schedule


@contextmanager
def _setting(name: str) -> Iterator[None]:
    saved = ar.get_num_threads(), plan.wavefront_schedule
    ar.set_num_threads(1 if name == "1 thread" else 2)
    plan.wavefront_schedule = _forced(name)
    try:
        yield
    finally:
        ar.set_num_threads(saved[0])
        plan.wavefront_schedule = saved[1]


def measure(spec: ar.RNNSpec, T: int, B: int, phase: str, rounds: int) -> dict[str, float]:
    params = ar.PackedParams.init(spec, seed=0)
    x = np.random.default_rng(0).standard_normal((T, B, spec.input_size)).astype(np.float32)
    times: dict[str, list[float]] = {name: [] for name in SETTINGS}
    for _ in range(rounds):
        for name in SETTINGS:
            with _setting(name):
                times[name].append(time_call(params, x, phase))
    return {name: 1e3 * float(np.median(t)) for name, t in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--modes", default="lstm,gru")
    args = parser.parse_args(argv)
    print("| stack | T, B, I, H | phase | 1 thread ms | layers ms | wavefront ms | layers / 1 thread "
          "| wavefront / 1 thread | wavefront / layers |")
    print("|---|---|---|---|---|---|---|---|---|")
    for mode in args.modes.split(","):
        for bidirectional in (False, True):
            for T, B, I, H in CASES:
                spec = ar.RNNSpec(mode, I, H, num_layers=2, bidirectional=bidirectional)
                stack = f"{mode} 2 layers{' bi' if bidirectional else ''}"
                for phase in ("forward", "train"):
                    ms = measure(spec, T, B, phase, args.rounds)
                    one, layers, wave = ms["1 thread"], ms["layers"], ms["wavefront"]
                    print(f"| {stack} | {T}, {B}, {I}, {H} | {phase} | {one:.2f} | {layers:.2f} | "
                          f"{wave:.2f} | {layers / one:.2f} | {wave / one:.2f} | {wave / layers:.2f} |",
                          flush=True)


if __name__ == "__main__":
    main()
