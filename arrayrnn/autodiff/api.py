"""``value_and_grad``, ``grad`` and ``vjp``: differentiate Python functions of arrays and PackedParams.

Arguments being differentiated may be arrays, :class:`~arrayrnn.PackedParams`, or lists, tuples and
dicts of them; gradients mirror that structure (the gradient of a PackedParams is a PackedParams: one
flat buffer, same spec and layout). Inside the function a PackedParams arrives as a
:class:`TracedParams` whose ``view`` / ``named_views`` are traced too.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..core.backend import get_xp
from ..core.params import PackedParams
from .tape import Node, Trace, Traced, backward, leaf, value_of


class TracedParams:
    """A PackedParams inside a differentiated function: ``data`` is traced, views are traced slices."""

    __slots__ = ("packed", "data")

    def __init__(self, packed: PackedParams, data: Traced):
        self.packed, self.data = packed, data

    spec = property(lambda self: self.packed.spec)
    format = property(lambda self: self.packed.format)
    layout = property(lambda self: self.packed.layout)

    def view(self, layer: int, direction: int, name: str) -> Traced:
        block = self.layout.block(layer, direction, name)
        return self.data[block.offset:block.stop].reshape(block.shape)

    def named_views(self) -> dict[str, Traced]:
        return {b.key: self.data[b.offset:b.stop].reshape(b.shape) for b in self.layout.blocks}

    def __repr__(self) -> str:
        return f"TracedParams({self.packed!r})"


def _describe(path: str) -> str:
    return path or "the argument"


def _box(arg: Any, trace: Trace, path: str, leaves: list[Node]) -> Any:
    """Replace every array / PackedParams in ``arg`` by a traced leaf (recording the leaf nodes)."""
    if isinstance(arg, PackedParams):
        data = leaf(arg.data, trace)
        leaves.append(data.node)
        return TracedParams(arg, data)
    if isinstance(arg, (list, tuple)):
        return type(arg)(_box(a, trace, f"{path}[{i}]", leaves) for i, a in enumerate(arg))
    if isinstance(arg, dict):
        return {k: _box(v, trace, f"{path}[{k!r}]", leaves) for k, v in arg.items()}
    if isinstance(arg, Traced):
        raise TypeError(f"{_describe(path)} is already a traced value; nested differentiation is not "
                        "supported")
    if isinstance(arg, np.generic):
        arg = np.asarray(arg)  # a NumPy scalar: differentiate it as a 0-d array
    if not hasattr(arg, "dtype") or not hasattr(arg, "shape"):
        raise TypeError(f"{_describe(path)} has type {type(arg).__name__}; can differentiate only with "
                        "respect to floating arrays, PackedParams, or lists/tuples/dicts of them")
    if np.dtype(arg.dtype).kind != "f":
        raise TypeError(f"{_describe(path)} has dtype {arg.dtype}; can differentiate only with respect to "
                        "floating arrays (convert with x.astype('float32') or pass it as a "
                        "non-differentiated argument)")
    node_value = leaf(arg, trace)
    leaves.append(node_value.node)
    return node_value


def _unbox(arg: Any, grads: dict[Node, tuple[Any, bool]], boxed: Any) -> Any:
    """The gradient structure mirroring ``arg``: fresh contiguous arrays (zeros where unused)."""
    if isinstance(arg, PackedParams):
        g = _leaf_gradient(boxed.data.node, arg.data, grads)
        if arg.format == "canonical":
            return PackedParams(arg.spec, g)
        out = arg.zeros_like()
        out.data[...] = g
        return out
    if isinstance(arg, (list, tuple)):
        return type(arg)(_unbox(a, grads, b) for a, b in zip(arg, boxed, strict=True))
    if isinstance(arg, dict):
        return {k: _unbox(arg[k], grads, boxed[k]) for k in arg}
    return _leaf_gradient(boxed.node, arg, grads)


def _leaf_gradient(node: Node, value: Any, grads: dict[Node, tuple[Any, bool]]) -> Any:
    xp = get_xp(value)
    if node not in grads:
        return xp.zeros_like(value)  # the output does not depend on it: zeros, like JAX
    g, owned = grads[node]
    return g if owned else xp.array(g, copy=True, order="C")


def _normalize_argnums(argnums: int | Sequence[int], nargs: int) -> tuple[int, ...]:
    nums = (int(argnums),) if isinstance(argnums, numbers.Integral) else tuple(argnums)
    for n in nums:
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, numbers.Integral) or not -nargs <= n < nargs:
            raise ValueError(f"argnums = {argnums!r}, but the function was called with {nargs} positional "
                             f"argument(s); every argnum must be in {-nargs}..{nargs - 1}")
    return tuple(n % nargs for n in nums)


def _scalar_output(out: Any, who: str) -> Any:
    value = value_of(out)
    if not hasattr(value, "shape") and not isinstance(value, (int, float)):
        raise TypeError(f"{who}: the function returned {type(value).__name__}; expected a scalar array "
                        "(such as a loss); with has_aux=True return (loss, aux)")
    if np.shape(value) != ():
        raise ValueError(f"{who}: the function returned an array of shape {tuple(np.shape(value))}; "
                         f"expected a "
                         "scalar (shape ()); reduce it first, e.g. ar.ops.sum(out) or ar.ops.mean(out)")
    if not isinstance(value, (int, float)) and np.dtype(value.dtype).kind != "f":
        raise TypeError(f"{who}: the function returned dtype {value.dtype}; expected a floating scalar")
    return value


def vjp(fun: Callable, *args: Any) -> tuple[Any, Callable]:
    """``(out, vjp_fn)``: ``vjp_fn(cotangent)`` returns one gradient per argument (mirroring each).

    ``vjp_fn`` runs the backward once; its nodes release their saved buffers as they go, so calling it a
    second time is a ``RuntimeError``.
    """
    out, vjp_fn, _ = _trace(fun, args, tuple(range(len(args))), {}, has_aux=False)
    return value_of(out), vjp_fn


def _trace(fun: Callable, args: tuple, argnums: tuple[int, ...], kwargs: dict, has_aux: bool):
    trace = Trace()
    leaves: list[Node] = []
    boxed_args = list(args)
    for n in argnums:
        boxed_args[n] = _box(args[n], trace, f"argument {n}", leaves)
    result = fun(*boxed_args, **kwargs)
    if has_aux and not (isinstance(result, tuple) and len(result) == 2):
        raise TypeError("has_aux=True: the function must return a pair (output, aux)")
    out, aux = result if has_aux else (result, None)

    def vjp_fn(cotangent: Any) -> tuple:
        grads = {}
        if isinstance(out, Traced) and out.node.trace is trace:
            if tuple(np.shape(cotangent)) != tuple(out.shape):
                raise ValueError(f"cotangent has shape {tuple(np.shape(cotangent))}; expected the output's "
                                 f"shape {tuple(out.shape)}")
            grads = backward(out, cotangent)
        return tuple(_unbox(args[n], grads, boxed_args[n]) for n in argnums)

    return out, vjp_fn, _strip(aux)


def _strip(tree: Any) -> Any:
    if isinstance(tree, (list, tuple)):
        return type(tree)(_strip(t) for t in tree)
    if isinstance(tree, dict):
        return {k: _strip(v) for k, v in tree.items()}
    return value_of(tree)


def value_and_grad(fun: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """Transform ``fun`` into a function returning ``(fun(*args), gradient)``.

    Parameters
    ----------
    fun : callable
        Returns a floating scalar (a 0-d array or a Python float); with ``has_aux``, ``(scalar, aux)``.
        Inside, the differentiated arguments are traced values: use :mod:`arrayrnn.ops`, the operators
        ``+ - * / @ **`` and indexing, `bias_act`, `dense_bias_act`, `scan`.
    argnums : int or sequence of int, optional
        Which positional arguments to differentiate (arrays or `PackedParams`).
    has_aux : bool, optional
        ``fun`` returns ``(value, aux)``; ``aux`` is passed through, not differentiated.

    Returns
    -------
    callable
        ``f(*args, **kwargs) -> (value, gradient)`` (``((value, aux), gradient)`` with ``has_aux``). The
        gradient mirrors ``args[argnums]`` (a tuple of them when ``argnums`` is a tuple): an array for an
        array, a `PackedParams` for a `PackedParams`; an argument the output does not depend on gets zeros,
        like JAX.

    Raises
    ------
    ValueError
        ``fun`` returned something other than a scalar, or ``argnums`` out of range (when called).
    TypeError
        ``fun`` returned a non-floating value (when called).

    Examples
    --------
    >>> import numpy as np
    >>> import arrayrnn as ar
    >>> def loss(w, x):
    ...     return ar.ops.sum(ar.ops.tanh(x @ w) ** 2)
    >>> w, x = np.full((3, 2), 0.1), np.ones((4, 3))
    >>> value, g = ar.value_and_grad(loss)(w, x)
    >>> g.shape
    (3, 2)
    """

    def value_and_grad_fun(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
        nums = _normalize_argnums(argnums, len(args))
        out, vjp_fn, aux = _trace(fun, args, nums, kwargs, has_aux)
        value = _scalar_output(out, "value_and_grad")
        xp = get_xp(value) if hasattr(value, "dtype") else np
        grads = vjp_fn(xp.ones((), dtype=getattr(value, "dtype", np.float64)))
        grads = grads[0] if isinstance(argnums, numbers.Integral) else grads
        return ((value, aux) if has_aux else value), grads

    return value_and_grad_fun


def grad(fun: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """Transform ``fun`` into a function returning its gradient: the gradient half of :func:`value_and_grad`.

    Parameters
    ----------
    fun : callable
        Returns a floating scalar (``(scalar, aux)`` with ``has_aux``).
    argnums : int or sequence of int, optional
        Which positional arguments to differentiate.
    has_aux : bool, optional
        ``fun`` returns ``(value, aux)``; the result is then ``(gradient, aux)``.

    Returns
    -------
    callable
        ``f(*args, **kwargs) -> gradient`` mirroring ``args[argnums]``.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayrnn as ar
    >>> ar.grad(lambda x: ar.ops.sum(x * x))(np.array([1.0, 2.0]))
    array([2., 4.])
    """
    vg = value_and_grad(fun, argnums, has_aux)

    def grad_fun(*args: Any, **kwargs: Any) -> Any:
        value, g = vg(*args, **kwargs)
        return (g, value[1]) if has_aux else g

    return grad_fun
