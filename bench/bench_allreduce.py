"""All-reduce cost against an S1 LSTM training step, 2 MPI ranks; per-buffer vs one fused all-reduce.

    mpiexec -n 2 python bench/bench_allreduce.py --write      # appends the table to bench/RESULTS.md

Each rank times (median of ``--runs``) an S1 training step (T=100, B=64, I=256, H=256, float32,
rnn_forward + rnn_backward with dy = 1, one BLAS thread per rank), ``allreduce_mean`` of its gradient
buffer, and, for a list of buffers of the demo's sizes (embedding, LSTM, head), ``allreduce_mean(list)``
(one all-reduce per buffer) against packing the list into one buffer, one all-reduce, and unpacking.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import threadpoolctl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import arrayrnn as ar  # noqa: E402
from arrayrnn.distributed import allreduce_mean  # noqa: E402


def timed(fn, runs: int, comm) -> float:
    samples = []
    for _ in range(runs):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


def fused(buffers: list, staging: np.ndarray, comm) -> None:
    offsets = np.cumsum([0] + [b.size for b in buffers])
    for b, lo, hi in zip(buffers, offsets[:-1], offsets[1:], strict=True):
        staging[lo:hi] = b.reshape(-1)
    allreduce_mean(staging, comm)
    for b, lo, hi in zip(buffers, offsets[:-1], offsets[1:], strict=True):
        b.reshape(-1)[...] = staging[lo:hi]


def main() -> None:
    from mpi4py import MPI

    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    threadpoolctl.threadpool_limits(1)
    spec = ar.RNNSpec("lstm", 256, 256, dtype="float32")
    params = ar.PackedParams.init(spec)
    x = np.random.default_rng(comm.Get_rank()).standard_normal((100, 64, 256)).astype(np.float32)
    grads = {}

    def step():
        res = ar.rnn_forward(params, x, training=True)
        grads["g"] = ar.rnn_backward(res, dy=np.ones_like(res.y)).dparams

    step()
    step_ms = timed(step, args.runs, comm)
    reduce_ms = timed(lambda: allreduce_mean(grads["g"], comm), args.runs, comm)
    rng = np.random.default_rng(0)
    sizes = (98 * 48, 4 * 256 * (48 + 256 + 2), 256 * 98 + 98)
    demo = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    staging = np.empty(sum(b.size for b in demo), np.float32)
    per_buffer_ms = timed(lambda: allreduce_mean(demo, comm), args.runs, comm)
    fused_ms = timed(lambda: fused(demo, staging, comm), args.runs, comm)
    if comm.Get_rank() != 0:
        return
    table = "\n".join([
        "## All-reduce cost, 2 MPI ranks (mpich wheel, shared memory)",
        "",
        f"Command: `mpiexec -n 2 python bench/bench_allreduce.py --runs {args.runs} --write` "
        "(1 BLAS thread per rank, "
        f"median of {args.runs} runs, rank 0's times). The 2-core machine was shared with other work "
        "during this run: numbers are noisy.",
        "",
        "| what | ms | fraction of S1 step |",
        "|---|---|---|",
        f"| S1 LSTM train step (T=100, B=64, I=256, H=256, float32, per rank) | {step_ms:.2f} | 1 |",
        f"| allreduce_mean of its gradient ({grads['g'].data.size:,} floats) | {reduce_ms:.3f} | "
        f"{reduce_ms / step_ms:.4f} |",
        f"| list of 3 demo-sized buffers: one all-reduce per buffer | {per_buffer_ms:.3f} | |",
        f"| same list packed into one buffer, one all-reduce | {fused_ms:.3f} | |",
        "",
    ])
    print(table)
    if args.write:
        with open(ROOT / "bench" / "RESULTS.md", "a") as f:
            f.write("\n" + table)


if __name__ == "__main__":
    main()
