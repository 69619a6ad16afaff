"""Layer normalisation inside the recurrence (issue 38) on every engine that runs it, against the oracles:
the torch-ops oracle (``torch.nn.functional.layer_norm`` in float64, tests/support/layer_norm_oracle.py:
values to 1e-12, every gradient through torch's autograd), the ``ar.scan`` oracle of the cell variants with
the same formulas (tests/support/variant_oracle.py), float64 central differences of every gradient entry
(every gain and shift, ``x``, ``h0``, ``c0``), and the existing suites' bodies (the cell variants', the
plain central differences', the properties') re-run with ``layer_norm=True``. Engines that decline it are
tested for their reason, and ``"auto"`` for taking the next engine.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import gradcheck_cases, variant_checks
from support import rnn_properties as properties
from support.engine_cases import EngineOnDevice, engine_fixture, gpu_cases
from support.layer_norm_oracle import run as run_torch_oracle
from support.rnn_cases import forward, host, make_case, on_device, xp_of

import arrayrnn as ar
from arrayrnn import RNNSpec, rnn_backward, rnn_forward
from arrayrnn.engines import engine_unavailable_reason, engines_for, probe_call

_PROBE = RNNSpec("lstm", 2, 3, layer_norm=True, recurrent_dropout=0.5, weight_dropout=0.5, zoneout=0.5,
                 peepholes=True, dtype="float64")


def layer_norm_engines() -> list[EngineOnDevice]:
    """The CPU engines that run a layer-normalised training call with every variant (and, with a GPU, the
    GPU engines that do)."""
    def runs(name: str, xp) -> bool:
        return engine_unavailable_reason(name, probe_call(_PROBE, xp, training=True, all_states=True)) is None

    cpu = [EngineOnDevice(name, np) for name in engines_for("cpu") if runs(name, np)]
    return cpu + [case for case in gpu_cases() if runs(case, case.xp)]


engine = engine_fixture(layer_norm_engines())
SEED = 5

# id, spec fields (layer_norm=True added), T, B, lengths
CASES = [
    ("lstm-bi-2l-dropout", dict(mode="lstm", num_layers=2, bidirectional=True, dropout=0.3), 4, 3,
     "unsorted"),
    ("lstm-proj-peep-clip", dict(mode="lstm", proj_size=2, peepholes=True, cell_clip=0.6), 4, 3, "zeros"),
    ("lstm-all-variants", dict(mode="lstm", num_layers=2, bidirectional=True, recurrent_dropout=0.3,
                               weight_dropout=0.4, zoneout=0.3, zoneout_cell=0.5, peepholes=True), 4, 3,
     "unsorted"),
    ("lstm-single_inp-zoneout-proj", dict(mode="lstm", bias="single_inp", zoneout=0.4, proj_size=2), 3, 2,
     "full"),
    ("gru-bi-2l-single_rec", dict(mode="gru", num_layers=2, bidirectional=True, bias="single_rec",
                                  dropout=0.3), 4, 3, "zeros"),
    ("gru-all-variants", dict(mode="gru", bidirectional=True, recurrent_dropout=0.4, weight_dropout=0.3,
                              zoneout=0.4), 4, 3, "unsorted"),
    ("gru-reset-before-2l-variants", dict(mode="gru", reset_after=False, num_layers=2, recurrent_dropout=0.4,
                                          weight_dropout=0.3, zoneout=0.4), 4, 2, "zeros"),
    ("gru-reset-before-single_inp-bi", dict(mode="gru", reset_after=False, bias="single_inp",
                                            bidirectional=True), 3, 3, "unsorted"),
    ("rnn_tanh-bi-2l-variants", dict(mode="rnn_tanh", num_layers=2, bidirectional=True, recurrent_dropout=0.4,
                                     weight_dropout=0.3, zoneout=0.4), 3, 3, "unsorted"),
    ("rnn_relu-no-bias", dict(mode="rnn_relu", bias="none"), 4, 2, "full"),
]
LN_CASES = [(case_id, {**fields, "layer_norm": True}, T, B, lengths)
            for case_id, fields, T, B, lengths in CASES]
IDS = [c[0] for c in LN_CASES]
UNCLIPPED = [c for c in LN_CASES if "cell_clip" not in c[1]]  # the scan oracle has no cell clipping


def _cotangents(case, res) -> dict[str, np.ndarray | None]:
    rng = np.random.default_rng(1)
    c = case.spec.has_cell
    return {"y": case.dy, "h_n": case.dh_n, "c_n": case.dc_n, "h_all": rng.standard_normal(res.h_all.shape),
            "c_all": rng.standard_normal(res.c_all.shape) if c else None}


# -- the oracles -------------------------------------------------------------------------------------
@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
@pytest.mark.parametrize("case_id, fields, T, B, lengths", LN_CASES, ids=IDS)
def test_values_and_every_gradient_equal_the_torch_oracle(case_id, fields, T, B, lengths, training, engine):
    """Values to 1e-12 (float64) and every gradient (params: every gain and shift too, x, h0, c0) of
    ``<y, dy> + <h_n, dh_n> + <c_n, dc_n> + <h_all, .> + <c_all, .>`` against torch's autograd of the
    oracle."""
    _check_against_the_torch_oracle(case_id, fields, T, B, lengths, training, engine)


# the numba engine's plans at two threads (engines/numba/plan.py): id, spec fields, T, B, the schedule, the
# column split's parts (any step large enough for it: small sizes, the same code)
NUMBA_PLANS = [
    ("rows-split", dict(mode="lstm", peepholes=True), 5, 20, None, 1),
    ("lstm-columns", dict(mode="lstm", num_layers=2, hidden_size=10, weight_dropout=0.3), 6, 12, None, 2),
    ("layers-pipelined", dict(mode="lstm", num_layers=2, proj_size=2), 9, 12, "layers", 1),
    ("directions", dict(mode="gru", bidirectional=True, recurrent_dropout=0.3), 5, 12, "directions", 1),
    ("gru-rows-split", dict(mode="gru", num_layers=2, zoneout=0.3), 5, 20, None, 1),
    ("gru-reset-after-pipelined", dict(mode="gru", num_layers=2, hidden_size=10), 9, 12, "layers", 1),
    ("gru-reset-before-pipelined", dict(mode="gru", reset_after=False, num_layers=2), 9, 12, "layers", 1),
    ("rnn-rows-split", dict(mode="rnn_relu", num_layers=2, weight_dropout=0.3), 4, 33, None, 1),
]


@pytest.mark.parametrize("case_id, fields, T, B, schedule, columns", NUMBA_PLANS,
                         ids=[c[0] for c in NUMBA_PLANS])
def test_the_numba_engines_split_loops_and_schedules_equal_the_torch_oracle(case_id, fields, T, B, schedule,
                                                                            columns, monkeypatch):
    """Rows split over threads, the LSTM's hidden units split (the parts meet three times a step: a
    normalised row needs every unit; the GRU's column split does not run), a stack's layers pipelined over
    chunks of time, a bidirectional layer's directions side by side: each of the numba engine's plans
    against the oracle, lengths unsorted."""
    from arrayrnn.engines import thresholds
    from arrayrnn.engines.numba.plan import forward_plan

    monkeypatch.setattr(thresholds, "COLUMN_SPLIT_MIN_STEP_FMAS", 0)
    monkeypatch.setattr(thresholds, "MIN_SPLIT_CALL_FMAS", 0)   # these small calls split as large ones do
    fields = {**fields, "layer_norm": True}
    spec = variant_checks.variant_spec(fields)
    plan = forward_plan(spec, np.zeros((T, B, spec.input_size)), np.full(T, B), threads=2)
    assert (plan.schedule, plan.column_parts) == (schedule, columns)
    assert plan.row_threads == (2 if B >= 16 and schedule is None else 1)
    threads = ar.get_num_threads()
    ar.set_num_threads(2)
    numba = EngineOnDevice("numba", np)
    try:
        for training in (True, False):
            _check_against_the_torch_oracle(case_id, fields, T, B, "unsorted", training, numba)
    finally:
        ar.set_num_threads(threads)


def _check_against_the_torch_oracle(case_id, fields, T, B, lengths, training, engine):
    case = variant_checks.variant_case(case_id, fields, T, B, lengths)
    dev, xp = on_device(case, engine), xp_of(engine)
    res = rnn_forward(dev.params, dev.x, dev.lengths, dev.h0, dev.c0, training=training, seed=SEED,
                      engine=engine, return_all_states=True)
    cot = _cotangents(case, res)
    grads = host(rnn_backward(res, dev.dy, dev.dh_n, dev.dc_n, dh_all=xp.asarray(cot["h_all"]),
                              dc_all=xp.asarray(cot["c_all"]) if cot["c_all"] is not None else None))
    oracle = run_torch_oracle(case.params, case.x, case.lengths, case.h0, case.c0, SEED, training, cot)
    for name, value in oracle.outputs.items():
        if value is not None:
            np.testing.assert_allclose(host(getattr(res, name)), value, rtol=1e-12, atol=1e-12, err_msg=name)
    mine = {"params": grads.dparams.data, "x": grads.dx, "h0": grads.dh0, "c0": grads.dc0}
    for name, value in oracle.grads.items():
        if value is not None:
            np.testing.assert_allclose(mine[name], value, rtol=1e-10, atol=1e-12, err_msg=f"d {name}")


@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
@pytest.mark.parametrize("case_id, fields, T, B, lengths", UNCLIPPED, ids=[c[0] for c in UNCLIPPED])
def test_values_and_every_gradient_equal_the_scan_oracle(case_id, fields, T, B, lengths, training, engine):
    """The cell variants' body (tests/test_cell_variants.py) with layer norm: ``ar.scan`` of the same
    formulas, values and every gradient through ``ar.value_and_grad``."""
    variant_checks.check_against_the_scan_oracle(case_id, fields, T, B, lengths, training, engine)


@pytest.mark.parametrize("case_id, fields, T, B, lengths", LN_CASES, ids=IDS)
def test_every_gradient_entry_equals_central_differences(case_id, fields, T, B, lengths, engine):
    """The cell variants' central differences (every entry of every gradient; the same seed, so the same
    masks) with layer norm."""
    variant_checks.check_central_differences(case_id, fields, T, B, lengths, engine)


GRADCHECK_CASES = [(case_id, {**fields, "layer_norm": True}, T, B, lengths, kw)
                   for case_id, fields, T, B, lengths, kw in gradcheck_cases.CASES]


@pytest.mark.parametrize("case_id, fields, T, B, lengths, kw", GRADCHECK_CASES,
                         ids=[c[0] for c in GRADCHECK_CASES])
def test_central_differences_of_the_plain_suite(case_id, fields, T, B, lengths, kw, engine):
    """tests/test_rnn_gradcheck.py's cases (single biases, reset-before GRU, clipping, zero-length rows,
    dropout) with layer norm."""
    gradcheck_cases.check_central_differences(case_id, fields, T, B, lengths, kw, engine)


# -- the properties, with layer norm -------------------------------------------------------------
@properties.SETTINGS
@given(data=st.data(), spec=properties.specs(layer_norm=True), T=st.integers(1, 5), B=st.integers(1, 4),
       seed=st.integers(0, 1000))
def test_rows_are_independent(engine, data, spec, T, B, seed):
    properties.check_rows_are_independent(engine, data, spec, T, B, seed)


@properties.SETTINGS
@given(data=st.data(), spec=properties.specs(layer_norm=True), T=st.integers(1, 5), B=st.integers(1, 4),
       seed=st.integers(0, 1000))
def test_zero_length_rows_pass_state_through(engine, data, spec, T, B, seed):
    properties.check_zero_length_rows_pass_state_through(engine, data, spec, T, B, seed)


@properties.SETTINGS
@given(data=st.data(), spec=properties.specs(bidirectional=False, layer_norm=True), T=st.integers(2, 7),
       B=st.integers(1, 3), seed=st.integers(0, 1000))
def test_chunks_equal_whole_sequence(engine, data, spec, T, B, seed):
    properties.check_chunks_equal_whole_sequence(engine, data, spec, T, B, seed)


# -- what a layer norm changes, and what it keeps ------------------------------------------------------
@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh"])
def test_layer_norm_changes_the_result_and_the_statistics_are_kept_per_row_and_step(mode, engine):
    """The norm acts (so the oracle tests prove something); the cache keeps 2 statistics per normalised row
    per step and row (LSTM: the recurrent product and the cell, 4 elements; GRU, RNN: 2)."""
    spec = RNNSpec(mode, 3, 4, dtype="float64")
    plain = make_case(spec, 5, 3, seed=2)
    normed = plain.with_(params=ar.PackedParams.init(spec.replace(layer_norm=True), seed=3))
    ln_view = normed.params.named_views()
    for name, view in plain.params.named_views().items():
        ln_view[name][...] = view
    a, b = host(forward(plain, engine).y), host(forward(normed, engine).y)
    assert not np.allclose(a, b)
    res = forward(normed, engine, training=True)
    stats = res._saved.cache.layers[0][0].cache.norm_stats
    assert stats.shape == (5, 3, 2 if mode == "lstm" else 1, 2)


def test_reset_before_gru_normalises_its_two_recurrent_parts_over_their_own_rows():
    """reset_after=False: the r, z part (2H wide) and the n part W_hn (r * h) (H wide) each over its own row:
    the statistics hold two rows per step."""
    spec = RNNSpec("gru", 2, 3, reset_after=False, layer_norm=True, dtype="float64")
    res = forward(make_case(spec, 4, 2), "reference", training=True)
    assert res._saved.cache.layers[0][0].cache.norm_stats.shape == (4, 2, 2, 2)
    assert spec.norms_per_step == 2 and spec.replace(reset_after=True).norms_per_step == 1
