"""Float64 central differences of the scalar loss of tests/support/rnn_cases.py (``<y, dy> + <h_n, dh_n> +
<c_n, dc_n>``), entry by entry (:func:`numeric_gradient`) or along random directions
(:func:`check_directions`, for GPU array modules where one forward costs milliseconds)."""

from __future__ import annotations

import numpy as np

from arrayrnn import PackedParams

from .rnn_cases import Case, forward, loss

EPS = 1e-6
DIRECTIONS = 4


def _loss_at(case: Case, engine: str, name: str, **kw):
    """``loss`` as a function of the values of ``params.data``, ``x``, ``h0`` or ``c0`` (and their base)."""
    base = case.params.data if name == "params" else getattr(case, name)

    def at(values: np.ndarray) -> float:
        arr = values.reshape(base.shape)
        changed = (case.with_(params=PackedParams(case.spec, arr)) if name == "params"
                   else case.with_(**{name: arr}))
        return loss(forward(changed, engine, **kw), case)

    return at, base


def numeric_gradient(case: Case, engine: str, name: str, **kw) -> np.ndarray:
    """Central differences of ``loss`` w.r.t. every entry of ``params.data``, ``x``, ``h0`` or ``c0``."""
    at, base = _loss_at(case, engine, name, **kw)
    flat = base.copy().reshape(-1)
    grad = np.empty_like(flat)
    for i in range(flat.size):
        keep = flat[i]
        flat[i] = keep + EPS
        up = at(flat.copy())
        flat[i] = keep - EPS
        down = at(flat.copy())
        flat[i] = keep
        grad[i] = (up - down) / (2 * EPS)
    return grad.reshape(base.shape)


def check_directions(analytic: np.ndarray, case: Case, engine: str, name: str, **kw) -> None:
    """``<analytic, v>`` against the central difference of ``loss`` along random unit directions ``v``."""
    at, base = _loss_at(case, engine, name, **kw)
    for v in np.random.default_rng(len(name)).standard_normal((DIRECTIONS, base.size)):
        v /= np.linalg.norm(v)
        numeric = (at(base.reshape(-1) + EPS * v) - at(base.reshape(-1) - EPS * v)) / (2 * EPS)
        np.testing.assert_allclose(np.dot(analytic.reshape(-1), v), numeric, rtol=1e-6, atol=1e-7,
                                   err_msg=f"d loss / d {name} along a random direction")
