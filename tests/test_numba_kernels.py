"""Kernel-level tests of the numba engine: activations, the BLAS binding and GEMM, allocation, signatures.

Oracles are plain NumPy in float64. The engine-level comparison with the reference engine lives in
test_numba_engine.py; the shared test bodies (tests/test_rnn_*.py) run on both engines through the
``engine`` fixture.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from numba.core.runtime import _nrt_python, rtsys

import arrayrnn as ar
from arrayrnn.engines import numba_blas
from arrayrnn.engines import numba_kernels as nk
from arrayrnn.engines.numba_blas import FLIPPED_MAX_M, SMALL_M, blas_binding, gemm

SIGMOID, TANH = 0, 1


def _activate(kind: int, x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    nk.activate(kind, x, out)
    return out


def _grid(dtype) -> np.ndarray:
    dense = np.linspace(-30.0, 30.0, 200_001)
    near_zero = np.linspace(-0.6, 0.6, 50_001)
    edges = [0.0, 1e-30, -1e-8, 0.4, -0.4, 0.39999998, 86.9, -86.9, 87.5, -87.5]
    return np.concatenate([dense, near_zero, edges]).astype(dtype)


def test_float32_tanh_is_within_3_ulp_everywhere():
    x = _grid(np.float32)
    exact = np.tanh(x.astype(np.float64))
    got = _activate(TANH, x).astype(np.float64)
    ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got - exact) / ulp) <= 3.0


def test_float32_sigmoid_has_float_relative_accuracy_until_underflow():
    x = _grid(np.float32)
    exact = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    got = _activate(SIGMOID, x).astype(np.float64)
    normal = x > -80.0
    assert np.max(np.abs(got - exact)[normal] / exact[normal]) <= 3e-7
    assert np.max(np.abs(got - exact)[~normal]) <= 2e-38


def test_float64_activations_are_libm_accurate():
    x = _grid(np.float64)
    with np.errstate(over="ignore"):
        exact_sigmoid = 1.0 / (1.0 + np.exp(-x))
    np.testing.assert_allclose(_activate(SIGMOID, x), exact_sigmoid, rtol=2e-16 * 4, atol=0)
    np.testing.assert_allclose(_activate(TANH, x), np.tanh(x), rtol=2e-16 * 4, atol=1e-300)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_activations_saturate_and_propagate_nan(dtype):
    x = np.array([-np.inf, -1e4, 1e4, np.inf, np.nan], dtype)
    sig, th = _activate(SIGMOID, x), _activate(TANH, x)
    np.testing.assert_allclose(sig[:4], [0.0, 0.0, 1.0, 1.0], atol=1e-37)
    np.testing.assert_array_equal(th[:4], [-1.0, -1.0, 1.0, 1.0])
    assert np.isnan(sig[4]) and np.isnan(th[4])


# -- BLAS -----------------------------------------------------------------------------------------
def test_blas_binding_is_numpys_own_library():
    import threadpoolctl

    binding = blas_binding()
    numpy_blas = [d["filepath"] for d in threadpoolctl.threadpool_info()
                  if d.get("user_api") == "blas" and "numpy" in d["filepath"]]
    if numpy_blas:  # wheels bundle their BLAS next to numpy; other builds link a system one
        assert binding.filepath == numpy_blas[0]
    assert binding.describe().endswith("CBLAS)")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m", [1, SMALL_M - 1, SMALL_M, 9])
@pytest.mark.parametrize("beta", [0.0, 1.0])
@pytest.mark.parametrize("k", [5, 13, 24])   # below, not a multiple of, and a multiple of small_gemm's 8
def test_gemm_on_strided_views_matches_numpy(dtype, m, beta, k):
    rng = np.random.default_rng(m)
    n = 7
    big_a = rng.standard_normal((m + 2, k + 5)).astype(dtype)
    big_b = rng.standard_normal((k + 1, n + 3)).astype(dtype)
    big_c = rng.standard_normal((m + 1, n + 4)).astype(dtype)
    a, b, c = big_a[1:m + 1, 2:k + 2], big_b[1:, :n], big_c[:m, 3:n + 3]
    expected = a.astype(np.float64) @ b + beta * c
    untouched = big_c.copy()
    gemm(blas_binding().ilp64, a, b, c, beta)
    tol = 1e-5 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(c, expected, rtol=tol, atol=tol)
    mask = np.ones(big_c.shape, bool)
    mask[:m, 3:n + 3] = False
    np.testing.assert_array_equal(big_c[mask], untouched[mask])  # nothing written outside the view


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m", [SMALL_M - 1, SMALL_M, 9, FLIPPED_MAX_M, FLIPPED_MAX_M + 1])
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_gemm_step_flipped_or_not_matches_numpy(dtype, m, beta):
    rng = np.random.default_rng(m)
    k, n = 11, 9
    a = rng.standard_normal((m + 1, k))[1:].astype(dtype)
    W = rng.standard_normal((n + 4, k)).astype(dtype)     # the weight; b = W[2:2+n].T, a column slice
    W_T = np.ascontiguousarray(W.T)
    b, b_t = W_T[:, 2:2 + n], W[2:2 + n]
    c = rng.standard_normal((m, n)).astype(dtype)
    expected = a.astype(np.float64) @ b + beta * c
    tol = 1e-5 if dtype == np.float32 else 1e-13
    for scratch in (np.empty(0, dtype), np.full(FLIPPED_MAX_M * n, np.nan, dtype)):
        out = c.copy()
        numba_blas.gemm_step(blas_binding().ilp64, a, b, b_t, out, beta, scratch)
        np.testing.assert_allclose(out, expected, rtol=tol, atol=tol)
    assert np.isfinite(scratch[:m * n]).all() == (SMALL_M <= m <= FLIPPED_MAX_M)   # the flipped path ran


def test_flipped_scratch_only_for_few_rows_and_a_large_weight():
    big = numba_blas.FLIPPED_MIN_WEIGHT
    assert numba_blas.flipped_scratch(SMALL_M - 1, big, 1, np.float32).size == 0
    assert numba_blas.flipped_scratch(SMALL_M, big - 1, 1, np.float32).size == 0
    assert numba_blas.flipped_scratch(SMALL_M, big, 1, np.float32).size == SMALL_M
    assert numba_blas.flipped_scratch(64, 1, big, np.float32).size == numba_blas.FLIPPED_MAX_M * big


def test_gemm_with_no_rows_or_empty_inner_dimension():
    a0, b, c = np.ones((0, 3), np.float32), np.ones((3, 4), np.float32), np.ones((0, 4), np.float32)
    gemm(blas_binding().ilp64, a0, b, c, 0.0)
    c = np.full((5, 4), 7.0, np.float32)
    gemm(blas_binding().ilp64, np.ones((5, 0), np.float32), np.ones((0, 4), np.float32), c, 0.0)
    np.testing.assert_array_equal(c, 0.0)


# -- allocation and compilation -------------------------------------------------------------------
_CONFIGS = {
    "lstm": dict(mode="lstm", bidirectional=True),
    "lstm-proj-clip": dict(mode="lstm", proj_size=2, cell_clip=0.5),
    "gru": dict(mode="gru", bidirectional=True),
    "gru-reset-before": dict(mode="gru", reset_after=False, bias="single_rec"),
    "rnn_relu": dict(mode="rnn_relu"),
}


def _nrt_allocations(spec: ar.RNNSpec, T: int) -> int:
    """NRT (numba runtime) allocations of one training forward + backward on the numba engine."""
    params = ar.PackedParams.init(spec)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T, 6, spec.input_size)).astype(spec.dtype)
    lengths = rng.integers(0, T + 1, 6)
    ar.rnn_backward(ar.rnn_forward(params, x, lengths=lengths, training=True, engine="numba"))  # compile
    before = rtsys.get_allocation_stats()
    ar.rnn_backward(ar.rnn_forward(params, x, lengths=lengths, training=True, engine="numba"))
    after = rtsys.get_allocation_stats()
    assert after.alloc - before.alloc == after.free - before.free  # and nothing leaks
    return after.alloc - before.alloc


@pytest.mark.parametrize("flipped", [False, True])
@pytest.mark.parametrize("config", sorted(_CONFIGS))
def test_compiled_loops_allocate_nothing_per_step(config, flipped, monkeypatch):
    # numba's own allocations bypass tracemalloc; its runtime counts them. The count per call must not
    # grow with the number of steps (it is a few per call: the boxed arguments). flipped: every step of
    # 4..6 active rows runs gemm_step's flipped product (the weight threshold lowered to reach it)
    if flipped:
        monkeypatch.setattr(numba_blas, "FLIPPED_MIN_WEIGHT", 0)
    _nrt_python.memsys_enable_stats()
    spec = ar.RNNSpec(input_size=3, hidden_size=4, **_CONFIGS[config])
    assert _nrt_allocations(spec, T=3) == _nrt_allocations(spec, T=40)


def test_one_compiled_signature_per_dtype_and_on_disk_cache():
    # every option (projection, clipping, cache kept or not, bias modes, direction) shares one signature
    rng = np.random.default_rng(1)
    for config in _CONFIGS.values():
        for dtype in ("float32", "float64"):
            spec = ar.RNNSpec(input_size=3, hidden_size=4, dtype=dtype, **config)
            x = rng.standard_normal((4, 2, 3)).astype(dtype)
            ar.rnn_forward(ar.PackedParams.init(spec), x, engine="numba")
            ar.rnn_backward(ar.rnn_forward(ar.PackedParams.init(spec), x, training=True, engine="numba"))
    loops = [nk.lstm_forward_loop, nk.lstm_backward_loop, nk.gru_forward_loop, nk.gru_backward_loop,
             nk.rnn_forward_loop, nk.rnn_backward_loop]
    for loop in loops:
        assert len(loop.signatures) <= 2, (loop.__name__, loop.signatures)
        assert type(loop._cache).__name__ == "FunctionCache"  # cache=True: compiled code kept on disk


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 1), (7, 3), (64, 33)])
def test_transposed_copies_a_contiguous_transpose(dtype, shape, monkeypatch):
    W = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    for binding in (blas_binding(), dataclasses.replace(blas_binding(), omatcopy={})):  # BLAS, NumPy fallback
        monkeypatch.setattr(numba_blas, "blas_binding", lambda b=binding: b)
        out = numba_blas.transposed(W)
        assert out.flags.c_contiguous and out.dtype == dtype
        np.testing.assert_array_equal(out, W.T)
    if "openblas" in blas_binding().filepath.lower():  # OpenBLAS (NumPy's wheels) has cblas_?omatcopy
        assert str(np.dtype(dtype)) in blas_binding().omatcopy
