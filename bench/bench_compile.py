"""The numba engine's compile cost: each compiled function's own compile time in a fresh cache, then the load.

    python bench/bench_compile.py                 # this tree; about 1-3 minutes
    python bench/bench_compile.py --tree /tmp/other-tree    # another checkout, in a child process

A child process with an empty ``NUMBA_CACHE_DIR`` makes float32 calls that reach every compiled function
the engine runs (the packed GEMM, each mode's forward and backward loop, the column-split forwards, the
per-step input projection, a cell step), in a fixed order, with 2 threads and the column-split thresholds
at 0 so that those loops run at 9 rows (``H = 40``: more than one unit group to split, float32 lanes being
at most 16). It reports numba's own timer of each function (``compiler_lock``
of its compile result: typing, lowering and LLVM, including any callee compiled for it first: the order
below is the order of first use) and the call's wall time; a second child loads everything from that
cache (the cost of a later process). Only numba's timers and wall clocks: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# run in the child: import the tree's arrayrnn, make the calls, print one JSON line
CHILD = r"""
import importlib, json, pkgutil, sys, time
t0 = time.perf_counter()
import numpy as np
import arrayrnn as ar
import numba
from numba.core.registry import CPUDispatcher
imported = time.perf_counter() - t0

def column_split_everywhere():
    older = ("arrayrnn.engines.numba.loop_threads", "arrayrnn.engines.loop_threads")  # trees before the table
    for name in ("arrayrnn.engines.thresholds", *older):
        try:
            table = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(table, "COLUMN_SPLIT_MIN_STEP_FMAS"):
            table.COLUMN_SPLIT_MIN_STEP_FMAS = table.COLUMN_SPLIT_WIDE_STEP_FMAS = 0
            return
    raise SystemExit("no column-split thresholds found")

def train(spec, B, T=3, lengths=None, training=True):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T, B, spec.input_size)).astype(np.float32)
    res = ar.rnn_forward(ar.PackedParams.init(spec), x, lengths, training=training, engine="numba")
    if training:
        ar.rnn_backward(res, np.ones_like(res.y))

def cell(mode):
    spec = ar.RNNSpec(mode, 5, 6)
    p = ar.PackedParams.init(spec)
    r = ar.cell_step(p, np.ones((2, 5), np.float32), training=True, engine="numba")
    ar.cell_step_backward(r, dh=np.ones_like(r.h))

ar.set_num_threads(2)
column_split_everywhere()
S = ar.RNNSpec
steps = [
    ("packed GEMM (pack_b, gemm)", lambda: train(S("rnn_tanh", 200, 300), 300, T=1, training=False)),
    ("lstm: forward + backward loops", lambda: train(S("lstm", 5, 6, proj_size=3, peepholes=True), 2)),
    ("lstm: column-split forward", lambda: train(S("lstm", 5, 40), 9, training=False)),
    ("gru: forward + backward loops", lambda: train(S("gru", 5, 6), 2)),
    ("gru: column-split forward", lambda: train(S("gru", 5, 40), 9, training=False)),
    ("rnn: forward + backward loops", lambda: train(S("rnn_tanh", 5, 6), 2)),
    ("active-rows input projection", lambda: train(S("gru", 5, 6), 16, T=8,
                                                   lengths=np.array([8, 8, 8, 8] + [1] * 12))),
    ("cell steps (lstm, gru, rnn)", lambda: [cell(m) for m in ("lstm", "gru", "rnn_tanh")]),
]
walls = []
for label, run in steps:
    t = time.perf_counter()
    run()
    walls.append((label, time.perf_counter() - t))

def dispatchers():
    seen = {}
    import arrayrnn.engines as engines
    for info in pkgutil.walk_packages(engines.__path__, "arrayrnn.engines."):
        module = sys.modules.get(info.name)
        if module is None:
            continue
        for name, value in vars(module).items():
            if isinstance(value, CPUDispatcher) and value.py_func.__module__ == info.name:
                seen[f"{info.name.split('engines.', 1)[1]}.{name}"] = value
    return seen

own = {}
for name, fn in sorted(dispatchers().items()):
    total = 0.0
    for sig in fn.signatures:
        timers = fn.get_metadata(sig).get("timers", {}) if fn.get_metadata(sig) else {}
        total += timers.get("compiler_lock", 0.0)
    if fn.signatures:
        own[name] = (total, len(fn.signatures))
print(json.dumps({"import": imported, "walls": walls, "own": own}))
"""


def run_child(tree: Path, cache: str) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONPATH=str(tree))
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, cwd=tree, env=env)
    if done.returncode:
        raise SystemExit(f"child failed in {tree}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def render(cold: dict, warm: dict) -> str:
    lines = ["| call (first use, in this order) | cold s | warm s |", "|---|---|---|"]
    for (label, c), (_, w) in zip(cold["walls"], warm["walls"], strict=True):
        lines.append(f"| {label} | {c:.2f} | {w:.3f} |")
    total_cold, total_warm = sum(c for _, c in cold["walls"]), sum(w for _, w in warm["walls"])
    lines.append(f"| total | {total_cold:.2f} | {total_warm:.3f} |")
    lines += ["", "| compiled function | signatures | own compile s (numba's compiler_lock timer) |",
              "|---|---|---|"]
    for name, (seconds, count) in sorted(cold["own"].items(), key=lambda kv: -kv[1][0]):
        lines.append(f"| {name} | {count} | {seconds:.2f} |")
    lines.append(f"\n`import arrayrnn`: {cold['import']:.2f} s cold, {warm['import']:.2f} s warm.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout to measure (default: this one)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as cache:
        cold = run_child(args.tree.resolve(), cache)
        warm = run_child(args.tree.resolve(), cache)
    print(render(cold, warm))


if __name__ == "__main__":
    main()
