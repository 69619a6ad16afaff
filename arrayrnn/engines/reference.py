"""The reference engine: the shared stack driver plus a plain ``xp`` time loop over the cell steps.

Array-generic (NumPy and CuPy), readable, and the oracle every other engine is tested against. Per
step it runs the cell's gate math (:mod:`arrayrnn.engines.cells`) on the active prefix of rows
``[:batch_sizes[t]]``; everything that can be hoisted out of the loop is done by the driver
(:mod:`arrayrnn.engines.stack`).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from ..core.backend import get_xp
from ..core.spec import RNNSpec
from .base import DirectionCache, DirectionForward, DirectionGrads, DirectionWeights
from .cells import BACKWARD_STEPS, FORWARD_STEPS
from .stack import StackEngine

Array = Any


def time_steps(T: int, reverse: bool) -> range:
    """The order in which the forward pass visits steps."""
    return range(T - 1, -1, -1) if reverse else range(T)


def empty_cache(xp: ModuleType, spec: RNNSpec, T: int, B: int, dtype: Any) -> DirectionCache:
    """Zero-filled residual stacks (zeros so inactive rows stay finite for the hoisted GEMMs)."""
    def stack(width: int) -> Array:
        return xp.zeros((T, B, width), dtype=dtype)

    H = spec.hidden_size
    if spec.mode == "lstm":
        return DirectionCache(gates=stack(spec.gate_size), c=stack(H), tanh_c=stack(H))
    if spec.mode == "gru":
        return DirectionCache(gates=stack(spec.gate_size), hn=stack(H) if spec.reset_after else None)
    return DirectionCache()


class ReferenceKernel:
    """:class:`~arrayrnn.engines.base.DirectionKernel` with a Python loop over steps."""

    def forward(self, spec: RNNSpec, w: DirectionWeights, xw: Array, batch_sizes: np.ndarray, h0: Array,
                c0: Array | None, reverse: bool, keep_cache: bool) -> DirectionForward:
        xp = get_xp(xw)
        T, B, _ = xw.shape
        step = FORWARD_STEPS[spec.mode]
        y = xp.zeros((T, B, spec.output_size), dtype=xw.dtype)
        h = h0.copy()
        c = c0.copy() if c0 is not None else None
        cache = empty_cache(xp, spec, T, B, xw.dtype) if keep_cache else None
        for t in time_steps(T, reverse):
            n = int(batch_sizes[t])
            if n == 0:
                continue
            h_new, c_new, residuals = step(xp, spec, w, xw[t, :n], h[:n], c[:n] if c is not None else None)
            y[t, :n] = h_new
            h[:n] = h_new
            if c is not None:
                c[:n] = c_new
            if cache is not None:
                for name, value in residuals.items():
                    getattr(cache, name)[t, :n] = value
        return DirectionForward(y, h, c, cache)

    def backward(self, spec: RNNSpec, w: DirectionWeights, fwd: DirectionForward, h_prev: Array,
                 c_prev: Array | None, dy: Array, dh_n: Array, dc_n: Array | None, batch_sizes: np.ndarray,
                 reverse: bool) -> DirectionGrads:
        xp = get_xp(dy)
        T, B, _ = dy.shape
        step = BACKWARD_STEPS[spec.mode]
        dpre_in = xp.zeros((T, B, spec.gate_size), dtype=dy.dtype)
        dpre_rec = xp.zeros_like(dpre_in) if spec.mode == "gru" and spec.reset_after else dpre_in
        d_h = xp.zeros((T, B, spec.output_size), dtype=dy.dtype) if w.W_hr is not None else None
        dh = dh_n.copy()
        dc = dc_n.copy() if dc_n is not None else None
        names = [name for name in ("gates", "c", "tanh_c", "hn") if getattr(fwd.cache, name) is not None]
        for t in reversed(time_steps(T, reverse)):
            n = int(batch_sizes[t])
            if n == 0:
                continue
            residuals = {name: getattr(fwd.cache, name)[t, :n] for name in names}
            g_ih, g_hh, g_h, dh_prev, dc_prev = step(
                xp, spec, w, dy[t, :n] + dh[:n], dc[:n] if dc is not None else None, residuals,
                h_prev[t, :n], c_prev[t, :n] if c_prev is not None else None, fwd.y[t, :n])
            dpre_in[t, :n] = g_ih
            if g_hh is not None:
                dpre_rec[t, :n] = g_hh
            if g_h is not None:
                d_h[t, :n] = g_h
            dh[:n] = dh_prev
            if dc is not None:
                dc[:n] = dc_prev
        return DirectionGrads(dpre_in, dpre_rec, d_h, dh, dc)


ENGINE = StackEngine("reference", ReferenceKernel())
