"""Where a GPU engine's host time goes, on a GPU: cProfile over repeated calls of one shape.

``bench/bench_gpu.py`` measures the host CPU time per call (ours against torch's); this says which Python
functions and which CuPy / cuDNN calls make it up. Each row: 3 warm-up calls (plans, graphs, kernels), then
``--calls`` calls under ``cProfile``, synchronised every 20 calls outside the profile (so the launch queue
never fills and blocks a launch), and the functions by own time and by cumulative time::

    python bench/profile_gpu_host.py [--engines cudnn,cupy] [--modes lstm,gru] [--shape S3] [--calls 200]
                                     [--out profile.txt]

``--device numpy`` profiles the same calls on the CPU (engine ``numba``): a dry run of this script.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import arrayrnn as ar  # noqa: E402

SHAPES = {"S1": (100, 64, 256, 256), "S3": (200, 1, 64, 128)}  # T, B, I, H (bench/SHAPES.md)


def calls_for(engine: str, mode: str, xp, shape: tuple) -> dict[str, Callable[[], object]]:
    """The forward and the training step of one shape, ready to call."""
    t, b, i, h = shape
    spec = ar.RNNSpec(mode=mode, input_size=i, hidden_size=h)
    params = ar.PackedParams.init(spec, seed=0, xp=xp)
    if engine == "cudnn":
        params = params.to_format("cudnn")
    x = xp.asarray(np.random.default_rng(0).standard_normal((t, b, i)).astype(np.float32))
    dy = xp.ones((t, b, h), np.float32)

    def train_step():
        return ar.rnn_backward(ar.rnn_forward(params, x, training=True, engine=engine), dy)

    return {"forward": lambda: ar.rnn_forward(params, x, engine=engine), "train_step": train_step}


def profiled(fn: Callable[[], object], sync: Callable[[], None], calls: int) -> tuple[float, pstats.Stats]:
    """(host CPU us per call, the profile) of ``calls`` calls of ``fn``."""
    for _ in range(3):
        fn()
    sync()
    prof, spent = cProfile.Profile(), 0.0
    for done in range(0, calls, 20):
        start = time.thread_time()
        prof.enable()
        for _ in range(min(20, calls - done)):
            fn()
        prof.disable()
        spent += time.thread_time() - start
        sync()
    return spent / calls * 1e6, pstats.Stats(prof)


def report(title: str, us: float, stats: pstats.Stats, calls: int, top: int) -> str:
    out = io.StringIO()
    out.write(f"==== {title}: {us:.0f} us host CPU per call (under the profiler), {calls} calls\n")
    for order in ("tottime", "cumulative"):
        stats.stream = out
        stats.sort_stats(order).print_stats(top)
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="cudnn,cupy")
    parser.add_argument("--modes", default="lstm,gru")
    parser.add_argument("--shape", default="S3", choices=sorted(SHAPES))
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--top", type=int, default=35)
    parser.add_argument("--device", default="cuda", choices=("cuda", "numpy"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.device == "cuda":
        import cupy as xp

        def sync():
            xp.cuda.get_current_stream().synchronize()
        engines = args.engines.split(",")
    else:
        xp, engines = np, ["numba"]

        def sync():
            pass
    text = []
    for engine in engines:
        for mode in args.modes.split(","):
            for what, fn in calls_for(engine, mode, xp, SHAPES[args.shape]).items():
                us, stats = profiled(fn, sync, args.calls)
                title = f"{engine} {mode} {args.shape} {what}"
                print(f"{title}: {us:.0f} us host CPU per call (profiled)", flush=True)
                text.append(report(title, us, stats, args.calls, args.top))
    if args.out:
        args.out.write_text("\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
