"""Every bad input of rnn_forward / rnn_backward is a ValueError or TypeError naming the argument, the value
and what was expected; an engine that cannot run here is an EngineUnavailableError."""

from __future__ import annotations

import numpy as np
import pytest

import arrayrnn as ar
from arrayrnn import EngineUnavailableError, PackedParams, RNNSpec, rnn_backward, rnn_forward

T, B = 12, 4
SMALL = ar.RNNSpec(mode="lstm", input_size=2, hidden_size=3)
GRU = RNNSpec(mode="gru", input_size=3, hidden_size=5, num_layers=2, dtype="float64")
LSTM = RNNSpec(mode="lstm", input_size=3, hidden_size=5, proj_size=2, bidirectional=True, dtype="float64")


def _x(spec: RNNSpec = GRU, shape=(T, B, 3)) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(shape).astype(spec.dtype)


@pytest.fixture(scope="module")
def gru() -> PackedParams:
    return PackedParams.init(GRU, seed=0)


@pytest.fixture(scope="module")
def lstm() -> PackedParams:
    return PackedParams.init(LSTM, seed=0)


FORWARD_ERRORS = [
    ("params-type", lambda p, q: rnn_forward(p.data, _x()), TypeError, r"params has type ndarray"),
    ("x-1d", lambda p, q: rnn_forward(p, _x(shape=(3,))), ValueError, r"x has shape \(3,\); expected a 3-D"),
    ("x-2d", lambda p, q: rnn_forward(p, _x(shape=(T, 3))), ValueError,
     r"x has shape \(12, 3\); expected a 3-D"),
    ("x-4d", lambda p, q: rnn_forward(p, _x(shape=(1, T, B, 3))), ValueError, r"expected a 3-D array"),
    ("x-features", lambda p, q: rnn_forward(p, _x(shape=(T, B, 4))), ValueError,
     r"x has 4 features .*input_size = 3"),
    ("x-features-batch-first", lambda p, q: rnn_forward(p, _x(shape=(B, T, 2)), batch_first=True), ValueError,
     r"x has 2 features .*\(B, T, input_size\)"),
    ("x-empty", lambda p, q: rnn_forward(p, _x(shape=(0, B, 3))), ValueError, r"T = 0"),
    ("x-dtype", lambda p, q: rnn_forward(p, _x().astype(np.float32)), TypeError,
     r"x \(numpy.ndarray, dtype float32.*different dtypes"),
    ("x-int", lambda p, q: rnn_forward(p, np.ones((T, B, 3), dtype=np.int64)), TypeError,
     r"x has dtype int64; expected the params' dtype float64"),
    ("x-list", lambda p, q: rnn_forward(p, [[[0.0] * 3]]), TypeError, r"x has type list"),
    ("lengths-too-long", lambda p, q: rnn_forward(p, _x(), lengths=[3, 5, 2, 14]), ValueError,
     r"lengths\[3\] = 14; every length must be in 0..T = 12"),
    ("lengths-negative", lambda p, q: rnn_forward(p, _x(), lengths=np.array([3, -1, 2, 4])), ValueError,
     r"lengths\[1\] = -1; every length must be in 0..T = 12"),
    ("lengths-count", lambda p, q: rnn_forward(p, _x(), lengths=[3, 5, 2]), ValueError,
     r"lengths has shape \(3,\); expected \(4,\)"),
    ("lengths-2d", lambda p, q: rnn_forward(p, _x(), lengths=np.ones((4, 1), dtype=int)), ValueError,
     r"lengths has shape \(4, 1\)"),
    ("lengths-float", lambda p, q: rnn_forward(p, _x(), lengths=np.array([3.0, 5, 2, 4])), TypeError,
     r"lengths has dtype float64; expected an integer array"),
    ("lengths-bool", lambda p, q: rnn_forward(p, _x(), lengths=[True] * 4), TypeError,
     r"lengths has dtype bool"),
    ("lengths-object", lambda p, q: rnn_forward(p, _x(), lengths="3542"), TypeError, r"lengths has type str"),
    ("h0-shape", lambda p, q: rnn_forward(p, _x(), h0=np.zeros((1, B, 5))), ValueError,
     r"h0 has shape \(1, 4, 5\); expected .* = \(2, 4, 5\)"),
    ("h0-dtype", lambda p, q: rnn_forward(p, _x(), h0=np.zeros((2, B, 5), np.float32)), TypeError,
     r"h0 \(numpy.ndarray, dtype float32.*different dtypes"),
    ("h0-int", lambda p, q: rnn_forward(p, _x(), h0=np.zeros((2, B, 5), int)), TypeError,
     r"h0 has dtype int64; expected the params' dtype float64"),
    ("c0-for-gru", lambda p, q: rnn_forward(p, _x(), c0=np.zeros((2, B, 5))), ValueError,
     r"c0 was given but mode = 'gru' has no cell state"),
    ("c0-shape", lambda p, q: rnn_forward(q, _x(), c0=np.zeros((2, B, 2))), ValueError,
     r"c0 has shape \(2, 4, 2\); expected .*hidden_size\) = \(2, 4, 5\)"),
    ("h0-proj-shape", lambda p, q: rnn_forward(q, _x(), h0=np.zeros((2, B, 5))), ValueError,
     r"h0 has shape \(2, 4, 5\); expected .*H_out\) = \(2, 4, 2\)"),
    ("batch_first-type", lambda p, q: rnn_forward(p, _x(), batch_first="yes"), TypeError,
     r"batch_first = 'yes'; expected True or False"),
    ("training-type", lambda p, q: rnn_forward(p, _x(), training=1), TypeError,
     r"training = 1; expected True"),
    ("seed-negative", lambda p, q: rnn_forward(p, _x(), seed=-1), ValueError, r"seed = -1; expected None or"),
    ("seed-float", lambda p, q: rnn_forward(p, _x(), seed=1.5), TypeError, r"seed has type float"),
    ("engine-unknown", lambda p, q: rnn_forward(p, _x(), engine="fast"), ValueError,
     r"engine = 'fast'; expected one of \('auto', 'reference', 'numba', 'cupy', 'cudnn'\)"),
    ("engine-type", lambda p, q: rnn_forward(p, _x(), engine=None), ValueError,
     r"engine = None; expected one of"),
    ("engine-gpu-on-cpu", lambda p, q: rnn_forward(p, _x(), engine="cupy"), EngineUnavailableError,
     r"engine = 'cupy'"),
    ("float16-on-cpu", lambda p, q: rnn_forward(p.astype("float16"), _x().astype(np.float16)), TypeError,
     r"float16 runs on GPU only"),
]


@pytest.mark.parametrize("case_id, call, error, message", FORWARD_ERRORS, ids=[c[0] for c in FORWARD_ERRORS])
def test_forward_errors(case_id, call, error, message, gru, lstm):
    with pytest.raises(error, match=message):
        call(gru, lstm)


@pytest.fixture(scope="module")
def lstm_result(lstm):
    return rnn_forward(lstm, _x(LSTM), lengths=[12, 3, 0, 7], training=True)


BACKWARD_ERRORS = [
    ("res-type", lambda r, p: rnn_backward(r.y), TypeError, r"res has type ndarray; expected the RNNResult"),
    ("params-other-spec", lambda r, p: rnn_backward(r, params=PackedParams.init(GRU)), ValueError,
     r"res was computed with spec .*mode='lstm'.* but params has spec .*mode='gru'"),
    ("params-other-buffer", lambda r, p: rnn_backward(r, params=p.copy()), ValueError,
     r"res was computed with another params buffer"),
    ("params-type", lambda r, p: rnn_backward(r, params=p.data), TypeError, r"params has type ndarray"),
    ("dy-shape", lambda r, p: rnn_backward(r, dy=np.zeros((T, B, 2))), ValueError,
     r"dy has shape \(12, 4, 2\); expected res.y's shape \(12, 4, 4\)"),
    ("dy-dtype", lambda r, p: rnn_backward(r, dy=np.zeros((T, B, 4), np.float32)), TypeError,
     r"dy \(numpy.ndarray, dtype float32.*different dtypes"),
    ("dy-int", lambda r, p: rnn_backward(r, dy=np.zeros((T, B, 4), int)), TypeError,
     r"dy has dtype int64; expected res.y's dtype float64"),
    ("dh_n-shape", lambda r, p: rnn_backward(r, dh_n=np.zeros((1, B, 2))), ValueError,
     r"dh_n has shape \(1, 4, 2\); expected res.h_n's shape \(2, 4, 2\)"),
    ("dc_n-shape", lambda r, p: rnn_backward(r, dc_n=np.zeros((2, B, 2))), ValueError,
     r"dc_n has shape \(2, 4, 2\); expected res.c_n's shape \(2, 4, 5\)"),
]


@pytest.mark.parametrize("case_id, call, error, message", BACKWARD_ERRORS,
                         ids=[c[0] for c in BACKWARD_ERRORS])
def test_backward_errors(case_id, call, error, message, lstm_result, lstm):
    with pytest.raises(error, match=message):
        call(lstm_result, lstm)


def test_dc_n_for_a_mode_without_cell(gru):
    res = rnn_forward(gru, _x(), training=True)
    with pytest.raises(ValueError, match=r"dc_n was given but mode = 'gru' has no cell state"):
        rnn_backward(res, dc_n=np.zeros((2, B, 5)))


def test_errors_leave_inputs_untouched(gru):
    x, before = _x(), gru.data.copy()
    with pytest.raises(ValueError):
        rnn_forward(gru, x, lengths=[1, 2, 3, 13])
    np.testing.assert_array_equal(gru.data, before)
    np.testing.assert_array_equal(x, _x())


def test_ragged_lengths_name_lengths():
    params = ar.PackedParams.init(SMALL, seed=0)
    ragged = r"lengths = \[\[1\], \[2, 3\]\] is ragged; expected .* shape \(2,\)"
    with pytest.raises(ValueError, match=ragged):
        ar.rnn_forward(params, np.zeros((4, 2, 2), np.float32), lengths=[[1], [2, 3]])
