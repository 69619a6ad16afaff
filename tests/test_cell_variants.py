"""The cell variants (recurrent dropout, DropConnect on W_hh, zoneout, peepholes) and ``return_all_states``
on every engine that accepts them, against two oracles: a plain stack under ``ar.scan`` with the public
masks (values and, through ``ar.value_and_grad``, every gradient; tests/support/variant_oracle.py) and
float64 central differences of every gradient entry. Engines that decline them are tested for the reason.
"""

from __future__ import annotations

import numpy as np
import pytest
from support.engine_cases import EngineOnDevice, engine_fixture
from support.rnn_cases import host, make_case, on_device, xp_of
from support.variant_oracle import run_oracle

import arrayrnn as ar
from arrayrnn import EngineUnavailableError, PackedParams, RNNSpec, rnn_backward, rnn_forward
from arrayrnn.engines import engine_unavailable_reason, engines_for, probe_call

_VARIANT_PROBE = RNNSpec("lstm", 2, 3, recurrent_dropout=0.5, weight_dropout=0.5, zoneout=0.5, peepholes=True,
                         dtype="float64")


def variant_engines() -> list[EngineOnDevice]:
    """The CPU engines that accept every variant (a training call with all of them, all states)."""
    call = probe_call(_VARIANT_PROBE, training=True, all_states=True)
    return [EngineOnDevice(name, np) for name in engines_for("cpu")
            if engine_unavailable_reason(name, call) is None]


engine = engine_fixture(variant_engines())

# id, spec fields, T, B, lengths
CASES = [
    ("lstm-all-bi-2l", dict(mode="lstm", num_layers=2, bidirectional=True, recurrent_dropout=0.3,
                            weight_dropout=0.4, zoneout=0.3, zoneout_cell=0.5, peepholes=True, dropout=0.3),
     4, 3, "unsorted"),
    ("lstm-proj-peep-zone", dict(mode="lstm", proj_size=2, peepholes=True, zoneout=0.4, recurrent_dropout=0.5),
     4, 3, "zeros"),
    ("lstm-zoneout-h-only", dict(mode="lstm", zoneout=0.5, zoneout_cell=0.0, bidirectional=True), 3, 3, "zeros"),
    ("gru-all-bi", dict(mode="gru", bidirectional=True, recurrent_dropout=0.4, weight_dropout=0.3, zoneout=0.4),
     4, 3, "unsorted"),
    ("gru-reset-before-2l", dict(mode="gru", reset_after=False, num_layers=2, recurrent_dropout=0.4,
                                 weight_dropout=0.3, zoneout=0.4, bias="single_rec"), 4, 2, "zeros"),
    ("rnn_tanh-all", dict(mode="rnn_tanh", num_layers=2, bidirectional=True, recurrent_dropout=0.4,
                          weight_dropout=0.3, zoneout=0.4), 3, 3, "unsorted"),
    ("rnn_relu-zoneout", dict(mode="rnn_relu", zoneout=0.5, bias="single_inp"), 4, 2, "full"),
    ("lstm-peepholes-only", dict(mode="lstm", peepholes=True), 4, 2, "full"),
]
SEED = 5


def _spec(fields: dict) -> RNNSpec:
    return RNNSpec(input_size=2, hidden_size=3, dtype="float64", **fields)


def _case(case_id: str, fields: dict, T: int, B: int, lengths: str):
    case = make_case(_spec(fields), T, B, seed=len(case_id), lengths=lengths, scale=1.5)
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


@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
@pytest.mark.parametrize("case_id, fields, T, B, lengths", CASES, ids=[c[0] for c in CASES])
def test_values_and_every_gradient_equal_the_scan_oracle(case_id, fields, T, B, lengths, training, engine):
    case = _case(case_id, fields, T, B, lengths)
    dev = on_device(case, engine)
    res = rnn_forward(dev.params, dev.x, dev.lengths, dev.h0, dev.c0, training=training, seed=SEED,
                      engine=engine, return_all_states=True)
    dh_all, dc_all = _all_cotangents(case, res)
    grads = host(rnn_backward(res, dev.dy, dev.dh_n, dev.dc_n, dh_all=dh_all, dc_all=dc_all))
    expected = run_oracle(case.params, case.x, case.lengths, case.h0, case.c0, SEED, training)
    for name, value in expected.items():
        if value is not None:
            np.testing.assert_allclose(host(getattr(res, name)), value, rtol=1e-10, atol=1e-12, err_msg=name)

    def scalar(params, x, h0, c0):
        return _loss(run_oracle(params, x, case.lengths, h0, c0, SEED, training), case, dh_all, dc_all)

    args = (case.params, case.x, case.h0, case.c0) if case.spec.has_cell else (case.params, case.x, case.h0)
    _, oracle = ar.value_and_grad(lambda *a: scalar(*a, None) if len(a) == 3 else scalar(*a),
                                  tuple(range(len(args))))(*args)
    np.testing.assert_allclose(grads.dparams.data, oracle[0].data, rtol=1e-9, atol=1e-11, err_msg="dparams")
    np.testing.assert_allclose(grads.dx, oracle[1], rtol=1e-9, atol=1e-11, err_msg="dx")
    np.testing.assert_allclose(grads.dh0, oracle[2], rtol=1e-9, atol=1e-11, err_msg="dh0")
    if case.spec.has_cell:
        np.testing.assert_allclose(grads.dc0, oracle[3], rtol=1e-9, atol=1e-11, err_msg="dc0")
