"""The numba engine against PyTorch CPU on bench/SHAPES.md's S1-S4 (LSTM, GRU; forward and training step).

One process, 2 threads each, the two sides alternated per call, median of ``--rounds`` calls; prints one
JSON object ``{"S1 lstm fwd": [ours_ms, torch_ms], ...}``. Run it once in each of two checkouts to compare
two versions of the engine (same machine, back to back)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 \
        ARRAYRNN_NUM_THREADS=2 PYTHONPATH=. python bench/bench_numba_vs_torch.py --rounds 7
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

import arrayrnn as ar

SHAPES = {"S1": (100, 64, 256, 256, 1, False), "S2": (50, 16, 128, 512, 2, False),
          "S3": (200, 1, 64, 128, 1, False), "S4": (100, 64, 256, 256, 2, True)}


def sides(mode: str, T: int, B: int, I: int, H: int, layers: int, bidirectional: bool) -> dict:
    params = ar.PackedParams.init(ar.RNNSpec(mode, I, H, layers, bidirectional=bidirectional), seed=0)
    x = np.random.default_rng(0).standard_normal((T, B, I)).astype(np.float32)
    lengths = np.full(B, T)
    module = (torch.nn.LSTM if mode == "lstm" else torch.nn.GRU)(I, H, layers, bidirectional=bidirectional)
    xt = torch.from_numpy(x)
    xg = xt.clone().requires_grad_()

    def ours_train() -> None:
        res = ar.rnn_forward(params, x, lengths, engine="numba", training=True)
        ar.rnn_backward(res, np.ones_like(res.y))

    def torch_forward() -> None:
        with torch.no_grad():
            module(xt)

    def torch_train() -> None:
        y, _ = module(xg)
        y.backward(torch.ones_like(y))

    return {"fwd": (lambda: ar.rnn_forward(params, x, lengths, engine="numba"), torch_forward),
            "train": (ours_train, torch_train)}


def median_ms(pair: tuple, rounds: int) -> list[float]:
    for f in pair:
        f(), f()
    times: list[list[float]] = [[], []]
    for _ in range(rounds):
        for i, f in enumerate(pair):
            start = time.perf_counter()
            f()
            times[i].append(time.perf_counter() - start)
    return [1e3 * float(np.median(t)) for t in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(2)
    out = {}
    for name, shape in SHAPES.items():
        for mode in ("lstm", "gru"):
            for phase, pair in sides(mode, *shape).items():
                out[f"{name} {mode} {phase}"] = median_ms(pair, args.rounds)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
