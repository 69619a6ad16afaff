"""Layer normalisation (issue 38) on CPU at S1: the memory of the saved statistics, and arrayrnn's call
against the PyTorch Python loop a user writes without it.

S1: T=100, B=64, I=256, H=256, float32, one layer. Rows (medians of ``--repeats`` alternated runs):

- arrayrnn, ``layer_norm=True``, ``engine="auto"`` (on CPU the reference engine: the numba engine declines
  layer norm until its fused kernels land), forward (inference) and training step (``rnn_forward(training=
  True)`` + ``rnn_backward``); the plain LSTM on ``"auto"`` (numba) and on the reference engine beside it;
- the PyTorch loop: per step ``F.linear`` of x and of h, ``F.layer_norm`` of each (and of c), the LSTM gates
  in torch ops (``nn.LSTMCell`` cannot normalise inside its gates), autograd for the backward; the loop is
  first checked against arrayrnn's result in float64 (the same formulas, 1e-10).

Memory: the statistics are 2 numbers (mean, 1/std) per normalised row per step, ``T * B * S * 2 * itemsize``
per layer-direction, ``S = spec.norms_per_step`` (LSTM 2, reset-after GRU 1, reset-before GRU 2, RNN 1);
printed against the measured ``norm_stats`` array and the rest of the training cache.

Usage: OPENBLAS_NUM_THREADS=1 python -m bench.bench_layer_norm [--repeats 5] [--threads 1]
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
from arrayrnn.engines import probe_call, select_engine

T, B, I, H = 100, 64, 256, 256


def torch_loop(flat: torch.Tensor, spec: ar.RNNSpec, x: torch.Tensor) -> torch.Tensor:
    """The user's layer-normalised LSTM as a Python loop over steps (one layer, one direction)."""
    w = {b.name: flat[b.offset:b.stop].view(b.shape) for b in ar.layout_of(spec).blocks}
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
    """Milliseconds, the median of ``repeats`` rounds that run every entry once (after one warm-up)."""
    for fn in runs.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            start = time.perf_counter()
            fn()
            times[name].append(1e3 * (time.perf_counter() - start))
    return {name: statistics.median(v) for name, v in times.items()}


def memory_rows(spec: ar.RNNSpec, x: np.ndarray) -> list[str]:
    res = ar.rnn_forward(ar.PackedParams.init(spec, seed=0), x, training=True, seed=1, engine="reference")
    cache = res._saved.cache.layers[0][0].cache
    formula = T * B * spec.norms_per_step * 2 * np.dtype(spec.dtype).itemsize
    total = cache.nbytes_per_step_row() * T * B
    return [f"| statistics, formula T*B*S*2*itemsize (S = {spec.norms_per_step}) | {formula:,} |",
            f"| statistics, measured norm_stats.nbytes | {cache.norm_stats.nbytes:,} |",
            f"| the whole training cache of the layer-direction (gates, c, tanh c, statistics) | {total:,} |"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads (%(default)s)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch loop vs arrayrnn, float64, T=7 B=3: max |dy| = {check_the_loop():.2e}")
    spec = ar.RNNSpec("lstm", I, H, layer_norm=True)
    plain = spec.replace(layer_norm=False)
    x = np.random.default_rng(0).standard_normal((T, B, I)).astype(np.float32)
    auto = select_engine("auto", probe_call(spec, training=True)).name
    auto_plain = select_engine("auto", probe_call(plain, training=True)).name
    runs = {}
    for name, (fwd, step) in {f"arrayrnn layer_norm, auto = {auto}": arrayrnn_runs(spec, x, "auto"),
                              f"arrayrnn plain, auto = {auto_plain}": arrayrnn_runs(plain, x, "auto"),
                              "arrayrnn plain, reference": arrayrnn_runs(plain, x, "reference"),
                              "PyTorch loop, F.layer_norm": torch_runs(spec, x)}.items():
        runs[f"{name} | forward"], runs[f"{name} | training step"] = fwd, step
    result = medians(runs, args.repeats)
    print("| S1 LSTM, float32 | pass | median ms |\n|---|---|---|")
    for name, ms in result.items():
        print(f"| {name} | {ms:.1f} |")
    print("\n| memory (S1 LSTM, float32, one layer-direction) | bytes |\n|---|---|")
    print("\n".join(memory_rows(spec, x)))


if __name__ == "__main__":
    main()
