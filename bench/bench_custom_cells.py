"""Custom cells on the numba engine (issue 47): an LSTM written through the cell API against the built-in, and
sLSTM against a PyTorch autograd loop of the same cell.

Rows (float32, time-major, one layer, shapes of bench/SHAPES.md, ``--threads`` threads for arrayrnn and for
torch):

- ``twin_lstm`` (tests/support/twin_cells.py: the built-in LSTM's equations through ``ar.Cell``, the same
  weights) against ``mode="lstm"``, both ``engine="numba"``, forward (inference) and training step
  (``rnn_forward(training=True)`` + ``rnn_backward``): the median of the per-round ratios twin / built-in
  (target: <= 1.1x at S1 and S3);
- ``mode="slstm"`` (arrayrnn/cells/slstm.py) on the numba engine against tests/support/slstm_torch.py's
  ``slstm_loop`` (the same equations as torch ops, autograd for the backward): the median of the per-round
  speedups torch / numba (target: >= 5x); where the ``flashrnn`` package is installed, also against
  FlashRNN's pure-PyTorch backend (``flashrnn.flashrnn(..., function="slstm", backend="vanilla")``: its own
  loop of torch ops, one head; the input product ``x @ W_ih.T + b_ih`` inside the timed call).

Each round runs the pair in turn, the order rotated every round; each side is called once untimed, then,
after a pause (``GAP_S``: OpenBLAS's and torch's idle threads spin for ~0.1 s after a call and slow the next
side), once timed. The compiled loops are warmed before the rounds (``ar.warmup(spec)``: a custom cell's
loops compile per process). This script never asserts timings.

Usage: python bench/bench_custom_cells.py [--rounds 9] [--shapes S1,S3] [--threads 2] [--no-slstm]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # support.twin_cells, support.slstm_torch: one definition each

from support.twin_cells import twin_params  # noqa: E402

import arrayrnn as ar  # noqa: E402
import arrayrnn.cells  # noqa: E402, F401 - registers "cifg" and "slstm"

SHAPES = {"S1": (100, 64, 256, 256), "S3": (200, 1, 64, 128), "Q1": (8, 4, 8, 16)}  # T, B, I, H
GAP_S = 0.2
Run = Callable[[], None]


def arrayrnn_runs(params: ar.PackedParams, x: np.ndarray) -> tuple[Run, Run]:
    """(forward, training step) of ``params`` on the numba engine."""
    def forward() -> None:
        ar.rnn_forward(params, x, engine="numba")

    def step() -> None:
        res = ar.rnn_forward(params, x, training=True, engine="numba")
        ar.rnn_backward(res, dy=np.ones_like(res.y))

    return forward, step


def torch_slstm_runs(params: ar.PackedParams, x: np.ndarray) -> tuple[Run, Run]:
    """(forward, training step) of the PyTorch sLSTM loop on ``params``' weights."""
    import torch
    from support.slstm_torch import slstm_loop

    names = ("W_ih", "W_hh", "b_ih", "b_hh")
    w = [torch.from_numpy(params.view(0, 0, n).copy()).requires_grad_() for n in names]
    xt = torch.from_numpy(x)

    def forward() -> None:
        with torch.no_grad():
            slstm_loop(xt, *w)

    def step() -> None:
        for t in w:
            t.grad = None
        slstm_loop(xt, *w)[0].sum().backward()

    return forward, step


def flashrnn_runs(params: ar.PackedParams, x: np.ndarray) -> tuple[Run, Run]:
    """(forward, training step) of FlashRNN's vanilla sLSTM on ``params``' weights (one head), or raise
    ``ImportError`` where ``flashrnn`` is not installed."""
    import flashrnn
    import torch

    T, B, _ = x.shape
    H = params.spec.hidden_size
    names = ("W_ih", "W_hh", "b_ih", "b_hh")
    w = [torch.from_numpy(params.view(0, 0, n).copy()).requires_grad_() for n in names]
    xt = torch.from_numpy(x)

    def run() -> torch.Tensor:
        W_ih, W_hh, b_ih, b_hh = w
        Wx = (xt @ W_ih.T + b_ih).transpose(0, 1).reshape(B, T, 4, 1, H)
        states, _ = flashrnn.flashrnn(Wx, W_hh.reshape(4, 1, H, H), b_hh.reshape(4, 1, H), function="slstm",
                                      backend="vanilla", dtype="float32")
        return states[0]

    def forward() -> None:
        with torch.no_grad():
            run()

    def step() -> None:
        for t in w:
            t.grad = None
        run().sum().backward()

    return forward, step


def timed(fn: Run) -> float:
    """Milliseconds of one call of ``fn``, after an untimed call and a pause."""
    fn()
    time.sleep(GAP_S)
    start = time.perf_counter()
    fn()
    return 1e3 * (time.perf_counter() - start)


def alternated(a: Run, b: Run, rounds: int) -> tuple[float, float, float]:
    """Medians of ``a``'s ms, ``b``'s ms and the per-round ratio a / b, the order rotated each round."""
    times_a, times_b, ratios = [], [], []
    for k in range(rounds):
        if k % 2:
            tb, ta = timed(b), timed(a)
        else:
            ta, tb = timed(a), timed(b)
        times_a.append(ta)
        times_b.append(tb)
        ratios.append(ta / tb)
    return statistics.median(times_a), statistics.median(times_b), statistics.median(ratios)


def twin_rows(shape: str, rounds: int) -> list[str]:
    T, B, I, H = SHAPES[shape]
    params = ar.PackedParams.init(ar.RNNSpec("lstm", I, H), seed=0)
    twin = twin_params(params)
    x = np.random.default_rng(0).standard_normal((T, B, I)).astype(np.float32)
    ar.warmup(twin.spec, "float32", progress=False)
    rows = []
    for phase, (builtin_run, twin_run) in zip(("forward", "training step"),
                                              zip(arrayrnn_runs(params, x), arrayrnn_runs(twin, x),
                                                  strict=True), strict=True):
        ms_twin, ms_builtin, ratio = alternated(twin_run, builtin_run, rounds)
        rows.append(f"| {shape} | twin_lstm / lstm, numba | {phase} | {ms_twin:.2f} | {ms_builtin:.2f} | "
                    f"{ratio:.3f}x |")
    return rows


def slstm_rows(shape: str, rounds: int) -> list[str]:
    T, B, I, H = SHAPES[shape]
    params = ar.PackedParams.init(ar.RNNSpec("slstm", I, H), seed=0)
    x = np.random.default_rng(0).standard_normal((T, B, I)).astype(np.float32)
    ar.warmup(params.spec, "float32", progress=False)
    peers = {"PyTorch sLSTM loop": torch_slstm_runs(params, x)}
    try:
        peers["FlashRNN vanilla"] = flashrnn_runs(params, x)
    except ImportError:
        print("(flashrnn is not installed: no FlashRNN rows)")
    rows = []
    for peer, runs in peers.items():
        for phase, ours, theirs in zip(("forward", "training step"), arrayrnn_runs(params, x), runs,
                                       strict=True):
            ms_peer, ms_ours, speedup = alternated(theirs, ours, rounds)
            rows.append(f"| {shape} | {peer} / slstm, numba | {phase} | {ms_peer:.2f} | {ms_ours:.2f} | "
                        f"{speedup:.2f}x |")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--shapes", default="S1,S3")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-slstm", action="store_true", help="skip the sLSTM rows (no torch)")
    args = parser.parse_args(argv)
    ar.set_num_threads(args.threads)
    slstm = not args.no_slstm
    if slstm:
        import torch

        torch.set_num_threads(args.threads)
    torch_threads = f", torch {torch.get_num_threads()}" if slstm else ""
    print(f"threads: arrayrnn {ar.get_num_threads()}{torch_threads}")
    print("| shape | pair (a / b) | pass | a: median ms | b: median ms | median of per-round a / b |")
    print("|---|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        for row in twin_rows(shape, args.rounds) + (slstm_rows(shape, args.rounds) if slstm else []):
            print(row, flush=True)


if __name__ == "__main__":
    main()
