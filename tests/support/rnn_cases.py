"""Test helpers for rnn_forward / rnn_backward: random cases, the scalar loss, comparisons.

``forward`` / ``forward_backward`` run a (host) case on the array module the ``engine`` fixture carries
(``engine.xp``, see conftest.py): on NumPy as is; on CuPy the case's arrays go to the device and the
results come back to the host (``y``, ``h_n``, ``c_n``, ``dx``, ``dh0``, ``dc0`` and canonical
``dparams``), so a body written with NumPy oracles runs unchanged on a GPU engine.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from arrayrnn import PackedParams, RNNSpec, rnn_backward, rnn_forward
from arrayrnn.core.backend import to_host


@dataclass(frozen=True)
class Case:
    params: PackedParams
    x: np.ndarray
    lengths: np.ndarray | None
    h0: np.ndarray | None
    c0: np.ndarray | None
    dy: np.ndarray
    dh_n: np.ndarray
    dc_n: np.ndarray | None
    batch_first: bool = False

    @property
    def spec(self) -> RNNSpec:
        return self.params.spec

    def with_(self, **changes) -> Case:
        return replace(self, **changes)


def make_lengths(kind: str, T: int, B: int, rng: np.random.Generator) -> np.ndarray | None:
    """``"full"``: None; ``"unsorted"``: random in 1..T with T and a short row present; ``"sorted"``:
    descending; ``"zeros"``: like unsorted with some rows of length 0; ``"short"``: all < T (T >= 2)."""
    if kind == "full":
        return None
    lengths = rng.integers(1, T + 1, B)
    if kind == "sorted":
        return np.sort(lengths)[::-1].copy()
    if kind == "short":
        return np.minimum(lengths, T - 1)
    if B > 1:
        lengths[rng.integers(B)] = T
    if kind == "zeros":
        lengths[rng.choice(B, size=max(1, B // 2), replace=False)] = 0
    return lengths


def make_case(spec: RNNSpec, T: int, B: int, seed: int = 0, lengths: str = "unsorted",
              batch_first: bool = False, with_state: bool = True, scale: float = 1.0) -> Case:
    rng = np.random.default_rng(seed)
    dt = spec.dtype
    L, D = spec.num_layers * spec.num_directions, spec.num_directions

    def normal(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(dt)

    params = PackedParams.init(spec, seed=seed + 1)
    x = scale * normal(*((B, T, spec.input_size) if batch_first else (T, B, spec.input_size)))
    lens = make_lengths(lengths, T, B, rng)
    h0 = normal(L, B, spec.output_size) if with_state else None
    c0 = normal(L, B, spec.hidden_size) if with_state and spec.has_cell else None
    y_shape = (B, T, D * spec.output_size) if batch_first else (T, B, D * spec.output_size)
    dy = normal(*y_shape)
    dh_n = normal(L, B, spec.output_size)
    dc_n = normal(L, B, spec.hidden_size) if spec.has_cell else None
    return Case(params, x.astype(dt), lens, h0, c0, dy, dh_n, dc_n, batch_first)


def _xp(engine: str) -> Any:
    return getattr(engine, "xp", np)


def on_device(case: Case, xp: Any) -> Case:
    """The case with its arrays on ``xp``'s device (lengths stay on the host)."""
    if xp is np:
        return case

    def move(a):
        return xp.asarray(a) if a is not None else None

    return case.with_(params=case.params.to(xp), x=move(case.x), h0=move(case.h0), c0=move(case.c0),
                      dy=move(case.dy), dh_n=move(case.dh_n), dc_n=move(case.dc_n))


def _host_result(res):
    return replace(res, y=to_host(res.y), h_n=to_host(res.h_n),
                   c_n=to_host(res.c_n) if res.c_n is not None else None)


def _host_grads(g):
    return replace(g, dx=to_host(g.dx), dh0=to_host(g.dh0), dc0=to_host(g.dc0) if g.dc0 is not None else None,
                   dparams=g.dparams.to(np))


def forward(case: Case, engine: str, **kw):
    """``rnn_forward`` of the case on ``engine`` (on NumPy: the result itself; else a host copy of it)."""
    xp = _xp(engine)
    dev = on_device(case, xp)
    res = rnn_forward(dev.params, dev.x, dev.lengths, dev.h0, dev.c0, batch_first=dev.batch_first,
                      engine=engine, **kw)
    return res if xp is np else _host_result(res)


def forward_backward(case: Case, engine: str, **kw):
    xp = _xp(engine)
    dev = on_device(case, xp)
    res = rnn_forward(dev.params, dev.x, dev.lengths, dev.h0, dev.c0, batch_first=dev.batch_first,
                      engine=engine, training=True, **kw)
    grads = rnn_backward(res, dev.dy, dev.dh_n, dev.dc_n)
    return (res, grads) if xp is np else (_host_result(res), _host_grads(grads))


def loss(res, case: Case) -> float:
    """``<y, dy> + <h_n, dh_n> + <c_n, dc_n>``: its gradient is what rnn_backward returns."""
    total = np.sum(res.y * case.dy) + np.sum(res.h_n * case.dh_n)
    if res.c_n is not None:
        total += np.sum(res.c_n * case.dc_n)
    return float(total)


def tolerances(dtype: str) -> dict[str, float]:
    return {"float64": dict(rtol=1e-10, atol=1e-12), "float32": dict(rtol=2e-4, atol=2e-5)}[dtype]


def assert_close(actual, expected, what: str, rtol: float, atol: float) -> None:
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=rtol, atol=atol, err_msg=what)
