"""rnn_forward / rnn_backward against PyTorch CPU: outputs, final states and every gradient, block by block.

Variable lengths go through ``pack_padded_sequence(enforce_sorted=False)`` on the PyTorch side.
"""

from __future__ import annotations

import pytest
from support.rnn_cases import assert_close, forward_backward, make_case, tolerances
from support.torch_oracle import run_torch

from arrayrnn import RNNSpec

# mode, layers, bidirectional, proj_size, bias, batch_first, lengths, T, B, with_state
GRID = [
    ("rnn_tanh", 1, False, 0, True, False, "full", 5, 3, True),
    ("rnn_tanh", 2, True, 0, False, True, "unsorted", 6, 4, True),
    ("rnn_tanh", 2, True, 0, True, False, "unsorted", 4, 1, False),
    ("rnn_relu", 1, True, 0, True, False, "unsorted", 5, 3, True),
    ("rnn_relu", 3, False, 0, True, True, "full", 4, 2, False),
    ("lstm", 1, False, 0, True, False, "full", 5, 3, True),
    ("lstm", 2, True, 0, True, False, "unsorted", 6, 4, True),
    ("lstm", 3, True, 2, True, True, "unsorted", 5, 3, True),
    ("lstm", 1, False, 2, False, False, "short", 5, 4, False),
    ("lstm", 2, False, 0, False, True, "sorted", 4, 3, True),
    ("lstm", 2, True, 2, True, False, "full", 1, 1, True),
    ("lstm", 1, True, 0, True, True, "unsorted", 1, 4, True),
    ("gru", 1, False, 0, True, False, "full", 5, 3, True),
    ("gru", 2, True, 0, True, True, "unsorted", 6, 4, True),
    ("gru", 3, False, 0, False, False, "short", 4, 3, False),
    ("gru", 1, True, 0, True, False, "full", 1, 1, True),
    ("gru", 2, True, 0, True, False, "sorted", 5, 1, True),
]


def _id(row) -> str:
    mode, layers, bi, proj, bias, bf, lengths, T, B, state = row
    return (f"{mode}-L{layers}{'-bi' if bi else ''}{f'-p{proj}' if proj else ''}{'' if bias else '-nobias'}"
            f"{'-bf' if bf else ''}-{lengths}-T{T}B{B}{'' if state else '-nostate'}")


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("row", GRID, ids=[_id(r) for r in GRID])
def test_matches_torch(row, dtype, engine):
    mode, layers, bi, proj, bias, batch_first, lengths, T, B, with_state = row
    spec = RNNSpec(mode=mode, input_size=3, hidden_size=4, num_layers=layers, bidirectional=bi,
                   proj_size=proj, bias=bias, dtype=dtype)
    case = make_case(spec, T, B, seed=T * 10 + B, lengths=lengths, batch_first=batch_first,
                     with_state=with_state)
    res, grads = forward_backward(case, engine)

    L = layers * spec.num_directions
    h0 = case.h0 if case.h0 is not None else 0 * case.dh_n
    c0 = case.c0 if case.c0 is not None or not spec.has_cell else 0 * case.dc_n
    ref = run_torch(case.params, case.x, case.lengths, h0, c0, case.dy, case.dh_n, case.dc_n, batch_first)
    tol = tolerances(dtype)
    assert res.y.shape == ref.y.shape and res.h_n.shape == (L, B, spec.output_size)
    assert_close(res.y, ref.y, "y", **tol)
    assert_close(res.h_n, ref.h_n, "h_n", **tol)
    assert_close(grads.dx, ref.dx, "dx", **tol)
    assert_close(grads.dh0, ref.dh0, "dh0", **tol)
    if spec.has_cell:
        assert_close(res.c_n, ref.c_n, "c_n", **tol)
        assert_close(grads.dc0, ref.dc0, "dc0", **tol)
    else:
        assert res.c_n is None and grads.dc0 is None
    views = grads.dparams.named_views()
    assert set(views) == set(ref.grads)
    for key, expected in ref.grads.items():
        assert_close(views[key], expected, f"dparams[{key}]", **tol)
    assert grads.dparams.spec == spec and grads.dparams.format == case.params.format
    assert grads.dparams.data.dtype == case.params.data.dtype
