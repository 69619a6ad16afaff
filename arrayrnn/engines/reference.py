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
from .custom_steps import custom_backward_step, custom_forward_step
from .layer_norm import new_gain_grads
from .stack import StackEngine
from .step_order import step_time

Array = Any


def time_steps(T: int, reverse: bool) -> list[int]:
    """The order in which the forward pass visits steps (:func:`.step_order.step_time`)."""
    return [step_time(s, T, reverse) for s in range(T)]


def empty_cache(xp: ModuleType, spec: RNNSpec, T: int, B: int, dtype: Any,
                w: DirectionWeights | None = None) -> DirectionCache:
    """Zero-filled residual stacks (zeros so inactive rows stay finite for the hoisted GEMMs); with
    zoneout (``w.zoneout_h`` / ``w.zoneout_c``) also the step's own output / cell before zoneout; with layer
    norm the statistics of each row normalised (``norm_stats``)."""
    def stack(width: int) -> Array:
        return xp.zeros((T, B, width), dtype=dtype)

    H = spec.hidden_size
    if spec.custom_cell is not None:
        return DirectionCache(residuals=stack(spec.custom_cell.num_residuals * H),
                              c=stack(spec.cell_width) if spec.has_cell else None)
    zone_h = w is not None and w.zoneout_h is not None
    zone_c = w is not None and w.zoneout_c is not None
    stats = xp.zeros((T, B, spec.norms_per_step, 2), dtype) if spec.layer_norm else None
    if spec.mode == "lstm":
        return DirectionCache(gates=stack(spec.gate_size), c=stack(H), tanh_c=stack(H),
                              c_cand=stack(H) if zone_c else None, norm_stats=stats)
    if spec.mode == "gru":
        return DirectionCache(gates=stack(spec.gate_size), hn=stack(H) if spec.reset_after else None,
                              norm_stats=stats)
    return DirectionCache(gates=stack(H) if zone_h else None, norm_stats=stats)


def zoneout(m: Array, prev: Array, new: Array) -> Array:
    """``m * prev + (1 - m) * new``: the zoned-out state."""
    return new + m * (prev - new)


class ReferenceKernel:
    """:class:`~arrayrnn.engines.base.DirectionKernel` with a Python loop over steps."""

    def forward(self, spec: RNNSpec, w: DirectionWeights, xw: Array, batch_sizes: np.ndarray, h0: Array,
                c0: Array | None, reverse: bool, keep_cache: bool) -> DirectionForward:
        xp = get_xp(xw)
        T, B, _ = xw.shape
        step = custom_forward_step if spec.custom_cell is not None else FORWARD_STEPS[spec.mode]
        y = xp.zeros((T, B, spec.output_size), dtype=xw.dtype)
        h = h0.copy()
        c = c0.copy() if c0 is not None else None
        cache = empty_cache(xp, spec, T, B, xw.dtype, w) if keep_cache else None
        for t in time_steps(T, reverse):
            n = int(batch_sizes[t])
            if n == 0:
                continue
            h_t, c_t = h[:n], c[:n] if c is not None else None
            h_rec = h_t * w.h_mask[:n] if w.h_mask is not None else None
            h_new, c_new, residuals = step(xp, spec, w, xw[t, :n], h_t, c_t, h_rec=h_rec)
            if w.zoneout_h is not None:
                if spec.mode.startswith("rnn"):
                    residuals["gates"] = h_new  # the candidate, whose derivative the backward takes
                h_new = zoneout(w.zoneout_h[t, :n], h_t, h_new)
            if w.zoneout_c is not None:
                residuals["c_cand"] = c_new
                c_new = residuals["c"] = zoneout(w.zoneout_c[t, :n], c_t, c_new)
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
                 reverse: bool, dc_seq: Array | None = None) -> DirectionGrads:
        xp = get_xp(dy)
        T, B, _ = dy.shape
        step = custom_backward_step if spec.custom_cell is not None else BACKWARD_STEPS[spec.mode]
        dpre_in = xp.zeros((T, B, spec.gate_size), dtype=dy.dtype)
        apart = bool(spec.split_gates) or w.norm is not None  # a dpre_rec of its own
        dpre_rec = xp.zeros_like(dpre_in) if apart else dpre_in
        norm_acc = new_gain_grads(xp, spec, dy.dtype) if w.norm is not None else None
        d_h = xp.zeros((T, B, spec.output_size), dtype=dy.dtype) if w.W_hr is not None else None
        dh = dh_n.copy()
        dc = dc_n.copy() if dc_n is not None else None
        names = [name for name in ("gates", "c", "tanh_c", "hn", "c_cand", "norm_stats", "residuals")
                 if getattr(fwd.cache, name) is not None]
        own_output = spec.mode.startswith("rnn") and fwd.cache.gates is not None  # zoneout: y is not h~
        for t in reversed(time_steps(T, reverse)):
            n = int(batch_sizes[t])
            if n == 0:
                continue
            residuals = {name: getattr(fwd.cache, name)[t, :n] for name in names}
            dh_t = dy[t, :n] + dh[:n]
            dc_t = dc[:n] + dc_seq[t, :n] if dc_seq is not None else (dc[:n] if dc is not None else None)
            m_h = w.zoneout_h[t, :n] if w.zoneout_h is not None else None
            m_c = w.zoneout_c[t, :n] if w.zoneout_c is not None else None
            g_ih, g_hh, g_h, dh_prev, dc_prev = step(
                xp, spec, w, dh_t - m_h * dh_t if m_h is not None else dh_t,
                dc_t - m_c * dc_t if m_c is not None else dc_t, residuals,
                h_prev[t, :n], c_prev[t, :n] if c_prev is not None else None,
                residuals["gates"] if own_output else fwd.y[t, :n],
                h_mask=w.h_mask[:n] if w.h_mask is not None else None, norm_acc=norm_acc)
            if m_h is not None:
                dh_prev += m_h * dh_t
            if m_c is not None:
                dc_prev += m_c * dc_t
            dpre_in[t, :n] = g_ih
            if g_hh is not None:
                dpre_rec[t, :n] = g_hh
            if g_h is not None:
                d_h[t, :n] = g_h
            dh[:n] = dh_prev
            if dc is not None:
                dc[:n] = dc_prev
        return DirectionGrads(dpre_in, dpre_rec, d_h, dh, dc, norm=norm_acc)


ENGINE = StackEngine("reference", ReferenceKernel())
