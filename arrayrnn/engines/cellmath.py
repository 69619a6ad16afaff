"""The math a custom cell's scalar functions may call (``from arrayrnn import cellmath as cm``).

Each function is written here once in plain Python, for the reference engine, which runs a cell's
functions on whole arrays (NumPy or CuPy), and for floats (the registry's probe, ``ar.check_cell``, the
CUDA simulator). The compiled engines map each one to their own form through numba overloads: the numba
wing to the vectorisable float32 polynomials its built-in loops use (:mod:`.numba.cell_overloads`), the
CUDA kernels to CUDA's math library. A float32 cell stays float32 in every one: the derivative helpers
(``dsigmoid``, ``dtanh``) and the constants inside these functions keep the argument's dtype, where a literal
``1 - x`` in a cell's own code computes in float64 under numba (and rounds back when stored).

Semantics per element (``y`` an activation's output, so derivatives come from outputs as the built-ins')::

    sigmoid(x) = 1 / (1 + exp(-x))      dsigmoid(y) = y * (1 - y)
    tanh(x)                             dtanh(y)    = 1 - y * y
    relu(x)    = max(x, 0)              drelu(y)    = 1 if y > 0 else 0
    exp, log, sqrt; logsigmoid(x) = log(sigmoid(x)) = -log(1 + exp(-x)) without overflow
    maximum(a, b), minimum(a, b) (NaN propagates); where(cond, a, b); step(x) = 1 if x > 0 else 0
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.backend import is_cupy_array
from .pointwise import POINTWISE

__all__ = ["dsigmoid", "drelu", "dtanh", "exp", "log", "logsigmoid", "maximum", "minimum", "relu",
           "sigmoid", "sqrt", "step", "tanh", "where"]


def _xp(*values: Any) -> Any:
    for v in values:
        if is_cupy_array(v):
            import cupy  # an array of it exists, so it imports
            return cupy
    return np


def _unary(table_name: str, x: Any) -> Any:
    """A :data:`.pointwise.POINTWISE` function on an array or a float (the reference engine's own forms,
    so a cell written through this module gives the built-in cells' bits there)."""
    xp = _xp(x)
    a = xp.asarray(x)
    if a.dtype.kind != "f":
        a = a.astype(np.float64)
    out = POINTWISE[table_name](xp, a)
    return out if a.ndim else out[()]


def sigmoid(x: Any) -> Any:
    """``1 / (1 + exp(-x))``, without overflow."""
    return _unary("sigmoid", x)


def tanh(x: Any) -> Any:
    """``tanh(x)``."""
    return _unary("tanh", x)


def relu(x: Any) -> Any:
    """``max(x, 0)``."""
    return _unary("relu", x)


def dsigmoid(y: Any) -> Any:
    """The derivative of sigmoid from its output ``y``: ``y * (1 - y)``."""
    return y * (1 - y)


def dtanh(y: Any) -> Any:
    """The derivative of tanh from its output ``y``: ``1 - y * y``."""
    return 1 - y * y


def step(x: Any) -> Any:
    """``1`` where ``x > 0``, else ``0``, in ``x``'s dtype."""
    return _xp(x).where(x > 0, 1, 0).astype(_dtype(x))[()]


def drelu(y: Any) -> Any:
    """The derivative of relu from its output ``y``: ``1`` where ``y > 0``, else ``0``."""
    return step(y)


def exp(x: Any) -> Any:
    """``exp(x)``."""
    return _xp(x).exp(x)


def log(x: Any) -> Any:
    """``log(x)``."""
    return _xp(x).log(x)


def sqrt(x: Any) -> Any:
    """``sqrt(x)``."""
    return _xp(x).sqrt(x)


def logsigmoid(x: Any) -> Any:
    """``log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|))``: finite for every finite ``x``."""
    xp = _xp(x)
    return xp.minimum(x, 0) - xp.log1p(xp.exp(-xp.abs(x)))


def maximum(a: Any, b: Any) -> Any:
    """The larger of ``a`` and ``b`` elementwise (NaN if either is NaN)."""
    return _xp(a, b).maximum(a, b)


def minimum(a: Any, b: Any) -> Any:
    """The smaller of ``a`` and ``b`` elementwise (NaN if either is NaN)."""
    return _xp(a, b).minimum(a, b)


def where(cond: Any, a: Any, b: Any) -> Any:
    """``a`` where ``cond``, else ``b`` (a cell's only branch: both sides are computed)."""
    out = _xp(cond, a, b).where(cond, a, b)
    return out[()] if getattr(out, "ndim", 1) == 0 else out


def _dtype(x: Any) -> Any:
    dtype = getattr(x, "dtype", np.dtype(np.float64))
    return dtype if dtype.kind == "f" else np.dtype(np.float64)
