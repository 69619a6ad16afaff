"""Activation functions for the fused bias + activation op, each declaring where its derivative comes from.

An :class:`Activation` computes ``act(x)`` into a buffer (in place when allowed) and scales an incoming
gradient by ``act'`` in place. ``from_output`` says whether ``act'`` can be computed from the output
``y = act(x)`` alone (``tanh' = 1 - y**2``): such an activation lets the fused op overwrite its GEMM
output and keep nothing else for the backward. Otherwise the backward needs the input ``x``.

Both passes run block by block over the flat buffer, so every temporary is one block (a few hundred KiB)
however large the array is: roughly ``for block in blocks(x): out[block] = act(x[block])``.

Built in (``get(name, **params)``): identity, relu, leaky_relu(negative_slope=0.01), relu6,
hardtanh(min_val=-1, max_val=1), elu(alpha=1), tanh, sigmoid (derivative from the output); gelu (the tanh
form, PyTorch's ``gelu(approximate="tanh")``), silu, softplus(beta=1, threshold=20) (need the input).
``register(name, factory)`` adds one.

``tanh``, ``sigmoid`` and ``relu`` take their math from the cells' pointwise table
(:data:`arrayrnn.engines.pointwise.POINTWISE`), so the fused op and the recurrent cells share one formula.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.backend import get_xp
from ..engines.pointwise import POINTWISE, Forward, scalar_like

BLOCK_ELEMENTS = 1 << 15  # 128 KiB of float32: a block and its temporaries stay in L2
"""Elements per block of the blocked NumPy activation passes (128 KiB of float32 stays in L2)."""

ScaleGrad = Callable[[Any, Any, Any], None]  # (xp, v, g): g *= act'(v); v is y if from_output else x


@dataclass(frozen=True, eq=False)
class Activation:
    """``name``, ``from_output`` and the two block kernels; ``params`` is only for display."""

    name: str
    from_output: bool
    forward_block: Forward = field(repr=False)
    scale_grad_block: ScaleGrad = field(repr=False)
    params: tuple[tuple[str, float], ...] = ()

    def forward(self, x: Any, out: Any) -> None:
        """``out[...] = act(x)``; both C-contiguous with one shape; ``out`` may be ``x`` (in place)."""
        xp = get_xp(x, out)
        flat_x, flat_out = _flat("x", x), _flat("out", out)
        for block in _blocks(x.size):
            self.forward_block(xp, flat_x[block], flat_out[block])

    def scale_grad(self, v: Any, g: Any) -> None:
        """``g *= act'(...)`` in place, from ``v`` = the output (``from_output``) or else the input."""
        xp = get_xp(v, g)
        flat_v, flat_g = _flat("v", v), _flat("g", g)
        for block in _blocks(v.size):
            self.scale_grad_block(xp, flat_v[block], flat_g[block])

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.params)
        return f"Activation({self.name}{'(' + args + ')' if args else ''}, from_output={self.from_output})"


def _flat(name: str, a: Any) -> Any:
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} has strides {a.strides}; expected a C-contiguous array "
                         "(pass xp.ascontiguousarray(...))")
    return a.reshape(-1)


def _blocks(n: int):
    for start in range(0, n, BLOCK_ELEMENTS):
        yield slice(start, min(start + BLOCK_ELEMENTS, n))



def _from_table(name: str) -> Activation:
    entry = POINTWISE[name]

    def scale_grad(xp, v, g):
        xp.multiply(g, entry.d_output(v), out=g)

    return Activation(name, True, entry.forward, scale_grad)


# -- the kernels --------------------------------------------------------------------------------------

def identity() -> Activation:
    """``y = x`` (no-op activation)."""
    def forward(xp, x, out):
        if out is not x:
            out[...] = x

    return Activation("identity", True, forward, lambda xp, v, g: None)


def relu() -> Activation:
    """``y = max(x, 0)``."""
    return _from_table("relu")


def leaky_relu(negative_slope: float = 0.01) -> Activation:
    """``y = x`` where ``x > 0``, else ``negative_slope * x`` (PyTorch's ``leaky_relu``)."""
    slope = float(negative_slope)

    def forward(xp, x, out):
        out[...] = xp.where(x > 0, x, x * scalar_like(x, slope))

    def scale_grad(xp, v, g):  # sign(y) = sign(x) when the slope is not negative
        xp.multiply(g, xp.where(v > 0, scalar_like(g, 1.0), scalar_like(g, slope)), out=g)

    return Activation("leaky_relu", slope >= 0, forward, scale_grad, (("negative_slope", slope),))


def hardtanh(min_val: float = -1.0, max_val: float = 1.0, name: str = "hardtanh") -> Activation:
    """``y = clip(x, min_val, max_val)``, zero gradient at and beyond the bounds (PyTorch's ``hardtanh``);
    a ``ValueError`` unless ``min_val < max_val``.
    """
    lo, hi = float(min_val), float(max_val)
    if not lo < hi:
        raise ValueError(f"{name}: min_val = {lo}, max_val = {hi}; expected min_val < max_val")

    def scale_grad(xp, v, g):  # PyTorch: zero gradient at and beyond the bounds
        xp.multiply(g, (v > lo) & (v < hi), out=g)

    return Activation(name, True, lambda xp, x, out: xp.clip(x, lo, hi, out=out), scale_grad,
                      (("min_val", lo), ("max_val", hi)))


def relu6() -> Activation:
    """``y = clip(x, 0, 6)`` (`hardtanh` with bounds 0 and 6)."""
    return hardtanh(0.0, 6.0, name="relu6")


def elu(alpha: float = 1.0) -> Activation:
    """``y = x`` where ``x > 0``, else ``alpha * (exp(x) - 1)``; a ``ValueError`` unless ``alpha > 0``."""
    a = float(alpha)
    if not a > 0:
        raise ValueError(f"elu: alpha = {alpha}; expected alpha > 0")

    def forward(xp, x, out):
        with np.errstate(over="ignore"):  # expm1 of large x overflows where x > 0 picks x anyway
            out[...] = xp.where(x > 0, x, xp.expm1(x) * scalar_like(x, a))

    def scale_grad(xp, v, g):  # y > 0: 1;  y <= 0: y + alpha  (= alpha * exp(x))
        xp.multiply(g, xp.where(v > 0, scalar_like(v, 1.0), v + scalar_like(v, a)), out=g)

    return Activation("elu", True, forward, scale_grad, (("alpha", a),))


def tanh() -> Activation:
    """``y = tanh(x)``."""
    return _from_table("tanh")


_sigmoid_into = POINTWISE["sigmoid"].forward


def sigmoid() -> Activation:
    """``y = 1 / (1 + exp(-x))``."""
    return _from_table("sigmoid")


_GELU_K = math.sqrt(2.0 / math.pi)
_GELU_C = 0.044715


def gelu() -> Activation:
    """``0.5 x (1 + tanh(k (x + c x^3)))``: PyTorch's ``gelu(approximate="tanh")``."""

    def inner_tanh(xp, x):
        t = x * x
        t *= scalar_like(x, _GELU_C)
        t += 1
        t *= x
        t *= scalar_like(x, _GELU_K)
        return xp.tanh(t, out=t)

    def forward(xp, x, out):
        t = inner_tanh(xp, x)
        t += 1
        t *= x
        xp.multiply(t, scalar_like(x, 0.5), out=out)

    def scale_grad(xp, x, g):  # 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2)
        t = inner_tanh(xp, x)
        d = x * x
        d *= scalar_like(x, 3 * _GELU_C)
        d += 1
        d *= x
        d *= scalar_like(x, 0.5 * _GELU_K)
        d *= 1 - t * t
        t += 1
        t *= scalar_like(x, 0.5)
        d += t
        xp.multiply(g, d, out=g)

    return Activation("gelu", False, forward, scale_grad, (("approximate", "tanh"),))


def silu() -> Activation:
    """``y = x * sigmoid(x)`` (SiLU / swish)."""
    def forward(xp, x, out):
        _sigmoid_into(xp, x, out)
        out *= x

    def scale_grad(xp, x, g):  # s (1 + x (1 - s))
        s = xp.empty_like(x)
        _sigmoid_into(xp, x, s)
        d = 1 - s
        d *= x
        d += 1
        d *= s
        xp.multiply(g, d, out=g)

    return Activation("silu", False, forward, scale_grad)


def softplus(beta: float = 1.0, threshold: float = 20.0) -> Activation:
    """``log(1 + exp(beta x)) / beta``, and ``x`` where ``beta x > threshold`` (PyTorch's softplus)."""
    b, limit = float(beta), float(threshold)
    if not b > 0:
        raise ValueError(f"softplus: beta = {beta}; expected beta > 0")

    def forward(xp, x, out):
        bx = x * scalar_like(x, b)
        soft = xp.log1p(xp.exp(-xp.abs(bx)))
        soft += xp.maximum(bx, 0)
        soft /= scalar_like(x, b)
        out[...] = xp.where(bx > limit, x, soft)

    def scale_grad(xp, x, g):  # sigmoid(beta x), 1 past the threshold
        bx = x * scalar_like(x, b)
        s = xp.empty_like(x)
        _sigmoid_into(xp, bx, s)
        xp.multiply(g, xp.where(bx > limit, scalar_like(x, 1.0), s), out=g)

    return Activation("softplus", False, forward, scale_grad, (("beta", b), ("threshold", limit)))


# -- the registry -------------------------------------------------------------------------------------

_REGISTRY: dict[str, Callable[..., Activation]] = {}


def register(name: str, factory: Callable[..., Activation]) -> None:
    """Make ``get(name, **params)`` return ``factory(**params)``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name = {name!r}; expected a non-empty string")
    _REGISTRY[name] = factory


def names() -> tuple[str, ...]:
    """The names `get` accepts, in registration order."""
    return tuple(_REGISTRY)


def get(activation: str | Activation, **params: Any) -> Activation:
    """The activation named ``activation`` (built with ``params``), or ``activation`` itself."""
    if isinstance(activation, Activation):
        if params:
            raise TypeError(f"get: params {sorted(params)} given with an Activation object; pass a name "
                            f"instead")
        return activation
    if not isinstance(activation, str):
        raise TypeError(f"activation has type {type(activation).__name__}; expected a name such as "
                        f"'tanh' or an "
                        "arrayrnn.activations.Activation")
    if activation not in _REGISTRY:
        raise ValueError(f"activation = {activation!r}; expected one of {names()} (or register it with "
                         "arrayrnn.activations.register)")
    try:
        return _REGISTRY[activation](**params)
    except TypeError as e:
        raise TypeError(f"activation {activation!r}: {e}") from None


for _factory in (identity, relu, leaky_relu, relu6, hardtanh, elu, tanh, sigmoid, gelu, silu, softplus):
    register(_factory.__name__, _factory)
