"""Fused bias + activation: ``act(x + b)`` and ``act(x @ W.T + b)`` as single tape nodes.

When the activation's derivative comes from its output (tanh, sigmoid, relu, ...), the forward adds the
bias and applies the activation in place in the buffer it just allocated (the GEMM's output for
``dense_bias_act``) and keeps only that output for the backward. The backward scales the incoming
gradient by ``act'(y)`` in place when the tape owns that buffer, and otherwise writes into one new
buffer. So under ``value_and_grad`` a dense layer costs one output-sized buffer in the forward and about
two in total (plus ``dW``), where the composition ``tanh(x @ W.T + b)`` keeps three in the forward and
allocates more temporaries in the backward. Activations that need their input (gelu, silu, softplus)
also keep the pre-activation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.backend import get_xp, is_writeable
from .activations import Activation
from .activations import get as get_activation
from .tape import Residuals, primitive, value_of


def _check_floating(op: str, **named: Any) -> Any:
    for name, v in named.items():
        if v is None:
            continue
        if not hasattr(v, "dtype") or not hasattr(v, "shape"):
            raise TypeError(f"{op}: {name} has type {type(v).__name__}; expected an array")
        if np.dtype(v.dtype).kind != "f":
            raise TypeError(f"{op}: {name} has dtype {v.dtype}; expected a floating array "
                            f"(convert explicitly, e.g. {name}.astype('float32'))")
    present = {n: v for n, v in named.items() if v is not None}
    return get_xp(*present.values(), names=tuple(f"{op}: {n}" for n in present))


def _check_bias(op: str, b: Any, width: int, what: str) -> None:
    if b is not None and tuple(b.shape) != (width,):
        raise ValueError(f"{op}: b has shape {tuple(b.shape)}; expected ({width},), one entry per {what}")


def _activate(xp: Any, act: Activation, z: Any) -> Any:
    """Apply ``act`` to the fresh buffer ``z``: in place when the derivative comes from the output."""
    if act.from_output:
        act.forward(z, z)
        return z
    return Residuals(_apply_new(xp, act, z), pre_activation=z)


def _apply_new(xp: Any, act: Activation, x: Any) -> Any:
    y = xp.empty_like(x)
    act.forward(x, y)
    return y


def _delta(act: Activation, v: Any, g: Any, owns_g: bool) -> Any:
    """``g * act'(v)``: in ``g`` itself when the tape owns it, else in one new buffer."""
    if owns_g and g.flags.c_contiguous and g.dtype == v.dtype and is_writeable(g):
        dz = g
    else:
        dz = get_xp(v).empty(v.shape, dtype=v.dtype)
        dz[...] = g
    act.scale_grad(v, dz)
    return dz


@primitive(keep=("ans",))
def _bias_act(x, b, *, act):
    xp = get_xp(x)
    if b is None and not act.from_output:  # keep x itself as the pre-activation: no copy
        x = xp.ascontiguousarray(x)
        return Residuals(_apply_new(xp, act, x), pre_activation=x)
    z = xp.empty(x.shape, dtype=x.dtype)
    if b is None:
        z[...] = x
    else:
        xp.add(x, b, out=z)
    return _activate(xp, act, z)


@_bias_act.defvjp
def _bias_act_vjp(g, ans, x, b, *, act, pre_activation=None, needs, owns_g):
    dz = _delta(act, ans if act.from_output else pre_activation, g, owns_g)
    db = dz.reshape(-1, dz.shape[-1]).sum(axis=0) if needs[1] else None
    return (dz if needs[0] else None), db


def bias_act(act: str | Activation, x: Any, b: Any = None) -> Any:
    """``act(x + b)`` in one fused pass, with ``b`` broadcast over the last axis of ``x``; differentiable.

    Parameters
    ----------
    act : str or Activation
        A name (``"tanh"``, ``"relu"``, ``"gelu"``, ...; see :mod:`arrayrnn.activations`) or an
        `arrayrnn.activations.Activation`.
    x : array or traced value
        ``(..., n)``.
    b : array, optional
        ``(n,)``; None means ``act(x)``.

    Returns
    -------
    array or traced value
        Shaped like ``x``.

    Raises
    ------
    ValueError
        An unknown activation name, or ``b`` not of shape ``(x.shape[-1],)``.
    TypeError
        ``x`` and ``b`` of different dtypes or devices.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayrnn as ar
    >>> ar.bias_act("relu", np.array([[-1.0, 0.5]]), np.array([0.5, 0.5]))
    array([[0., 1.]])
    """
    activation = get_activation(act)
    xv, bv = value_of(x), value_of(b)
    _check_floating("bias_act", x=xv, b=bv)
    if np.ndim(xv) < 1:
        raise ValueError("bias_act: x is a scalar; expected an array of shape (..., features)")
    _check_bias("bias_act", bv, xv.shape[-1], f"feature of x (x has shape {tuple(xv.shape)})")
    return _bias_act(x, b, act=activation)


@primitive(keep=("W", "x", "ans"))
def _dense_bias_act(W, x, b, *, act):
    xp = get_xp(W, x, b)
    z = x.reshape(-1, x.shape[-1]) @ W.T  # the GEMM's output: the one buffer of the forward
    if b is not None:
        z += b
    result = _activate(xp, act, z)
    shape = x.shape[:-1] + (W.shape[0],)
    if isinstance(result, Residuals):
        return Residuals(result.out.reshape(shape), pre_activation=z)
    return result.reshape(shape)


@_dense_bias_act.defvjp
def _dense_bias_act_vjp(g, ans, W, x, b, *, act, pre_activation=None, needs, owns_g):
    out_features = W.shape[0]
    v = ans.reshape(-1, out_features) if act.from_output else pre_activation
    dz = _delta(act, v, g.reshape(-1, out_features), owns_g)
    x2 = x.reshape(-1, x.shape[-1])
    dW = dz.T @ x2 if needs[0] else None
    dx = (dz @ W).reshape(x.shape) if needs[1] else None
    db = dz.sum(axis=0) if needs[2] else None
    return dW, dx, db


def dense_bias_act(act: str | Activation, W: Any, x: Any, b: Any = None) -> Any:
    """``act(x @ W.T + b)``: a dense layer in one fused call (``F.linear``'s convention); differentiable.

    Parameters
    ----------
    act : str or Activation
        A name (``"identity"``, ``"tanh"``, ``"relu"``, ...) or an `arrayrnn.activations.Activation`.
    W : array or traced value
        ``(out, in)``.
    x : array or traced value
        ``(..., in)``.
    b : array or traced value, optional
        ``(out,)`` or None.

    Returns
    -------
    array or traced value
        ``(..., out)``.

    Raises
    ------
    ValueError
        Shapes that do not fit (named in the message), or an unknown activation name.
    TypeError
        Operands of different dtypes or devices.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayrnn as ar
    >>> W, b = np.ones((2, 3)), np.zeros(2)
    >>> ar.dense_bias_act("identity", W, np.ones((4, 3)), b).shape
    (4, 2)
    """
    activation = get_activation(act)
    Wv, xv, bv = value_of(W), value_of(x), value_of(b)
    _check_floating("dense_bias_act", W=Wv, x=xv, b=bv)
    if np.ndim(Wv) != 2:
        raise ValueError(f"dense_bias_act: W has shape {tuple(np.shape(Wv))}; expected (out_features, "
                         "in_features)")
    if np.ndim(xv) < 1 or xv.shape[-1] != Wv.shape[1]:
        raise ValueError(f"dense_bias_act: x has shape {tuple(np.shape(xv))} and W {tuple(Wv.shape)}; "
                         f"expected "
                         f"x of shape (..., {Wv.shape[1]}) (the last axis of x must equal W.shape[1])")
    _check_bias("dense_bias_act", bv, Wv.shape[0], f"output feature (W has shape {tuple(Wv.shape)})")
    return _dense_bias_act(W, x, b, act=activation)
