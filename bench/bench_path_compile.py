"""What the background compile's first child costs: one call's path against its whole family.

    python bench/bench_path_compile.py --runs 3      # about 2.5 minutes per run on 2 cores

Each measurement is a fresh child process with an empty ``NUMBA_CACHE_DIR`` that runs what the background
compile's child runs (:mod:`arrayrnn.frontend.compile_ahead`): ``compile_path`` of the demo's LSTM call
(float32, input 48, hidden 256, 32 rows, 2 threads; inference, then training) or ``compile_family`` of its
training family (every probe). The three kinds alternate within a run; the table has the median wall time
of each and its ratio to the family's. Only wall clocks: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
import arrayrnn as ar
from arrayrnn.engines import probe_call
from arrayrnn.engines.numba import warmup as W
from arrayrnn.frontend.compile_ahead import compile_family, compile_path

kind = sys.argv[1]
spec = ar.RNNSpec(mode="lstm", input_size=48, hidden_size=256, dtype="float32")
start = time.perf_counter()
if kind == "family":
    compile_family(W.Family("lstm", "float32", True))
else:
    compile_path(W.path_of(probe_call(spec, training=kind == "training path", seq_len=64, batch=32), 2))
print(json.dumps({"seconds": time.perf_counter() - start}))
"""

KINDS = ("inference path", "training path", "family")


def measure(kind: str) -> float:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache, "ARRAYRNN_BACKGROUND_COMPILE": "0",
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        out = subprocess.run([sys.executable, "-c", CHILD, kind], env=env, capture_output=True, text=True,
                             check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for run in range(args.runs):
        for kind in KINDS:
            times[kind].append(measure(kind))
            print(f"run {run}: {kind} {times[kind][-1]:.1f} s", file=sys.stderr, flush=True)
    family = statistics.median(times["family"])
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {os.getloadavg()[0]:.1f}\n")
    print("| compiled from an empty cache | median s | runs (s) | / family |")
    print("|---|---|---|---|")
    for kind in KINDS:
        median = statistics.median(times[kind])
        runs = ", ".join(f"{t:.1f}" for t in times[kind])
        print(f"| {kind} | {median:.1f} | {runs} | {median / family:.2f} |")


if __name__ == "__main__":
    main()
