"""GPU benchmark: the cudnn and cupy engines against torch.nn.LSTM / GRU on CUDA (which calls cuDNN).

Shapes: bench/SHAPES.md (S1..S5, float32, time-major) and the same shapes at batch 256. For each engine, mode
and shape: forward alone (training=False) and a training step (forward + backward of sum(y)), each pair
(ours, torch) alternated in the same process, synchronised, median of the pairs, reported as the ratio
ours / torch (below 1 is faster). Never run in CI; `.ci/gpu` runs it (``--quick`` by default there).

Each row also reports the host CPU time per call of both sides (``time.thread_time`` around calls made
without synchronising: what the host spends enqueueing, not waiting) and, for the cudnn engine, the cuDNN
algorithm its plan runs. ``--timeline`` adds a CUPTI trace (through ``torch.profiler``, which sees every
kernel on the device, CuPy's and cuDNN's too) of one S3 call of each side: host wall time, GPU busy time
(the union of kernel and copy intervals) and their ratio, so a host-bound call (busy / wall well below 1)
is told from a device-bound one; the traces are written beside ``--out`` as Chrome traces.

Precision: the like-for-like rows ("fp32") pin ``torch.backends.cudnn.allow_tf32 = False`` (PyTorch's default
is True) and ``torch.backends.cuda.matmul.allow_tf32 = False``, as arrayrnn's cuDNN engine runs float32 with
CUDNN_FMA_MATH. The "tf32" rows allow TF32 on both sides (``arrayrnn.engines.cudnn.config.allow_tf32``);
they are reported separately, for the cudnn engine only (the cupy engine's cuBLAS GEMMs follow CuPy's own
setting, ``CUPY_TF32``).

    python bench/bench_gpu.py [--quick] [--pairs 9] [--timeline] [--out results.json]

``--quick``: S1 and S3 only (and their batch-256 forms), 5 pairs, TF32 rows for each of them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import arrayrnn as ar  # noqa: E402
from arrayrnn.engines.cudnn import config as cudnn_config  # noqa: E402

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
                    rows.append((engine, mode, shape, precision))
    return rows


@contextlib.contextmanager
def precision(tf32: bool) -> Iterator[None]:
    """TF32 allowed on both sides or on neither (torch's cuDNN and matmul flags, arrayrnn's cuDNN engine);
    the flags are restored afterwards."""
    import torch

    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32, cudnn_config.allow_tf32)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = tf32
    cudnn_config.allow_tf32 = tf32
    try:
        yield
    finally:
        (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
         cudnn_config.allow_tf32) = saved


def _timed(fn, sync) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def _host_us(fn, sync, calls: int = 10) -> float:
    """Host CPU microseconds per call, the calls enqueued back to back without waiting for the GPU."""
    sync()
    start = time.thread_time()
    for _ in range(calls):
        fn()
    spent = time.thread_time() - start
    sync()
    return spent / calls * 1e6


@dataclass
class Case:
    """One (engine, mode, shape): our forward and step, torch's, and what to synchronise."""

    ours_fwd: Callable[[], None]
    ours_step: Callable[[], None]
    torch_fwd: Callable[[], None]
    torch_step: Callable[[], None]
    sync: Callable[[], None]
    algo: Callable[[], str]


def make_case(engine: str, mode: str, shape: tuple) -> Case:
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
    dy = cupy.ones((t, b, spec.num_directions * h), np.float32)
    given = lengths if variable else None
    module = (torch.nn.LSTM if mode == "lstm" else torch.nn.GRU)(i, h, layers, bidirectional=bidir).cuda()
    xt = torch.from_numpy(x_np).cuda()
    packed = (torch.nn.utils.rnn.pack_padded_sequence(xt, torch.from_numpy(lengths), enforce_sorted=False)
              if variable else xt)

    def ours_step():
        ar.rnn_backward(ar.rnn_forward(params, x, lengths=given, training=True, engine=engine), dy)

    def torch_fwd():
        with torch.no_grad():
            module(packed)

    def torch_step():
        out = module(packed)[0]
        (out.data if variable else out).sum().backward()

    def sync():
        cupy.cuda.Device().synchronize()
        torch.cuda.synchronize()

    def algo() -> str:
        if engine != "cudnn":
            return ""
        from arrayrnn.engines import load_engine

        return load_engine("cudnn").plan_for(params, x, lengths, False, True).algo

    return Case(lambda: ar.rnn_forward(params, x, lengths=given, engine=engine), ours_step, torch_fwd,
                torch_step, sync, algo)


def _case(engine: str, mode: str, shape: tuple, pairs: int) -> dict:
    case = make_case(engine, mode, shape)
    result = {}
    for what, ours, theirs in (("forward", case.ours_fwd, case.torch_fwd),
                               ("train_step", case.ours_step, case.torch_step)):
        ours(), ours(), theirs()  # warm-up: plans, index map, cuDNN's own plans, CuPy kernels; the cupy
        # engine runs a shape's first call step by step and captures its CUDA graphs at the second
        ratios = [_timed(ours, case.sync) / _timed(theirs, case.sync) for _ in range(pairs)]
        result[what] = statistics.median(ratios)
        result[f"{what}_host_us"] = _host_us(ours, case.sync)
        result[f"{what}_torch_host_us"] = _host_us(theirs, case.sync)
    result["algo"] = case.algo()
    return result


def _busy_us(trace: dict) -> tuple[float, int]:
    """The union of the GPU's kernel / copy / memset intervals in a Chrome trace, and their count."""
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in trace.get("traceEvents", [])
                   if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e)
    busy, end = 0.0, float("-inf")
    for start, stop in spans:
        if stop > end:
            busy += stop - max(start, end)
            end = stop
    return busy, len(spans)


def _traced(fn: Callable[[], None], sync: Callable[[], None], path: Path) -> dict:
    """One call under CUPTI: host wall time, GPU busy time (written to ``path`` as a Chrome trace)."""
    from torch.profiler import ProfilerActivity, profile

    fn(), fn()
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        wall = _timed(fn, sync) * 1e6
    prof.export_chrome_trace(str(path))
    busy, ops = _busy_us(json.loads(path.read_text()))
    return dict(wall_us=wall, busy_us=busy, busy_fraction=busy / wall, gpu_ops=ops)


def timeline(out_dir: Path) -> list[dict]:
    """One S3 forward and training step of each side under CUPTI: wall, GPU busy, busy / wall."""
    rows = []
    for engine in ENGINES:
        for mode in MODES:
            case = make_case(engine, mode, SHAPES["S3"])
            sides = {"ours": (case.ours_fwd, case.ours_step), "torch": (case.torch_fwd, case.torch_step)}
            for side, fns in sides.items():
                for what, fn in zip(("forward", "train_step"), fns, strict=True):
                    name = f"{engine}-{mode}-{side}-{what}"
                    row = dict(engine=engine, mode=mode, side=side, what=what,
                               **_traced(fn, case.sync, out_dir / f"trace-{name}.json"))
                    rows.append(row)
                    print(f"timeline S3 {name:28s} wall {row['wall_us']:8.0f} us  GPU busy "
                          f"{row['busy_us']:8.0f} us ({row['busy_fraction']:.0%})  {row['gpu_ops']} GPU ops",
                          flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="S1 and S3 (and batch 256), 5 pairs")
    parser.add_argument("--pairs", type=int, default=9)
    parser.add_argument("--timeline", action="store_true", help="CUPTI timeline of one S3 call per side")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    pairs = 5 if args.quick else args.pairs
    rows = []
    for engine, mode, name, prec in plan(args.quick):
        with precision(tf32=prec == "tf32"):
            r = _case(engine, mode, _shapes(args.quick)[name], pairs)
        rows.append({"engine": engine, "mode": mode, "shape": name, "precision": prec, **r})
        print(f"{prec} {engine:6s} {mode:4s} {name:8s} forward {r['forward']:.2f}x  train step "
              f"{r['train_step']:.2f}x  (ours / torch CUDA, median of {pairs})  host us/call fwd "
              f"{r['forward_host_us']:.0f} vs {r['forward_torch_host_us']:.0f}, step "
              f"{r['train_step_host_us']:.0f} vs {r['train_step_torch_host_us']:.0f}  {r['algo']}",
              flush=True)
    result = {"rows": rows}
    if args.timeline:
        with precision(tf32=False):
            traces = (args.out.parent if args.out else Path(".")) / "traces"
            traces.mkdir(exist_ok=True)
            result["timeline"] = timeline(traces)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
