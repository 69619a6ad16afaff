"""Data-parallel training worker launched by tests/test_distributed.py (not collected by pytest).

    mpiexec -n 2 python tests/support/dist_workers/train.py mpi   --optimizer adam --steps 3 --out DIR
    python tests/support/dist_workers/train.py torch --optimizer sgd --steps 3 --out DIR  # 2 processes

Each rank builds an LSTM stack + Dense head (float64; rank r seeds its weights with ``SEED + r``, so only
``broadcast_from_root`` makes them equal), takes its 1/size share of the batch's rows, and runs ``--steps``
steps of value_and_grad -> allreduce_mean -> optimizer step. Rank r writes its final parameters to
``DIR/rank{r}.npy``. ``--fail-rank R`` makes rank R raise before its first all-reduce (the others block in
it) to test that the job still ends. ``train(...)`` with ``comm=None`` is the single-process oracle.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import arrayrnn as ar  # noqa: E402
from arrayrnn import ops  # noqa: E402
from arrayrnn.distributed import abort_on_error, allreduce_mean, broadcast_from_root  # noqa: E402

T, B, I, H, V, LAYERS, SEED = 7, 6, 5, 8, 11, 2, 100


def batch() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    return rng.standard_normal((T, B, I)), rng.integers(0, V, size=(T, B))


def build(seed: int, optimizer: str) -> tuple[Any, Any, list[Any], Any]:
    lstm = ar.nn.LSTM(I, H, LAYERS, dtype="float64", seed=seed, engine="reference")
    head = ar.nn.Dense(H, V, dtype="float64", seed=seed + 1000)
    params = [lstm.params, head.params]
    opt = (ar.optim.Adam(params, lr=0.05) if optimizer == "adam"
           else ar.optim.SGD(params, lr=0.5, momentum=0.9))
    return lstm, head, params, opt


def train(optimizer: str, steps: int, comm: Any = None, rank: int = 0, size: int = 1,
          fail_rank: int = -1) -> np.ndarray:
    """``steps`` steps on this rank's rows of the batch; returns the final parameters, concatenated."""
    lstm, head, params, opt = build(SEED + rank, optimizer)
    if comm is not None:
        broadcast_from_root([params, opt], comm)

    def loss(p: list[Any], x: Any, targets: Any) -> Any:
        y, _, _ = lstm.apply(p[0], x)
        return ops.softmax_cross_entropy(head.apply(p[1], y), targets)

    x, targets = batch()
    rows = slice(rank * B // size, (rank + 1) * B // size)
    value_and_grad = ar.value_and_grad(loss)
    for _ in range(steps):
        _, grads = value_and_grad(params, x[:, rows], targets[:, rows])
        if rank == fail_rank:
            raise RuntimeError(f"rank {rank} fails on purpose")
        if comm is not None:
            allreduce_mean(grads, comm)
        opt.step(grads)
    return np.concatenate([params[0].data, params[1]])


def run_mpi(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    with abort_on_error(comm):
        final = train(args.optimizer, args.steps, comm, comm.Get_rank(), comm.Get_size(), args.fail_rank)
        np.save(Path(args.out) / f"rank{comm.Get_rank()}.npy", final)


def _torch_rank(rank: int, args: argparse.Namespace, size: int) -> None:
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{Path(args.out) / 'rendezvous'}", rank=rank,
                            world_size=size, timeout=datetime.timedelta(seconds=60))
    try:
        final = train(args.optimizer, args.steps, dist.group.WORLD, rank, size, args.fail_rank)
        np.save(Path(args.out) / f"rank{rank}.npy", final)
        dist.barrier()  # neither rank tears gloo down while the other still uses it (see ddp.py)
    finally:
        dist.destroy_process_group()


def run_torch(args: argparse.Namespace) -> None:
    import torch.multiprocessing as mp

    # spawn's join() terminates the other ranks as soon as one raises, so a failure ends the job.
    mp.spawn(_torch_rank, args=(args, 2), nprocs=2, join=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("backend", choices=("mpi", "torch"))
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="adam")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", required=True)
    parser.add_argument("--fail-rank", type=int, default=-1)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    (run_mpi if args.backend == "mpi" else run_torch)(args)


if __name__ == "__main__":
    main()
