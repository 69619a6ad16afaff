"""Data-parallel training on the communicators users already have: MPI, NCCL, ``torch.distributed``.

Every recurrent stack keeps its gradient in one flat buffer, so averaging the gradients of a step across
ranks is one all-reduce per buffer::

    loss, grads = ar.value_and_grad(loss_fn)(params, x_shard, y_shard)
    ar.distributed.allreduce_mean(grads, comm)     # in place; every rank now holds the mean gradient
    opt.step(grads)

Semantics roughly equal to this loop (``sum`` across the ranks of ``comm``)::

    for g in buffers(grads):
        g[...] = sum(g on every rank) / comm_size

``comm`` is one of (one row each in ``_BACKENDS``):

- an ``mpi4py.MPI.Comm`` (NumPy buffers; ``Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)``),
- a ``cupy.cuda.nccl.NcclCommunicator`` (CuPy buffers, on CuPy's current stream),
- a ``torch.distributed.ProcessGroup`` (NumPy or CuPy buffers seen as tensors through DLPack, no copy).

Nothing is pickled and nothing is called per named weight. mpi4py, CuPy and torch are imported only when
a communicator of theirs is passed (a communicator's own module is then already loaded).
"""

from __future__ import annotations

import contextlib
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.backend import as_array, is_cupy_array
from ..core.params import PackedParams
from .optim import Optimizer

ACCEPTED = ("an mpi4py.MPI.Comm (NumPy buffers), a cupy.cuda.nccl.NcclCommunicator (CuPy buffers) or a "
            "torch.distributed.ProcessGroup (e.g. torch.distributed.group.WORLD)")


# -- one row per communicator kind -----------------------------------------------------------------------
@dataclass(frozen=True)
class _Backend:
    name: str
    matches: Callable[[Any], bool]
    size: Callable[[Any], int]
    allreduce_sum: Callable[[Any, Any], None]        # (comm, contiguous buffer) -> sums in place
    broadcast: Callable[[Any, Any, int], None]       # (comm, contiguous buffer, root) -> in place
    buffer_kind: str                                 # "numpy", "cupy" or "any"


def _loaded_class(module: str, attr: str) -> type | None:
    """``module.attr`` if ``module`` is already imported (a communicator of it exists only then)."""
    mod = sys.modules.get(module)
    return getattr(mod, attr, None) if mod is not None else None


def _isinstance_of(module: str, attr: str) -> Callable[[Any], bool]:
    def matches(comm: Any) -> bool:
        cls = _loaded_class(module, attr)
        return cls is not None and isinstance(comm, cls)
    return matches


# mpi4py
def _mpi_allreduce_sum(comm: Any, buf: np.ndarray) -> None:
    from mpi4py import MPI
    comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)


def _mpi_broadcast(comm: Any, buf: np.ndarray, root: int) -> None:
    comm.Bcast(buf, root=root)


# CuPy NCCL
def _nccl_args(buf: Any) -> tuple[int, int, int, int]:
    """``(pointer, count, NCCL datatype, current stream pointer)`` of a CuPy buffer."""
    import cupy
    from cupy.cuda import nccl
    types = {"float16": nccl.NCCL_FLOAT16, "float32": nccl.NCCL_FLOAT32, "float64": nccl.NCCL_FLOAT64,
             "int64": nccl.NCCL_INT64}
    return buf.data.ptr, buf.size, types[str(buf.dtype)], cupy.cuda.get_current_stream().ptr


def _nccl_allreduce_sum(comm: Any, buf: Any) -> None:
    from cupy.cuda import nccl
    ptr, count, dtype, stream = _nccl_args(buf)
    comm.allReduce(ptr, ptr, count, dtype, nccl.NCCL_SUM, stream)


def _nccl_broadcast(comm: Any, buf: Any, root: int) -> None:
    ptr, count, dtype, stream = _nccl_args(buf)
    comm.bcast(ptr, count, dtype, root, stream)


# torch.distributed
def _tensor_view(buf: Any) -> Any:
    import torch
    return torch.from_dlpack(buf)      # zero-copy: the tensor aliases buf's memory


def _torch_allreduce_sum(group: Any, buf: Any) -> None:
    import torch.distributed as dist
    dist.all_reduce(_tensor_view(buf), op=dist.ReduceOp.SUM, group=group)


def _torch_broadcast(group: Any, buf: Any, root: int) -> None:
    import torch.distributed as dist
    dist.broadcast(_tensor_view(buf), group=group, group_src=root)


def _torch_size(group: Any) -> int:
    import torch.distributed as dist
    return dist.get_world_size(group)


_BACKENDS = (
    _Backend("mpi4py", _isinstance_of("mpi4py.MPI", "Comm"), lambda c: c.Get_size(),
             _mpi_allreduce_sum, _mpi_broadcast, "numpy"),
    _Backend("nccl", _isinstance_of("cupy.cuda.nccl", "NcclCommunicator"), lambda c: c.size(),
             _nccl_allreduce_sum, _nccl_broadcast, "cupy"),
    _Backend("torch.distributed", _isinstance_of("torch.distributed", "ProcessGroup"), _torch_size,
             _torch_allreduce_sum, _torch_broadcast, "any"),
)


def _backend_for(comm: Any) -> _Backend:
    for backend in _BACKENDS:
        if backend.matches(comm):
            return backend
    raise TypeError(f"comm has type {type(comm).__module__}.{type(comm).__name__}; expected {ACCEPTED}")


# -- buffers ----------------------------------------------------------------------------------------------
def _flat_buffers(tree: Any, what: str, backend: _Backend) -> list[Any]:
    """The contiguous buffers of a PackedParams / array or a list/tuple of them, checked for ``backend``."""
    items = list(tree) if isinstance(tree, (list, tuple)) else [tree]
    out = []
    for i, item in enumerate(items):
        name = what if not isinstance(tree, (list, tuple)) else f"{what}[{i}]"
        buf = item.data if isinstance(item, PackedParams) else as_array(item, name)
        _check_reducible(name, buf, backend)
        out.append(buf)
    return out


def _check_reducible(name: str, buf: Any, backend: _Backend) -> None:
    on_gpu = is_cupy_array(buf)
    if backend.buffer_kind == "numpy" and on_gpu:
        raise TypeError(f"{name} is a CuPy array; an {backend.name} communicator takes NumPy buffers "
                        "(use a cupy.cuda.nccl.NcclCommunicator for GPU buffers)")
    if backend.buffer_kind == "cupy" and not on_gpu:
        raise TypeError(f"{name} is a {type(buf).__module__}.{type(buf).__name__}; a {backend.name} "
                        "communicator takes CuPy buffers")
    if not buf.flags.c_contiguous:
        raise ValueError(f"{name} with shape {tuple(buf.shape)} is not C-contiguous; expected a contiguous "
                         "buffer (gradients from value_and_grad are)")
    if not buf.flags.writeable:
        raise ValueError(f"{name} is read-only; expected a writeable buffer (it is updated in place)")


# -- public API -------------------------------------------------------------------------------------------
def allreduce_mean(grads: Any, comm: Any) -> None:
    """Average ``grads`` in place across the ranks of ``comm``: one all-reduce per flat buffer.

    ``grads``: a PackedParams, an array, or a list/tuple of them (what ``value_and_grad`` returns).
    Every rank must call this with buffers of the same shapes and dtypes, in the same order. A list is
    reduced one buffer at a time, without staging copies: measured faster than packing the list into one
    buffer for one all-reduce (bench/bench_allreduce.py, bench/RESULTS.md).
    """
    backend = _backend_for(comm)
    buffers = _flat_buffers(grads, "grads", backend)
    size = backend.size(comm)
    for buf in buffers:
        if np.dtype(buf.dtype).kind != "f":
            raise TypeError(f"a gradient buffer has dtype {buf.dtype}; expected a floating dtype")
    for buf in buffers:
        backend.allreduce_sum(comm, buf)
        if size != 1:
            buf /= size


def broadcast_from_root(tree: Any, comm: Any, root: int = 0) -> None:
    """Overwrite ``tree`` on every rank with rank ``root``'s values, in place, so all ranks start equal.

    ``tree``: a PackedParams, an array, an ``ar.optim`` optimizer (its parameters, its state buffers and
    its step count), or a list/tuple of them. Call it once after building the model and optimizer (and
    after loading a checkpoint on ``root``)::

        for item in flatten(tree):
            item[...] = item on rank root
    """
    backend = _backend_for(comm)
    size = backend.size(comm)
    if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < size:
        raise ValueError(f"root = {root!r}; expected a rank in 0..{size - 1}")
    buffers, counters = _broadcast_plan(tree, backend)
    for buf in buffers:
        backend.broadcast(comm, buf, root)
    for opt, counter in counters:
        opt.step_count = int(counter.get()[0] if is_cupy_array(counter) else counter[0])


def _broadcast_plan(tree: Any, backend: _Backend) -> tuple[list[Any], list[tuple[Optimizer, Any]]]:
    """Every buffer to broadcast, and a one-element step-count buffer per optimizer (also in the list)."""
    items = list(tree) if isinstance(tree, (list, tuple)) else [tree]
    buffers: list[Any] = []
    counters: list[tuple[Optimizer, Any]] = []
    for i, item in enumerate(items):
        if not isinstance(item, Optimizer):
            buffers += _flat_buffers(item, f"tree[{i}]", backend)
            continue
        buffers += _flat_buffers(item._params, f"tree[{i}].params", backend)
        for j, state in enumerate(item.state):
            for key in sorted(state):
                _check_reducible(f"tree[{i}].state[{j}][{key!r}]", state[key], backend)
                buffers.append(state[key])
        counter = np.array([item.step_count], dtype=np.int64)
        if backend.buffer_kind == "cupy":
            import cupy
            counter = cupy.asarray(counter)
        buffers.append(counter)
        counters.append((item, counter))
    return buffers, counters


@contextlib.contextmanager
def abort_on_error(comm: Any, errorcode: int = 1) -> Iterator[None]:
    """Abort every rank of an MPI job when the body raises, instead of leaving them blocked.

    An exception on one rank would otherwise leave the others waiting forever in their next
    collective; ``MPI_Abort`` ends the whole job (``mpiexec`` returns ``errorcode``). The traceback is
    printed first. ``comm`` must be an ``mpi4py.MPI.Comm``.
    """
    if not _BACKENDS[0].matches(comm):
        raise TypeError(f"comm has type {type(comm).__module__}.{type(comm).__name__}; expected an "
                        "mpi4py.MPI.Comm")
    try:
        yield
    except Exception:
        # one write, then a moment for mpiexec to forward it: MPI_Abort may kill this rank's output stream
        # before a traceback written line by line gets through (seen as a lone first line, ~1 run in 10)
        sys.stderr.write(f"rank {comm.Get_rank()}: aborting the MPI job after an exception:\n"
                         f"{traceback.format_exc()}")
        sys.stderr.flush()
        time.sleep(0.2)
        comm.Abort(errorcode)
        raise
