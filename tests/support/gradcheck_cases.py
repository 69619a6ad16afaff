"""tests/test_rnn_gradcheck.py's cases and body (shared with test_layer_norm.py, which runs them with layer
norm)."""

from __future__ import annotations

import numpy as np

from arrayrnn import RNNSpec
from support.finite_differences import check_directions, numeric_gradient
from support.rnn_cases import forward, forward_backward, host, make_case, xp_of

# id, spec fields, T, B, lengths, forward kwargs
CASES = [
    ("gru-reset-before-bi", dict(mode="gru", reset_after=False, num_layers=2, bidirectional=True), 4, 3,
     "unsorted", {}),
    ("gru-reset-before-single_rec", dict(mode="gru", reset_after=False, bias="single_rec"), 4, 3, "unsorted",
     {}),
    ("gru-reset-before-single_inp", dict(mode="gru", reset_after=False, bias="single_inp"), 3, 2, "full", {}),
    ("gru-single_rec", dict(mode="gru", bias="single_rec", bidirectional=True), 4, 3, "unsorted", {}),
    ("gru-single_inp", dict(mode="gru", bias="single_inp"), 4, 2, "full", {}),
    ("lstm-single_inp-proj", dict(mode="lstm", bias="single_inp", proj_size=2), 4, 3, "unsorted", {}),
    ("lstm-single_rec", dict(mode="lstm", bias="single_rec", bidirectional=True), 3, 3, "unsorted", {}),
    ("rnn_tanh-single_rec", dict(mode="rnn_tanh", bias="single_rec", num_layers=2), 4, 2, "unsorted",
     {}),
    ("rnn_relu-single_inp", dict(mode="rnn_relu", bias="single_inp", bidirectional=True), 4, 3, "full", {}),
    ("lstm-clip-bi", dict(mode="lstm", cell_clip=0.4, num_layers=2, bidirectional=True), 4, 3, "unsorted",
     {}),
    ("lstm-clip-asym-proj", dict(mode="lstm", cell_clip=(-0.3, 0.5), proj_size=2), 5, 3, "unsorted", {}),
    ("lstm-zero-length-bi", dict(mode="lstm", num_layers=2, bidirectional=True, proj_size=2), 4, 4, "zeros",
     {}),
    ("gru-zero-length-bi", dict(mode="gru", bidirectional=True), 4, 3, "zeros", {}),
    ("rnn_relu-zero-length", dict(mode="rnn_relu", num_layers=2), 3, 3, "zeros", {}),
    ("lstm-dropout-bi", dict(mode="lstm", num_layers=3, bidirectional=True, dropout=0.4), 3, 3, "unsorted",
     dict(training=True, seed=7)),
    ("gru-reset-before-dropout", dict(mode="gru", num_layers=2, dropout=0.5, reset_after=False), 4, 2,
     "zeros", dict(training=True, seed=3)),
]

# the example custom cells (arrayrnn/cells/) through the same checks: every engine that runs custom cells
CUSTOM_CELL_CASES = [
    ("cifg-zero-length-bi", dict(mode="cifg", num_layers=2, bidirectional=True), 4, 3, "zeros", {}),
    ("cifg-single_rec-dropout", dict(mode="cifg", num_layers=2, bias="single_rec", dropout=0.4), 3, 3,
     "unsorted", dict(training=True, seed=5)),
    ("slstm-bi", dict(mode="slstm", bidirectional=True), 4, 3, "unsorted", {}),
]


def check_central_differences(case_id, fields, T, B, lengths, kw, engine):
    """Every entry of every gradient against central differences (along random directions on GPU array
    modules), with the case's clip and dropout shown to be active."""
    spec = RNNSpec(input_size=2, hidden_size=3, dtype="float64", **fields)
    case = make_case(spec, T, B, seed=len(case_id), lengths=lengths, scale=1.5)
    res, grads = map(host, forward_backward(case, engine, **{k: v for k, v in kw.items() if k != "training"}))
    checks = {"params": grads.dparams.data, "x": grads.dx, "h0": grads.dh0}
    if spec.has_cell:
        checks["c0"] = grads.dc0
    for name, analytic in checks.items():
        if xp_of(engine) is not np:
            check_directions(analytic, case, engine, name, **kw)
            continue
        numeric = numeric_gradient(case, engine, name, **kw)
        np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-7, err_msg=f"d loss / d {name}")
    forward_kw = {"training": True, **kw}
    if spec.cell_clip is not None:  # the clip must be active, or the check proves nothing about it
        unclipped = make_case(spec.replace(cell_clip=None), T, B, seed=len(case_id), lengths=lengths,
                              scale=1.5)
        assert not np.allclose(host(forward(unclipped, engine, **forward_kw).y), res.y)
    if spec.dropout:  # likewise the dropout
        assert not np.allclose(host(forward(case, engine).y), res.y)
    if case.lengths is not None and (case.lengths == 0).any():
        zero = case.lengths == 0
        assert not grads.dx[:, zero].any()
        np.testing.assert_array_equal(grads.dh0[:, zero], case.dh_n[:, zero])
