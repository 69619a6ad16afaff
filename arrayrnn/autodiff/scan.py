"""``scan``: a differentiable loop over the leading axis, for recurrent cells written with ``ar.ops``.

Semantics of JAX's ``lax.scan``, roughly equal to this Python loop::

    ys = []
    for x in (reversed(xs) if reverse else xs):
        carry, y = cell_fn(carry, x)
        ys.append(y)
    return carry, stack(ys in the order of xs)

``carry`` and ``xs`` may be arrays, traced values, or tuples/lists/dicts of them (``xs`` leaves share
their leading length). Every step records ordinary tape nodes, so the loop differentiates through
``value_and_grad`` like any other code; ``xs`` is sliced by one node per leaf and ``ys`` is stacked by one
node per leaf, so the backward does not allocate a full buffer per step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..core.backend import get_xp
from . import ops
from .tape import value_of

Tree = Any


def _flatten(tree: Tree) -> tuple[list, Callable[[list], Tree]]:
    """The leaves of ``tree`` (arrays, traced values; None is an empty subtree) and a rebuild function."""
    if tree is None:
        return [], lambda leaves: None
    if isinstance(tree, (tuple, list)):
        parts = [_flatten(t) for t in tree]
        sizes = [len(leaves) for leaves, _ in parts]

        def rebuild_seq(leaves: list) -> Tree:
            out, start = [], 0
            for (_, rebuild), n in zip(parts, sizes, strict=True):
                out.append(rebuild(leaves[start:start + n]))
                start += n
            return type(tree)(out)

        return [leaf for leaves, _ in parts for leaf in leaves], rebuild_seq
    if isinstance(tree, dict):
        keys = list(tree)
        flat, rebuild_values = _flatten([tree[k] for k in keys])
        return flat, lambda leaves: dict(zip(keys, rebuild_values(leaves), strict=True))
    return [tree], lambda leaves: leaves[0]


def _signature(leaves: list) -> list[tuple]:
    return [(tuple(np.shape(value_of(leaf))), str(getattr(value_of(leaf), "dtype", type(leaf).__name__)))
            for leaf in leaves]


def scan(cell_fn: Callable[[Tree, Tree], tuple[Tree, Tree]], carry: Tree, xs: Tree, reverse: bool = False,
         length: int | None = None) -> tuple[Tree, Tree]:
    """Loop ``cell_fn(carry, x_t) -> (carry, y_t)`` over the leading axis of ``xs``, differentiably (like
    ``jax.lax.scan``).

    For custom cells written with :mod:`arrayrnn.ops`; the built-in modes run fused in `rnn_forward` instead.

    Parameters
    ----------
    cell_fn : callable
        ``(carry, x_t) -> (carry, y_t)``. The carry must keep its structure, shapes and dtypes from step
        to step.
    carry : pytree
        The initial carry (arrays, traced values, or nested tuples, lists and dicts of them).
    xs : pytree or None
        Leaves with a leading time axis ``T``; None needs ``length``.
    reverse : bool, optional
        Run from the last step to the first (``ys`` stays in time order).
    length : int, optional
        Number of steps when ``xs`` is None (or a check of ``T``).

    Returns
    -------
    final_carry : pytree
        The carry after the last step.
    ys : pytree
        The structure of ``y_t`` with a new leading axis ``T`` (None if ``y_t`` is None). Over zero steps
        the leaves are empty, shaped ``(0, *y_t.shape)`` from one probe call of ``cell_fn`` (like JAX).

    Raises
    ------
    ValueError
        ``xs`` leaves of different lengths, neither ``xs`` nor ``length``, or a carry that changes
        structure, shape or dtype.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayrnn as ar
    >>> def cell(h, x):
    ...     h = ar.ops.tanh(x + h)
    ...     return h, h
    >>> h_T, ys = ar.scan(cell, np.zeros(2), np.ones((5, 2)))
    >>> ys.shape, h_T.shape
    ((5, 2), (2,))
    """
    x_leaves, rebuild_x = _flatten(xs)
    lengths = {int(np.shape(value_of(leaf))[0]) if np.ndim(value_of(leaf)) else -1 for leaf in x_leaves}
    if -1 in lengths:
        raise ValueError("scan: every leaf of xs needs a leading (time) axis; got a scalar leaf")
    if length is not None:
        lengths.add(int(length))
    if len(lengths) != 1:
        raise ValueError(f"scan: the leaves of xs (and length={length}) have leading lengths "
                         f"{sorted(lengths)}; "
                         "they must all be equal" if lengths else "scan: xs is None; pass length=")
    steps = lengths.pop()
    if steps == 0:
        return carry, _empty_outputs(cell_fn, carry, x_leaves, rebuild_x)
    slices = [ops.unstack(leaf) for leaf in x_leaves]
    carry_leaves, _ = _flatten(carry)
    expected = _signature(carry_leaves)
    ys: list = [None] * steps
    for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
        carry, ys[t] = _step(cell_fn, carry, rebuild_x([s[t] for s in slices]), t)
        got = _signature(_flatten(carry)[0])
        if got != expected:
            raise ValueError(f"scan: at step {t} cell_fn returned a carry with (shape, dtype) leaves {got}; "
                             f"expected those of the initial carry {expected}")
    return carry, _stack_outputs(ys)


def _empty_outputs(cell_fn: Callable, carry: Tree, x_leaves: list, rebuild_x: Callable) -> Tree:
    """Zero-step scan: ``ys`` leaves of shape ``(0, *y_t.shape)``, found (as JAX does) from what the cell
    returns for one probe step on zeros shaped like a slice of ``xs`` (its result is otherwise unused)."""
    probe = [_zeros_like(leaf, lambda shape: shape[1:]) for leaf in x_leaves]
    _, y = _step(cell_fn, carry, rebuild_x(probe), 0)
    leaves, rebuild = _flatten(y)
    return rebuild([_zeros_like(leaf, lambda shape: (0, *shape)) for leaf in leaves])


def _zeros_like(leaf: Any, new_shape: Callable[[tuple], tuple]) -> Any:
    value = value_of(leaf)
    xp = get_xp(value) if hasattr(value, "__array_namespace__") or hasattr(value, "dtype") else np
    return xp.zeros(new_shape(tuple(np.shape(value))), dtype=getattr(value, "dtype", np.result_type(value)))


def _step(cell_fn: Callable, carry: Tree, x: Tree, t: int) -> tuple[Tree, Tree]:
    result = cell_fn(carry, x)
    if not isinstance(result, tuple) or len(result) != 2:
        raise TypeError(f"scan: at step {t} cell_fn returned {type(result).__name__}; expected a pair "
                        "(new_carry, y)")
    return result


def _stack_outputs(ys: list) -> Tree:
    if not ys:
        return None
    flat = [_flatten(y) for y in ys]
    rebuild = flat[0][1]
    columns = zip(*(leaves for leaves, _ in flat), strict=True)
    return rebuild([ops.stack(list(column)) for column in columns])
