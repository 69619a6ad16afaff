"""GPU benchmark: the cudnn and cupy engines against torch.nn.LSTM / GRU on CUDA (which calls cuDNN).

Shapes: BENCH_SHAPES (S1..S5, float32, time-major) and the same shapes at batch 256. For each engine, mode
and shape: forward alone (training=False) and a training step (forward + backward of sum(y)), each pair
(ours, torch) alternated in the same process, synchronised, median of the pairs, reported as the ratio
ours / torch (below 1 is faster). Never run in CI; `.ci/gpu` runs it (``--quick`` by default there).

Precision: the like-for-like rows ("fp32") pin ``torch.backends.cudnn.allow_tf32 = False`` (PyTorch's default
is True) and ``torch.backends.cuda.matmul.allow_tf32 = False``, as arrayrnn's cuDNN engine runs float32 with
CUDNN_FMA_MATH. The "tf32" rows allow TF32 on both sides (``arrayrnn.engines.cudnn_format.allow_tf32``);
they are reported separately, for the cudnn engine only (the cupy engine's cuBLAS GEMMs follow CuPy's own
setting, ``CUPY_TF32``).

    python bench/bench_gpu.py [--quick] [--pairs 9] [--out results.json]

``--quick``: S1 and S3 only (and their batch-256 forms), 3 pairs, TF32 rows for S1 only.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import arrayrnn as ar  # noqa: E402
from arrayrnn.engines import cudnn_format  # noqa: E402

SHAPES = {  # name: (T, B, I, H, layers, bidirectional, variable lengths)
    "S1": (100, 64, 256, 256, 1, False, False),
    "S2": (50, 16, 128, 512, 2, False, False),
    "S3": (200, 1, 64, 128, 1, False, False),
    "S4": (100, 64, 256, 256, 2, True, False),
    "S5": (100, 64, 256, 256, 1, False, True),
}
ENGINES = ("cudnn", "cupy")
MODES = ("lstm", "gru")


def _shapes(quick: bool) -> dict:
    base = {k: v for k, v in SHAPES.items() if not quick or k in ("S1", "S3")}
    big = {f"{k}-B256": (v[0], 256, *v[2:]) for k, v in base.items()}
    return {**base, **big}


def plan(quick: bool) -> list[tuple[str, str, str, str]]:
    """Every row to measure: (engine, mode, shape, precision); "tf32" rows for cudnn only."""
    rows = []
    for precision in ("fp32", "tf32"):
        for engine in ENGINES if precision == "fp32" else ("cudnn",):
            for mode in MODES:
                for shape in _shapes(quick):
                    if precision == "tf32" and quick and not shape.startswith("S1"):
                        continue
                    rows.append((engine, mode, shape, precision))
    return rows


@contextlib.contextmanager
def precision(tf32: bool) -> Iterator[None]:
    """TF32 allowed on both sides or on neither (torch's cuDNN and matmul flags, arrayrnn's cuDNN engine);
    the flags are restored afterwards."""
    import torch

    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32, cudnn_format.allow_tf32)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = tf32
    cudnn_format.allow_tf32 = tf32
    try:
        yield
    finally:
        (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
         cudnn_format.allow_tf32) = saved


def _timed(fn, sync) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def _case(engine: str, mode: str, shape: tuple, pairs: int) -> dict:
    import cupy
    import torch

    t, b, i, h, layers, bidir, variable = shape
    rng = np.random.default_rng(0)
    spec = ar.RNNSpec(mode=mode, input_size=i, hidden_size=h, num_layers=layers, bidirectional=bidir)
    params = ar.PackedParams.init(spec, seed=0, xp=cupy)
    if engine == "cudnn":
        params = params.to_format("cudnn")
    lengths = rng.integers(1, t + 1, b) if variable else np.full(b, t)
    x_np = rng.standard_normal((t, b, i)).astype(np.float32) * (np.arange(t)[:, None] < lengths)[..., None]
    x = cupy.asarray(x_np)
    module = (torch.nn.LSTM if mode == "lstm" else torch.nn.GRU)(i, h, layers, bidirectional=bidir).cuda()
    xt = torch.from_numpy(x_np).cuda()
    packed = (torch.nn.utils.rnn.pack_padded_sequence(xt, torch.from_numpy(lengths), enforce_sorted=False)
              if variable else xt)

    def ours_fwd():
        ar.rnn_forward(params, x, lengths=lengths, engine=engine)

    def ours_step():
        res = ar.rnn_forward(params, x, lengths=lengths, training=True, engine=engine)
        ar.rnn_backward(res, cupy.ones_like(res.y))

    def torch_fwd():
        with torch.no_grad():
            module(packed)

    def torch_step():
        out = module(packed)[0]
        (out.data if variable else out).sum().backward()

    def sync():
        cupy.cuda.Device().synchronize()
        torch.cuda.synchronize()

    result = {}
    for what, ours, theirs in (("forward", ours_fwd, torch_fwd), ("train_step", ours_step, torch_step)):
        ours(), theirs()  # warm-up (descriptors, index map, cuDNN plans, CuPy kernels)
        ratios = [_timed(ours, sync) / _timed(theirs, sync) for _ in range(pairs)]
        result[what] = statistics.median(ratios)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="S1 and S3 only, 3 pairs, TF32 rows for S1")
    parser.add_argument("--pairs", type=int, default=9)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    pairs = 3 if args.quick else args.pairs
    rows = []
    for engine, mode, name, prec in plan(args.quick):
        if importlib.util.find_spec(f"arrayrnn.engines.{engine}_engine") is None:
            print(f"note: engine {engine!r} skipped: arrayrnn/engines/{engine}_engine.py is missing")
            continue
        with precision(tf32=prec == "tf32"):
            r = _case(engine, mode, _shapes(args.quick)[name], pairs)
        rows.append({"engine": engine, "mode": mode, "shape": name, "precision": prec, **r})
        print(f"{prec} {engine:6s} {mode:4s} {name:8s} forward {r['forward']:.2f}x  "
              f"train step {r['train_step']:.2f}x  (ours / torch CUDA, median of {pairs})", flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
