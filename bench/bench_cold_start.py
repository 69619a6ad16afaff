"""Cold start: a fresh process per case with an empty numba cache directory (issue 36).

For each mode x dtype x phase (forward, training step) the child process times, from before
``import arrayrnn``: the first result (``engine="auto"``, the default), and the first call that ran on the
numba engine ("full speed"; the calls in between run on the reference engine while the compile runs in
the background). Peers in the same run: the same first call with ``ARRAYRNN_BACKGROUND_COMPILE=0`` (the
behaviour before: the call waits for numba's compile), and ``import torch`` plus ``torch.nn.LSTM/GRU/RNN``'s
first call, each in a fresh process. Medians of ``--repeats`` runs. A 2-core machine shared with other jobs
reads slower than an idle one.

    python bench/bench_cold_start.py [--modes lstm gru rnn_tanh] [--dtypes float32 float64]
                                     [--phases forward training] [--repeats 1] [--no-before]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_OURS = """
    import time
    t0 = time.perf_counter()
    import numpy as np
    import arrayrnn as ar
    from arrayrnn.engines.numba import warmup
    t_import = time.perf_counter() - t0
    spec = ar.RNNSpec(mode={mode!r}, input_size=32, hidden_size=64, num_layers=2, dtype={dtype!r})
    params = ar.PackedParams.init(spec, seed=0)
    x = np.random.default_rng(0).standard_normal((50, 8, 32)).astype({dtype!r})
    training = {training!r}

    def step():
        res = ar.rnn_forward(params, x, training=training)
        if training:
            ar.rnn_backward(res, dy=np.ones_like(res.y))
        return res.engine

    first_engine = step()
    t_first = time.perf_counter() - t0
    engine, calls = first_engine, 1
    while engine != "numba":
        warmup.wait(spec, training, timeout=0.25)
        engine, calls = step(), calls + 1
    t_full = time.perf_counter() - t0
    print(json.dumps(dict(import_s=t_import, first_s=t_first, full_s=t_full, first_engine=first_engine,
                          calls_before_full=calls - 1)))
"""

_TORCH = """
    import time
    t0 = time.perf_counter()
    import torch
    t_import = time.perf_counter() - t0
    dtype = getattr(torch, {dtype!r})
    cls = {{"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}}.get({mode!r}, torch.nn.RNN)
    layer = cls(32, 64, num_layers=2, dtype=dtype)
    x = torch.randn(50, 8, 32, dtype=dtype, requires_grad={training!r})
    y = layer(x)[0]
    if {training!r}:
        y.sum().backward()
    print(json.dumps(dict(import_s=t_import, first_s=time.perf_counter() - t0)))
"""


def _child(body: str, env: dict[str, str], cache: str) -> dict:
    code = "import json\n" + textwrap.dedent(body)
    full_env = {**os.environ, **env, "NUMBA_CACHE_DIR": cache,
                "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True,
                         check=False, cwd=cache)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_case(mode: str, dtype: str, training: bool, before: bool) -> dict:
    fields = dict(mode=mode, dtype=dtype, training=training)
    with tempfile.TemporaryDirectory(prefix="arrayrnn-cold-") as cache:
        ours = _child(_OURS.format(**fields), {"ARRAYRNN_BACKGROUND_COMPILE": "1"}, cache)
    row = dict(ours)
    if before:
        with tempfile.TemporaryDirectory(prefix="arrayrnn-cold-") as cache:
            row["before_first_s"] = _child(_OURS.format(**fields), {"ARRAYRNN_BACKGROUND_COMPILE": "0"},
                                           cache)["first_s"]
    with tempfile.TemporaryDirectory(prefix="arrayrnn-cold-") as cache:
        torch_row = _child(_TORCH.format(**fields), {}, cache)
    row["torch_first_s"] = torch_row["first_s"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", nargs="+", default=["lstm", "gru", "rnn_tanh"])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    parser.add_argument("--phases", nargs="+", default=["forward", "training"],
                        choices=["forward", "training"])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--no-before", action="store_true", help="skip the waiting-for-numba peer")
    args = parser.parse_args()
    print("| case | import | first result | ratio to torch's first call | full speed | before: first call "
          "waits for numba | torch: import + first call |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for mode in args.modes:
        for dtype in args.dtypes:
            for phase in args.phases:
                runs = [run_case(mode, dtype, phase == "training", not args.no_before)
                        for _ in range(args.repeats)]
                med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k.endswith("_s")}
                before = f"{med['before_first_s']:.1f} s" if "before_first_s" in med else "-"
                print(f"| {mode} {dtype} {phase} | {med['import_s']:.2f} s | {med['first_s']:.2f} s "
                      f"({runs[0]['first_engine']}) | {med['first_s'] / med['torch_first_s']:.2f}x | "
                      f"{med['full_s']:.1f} s | {before} | {med['torch_first_s']:.2f} s |", flush=True)


if __name__ == "__main__":
    main()
