"""Cross-rank agreement on what a collective call is about to reduce, before it reduces anything.

Ranks that pass different numbers of buffers, or buffers of different shapes or dtypes, to the same
collective hang (one rank waits in an all-reduce the others never make) or crash inside the
communication library (gloo's SIGABRT, MPICH's assertion). So each call first agrees on a description
of itself in ONE small collective: an int64 fingerprint ``v`` (call, root, whether this rank refused its
arguments, number of buffers, largest ``ndim``, a 62-bit hash of every buffer's dtype and shape),
all-reduced with MAX as ``[v, -v]`` so every rank learns the element-wise maximum and minimum at once.
Equal maximum and minimum: every rank describes the same call, and the data collectives follow.
Otherwise every rank takes the error path together: one all-gather of each rank's full description
(padded to the agreed maximum sizes), then a ``ValueError`` on every rank, naming the first buffer that
differs, its shape and dtype here and on the rank that disagrees.

``join``: a rank that has left its ``join(comm)`` block (``distributed.join``) describes itself as the
call ``"join"`` until every rank has; a rank making one more call than it fails the agreement, and the
all-gathered description also carries each rank's count of calls inside ``join`` (not part of the
fingerprint), so both errors name the rank and the call count.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.backend import is_cupy_array

CALLS = ("allreduce_mean", "broadcast_from_root", "join")
OUTSIDE_JOIN = -1   # the count of calls of a rank that is not inside join(comm)
_PAD = -1
_HASH_BITS = 62   # non-negative and far from the int64 limits, so -v never overflows


@dataclass(frozen=True)
class Collectives:
    """The two integer collectives the agreement needs, on fresh host int64 vectors (equal length on every
    rank; they may be reduced in place)."""

    rank: int
    allreduce_max: Callable[[np.ndarray], np.ndarray]   # (n,) -> element-wise max over the ranks, (n,)
    allgather: Callable[[np.ndarray], np.ndarray]       # (n,) -> every rank's vector, (size, n)


def agree(call: str, names: Sequence[str], buffers: Sequence[Any], comm: Collectives, root: int = 0,
          refused: bool = False, joined: tuple[int, bool] = (OUTSIDE_JOIN, False)) -> None:
    """Return when every rank describes the same call; else raise a ``ValueError`` on every rank.

    ``refused``: this rank's own arguments failed its local checks (it takes part with no buffers, so the
    others learn of it instead of waiting for it; the caller then raises its own error). ``joined``: the
    calls this rank made inside ``join(comm)`` before this one (``OUTSIDE_JOIN`` outside it), and for the
    call ``"join"`` whether it left its block by an exception.
    """
    rows = [(_dtype_code(b), len(b.shape), *b.shape) for b in buffers]
    header = (CALLS.index(call), int(root), int(refused), len(rows))
    mine = _fingerprint(header, rows)
    both = comm.allreduce_max(np.array([*mine, *(-v for v in mine)], dtype=np.int64)).tolist()
    highest, lowest = both[:len(mine)], [-v for v in both[len(mine):]]
    if highest == lowest:
        return
    count, ndim = highest[3], highest[4]
    table = comm.allgather(_padded((*header, joined[0], int(joined[1])), rows, count, ndim))
    raise ValueError(_mismatch_message(call, names, table, comm.rank, ndim))


# -- this rank's description ---------------------------------------------------------------------------
def _dtype_code(buf: Any) -> int:
    dtype = buf.dtype
    return (int(is_cupy_array(buf)) << 48) | (ord(dtype.kind) << 32) | dtype.itemsize


def _fingerprint(header: tuple[int, ...], rows: list[tuple[int, ...]]) -> tuple[int, ...]:
    """``(*header, largest ndim, 62-bit hash of header and rows)``."""
    digest = hashlib.blake2b(repr((header, rows)).encode(), digest_size=8).digest()
    ndim = max((row[1] for row in rows), default=0)
    return (*header, ndim, int.from_bytes(digest, "little") >> (64 - _HASH_BITS))


def _padded(header: tuple[int, ...], rows: list[tuple[int, ...]], count: int, ndim: int) -> np.ndarray:
    """``header`` then ``count`` rows of ``2 + ndim`` entries (missing rows and dimensions: -1)."""
    table = np.full((count, 2 + ndim), _PAD, dtype=np.int64)
    for i, row in enumerate(rows):
        table[i, :len(row)] = row
    return np.concatenate([np.array(header, dtype=np.int64), table.ravel()])


# -- the error every rank raises -----------------------------------------------------------------------
@dataclass(frozen=True)
class _Described:
    """One rank's call as the all-gather tells it."""

    call: int
    root: int
    refused: int
    buffers: tuple[str | None, ...]   # each buffer's description, None past this rank's count
    calls_in_join: int                # OUTSIDE_JOIN outside join(comm)
    left_by_exception: int


_HEADER = 6   # call, root, refused, count, calls in join, left by an exception


def _decode(vector: np.ndarray, ndim: int) -> _Described:
    call, root, refused, count, calls_in_join, failed = (int(v) for v in vector[:_HEADER])
    rows = vector[_HEADER:].reshape(-1, 2 + ndim)
    buffers = tuple(_buffer_text(row) if i < count else None for i, row in enumerate(rows))
    return _Described(call, root, refused, buffers, calls_in_join, failed)


def _buffer_text(row: np.ndarray) -> str:
    code, dims = int(row[0]), int(row[1])
    kind, itemsize, on_gpu = chr((code >> 32) & 0xFFFF), code & 0xFFFFFFFF, code >> 48
    try:
        dtype = np.dtype(f"{kind}{itemsize}").name
    except TypeError:
        dtype = f"{kind}{itemsize}"
    return f"shape {tuple(int(n) for n in row[2:2 + dims])} and dtype {dtype}{' (CuPy)' if on_gpu else ''}"


def _mismatch_message(call: str, names: Sequence[str], table: np.ndarray, rank: int, ndim: int) -> str:
    decoded = [_decode(row, ndim) for row in table]
    refusing = [r for r, d in enumerate(decoded) if d.refused]
    if refusing:
        return (f"{call}: rank(s) {refusing} refused their arguments (see the error raised there); no data "
                "was exchanged")
    mine = decoded[rank]
    other = next(r for r, d in enumerate(decoded) if _compared(d) != _compared(mine))
    theirs = decoded[other]
    join = CALLS.index("join")
    if join in (mine.call, theirs.call) and mine.call != theirs.call:
        return _uneven_message(call, rank, mine, other, theirs)
    lead = f"{call}: the ranks disagree on this collective call (rank {rank}, this one, and rank {other}): "
    fix = ("; every rank must pass the same buffers (number, order, shapes, dtypes) and root; no data "
           "was exchanged")
    if mine.call != theirs.call:
        return lead + f"rank {rank} calls {call}, rank {other} calls {CALLS[theirs.call]}" + fix
    if mine.root != theirs.root:
        return lead + f"root = {mine.root} on rank {rank}, root = {theirs.root} on rank {other}" + fix
    i = next(i for i, (a, b) in enumerate(zip(mine.buffers, theirs.buffers, strict=True)) if a != b)
    here, there = mine.buffers[i], theirs.buffers[i]
    counts = [sum(d is not None for d in side.buffers) for side in (mine, theirs)]
    passes = f"rank {rank} passes {counts[0]} buffer(s), rank {other} passes {counts[1]}: "
    if here is None:
        return lead + passes + f"buffer #{i} ({there} on rank {other}) does not exist on rank {rank}" + fix
    name = names[i] if i < len(names) else f"buffer #{i}"
    if there is None:
        return lead + passes + f"{name} ({here} here) does not exist on rank {other}" + fix
    return lead + f"{name} has {here} on rank {rank}, {there} on rank {other}" + fix


def _compared(d: _Described) -> tuple:
    """What the fingerprint covers (the calls inside join are only told)."""
    return d.call, d.root, d.refused, d.buffers


def _uneven_message(call: str, rank: int, mine: _Described, other: int, theirs: _Described) -> str:
    """One rank has left ``join(comm)`` while another makes a call."""
    fix = ": every rank must make the same collective calls inside join(comm) (uneven inputs?)"
    if mine.call == CALLS.index("join"):
        made = (f"made collective call {theirs.calls_in_join + 1}" if theirs.calls_in_join != OUTSIDE_JOIN
                else f"called {CALLS[theirs.call]} outside join(comm)")
        return (f"join(comm): rank {other} {made} after rank {rank} (this one) left join(comm) after "
                f"{_calls(mine.calls_in_join)}" + fix)
    how = " by an exception" if theirs.left_by_exception else ""
    this = (f"this is call {mine.calls_in_join + 1} on rank {rank}" if mine.calls_in_join != OUTSIDE_JOIN
            else f"rank {rank} is not inside join(comm)")
    return (f"{call}: rank {other} has left join(comm){how} after {_calls(theirs.calls_in_join)}; {this}"
            + fix + "; no data was exchanged")


def _calls(n: int) -> str:
    return f"{n} call" if n == 1 else f"{n} calls"
