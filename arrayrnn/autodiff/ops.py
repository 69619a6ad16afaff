"""Differentiable operations (``ar.ops``): each a primitive with its VJP rule right below it.

They take raw arrays (NumPy, CuPy), Python numbers, or traced values; called without traced arguments
they are plain array functions. Floating operands must share one dtype and device (a ``TypeError``
otherwise, never a silent cast); shapes that do not fit are a ``ValueError`` naming them.
"""

from __future__ import annotations

import numbers
import operator
from typing import Any

import numpy as np

from ..core.backend import get_xp, to_host
from ..core.params import PackedParams
from ..engines.pointwise import POINTWISE
from ..frontend.rnn import rnn_backward, rnn_forward
from .api import TracedParams
from .tape import Residuals, Traced, is_traced, primitive, unbroadcast, value_of

__all__ = [
    "add", "subtract", "mul", "divide", "power", "negative", "matmul", "sum", "mean", "reshape", "transpose",
    "concatenate", "stack", "unstack", "split", "take", "getitem", "tanh", "sigmoid", "relu", "exp", "log",
    "softmax_cross_entropy", "mse", "rnn",
]

_NUMBER = (bool, int, float)


# -- checks -------------------------------------------------------------------------------------------

def _operands(op: str, **named: Any) -> Any:
    """The array module of ``named`` operands; a TypeError for non-arrays, integer arrays, or a mix of
    floating dtypes or devices."""
    arrays = {}
    for name, v in named.items():
        if v is None or isinstance(v, _NUMBER):
            continue
        if not hasattr(v, "dtype") or not hasattr(v, "shape"):
            raise TypeError(f"{op}: {name} has type {type(v).__name__}; expected an array or a number")
        if np.dtype(v.dtype).kind not in "fb":
            raise TypeError(f"{op}: {name} has dtype {v.dtype}; expected a floating array "
                            f"(convert explicitly, e.g. {name}.astype('float32'))")
        arrays[name] = v
    return get_xp(*arrays.values(), names=tuple(f"{op}: {n}" for n in arrays))


def _broadcast_shape(op: str, x: Any, y: Any) -> tuple[int, ...]:
    try:
        return np.broadcast_shapes(np.shape(x), np.shape(y))
    except ValueError:
        raise ValueError(f"{op}: shapes {np.shape(x)} and {np.shape(y)} do not broadcast together; reshape "
                         "one of them (NumPy broadcasting rules)") from None


def _binary(op: str, x: Any, y: Any) -> Any:
    xp = _operands(op, x=x, y=y)
    _broadcast_shape(op, x, y)
    return xp


def _normalize_axes(op: str, axis: Any, ndim: int) -> tuple[int, ...] | None:
    if axis is None:
        return None
    axes = (int(axis),) if isinstance(axis, numbers.Integral) else tuple(axis)
    for a in axes:
        if not -ndim <= a < max(ndim, 1):
            raise ValueError(f"{op}: axis = {axis!r} is out of range for an array of {ndim} dimension(s)")
    return tuple(sorted(a % max(ndim, 1) for a in axes))


def _first(gs: tuple) -> Any:
    return next(g for g in gs if g is not None)


# -- elementwise arithmetic ---------------------------------------------------------------------------

@primitive(keep=())
def add(x, y):
    """``x + y`` with NumPy broadcasting; differentiable."""
    xp = _binary("add", x, y)
    return xp.asarray(x + y)


@add.defvjp
def _add_vjp(g, ans, x, y, *, needs):
    return (unbroadcast(g, x.shape) if needs[0] else None, unbroadcast(g, y.shape) if needs[1] else None)


@primitive(keep=())
def subtract(x, y):
    """``x - y`` with NumPy broadcasting; differentiable."""
    xp = _binary("subtract", x, y)
    return xp.asarray(x - y)


@subtract.defvjp
def _subtract_vjp(g, ans, x, y, *, needs):
    return (unbroadcast(g, x.shape) if needs[0] else None, -unbroadcast(g, y.shape) if needs[1] else None)


@primitive(keep=("x", "y"))
def mul(x, y):
    """``x * y`` (elementwise) with NumPy broadcasting; differentiable."""
    xp = _binary("mul", x, y)
    return xp.asarray(x * y)


@mul.defvjp
def _mul_vjp(g, ans, x, y, *, needs):
    return (unbroadcast(g * y, np.shape(x)) if needs[0] else None,
            unbroadcast(g * x, np.shape(y)) if needs[1] else None)


@primitive(keep=("y", "ans"))
def divide(x, y):
    """``x / y`` (true division) with NumPy broadcasting; differentiable."""
    xp = _binary("divide", x, y)
    return xp.asarray(x / y)


@divide.defvjp
def _divide_vjp(g, ans, x, y, *, needs):
    gy = g / y
    return (unbroadcast(gy, x.shape) if needs[0] else None,
            unbroadcast(-gy * ans, np.shape(y)) if needs[1] else None)


@primitive(keep=("x", "p", "ans"))
def power(x, p):
    """``x ** p`` with NumPy broadcasting; differentiable in ``x`` and ``p`` (``p``'s gradient uses ``log(x)``
    where ``x > 0``).
    """
    xp = _binary("power", x, p)
    return xp.asarray(x ** p)


@power.defvjp
def _power_vjp(g, ans, x, p, *, needs):
    gx = gp = None
    if needs[0]:
        gx = unbroadcast(g * (2 * x if isinstance(p, _NUMBER) and p == 2 else p * x ** (p - 1)), np.shape(x))
    if needs[1]:
        xp = get_xp(g)
        gp = unbroadcast(g * ans * xp.log(xp.where(x > 0, x, 1)), np.shape(p))
    return gx, gp


@primitive(keep=())
def negative(x):
    """``-x``; differentiable."""
    _operands("negative", x=x)
    return -x


@negative.defvjp
def _negative_vjp(g, ans, x):
    return (-g,)


# -- matmul -------------------------------------------------------------------------------------------

@primitive(keep=("a", "b"))
def matmul(a, b):
    """NumPy's ``a @ b`` (1-D operands and batch broadcasting included)."""
    xp = _operands("matmul", a=a, b=b)
    for name, v in (("a", a), ("b", b)):
        if np.ndim(v) == 0:
            raise ValueError(f"matmul: {name} is a scalar; matmul needs arrays of at least 1 dimension "
                             "(use mul for scalars)")
    k_a = a.shape[-1]
    k_b = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if k_a != k_b:
        raise ValueError(f"matmul: a has shape {a.shape} and b has shape {b.shape}; the last axis of a "
                         f"({k_a}) "
                         f"must equal the {'only' if b.ndim == 1 else 'second-to-last'} axis of b ({k_b})")
    return xp.asarray(xp.matmul(a, b))


@matmul.defvjp
def _matmul_vjp(g, ans, a, b, *, needs):
    xp = get_xp(g)
    swap = lambda m: xp.swapaxes(m, -1, -2)  # noqa: E731
    da = db = None
    if a.ndim == 1 and b.ndim == 1:
        da, db = (g * b if needs[0] else None), (g * a if needs[1] else None)
    elif a.ndim == 1:  # (k,) @ (..., k, n) -> (..., n)
        da = unbroadcast(xp.matmul(b, g[..., None])[..., 0], a.shape) if needs[0] else None
        db = unbroadcast(a[:, None] * g[..., None, :], b.shape) if needs[1] else None
    elif b.ndim == 1:  # (..., m, k) @ (k,) -> (..., m)
        da = unbroadcast(g[..., :, None] * b, a.shape) if needs[0] else None
        db = unbroadcast(xp.matmul(swap(a), g[..., None])[..., 0], b.shape) if needs[1] else None
    else:
        da = unbroadcast(xp.matmul(g, swap(b)), a.shape) if needs[0] else None
        if needs[1] and b.ndim == 2:  # one GEMM over all batch rows instead of a batch of them
            db = a.reshape(-1, a.shape[-1]).T @ g.reshape(-1, g.shape[-1])
        elif needs[1]:
            db = unbroadcast(xp.matmul(swap(a), g), b.shape)
    return da, db


# -- reductions ---------------------------------------------------------------------------------------

def _reduced_to_input(g: Any, shape: tuple, axes: tuple | None, keepdims: bool) -> Any:
    """Broadcast the cotangent of a reduction back to the input's shape (a read-only view)."""
    xp = get_xp(g)
    if not keepdims:
        kept = tuple(1 if axes is None or i in axes else n for i, n in enumerate(shape))
        g = g.reshape(kept)
    return xp.broadcast_to(g, shape)


@primitive(keep=())
def _sum(x, *, axis=None, keepdims=False):
    xp = _operands("sum", x=x)
    x = xp.asarray(x)
    return xp.asarray(xp.sum(x, axis=_normalize_axes("sum", axis, x.ndim), keepdims=keepdims))


@_sum.defvjp
def _sum_vjp(g, ans, x, *, axis=None, keepdims=False):
    return (_reduced_to_input(g, x.shape, _normalize_axes("sum", axis, x.ndim), keepdims),)


@primitive(keep=())
def _mean(x, *, axis=None, keepdims=False):
    xp = _operands("mean", x=x)
    x = xp.asarray(x)
    return xp.asarray(xp.mean(x, axis=_normalize_axes("mean", axis, x.ndim), keepdims=keepdims))


@_mean.defvjp
def _mean_vjp(g, ans, x, *, axis=None, keepdims=False):
    axes = _normalize_axes("mean", axis, x.ndim)
    count = x.size if axes is None else int(np.prod([x.shape[a] for a in axes]))
    return (_reduced_to_input(g / count, x.shape, axes, keepdims),)


def sum(x: Any, axis: int | tuple[int, ...] | None = None, keepdims: bool = False) -> Any:  # noqa: A001
    """``x.sum(axis, keepdims)``."""
    return _sum(x, axis=axis, keepdims=keepdims)


def mean(x: Any, axis: int | tuple[int, ...] | None = None, keepdims: bool = False) -> Any:
    """``x.mean(axis, keepdims)``."""
    return _mean(x, axis=axis, keepdims=keepdims)


# -- shapes -------------------------------------------------------------------------------------------

@primitive(keep=())
def _reshape(x, *, shape):
    _operands("reshape", x=x)
    try:
        return x.reshape(shape)
    except ValueError:
        raise ValueError(f"reshape: cannot reshape an array of shape {x.shape} ({x.size} elements) into "
                         f"{shape}; the number of elements must stay the same") from None


@_reshape.defvjp
def _reshape_vjp(g, ans, x, *, shape):
    return (g.reshape(x.shape),)


def reshape(x: Any, *shape: Any) -> Any:
    """``x.reshape(shape)``; ``reshape(x, (2, 3))`` and ``reshape(x, 2, 3)`` both work."""
    shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    return _reshape(x, shape=tuple(int(n) for n in shape))


@primitive(keep=())
def _transpose(x, *, axes=None):
    xp = _operands("transpose", x=x)
    if axes is not None and sorted(a % max(x.ndim, 1) for a in axes) != list(range(x.ndim)):
        raise ValueError(f"transpose: axes = {axes}; expected a permutation of 0..{x.ndim - 1}")
    return xp.transpose(x, axes)


@_transpose.defvjp
def _transpose_vjp(g, ans, x, *, axes=None):
    xp = get_xp(g)
    inverse = None if axes is None else tuple(np.argsort([a % x.ndim for a in axes]))
    return (xp.transpose(g, inverse),)


def transpose(x: Any, axes: tuple[int, ...] | None = None) -> Any:
    """``x.transpose(axes)``: reverses the axes when ``axes`` is None."""
    return _transpose(x, axes=None if axes is None else tuple(axes))


def _check_sequence(op: str, arrays: Any) -> None:
    if not isinstance(arrays, (list, tuple)) or not arrays:
        raise TypeError(f"{op}: arrays has type {type(arrays).__name__}; expected a non-empty list or tuple "
                        "of arrays")


@primitive(keep=())
def _concatenate(*arrays, axis=0):
    xp = _operands("concatenate", **{f"arrays[{i}]": a for i, a in enumerate(arrays)})
    try:
        return xp.concatenate(arrays, axis=axis)
    except (ValueError, np.exceptions.AxisError) as e:
        raise ValueError(f"concatenate: shapes {[a.shape for a in arrays]} along axis {axis}: {e}") from None


@_concatenate.defvjp
def _concatenate_vjp(g, ans, *arrays, axis=0):
    xp = get_xp(g)
    stops = np.cumsum([a.shape[axis] for a in arrays])[:-1]
    return tuple(xp.split(g, stops, axis=axis))


def concatenate(arrays: Any, axis: int = 0) -> Any:
    """Join a sequence of arrays along an existing ``axis`` (``numpy.concatenate``); differentiable."""
    _check_sequence("concatenate", arrays)
    return _concatenate(*arrays, axis=axis)


@primitive(keep=())
def _stack(*arrays, axis=0):
    xp = _operands("stack", **{f"arrays[{i}]": a for i, a in enumerate(arrays)})
    shapes = {np.shape(a) for a in arrays}
    if len(shapes) != 1:
        raise ValueError(f"stack: arrays have shapes {[np.shape(a) for a in arrays]}; all must be equal")
    return xp.stack(arrays, axis=axis)


@_stack.defvjp
def _stack_vjp(g, ans, *arrays, axis=0):
    index = (slice(None),) * (axis % g.ndim)
    return tuple(g[index + (i,)] for i in range(len(arrays)))


def stack(arrays: Any, axis: int = 0) -> Any:
    """Join a sequence of same-shape arrays along a new ``axis`` (``numpy.stack``); differentiable."""
    _check_sequence("stack", arrays)
    return _stack(*arrays, axis=axis)


@primitive(keep=())
def _unstack(x, *, axis=0):
    _operands("unstack", x=x)
    index = (slice(None),) * (axis % x.ndim)
    return tuple(x[index + (i,)] for i in range(x.shape[axis]))


@_unstack.defvjp
def _unstack_vjp(gs, ans, x, *, axis=0):
    xp = get_xp(_first(gs))
    out = xp.zeros(x.shape, dtype=x.dtype)
    index = (slice(None),) * (axis % x.ndim)
    for i, g in enumerate(gs):
        if g is not None:
            out[index + (i,)] = g
    return (out,)


def unstack(x: Any, axis: int = 0) -> tuple:
    """The slices of ``x`` along ``axis`` as a tuple (the inverse of :func:`stack`); one node for all."""
    if np.ndim(value_of(x)) == 0:
        raise ValueError("unstack: x is a scalar; expected an array of at least 1 dimension")
    return _unstack(x, axis=axis)


def _split_bounds(n: int, sections: Any) -> list[tuple[int, int]]:
    if isinstance(sections, int):
        if sections <= 0 or n % sections:
            raise ValueError(f"split: {sections} sections do not divide an axis of length {n} equally")
        cuts = [n // sections * i for i in range(1, sections)]
    else:
        cuts = [min(max(int(c), 0), n) for c in sections]
    edges = [0, *cuts, n]
    return [(edges[i], max(edges[i], edges[i + 1])) for i in range(len(edges) - 1)]


@primitive(keep=())
def _split(x, *, sections, axis=0):
    _operands("split", x=x)
    index = (slice(None),) * (axis % x.ndim)
    return tuple(x[index + (slice(lo, hi),)] for lo, hi in _split_bounds(x.shape[axis], sections))


@_split.defvjp
def _split_vjp(gs, ans, x, *, sections, axis=0):
    xp = get_xp(_first(gs))
    out = xp.empty(x.shape, dtype=x.dtype)
    index = (slice(None),) * (axis % x.ndim)
    for g, (lo, hi) in zip(gs, _split_bounds(x.shape[axis], sections), strict=True):
        out[index + (slice(lo, hi),)] = 0 if g is None else g
    return (out,)


def split(x: Any, indices_or_sections: int | list[int], axis: int = 0) -> tuple:
    """``numpy.split``: one node whose rule writes all pieces' gradients into one buffer."""
    sections = indices_or_sections if isinstance(indices_or_sections, int) else tuple(indices_or_sections)
    return _split(x, sections=sections, axis=axis)


# -- gathering ----------------------------------------------------------------------------------------

def _check_indices(op: str, indices: Any, size: int, axis_text: str) -> Any:
    indices = value_of(indices)
    if isinstance(indices, (list, tuple, int)):
        indices = np.asarray(indices)
    if not hasattr(indices, "dtype") or np.dtype(indices.dtype).kind not in "iu":
        raise TypeError(f"{op}: indices have dtype {getattr(indices, 'dtype', type(indices).__name__)}; "
                        "expected an integer array")
    if indices.size and (int(indices.min()) < -size or int(indices.max()) >= size):
        bad = int(indices.min()) if int(indices.min()) < -size else int(indices.max())
        raise ValueError(f"{op}: index {bad} is out of range for {axis_text} of size {size}; "
                         f"every index must be in {-size}..{size - 1}")
    return indices


@primitive(keep=("indices",))
def _take(x, indices, *, axis=None):
    xp = _operands("take", x=x)
    return xp.take(x, indices, axis=axis)


@_take.defvjp
def _take_vjp(g, ans, x, indices, *, axis=None, needs):
    xp = get_xp(g)
    out = xp.zeros(x.shape if axis is not None else (x.size,), dtype=x.dtype)
    axis = 0 if axis is None else axis % x.ndim
    flat = indices.reshape(-1)
    g = g.reshape(g.shape[:axis] + (flat.size,) + g.shape[axis + indices.ndim:])
    xp.add.at(xp.moveaxis(out, axis, 0), flat, xp.moveaxis(g, axis, 0))
    return out.reshape(x.shape), None


def take(x: Any, indices: Any, axis: int | None = None) -> Any:
    """``numpy.take`` (``axis=None`` indexes the flattened array); repeated indices accumulate gradients."""
    value = value_of(x)
    size = value.size if axis is None else value.shape[_normalize_axes("take", axis, value.ndim)[0]]
    where = "the flattened array" if axis is None else f"axis {axis}"
    return _take(x, _check_indices("take", indices, size, where), axis=axis)


def _is_basic_index(index: Any) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return all(isinstance(p, (int, slice, type(None), type(Ellipsis))) for p in parts)


@primitive(keep=())
def _getitem(x, *, index):
    return x[index]


@_getitem.defvjp
def _getitem_vjp(g, ans, x, *, index):
    xp = get_xp(g)
    out = xp.zeros(x.shape, dtype=x.dtype)
    if _is_basic_index(index):
        out[index] = g
    else:
        xp.add.at(out, index, g)
    return (out,)


def getitem(x: Any, index: Any) -> Any:
    """``x[index]``: basic and advanced NumPy indexing; repeated advanced indices accumulate gradients."""
    parts = index if isinstance(index, tuple) else (index,)
    parts = tuple(value_of(p) for p in parts)
    return _getitem(x, index=parts if isinstance(index, tuple) else parts[0])


# -- elementwise functions ----------------------------------------------------------------------------

@primitive(keep=("ans",))
def tanh(x):
    """Elementwise ``tanh(x)``; differentiable."""
    return POINTWISE["tanh"](_operands("tanh", x=x), x)


@tanh.defvjp
def _tanh_vjp(g, ans, x):
    return (g * POINTWISE["tanh"].d_output(ans),)


@primitive(keep=("ans",))
def sigmoid(x):
    """Elementwise logistic sigmoid ``1 / (1 + exp(-x))``; differentiable."""
    return POINTWISE["sigmoid"](_operands("sigmoid", x=x), x)


@sigmoid.defvjp
def _sigmoid_vjp(g, ans, x):
    return (g * POINTWISE["sigmoid"].d_output(ans),)


@primitive(keep=("ans",))
def relu(x):
    """Elementwise ``max(x, 0)``; differentiable (gradient 0 at 0)."""
    return POINTWISE["relu"](_operands("relu", x=x), x)


@relu.defvjp
def _relu_vjp(g, ans, x):
    return (g * POINTWISE["relu"].d_output(ans),)


@primitive(keep=("ans",))
def exp(x):
    """Elementwise ``exp(x)``; differentiable."""
    return _operands("exp", x=x).exp(x)


@exp.defvjp
def _exp_vjp(g, ans, x):
    return (g * ans,)


@primitive(keep=("x",))
def log(x):
    """Elementwise natural logarithm; differentiable."""
    return _operands("log", x=x).log(x)


@log.defvjp
def _log_vjp(g, ans, x):
    return (g / x,)


# -- losses -------------------------------------------------------------------------------------------

def _log_softmax_rows(xp: Any, z: Any) -> Any:
    """A new ``(N, C)`` buffer holding ``log_softmax(z)`` row-wise."""
    out = z - z.max(axis=1, keepdims=True)
    out -= xp.log(xp.exp(out).sum(axis=1, keepdims=True))
    return out


@primitive(keep=("logits", "targets"))
def _softmax_cross_entropy(logits, targets, *, ignore_index):
    xp = get_xp(logits)
    rows = targets.reshape(-1)
    valid = rows != ignore_index
    count = int(valid.sum())
    if count == 0:
        return xp.asarray(np.nan, dtype=logits.dtype)  # like PyTorch: a mean over no targets
    z = logits.reshape(-1, logits.shape[-1])
    # log-sum-exp minus the target logit, summed over valid rows without forming log_softmax
    top = z.max(axis=1)
    lse = xp.log(xp.exp(z - top[:, None]).sum(axis=1)) + top
    picked = xp.take_along_axis(z, xp.where(valid, rows, 0)[:, None], axis=1)[:, 0]
    return xp.asarray(((lse - picked) * valid).sum() / count, dtype=logits.dtype)


@_softmax_cross_entropy.defvjp
def _softmax_cross_entropy_vjp(g, ans, logits, targets, *, ignore_index, needs):
    xp = get_xp(logits)
    rows = targets.reshape(-1)
    valid = rows != ignore_index
    count = int(valid.sum())
    if count == 0:
        return xp.zeros_like(logits), None
    grad = _log_softmax_rows(xp, logits.reshape(-1, logits.shape[-1]))
    xp.exp(grad, out=grad)                                   # softmax
    at = xp.nonzero(valid)[0]
    grad[at, rows[at]] -= 1
    grad *= (valid * (g / count)).astype(grad.dtype)[:, None]
    return grad.reshape(logits.shape), None


def softmax_cross_entropy(logits: Any, targets: Any, ignore_index: int = -1) -> Any:
    """Mean over non-ignored targets of ``-log softmax(logits)[target]`` (PyTorch's ``cross_entropy``).

    If every target is ignored the loss is NaN, like PyTorch.

    Parameters
    ----------
    logits : array or traced value
        ``(..., C)``, floating.
    targets : array of int
        Shape ``logits.shape[:-1]``, each in ``0..C-1`` or equal to ``ignore_index``.
    ignore_index : int, optional
        Targets equal to it are left out of the mean (padding).

    Returns
    -------
    scalar array or traced value
        The mean loss.

    Raises
    ------
    ValueError
        Shapes that do not match, or a target out of range.
    TypeError
        Non-floating logits or non-integer targets.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayrnn as ar
    >>> logits = np.zeros((2, 3, 4))
    >>> targets = np.array([[0, 1, -1], [2, 3, -1]])
    >>> round(float(ar.ops.softmax_cross_entropy(logits, targets)), 4)  # log(4)
    1.3863
    """
    lv, tv = value_of(logits), value_of(targets)
    _operands("softmax_cross_entropy", logits=lv)
    if np.ndim(lv) < 1:
        raise ValueError("softmax_cross_entropy: logits is a scalar; expected shape (..., num_classes)")
    if not hasattr(tv, "dtype") or np.dtype(tv.dtype).kind not in "iu":
        raise TypeError(f"softmax_cross_entropy: targets have dtype "
                        f"{getattr(tv, 'dtype', type(tv).__name__)}; "
                        "expected an integer array of class indices")
    if tuple(tv.shape) != tuple(lv.shape[:-1]):
        raise ValueError(f"softmax_cross_entropy: targets have shape {tuple(tv.shape)}; expected "
                         f"logits.shape[:-1]"
                         f" = {tuple(lv.shape[:-1])}")
    get_xp(lv, tv, names=("logits", "targets"))
    classes = lv.shape[-1]
    bad = (tv != ignore_index) & ((tv < 0) | (tv >= classes))
    if bool(bad.any()):
        position = tuple(int(i) for i in np.argwhere(to_host(bad))[0])
        raise ValueError(f"softmax_cross_entropy: targets{list(position)} = {int(tv[position])}; every "
                         f"target "
                         f"must be in 0..{classes - 1} or equal ignore_index = {ignore_index}")
    return _softmax_cross_entropy(logits, tv, ignore_index=int(ignore_index))


@primitive(keep=("pred", "target"))
def _mse(pred, target):
    xp = _operands("mse", pred=pred, target=target)
    if np.shape(pred) != np.shape(target):
        raise ValueError(f"mse: pred has shape {np.shape(pred)} and target {np.shape(target)}; expected "
                         f"equal "
                         "shapes (no broadcasting in a loss)")
    diff = pred - target
    return xp.asarray(xp.mean(diff * diff))


@_mse.defvjp
def _mse_vjp(g, ans, pred, target, *, needs):
    scaled = (pred - target) * (2 * g / pred.size)
    return (scaled if needs[0] else None, -scaled if needs[1] else None)


def mse(pred: Any, target: Any) -> Any:
    """Mean squared error ``mean((pred - target) ** 2)``.

    Parameters
    ----------
    pred, target : array or traced value
        The same shape.

    Returns
    -------
    scalar array or traced value

    Raises
    ------
    ValueError
        Shapes that differ.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayrnn as ar
    >>> float(ar.ops.mse(np.array([1.0, 3.0]), np.array([0.0, 0.0])))
    5.0
    """
    return _mse(pred, target)


# -- the fused recurrent stack ------------------------------------------------------------------------

@primitive(keep=())
def _rnn(data, x, h0, c0, *, params, lengths, batch_first, engine, training, seed):
    res = rnn_forward(params, x, lengths=lengths, h0=h0, c0=c0, batch_first=batch_first, training=training,
                      seed=seed, engine=engine)
    return Residuals((res.y, res.h_n, res.c_n), res=res)


@_rnn.defvjp
def _rnn_vjp(gs, ans, data, x, h0, c0, *, res, params, lengths, batch_first, engine, training, seed):
    dy, dh_n, dc_n = gs
    grads = rnn_backward(res, dy=dy, dh_n=dh_n, dc_n=dc_n)
    return grads.dparams.data, grads.dx, grads.dh0 if h0 is not None else None, \
        grads.dc0 if c0 is not None else None


def rnn(params: PackedParams | TracedParams, x: Any, lengths: Any = None, h0: Any = None, c0: Any = None,
        batch_first: bool = False, engine: str = "auto", seed: int | None = None) -> tuple:
    """``(y, h_n, c_n)`` of :func:`arrayrnn.rnn_forward` as ONE tape node whose rule is ``rnn_backward``.

    Under differentiation the forward runs with ``training=True`` (keeping the engine's cache; inter-layer
    dropout, if the spec has any, is on and seeded by ``seed``); otherwise it is an inference call.

    Parameters
    ----------
    params : PackedParams or traced PackedParams
        The stack's weights (inside `arrayrnn.value_and_grad`, the traced ones it passes).
    x : array or traced value
        ``(T, B, input_size)`` (``(B, T, input_size)`` with ``batch_first``).
    lengths : array of int, optional
        ``(B,)`` in ``0..T``.
    h0, c0 : array or traced value, optional
        Initial states ``(L*D, B, H_out)`` / ``(L*D, B, H)``; None means zeros.
    batch_first : bool, optional
        Batch-major ``x`` and ``y``.
    engine : str, optional
        As in `arrayrnn.rnn_forward`.
    seed : int, optional
        Seed of the dropout masks under differentiation.

    Returns
    -------
    y : array or traced value
        ``(T, B, D*H_out)``.
    h_n : array or traced value
        ``(L*D, B, H_out)``.
    c_n : array or traced value or None
        ``(L*D, B, H)``; None unless the mode is LSTM.

    Raises
    ------
    ValueError, TypeError, EngineUnavailableError
        As `arrayrnn.rnn_forward`.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayrnn as ar
    >>> params = ar.PackedParams.init(ar.RNNSpec(mode="gru", input_size=3, hidden_size=4), seed=0)
    >>> x = np.ones((5, 2, 3), dtype=np.float32)
    >>> def loss(p):
    ...     y, h_n, _ = ar.ops.rnn(p, x)
    ...     return ar.ops.mean(y)
    >>> ar.grad(loss)(params).data.shape == params.data.shape
    True
    """
    if isinstance(params, TracedParams):
        packed, data = params.packed, params.data
    elif isinstance(params, PackedParams):
        packed, data = params, params.data
    else:
        raise TypeError(f"rnn: params has type {type(params).__name__}; expected an arrayrnn.PackedParams")
    training = any(is_traced(a) for a in (data, x, h0, c0))
    return _rnn(data, x, h0, c0, params=packed, lengths=value_of(lengths), batch_first=batch_first,
                engine=engine, training=training, seed=seed)


# -- Python operators on traced values ----------------------------------------------------------------

def _flip(fn):
    return lambda self, other: fn(other, self)


def _method(fn):  # primitives are objects, not functions: they would not bind as methods
    return lambda self, *args, **kwargs: fn(self, *args, **kwargs)


def _install_operators() -> None:
    methods = {
        "__add__": _method(add), "__radd__": _flip(add), "__sub__": _method(subtract),
        "__rsub__": _flip(subtract), "__mul__": _method(mul), "__rmul__": _flip(mul),
        "__truediv__": _method(divide), "__rtruediv__": _flip(divide), "__matmul__": _method(matmul),
        "__rmatmul__": _flip(matmul), "__pow__": _method(power), "__rpow__": _flip(power),
        "__neg__": _method(negative), "__getitem__": getitem,
        "reshape": reshape, "transpose": lambda self, *axes: transpose(self, axes or None),
        "sum": sum, "mean": mean,
    }
    for name, fn in methods.items():
        setattr(Traced, name, fn)
    Traced.T = property(transpose)
    for name in ("__lt__", "__le__", "__gt__", "__ge__"):  # comparisons give plain (constant) arrays
        compare = getattr(operator, name.strip("_"))
        setattr(Traced, name, lambda self, other, c=compare: c(self.value, value_of(other)))


_install_operators()
