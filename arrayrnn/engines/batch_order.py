"""Rows sorted by length (cuDNN's packed layout): the permutation and the per-step batch sizes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.backend import get_xp

Array = Any


@dataclass(frozen=True, eq=False)
class BatchOrder:
    """``perm`` sorts rows by length, descending and stable; ``batch_sizes[t]`` rows are active at step t.

    After sorting, step ``t`` works on the contiguous prefix of rows ``[:batch_sizes[t]]``.
    ``perm is None`` means the rows are already in that order.
    """

    perm: np.ndarray | None
    inverse: np.ndarray | None
    batch_sizes: np.ndarray      # (T,) int64, non-increasing
    lengths: np.ndarray | None   # (B,) int64 host copy in the caller's order; None = all full

    @classmethod
    def full(cls, seq_len: int, batch: int) -> BatchOrder:
        return cls(None, None, np.full(seq_len, batch, dtype=np.int64), None)

    @classmethod
    def from_lengths(cls, lengths: np.ndarray, seq_len: int) -> BatchOrder:
        if lengths.size and int(lengths.min()) >= seq_len:  # every row full: the caller's order as it is
            return cls(None, None, np.full(seq_len, lengths.size, dtype=np.int64), lengths)
        perm = np.argsort(-lengths, kind="stable")
        steps = np.arange(seq_len)
        batch_sizes = (lengths[None, :] > steps[:, None]).sum(axis=1).astype(np.int64)
        if np.array_equal(perm, np.arange(lengths.size)):
            return cls(None, None, batch_sizes, lengths)
        return cls(perm, np.argsort(perm), batch_sizes, lengths)

    @property
    def has_padding(self) -> bool:
        return bool(self.batch_sizes.size) and int(self.batch_sizes[-1]) < self.batch

    @property
    def batch(self) -> int:
        return int(self.lengths.size) if self.lengths is not None else int(self.batch_sizes[0])

    def gather_time_major(self, x: Array, batch_first: bool) -> Array:
        """A new contiguous ``(T, B, F)`` array: ``x`` (caller's rows, time- or batch-major) with its rows
        sorted and zero at padding, made in one gather."""
        xp = get_xp(x)
        time_major = xp.swapaxes(x, 0, 1) if batch_first else x
        if self.perm is None:
            out = xp.array(time_major, order="C", copy=True)
        else:  # row by row: fancy indexing of a strided view would copy twice (a strided temporary first)
            out = xp.empty(time_major.shape, dtype=x.dtype)
            for row, source in enumerate(self.perm):
                out[:, row] = time_major[:, source]
        if self.has_padding:
            out[~self.active(xp)[:, :, 0]] = 0
        return out

    def sort(self, a: Array | None, axis: int = 1) -> Array | None:
        """Rows of ``a`` (along ``axis``) in sorted order."""
        return _take(a, self.perm, axis)

    def unsort(self, a: Array | None, axis: int = 1) -> Array | None:
        """Rows of ``a`` (along ``axis``) back in the caller's order."""
        return _take(a, self.inverse, axis)

    def active(self, xp: Any) -> Array:
        """(T, B, 1) boolean: whether row b (sorted) is active at step t."""
        rows = np.arange(self.batch)
        return xp.asarray((rows[None, :] < self.batch_sizes[:, None])[:, :, None])


def _take(a: Array | None, index: np.ndarray | None, axis: int) -> Array | None:
    if a is None or index is None:
        return a
    xp = get_xp(a)
    return xp.take(a, xp.asarray(index), axis=axis)
