"""Test helpers for rnn_forward / rnn_backward: random cases, the scalar loss, comparisons.

A case is built on the host (NumPy). ``forward`` / ``forward_backward`` run it on the array module the
``engine`` fixture carries (``engine.xp``, see conftest.py): the case's arrays go to that device first
(:func:`on_device`) and the results STAY there, as a user's would, so a backward after them takes device
cotangents (``on_device(case, engine).dy``) and nothing is copied behind the test's back. Bodies compare
through :func:`host` / :func:`assert_close`, which copy to the host for the comparison only. An engine on a
GPU array module that refuses the case's spec (cuDNN: the reset-before GRU, cell clipping) skips the test
with its reason; a CPU engine never does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest

from arrayrnn import EngineUnavailableError, PackedParams, RNNSpec, rnn_backward, rnn_forward
from arrayrnn.core.backend import get_xp, to_host
from arrayrnn.frontend.rnn import RNNGrads, RNNResult


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
    descending; ``"zeros"``: like unsorted with some rows of length 0; ``"short"``: all < T (T >= 2);
    ``"edges"``: random in 0..T, the first rows T, 0 and 1."""
    if kind == "full":
        return None
    if kind == "edges":
        lengths = rng.integers(0, T + 1, B)
        lengths[:3] = (T, 0, 1)[:B]
        return lengths
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
    if spec.layer_norm:
        _spread_norm_gains(params, seed)
    x = scale * normal(*((B, T, spec.input_size) if batch_first else (T, B, spec.input_size)))
    lens = make_lengths(lengths, T, B, rng)
    h0 = normal(L, B, spec.output_size) if with_state else None
    c0 = normal(L, B, spec.cell_width) if with_state and spec.has_cell else None
    y_shape = (B, T, D * spec.output_size) if batch_first else (T, B, D * spec.output_size)
    dy = normal(*y_shape)
    dh_n = normal(L, B, spec.output_size)
    dc_n = normal(L, B, spec.cell_width) if spec.has_cell else None
    return Case(params, x.astype(dt), lens, h0, c0, dy, dh_n, dc_n, batch_first)


def _spread_norm_gains(params: PackedParams, seed: int) -> None:
    """Layer norm's gains start at ones and the cell's shift at zeros: spread them, so each one matters."""
    rng = np.random.default_rng(seed + 2)
    for block in params.layout.blocks:
        if block.name in ("g_ih", "g_hh", "g_c", "b_c"):
            params.block_view(block)[...] += 0.5 * rng.standard_normal(block.shape)


def xp_of(engine: Any) -> Any:
    """The array module the ``engine`` fixture's value runs on (NumPy for a plain engine name)."""
    return getattr(engine, "xp", np)


def on_device(case: Case, engine: Any) -> Case:
    """The case with its arrays on the device of the ``engine`` fixture's value (lengths stay on the host);
    the case itself if already there, or if ``engine`` is a plain name (the caller placed the arrays)."""
    xp = getattr(engine, "xp", None)
    if xp is None or get_xp(case.params.data) is xp:
        return case

    def move(a):
        return xp.asarray(a) if a is not None else None

    return case.with_(params=case.params.to(xp), x=move(case.x), h0=move(case.h0), c0=move(case.c0),
                      dy=move(case.dy), dh_n=move(case.dh_n), dc_n=move(case.dc_n))


def host(obj: Any) -> Any:
    """A host (NumPy) copy of a device array, result, gradients or params; host objects as they are."""
    if obj is None or isinstance(obj, np.ndarray):
        return obj
    if isinstance(obj, PackedParams):
        return obj if get_xp(obj.data) is np else obj.to(np)
    if isinstance(obj, RNNResult):
        return replace(obj, y=to_host(obj.y), h_n=to_host(obj.h_n), c_n=host(obj.c_n), h_all=host(obj.h_all),
                       c_all=host(obj.c_all))
    if isinstance(obj, RNNGrads):
        return replace(obj, dx=to_host(obj.dx), dh0=to_host(obj.dh0), dc0=host(obj.dc0),
                       dparams=host(obj.dparams))
    return to_host(obj)


def _forward(dev: Case, engine: Any, **kw) -> RNNResult:
    try:
        return rnn_forward(dev.params, dev.x, dev.lengths, dev.h0, dev.c0, batch_first=dev.batch_first,
                           engine=engine, **kw)
    except EngineUnavailableError as err:
        if xp_of(engine) is np:
            raise
        pytest.skip(f"{engine} on {xp_of(engine).__name__} refuses this case: {err}")


def forward(case: Case, engine: Any, **kw) -> RNNResult:
    """``rnn_forward`` of the case on ``engine``'s device; the result stays there."""
    return _forward(on_device(case, engine), engine, **kw)


def forward_backward(case: Case, engine: Any, **kw) -> tuple[RNNResult, RNNGrads]:
    """``rnn_forward(training=True)`` then ``rnn_backward`` with the case's cotangents, on ``engine``'s
    device; both results stay there."""
    dev = on_device(case, engine)
    res = _forward(dev, engine, training=True, **kw)
    return res, rnn_backward(res, dev.dy, dev.dh_n, dev.dc_n)


# -- one engine against another ------------------------------------------------------------------
def engine_results(engine: str, spec: RNNSpec, T: int, B: int, seed: int = 0, training: bool = True,
                   mask_seed: int = 7) -> dict[str, Any]:
    """``engine``'s results on ``make_case(spec, T, B, seed, lengths="edges")`` (rows of length 0, 1 and
    T, unsorted; random initial states): ``y``, ``h_n``, ``c_n`` and, ``training``, the gradients of the
    case's cotangents; every mask drawn from ``mask_seed``."""
    case = make_case(spec, T, B, seed, lengths="edges")
    if not training:
        res = forward(case, engine, seed=mask_seed)
        return {"y": res.y, "h_n": res.h_n, "c_n": res.c_n}
    res, g = forward_backward(case, engine, seed=mask_seed)
    return {"y": res.y, "h_n": res.h_n, "c_n": res.c_n, "dx": g.dx, "dh0": g.dh0, "dc0": g.dc0,
            "dparams": g.dparams.data}


def assert_same_results(got: dict[str, Any], want: dict[str, Any], rtol: float, atol: float) -> None:
    """Every result of :func:`engine_results` ``got`` equals ``want``'s (absent where it is absent)."""
    assert got.keys() == want.keys()
    for name, expected in want.items():
        if expected is None:
            assert got[name] is None, name
            continue
        np.testing.assert_allclose(host(got[name]), host(expected), rtol=rtol, atol=atol, err_msg=name)


def loss(res, case: Case) -> float:
    """``<y, dy> + <h_n, dh_n> + <c_n, dc_n>``: its gradient is what rnn_backward returns."""
    res = host(res)
    total = np.sum(res.y * case.dy) + np.sum(res.h_n * case.dh_n)
    if res.c_n is not None:
        total += np.sum(res.c_n * case.dc_n)
    return float(total)


def tolerances(dtype: str) -> dict[str, float]:
    return {"float64": dict(rtol=1e-10, atol=1e-12), "float32": dict(rtol=2e-4, atol=2e-5)}[dtype]


def assert_close(actual, expected, what: str, rtol: float, atol: float) -> None:
    np.testing.assert_allclose(host(actual), host(expected), rtol=rtol, atol=atol, err_msg=what)
