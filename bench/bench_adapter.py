"""Overhead of the framework adapters against calling rnn_forward / rnn_backward directly (CPU).

    python bench/bench_adapter.py                 # S1 LSTM training step, 9 alternated triples
    python bench/bench_adapter.py --quick         # smoke run: tiny shape, 2 triples

One training step = forward + backward with ``dy = 1`` (the gradient of ``y.sum()``), input gradient
included, float32, time-major, S1 (T=100, B=64, I=256, H=256), the auto engine:

- ``direct``: ``res = ar.rnn_forward(params, x, training=True); ar.rnn_backward(res, dy=ones)``
- ``torch``:  ``y, _ = ArrayRNN(...)(x); y.backward(ones)`` (x.requires_grad, so dx is computed too)
- ``dropin``: the same through ``arrayrnn.torch.LSTM`` (per-weight Parameters that are views of one buffer;
  their gradients views of one gradient buffer)
- ``jax``:    ``jax.jit(jax.grad(sum of y, argnums=(0, 1)))`` through ``arrayrnn.jax.rnn``; its backward
  recomputes the forward (the residuals are the inputs), so it runs two forwards per step.

The sides run in alternated order within each round (the first side rotates); before every timed call
one untimed call of the same side warms it. Reported: each side's median time and the median over
rounds of the per-round ratio side / direct. Same BLAS thread count for all (``--threads``).
Never asserts timings.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import threadpoolctl
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import arrayrnn as ar  # noqa: E402
from arrayrnn.torch import LSTM, ArrayRNN  # noqa: E402


def direct_step(params, x):
    dy = np.ones((x.shape[0], x.shape[1], params.spec.output_size), x.dtype)

    def step():
        res = ar.rnn_forward(params, x, training=True)
        ar.rnn_backward(res, dy=dy)
    return step


def torch_step(params, x):
    module = ArrayRNN(params.spec, seed=0)
    with torch.no_grad():
        module.flat.copy_(torch.from_numpy(params.data))
    xt = torch.from_numpy(x).requires_grad_()
    dy = torch.ones(x.shape[0], x.shape[1], params.spec.output_size)  # allocated once, as on the direct side

    def step():
        module.flat.grad = xt.grad = None
        y, _ = module(xt)
        y.backward(dy)
    return step


def dropin_step(params, x):
    spec = params.spec
    module = LSTM(spec.input_size, spec.hidden_size)
    with torch.no_grad():
        module.flat.copy_(torch.from_numpy(params.data))
    xt = torch.from_numpy(x).requires_grad_()
    dy = torch.ones(x.shape[0], x.shape[1], spec.output_size)

    def step():
        module.zero_grad()
        xt.grad = None
        y, _ = module(xt)
        y.backward(dy)
    return step


def jax_step(params, x):
    import jax
    import jax.numpy as jnp

    from arrayrnn.jax import rnn

    grad = jax.jit(jax.grad(lambda p, x: jnp.sum(rnn(params.spec, p, x)[0]), argnums=(0, 1)))
    p, xj = jnp.asarray(params.data), jnp.asarray(x)

    def step():
        jax.block_until_ready(grad(p, xj))
    return step


def timed(step) -> float:
    step()  # untimed warm call of the same side
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def measure(steps: dict, rounds: int) -> dict[str, list[float]]:
    names, times = list(steps), {name: [] for name in steps}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(timed(steps[name]))
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="tiny shape, 2 rounds")
    parser.add_argument("--no-jax", action="store_true")
    args = parser.parse_args(argv)
    T, B, I, H = (8, 4, 8, 16) if args.quick else (100, 64, 256, 256)
    rounds = 2 if args.quick else args.rounds
    spec = ar.RNNSpec(mode="lstm", input_size=I, hidden_size=H, dtype="float32")
    params = ar.PackedParams.init(spec, seed=0)
    x = np.random.default_rng(0).standard_normal((T, B, I)).astype(np.float32)
    steps = {"direct": direct_step(params, x), "torch": torch_step(params, x),
             "dropin": dropin_step(params, x)}
    if not args.no_jax:
        steps["jax"] = jax_step(params, x)
    torch.set_num_threads(args.threads)
    with threadpoolctl.threadpool_limits(args.threads):
        times = measure(steps, rounds)
    print(f"LSTM training step T={T} B={B} I={I} H={H} float32, {args.threads} threads, {rounds} rounds")
    print("| side | median ms | ratio to direct (median of per-round ratios) |")
    print("|------|-----------|-----------------------------------------------|")
    for name, values in times.items():
        ratio = statistics.median(v / d for v, d in zip(values, times["direct"], strict=True))
        print(f"| {name} | {1e3 * statistics.median(values):.1f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
