"""The packed GEMM's K blocking on this CPU: GFLOP/s of gate-grouped products at every candidate budget.

For each shape (one thread's share of a time loop's recurrent product: rows, K, hidden units, gates) and each
budget the tuning pass (``arrayrnn/engines/numba/gemm_tuning.py``) chooses among, the product's rate, best of
``--rounds`` alternated rounds, one thread, against the one-thread FMA peak (``bench/cpu_peak.py``); then the
tuning pass itself, forced, and the budget it keeps. The bits are the same at every budget (checked here too).

    python bench/bench_gemm_blocking.py [--rounds 7] [--shapes 32x256x256x4,16x512x256x4] [--peak 176]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_peak import measure as peak_gflops  # noqa: E402

from arrayrnn.engines.numba import blocking, gemm_tuning  # noqa: E402
from arrayrnn.engines.numba import packed_gemm as pg  # noqa: E402

SHAPES = "32x256x256x4,32x256x256x3,16x512x256x4,8x512x512x4,64x256x256x4,32x512x256x4,32x1024x256x4"


def rates(shape: tuple[int, int, int, int], budgets: list[int], rounds: int) -> dict[int, float]:
    """GFLOP/s of the shape's product at each budget (the tuning pass's own timing), after checking that
    every budget gives the same bits."""
    rows, K, H, G = shape
    rng = np.random.default_rng(0)
    a = rng.standard_normal((rows, K)).astype(np.float32)
    packed = pg.pack_b(rng.standard_normal((K, G * H)).astype(np.float32), G)
    outs = {b: np.empty((rows, G * H), np.float32) for b in budgets}
    for b in budgets:
        pg.gemm(a, packed, G, outs[b], False, pg.new_scratch(np.float32, b))
        if not np.array_equal(outs[b], outs[budgets[0]]):
            raise AssertionError(f"{shape}: budget {b} changed the bits")
    seconds = gemm_tuning.best_times(shape, np.dtype(np.float32), budgets, rounds)
    return {b: 2 * rows * K * G * H / t / 1e9 for b, t in seconds.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--shapes", default=SHAPES, help="rows x K x H x gates, comma-separated")
    parser.add_argument("--peak", type=float, help="the one-thread FMA peak, GFLOP/s (default: measured)")
    args = parser.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    if any(len(s) != 4 for s in shapes):
        parser.error(f"--shapes {args.shapes!r}: expected rows x K x H x gates, e.g. 32x256x256x4")
    budgets = gemm_tuning._candidates()
    peak = args.peak or peak_gflops(1)
    print(f"CPU {blocking.cpu_key()}; L1d {blocking.l1d_bytes()} B; default budget "
          f"{blocking.default_budget()} B; one-thread FMA peak {peak:.1f} GFLOP/s float32\n")
    names = ["none" if b == 0 else f"{b // 1024} KiB" for b in budgets]
    print("| rows x K x H x G | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(budgets))
    for shape in shapes:
        got = rates(shape, budgets, args.rounds)
        top = max(got.values())
        mark = ["**" if r == top else "" for r in got.values()]
        cells = [f"{m}{r:.0f} ({r / peak:.0%}){m}" for r, m in zip(got.values(), mark, strict=True)]
        print(f"| {'x'.join(map(str, shape))} | " + " | ".join(cells) + " |")
    record = gemm_tuning.tune(force=True)
    print(f"\ntuning pass (forced): keeps {record['budget']} B; GFLOP/s by budget {record['gflops']}")


if __name__ == "__main__":
    main()
