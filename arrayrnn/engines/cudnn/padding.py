"""Padding and empty rows in the cuDNN engine: the stand-in lengths cuDNN runs (it has no empty
sequences) and the device masks that keep padding and empty rows out of its results with ``where``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

Array = Any


def stand_in_lengths(lengths: np.ndarray) -> np.ndarray:
    """Host int32 lengths for cuDNN: every 0 run as 1 (cuDNN has no empty sequences; see :class:`Rows`)."""
    return np.maximum(np.asarray(lengths), 1).astype(np.int32)


@dataclass(frozen=True, eq=False)
class Rows:
    """Where a call's sequences have padding and empty rows, as device masks for ``xp.where``.

    cuDNN runs an empty row as one step from a zero state on zero input (:func:`stand_in_lengths`), and
    everything it reads or writes for that row, like everything at padding, is kept out of the results
    with ``where``, never by multiplying (``inf * 0`` is NaN): the row's ``h0``/``c0`` and cotangents go in
    as zeros; its outputs come back as zero, its final states as its initial ones, its ``dx`` as zero and
    its ``dh0``/``dc0`` as ``dh_n``/``dc_n``; ``dy`` is zero at every padding position before cuDNN sees it
    and ``dx`` is zero there after."""

    valid: Array | None   # (T, B, 1) / (B, T, 1) bool, True at t < len[b]; None without padding
    empty: Array | None   # (1, B, 1) bool, True for rows of length 0; None without empty rows
    seq_lengths: Array    # (B,) int32: cuDNN's devSeqLengths (:func:`stand_in_lengths`)
    host_lengths: np.ndarray  # the same on the host, for the RNN data descriptors

    @classmethod
    def of(cls, xp: Any, lengths: np.ndarray, seq_len: int, batch_first: bool) -> Rows:
        lengths = np.asarray(lengths)
        host = stand_in_lengths(lengths)
        valid = empty = None
        if (lengths < seq_len).any():
            mask = np.arange(seq_len)[:, None] < lengths[None, :]
            valid = xp.asarray((mask.T if batch_first else mask)[:, :, None])
        if (lengths == 0).any():
            empty = xp.asarray((lengths == 0)[None, :, None])
        return cls(valid, empty, xp.asarray(host), host)

    def states_in(self, xp: Any, h0: Array | None, c0: Array | None) -> tuple[Array | None, Array | None]:
        """Initial states for cuDNN: zero for empty rows (``None``, zeros, stays ``None``)."""
        return self._zero_empty(xp, h0), self._zero_empty(xp, c0)

    def forward_out(self, xp: Any, y: Array, h_n: Array, c_n: Array | None, h0: Array,
                    c0: Array | None) -> tuple[Array, Array, Array | None]:
        """cuDNN's outputs with the contract restored for empty rows."""
        if self.empty is None:
            return y, h_n, c_n
        y = xp.where(self.valid, y, 0).astype(y.dtype, copy=False)
        return y, self._restore(xp, h_n, h0), self._restore(xp, c_n, c0)

    def cotangents_in(self, xp: Any, dy: Array, dh_n: Array | None, dc_n: Array | None):
        """Cotangents for cuDNN: ``dy`` zero at padding, ``dh_n``/``dc_n`` zero for empty rows (``None``,
        zeros, stays ``None``)."""
        if self.valid is not None:
            dy = xp.where(self.valid, dy, 0).astype(dy.dtype, copy=False)
        return dy, self._zero_empty(xp, dh_n), self._zero_empty(xp, dc_n)

    def backward_out(self, xp: Any, dx: Array, dh0: Array, dc0: Array | None, dh_n: Array,
                     dc_n: Array | None) -> tuple[Array, Array, Array | None]:
        """cuDNN's gradients with ``dx`` zero at padding and the contract restored for empty rows."""
        if self.valid is not None:
            dx = xp.where(self.valid, dx, 0).astype(dx.dtype, copy=False)
        if self.empty is None:
            return dx, dh0, dc0
        return dx, self._restore(xp, dh0, dh_n), self._restore(xp, dc0, dc_n)

    def _restore(self, xp: Any, out: Array | None, given: Array | None) -> Array | None:
        """``out`` with the empty rows' entries taken from ``given`` (zeros where ``given`` is None)."""
        if out is None:
            return None
        return xp.where(self.empty, 0 if given is None else given, out).astype(out.dtype, copy=False)

    def _zero_empty(self, xp: Any, state: Array | None) -> Array | None:
        if state is None or self.empty is None:
            return state
        return xp.where(self.empty, 0, state).astype(state.dtype, copy=False)
