"""Ranks that disagree on a collective call, launched by tests/test_distributed_agreement.py (not collected).

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


CASES: dict[str, Callable[[int, Any], None]] = {
    "count": _count, "shape": _shape, "dtype": _dtype, "refused": _refused, "root": _root, "call": _call}


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
