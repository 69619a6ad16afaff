"""Test helpers for rnn_forward / rnn_backward: random cases, the scalar loss, comparisons."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from arrayrnn import PackedParams, RNNSpec, rnn_backward, rnn_forward


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


def forward(case: Case, engine: str, **kw):
    return rnn_forward(case.params, case.x, case.lengths, case.h0, case.c0, batch_first=case.batch_first,
                       engine=engine, **kw)


def forward_backward(case: Case, engine: str, **kw):
    res = forward(case, engine, training=True, **kw)
    return res, rnn_backward(res, case.dy, case.dh_n, case.dc_n)


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
