"""Layer normalisation (issue 38) in the cupy engine's kernels, under numba's CUDA simulator.

The block-per-row kernels (:func:`~arrayrnn.engines.cupy.kernels.norm_step`, ``norm_backward_step``, the
LSTM's ``lstm_norm_forward_step`` / ``lstm_norm_backward_step``) against the reference engine through the same
stack driver, to 1e-12 in float64, for every mode and the options they combine with; then the public path on
the CuPy stand-in (tests/test_layer_norm.py's bodies: the torch-ops oracle, central differences along random
directions, a property). The simulator's blocks are ``ROW_THREADS = 8`` wide (the GPU's 128): a row of
``H = 4`` leaves lanes idle and one of ``4H = 16`` gives each lane two columns.
"""

from __future__ import annotations

import numpy as np
import pytest
import test_layer_norm as ln_suite
from hypothesis import given, settings
from hypothesis import strategies as st
from support import rnn_properties as properties
from support.rnn_cases import _spread_norm_gains
from test_cuda_kernels_sim import REFERENCE, SIM, TOL, _inputs, _run

from arrayrnn import PackedParams, RNNSpec
from arrayrnn.engines.cupy import kernels as ck


def check(spec_fields: dict, T: int, lengths: list[int], seed: int = 0) -> None:
    """The cupy engine's kernels equal the reference engine's step functions, forward and every gradient."""
    spec = RNNSpec(input_size=3, hidden_size=4, dtype="float64", layer_norm=True, **spec_fields)
    params = PackedParams.init(spec, seed=seed)
    _spread_norm_gains(params, seed)
    inputs = _inputs(spec, T, lengths, seed)
    (ref, ref_g), (sim, sim_g) = _run(REFERENCE, params, inputs), _run(SIM, params, inputs)
    for name in ("y", "h_n", "c_n"):
        if getattr(ref, name) is not None:
            np.testing.assert_allclose(getattr(sim, name), getattr(ref, name), **TOL, err_msg=name)
    for name in ("dx", "dh0", "dc0"):
        if getattr(ref_g, name) is not None:
            np.testing.assert_allclose(getattr(sim_g, name), getattr(ref_g, name), **TOL, err_msg=name)
    for key, ref_view in ref_g.dparams.named_views().items():
        np.testing.assert_allclose(sim_g.dparams.named_views()[key], ref_view, **TOL, err_msg=key)
    if max(lengths) > 0:
        assert np.abs(ref_g.dparams.view(0, 0, "g_hh")).max() > 0  # the comparison is not between zeros
    stats = sim.cache.layers[0][0].cache.norm_stats
    np.testing.assert_allclose(stats, ref.cache.layers[0][0].cache.norm_stats, **TOL, err_msg="norm_stats")


UNSORTED = [2, 4, 0, 3]  # T = 4, with a zero-length row


def test_the_simulated_block_is_narrow():
    assert ck.ROW_THREADS == 8


@pytest.mark.parametrize("mode, reset_after", [("rnn_tanh", True), ("rnn_relu", True), ("lstm", True),
                                               ("gru", True), ("gru", False)])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_modes_both_directions_unsorted_lengths(mode, reset_after, bidirectional):
    check(dict(mode=mode, reset_after=reset_after, bidirectional=bidirectional), 4, UNSORTED)


@pytest.mark.parametrize("fields", [
    dict(mode="lstm", proj_size=2, peepholes=True, cell_clip=0.5),
    dict(mode="lstm", peepholes=True, bias="single_rec", zoneout_cell=0.0),
    dict(mode="lstm", bias="none", num_layers=2, dropout=0.5),
    dict(mode="gru", bias="single_rec", num_layers=2, bidirectional=True, dropout=0.5),
    dict(mode="gru", reset_after=False, bias="single_inp"),
    dict(mode="rnn_tanh", bias="single_rec", num_layers=2),
], ids=["lstm-proj-peep-clip", "lstm-peep-single_rec", "lstm-nobias-2l-dropout", "gru-single_rec-2l-bi",
        "gru-reset-before-single_inp", "rnn-single_rec-2l"])
def test_with_the_stacks_options(fields):
    check(fields, 3, [3, 0, 2])


@pytest.mark.parametrize("mode, reset_after", [("lstm", True), ("gru", True), ("gru", False),
                                               ("rnn_relu", True)])
def test_single_step_single_row_and_empty_rows(mode, reset_after):
    check(dict(mode=mode, reset_after=reset_after), 1, [1])
    check(dict(mode=mode, reset_after=reset_after, bidirectional=True), 2, [0, 0])


def test_a_hidden_size_wider_than_the_block():
    """H = 20 > ROW_THREADS = 8: the cell's row takes three passes of the block, the product's (80) ten."""
    spec = dict(mode="lstm", peepholes=True)
    base = RNNSpec(input_size=3, hidden_size=20, dtype="float64", layer_norm=True, **spec)
    params = PackedParams.init(base, seed=1)
    _spread_norm_gains(params, 1)
    inputs = _inputs(base, 3, [3, 1], 1)
    (ref, ref_g), (sim, sim_g) = _run(REFERENCE, params, inputs), _run(SIM, params, inputs)
    np.testing.assert_allclose(sim.y, ref.y, **TOL)
    np.testing.assert_allclose(sim_g.dparams.data, ref_g.dparams.data, **TOL)


@pytest.mark.parametrize("mode, reset_after", [("lstm", True), ("gru", True), ("gru", False),
                                               ("rnn_tanh", True)])
def test_float32_rows_near_1e20_are_reduced_in_float64(mode, reset_after):
    """A float32 row near 1e20 squares past float32's range: the block sums of the kernels' statistics (the
    recurrent product's, the cell's) were float32, the variance became inf (rstd 0: outputs off by 1 or
    more). Now float64, as the numba loops and the reference engine reduce (tests/test_hardening_io.py).
    The initial states carry the large values into the first step's recurrent product and cell."""
    spec = RNNSpec(input_size=4, hidden_size=3, layer_norm=True, mode=mode, reset_after=reset_after)
    params = PackedParams.init(spec, seed=1)
    x, lens, h0, c0, masks, cot = _inputs(spec, 3, [3, 2], 0)
    h0 = h0 * np.geomspace(1e19, 1e20, 3)
    c0 = None if c0 is None else c0 * np.geomspace(1e19, 1e20, 3)
    big = (x, lens, h0, c0, masks, cot)
    as32 = tuple(a.astype(np.float32) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a
                 for a in (x, lens, h0, c0, masks))
    assert np.isfinite(as32[2]).all() and np.abs(as32[2]).max() > 1e19
    sim, _ = _run(SIM, params, (*as32, tuple(None if a is None else a.astype(np.float32) for a in cot)))
    ref, _ = _run(REFERENCE, params.astype("float64"), big)
    assert sim.y.dtype == np.float32 and np.isfinite(sim.y).all()
    np.testing.assert_allclose(sim.y, ref.y, rtol=1e-3, atol=1e-4 * np.abs(ref.y).max())
    stats = sim.cache.layers[0][0].cache.norm_stats
    assert np.isfinite(stats).all() and np.abs(stats[..., 0]).max() > 1e18   # the large rows were normalised


@pytest.mark.parametrize("mode, reset_after", [("lstm", True), ("gru", False), ("rnn_tanh", True)])
def test_float64_rows_near_1e198_are_rescaled(mode, reset_after):
    """A float64 row near 1e198 squares past float64's range: the kernels' statistics took rstd 0 (outputs
    off with no error). Now the rare pass rescales by a power of two (gate_math.layer_norm_rstd_rescaled), as
    the numba loops and the reference engine do (tests/test_hardening_io.py checks those for scale
    invariance)."""
    spec = RNNSpec(input_size=4, hidden_size=3, layer_norm=True, mode=mode, reset_after=reset_after)
    params = PackedParams.init(spec, seed=1).astype("float64")
    x, lens, h0, c0, masks, cot = _inputs(spec, 3, [3, 2], 0)
    huge = 2.0 ** 660
    big = (x, lens, h0 * huge, c0, masks, cot)   # h0 enters the first step's normalised recurrent product
    sim, _ = _run(SIM, params, big)
    ref, _ = _run(REFERENCE, params, big)
    np.testing.assert_allclose(sim.y, ref.y, **TOL)
    stats = sim.cache.layers[0][0].cache.norm_stats
    assert np.isfinite(stats).all() and (stats[0, ..., 1] > 0).all()   # step 0: every row active, none zeroed


# -- the public path on the CuPy stand-in: tests/test_layer_norm.py's bodies --------------------------------
ORACLE_CASES = [c for c in ln_suite.LN_CASES if c[0] in ("lstm-all-variants", "lstm-proj-peep-clip",
                                                         "gru-all-variants", "gru-reset-before-2l-variants",
                                                         "rnn_tanh-bi-2l-variants")]


@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
@pytest.mark.parametrize("case_id, fields, T, B, lengths", ORACLE_CASES, ids=[c[0] for c in ORACLE_CASES])
def test_values_and_every_gradient_equal_the_torch_oracle(case_id, fields, T, B, lengths, training, engine):
    ln_suite.test_values_and_every_gradient_equal_the_torch_oracle(case_id, fields, T, B, lengths, training,
                                                                   engine)


@pytest.mark.parametrize("case_id, fields, T, B, lengths", ORACLE_CASES[:3],
                         ids=[c[0] for c in ORACLE_CASES[:3]])
def test_every_gradient_along_random_directions(case_id, fields, T, B, lengths, engine):
    ln_suite.test_every_gradient_entry_equals_central_differences(case_id, fields, T, B, lengths, engine)


@settings(properties.SETTINGS, max_examples=8)
@given(data=st.data(), spec=properties.specs(layer_norm=True), T=st.integers(1, 4), B=st.integers(1, 3),
       seed=st.integers(0, 1000))
def test_zero_length_rows_pass_state_through(engine, data, spec, T, B, seed):
    properties.check_zero_length_rows_pass_state_through(engine, data, spec, T, B, seed)
