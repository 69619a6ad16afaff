"""The row-dot kernel (``out (+)= x @ w.T`` from unpacked ``w``) against float64 NumPy, every tile and edge.

Shapes hit every tile of the kernel (rows of ``x`` from 1 past two row blocks, rows of ``w`` past a multiple
of the tile's), ``K`` below, at and past a vector (the scalar tail) and ``K = 0``. The variant this process
runs is tested in process, every other one this CPU can run in a subprocess (as tests/test_packed_gemm.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from support.simd_variants import errors_in_variant, runnable_variants

from arrayrnn.engines.numba import row_dot, simd_ir

TOL = {np.float32: 1e-5, np.float64: 1e-13}


def _shapes(dtype) -> list[tuple[int, int, int]]:
    L = simd_ir.lanes(np.dtype(dtype).itemsize)
    rows, w_rows = row_dot.ROWS, row_dot.W_ROWS
    Ks = [0, 1, L - 1, L, L + 1, 3 * L + 5, 257]
    return [(M, N, K) for M in (1, rows - 1, rows, 2 * rows + 1) for N in (1, w_rows + 1, 3 * w_rows + 3)
            for K in Ks]


def check_shapes(dtype) -> float:
    """Worst error over :func:`_shapes`, relative to ``sqrt(K) + 1``, both overwrite and accumulate (used by
    subprocesses)."""
    rng = np.random.default_rng(5)
    worst = 0.0
    for M, N, K in _shapes(dtype):
        x, w, before = (rng.standard_normal(shape).astype(dtype) for shape in ((M, K), (N, K), (M, N)))
        exact = x.astype(np.float64) @ w.astype(np.float64).T
        out = np.full((M, N), np.nan, dtype)
        row_dot.dot_rows(x, w, out)
        added = before.copy()
        row_dot.dot_rows(x, w, added, accumulate=True)
        scale = np.sqrt(K) + 1
        worst = max(worst, np.abs(out - exact).max(initial=0) / scale,
                    np.abs(added - (exact + before)).max(initial=0) / scale)
    return worst


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_dot_matches_float64_matmul_on_every_tile_and_edge(dtype):
    assert check_shapes(dtype) < TOL[dtype]


@pytest.mark.parametrize("variant", [v for v in simd_ir.VARIANTS if v != simd_ir.VARIANT])
def test_other_variants_match_float64_matmul(variant):
    if variant not in runnable_variants():
        pytest.skip(f"this CPU cannot run the {variant} variant")
    err32, err64 = errors_in_variant(variant, "test_row_dot")
    assert err32 < TOL[np.float32] and err64 < TOL[np.float64]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_row_has_the_same_bits_whatever_rows_it_is_computed_with(dtype, rng):
    """The sums' order depends on K and the lanes only: a row alone, in a batch, or past a row block (a
    partial tile) gives the same bits; so does a row of ``w`` in any tile."""
    M, N, K = 2 * row_dot.ROWS + 1, 3 * row_dot.W_ROWS + 1, 3 * simd_ir.lanes(np.dtype(dtype).itemsize) + 3
    x, w = rng.standard_normal((M, K)).astype(dtype), rng.standard_normal((N, K)).astype(dtype)
    whole = np.empty((M, N), dtype)
    row_dot.dot_rows(x, w, whole)
    for i in range(M):
        alone = np.empty((1, N), dtype)
        row_dot.dot_rows(x[i:i + 1], w, alone)
        np.testing.assert_array_equal(alone[0], whole[i])
    some = np.empty((M, 3), dtype)
    row_dot.dot_rows(x, np.ascontiguousarray(w[1:4]), some)
    np.testing.assert_array_equal(some, whole[:, 1:4])


def test_reads_any_x_and_read_only_weights_writes_only_out(rng):
    x_full = rng.standard_normal((6, 40)).astype(np.float32)
    x = x_full[::2, 3:35]                        # strided: copied
    w = rng.standard_normal((9, 32)).astype(np.float32)
    w.flags.writeable = False
    x_ro = x.copy()
    x_ro.flags.writeable = False
    out = np.empty((3, 9), np.float32)
    big = np.full((5, 9), 7.0, np.float32)
    row_dot.dot_rows(x, w, out)
    np.testing.assert_allclose(out, x.astype(np.float64) @ w.astype(np.float64).T, rtol=1e-5, atol=1e-5)
    got = big[1:4]                               # C-contiguous rows of a bigger array: the rest untouched
    row_dot.dot_rows(x_ro, w, got)
    np.testing.assert_array_equal(got, out)
    assert (big[0] == 7).all() and (big[4] == 7).all()
    assert row_dot._dot_rows.signatures == list(dict.fromkeys(row_dot._dot_rows.signatures))
    assert {sig[0].mutable for sig in row_dot._dot_rows.signatures} == {True}  # one signature a dtype


def test_bad_arguments_are_refused_with_their_shapes():
    x, w = np.zeros((2, 3), np.float32), np.zeros((4, 3), np.float32)
    with pytest.raises(ValueError, match=r"w \(4, 5\) float32.*expected x \(M, K\), w \(N, K\)"):
        row_dot.dot_rows(x, np.zeros((4, 5), np.float32), np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match=r"out \(3, 4\) float32"):
        row_dot.dot_rows(x, w, np.zeros((3, 4), np.float32))
    with pytest.raises(ValueError, match="one dtype"):
        row_dot.dot_rows(x, w, np.zeros((2, 4), np.float64))
    with pytest.raises(ValueError, match="w .* must be C-contiguous"):
        row_dot.dot_rows(x, np.zeros((3, 4), np.float32).T, np.zeros((2, 4), np.float32))
    read_only = np.zeros((2, 4), np.float32)
    read_only.flags.writeable = False
    for out in (np.zeros((4, 2), np.float32).T, read_only):
        with pytest.raises(ValueError, match="out .* must be C-contiguous, writeable"):
            row_dot.dot_rows(x, w, out)
