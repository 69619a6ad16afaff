"""The demo's training step (``python -m arrayrnn.demo``'s model and batch) against PyTorch's, CPU, float32.

    python bench/bench_demo_step.py                 # 7 rounds of 20 steps per side
    python bench/bench_demo_step.py --rounds 3 --steps 5

Sides, each timed over ``--steps`` training steps (ours: :func:`arrayrnn.demo.train`, the demo's loop: a
random batch of windows, ``value_and_grad`` of the loss, gradient clipping, an Adam step; it starts a new Adam
each round) after two untimed steps, alternated in every round (the side that
goes first rotates; each after a pause of 0.5 s, so no side runs beside the threads another left spinning):

- ``blas held``: the demo as it runs (:func:`arrayrnn.demo.blas_beside`: NumPy's BLAS at one thread while
  the LSTM runs on the numba engine's threads);
- ``blas free``: the same with NumPy's BLAS left at its own threads (the head's products then leave
  OpenBLAS's threads spinning on the cores the engine's threads need);
- ``torch``: ``nn.Embedding -> nn.LSTM -> nn.Linear``, cross-entropy, ``clip_grad_norm_``, ``Adam``, on
  the same windows, with ``torch.set_num_threads(--threads)``.

Reported: the median over rounds of each side's milliseconds per step and of the per-round ratios against
torch. Never asserts timings.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

GAP_S = 0.5   # before each side: the threads the last side left spinning (OpenBLAS ~0.1 s, OpenMP's) sleep
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import arrayrnn as ar  # noqa: E402
from arrayrnn import demo  # noqa: E402


def ours(ids: np.ndarray, cfg: demo.Config, held: bool) -> Callable[[int], None]:
    """``n`` steps of the demo's own training loop (:func:`arrayrnn.demo.train`) on one model."""
    model = demo.CharModel(int(ids.max()) + 1, cfg)

    def steps(n: int) -> None:
        with demo.blas_beside(model.lstm.engine) if held else contextlib.nullcontext():
            demo.train(replace(cfg, steps=n), ids, model, progress=False)
    return steps


def theirs(ids: np.ndarray, cfg: demo.Config) -> Callable[[int], None]:
    vocab = int(ids.max()) + 1
    embedding, lstm = torch.nn.Embedding(vocab, cfg.embed), torch.nn.LSTM(cfg.embed, cfg.hidden, cfg.layers)
    head = torch.nn.Linear(cfg.hidden, vocab)
    params = [*embedding.parameters(), *lstm.parameters(), *head.parameters()]
    opt = torch.optim.Adam(params, lr=cfg.lr)
    rng = np.random.default_rng(0)

    def steps(n: int) -> None:
        for _ in range(n):
            window = torch.from_numpy(demo.random_windows(ids, cfg.batch, cfg.seq_len, rng))
            y, _ = lstm(embedding(window[:-1]))
            loss = torch.nn.functional.cross_entropy(head(y).reshape(-1, vocab), window[1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.clip)
            opt.step()
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    ar.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    cfg = demo.Config()
    text = demo.load_text()
    ids = demo.Vocabulary(text).encode(text)
    sides = {"blas held": ours(ids, cfg, True), "blas free": ours(ids, cfg, False), "torch": theirs(ids, cfg)}
    for run in sides.values():
        run(2)
    times: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(args.rounds):
        names = list(sides)[r % len(sides):] + list(sides)[:r % len(sides)]
        for name in names:
            time.sleep(GAP_S)
            start = time.perf_counter()
            sides[name](args.steps)
            times[name].append((time.perf_counter() - start) / args.steps * 1e3)
    print(f"Command: `python bench/bench_demo_step.py --rounds {args.rounds} --steps {args.steps} "
          f"--threads {args.threads}`; ms per training step, median of {args.rounds} rounds\n")
    print("| side | ms/step | / torch |\n|---|---|---|")
    for name, values in times.items():
        ratio = statistics.median(a / b for a, b in zip(values, times["torch"], strict=True))
        print(f"| {name} | {statistics.median(values):.1f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
