"""The ONE table of the elementwise functions the recurrent cells use (tanh, sigmoid, relu).

Each :class:`Pointwise` entry has its forward, its derivative from the output and its derivative from the
input, written once against ``xp``. Its users: the cells (:mod:`arrayrnn.engines.cells`), the autodiff ops
(``ar.ops.tanh/sigmoid/relu``) and the activations of the fused bias op (``tanh``, ``sigmoid``, ``relu`` in
:mod:`arrayrnn.autodiff.activations`); the numba and CUDA kernels are tested against it
(tests/test_pointwise_table.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Forward = Callable[[Any, Any, Any], None]  # (xp, x, out): out[...] = f(x); out may be x


def scalar_like(v: Any, value: float) -> Any:
    """``value`` in ``v``'s dtype, so float32 math stays float32."""
    return v.dtype.type(value)


@dataclass(frozen=True, eq=False)
class Pointwise:
    """An elementwise function with both forms of its derivative, written once against ``xp``.

    ``forward(xp, x, out)``: ``out[...] = f(x)`` (``out`` may be ``x``); ``d_output(y)``: ``f'(x)`` from
    ``y = f(x)``; ``d_input(xp, x)``: ``f'(x)`` from ``x``. Both derivatives return new arrays.
    """

    name: str
    forward: Forward = field(repr=False)
    d_output: Callable[[Any], Any] = field(repr=False)
    d_input: Callable[[Any, Any], Any] = field(repr=False)

    def __call__(self, xp: Any, x: Any) -> Any:
        """``f(x)`` in a new array."""
        out = xp.empty_like(x)
        self.forward(xp, x, out)
        return out


def _tanh_forward(xp, x, out):
    xp.tanh(x, out=out)


def _sigmoid_forward(xp, x, out):
    """``1 / (1 + exp(-x))`` as ``e = exp(-|x|)``: ``1/(1+e)`` for x >= 0, ``e/(1+e)`` else (no overflow)."""
    with np.errstate(under="ignore"):  # exp(-|x|) underflows to 0 far out: sigmoid is exactly 0 or 1 there
        e = xp.exp(-xp.abs(x))
    positive = x >= 0
    xp.divide(xp.where(positive, scalar_like(e, 1.0), e), e + scalar_like(e, 1.0), out=out)


def _relu_forward(xp, x, out):
    xp.maximum(x, scalar_like(x, 0.0), out=out)


def _tanh_d_output(y):
    return 1 - y * y


def _sigmoid_d_output(y):
    return y * (1 - y)


def _relu_d_output(y):
    return (y > 0).astype(y.dtype)


POINTWISE: dict[str, Pointwise] = {
    "tanh": Pointwise("tanh", _tanh_forward, _tanh_d_output, lambda xp, x: _tanh_d_output(xp.tanh(x))),
    "sigmoid": Pointwise("sigmoid", _sigmoid_forward, _sigmoid_d_output,
                         lambda xp, x: _sigmoid_d_output(POINTWISE["sigmoid"](xp, x))),
    "relu": Pointwise("relu", _relu_forward, _relu_d_output, lambda xp, x: (x > 0).astype(x.dtype)),
}
