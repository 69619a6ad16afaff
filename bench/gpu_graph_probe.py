"""GPU probe (issue 33): the cupy engine's time loops step by step and as CUDA graphs, against torch's cuDNN.

Needs a GPU with CuPy and torch (CUDA); about 1-2 minutes on an H100/H200. For each mode (LSTM, GRU), shape
(bench_gpu.py's S1 and S3, float32, TF32 off) and cell (plain; recurrent dropout 0.25 + zoneout 0.1, which
cuDNN cannot run), forward and training step:

- host (CPU) and device (GPU) time per call, medians of ``cupyx.profiler.benchmark`` (CUDA events on CuPy's
  current stream, the legacy default stream, which orders with torch's default stream), for
  ``torch.nn.LSTM/GRU`` (cuDNN; the plain cell, the target of both cells), the cupy engine step by step
  (``cuda_graphs.use_graphs = False``) and with graphs (from a shape's third call);
- ``replay us/step``: device time of one forward direction's graph replay alone, per step (the loop's GEMM,
  kernel and node overheads, without the driver's hoisted GEMMs and copies).

The timeline of one call (CUPTI, kernel by kernel) is ``bench/bench_gpu.py --timeline``'s, whose cupy rows
trace a replayed call.

    python bench/gpu_graph_probe.py [--repeat 20] [--out probe.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import arrayrnn as ar  # noqa: E402
from arrayrnn.engines.cupy import graphs as cuda_graphs  # noqa: E402
from arrayrnn.engines.cupy.engine import ENGINE  # noqa: E402

SHAPES = {"S1": (100, 64, 256, 256), "S3": (200, 1, 64, 128)}  # T, B, I, H (bench_gpu.py's)
CELLS = {"plain": {}, "rdrop+zoneout": {"recurrent_dropout": 0.25, "zoneout": 0.1}}


def _medians_ms(fn, repeat: int) -> tuple[float, float]:
    from cupyx.profiler import benchmark

    result = benchmark(fn, n_repeat=repeat, n_warmup=3)
    return 1e3 * float(np.median(result.cpu_times)), 1e3 * float(np.median(result.gpu_times[0]))


def _sides(mode: str, shape: tuple, cell: dict, what: str):
    import cupy
    import torch

    T, B, I, H = shape
    rng = np.random.default_rng(0)
    spec = ar.RNNSpec(mode=mode, input_size=I, hidden_size=H, dtype="float32", **cell)
    params = ar.PackedParams.init(spec, seed=0, xp=cupy)
    x_np = rng.standard_normal((T, B, I)).astype(np.float32)
    x, dy = cupy.asarray(x_np), cupy.ones((T, B, H), np.float32)
    training = what == "train_step" or bool(cell)  # the variants' masks exist in training only

    def ours():
        res = ar.rnn_forward(params, x, training=training, seed=1, engine="cupy")
        if what == "train_step":
            ar.rnn_backward(res, dy=dy)

    module = (torch.nn.LSTM if mode == "lstm" else torch.nn.GRU)(I, H).cuda()
    xt = torch.from_numpy(x_np).cuda()

    def theirs():
        if what == "train_step":
            module(xt)[0].sum().backward()
        else:
            with torch.no_grad():
                module(xt)

    return ours, theirs


def _replay_us_per_step(T: int, repeat: int) -> float | None:
    forward = [graph for key, graph in ENGINE.kernel.graphs.graphs() if key[0] == "forward"]
    if not forward:
        return None
    _, gpu_ms = _medians_ms(forward[-1].launch, repeat)
    return 1e3 * gpu_ms / T


def _row(mode: str, shape_name: str, cell_name: str, what: str, repeat: int) -> dict:
    import torch

    T = SHAPES[shape_name][0]
    ours, theirs = _sides(mode, SHAPES[shape_name], CELLS[cell_name], what)
    row = {"mode": mode, "shape": shape_name, "cell": cell_name, "what": what, "steps": T}
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    row["torch_cpu_ms"], row["torch_gpu_ms"] = _medians_ms(theirs, repeat)
    cuda_graphs.use_graphs = False
    try:
        row["steps_cpu_ms"], row["steps_gpu_ms"] = _medians_ms(ours, repeat)
    finally:
        cuda_graphs.use_graphs = True
    ENGINE.kernel.graphs.clear()
    for _ in range(3):  # step by step, captured, replayed
        ours()
    row["graph_cpu_ms"], row["graph_gpu_ms"] = _medians_ms(ours, repeat)
    row["replay_us_per_step"] = _replay_us_per_step(T, repeat)
    row["graph_over_torch_gpu"] = row["graph_gpu_ms"] / row["torch_gpu_ms"]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    rows, failures = [], []
    print("ms per call, median; gpu = CUDA events; graph/torch = the graph path's device time over cuDNN's")
    for mode in ("lstm", "gru"):
        for shape in SHAPES:
            for cell in CELLS:
                for what in ("forward", "train_step"):
                    try:
                        r = _row(mode, shape, cell, what, args.repeat)
                    except Exception as err:  # reported; the other rows still run
                        failures.append(f"{mode} {shape} {cell} {what}: {type(err).__name__}: {err}")
                        print("FAILED", failures[-1], flush=True)
                        continue
                    rows.append(r)
                    replay = r["replay_us_per_step"]
                    print(f"{mode:4s} {shape} {cell:13s} {what:10s} torch cpu {r['torch_cpu_ms']:7.2f} gpu "
                          f"{r['torch_gpu_ms']:7.2f} | steps cpu {r['steps_cpu_ms']:7.2f} gpu "
                          f"{r['steps_gpu_ms']:7.2f} | graph cpu {r['graph_cpu_ms']:7.2f} gpu "
                          f"{r['graph_gpu_ms']:7.2f} | graph/torch {r['graph_over_torch_gpu']:5.2f} | replay "
                          f"{'-' if replay is None else f'{replay:.1f}'} us/step", flush=True)
    if rows:
        ratios = [r["graph_over_torch_gpu"] for r in rows]
        print(f"graph/torch device time: median {statistics.median(ratios):.2f}, max {max(ratios):.2f}")
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "failures": failures}, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
