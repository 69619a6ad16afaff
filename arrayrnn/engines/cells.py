"""Gate math of the four cells for one time step, written once against ``xp`` (NumPy or CuPy).

Every function works on the ``n`` active rows of one step. Forward steps return the new state and the
residuals the backward needs (see :class:`~arrayrnn.engines.base.DirectionCache`); backward steps take
the total cotangent of the step's output ``dh`` (and ``dc`` for LSTM) and return the pre-activation
gradients plus the carries into the previous step. Derivatives are taken from outputs: ``1 - g*g`` for
tanh, ``s * (1 - s)`` for sigmoid, ``y > 0`` for relu. Gates are addressed by name (``spec.gate_names``).

Semantics, per active row (``@`` as in ``x @ W.T``; ``xw = W_ih x + b_ih (+ folded b_hh)``):

- rnn: ``h = act(xw + W_hh h)``
- lstm: ``i, f, g, o = sig, sig, tanh, sig(xw + W_hh h)``; ``c = clip(f*c + i*g)``;
  ``h = o * tanh(c)``, then ``h = W_hr h`` with projection
- gru, reset_after: ``r, z = sig(xw_rz + W_hrz h)``; ``n = tanh(xw_n + r * (W_hn h + b_hn))``
- gru, reset_before: ``n = tanh(xw_n + W_hn (r * h))`` (``b_hn`` is folded into ``xw``);
  both GRUs: ``h = (1 - z) * n + z * h``

Cell variants: with recurrent dropout the recurrent products read ``h_rec = h * h_mask`` in place of
``h`` (the GRU's ``z * h`` keeps the carried ``h``); peepholes (``w.P``, rows i, f, o) add ``P_i * c`` and
``P_f * c`` to the i and f pre-activations and ``P_o * c_new`` (after clipping) to o's. Zoneout wraps a
step (the reference kernel does it): ``h = m*h_prev + (1-m)*h_step``. Layer normalisation (``w.norm``;
:mod:`.layer_norm` has the loop): every recurrent product ``W h`` becomes ``g_hh * LN(W h)`` (its statistics
into the residual ``norm_stats``), the LSTM's ``tanh(c)`` becomes ``tanh(g_c * LN(c) + b_c)``; ``xw``
arrives normalised. Its backward steps also take ``norm_acc`` (:func:`.layer_norm.new_gain_grads`), into
which they add the gains' gradients, and return the raw product's cotangent as ``dpre_rec``.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..core.backend import get_xp
from ..core.spec import RNNSpec
from .layer_norm import normalized, normalized_backward
from .pointwise import POINTWISE

if TYPE_CHECKING:  # base imports nothing of this module; the weights type is only needed for hints
    from .base import DirectionWeights

Array = Any
_TANH, _SIGMOID, _RELU = POINTWISE["tanh"], POINTWISE["sigmoid"], POINTWISE["relu"]


# -- gates by name ------------------------------------------------------------------------------
def gate_slice(spec: RNNSpec, first: str, last: str | None = None) -> slice:
    """Columns of gates ``first`` .. ``last`` (inclusive, in ``spec.gate_names`` order) in a G*H axis."""
    names, h = spec.gate_names, spec.hidden_size
    start, stop = names.index(first), names.index(last or first) + 1
    return slice(start * h, stop * h)


def gate(spec: RNNSpec, a: Array, first: str, last: str | None = None) -> Array:
    """View of gate(s) ``first`` .. ``last`` along the last axis of ``a``."""
    return a[..., gate_slice(spec, first, last)]


# -- activations (in place where it saves memory) ------------------------------------------------
def sigmoid_(xp: ModuleType, a: Array) -> Array:
    """``a = sigmoid(a)`` in place (:data:`arrayrnn.engines.pointwise.POINTWISE`)."""
    _SIGMOID.forward(xp, a, a)
    return a


def tanh_(xp: ModuleType, a: Array) -> Array:
    _TANH.forward(xp, a, a)
    return a


def relu_(xp: ModuleType, a: Array) -> Array:
    _RELU.forward(xp, a, a)
    return a


# -- biases -------------------------------------------------------------------------------------
def split_biases(spec: RNNSpec, b_ih: Array | None, b_hh: Array | None) -> tuple[Array | None, Array | None]:
    """``(input_bias, inner_bias)``: what is added once into ``xw`` and what stays inside the step.

    Every bias is additive outside any product except a split gate's part of ``b_hh`` (the reset-after
    GRU's ``b_hn``, which sits in ``r * (W_hn h + b_hn)``; a custom cell's ``split`` gates, concatenated in
    gate order); that one stays with the kernel. Each bias keeps exactly the place PyTorch's
    cell equations give it, so a single bias mode is a plain omission.
    """
    inner = None
    outer_hh = b_hh
    split = spec.split_gates
    if b_hh is not None and split:
        parts = [gate(spec, b_hh, name) for name in split]
        inner = parts[0] if len(parts) == 1 else get_xp(b_hh).concatenate(parts)
        outer_hh = b_hh.copy()
        for name in split:
            gate(spec, outer_hh, name)[...] = 0
    if b_ih is None:
        return outer_hh, inner
    if outer_hh is None:
        return b_ih, inner
    return b_ih + outer_hh, inner


# -- layer normalisation of the recurrent products and the LSTM's cell (w.norm) ------------------------
_PRODUCT, _CELL = 0, 1  # norm_stats slots (the reset-before GRU: r, z part in 0, n part in 1)


def _norm_stats(xp: ModuleType, spec: RNNSpec, rows: int, dtype: Any) -> Array | None:
    """A step's ``(rows, S, 2)`` statistics residual (``None`` without layer norm)."""
    return xp.zeros((rows, spec.norms_per_step, 2), dtype) if spec.layer_norm else None


def _residuals(residuals: dict[str, Array], stats: Array | None) -> dict[str, Array]:
    if stats is not None:
        residuals["norm_stats"] = stats
    return residuals


def recurrent(xp: ModuleType, w: DirectionWeights, h: Array, W_T: Array, stats: Array | None,
              slot: int = _PRODUCT, cols: slice = slice(None)) -> Array:
    """The recurrent product ``h @ W_T`` (columns ``cols`` of the G*H axis); with layer norm
    ``g_hh[cols] * LN(h @ W_T)``, its statistics into ``stats[:, slot]``."""
    product = h @ W_T
    if w.norm is None:
        return product
    return normalized(xp, product, w.norm.g_hh[cols], w.norm.eps, stats[:, slot])


def recurrent_grad(w: DirectionWeights, d: Array, h: Array, W_T: Array, stats: Array | None,
                   norm_acc: dict[str, Array] | None, slot: int = _PRODUCT,
                   cols: slice = slice(None)) -> Array:
    """The cotangent of the raw product ``h @ W_T`` from ``d``, that of what :func:`recurrent` returned
    (the product is computed again); the gain's gradient and ``b_hh``'s (beside it) into ``norm_acc``."""
    if w.norm is None:
        return d
    return normalized_backward(h @ W_T, stats[:, slot], w.norm.g_hh[cols], d, norm_acc["g_hh"][cols],
                               norm_acc["b_hh"][cols])


def _cell_output(xp: ModuleType, w: DirectionWeights, c: Array, stats: Array | None) -> Array:
    """``tanh(c)``; with layer norm ``tanh(g_c * LN(c) + b_c)`` (statistics into ``stats[:, 1]``)."""
    if w.norm is None:
        return xp.tanh(c)
    u = normalized(xp, c, w.norm.g_c, w.norm.eps, stats[:, _CELL])
    u += w.norm.b_c
    return tanh_(xp, u)


def _cell_output_grad(w: DirectionWeights, d_u: Array, c: Array, stats: Array | None,
                      norm_acc: dict[str, Array] | None) -> Array:
    """The cotangent of ``c`` through :func:`_cell_output` from that of tanh's argument ``d_u``."""
    if w.norm is None:
        return d_u
    return normalized_backward(c, stats[:, _CELL], w.norm.g_c, d_u, norm_acc["g_c"], norm_acc["b_c"])


def _h_rec(h_prev: Array, h_mask: Array | None) -> Array:
    return h_prev * h_mask if h_mask is not None else h_prev


# -- forward steps: (xp, spec, w, xw_t, h, c) -> (h_new, c_new, residuals) ------------------------
def rnn_forward_step(xp: ModuleType, spec: RNNSpec, w: DirectionWeights, xw_t: Array, h: Array,
                     c: Array | None, h_rec: Array | None = None) -> tuple[Array, None, dict[str, Array]]:
    stats = _norm_stats(xp, spec, h.shape[0], xw_t.dtype)
    pre = xw_t + recurrent(xp, w, h if h_rec is None else h_rec, w.W_hh.T, stats)
    h_new = tanh_(xp, pre) if spec.mode == "rnn_tanh" else relu_(xp, pre)
    return h_new, None, _residuals({}, stats)


def lstm_forward_step(xp: ModuleType, spec: RNNSpec, w: DirectionWeights, xw_t: Array, h: Array,
                      c: Array, h_rec: Array | None = None) -> tuple[Array, Array, dict[str, Array]]:
    stats = _norm_stats(xp, spec, h.shape[0], xw_t.dtype)
    gates = xw_t + recurrent(xp, w, h if h_rec is None else h_rec, w.W_hh.T, stats)
    i, f, g, o = (gate(spec, gates, name) for name in ("i", "f", "g", "o"))
    if w.P is not None:
        i += w.P[0] * c
        f += w.P[1] * c
    sigmoid_(xp, gate(spec, gates, "i", "f"))
    tanh_(xp, g)
    c_new = f * c
    c_new += i * g
    if spec.cell_clip is not None:
        xp.clip(c_new, *spec.cell_clip, out=c_new)
    if w.P is not None:
        o += w.P[2] * c_new
    sigmoid_(xp, o)
    tanh_c = _cell_output(xp, w, c_new, stats)
    h_new = o * tanh_c
    if w.W_hr is not None:
        h_new = h_new @ w.W_hr.T
    return h_new, c_new, _residuals({"gates": gates, "c": c_new, "tanh_c": tanh_c}, stats)


def gru_forward_step(xp: ModuleType, spec: RNNSpec, w: DirectionWeights, xw_t: Array, h: Array,
                     c: Array | None, h_rec: Array | None = None) -> tuple[Array, None, dict[str, Array]]:
    gates = xw_t.copy()
    rz, n = gate(spec, gates, "r", "z"), gate(spec, gates, "n")
    stats = _norm_stats(xp, spec, h.shape[0], xw_t.dtype)
    residuals = _residuals({"gates": gates}, stats)
    h_rec = h if h_rec is None else h_rec
    if spec.reset_after:
        hh = recurrent(xp, w, h_rec, w.W_hh.T, stats)
        hn = gate(spec, hh, "n")
        if w.inner_bias is not None:
            hn += w.inner_bias
        rz += gate(spec, hh, "r", "z")
        sigmoid_(xp, rz)
        n += gate(spec, gates, "r") * hn
        residuals["hn"] = hn
    else:  # with layer norm each part of the product over its own row (.layer_norm)
        rz += recurrent(xp, w, h_rec, gate(spec, w.W_hh.T, "r", "z"), stats, 0, gate_slice(spec, "r", "z"))
        sigmoid_(xp, rz)
        n += recurrent(xp, w, gate(spec, gates, "r") * h_rec, gate(spec, w.W_hh.T, "n"), stats, 1,
                       gate_slice(spec, "n"))
    tanh_(xp, n)
    h_new = h - n
    h_new *= gate(spec, gates, "z")
    h_new += n
    return h_new, None, residuals


# -- backward steps -----------------------------------------------------------------------------
# (xp, spec, w, dh, dc, res_t, h_prev_t, c_prev_t, y_t, h_mask=None, norm_acc=None)
#     -> (dpre_in, dpre_rec or None (meaning dpre_in), d_h, dh_prev, dc_prev)
# ``y_t``: the step's own output (before zoneout); ``h_mask``: the rows' recurrent-dropout mask or None;
# ``norm_acc``: with layer norm, the gains' gradient accumulators (dpre_rec is then the raw product's).
def _masked(a: Array, h_mask: Array | None) -> Array:
    if h_mask is not None:
        a *= h_mask
    return a


def rnn_backward_step(xp: ModuleType, spec: RNNSpec, w: DirectionWeights, dh: Array, dc: Array | None,
                      res: dict[str, Array], h_prev: Array, c_prev: Array | None, y: Array,
                      h_mask: Array | None = None, norm_acc: dict[str, Array] | None = None):
    d_pre = dh * (_TANH if spec.mode == "rnn_tanh" else _RELU).d_output(y)
    d_rec = recurrent_grad(w, d_pre, _h_rec(h_prev, h_mask), w.W_hh.T, res.get("norm_stats"), norm_acc)
    return d_pre, None if w.norm is None else d_rec, None, _masked(d_rec @ w.W_hh, h_mask), None


def lstm_backward_step(xp: ModuleType, spec: RNNSpec, w: DirectionWeights, dh: Array, dc: Array,
                       res: dict[str, Array], h_prev: Array, c_prev: Array, y: Array,
                       h_mask: Array | None = None, norm_acc: dict[str, Array] | None = None):
    gates, tanh_c, stats = res["gates"], res["tanh_c"], res.get("norm_stats")
    c = res["c_cand"] if "c_cand" in res else res["c"]  # the step's own cell (before zoneout)
    i, f, g, o = (gate(spec, gates, name) for name in ("i", "f", "g", "o"))
    dm = dh @ w.W_hr if w.W_hr is not None else dh
    d_o = dm * tanh_c * _SIGMOID.d_output(o)
    dc = dc + _cell_output_grad(w, dm * o * _TANH.d_output(tanh_c), c, stats, norm_acc)
    if w.P is not None:
        dc += d_o * w.P[2]
    if spec.cell_clip is not None:
        lo, hi = spec.cell_clip
        dc *= (c > lo) & (c < hi)  # clipped entries pass no gradient
    d_pre = xp.empty_like(gates)
    d_i, d_f = gate(spec, d_pre, "i"), gate(spec, d_pre, "f")
    d_i[...] = dc * g * _SIGMOID.d_output(i)
    d_f[...] = dc * c_prev * _SIGMOID.d_output(f)
    gate(spec, d_pre, "g")[...] = dc * i * _TANH.d_output(g)
    gate(spec, d_pre, "o")[...] = d_o
    dc_prev = dc * f
    if w.P is not None:
        dc_prev += d_i * w.P[0] + d_f * w.P[1]
    d_h = dh if w.W_hr is not None else None
    d_rec = recurrent_grad(w, d_pre, _h_rec(h_prev, h_mask), w.W_hh.T, stats, norm_acc)
    return d_pre, None if w.norm is None else d_rec, d_h, _masked(d_rec @ w.W_hh, h_mask), dc_prev


def gru_backward_step(xp: ModuleType, spec: RNNSpec, w: DirectionWeights, dh: Array, dc: Array | None,
                      res: dict[str, Array], h_prev: Array, c_prev: Array | None, y: Array,
                      h_mask: Array | None = None, norm_acc: dict[str, Array] | None = None):
    gates, stats = res["gates"], res.get("norm_stats")
    r, z, n = (gate(spec, gates, name) for name in ("r", "z", "n"))
    dpre_in = xp.empty_like(gates)
    dn = gate(spec, dpre_in, "n")
    dn[...] = (dh - dh * z) * _TANH.d_output(n)  # dh * (1 - z), written as the compiled kernels do
    gate(spec, dpre_in, "z")[...] = dh * (h_prev - n) * _SIGMOID.d_output(z)
    dh_prev = dh * z
    h_rec = _h_rec(h_prev, h_mask)
    if spec.reset_after:
        gate(spec, dpre_in, "r")[...] = dn * res["hn"] * _SIGMOID.d_output(r)
        d_norm = dpre_in.copy()  # the cotangent of what the step added of the recurrent side: r * (.) in n
        gate(spec, d_norm, "n")[...] *= r
        dpre_rec = recurrent_grad(w, d_norm, h_rec, w.W_hh.T, stats, norm_acc)
        dh_prev += _masked(dpre_rec @ w.W_hh, h_mask)
        return dpre_in, dpre_rec, None, dh_prev, None
    rz, n_cols = gate_slice(spec, "r", "z"), gate_slice(spec, "n")
    W_rz, W_n = gate(spec, w.W_hh.T, "r", "z"), gate(spec, w.W_hh.T, "n")
    d_n = recurrent_grad(w, dn, r * h_rec, W_n, stats, norm_acc, 1, n_cols)
    d_rh = d_n @ W_n.T
    gate(spec, dpre_in, "r")[...] = d_rh * h_rec * _SIGMOID.d_output(r)
    d_rz = recurrent_grad(w, gate(spec, dpre_in, "r", "z"), h_rec, W_rz, stats, norm_acc, 0, rz)
    d_rec = d_rh * r
    d_rec += d_rz @ W_rz.T
    dh_prev += _masked(d_rec, h_mask)
    if w.norm is None:
        return dpre_in, None, None, dh_prev, None
    dpre_rec = xp.empty_like(dpre_in)  # the raw products' cotangents, r, z part and n part
    dpre_rec[..., rz], dpre_rec[..., n_cols] = d_rz, d_n
    return dpre_in, dpre_rec, None, dh_prev, None


FORWARD_STEPS = {"rnn_tanh": rnn_forward_step, "rnn_relu": rnn_forward_step,
                 "lstm": lstm_forward_step, "gru": gru_forward_step}
BACKWARD_STEPS = {"rnn_tanh": rnn_backward_step, "rnn_relu": rnn_backward_step,
                  "lstm": lstm_backward_step, "gru": gru_backward_step}
