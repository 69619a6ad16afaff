"""``ar.check_cell``: a custom cell's backward against float64 central differences of its forward.

A cell's functions are elementwise, so one perturbation of a whole argument array gives every sample's
derivative at once. For random cotangents ``u`` of the new states, per sample::

    vjp     = cell.backward(residuals, u)[k]
    numeric = (L(arg_k + eps) - L(arg_k - eps)) / (2 eps),   L = sum_s u_s * forward(...)[0][s]

and the first argument whose ``|vjp - numeric| > atol + rtol * |numeric|`` somewhere is named in the error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..core.cell_registry import Cell, cell_of, registered_cells

DEFAULT_RANGE = (-1.5, 1.5)


class CellCheckError(AssertionError):
    """A cell's backward disagrees with the central differences of its forward (or a function misbehaves)."""


def check_cell(cell: Cell | str, *, samples: int = 256, seed: int = 0, eps: float = 1e-6,
               rtol: float = 1e-5, atol: float = 1e-7,
               ranges: Mapping[str, tuple[float, float]] | None = None) -> dict[str, float]:
    """Check ``cell``'s backward against float64 central differences of its forward.

    Parameters
    ----------
    cell : Cell or str
        The cell, or the name it is registered under.
    samples, seed : int
        How many random points (float64), and the generator's seed.
    eps, rtol, atol : float
        The central differences' step and the tolerance ``|vjp - numeric| <= atol + rtol * |numeric|``.
    ranges : dict, optional
        ``{argument name: (lo, hi)}``: where to draw an argument of ``forward`` (uniformly); every other in
        ``(-1.5, 1.5)``. Argument names are ``cell.argument_names`` (a split gate ``n`` gives ``n_x``,
        ``n_h``), e.g. ``{"n": (0.5, 2.0)}`` for a state that must stay positive.

    Returns
    -------
    dict
        ``{argument name: largest |vjp - numeric|}``.

    Raises
    ------
    CellCheckError
        (an ``AssertionError``) naming the cell, the first argument whose cotangent is wrong, the sample,
        both values; or a forward that gives non-finite values on the samples.

    Examples
    --------
    >>> import arrayrnn as ar
    >>> errors = ar.check_cell("cifg")
    >>> sorted(errors) == sorted(ar.RNNSpec("cifg", 1, 1).custom_cell.argument_names)
    True
    """
    cell = _resolve(cell)
    names = cell.argument_names
    ranges = dict(ranges or {})
    unknown = sorted(set(ranges) - set(names))
    if unknown:
        raise ValueError(f"ranges names {unknown}, not arguments of cell {cell.name!r}; expected names among "
                         f"{names}")
    rng = np.random.default_rng(seed)
    args = [rng.uniform(*ranges.get(name, DEFAULT_RANGE), size=samples) for name in names]
    new_states, residuals = _forward(cell, args)
    u = [rng.standard_normal(samples) for _ in cell.states]
    vjp = cell.backward(tuple(_full(r, samples) for r in residuals), tuple(u))
    errors = {}
    for k, name in enumerate(names):
        numeric = (_loss(cell, args, k, eps, u) - _loss(cell, args, k, -eps, u)) / (2 * eps)
        got = _full(vjp[k], samples)
        error = np.abs(got - numeric)
        bad = np.flatnonzero(~(error <= atol + rtol * np.abs(numeric)))
        if bad.size:
            i = int(bad[0])
            raise CellCheckError(
                f"cell {cell.name!r}: backward's cotangent of {name!r} (forward argument {k}) disagrees with "
                f"central differences at sample {i} of {samples}: backward {float(got[i])!r}, differences "
                f"{float(numeric[i])!r} (at {_point(names, args, i)}); {bad.size} samples off")
        errors[name] = float(error.max(initial=0.0))
    return errors


def _resolve(cell: Cell | str) -> Cell:
    if isinstance(cell, Cell):
        return cell
    found = cell_of(cell) if isinstance(cell, str) else None
    if found is None:
        raise ValueError(f"cell = {cell!r}; expected an arrayrnn.Cell or the name of a registered cell "
                         f"(registered: {registered_cells()})")
    return found


def _forward(cell: Cell, args: list[np.ndarray]) -> tuple[tuple, tuple]:
    new_states, residuals = cell.forward(*args)
    samples = args[0].shape[0]
    for name, value in zip(cell.states, new_states, strict=True):
        value = _full(value, samples)
        if not np.isfinite(value).all():
            raise CellCheckError(f"cell {cell.name!r}: forward's new {name!r} is not finite on "
                                 f"{int((~np.isfinite(value)).sum())} of {samples} samples; pass ranges= "
                                 "where the cell's arguments live")
    return new_states, residuals


def _loss(cell: Cell, args: list[np.ndarray], k: int, step: float, u: list[np.ndarray]) -> np.ndarray:
    moved = list(args)
    moved[k] = args[k] + step
    new_states, _ = cell.forward(*moved)
    samples = args[0].shape[0]
    return sum(u_s * _full(s, samples) for u_s, s in zip(u, new_states, strict=True))


def _full(value: Any, samples: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(value, dtype=np.float64), (samples,))


def _point(names: tuple[str, ...], args: list[np.ndarray], i: int) -> str:
    return ", ".join(f"{name}={a[i]:.4g}" for name, a in zip(names, args, strict=True))
