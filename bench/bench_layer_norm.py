"""Layer normalisation (issue 38) on CPU: the fused numba loops against the plain layer, against the
PyTorch Python loop a user writes without arrayrnn, and the memory of the saved statistics.

Shapes (bench/SHAPES.md, float32, time-major): S1 (T=100, B=64, I=256, H=256, one layer) and S2 (T=50, B=16,
I=128, H=512, two layers). Rows, each the median of ``--repeats`` rounds that run every row twice and time
the second after a pause (the row before may leave BLAS or torch threads spinning for a while):

- arrayrnn ``layer_norm=True`` on the numba engine and the plain LSTM on the numba engine, forward (inference)
  and training step (``rnn_forward(training=True)`` + ``rnn_backward``); their ratio (targets: forward <=
  1.25x, training <= 1.3x); the reference engine's layer-normalised call beside them;
- S1 only, the PyTorch loop: per step ``F.linear`` of x and of h, ``F.layer_norm`` of each (and of c), the
  LSTM gates in torch ops (``nn.LSTMCell`` cannot normalise inside its gates), autograd for the backward;
  the loop is first checked against arrayrnn's result in float64 (the same formulas, 1e-10). Target: the
  numba call >= 5x faster. torch runs on as many threads as arrayrnn (``--threads``).

Memory: the statistics are 2 numbers (mean, 1/std) per normalised row per step, ``T * B * S * 2 * itemsize``
per layer-direction, ``S = spec.norms_per_step`` (LSTM 2, reset-after GRU 1, reset-before GRU 2, RNN 1);
printed against the measured ``norm_stats`` array and the rest of the training cache.

Usage: python -m bench.bench_layer_norm [--repeats 7] [--shapes S1,S2] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

import arrayrnn as ar

T, B, I, H = 100, 64, 256, 256  # S1
SETTLE_S = 0.3  # the pause before each timed run (OpenBLAS's threads spin ~0.1 s before they sleep)
SHAPES = {"S1": (100, 64, 256, 256, 1), "S2": (50, 16, 128, 512, 2)}  # T, B, I, H, layers


def torch_loop(flat: torch.Tensor, spec: ar.RNNSpec, x: torch.Tensor) -> torch.Tensor:
    """The user's layer-normalised LSTM as a Python loop over steps (one layer, one direction)."""
    w = {b.name: flat[b.offset:b.stop].view(b.shape) for b in ar.layout_of(spec).blocks}
    H = spec.hidden_size
    eps, h = spec.layer_norm_eps, x.new_zeros(x.shape[1], H)
    c, ys = x.new_zeros(x.shape[1], H), []
    for t in range(x.shape[0]):
        pre = (w["g_ih"] * F.layer_norm(F.linear(x[t], w["W_ih"]), (4 * H,), eps=eps)
               + w["g_hh"] * F.layer_norm(F.linear(h, w["W_hh"]), (4 * H,), eps=eps) + w["b_ih"] + w["b_hh"])
        i, f, g, o = pre.chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(w["g_c"] * F.layer_norm(c, (H,), eps=eps) + w["b_c"])
        ys.append(h)
    return torch.stack(ys)


def check_the_loop() -> float:
    """Largest difference of the torch loop's ``y`` from arrayrnn's (float64, small shape, spread gains)."""
    spec = ar.RNNSpec("lstm", I, H, layer_norm=True, dtype="float64")
    params = ar.PackedParams.init(spec, seed=2)
    params.data[:] += 0.3 * np.random.default_rng(2).standard_normal(params.data.shape)
    x = np.random.default_rng(3).standard_normal((7, 3, I))
    got = torch_loop(torch.from_numpy(params.data), spec, torch.from_numpy(x)).numpy()
    return float(np.abs(got - ar.rnn_forward(params, x).y).max())


def arrayrnn_runs(spec: ar.RNNSpec, x: np.ndarray, engine: str) -> tuple[Callable, Callable]:
    params = ar.PackedParams.init(spec, seed=0)

    def forward() -> None:
        ar.rnn_forward(params, x, engine=engine)

    def step() -> None:
        res = ar.rnn_forward(params, x, training=True, seed=1, engine=engine)
        ar.rnn_backward(res, dy=np.ones_like(res.y))

    return forward, step


def torch_runs(spec: ar.RNNSpec, x: np.ndarray) -> tuple[Callable, Callable]:
    flat = torch.from_numpy(ar.PackedParams.init(spec, seed=0).data.copy()).requires_grad_()
    xt = torch.from_numpy(x)

    def forward() -> None:
        with torch.no_grad():
            torch_loop(flat, spec, xt)

    def step() -> None:
        flat.grad = None
        torch_loop(flat, spec, xt).sum().backward()

    return forward, step


def medians(runs: dict[str, Callable], repeats: int) -> dict[str, float]:
    """Milliseconds, the median of ``repeats`` rounds that run every entry twice, timing the second after a
    pause: the previous entry's threads (OpenBLAS's, torch's) spin for a while after it returned and slowed
    whatever ran next (measured: the numba S2 forward read 54 ms after the reference engine's rows, 38 ms
    alone)."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            fn()
            time.sleep(SETTLE_S)
            start = time.perf_counter()
            fn()
            times[name].append(1e3 * (time.perf_counter() - start))
    return {name: statistics.median(v) for name, v in times.items()}


def memory_rows(spec: ar.RNNSpec, x: np.ndarray) -> list[str]:
    res = ar.rnn_forward(ar.PackedParams.init(spec, seed=0), x, training=True, seed=1, engine="numba")
    cache = res._saved.cache.layers[0][0].cache
    T, B = x.shape[:2]
    formula = T * B * spec.norms_per_step * 2 * np.dtype(spec.dtype).itemsize
    total = cache.nbytes_per_step_row() * T * B
    return [f"| statistics, formula T*B*S*2*itemsize (S = {spec.norms_per_step}) | {formula:,} |",
            f"| statistics, measured norm_stats.nbytes | {cache.norm_stats.nbytes:,} |",
            f"| the whole training cache of the layer-direction (gates, c, tanh c, statistics) | {total:,} |"]


def shape_runs(name: str) -> tuple[dict[str, Callable], ar.RNNSpec, np.ndarray]:
    T, B, I, H, layers = SHAPES[name]
    spec = ar.RNNSpec("lstm", I, H, num_layers=layers, layer_norm=True)
    plain = spec.replace(layer_norm=False)
    x = np.random.default_rng(0).standard_normal((T, B, I)).astype(np.float32)
    calls = {"layer_norm, numba": arrayrnn_runs(spec, x, "numba"),
             "plain, numba": arrayrnn_runs(plain, x, "numba"),
             "layer_norm, reference": arrayrnn_runs(spec, x, "reference")}
    if layers == 1:
        calls["PyTorch loop, F.layer_norm"] = torch_runs(spec, x)
    runs = {}
    for row, (fwd, step) in calls.items():
        runs[f"{name} | {row} | forward"], runs[f"{name} | {row} | training step"] = fwd, step
    return runs, spec, x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--shapes", default="S1,S2")
    parser.add_argument("--threads", type=int, default=ar.get_num_threads(),
                        help="torch's intra-op threads (default: arrayrnn's, %(default)s)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch loop vs arrayrnn, float64, T=7 B=3: max |dy| = {check_the_loop():.2e}")
    print(f"threads: arrayrnn {ar.get_num_threads()}, torch {torch.get_num_threads()}")
    print("| shape | call | pass | median ms | / plain numba | PyTorch loop / this |")
    print("|---|---|---|---|---|---|")
    for name in args.shapes.split(","):
        runs, spec, x = shape_runs(name)
        result = medians(runs, args.repeats)
        for key, ms in result.items():
            shape, row, phase = key.split(" | ")
            plain = result[f"{shape} | plain, numba | {phase}"]
            loop = result.get(f"{shape} | PyTorch loop, F.layer_norm | {phase}")
            vs_loop = f"{loop / ms:.2f}" if loop is not None else ""
            print(f"| {shape} | {row} | {phase} | {ms:.1f} | {ms / plain:.2f} | {vs_loop} |")
    spec = ar.RNNSpec("lstm", I, H, layer_norm=True)
    x = np.random.default_rng(0).standard_normal((T, B, I)).astype(np.float32)
    print("\n| memory (S1 LSTM, float32, one layer-direction) | bytes |\n|---|---|")
    print("\n".join(memory_rows(spec, x)))


if __name__ == "__main__":
    main()
