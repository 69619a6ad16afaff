"""``check_grads``: compare reverse-mode gradients with central differences (like autograd's check_grads)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..core.backend import get_xp
from ..core.params import PackedParams
from ..core.spec import check_seed
from . import ops
from .api import value_and_grad


def _outputs(out: Any) -> list:
    return [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if o is not None]


def _buffer(arg: Any) -> Any:
    return arg.data if isinstance(arg, PackedParams) else arg


def _with_buffer(arg: Any, buffer: Any) -> Any:
    return PackedParams(arg.spec, buffer) if isinstance(arg, PackedParams) else buffer


def check_grads(fun: Callable, *args: Any, argnums: Sequence[int] | None = None, eps: float = 1e-6,
                rtol: float = 1e-6, atol: float = 1e-9, seed: int = 0) -> None:
    """Assert that the gradients of ``fun`` at ``args`` match central differences.

    ``fun`` returns an array or a tuple of arrays (``None`` entries skipped). Both sides are reduced to one
    number each: a random cotangent ``u`` for the outputs and a random direction ``v`` per argument give
    ``<grad <u, fun>, v>`` (reverse mode) and ``(<u, fun(x + eps v)> - <u, fun(x - eps v)>) / (2 eps)``.
    Use float64 arguments. Raises ``AssertionError`` naming the argument on a mismatch.
    """
    rng = np.random.default_rng(check_seed(seed))
    nums = tuple(range(len(args))) if argnums is None else tuple(argnums)
    cotangents = []
    for o in _outputs(fun(*args)):
        xp = get_xp(o)
        cotangents.append(xp.asarray(rng.standard_normal(np.shape(o)), dtype=o.dtype))

    def inner_product(*a: Any) -> Any:
        total = 0.0
        for o, u in zip(_outputs(fun(*a)), cotangents, strict=True):
            total = ops.add(total, ops.sum(ops.mul(o, u)))
        return total

    _, grads = value_and_grad(inner_product, nums)(*args)
    for n, g in zip(nums, grads, strict=True):
        x = _buffer(args[n])
        xp = get_xp(x)
        v = xp.asarray(rng.standard_normal(np.shape(x)), dtype=x.dtype)
        analytic = float(xp.sum(_buffer(g) * v))
        shifted = [list(args), list(args)]
        shifted[0][n] = _with_buffer(args[n], x + eps * v)
        shifted[1][n] = _with_buffer(args[n], x - eps * v)
        numeric = (float(inner_product(*shifted[0])) - float(inner_product(*shifted[1]))) / (2 * eps)
        if not np.isclose(analytic, numeric, rtol=rtol, atol=atol):
            raise AssertionError(f"argument {n}: reverse-mode directional derivative {analytic!r} "
                                 f"differs from "
                                 f"the central difference {numeric!r} (rtol={rtol}, atol={atol})")
