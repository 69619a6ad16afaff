"""The cell variants (recurrent dropout, DropConnect on W_hh, zoneout, peepholes) and ``return_all_states``
on every engine that accepts them, against two oracles: a plain stack under ``ar.scan`` with the public
masks (values and, through ``ar.value_and_grad``, every gradient; tests/support/variant_oracle.py) and
float64 central differences of every gradient entry. Engines that decline them are tested for the reason.
"""

from __future__ import annotations

import numpy as np
import pytest
from support.engine_cases import EngineOnDevice, engine_fixture
from support.rnn_cases import forward, host, make_case
from support.variant_checks import (
    SEED,
    check_against_the_scan_oracle,
    check_central_differences,
    variant_case,
    variant_spec,
)

import arrayrnn as ar
from arrayrnn import RNNSpec, rnn_backward
from arrayrnn.engines import engine_unavailable_reason, engines_for, probe_call
from arrayrnn.engines.cudnn import config as cudnn_config

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
    ("lstm-proj-peep-zone", dict(mode="lstm", proj_size=2, peepholes=True, zoneout=0.4,
                                 recurrent_dropout=0.5), 4, 3, "zeros"),
    ("lstm-zoneout-h-only", dict(mode="lstm", zoneout=0.5, zoneout_cell=0.0, bidirectional=True), 3, 3,
     "zeros"),
    ("gru-all-bi", dict(mode="gru", bidirectional=True, recurrent_dropout=0.4, weight_dropout=0.3,
                        zoneout=0.4), 4, 3, "unsorted"),
    ("gru-reset-before-2l", dict(mode="gru", reset_after=False, num_layers=2, recurrent_dropout=0.4,
                                 weight_dropout=0.3, zoneout=0.4, bias="single_rec"), 4, 2, "zeros"),
    ("rnn_tanh-all", dict(mode="rnn_tanh", num_layers=2, bidirectional=True, recurrent_dropout=0.4,
                          weight_dropout=0.3, zoneout=0.4), 3, 3, "unsorted"),
    ("rnn_relu-zoneout", dict(mode="rnn_relu", zoneout=0.5, bias="single_inp"), 4, 2, "full"),
    ("lstm-peepholes-only", dict(mode="lstm", peepholes=True), 4, 2, "full"),
]
@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
@pytest.mark.parametrize("case_id, fields, T, B, lengths", CASES, ids=[c[0] for c in CASES])
def test_values_and_every_gradient_equal_the_scan_oracle(case_id, fields, T, B, lengths, training, engine):
    check_against_the_scan_oracle(case_id, fields, T, B, lengths, training, engine)


@pytest.mark.parametrize("case_id, fields, T, B, lengths", CASES, ids=[c[0] for c in CASES])
def test_every_gradient_entry_equals_central_differences(case_id, fields, T, B, lengths, engine):
    """Independent of the scan oracle: float64 central differences of the engine's own training forward
    (same seed, so the same masks)."""
    check_central_differences(case_id, fields, T, B, lengths, engine)


@pytest.mark.parametrize("field, value", [("recurrent_dropout", 0.5), ("weight_dropout", 0.5),
                                          ("zoneout", 0.5), ("zoneout_cell", 0.5), ("peepholes", True)])
def test_each_variant_changes_the_result_and_dropouts_only_in_training(field, value, engine):
    """Each variant acts (so the oracle tests prove something about it); the dropouts act in training only,
    zoneout and peepholes in inference too."""
    plain = make_case(variant_spec(dict(mode="lstm", peepholes=field == "peepholes")), 5, 3, seed=2)
    if field == "peepholes":
        plain.params.view(0, 0, "P")[...] = 0.0  # zero peepholes compute the plain LSTM
        with_variant = variant_case("x", dict(mode="lstm", peepholes=True), 5, 3, "unsorted")
        with_variant = plain.with_(params=with_variant.params)
    else:
        spec = plain.spec.replace(**{field: value})
        with_variant = plain.with_(params=ar.PackedParams(spec, plain.params.data))
    for training in (True, False):
        a = host(forward(plain, engine, training=training, seed=SEED).y)
        b = host(forward(with_variant, engine, training=training, seed=SEED).y)
        acts = training or field in ("zoneout", "zoneout_cell", "peepholes")
        assert not np.allclose(a, b) if acts else np.array_equal(a, b), (field, training)


def test_all_states_of_a_plain_stack_are_its_layers_outputs(engine):
    """h_all's last layer is y; its last active step is h_n; c_all's is c_n; zeros past each row's end,
    whatever the layout of x (batch_first)."""
    spec = RNNSpec("lstm", 2, 3, num_layers=2, bidirectional=True, proj_size=2, dtype="float64")
    case = make_case(spec, 5, 4, lengths="zeros", batch_first=True)
    res = host(forward(case, engine, return_all_states=True))
    T, B = 5, 4
    assert res.h_all.shape == (4, T, B, 2) and res.c_all.shape == (4, T, B, 3)
    y = np.swapaxes(res.y, 0, 1)
    np.testing.assert_array_equal(np.concatenate([res.h_all[2], res.h_all[3]], axis=-1), y)
    for b, n in enumerate(case.lengths):
        assert not res.h_all[:, n:, b].any() and not res.c_all[:, n:, b].any()
        if n:
            np.testing.assert_array_equal(res.h_all[0::2, n - 1, b], res.h_n[0::2, b])  # forward: last step
            np.testing.assert_array_equal(res.h_all[1::2, 0, b], res.h_n[1::2, b])      # reverse: t = 0
            np.testing.assert_array_equal(res.c_all[0::2, n - 1, b], res.c_n[0::2, b])
    assert forward(case, engine).h_all is None


def test_all_states_cotangent_errors():
    spec = RNNSpec("gru", 2, 3, dtype="float64")
    case = make_case(spec, 3, 2)
    res = forward(case, "reference")
    with pytest.raises(ValueError, match=r"dh_all was given but res has no h_all .*return_all_states=True"):
        rnn_backward(res, dh_all=np.zeros((1, 3, 2, 3)))
    res = forward(case, "reference", return_all_states=True)
    with pytest.raises(ValueError, match=r"dc_all was given but mode = 'gru' has no cell state"):
        rnn_backward(res, dc_all=np.zeros((1, 3, 2, 3)))
    with pytest.raises(ValueError, match=r"dh_all has shape \(1, 3, 2, 2\); expected res.h_all's shape"):
        rnn_backward(res, dh_all=np.zeros((1, 3, 2, 2)))
    with pytest.raises(TypeError, match=r"return_all_states = 1; expected True or False"):
        forward(case, "reference", return_all_states=1)


def test_cudnn_declines_each_variant_with_its_reason_and_auto_takes_the_numba_engine():
    plain = RNNSpec("lstm", 2, 3, dtype="float64")
    for fields, training, all_states in [(dict(recurrent_dropout=0.1), True, False),
                                         (dict(weight_dropout=0.1), True, False),
                                         (dict(zoneout=0.1), False, False),
                                         (dict(zoneout_cell=0.1), False, False),
                                         (dict(peepholes=True), False, False), ({}, False, True)]:
        call = probe_call(plain.replace(**fields), training=training, all_states=all_states)
        phrase = next(iter(fields), "return_all_states")
        assert phrase in (cudnn_config.variant_refusal(call) or cudnn_config.refusal(call.spec))
        assert engine_unavailable_reason("numba", call) is None
        case = make_case(call.spec, 3, 2)
        assert forward(case, "auto", training=training, return_all_states=all_states).engine == "numba"
