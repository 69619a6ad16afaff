"""Small calls: microseconds per call of the drop-ins against ``torch.nn`` in the same run (CPU, float32).

    python bench/bench_small_calls.py               # the grid below, 9 rounds
    python bench/bench_small_calls.py --quick       # smoke run: H = 64 only, 3 rounds, short batches
    python bench/bench_small_calls.py --only "cell step" --sizes 64,256,512 --clock cpu  # issue 46's cells

Rows (one layer, ``input_size = H``, time-major):

- ``lstm forward``: ``LSTM(x)`` under ``torch.no_grad()``, against ``nn.LSTM``;
- ``lstm train``: ``zero_grad``, ``y, _ = LSTM(x)``, ``y.square().mean().backward()`` (the weights'
  gradients; ``x`` needs none), against ``nn.LSTM``;

  both at ``T`` in {1, 10}, ``B`` in {1, 8}, ``H`` in {64, 256};
- ``cell step``: ``LSTMCell(x, (h, c))`` under ``torch.no_grad()``, against ``nn.LSTMCell``;
- ``gru cell step``: ``GRUCell(x, h)`` under ``torch.no_grad()``, against ``nn.GRUCell``;
- ``cell loop``: ``zero_grad``, 100 steps ``h, c = LSTMCell(x[t], (h, c))``, ``h.square().mean()
  .backward()``, against ``nn.LSTMCell``;

  both at ``B`` in {1, 8}, ``H`` in {64, 256}.

Method: both sides have the same weights (``load_state_dict``) and their outputs are compared once per row
(``max|d|``). Each round times both sides, alternated (the side that goes first alternates between
rounds); a side's time in a round is the mean over a batch of calls lasting about ``--batch-ms``, right
after untimed calls of the same side for at least 0.1 s (this VM's idle vCPUs run the first calls after a
pause slow; see ``bench_rnn.py``); ``--clock cpu`` times the calling thread's CPU time instead of wall
time, which a busy shared machine disturbs less (meaningful with one thread only). Reported: the median
over rounds of each side's per-call time and the median of the per-round ratios ours / torch, beside
the issues' target where one is set. torch, the engine (``ar.set_num_threads``) and NumPy's BLAS use
``--threads`` threads. Never asserts timings.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import threadpoolctl
import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import arrayrnn as ar  # noqa: E402
from arrayrnn.torch import LSTM, GRUCell, LSTMCell  # noqa: E402

WARM_S = 0.1
CELL_STEPS = 100
# issue 37's targets (ours / torch): T = 1 forwards at two sizes, every T = 1 training step, the cell loop;
# issue 46's for the cells' step (LSTMCell and GRUCell, B = 1 and 8, H = 64-512)
TARGETS = {("lstm forward", 1, 1, 64): 1.5, ("lstm forward", 1, 8, 256): 1.0, "lstm train T=1": 1.5,
           "cell step": 1.2, "cell loop": 1.2}


@dataclasses.dataclass(frozen=True)
class Row:
    kind: str   # "lstm forward", "lstm train", "cell step", "gru cell step", "cell loop"
    T: int
    B: int
    H: int

    def target(self) -> float | None:
        if "cell" in self.kind:
            return TARGETS[self.kind.removeprefix("gru ")]
        if self.kind == "lstm train":
            return TARGETS["lstm train T=1"] if self.T == 1 else None
        return TARGETS.get((self.kind, self.T, self.B, self.H))


def grid(quick: bool, sizes: list[int]) -> list[Row]:
    sizes = [64] if quick else sizes
    rows = [Row(kind, T, B, H) for kind in ("lstm forward", "lstm train") for H in sizes for T in (1, 10)
            for B in (1, 8)]
    return rows + [Row(kind, CELL_STEPS if kind == "cell loop" else 1, B, H)
                   for kind in ("cell step", "gru cell step", "cell loop") for H in sizes for B in (1, 8)]


# -- the calls ---------------------------------------------------------------------------------------
def pair(row: Row) -> tuple[nn.Module, nn.Module]:
    """(ours, theirs) with the same weights."""
    ours_cls, their_cls = {"cell step": (LSTMCell, nn.LSTMCell), "gru cell step": (GRUCell, nn.GRUCell),
                           "cell loop": (LSTMCell, nn.LSTMCell)}.get(row.kind, (LSTM, nn.LSTM))
    torch.manual_seed(0)
    theirs = their_cls(row.H, row.H)
    ours = ours_cls(row.H, row.H)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


def call(row: Row, module: nn.Module) -> Callable[[], torch.Tensor]:
    """One timed call of ``row`` on ``module``; it returns what the sides' outputs are compared on."""
    torch.manual_seed(1)
    if row.kind.startswith("lstm"):
        x = torch.randn(row.T, row.B, row.H)
        if row.kind == "lstm forward":
            return lambda: _no_grad(lambda: module(x)[0])
        return lambda: _train(module, lambda: module(x)[0])
    x = torch.randn(row.T, row.B, row.H)
    state = (torch.zeros(row.B, row.H), torch.zeros(row.B, row.H))
    if row.kind == "cell step":
        return lambda: _no_grad(lambda: module(x[0], state)[0])
    if row.kind == "gru cell step":
        return lambda: _no_grad(lambda: module(x[0], state[0]))
    return lambda: _train(module, lambda: _cell_loop(module, x, state))


def _no_grad(fn: Callable[[], torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return fn()


def _train(module: nn.Module, forward: Callable[[], torch.Tensor]) -> torch.Tensor:
    module.zero_grad(set_to_none=True)
    y = forward()
    y.square().mean().backward()
    return next(module.parameters()).grad


def _cell_loop(cell: nn.Module, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    h, c = state
    for t in range(x.shape[0]):
        h, c = cell(x[t], (h, c))
    return h


# -- timing ------------------------------------------------------------------------------------------
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def per_call_us(fn: Callable[[], object], batch_s: float, clock: Callable[[], float]) -> float:
    """Mean microseconds per call over a batch of about ``batch_s``, after untimed calls for ``WARM_S``."""
    start = time.perf_counter()
    calls = 0
    while time.perf_counter() - start < WARM_S or calls == 0:
        fn()
        calls += 1
    per_call = (time.perf_counter() - start) / calls
    n = max(1, round(batch_s / per_call))
    start = clock()
    for _ in range(n):
        fn()
    return (clock() - start) / n * 1e6


@dataclasses.dataclass
class Result:
    row: Row
    ours_us: float
    theirs_us: float
    ratio: float
    max_diff: float


def time_row(row: Row, rounds: int, batch_s: float, clock: Callable[[], float]) -> Result:
    ours, theirs = pair(row)
    sides = [call(row, ours), call(row, theirs)]
    diff = float((sides[0]() - sides[1]()).abs().max())
    times: list[tuple[float, float]] = []
    for r in range(rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        got = {side: per_call_us(sides[side], batch_s, clock) for side in order}
        times.append((got[0], got[1]))
    return Result(row, statistics.median(t[0] for t in times), statistics.median(t[1] for t in times),
                  statistics.median(t[0] / t[1] for t in times), diff)


def report(results: list[Result], threads: int, rounds: int, clock: str) -> str:
    lines = [f"torch {torch.__version__}, {threads} thread(s) for torch, the engine and BLAS; median of "
             f"{rounds} alternated rounds; {clock} clock", "",
             "| row | T | B | H | ours us | torch us | ours / torch | target | max abs diff |",
             "|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        row, target = res.row, res.row.target()
        verdict = "" if target is None else f"<= {target} {'met' if res.ratio <= target else 'NOT met'}"
        lines.append(f"| {row.kind} | {row.T} | {row.B} | {row.H} | {res.ours_us:.1f} | "
                     f"{res.theirs_us:.1f} | {res.ratio:.2f} | {verdict} | {res.max_diff:.1e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="H = 64 only, 3 rounds, 5 ms batches")
    parser.add_argument("--rounds", type=int, default=None, help="alternated rounds (default 9; quick 3)")
    parser.add_argument("--batch-ms", type=float, default=None, help="timed batch length (default 50)")
    parser.add_argument("--threads", type=int, default=1, help="threads for torch, the engine and BLAS")
    parser.add_argument("--only", default="", help="rows whose kind contains this text (e.g. 'cell')")
    parser.add_argument("--sizes", default="64,256", help="hidden sizes H, comma-separated")
    parser.add_argument("--no-warmup", action="store_true",
                        help="the default setting: no arrayrnn.warmup() first, so the calls run on whatever "
                             "engine the background compile has reached (else the waiting setting: numba)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall time, or the calling thread's CPU time (steadier on a shared machine; "
                             "right for one thread only)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 9)
    batch_s = (args.batch_ms or (5.0 if args.quick else 50.0)) / 1000
    if not args.no_warmup:  # every call on the numba engine from the first (its loops loaded or compiled)
        ar.warmup(("lstm", "gru"), "float32", progress=False)
    torch.set_num_threads(args.threads)
    ar.set_num_threads(args.threads)  # the engine's threads (numba's own threading layer stays unlaunched)
    with threadpoolctl.threadpool_limits(args.threads, user_api="blas"):
        sizes = [int(h) for h in args.sizes.split(",")]
        rows = [row for row in grid(args.quick, sizes) if args.only in row.kind]
        results = [time_row(row, rounds, batch_s, CLOCKS[args.clock]) for row in rows]
    setting = "default setting: no warmup" if args.no_warmup else "waiting setting: arrayrnn.warmup first"
    print(report(results, args.threads, rounds, args.clock) + f"\n({setting})")


if __name__ == "__main__":
    main()
