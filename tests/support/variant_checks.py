"""The cell variants' checks (tests/test_cell_variants.py on every engine that accepts them,
tests/test_numba_variants.py on cases of the numba engine only): a case with the variants on, its values and
gradients against the scan oracle (tests/support/variant_oracle.py) and against central differences."""

from __future__ import annotations

from typing import Any

import numpy as np

import arrayrnn as ar
from arrayrnn import RNNSpec, rnn_backward, rnn_forward

from .finite_differences import check_directions, numeric_gradient
from .rnn_cases import Case, forward_backward, host, make_case, on_device, xp_of
from .variant_oracle import run_oracle

SEED = 5


def variant_spec(fields: dict) -> RNNSpec:
    return RNNSpec(**{"input_size": 2, "hidden_size": 3, "dtype": "float64", **fields})


def variant_case(case_id: str, fields: dict, T: int, B: int, lengths: str) -> Case:
    case = make_case(variant_spec(fields), T, B, seed=len(case_id), lengths=lengths, scale=1.5)
    if case.spec.peepholes:  # init draws peepholes like any weight; make them matter
        for layer in range(case.spec.num_layers):
            for direction in range(case.spec.num_directions):
                case.params.view(layer, direction, "P")[...] *= 3.0
    return case


def _all_cotangents(case, res):
    rng = np.random.default_rng(1)
    dh_all = rng.standard_normal(res.h_all.shape)
    dc_all = rng.standard_normal(res.c_all.shape) if res.c_all is not None else None
    return dh_all, dc_all


def _loss(out: dict, case, dh_all, dc_all):
    total = (out["y"] * case.dy).sum() + (out["h_n"] * case.dh_n).sum() + (out["h_all"] * dh_all).sum()
    if out["c_n"] is not None:
        total = total + (out["c_n"] * case.dc_n).sum() + (out["c_all"] * dc_all).sum()
    return total


def check_against_the_scan_oracle(case_id: str, fields: dict, T: int, B: int, lengths: str, training: bool,
                                  engine: Any) -> None:
    """The values and every gradient (``return_all_states`` and its cotangents included) of ``engine`` on
    :func:`variant_case` against the plain stack under ``ar.scan`` with the public masks."""
    case = variant_case(case_id, fields, T, B, lengths)
    dev = on_device(case, engine)
    res = rnn_forward(dev.params, dev.x, dev.lengths, dev.h0, dev.c0, training=training, seed=SEED,
                      engine=engine, return_all_states=True)
    dh_all, dc_all = _all_cotangents(case, res)
    xp = xp_of(engine)
    grads = host(rnn_backward(res, dev.dy, dev.dh_n, dev.dc_n, dh_all=xp.asarray(dh_all),
                              dc_all=xp.asarray(dc_all) if dc_all is not None else None))
    expected = run_oracle(case.params, case.x, case.lengths, case.h0, case.c0, SEED, training)
    for name, value in expected.items():
        if value is not None:
            np.testing.assert_allclose(host(getattr(res, name)), value, rtol=1e-10, atol=1e-12, err_msg=name)

    def scalar(params, x, h0, c0=None):
        return _loss(run_oracle(params, x, case.lengths, h0, c0, SEED, training), case, dh_all, dc_all)

    args = (case.params, case.x, case.h0) + ((case.c0,) if case.spec.has_cell else ())
    _, oracle = ar.value_and_grad(scalar, tuple(range(len(args))))(*args)
    np.testing.assert_allclose(grads.dparams.data, oracle[0].data, rtol=1e-9, atol=1e-11, err_msg="dparams")
    np.testing.assert_allclose(grads.dx, oracle[1], rtol=1e-9, atol=1e-11, err_msg="dx")
    np.testing.assert_allclose(grads.dh0, oracle[2], rtol=1e-9, atol=1e-11, err_msg="dh0")
    if case.spec.has_cell:
        np.testing.assert_allclose(grads.dc0, oracle[3], rtol=1e-9, atol=1e-11, err_msg="dc0")


def check_central_differences(case_id: str, fields: dict, T: int, B: int, lengths: str, engine: Any) -> None:
    """Independent of the scan oracle: d<y, dy> + <h_n, dh_n> + <c_n, dc_n> by float64 central differences
    of the engine's own training forward (same seed, so the same masks)."""
    case = variant_case(case_id, fields, T, B, lengths)
    _, grads = map(host, forward_backward(case, engine, seed=SEED))
    checks = {"params": grads.dparams.data, "x": grads.dx, "h0": grads.dh0}
    if case.spec.has_cell:
        checks["c0"] = grads.dc0
    for name, analytic in checks.items():
        if xp_of(engine) is not np:  # a GPU stand-in: along random directions (as test_rnn_gradcheck)
            check_directions(analytic, case, engine, name, training=True, seed=SEED)
            continue
        numeric = numeric_gradient(case, engine, name, training=True, seed=SEED)
        np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-7, err_msg=f"d loss / d {name}")
