"""Ranks that disagree on a collective call (or on how many they make), and a resumed optimizer broadcast from
rank 0; launched by tests/test_distributed_agreement.py (not collected).

    mpiexec -n 2 python tests/support/dist_workers/mismatch.py mpi CASE
    python tests/support/dist_workers/mismatch.py torch CASE --out DIR      # 2 gloo processes
    mpiexec -n 1 python tests/support/dist_workers/mismatch.py mpi-state     # MPI used at the wrong time

Each rank runs ``CASE`` (rank 0 and rank 1 pass different arguments, see ``CASES``), prints
``rank R: <exception type>: <message>`` (or ``rank R: no error``), then makes one correct all-reduce and
prints ``rank R: afterwards <mean>`` to show that the communicator still works.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from arrayrnn.distributed import abort_on_error, allreduce_mean, broadcast_from_root  # noqa: E402


def _count(rank: int, comm: Any) -> None:
    allreduce_mean([np.ones(3), np.ones(2)] if rank == 0 else [np.ones(3)], comm)


def _shape(rank: int, comm: Any) -> None:
    allreduce_mean([np.ones(2), np.ones(3 + rank)], comm)


def _dtype(rank: int, comm: Any) -> None:
    allreduce_mean([np.ones(2), np.ones(3, dtype=np.float64 if rank == 0 else np.float32)], comm)


def _refused(rank: int, comm: Any) -> None:
    allreduce_mean(np.ones(3) if rank == 0 else np.ones(3, dtype=np.int64), comm)


def _root(rank: int, comm: Any) -> None:
    broadcast_from_root(np.ones(3), comm, root=rank)


def _call(rank: int, comm: Any) -> None:
    (allreduce_mean if rank == 0 else broadcast_from_root)(np.ones(3), comm)


def _uneven(rank: int, comm: Any) -> None:
    """Rank 1 makes one all-reduce more than rank 0 inside ``join``."""
    from arrayrnn.distributed import join

    with join(comm):
        for _ in range(3 + rank):
            allreduce_mean(np.ones(2), comm)


def _uneven_abort(rank: int, comm: Any) -> None:
    """``_uneven`` inside ``abort_on_error`` (docs/guide/distributed.md's pattern): the error ends the job."""
    with abort_on_error(comm):
        _uneven(rank, comm)


def _uneven_abort_only(rank: int, comm: Any) -> None:
    """Rank 1 makes one all-reduce more than rank 0 inside ``abort_on_error`` alone (no ``join``)."""
    with abort_on_error(comm):
        for _ in range(3 + rank):
            allreduce_mean(np.ones(2), comm)


def _raising(rank: int, comm: Any) -> None:
    """Rank 1 fails after its first all-reduce inside ``join``; rank 0 goes on to a second."""
    from arrayrnn.distributed import join

    with join(comm):
        allreduce_mean(np.ones(2), comm)
        if rank == 1:
            raise RuntimeError("rank 1 fails on purpose")
        allreduce_mean(np.ones(2), comm)


def _resume(rank: int, comm: Any) -> None:
    """Rank 0 loads an optimizer saved with other hyperparameters (the documented resume), then the
    broadcast; each rank prints what its optimizers hold."""
    import json
    import tempfile

    from arrayrnn import optim

    params = [np.full(3, float(rank)), np.full(2, float(rank))]
    adam, sgd = optim.Adam(params[0]), optim.SGD(params[1], momentum=0.5)
    if rank == 0:
        with tempfile.TemporaryDirectory() as folder:
            optim.Adam(np.ones(3), lr=0.25, betas=(0.5, 0.75), eps=1e-3, weight_decay=0.125).save(
                f"{folder}/adam.npz")
            optim.SGD(np.ones(2), lr=0.5, momentum=0.25, weight_decay=0.375, nesterov=True).save(
                f"{folder}/sgd.npz")
            adam.load(f"{folder}/adam.npz")
            sgd.load(f"{folder}/sgd.npz")
    broadcast_from_root([*params, adam, sgd], comm)
    said = {type(opt).__name__: opt.state_dict()["hyperparameters"] for opt in (adam, sgd)}
    say(f"rank {rank}: hyperparameters {json.dumps(said, sort_keys=True)}")


CASES: dict[str, Callable[[int, Any], None]] = {
    "count": _count, "shape": _shape, "dtype": _dtype, "refused": _refused, "root": _root, "call": _call,
    "uneven": _uneven, "uneven-abort": _uneven_abort,
    "uneven-abort-only": _uneven_abort_only, "raising": _raising, "resume": _resume}


def say(line: str) -> None:
    """One write per line, so the lines of two ranks sharing a pipe never interleave."""
    os.write(1, (line + "\n").encode())


def run_case(case: str, rank: int, comm: Any) -> None:
    try:
        CASES[case](rank, comm)
        say(f"rank {rank}: no error")
    except Exception as err:  # noqa: BLE001 - printed for the test to read
        say(f"rank {rank}: {type(err).__name__}: {err}")
    check = np.full(2, float(rank))
    allreduce_mean(check, comm)
    say(f"rank {rank}: afterwards {check[0]}")


def run_mpi(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    run_case(args.case, MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD)


def _report(what: str, fn: Callable[[], Any]) -> None:
    try:
        fn()
        say(f"{what}: no error")
    except Exception as err:  # noqa: BLE001 - printed for the test to read
        say(f"{what}: {type(err).__name__}: {err}")


def _abort_on_error(comm: Any) -> None:
    with abort_on_error(comm):
        pass


def run_mpi_state(args: argparse.Namespace) -> None:
    import mpi4py

    mpi4py.rc.initialize = mpi4py.rc.finalize = False
    from mpi4py import MPI

    _report("before Init", lambda: allreduce_mean(np.ones(3), MPI.COMM_WORLD))
    MPI.Init()
    _report("after Init", lambda: allreduce_mean(np.ones(3), MPI.COMM_WORLD))
    _report("COMM_NULL allreduce_mean", lambda: allreduce_mean(np.ones(3), MPI.COMM_NULL))
    _report("COMM_NULL broadcast_from_root", lambda: broadcast_from_root(np.ones(3), MPI.COMM_NULL))
    _report("COMM_NULL abort_on_error", lambda: _abort_on_error(MPI.COMM_NULL))
    MPI.Finalize()
    _report("after Finalize", lambda: allreduce_mean(np.ones(3), MPI.COMM_WORLD))
    _report("after Finalize broadcast_from_root", lambda: broadcast_from_root(np.ones(3), MPI.COMM_WORLD))


def _torch_rank(rank: int, args: argparse.Namespace) -> None:
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{Path(args.out) / 'rendezvous'}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=60))
    try:
        run_case(args.case, rank, dist.group.WORLD)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_torch(args: argparse.Namespace) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_torch_rank, args=(args,), nprocs=2, join=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("backend", choices=("mpi", "torch", "mpi-state"))
    parser.add_argument("case", nargs="?", choices=sorted(CASES))
    parser.add_argument("--out")
    args = parser.parse_args()
    {"mpi": run_mpi, "torch": run_torch, "mpi-state": run_mpi_state}[args.backend](args)


if __name__ == "__main__":
    main()
