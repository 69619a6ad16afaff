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

Before any data moves, the ranks agree on what the call reduces (function, root, number of buffers,
shapes, dtypes) in one small collective (agreement.py): a disagreement, or a rank whose own arguments were
refused, raises a ``ValueError`` on every rank instead of a hang or an abort inside the library.

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

from ..core.backend import as_array, is_cupy_array, is_writeable
from ..core.params import PackedParams
from .agreement import OUTSIDE_JOIN, Collectives, agree
from .optim import Optimizer

ACCEPTED = ("an mpi4py.MPI.Comm (NumPy buffers), a cupy.cuda.nccl.NcclCommunicator (CuPy buffers) or a "
            "torch.distributed.ProcessGroup (e.g. torch.distributed.group.WORLD)")
"""The communicators `allreduce_mean` and the other collectives accept, as shown in their errors."""


# -- one row per communicator kind -----------------------------------------------------------------------
@dataclass(frozen=True)
class _Backend:
    name: str
    matches: Callable[[Any], bool]
    check: Callable[[Any], None]                     # raises if comm cannot be used now
    size: Callable[[Any], int]
    rank: Callable[[Any], int]
    allreduce_sum: Callable[[Any, Any], None]        # (comm, contiguous buffer) -> sums in place
    broadcast: Callable[[Any, Any, int], None]       # (comm, contiguous buffer, root) -> in place
    allreduce_max: Callable[[Any, np.ndarray], np.ndarray]  # (comm, host int64 vector) -> element-wise max
    allgather: Callable[[Any, np.ndarray], np.ndarray]      # (comm, host int64 (n,)) -> (size, n)
    buffer_kind: str                                 # "numpy", "cupy" or "any"
    dtypes: tuple[str, ...] | None = None            # the dtypes it reduces; None: any native-order dtype


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
def _mpi_check(comm: Any) -> None:
    """MPI must be initialized and not finalized (else MPICH ends the process with no Python exception)."""
    from mpi4py import MPI
    if MPI.Is_finalized():
        raise RuntimeError("MPI is already finalized (MPI.Finalize() was called); collectives are no longer "
                           "possible in this process: call arrayrnn.distributed before finalizing MPI")
    if not MPI.Is_initialized():
        raise RuntimeError("MPI is not initialized (mpi4py.rc.initialize = False?); call MPI.Init() or "
                           "MPI.Init_thread() before arrayrnn.distributed")
    if comm == MPI.COMM_NULL:
        raise ValueError("comm = MPI.COMM_NULL (a freed communicator, or a Split/Create that excluded this "
                         "rank); expected a communicator this rank belongs to, e.g. MPI.COMM_WORLD")
    if comm.Is_inter():
        raise ValueError("comm is an MPI intercommunicator; expected an intracommunicator (e.g. "
                         "MPI.COMM_WORLD, or comm.Merge() of the intercommunicator)")


def _mpi_allreduce_sum(comm: Any, buf: np.ndarray) -> None:
    from mpi4py import MPI
    comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)


def _mpi_broadcast(comm: Any, buf: np.ndarray, root: int) -> None:
    comm.Bcast(buf, root=root)


def _mpi_allreduce_max(comm: Any, vector: np.ndarray) -> np.ndarray:
    from mpi4py import MPI
    comm.Allreduce(MPI.IN_PLACE, vector, op=MPI.MAX)
    return vector


def _mpi_allgather(comm: Any, vector: np.ndarray) -> np.ndarray:
    out = np.empty((comm.Get_size(), vector.size), dtype=vector.dtype)
    comm.Allgather(vector, out)
    return out


# CuPy NCCL
_NCCL_TYPES = {"float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64",
               "int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32", "uint32": "NCCL_UINT32",
               "int64": "NCCL_INT64", "uint64": "NCCL_UINT64"}
# what torch.from_dlpack takes from NumPy / CuPy
_TORCH_DTYPES = ("float16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool",
                 "complex64", "complex128")


def _nccl_args(buf: Any) -> tuple[int, int, int, int]:
    """``(pointer, count, NCCL datatype, current stream pointer)`` of a CuPy buffer."""
    import cupy
    from cupy.cuda import nccl
    dtype = getattr(nccl, _NCCL_TYPES[str(buf.dtype)])
    return buf.data.ptr, buf.size, dtype, cupy.cuda.get_current_stream().ptr


def _nccl_allreduce_sum(comm: Any, buf: Any) -> None:
    from cupy.cuda import nccl
    ptr, count, dtype, stream = _nccl_args(buf)
    comm.allReduce(ptr, ptr, count, dtype, nccl.NCCL_SUM, stream)


def _nccl_broadcast(comm: Any, buf: Any, root: int) -> None:
    ptr, count, dtype, stream = _nccl_args(buf)
    comm.bcast(ptr, count, dtype, root, stream)


def _nccl_allreduce_max(comm: Any, vector: np.ndarray) -> np.ndarray:
    import cupy
    from cupy.cuda import nccl
    buf = cupy.asarray(vector)
    ptr, count, dtype, stream = _nccl_args(buf)
    comm.allReduce(ptr, ptr, count, dtype, nccl.NCCL_MAX, stream)
    return buf.get()        # waits for the current stream


def _nccl_allgather(comm: Any, vector: np.ndarray) -> np.ndarray:
    import cupy
    send = cupy.asarray(vector)
    out = cupy.empty((comm.size(), vector.size), dtype=vector.dtype)
    ptr, count, dtype, stream = _nccl_args(send)
    comm.allGather(ptr, out.data.ptr, count, dtype, stream)
    return out.get()


# torch.distributed
def _tensor_view(buf: Any) -> Any:
    import torch
    return torch.from_dlpack(buf)      # zero-copy: the tensor aliases buf's memory


def _torch_check(group: Any) -> None:
    import torch.distributed as dist
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialized (or was destroyed); call "
                           "torch.distributed.init_process_group(...) first")
    if dist.get_rank(group) < 0:
        raise ValueError("comm is a torch.distributed process group this process is not a member of; "
                         "expected a group containing this rank (e.g. torch.distributed.group.WORLD)")


def _torch_allreduce_sum(group: Any, buf: Any) -> None:
    import torch.distributed as dist
    dist.all_reduce(_tensor_view(buf), op=dist.ReduceOp.SUM, group=group)


def _torch_broadcast(group: Any, buf: Any, root: int) -> None:
    import torch.distributed as dist
    dist.broadcast(_tensor_view(buf), group=group, group_src=root)


def _torch_size(group: Any) -> int:
    import torch.distributed as dist
    return dist.get_world_size(group)


def _torch_rank(group: Any) -> int:
    import torch.distributed as dist
    return dist.get_rank(group)


def _torch_host_tensor(group: Any, vector: np.ndarray) -> Any:
    """``vector`` as a tensor on a device the group's backend reduces (CPU for gloo and MPI, else CUDA)."""
    import torch
    import torch.distributed as dist
    backend = str(dist.get_backend(group))
    on_cpu = "gloo" in backend or "mpi" in backend
    return torch.from_numpy(vector).to("cpu" if on_cpu else f"cuda:{torch.cuda.current_device()}")


def _torch_allreduce_max(group: Any, vector: np.ndarray) -> np.ndarray:
    import torch.distributed as dist
    tensor = _torch_host_tensor(group, vector)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return tensor.cpu().numpy()


def _torch_allgather(group: Any, vector: np.ndarray) -> np.ndarray:
    import torch
    import torch.distributed as dist
    tensor = _torch_host_tensor(group, vector)
    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, tensor, group=group)
    return torch.stack(out).cpu().numpy()


def _nothing_to_check(comm: Any) -> None:
    return None


_BACKENDS = (
    _Backend("mpi4py", _isinstance_of("mpi4py.MPI", "Comm"), _mpi_check, lambda c: c.Get_size(),
             lambda c: c.Get_rank(), _mpi_allreduce_sum, _mpi_broadcast, _mpi_allreduce_max, _mpi_allgather,
             "numpy"),
    _Backend("nccl", _isinstance_of("cupy.cuda.nccl", "NcclCommunicator"), _nothing_to_check,
             lambda c: c.size(), lambda c: c.rank_id(), _nccl_allreduce_sum, _nccl_broadcast,
             _nccl_allreduce_max, _nccl_allgather, "cupy", tuple(_NCCL_TYPES)),
    _Backend("torch.distributed", _isinstance_of("torch.distributed", "ProcessGroup"), _torch_check,
             _torch_size, _torch_rank, _torch_allreduce_sum, _torch_broadcast, _torch_allreduce_max,
             _torch_allgather, "any", _TORCH_DTYPES),
)


def _backend_for(comm: Any) -> _Backend:
    """The row of ``comm``'s kind, after checking that ``comm`` is usable now."""
    for backend in _BACKENDS:
        if backend.matches(comm):
            backend.check(comm)
            return backend
    raise TypeError(f"comm has type {type(comm).__module__}.{type(comm).__name__}; expected {ACCEPTED}")


def _agreed(call: str, backend: _Backend, comm: Any, plan: Callable[[], tuple[list[str], list[Any]]],
            root: int = 0) -> list[Any]:
    """``plan()``'s buffers once every rank has described the same call (see agreement.py).

    A rank whose ``plan()`` raises still takes part (with no buffers), so the other ranks raise too
    instead of waiting in a collective it will never make; it then raises its own error. Inside
    ``join(comm)`` the call is counted (a rank that left its block ends it with an error naming both).
    """
    try:
        names, buffers = plan()
        refused: Exception | None = None
    except Exception as err:  # noqa: BLE001 - whatever stops this rank, the others must hear of it
        names, buffers, refused = [], [], err
    scopes = _joins.get(id(comm))
    calls = scope.count_call() if (scope := scopes[-1] if scopes else None) is not None else OUTSIDE_JOIN
    try:
        agree(call, names, buffers, _collectives(backend, comm), root if refused is None else -1,
              refused is not None, joined=(calls, False))
    except ValueError:
        if refused is None:
            raise
    if refused is not None:
        raise refused
    return buffers


def _collectives(backend: _Backend, comm: Any) -> Collectives:
    return Collectives(backend.rank(comm), lambda v: backend.allreduce_max(comm, v),
                       lambda v: backend.allgather(comm, v))


# -- buffers ----------------------------------------------------------------------------------------------
def _flat_buffers(tree: Any, what: str, backend: _Backend) -> list[tuple[str, Any]]:
    """``(name, contiguous buffer)`` of a PackedParams / array or of each of a list/tuple of them."""
    if isinstance(tree, dict):
        raise TypeError(f"{what} is a dict; expected an array, a PackedParams, or a list/tuple of them "
                        f"(pass list({what}.values()))")
    items = list(tree) if isinstance(tree, (list, tuple)) else [tree]
    out = []
    for i, item in enumerate(items):
        name = what if not isinstance(tree, (list, tuple)) else f"{what}[{i}]"
        if isinstance(item, np.generic):
            raise TypeError(f"{name} is a NumPy scalar ({type(item).__name__}), which cannot be updated in "
                            "place; expected an array (e.g. np.atleast_1d(x), kept and reused)")
        buf = item.data if isinstance(item, PackedParams) else as_array(item, name)
        _check_reducible(name, buf, backend)
        out.append((name, buf))
    return out


def _check_reducible(name: str, buf: Any, backend: _Backend) -> None:
    on_gpu = is_cupy_array(buf)
    if backend.buffer_kind == "numpy" and on_gpu:
        raise TypeError(f"{name} is a CuPy array; an {backend.name} communicator takes NumPy buffers "
                        "(use a cupy.cuda.nccl.NcclCommunicator for GPU buffers)")
    if backend.buffer_kind == "cupy" and not on_gpu:
        raise TypeError(f"{name} is a {type(buf).__module__}.{type(buf).__name__}; a {backend.name} "
                        "communicator takes CuPy buffers")
    dtype = np.dtype(buf.dtype)
    if not dtype.isnative:
        raise TypeError(f"{name} has dtype {dtype.str} (non-native byte order); expected a native-order "
                        f"dtype (convert with .astype({dtype.newbyteorder('=').str!r}))")
    if backend.dtypes is not None and dtype.name not in backend.dtypes:
        raise TypeError(f"{name} has dtype {dtype.name}; a {backend.name} communicator reduces "
                        f"{', '.join(backend.dtypes)} (convert explicitly)")
    if not buf.flags.c_contiguous:
        raise ValueError(f"{name} with shape {tuple(buf.shape)} is not C-contiguous; expected a contiguous "
                         "buffer (gradients from value_and_grad are)")
    if not is_writeable(buf):
        raise ValueError(f"{name} is read-only; expected a writeable buffer (it is updated in place)")


def _unzip(named: list[tuple[str, Any]]) -> tuple[list[str], list[Any]]:
    return [name for name, _ in named], [buf for _, buf in named]


# -- public API -------------------------------------------------------------------------------------------
def allreduce_mean(grads: Any, comm: Any) -> None:
    """Average ``grads`` in place across the ranks of ``comm``: one all-reduce per flat buffer.

    Every rank must call this with buffers of the same shapes and dtypes, in the same order: one small
    collective checks that first. A list is reduced one buffer at a time, without staging copies: measured
    faster than packing the list into one buffer for one all-reduce (bench/bench_allreduce.py,
    bench/RESULTS.md).

    Parameters
    ----------
    grads : PackedParams, array, or list/tuple of them
        What `arrayrnn.value_and_grad` returns; NumPy buffers with MPI, CuPy buffers with NCCL, either
        with torch.distributed.
    comm : communicator
        An ``mpi4py.MPI.Comm``, a ``cupy.cuda.nccl.NcclCommunicator`` or a ``torch.distributed``
        process group (see `ACCEPTED`).

    Raises
    ------
    ValueError
        The ranks disagree (raised on every rank, naming the buffer, its shape and dtype here and on the
        rank that differs), or an uneven call inside `join`.
    TypeError
        An unsupported communicator, or a buffer the communicator cannot carry (a CuPy array over MPI).

    Examples
    --------
    Run under ``mpiexec -n 2 python train.py``:

    >>> from mpi4py import MPI  # doctest: +SKIP
    >>> value, grads = ar.value_and_grad(loss)(model.params, x_shard, y_shard)  # doctest: +SKIP
    >>> ar.distributed.allreduce_mean(grads, MPI.COMM_WORLD)  # doctest: +SKIP
    >>> opt.step(grads)  # doctest: +SKIP
    """
    backend = _backend_for(comm)
    buffers = _agreed("allreduce_mean", backend, comm, lambda: _unzip(_gradient_buffers(grads, backend)))
    size = backend.size(comm)
    for buf in buffers:
        backend.allreduce_sum(comm, buf)
        if size != 1:
            buf /= size


def _gradient_buffers(grads: Any, backend: _Backend) -> list[tuple[str, Any]]:
    named = _flat_buffers(grads, "grads", backend)
    for name, buf in named:
        if np.dtype(buf.dtype).kind != "f":
            raise TypeError(f"{name} has dtype {buf.dtype}; expected a floating dtype (a gradient)")
    return named


def broadcast_from_root(tree: Any, comm: Any, root: int = 0) -> None:
    """Overwrite ``tree`` on every rank with rank ``root``'s values, in place, so all ranks start equal.

    Call it once after building the model and optimizer (and after loading a checkpoint on ``root``:
    ``Optimizer.load`` there restores its hyperparameters too, which reach every rank)::

        for item in flatten(tree):
            item[...] = item on rank root

    Parameters
    ----------
    tree : PackedParams, array, optimizer, or list/tuple of them
        An ``arrayrnn.optim`` optimizer brings its parameters, its state buffers, its step count and every
        hyperparameter (``lr``, ``betas``, ...).
    comm : communicator
        As for `allreduce_mean`.
    root : int, optional
        The rank whose values win.

    Raises
    ------
    ValueError
        The ranks pass different roots or buffers of different shapes or dtypes (checked first, as in
        `allreduce_mean`), or ``root`` out of range.
    TypeError
        An unsupported communicator or item.

    Examples
    --------
    >>> from mpi4py import MPI  # doctest: +SKIP
    >>> opt = ar.optim.Adam(model.params, lr=1e-3)  # doctest: +SKIP
    >>> ar.distributed.broadcast_from_root([model.params, opt], MPI.COMM_WORLD)  # doctest: +SKIP
    """
    backend = _backend_for(comm)
    received: list[tuple[Optimizer, Any, Any]] = []

    def plan() -> tuple[list[str], list[Any]]:
        _check_root(root, backend.size(comm))
        named, found = _broadcast_plan(tree, backend)
        received.extend(found)
        return _unzip(named)

    for buf in _agreed("broadcast_from_root", backend, comm, plan, root):
        backend.broadcast(comm, buf, root)
    for opt, counter, hyperparameters in received:
        opt.step_count = int(_on_host(counter)[0])
        opt._load_hyperparameter_vector(_on_host(hyperparameters), f"rank {root}'s optimizer")


def _check_root(root: Any, size: int) -> None:
    if isinstance(root, (bool, np.bool_)) or not isinstance(root, (int, np.integer)) or not 0 <= root < size:
        raise ValueError(f"root = {root!r}; expected a rank in 0..{size - 1} (an int)")


def _broadcast_plan(tree: Any, backend: _Backend) -> tuple[list[tuple[str, Any]], list[tuple[Any, Any, Any]]]:
    """Every ``(name, buffer)`` to broadcast; ``(optimizer, its step-count buffer, its hyperparameters
    buffer)`` each (:meth:`Optimizer._hyperparameter_vector`)."""
    is_list = isinstance(tree, (list, tuple))
    items = list(tree) if is_list else [tree]
    named: list[tuple[str, Any]] = []
    received: list[tuple[Optimizer, Any, Any]] = []
    for i, item in enumerate(items):
        where = f"tree[{i}]" if is_list else "tree"
        if not isinstance(item, Optimizer):
            named += _flat_buffers(item, where, backend)
            continue
        named += _flat_buffers(item._params, f"{where}.params", backend)
        for j, state in enumerate(item.state):
            for key in sorted(state):
                name = f"{where}.state[{j}][{key!r}]"
                _check_reducible(name, state[key], backend)
                named.append((name, state[key]))
        counter = _on_device(np.array([item.step_count], dtype=np.int64), backend)
        hyperparameters = _on_device(item._hyperparameter_vector(), backend)
        named += [(f"{where}.step_count", counter), (f"{where}.hyperparameters", hyperparameters)]
        received.append((item, counter, hyperparameters))
    return named, received


def _on_device(host: np.ndarray, backend: _Backend) -> Any:
    """``host`` where ``backend`` reduces (a CuPy copy for NCCL)."""
    if backend.buffer_kind != "cupy":
        return host
    import cupy
    return cupy.asarray(host)


def _on_host(buf: Any) -> np.ndarray:
    return buf.get() if is_cupy_array(buf) else buf


class _JoinScope:
    """The collective calls this rank made inside ``join(comm)`` (``implicit``: ``abort_on_error(comm)``)."""

    def __init__(self, implicit: bool = False) -> None:
        self.calls = 0
        self.implicit = implicit

    def count_call(self) -> int:
        """The calls made before this one."""
        self.calls += 1
        return self.calls - 1


_joins: dict[int, list[_JoinScope]] = {}   # by id(comm): the blocks this process is inside, innermost last


def _enter(comm: Any, implicit: bool) -> _JoinScope:
    scope = _JoinScope(implicit)
    _joins.setdefault(id(comm), []).append(scope)
    return scope


def _exit(comm: Any) -> None:
    scopes = _joins[id(comm)]
    scopes.pop()
    if not scopes:
        del _joins[id(comm)]


@contextlib.contextmanager
def join(comm: Any) -> Iterator[None]:
    """End uneven collective calls with an error on every rank instead of a hang (like PyTorch's ``Join``
    for uneven inputs, but an error, not shadow all-reduces).

    Inside the block every `allreduce_mean` / `broadcast_from_root` on ``comm`` is counted. A rank
    leaving the block (normally or by an exception) takes part in the collectives the other ranks still
    make, until every rank has left: a call made while another rank has left raises a ``ValueError`` on
    both, naming the ranks and their call counts (``allreduce_mean: rank 0 has left join(comm) after 3
    calls; this is call 4 on rank 1``, and on rank 0 ``join(comm): rank 1 made collective call 4 after rank
    0 (this one) left join(comm) after 3 calls``), raised on the rank that left when the block ends. A rank
    that raised inside the block raises its own error, and the others hear of it at their next call instead
    of waiting forever (`abort_on_error` ends an MPI job instead). Every rank must enter ``join(comm)``,
    and inside it make no other collective on ``comm`` than arrayrnn's (a user's own ``comm.allreduce``
    would pair with the agreement's).

    Parameters
    ----------
    comm : communicator
        As for `allreduce_mean`.

    Raises
    ------
    ValueError
        Uneven calls, as above.

    Examples
    --------
    >>> with ar.distributed.join(comm):  # doctest: +SKIP
    ...     for x, y in my_shard_of_batches:  # ranks may have different numbers of batches
    ...         value, grads = ar.value_and_grad(loss)(model.params, x, y)
    ...         ar.distributed.allreduce_mean(grads, comm)
    ...         opt.step(grads)
    """
    backend = _backend_for(comm)
    if any(not scope.implicit for scope in _joins.get(id(comm), ())):
        raise ValueError("join(comm) is already active for this communicator; expected one block per comm")
    scope = _enter(comm, implicit=False)
    try:
        yield
    except BaseException:
        _leave(backend, comm, scope, by_exception=True)
        raise
    uneven = _leave(backend, comm, scope, by_exception=False)
    if uneven is not None:
        raise ValueError(uneven)


def _leave(backend: _Backend, comm: Any, scope: _JoinScope, by_exception: bool) -> str | None:
    """Answer the other ranks' calls as "join" until every rank has left; the message of the first error
    it caused (the text, not the exception: one kept here would hold this frame, and the communicator's
    tensors in it, in a reference cycle until some garbage collection, which a torch.distributed process
    group destroyed meanwhile did not survive: an abort at exit, ~1 run in 10 with gloo)."""
    _exit(comm)
    first: str | None = None
    while True:
        try:
            agree("join", [], [], _collectives(backend, comm), joined=(scope.calls, by_exception))
            return first
        except ValueError as err:
            first = first or str(err)


@contextlib.contextmanager
def abort_on_error(comm: Any, errorcode: int = 1) -> Iterator[None]:
    """Abort every rank of an MPI job when the body raises, instead of leaving them blocked.

    An exception on one rank would otherwise leave the others waiting forever in their next
    collective; ``MPI_Abort`` ends the whole job (``mpiexec`` returns ``errorcode``). The traceback is
    printed first.

    Uneven calls end the job too: the block counts arrayrnn's collectives on ``comm`` as `join`
    does (unless a block around it already counts them), so a rank making a call the others never make
    raises (and aborts) instead of waiting forever, and one that leaves the block after fewer calls than
    another aborts when the block ends, naming the ranks and their counts. A ``join(comm)`` inside counts
    its own calls as before.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        The job's communicator.
    errorcode : int, optional
        The exit status ``mpiexec`` returns.

    Raises
    ------
    TypeError
        ``comm`` is not an ``mpi4py.MPI.Comm``.

    Examples
    --------
    >>> from mpi4py import MPI  # doctest: +SKIP
    >>> with ar.distributed.abort_on_error(MPI.COMM_WORLD):  # doctest: +SKIP
    ...     train()
    """
    if not _BACKENDS[0].matches(comm):
        raise TypeError(f"comm has type {type(comm).__module__}.{type(comm).__name__}; expected an "
                        "mpi4py.MPI.Comm")
    _BACKENDS[0].check(comm)
    if isinstance(errorcode, (bool, np.bool_)) or not isinstance(errorcode, (int, np.integer)) or not (
            1 <= errorcode <= 255):
        raise ValueError(f"errorcode = {errorcode!r}; expected an int in 1..255 (the exit status mpiexec "
                         "reports; 0 would report success)")
    scope = None if _joins.get(id(comm)) else _enter(comm, implicit=True)
    try:
        yield
    except BaseException as err:
        if scope is not None:
            _exit(comm)
        if isinstance(err, Exception):
            _abort(comm, errorcode, f"after an exception:\n{traceback.format_exc()}")
        raise
    if scope is not None:
        uneven = _leave(_BACKENDS[0], comm, scope, by_exception=False)
        if uneven is not None:
            _abort(comm, errorcode, f"uneven collective calls: {uneven}\n")
            raise ValueError(uneven)


def _abort(comm: Any, errorcode: int, why: str) -> None:
    # one write, then a moment for mpiexec to forward it: MPI_Abort may kill this rank's output stream
    # before a traceback written line by line gets through (seen as a lone first line, ~1 run in 10)
    if sys.stderr is not None:
        sys.stderr.write(f"rank {comm.Get_rank()}: aborting the MPI job {why}")
        sys.stderr.flush()
    time.sleep(0.2)
    comm.Abort(errorcode)
