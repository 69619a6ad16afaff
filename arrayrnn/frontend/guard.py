"""Detect in-place writes to a params buffer between ``rnn_forward`` and ``rnn_backward``.

PyTorch raises when a tensor saved for backward was modified in place (its version counter). NumPy and
CuPy arrays have no version counter, so the forward keeps a private copy of the flat buffer (one copy of
``params.data``: small next to the forward, which reads ``W_hh`` once per step) and the backward compares
it with the buffer. Any write that changes a value of ``params.data`` (an optimizer step, ``-=`` on a
view, ``params.data[...] = ...``) is detected; a write that leaves every value as it was is harmless.
"""

from __future__ import annotations

from typing import Any

from ..core.backend import get_xp


class WeightSnapshot:
    """A private copy of a flat buffer; :meth:`assert_unchanged` raises if the buffer changed since."""

    def __init__(self, data: Any):
        self._copy = get_xp(data).array(data, copy=True)

    def assert_unchanged(self, data: Any) -> None:
        xp = get_xp(data)
        # the plain comparison is 10x cheaper; only a buffer holding NaN needs the NaN-aware one
        if not bool(xp.array_equal(self._copy, data)) and not bool(
                xp.array_equal(self._copy, data, equal_nan=True)):
            raise ValueError(
                "params.data was modified in place between rnn_forward and rnn_backward (for example an "
                "optimizer step before the backward); the gradient would match neither the old nor the new "
                "weights. Call rnn_backward first, then update the params, or run rnn_forward again.")

