""":mod:`arrayrnn.cellmath` compiled for the CPU: a numba ``@overload`` of each of its functions, so a custom
cell's ``forward`` / ``backward`` (plain Python calling ``cm.sigmoid``, ``cm.dtanh``, ...) compile with
``numba.njit`` and inline into the time loops (:mod:`.custom_loops`).

Each form is the built-in loops' own, so a cell written through the API gives their bits: float32
``sigmoid`` / ``tanh`` / ``exp`` are :mod:`.loop_parts`' vectorisable polynomials (a few ulp; ``exp`` is 0
below -87.33 and ``inf`` above 88.72, as libm's), float64 ones libm's; ``relu`` and ``step`` are the
built-in RNN's ``x if x > 0 else 0``. Semantics per element (``one``, ``zero``: in the argument's float
type, so float32 stays float32)::

    sigmoid(x), tanh(x), exp(x)     loop_parts' forms       relu(x) = x if x > 0 else 0
    dsigmoid(y) = y * (one - y)     dtanh(y) = one - y * y  drelu(y) = step(y) = one if y > 0 else 0
    log(x), sqrt(x)                 libm (sqrt: LLVM's)     logsigmoid(x) = min(x, 0) - log1p(exp(-|x|))
                                                            (float32: log1p by a series, vectorisable)
    maximum(a, b), minimum(a, b)    NaN if either is NaN    where(cond, a, b) = a if cond else b

Two-argument functions compute in the narrower float type of their arguments: in a float32 cell a float
literal (``cm.maximum(x, 0.0)``) is float64 to numba, and would otherwise promote the result. Importing
this module registers the overloads (:mod:`.custom_loops` does), for the CPU target only: an overload of
numba's default ("generic") target is also tried when numba-cuda types a kernel, where it compiles as a
device function for the current device and so needs a GPU's driver (once this module had loaded, the CuPy
engine's PTX of a custom cell failed without a GPU); the CUDA forms are :mod:`..cupy.cell_math`'s.
"""

from __future__ import annotations

import math

import numpy as np
from numba import types
from numba.extending import overload, register_jitable

from .. import cellmath as cm
from .loop_parts import _exp_f32, sigmoid, tanh


def _real(*numba_types: types.Type) -> type | None:
    """The float type a cellmath function computes in for arguments of ``numba_types``: float32 if any is,
    else float64; ``None`` (no overload: numba reports the call) if any is not a number or a bool."""
    if not all(isinstance(t, (types.Number, types.Boolean)) for t in numba_types):
        return None
    return np.float32 if any(t == types.float32 for t in numba_types) else np.float64


OVERLOADED: set[str] = set()
"""The names of the cellmath functions overloaded here (a test holds it to ``cellmath.__all__``)."""


def _unary(fn, make):
    """Register ``make(real)`` (an implementation for the float type ``real``) as ``fn``'s overload."""
    OVERLOADED.add(fn.__name__)

    @overload(fn, target="cpu")
    def typed(x):
        real = _real(x)
        return None if real is None else make(real)
    return typed


def _binary(fn, make):
    OVERLOADED.add(fn.__name__)

    @overload(fn, target="cpu")
    def typed(a, b):
        real = _real(a, b)
        return None if real is None else make(real)
    return typed


_EXP_F32_MIN_ARG = np.float32(87.33)  # exp(-x) below float32's normals past it: 0 here (subnormals flushed)
_EXP_F32_MAX_ARG = np.float32(88.72)  # exp(x) past float32's largest finite value


@register_jitable
def _exp_f32_full(x):
    """:func:`.loop_parts._exp_f32` (which saturates its argument to [-87, 87], enough for sigmoid and tanh)
    with exp's own range: 0 below ``-87.33``, ``inf`` above ``88.72``."""
    e = _exp_f32(x)
    e = np.float32(0.0) if x < -_EXP_F32_MIN_ARG else e
    return np.float32(np.inf) if x > _EXP_F32_MAX_ARG else e


@register_jitable
def _log1p_exp_neg_abs_f32(x):
    """``log1p(u)``, ``u = exp(-|x|)`` in (0, 1], without libm (a libm call keeps LLVM from vectorising the
    loop around it): ``2 atanh(s)``, ``s = u / (2 + u)`` in (0, 1/3], by its odd series to ``s**15`` (the
    next term is below float32's half ulp); relative error a few ulp, tiny ``u`` included (no
    cancellation)."""
    u = _exp_f32(-abs(x)) if abs(x) < _EXP_F32_MIN_ARG else np.float32(0.0)
    s = u / (np.float32(2.0) + u)
    s2 = s * s
    p = np.float32(1.0 / 15.0)
    p = p * s2 + np.float32(1.0 / 13.0)
    p = p * s2 + np.float32(1.0 / 11.0)
    p = p * s2 + np.float32(1.0 / 9.0)
    p = p * s2 + np.float32(1.0 / 7.0)
    p = p * s2 + np.float32(1.0 / 5.0)
    p = p * s2 + np.float32(1.0 / 3.0)
    return np.float32(2.0) * (s + s * s2 * p)


def _sigmoid(real):
    return lambda x: sigmoid(real(x))


def _tanh(real):
    return lambda x: tanh(real(x))


def _exp(real):
    if real is np.float32:
        return lambda x: _exp_f32_full(np.float32(x))
    return lambda x: math.exp(np.float64(x))


def _log(real):
    return lambda x: math.log(real(x))


def _sqrt(real):
    return lambda x: math.sqrt(real(x))


def _relu(real):
    return lambda x: real(x) if real(x) > real(0.0) else real(0.0)


def _step(real):
    return lambda x: real(1.0) if real(x) > real(0.0) else real(0.0)


def _dsigmoid(real):  # the argument is y (an output), named x as the overloads' typing functions
    return lambda x: real(x) * (real(1.0) - real(x))


def _dtanh(real):
    return lambda x: real(1.0) - real(x) * real(x)


def _logsigmoid(real):
    if real is np.float32:
        return lambda x: min(np.float32(x), np.float32(0.0)) - _log1p_exp_neg_abs_f32(np.float32(x))
    return lambda x: min(np.float64(x), 0.0) - math.log1p(math.exp(-abs(np.float64(x))))


def _maximum(real):
    def impl(a, b):
        a, b = real(a), real(b)
        return a if (a >= b or a != a) else b
    return impl


def _minimum(real):
    def impl(a, b):
        a, b = real(a), real(b)
        return a if (a <= b or a != a) else b
    return impl


for _fn, _make in ((cm.sigmoid, _sigmoid), (cm.tanh, _tanh), (cm.exp, _exp), (cm.log, _log),
                   (cm.sqrt, _sqrt), (cm.relu, _relu), (cm.step, _step), (cm.drelu, _step),
                   (cm.dsigmoid, _dsigmoid), (cm.dtanh, _dtanh), (cm.logsigmoid, _logsigmoid)):
    _unary(_fn, _make)
for _fn, _make in ((cm.maximum, _maximum), (cm.minimum, _minimum)):
    _binary(_fn, _make)


OVERLOADED.add(cm.where.__name__)


@overload(cm.where, target="cpu")
def _where(cond, a, b):
    real = _real(a, b)
    if real is None or not isinstance(cond, (types.Boolean, types.Number)):
        return None
    return lambda cond, a, b: real(a) if cond else real(b)
