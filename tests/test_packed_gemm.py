"""The packed GEMM and its SIMD micro-kernels against ``np.matmul`` (float64 oracle), every edge.

Shapes hit every edge of the tiles: M, N, K not multiples of the tile sizes, M = 1, K = 1, K = 0, a
partial last vector in a gate group. The variant this process runs is tested in process; every other
variant this CPU can run (AVX2 and the portable one on an AVX-512 machine) is tested in a subprocess
with ``ARRAYRNN_SIMD`` (and numba's target features) set, running this file's shape list.
"""

from __future__ import annotations

import re

import numba
import numpy as np
import pytest
from support.simd_variants import errors_in_variant, runnable_variants

from arrayrnn.engines.numba import blocking, simd_ir
from arrayrnn.engines.numba import packed_gemm as pg

# (M, K, N, gates); K up to 300: longer than a tile's L1 share of the packed panel
SHAPES = [(1, 1, 1, 1), (1, 7, 33, 1), (13, 5, 70, 1), (2, 3, 24, 2), (23, 3, 36, 3), (11, 9, 512, 4),
          (7, 64, 100, 4), (5, 0, 17, 1), (250, 17, 40, 1), (9, 33, 96, 1), (21, 129, 40, 1), (9, 300, 70, 1),
          (13, 257, 100, 4), (250, 256, 36, 3), (1, 300, 20, 1)]


def check_shapes(dtype) -> float:
    """Worst relative error over :data:`SHAPES`, both overwrite and accumulate (used by subprocesses)."""
    rng = np.random.default_rng(7)
    worst = 0.0
    for M, K, N, gates in SHAPES:
        a = rng.standard_normal((M, K)).astype(dtype)
        b = rng.standard_normal((K, N)).astype(dtype)
        exact = a.astype(np.float64) @ b.astype(np.float64)
        packed = pg.pack_b(b, gates)
        got = pg.matmul(a, packed, N, gates)
        c0 = rng.standard_normal((M, N)).astype(dtype)
        added = pg.matmul(a, packed, N, gates, out=c0.copy(), accumulate=True)
        scale = np.sqrt(K) + 1
        worst = max(worst, np.abs(got - exact).max(initial=0) / scale,
                    np.abs(added - (exact + c0)).max(initial=0) / scale)
    return worst


TOL = {np.float32: 1e-5, np.float64: 1e-13}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_packed_gemm_matches_matmul_on_every_edge(dtype):
    assert check_shapes(dtype) < TOL[dtype]


def test_gemm_on_strided_rows_leaves_the_rest_of_c_alone(rng):
    a_full = rng.standard_normal((9, 40)).astype(np.float32)
    a = a_full[::2, 3:35]                       # strided rows, unit inner stride
    b = rng.standard_normal((32, 50)).astype(np.float32)
    c = np.full((5, 80), 7.0, np.float32)
    pg.gemm(a, pg.pack_b(b), 1, c[:, 10:60], False, pg.new_scratch(np.float32))
    np.testing.assert_allclose(c[:, 10:60], a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    assert (c[:, :10] == 7).all() and (c[:, 60:] == 7).all()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_gemm_steps_writes_each_steps_active_rows_of_its_columns(rng, dtype, with_bias):
    T, B, K, N = 5, 7, 9, 3 * pg.vector_lanes(np.dtype(dtype)) - 5  # a partial last vector
    a = rng.standard_normal((T, B, K)).astype(dtype)
    b = rng.standard_normal((K, N)).astype(dtype)
    bias = rng.standard_normal(N).astype(dtype) if with_bias else np.empty(0, dtype)
    batch_sizes = np.array([7, 5, 5, 1, 0], np.int64)
    packed, c = pg.pack_b(b), np.full((T, B, N), np.nan, dtype)
    for v0, v1 in ((0, 1), (1, 3)):  # two column parts, as two threads would run them
        pg.gemm_steps(v0, v1, a, packed, c, bias, batch_sizes, pg.new_scratch(dtype))
    active = np.arange(B)[None, :] < batch_sizes[:, None]
    want = a @ b + (bias if with_bias else 0)
    np.testing.assert_allclose(c[active], want[active], rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-5)
    assert np.isnan(c[~active]).all()


def test_gate_grouped_packing_orders_vectors_by_unit_group(rng):
    W = pg.vector_lanes(np.float64)
    H, K = W + 3, 2                             # two unit groups, the second partial
    b = rng.standard_normal((K, 4 * H))
    packed = pg.pack_b(b, gates=4)
    assert packed.shape == (8, K, W)
    np.testing.assert_array_equal(packed[4 + 2, :, :3], b[:, 2 * H + W:2 * H + W + 3])   # group 1, gate 2
    assert (packed[4 + 2, :, 3:] == 0).all()


def test_bad_arguments_name_what_was_expected():
    with pytest.raises(ValueError, match="gates=3 must be"):
        pg.pack_b(np.zeros((2, 8), np.float32), gates=3)
    with pytest.raises(ValueError, match="2-D float32 or float64"):
        pg.pack_b(np.zeros((2, 8), np.int32))
    packed = pg.pack_b(np.zeros((4, 8), np.float32))
    with pytest.raises(ValueError, match="4 columns"):
        pg.matmul(np.zeros((2, 5), np.float32), packed, 8)


@pytest.mark.parametrize("variant", [v for v in simd_ir.VARIANTS if v != simd_ir.VARIANT])
def test_other_variants_match_matmul(variant):
    if variant not in runnable_variants():
        pytest.skip(f"this CPU cannot run the {variant} variant")
    err32, err64 = errors_in_variant(variant, "test_packed_gemm")
    assert err32 < TOL[np.float32] and err64 < TOL[np.float64]


def test_simd_variant_follows_the_environment(monkeypatch):
    monkeypatch.setenv("ARRAYRNN_SIMD", "portable")
    assert simd_ir.detect_variant() == "portable"
    monkeypatch.setenv("ARRAYRNN_SIMD", "sse9")
    with pytest.raises(ValueError, match="ARRAYRNN_SIMD='sse9'"):
        simd_ir.detect_variant()


@numba.njit
def _one_tile(mr, nv, a, bp, c):
    W = bp.shape[2]
    K = a.shape[1]
    simd_ir.tile(mr, nv, a.ctypes.data, K, bp.ctypes.data, bp.shape[1] * W, K, c.ctypes.data, c.shape[1], W,
                 True, a[0, 0])


def _k_loops(asm: str) -> list[str]:
    """The machine-code blocks that branch back to themselves and hold vector FMAs (the K loops)."""
    blocks = re.split(r"\n(?=\.LBB\d+_\d+:)", asm)
    loops = []
    for text in blocks:
        label = re.match(r"(\.LBB\d+_\d+):", text)
        if label and "vfmadd" in text and re.search(rf"\bj\w+\s+{re.escape(label.group(1))}\b", text):
            loops.append(text)
    return loops


@pytest.mark.skipif(simd_ir.VARIANT == "portable", reason="the portable variant's code is the target's own")
def test_k_loops_keep_accumulators_in_registers():
    f32 = numba.float32
    sig = (numba.int64, numba.int64, f32[:, ::1], f32[:, :, ::1], f32[:, ::1])
    _one_tile.compile(sig)                               # compiled, not run
    asm = _one_tile.inspect_asm(sig)
    loops = _k_loops(asm)
    # one K loop per tile shape, none unrolled; tiles of <= 4 accumulators add a remainder loop
    shapes = [(mr, nv) for nv in range(1, simd_ir.MAX_NV + 1) for mr in range(1, simd_ir.max_rows(nv) + 1)]
    assert len(loops) == sum(2 if mr * nv <= 4 else 1 for mr, nv in shapes)
    spilling = [loop.splitlines()[0] for loop in loops if re.search(r"\(%rsp\)", loop)]
    assert not spilling, f"K loops spill to the stack: {spilling}"


def test_cache_key_covers_every_engine_module_the_time_loops_call_into():
    # numba's cache of a caller misses a change in a callee's module: each module of the engines that the
    # compiled loops import must be digested (KERNEL_SOURCES: paths relative to arrayrnn/engines/)
    import ast
    from pathlib import Path

    from arrayrnn.engines.numba import gru_loops, loop_parts, lstm_loops, rnn_loops

    for loops in (loop_parts, lstm_loops, gru_loops, rnn_loops):
        callees = set()
        for node in ast.walk(ast.parse(Path(loops.__file__).read_text())):
            if isinstance(node, ast.ImportFrom) and node.level in (1, 2):
                folder = "numba/" if node.level == 1 else ""
                names = [node.module] if node.module else [alias.name for alias in node.names]
                callees |= {f"{folder}{name}.py" for name in names}
        callees.discard("numba_cache.py")  # the decorator (numba's cache made safe to fail): no code called
        assert {"gate_math.py", "numba/packed_gemm.py"} <= callees <= set(simd_ir.KERNEL_SOURCES), loops


@pytest.mark.skipif(simd_ir.VARIANT != "avx512", reason=f"the SIMD variant here is {simd_ir.VARIANT}")
def test_time_loops_let_llvm_vectorise_at_512_bits():
    import inspect

    import numba

    from arrayrnn.engines.numba import gru_loops, lstm_loops, rnn_loops

    # every time loop asks for it ...
    loops = {name: fn for module in (lstm_loops, gru_loops, rnn_loops) for name, fn in vars(module).items()
             if name.endswith(("_loop", "_columns")) and hasattr(fn, "py_func")}
    assert {"lstm_forward_loop", "lstm_forward_columns", "lstm_backward_loop", "gru_forward_loop",
            "gru_forward_columns", "gru_backward_loop", "rnn_forward_loop", "rnn_backward_loop"} <= set(loops)
    for name, fn in loops.items():
        assert "prefer_full_vectors()" in inspect.getsource(fn.py_func), name
    # ... and asking puts the attribute on the function (compiled here: a function loaded from numba's
    # disk cache shows no IR)
    tile = numba.njit(nogil=True)(lstm_loops._lstm_peephole_tile.py_func)
    xw, y = np.zeros((1, 1, 8), np.float32), np.zeros((1, 1, 2), np.float32)   # 1 step, 1 row, H = 2
    c, m, peepholes = np.zeros((1, 2), np.float32), np.zeros((1, 2), np.float32), np.zeros((3, 2), np.float32)
    tile(xw, 0, 0, 1, 2, c, y, m, False, False, y, np.float32(-1), np.float32(1), peepholes)
    ir_text = next(iter(tile.inspect_llvm().values()))
    assert '"prefer-vector-width"="512"' in ir_text


@pytest.mark.parametrize("gates", [1, 3, 4])
def test_packing_reads_any_strides_the_same(rng, gates):
    """The forward packs ``W.T`` (contiguous columns, read column by column), the backward ``W`` (rows):
    both orders give the same packed block, zero past a partial last vector."""
    H = pg.vector_lanes(np.float32) + 5
    w = rng.standard_normal((gates * H, 37)).astype(np.float32)
    by_rows = pg.pack_b(np.ascontiguousarray(w.T), gates)
    by_columns = pg.pack_b(w.T, gates)
    strided = pg.pack_b(np.repeat(w.T, 2, axis=0)[::2], gates)   # rows two apart
    np.testing.assert_array_equal(by_columns, by_rows)
    np.testing.assert_array_equal(strided, by_rows)
    W = pg.vector_lanes(np.float32)
    last_gate_of_group_1 = by_columns[2 * gates - 1]
    np.testing.assert_array_equal(last_gate_of_group_1[:, :5], w.T[:, (gates - 1) * H + W:gates * H])
    assert (by_columns[gates:, :, 5:] == 0).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_k_blocks_give_the_whole_products_bits(rng, dtype):
    """The K-block budget (:mod:`arrayrnn.engines.numba.blocking`) changes the speed, never the bits: every
    budget gives no blocking's bits, whole and partial last vectors, overwrite and accumulate, K = 0."""
    W, item = pg.vector_lanes(dtype), np.dtype(dtype).itemsize
    budgets = (1, 8 * 4 * W * item + 5, blocking.default_budget(), 10**9)     # K blocks of 8 .. the whole K
    for M, K, H, G in [(13, 300, 2 * W + 3, 4), (7, 257, W, 3), (1, 100, W + 1, 4), (20, 64, 2 * W, 2),
                       (9, 0, W, 4)]:
        a = rng.standard_normal((M, K)).astype(dtype)
        b = rng.standard_normal((K, G * H)).astype(dtype)
        c0 = rng.standard_normal((M, G * H)).astype(dtype)
        packed = pg.pack_b(b, G)

        def product(budget, accumulate, packed=packed, a=a, c0=c0, G=G):
            c = c0.copy()
            pg.gemm(a, packed, G, c, accumulate, pg.new_scratch(dtype, budget))
            return c
        for accumulate in (False, True):
            whole = product(0, accumulate)
            exact = a.astype(np.float64) @ b + (c0 if accumulate else 0)
            tol = TOL[dtype] * 10
            np.testing.assert_allclose(whole, exact, rtol=tol, atol=tol * np.sqrt(K + 1))
            for budget in budgets:
                np.testing.assert_array_equal(product(budget, accumulate), whole,
                                              err_msg=f"{(M, K, H, G)}, budget {budget}, {accumulate = }")


def test_k_block_is_the_budget_over_one_k_row_of_the_gate_group():
    W = pg.vector_lanes(np.float32)
    assert pg.k_block(pg.new_scratch(np.float32, 32768), 4, W, 512) == 32768 // (4 * W * 4)
    assert pg.k_block(pg.new_scratch(np.float32, 0), 4, W, 512) == 512       # 0: the whole K
    assert pg.k_block(pg.new_scratch(np.float32, 0), 4, W, 0) == 1           # one (empty) block at K = 0
    assert pg.k_block(pg.new_scratch(np.float32, 100), 4, W, 512) == 8       # never below 8
    with blocking.forced(4096):
        assert pg.k_block(pg.new_scratch(np.float64), 2, W // 2, 512) == 4096 // (2 * (W // 2) * 8)
