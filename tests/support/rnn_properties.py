"""The property bodies of tests/test_rnn_properties.py (shared with test_layer_norm.py)."""


from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from arrayrnn import RNNSpec, rnn_backward, rnn_forward
from support.rnn_cases import forward_backward, host, make_case, on_device

SETTINGS = settings(max_examples=50, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
CLOSE = dict(rtol=1e-10, atol=1e-12)


@st.composite
def specs(draw, bidirectional=None, layer_norm=False):
    mode = draw(st.sampled_from(["rnn_tanh", "rnn_relu", "lstm", "gru"]))
    fields = dict(mode=mode, input_size=draw(st.integers(1, 3)), hidden_size=draw(st.integers(1, 3)),
                  num_layers=draw(st.integers(1, 2)), dtype="float64", layer_norm=layer_norm,
                  bidirectional=draw(st.booleans()) if bidirectional is None else bidirectional,
                  bias=draw(st.sampled_from(["double", "single_inp", "single_rec", "none"])))
    if mode == "lstm":
        if fields["hidden_size"] > 1 and draw(st.booleans()):
            fields["proj_size"] = fields["hidden_size"] - 1
        fields["cell_clip"] = draw(st.sampled_from([None, 0.7]))
    if mode == "gru":
        fields["reset_after"] = draw(st.booleans())
    return RNNSpec(**fields)


@st.composite
def lengths_for(draw, T: int, B: int):
    return np.array(draw(st.lists(st.integers(0, T), min_size=B, max_size=B)), dtype=np.int64)


def check_rows_are_independent(engine, data, spec, T, B, seed):
    """Each row's outputs and gradients equal those of a batch holding only that row; the batched
    parameter gradient is the sum of the per-row ones."""
    case = make_case(spec, T, B, seed=seed).with_(lengths=data.draw(lengths_for(T, B)))
    res, grads = map(host, forward_backward(case, engine))
    dparams_sum = np.zeros_like(grads.dparams.data)
    for b in range(B):
        rows = slice(b, b + 1)
        one = case.with_(x=case.x[:, rows], lengths=case.lengths[rows], h0=case.h0[:, rows],
                         c0=case.c0[:, rows] if spec.has_cell else None, dy=case.dy[:, rows],
                         dh_n=case.dh_n[:, rows], dc_n=case.dc_n[:, rows] if spec.has_cell else None)
        r1, g1 = map(host, forward_backward(one, engine))
        np.testing.assert_allclose(res.y[:, rows], r1.y, **CLOSE)
        np.testing.assert_allclose(res.h_n[:, rows], r1.h_n, **CLOSE)
        np.testing.assert_allclose(grads.dx[:, rows], g1.dx, **CLOSE)
        np.testing.assert_allclose(grads.dh0[:, rows], g1.dh0, **CLOSE)
        if spec.has_cell:
            np.testing.assert_allclose(res.c_n[:, rows], r1.c_n, **CLOSE)
            np.testing.assert_allclose(grads.dc0[:, rows], g1.dc0, **CLOSE)
        dparams_sum += g1.dparams.data
    np.testing.assert_allclose(grads.dparams.data, dparams_sum, rtol=1e-9, atol=1e-11)


def check_zero_length_rows_pass_state_through(engine, data, spec, T, B, seed):
    lengths = data.draw(lengths_for(T, B))
    zero = data.draw(st.lists(st.integers(0, B - 1), min_size=1, max_size=B))
    lengths[zero] = 0
    case = make_case(spec, T, B, seed=seed).with_(lengths=lengths)
    res, grads = map(host, forward_backward(case, engine))
    z = lengths == 0
    assert not res.y[:, z].any() and not grads.dx[:, z].any()
    np.testing.assert_array_equal(res.h_n[:, z], case.h0[:, z])
    np.testing.assert_array_equal(grads.dh0[:, z], case.dh_n[:, z])
    if spec.has_cell:
        np.testing.assert_array_equal(res.c_n[:, z], case.c0[:, z])
        np.testing.assert_array_equal(grads.dc0[:, z], case.dc_n[:, z])
    for b in range(B):  # and every row is zero past its end
        assert not res.y[lengths[b]:, b].any()
    if z.all():
        assert not grads.dparams.data.any()


def check_chunks_equal_whole_sequence(engine, data, spec, T, B, seed):
    """Truncated BPTT: chunks chained through h_n/c_n give the whole sequence's outputs, and the chunk
    gradients chained through dh0 -> dh_n give the whole sequence's gradients."""
    lengths = data.draw(lengths_for(T, B))
    cuts = sorted(data.draw(st.sets(st.integers(1, T - 1), min_size=1, max_size=3)))
    bounds = list(zip([0, *cuts], [*cuts, T], strict=True))
    case = on_device(make_case(spec, T, B, seed=seed).with_(lengths=lengths), engine)
    whole, whole_grads = map(host, forward_backward(case, engine))

    results, state = [], (case.h0, case.c0)  # on the engine's device, chained as a user would
    for start, stop in bounds:
        chunk_lengths = np.clip(lengths - start, 0, stop - start)
        res = rnn_forward(case.params, case.x[start:stop], chunk_lengths, *state, training=True,
                          engine=engine)
        results.append(res)
        state = (res.h_n, res.c_n)
    np.testing.assert_allclose(np.concatenate([host(r.y) for r in results]), whole.y, **CLOSE)
    np.testing.assert_allclose(host(state[0]), whole.h_n, **CLOSE)
    if spec.has_cell:
        np.testing.assert_allclose(host(state[1]), whole.c_n, **CLOSE)

    dxs, dparams, carry = [], np.zeros_like(whole_grads.dparams.data), (case.dh_n, case.dc_n)
    for (start, stop), res in reversed(list(zip(bounds, results, strict=True))):
        g = rnn_backward(res, case.dy[start:stop], *carry)
        dxs.insert(0, host(g.dx))
        dparams += host(g.dparams.data)
        carry = (g.dh0, g.dc0)
    np.testing.assert_allclose(np.concatenate(dxs), whole_grads.dx, **CLOSE)
    np.testing.assert_allclose(host(carry[0]), whole_grads.dh0, **CLOSE)
    if spec.has_cell:
        np.testing.assert_allclose(host(carry[1]), whole_grads.dc0, **CLOSE)
    np.testing.assert_allclose(dparams, whole_grads.dparams.data, rtol=1e-9, atol=1e-11)
