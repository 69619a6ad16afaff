"""Packed GEMM on the SIMD micro-kernel of :mod:`.simd_ir`: ``C (+)= A @ B`` with ``B`` packed once.

The recurrent weights are the right operand of every product of an RNN (``h @ W_hh.T``, ``x @ W_ih.T``,
``dgates @ W_hh``) and stay the same for a whole call, so they are packed once (:func:`pack_b`) into
vector columns: ``packed[v]`` is the contiguous ``(K, W)`` block of ``W`` consecutive columns, zero past
the last one. The micro-kernel then streams ``nv`` of these blocks per tile while ``mr`` rows of ``A``
are broadcast from memory (:func:`.simd_ir.tile`).

Gate-grouped packing (``gates=G``, ``N = G * H``): the vectors are ordered unit group by unit group,
``packed[u * G + g]`` holding columns ``g * H + u * W ... + W - 1`` (gate ``g`` of units ``u * W ...``).
One tile of ``G`` vectors then computes every gate of ``W`` hidden units, which is what the fused
time loops (:mod:`.loop_parts`) need to apply the gate nonlinearities to a tile while it is in L1.
``C`` keeps its ordinary column order either way (the tile stores gate ``g`` at column ``g * H + ...``).

Edges: rows past a multiple of the tile height run a shorter tile (every ``mr`` has its own loop); a
block of columns that runs past ``N`` (or past ``H`` in a gate group) is computed into a small scratch
tile and copied. ``M``, ``N`` or ``K`` may be any size, ``K = 0`` included.

Which tile a product uses: blocks of 2 vectors with up to :func:`.simd_ir.max_rows` ``(2)`` rows
(10 with AVX-512), or 4 vectors for products of at most ``max_rows(4)`` rows (a per-step product of a
small batch); gate-grouped products use ``G``-vector tiles.

A product over one term (``K = 1``: a weight gradient of one (step, row) pair) needs no packing:
:func:`outer`.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from numba.extending import register_jitable

from . import blocking, simd_ir
from .simd_ir import MAX_NV, ROWS_BY_NV, SMALL_TILE, max_rows, simd_jit, tile

_JIT = dict(cache=True, nogil=True, error_model="numpy")

MR_WIDE = max_rows(MAX_NV)   # products of at most this many rows use 4-vector tiles
ROW_PANEL = 240      # rows of a per panel (a multiple of the tile heights 10, 8, 6)


def vector_lanes(dtype: Any) -> int:
    """Elements per packed vector (``W``) for ``dtype`` on this CPU's SIMD variant."""
    return simd_ir.lanes(np.dtype(dtype).itemsize)


@simd_jit(**_JIT)
def pack_b_into(b, gates, out):
    """Pack ``b (K, N)`` (any strides) into ``out (G * ceil(N / G / W), K, W)``; see :func:`pack_b`."""
    K, N = b.shape
    W = out.shape[2]
    H = N // gates
    # b = W.T (the forward's operand) has contiguous columns: read each column whole (a lane of the
    # block); reading it row by row touched one cache line per element (3x slower at 256 x 1024)
    by_column = b.strides[0] < b.strides[1]
    for v in range(out.shape[0]):
        u, g = v // gates, v % gates
        first = u * W
        valid = min(W, H - first)
        col = g * H + first
        block = out[v]
        if by_column:
            for lane in range(valid):
                column = b[:, col + lane]
                for kk in range(K):
                    block[kk, lane] = column[kk]
        else:
            for kk in range(K):
                row = block[kk]
                for lane in range(valid):
                    row[lane] = b[kk, col + lane]
        for kk in range(K):
            for lane in range(valid, W):
                block[kk, lane] = 0.0


def pack_b(b: np.ndarray, gates: int = 1) -> np.ndarray:
    """``b (K, N)`` packed for :func:`gemm`: ``(G * ceil(N / G / W), K, W)``, ``W`` = :func:`vector_lanes`.

    ``gates = G > 1`` packs gate-grouped (``N = G * H``, see the module doc). For ``A @ W.T`` pass
    ``b = W.T`` (a view: the packing reads any strides).
    """
    if b.ndim != 2 or b.dtype not in (np.float32, np.float64):
        raise ValueError(f"pack_b: b must be a 2-D float32 or float64 array, got shape {b.shape} dtype "
                         f"{b.dtype}")
    K, N = b.shape
    if gates < 1 or gates > MAX_NV or N % gates:
        raise ValueError(f"pack_b: gates={gates} must be 1..{MAX_NV} and divide b's {N} columns")
    W = vector_lanes(b.dtype)
    groups = -(-(N // gates) // W)
    out = np.empty((groups * gates, K, W), dtype=b.dtype)
    pack_b_into(b, gates, out)
    return out


@simd_jit(**_JIT)
def block(a, i0, mr, bp, v0, nv, c, c_col, cvs, valid, accumulate, scratch, k0, k1):
    """Rows ``i0 .. i0 + mr`` of ``a`` times packed vectors ``v0 .. v0 + nv`` over ``K`` from ``k0`` to
    ``k1``, into ``c`` from column ``c_col``, vector ``v`` at ``c_col + v * cvs``, only the first ``valid``
    lanes of each vector (``valid < W``: through ``scratch``, :func:`new_scratch`); ``accumulate`` goes on
    from ``c``'s sums (the K blocks after the first accumulate)."""
    K = a.shape[1]
    W = bp.shape[2]
    item = a.itemsize
    lda, ldc = a.strides[0] // item, c.strides[0] // item
    a_addr = a.ctypes.data + (i0 * lda + k0) * item
    b_addr = bp.ctypes.data + (v0 * K + k0) * W * item
    # one call site of the micro-kernel, its output address an int64 either way (a bare uint64 `.ctypes.data`
    # compiles the kernel's chain again: issue 36); a partial vector goes through the scratch tile, where
    # the kernel goes on from the partial sums (the lanes past `valid` start at 0)
    whole = valid == W
    if accumulate and not whole:
        for i in range(mr):
            row, dst = c[i0 + i], scratch[i]
            for v in range(nv):
                base = c_col + v * cvs
                for lane in range(W):
                    dst[v * W + lane] = row[base + lane] if lane < valid else 0.0
    out = c.ctypes.data + (i0 * ldc + c_col) * item if whole else scratch.ctypes.data + 0 * item
    ld_out, step = (ldc, cvs) if whole else (scratch.shape[1], W)
    tile(mr, nv, a_addr, lda, b_addr, K * W, k1 - k0, out, ld_out, step, accumulate, bp.dtype.type(0))
    if whole:
        return
    for i in range(mr):
        row, src = c[i0 + i], scratch[i]
        for v in range(nv):
            base = c_col + v * cvs
            for lane in range(valid):
                row[base + lane] = src[v * W + lane]


# The compiled products take one signature per dtype: their fronts below (inlined into the caller) pass
# any-layout views and non-literal scalars. A literal argument (``gemm(.., 1, .., False, ..)``) or another
# layout would each compile the whole chain again (gemm had 8 signatures and block 16 per dtype), and the
# micro-kernel's K loops are most of the engine's compile time (issue 36).
@register_jitable(inline="always")
def gate_groups(a, r0, n, bp, gates, u0, u1, c, accumulate, scratch):
    """Every gate of unit groups ``u0 .. u1`` (units ``u*W .. u*W + W`` each) for rows ``r0 .. n``, into ``c
    (M, G * H)`` in its ordinary column order; ``bp`` packed with ``gates = G``."""
    _gate_groups(a[:, ::1], int(r0), int(n), bp, int(gates), int(u0), int(u1), c[:, ::1], bool(accumulate),
                 scratch)


@simd_jit(**_JIT)
def _gate_groups(a, r0, n, bp, gates, u0, u1, c, accumulate, scratch):
    """Each group's weights cut into K blocks of :func:`k_block` (L1-sized: :mod:`.blocking`), each block read
    once per step for all the row tiles; the tiles' sums go on from block to block in ``c``. Whole vectors
    call the micro-kernel here: through a call of :func:`block` per tile (four arrays' reference counts and
    ~50 arguments) the blocked product ran no faster than the unblocked one (bench/RESULTS.md)."""
    K, W = bp.shape[1], bp.shape[2]
    H = c.shape[1] // gates
    mr_max = ROWS_BY_NV[gates]
    kc = k_block(scratch, gates, W, K)
    item = a.itemsize
    lda, ldc = a.strides[0] // item, c.strides[0] // item
    for u in range(u0, u1):
        first = u * W
        valid = min(W, H - first)
        for k0 in range(0, max(K, 1), kc):    # K = 0: one empty block (the overwrite writes zeros)
            k1 = min(K, k0 + kc)
            b_addr = bp.ctypes.data + (u * gates * K + k0) * W * item
            for i0 in range(r0, n, mr_max):
                mr = min(mr_max, n - i0)
                t0, t1 = k0, k1
                if mr * gates <= SMALL_TILE:   # its sums' order depends on its K range: the whole K at once
                    if k0 > 0:
                        continue
                    t1 = K
                go_on = accumulate or t0 > 0
                if valid < W:
                    block(a, i0, mr, bp, u * gates, gates, c, first, H, valid, go_on, scratch, t0, t1)
                    continue
                tile(mr, gates, a.ctypes.data + (i0 * lda + t0) * item, lda, b_addr, K * W, t1 - t0,
                     c.ctypes.data + (i0 * ldc + first) * item, ldc, H, go_on, bp.dtype.type(0))


@register_jitable(inline="always")
def k_block(scratch, gates, W, K):
    """The K block of a ``gates``-vector tile: the budget the scratch carries (its last row, from
    :func:`.blocking.budget`) over one K row of the block; the whole ``K`` when the budget is 0."""
    budget = int(scratch[scratch.shape[0] - 1, 0])
    if budget <= 0:
        return max(K, 1)
    return max(8, budget // (gates * W * scratch.itemsize))


def new_scratch(dtype: Any, budget: int | None = None) -> np.ndarray:
    """The scratch tile of :func:`gemm` / :func:`block` for ``dtype``; its last row carries the K-block budget
    (``budget`` bytes, by default :func:`.blocking.budget`), read by the compiled products at run time."""
    scratch = np.empty(_scratch_shape(np.dtype(dtype)), dtype)  # the tiles write before they read
    scratch[-1, 0] = blocking.budget() if budget is None else budget
    return scratch


@functools.cache
def _scratch_shape(dtype: np.dtype) -> tuple[int, int]:
    return max(max_rows(nv) for nv in range(1, MAX_NV + 1)) + 1, MAX_NV * vector_lanes(dtype)


@simd_jit(**_JIT)
def _gemm_rows(a, r0, r1, bp, gates, c, accumulate, scratch):
    """:func:`gemm` on rows ``r0 .. r1``: column blocks outside, row tiles inside."""
    M = r1 - r0
    NV, K, W = bp.shape
    N = c.shape[1]
    if gates > 1:
        _gate_groups(a, r0, r1, bp, gates, 0, NV // gates, c, accumulate, scratch)
        return
    nvb = MAX_NV if M <= MR_WIDE else 2
    mr_max = ROWS_BY_NV[nvb]
    k0 = np.int64(0)  # not the literal 0: a literal argument compiles block and the micro-kernel again
    for v0 in range(0, NV, nvb):
        nv = min(nvb, NV - v0)
        first = v0 * W
        valid = min(W, N - (v0 + nv - 1) * W)
        for i0 in range(r0, r1, mr_max):
            mr = min(mr_max, r1 - i0)
            if valid < W and nv > 1:
                # the full vectors straight into c, the last (partial) one through the scratch; its count
                # is an int64, not the literal 1 (which would compile block and the micro-kernel again)
                block(a, i0, mr, bp, v0, nv - 1, c, first, W, W, accumulate, scratch, k0, K)
                block(a, i0, mr, bp, v0 + nv - 1, np.int64(1), c, first + (nv - 1) * W, W, valid, accumulate,
                      scratch, k0, K)
            else:
                block(a, i0, mr, bp, v0, nv, c, first, W, valid, accumulate, scratch, k0, K)


@register_jitable(inline="always")
def gemm(a, bp, gates, c, accumulate, scratch):
    """``c = a @ b`` (or ``c += a @ b`` when ``accumulate``) with ``bp = pack_b(b, gates)``.

    ``a (M, K)`` and ``c (M, N)``: unit inner stride, rows may be strided; ``scratch`` from
    :func:`new_scratch`. Rows run in panels of :data:`ROW_PANEL` (a panel of ``a`` stays in L2 while
    every column block of ``b`` passes over it); within a panel, a block of ``b`` (``nv * K * W``
    elements) stays in L1/L2 across the row tiles.
    """
    _gemm(a[:, ::1], bp, int(gates), c[:, ::1], bool(accumulate), scratch)


@simd_jit(**_JIT)
def _gemm(a, bp, gates, c, accumulate, scratch):
    a, c = a[:, ::1], c[:, ::1]  # called from Python with C-contiguous arrays: the same signature
    M = a.shape[0]
    if M == 0 or c.shape[1] == 0:
        return
    for r0 in range(0, M, ROW_PANEL):
        _gemm_rows(a, r0, min(M, r0 + ROW_PANEL), bp, gates, c, accumulate, scratch)


@simd_jit(**_JIT)
def gemm_steps(v0, v1, a, bp, c, bias, batch_sizes, scratch):
    """``c[t, b, cols] = a[t, b] @ b[:, cols] + bias[cols]`` for the columns ``cols`` of the packed vectors
    ``v0 .. v1`` of ``bp = pack_b(b)``, every step ``t`` and its active rows (rows sorted by length:
    step ``t``'s active rows are its first ``batch_sizes[t]``); no other entry of ``c`` is written.
    ``a (T, B, K)``, ``c (T, B, N)``; ``bias`` (N,) or zero-size."""
    W = bp.shape[2]
    c0, c1 = v0 * W, min(v1 * W, c.shape[2])
    if c1 <= c0:
        return
    part = bp[v0:v1]
    for t in range(a.shape[0]):
        n = batch_sizes[t]
        if n == 0:
            continue
        if bias.size:
            for row in range(n):
                for col in range(c0, c1):  # not a slice assignment: see loop_parts.copy_row
                    c[t, row, col] = bias[col]
        gemm(a[t, :n], part, 1, c[t, :n, c0:c1], bias.size > 0, scratch)


@simd_jit(**_JIT)
def _outer_into(a, b, out):
    for i in range(a.shape[0]):
        ai, row = a[i], out[i]
        for j in range(b.shape[0]):
            row[j] = ai * b[j]


def outer(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``a @ b`` for ``a (M, 1)`` and ``b (1, N)``, into ``out`` if given: each entry ``a[i] * b[j]`` rounded
    once, as BLAS's product over one term (the same bits), without packing either operand or a BLAS call
    (a weight gradient over one (step, row) pair: bench/RESULTS.md, "an outer product"). Compiled for one
    float32 / float64 dtype and ``out`` in C order (or none), else NumPy's broadcast multiply."""
    dtype = np.result_type(a, b)
    compiled = dtype in (np.float32, np.float64) and a.dtype == b.dtype == dtype
    if out is None:
        out = np.empty((a.shape[0], b.shape[1]), dtype)
    if compiled and out.dtype == dtype and out.flags.c_contiguous:
        _outer_into(np.ascontiguousarray(a[:, 0]), np.ascontiguousarray(b[0]), out)
        return out
    return np.multiply(a, b, out=out, dtype=dtype)


def matmul(a: np.ndarray, packed: np.ndarray, n: int, gates: int = 1, out: np.ndarray | None = None,
           accumulate: bool = False) -> np.ndarray:
    """``a @ b`` for ``packed = pack_b(b, gates)`` and ``b``'s column count ``n``; into ``out`` if given
    (``out += a @ b`` with ``accumulate``). A checked front for :func:`gemm`."""
    if a.ndim != 2 or a.dtype != packed.dtype or a.shape[1] != packed.shape[1]:
        raise ValueError(f"matmul: a must be 2-D {packed.dtype} with {packed.shape[1]} columns (the packed "
                         f"K), got shape {a.shape} dtype {a.dtype}")
    if a.shape[0] and a.strides[1] != a.itemsize:
        a = np.ascontiguousarray(a)
    if out is None:
        out = np.zeros((a.shape[0], n), a.dtype)
    elif (out.shape != (a.shape[0], n) or out.dtype != a.dtype
          or (out.size and out.strides[1] != out.itemsize)):
        raise ValueError(f"matmul: out must be ({a.shape[0]}, {n}) {a.dtype} with unit column stride, got "
                         f"shape {out.shape} dtype {out.dtype}")
    gemm(a, packed, gates, out, accumulate, new_scratch(a.dtype))
    return out
