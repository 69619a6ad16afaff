"""The streaming call: ``ar.rnn_forward`` of one time step (NumPy API) against ``torch.nn``'s module on the
same weights, same run (CPU, float32, one thread each): inference, and a training step (``rnn_forward(...,
training=True)`` + ``rnn_backward``, against the module's forward + ``backward()`` of ``y.sum()``, the
weights' gradients included).

    python bench/bench_streaming.py                  # LSTM and GRU, B in {1, 8}, H in {64, 256}, 9 rounds
    python bench/bench_streaming.py --what forward   # the inference rows only
    PYTHONPATH=/path/to/other/checkout python bench/bench_streaming.py   # the same rows on another tree

Each round times both sides, alternated (the side that goes first alternates), each over a batch of calls
lasting about ``--batch-ms`` after untimed calls of the same side; ``--clock cpu`` (the default) takes
the calling thread's CPU time, which a busy shared machine disturbs less than wall time. Reported: each
side's median per-call time and the median of the per-round ratios ours / torch, beside issue 46's target
where it sets one. The weights never change between calls (the streaming case: the numba engine reuses
its private copy of them and what it packed, see ``arrayrnn.frontend.guard.frozen_copy``). Never asserts
timings.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import numpy as np
import torch

import arrayrnn as ar

TARGETS = {("forward", "lstm", 1, 64): 1.2, ("forward", "lstm", 8, 256): 1.0,  # issue 46
           ("train", "lstm", 1, 64): 1.2, ("train", "lstm", 8, 256): 1.2}


def _clock(kind: str):
    return time.thread_time if kind == "cpu" else time.perf_counter


def _per_call(fn, batch_s: float, clock) -> float:
    start = clock()
    while clock() - start < 0.05:  # untimed calls of this side first
        fn()
    calls, start = 0, clock()
    while (elapsed := clock() - start) < batch_s:
        fn()
        calls += 1
    return elapsed / calls


def _sides(mode: str, B: int, H: int, what: str):
    spec = ar.RNNSpec(mode=mode, input_size=H, hidden_size=H, dtype="float32")
    params = ar.PackedParams.init(spec, seed=0)
    module = (torch.nn.LSTM if mode == "lstm" else torch.nn.GRU)(H, H)
    names = {"weight_ih_l0": "W_ih", "weight_hh_l0": "W_hh", "bias_ih_l0": "b_ih", "bias_hh_l0": "b_hh"}
    with torch.no_grad():  # the canonical layout is PyTorch's (gate order included)
        for theirs, ours in names.items():
            getattr(module, theirs).copy_(torch.from_numpy(params.view(0, 0, ours).copy()))
    x = np.random.default_rng(0).standard_normal((1, B, H)).astype(np.float32)
    xt = torch.from_numpy(x)
    dy = np.ones((1, B, H), np.float32)
    if what == "train":
        res = ar.rnn_forward(params, x, training=True, engine="numba")
        ours_grad = ar.rnn_backward(res, dy).dparams.view(0, 0, "W_ih")
        module(xt.requires_grad_())[0].sum().backward()
        diff = float(np.abs(ours_grad - module.weight_ih_l0.grad.numpy()).max())

        def ours_call() -> None:
            ar.rnn_backward(ar.rnn_forward(params, x, training=True, engine="numba"), dy)

        def torch_call() -> None:
            module.zero_grad(set_to_none=True)
            module(xt)[0].sum().backward()

        return ours_call, torch_call, diff
    ours = ar.rnn_forward(params, x, engine="numba").y
    with torch.no_grad():
        theirs = module(xt)[0].numpy()
    diff = float(np.abs(ours - theirs).max())

    def torch_call() -> None:
        with torch.no_grad():
            module(xt)

    return (lambda: ar.rnn_forward(params, x, engine="numba")), torch_call, diff


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--batch-ms", type=float, default=50.0)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--what", default="forward,train", help="rows: forward, train or both (comma)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    ar.set_num_threads(1)
    clock = _clock(args.clock)
    print(f"torch {torch.__version__}, arrayrnn at {ar.__file__}, 1 thread, {args.rounds} alternated rounds, "
          f"{args.clock} clock")
    print("| row | B | H | ours us | torch us | ours / torch | target | max abs diff |")
    print("|---|---|---|---|---|---|---|---|")
    for what, mode in itertools.product(args.what.split(","), ("lstm", "gru")):
        for B, H in ((1, 64), (8, 64), (1, 256), (8, 256)):
            ours, theirs, diff = _sides(mode, B, H, what)
            times: dict[str, list[float]] = {"ours": [], "torch": []}
            sides = [("ours", ours), ("torch", theirs)]
            for r in range(args.rounds):
                for side, fn in sides if r % 2 == 0 else sides[::-1]:
                    times[side].append(_per_call(fn, args.batch_ms / 1e3, clock))
            ratio = statistics.median(a / b for a, b in zip(times["ours"], times["torch"], strict=True))
            target = TARGETS.get((what, mode, B, H))
            verdict = "" if target is None else f"<= {target} {'met' if ratio <= target else 'NOT met'}"
            print(f"| {mode} {what}, T = 1 | {B} | {H} | {statistics.median(times['ours']) * 1e6:.1f} | "
                  f"{statistics.median(times['torch']) * 1e6:.1f} | {ratio:.2f} | {verdict} | {diff:.1e} |")


if __name__ == "__main__":
    main()
