"""One time step of a custom cell (:mod:`arrayrnn.core.cell_registry`) against ``xp``: the reference engine's.

The cell's scalar functions run on whole ``(n, H)`` blocks (they are elementwise), with the same
signatures as the built-in steps of :mod:`.cells` (the reference kernel calls either). Per active row::

    hw = h_rec @ W_hh.T                                   # (n, G*H), one product for every gate
    pre_k = xw_k + hw_k            (a split gate: xw_k, hw_k + inner_bias_k, apart)
    (h, *others), res = cell.forward(*pre, h, *others)    # others: the columns of c, H each
    ...backward: (*d_pre, dh_prev, *d_others) = cell.backward(res, (dh, *dc))
    dh_prev += d_rec @ W_hh                               # the product's part (d_rec: the pre-activations'
                                                          #   cotangents, a split gate's recurrent part)
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..core.spec import RNNSpec

if TYPE_CHECKING:
    from .base import DirectionWeights

Array = Any


def blocks(a: Array, count: int, width: int) -> list[Array]:
    """The ``count`` column blocks of ``width`` of ``a``'s last axis (views)."""
    return [a[..., k * width:(k + 1) * width] for k in range(count)]


def _as_block(xp: ModuleType, value: Any, like: Array) -> Array:
    """A cell's output as an ``(n, H)`` array of ``like``'s dtype (a constant such as ``0.0`` broadcast)."""
    out = xp.empty_like(like)
    out[...] = value
    return out


def forward_inputs(xp: ModuleType, spec: RNNSpec, w: DirectionWeights, xw_t: Array, hw: Array) -> list[Array]:
    """``forward``'s pre-activation arguments from the input side ``xw_t`` and the product ``hw``."""
    cell, H = spec.custom_cell, spec.hidden_size
    args = []
    for k, (x_k, h_k) in enumerate(zip(blocks(xw_t, spec.gates, H), blocks(hw, spec.gates, H), strict=True)):
        slot = cell.split_index(cell.gates[k])
        if slot is None:
            args.append(x_k + h_k)
        else:
            args += [x_k, h_k + w.inner_bias[slot * H:(slot + 1) * H] if w.inner_bias is not None else h_k]
    return args


def custom_forward_step(xp: ModuleType, spec: RNNSpec, w: DirectionWeights, xw_t: Array, h: Array,
                        c: Array | None, h_rec: Array | None = None) -> tuple[Array, Array | None, dict]:
    """``(h_new, c_new, {"residuals": (n, R*H), "c": c_new})`` of one step of the rows ``h`` (``c``: the other
    states; the cache keeps every step's ``c_new``: ``return_all_states``' ``c_all``)."""
    cell, H = spec.custom_cell, spec.hidden_size
    hw = (h if h_rec is None else h_rec) @ w.W_hh.T
    others = blocks(c, len(cell.states) - 1, H) if c is not None else []
    new_states, residuals = cell.forward(*forward_inputs(xp, spec, w, xw_t, hw), h, *others)
    h_new = _as_block(xp, new_states[0], h)
    c_new = None
    if c is not None:
        c_new = xp.empty_like(c)
        for k, value in enumerate(new_states[1:]):
            c_new[:, k * H:(k + 1) * H] = value
    res = xp.empty((h.shape[0], cell.num_residuals * H), dtype=h.dtype)
    for k, value in enumerate(residuals):
        res[:, k * H:(k + 1) * H] = value
    kept = {"residuals": res} if c_new is None else {"residuals": res, "c": c_new}
    return h_new, c_new, kept


def custom_backward_step(xp: ModuleType, spec: RNNSpec, w: DirectionWeights, dh: Array, dc: Array | None,
                         res: dict[str, Array], h_prev: Array, c_prev: Array | None, y: Array,
                         h_mask: Array | None = None, norm_acc: dict | None = None):
    """The backward step (:mod:`.cells`' signature):
    ``(dpre_in, dpre_rec or None, None, dh_prev, dc_prev)``."""
    cell, H, G = spec.custom_cell, spec.hidden_size, spec.gates
    residuals = tuple(blocks(res["residuals"], cell.num_residuals, H))
    d_new = (dh, *(blocks(dc, len(cell.states) - 1, H) if dc is not None else ()))
    grads = cell.backward(residuals, d_new)
    d_inputs, d_states = grads[:cell.num_inputs], grads[cell.num_inputs:]
    dpre_in = xp.empty((dh.shape[0], G * H), dtype=dh.dtype)
    dpre_rec = xp.empty_like(dpre_in) if cell.split else dpre_in
    position = 0
    for k, name in enumerate(cell.gates):
        cols = slice(k * H, (k + 1) * H)
        dpre_in[:, cols] = d_inputs[position]
        if cell.split:
            dpre_rec[:, cols] = d_inputs[position + 1] if name in cell.split else d_inputs[position]
        position += 2 if name in cell.split else 1
    d_rec = dpre_rec @ w.W_hh
    if h_mask is not None:
        d_rec *= h_mask
    dh_prev = d_rec
    dh_prev += d_states[0]  # in place: a float64 constant from the cell keeps the rows' dtype
    dc_prev = None
    if dc is not None:
        dc_prev = xp.empty_like(dc)
        for k, value in enumerate(d_states[1:]):
            dc_prev[:, k * H:(k + 1) * H] = value
    return dpre_in, dpre_rec if cell.split else None, None, dh_prev, dc_prev
