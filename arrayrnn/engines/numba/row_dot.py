"""Products of a few rows with a weight matrix as it is (unpacked): ``out (+)= x @ w.T``, each row of ``w``
read once.

An inference step that reads the caller's weights as they are (:mod:`.source_step`, up to 64 rows)
multiplies ``x (M, K)`` by ``w.T`` for a ``w (N, K)`` it may not pack (packing reads and writes the whole
matrix: the step would cost what it saves). NumPy's OpenBLAS runs ``x @ w.T`` over 2-16 rows as a GEMM that
packs ``w`` every call, and ``w @ x.T`` reads ``w`` at a quarter of its one-row speed (both products of an
`H = 256` LSTM, one thread: 181 us at 8 rows, 46 at one; bench/RESULTS.md). This kernel takes ``w`` as it
lies: :data:`W_ROWS` rows of ``w`` at a time are loaded as vectors along ``K`` and multiplied with up to
:data:`ROWS` rows of ``x`` (which stay in L1), one accumulator per pair, each summed across its lanes at
the end; roughly::

    for j in range(0, N, W_ROWS):                             # rows of w: read from memory once
        for i in range(0, M, ROWS):                           # the rows of x, from L1
            acc[i][j] = sum_kk fma(x[i, kk:kk+L], w[j, kk:kk+L], acc[i][j])   # L lanes a vector
            out[i, j] = (out[i, j] if accumulate else 0) + lanes_sum(acc[i][j]) + tail[i][j]

``tail`` is the ``K mod L`` last products, one at a time. The sums' order is fixed by ``K`` and the lane
count alone (not by ``M``, the thread or where a row's tile falls), so a row's result has the same bits
whatever rows it is computed with. The IR is emitted for the SIMD variant of :mod:`.simd_ir` (its vector
width and registers).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, register_jitable

from .simd_ir import REGISTERS, VARIANT, Emitter, no_unroll, simd_jit, switched_kernel

W_ROWS = 4 if REGISTERS == 32 else 2
"""Rows of ``w`` a tile reads at once."""

ROWS = 4
"""The most rows of ``x`` a tile multiplies: ``ROWS * W_ROWS`` accumulators, the ``w`` vectors and a loaded
``x`` vector fit the register file (4 x 4 ran 8 rows at `H = 256` in 100 us, 2 x 8 in 113, 1 x 8 in 158)."""


class _DotEmitter(Emitter):
    """Emits one ``(mr, nw)`` tile of :func:`dot_rows` into the current function; the tile's accumulators
    are one flat list, ``acc[i * nw + j]`` for row ``i`` of ``x`` and row ``j`` of ``w``."""

    def dot_tile(self, mr, nw, x, ldx, w, ldw, k, out, ldo, accumulate, done):
        b, i64 = self.b, self.i64
        whole = b.mul(b.sdiv(k, ir.Constant(i64, self.W)), ir.Constant(i64, self.W))  # k rounded down
        vectors = self._counted_loop(ir.Constant(i64, 0), self.W, whole, [self.zero_vec] * (mr * nw),
                                     lambda kk, accs: self._products(mr, nw, x, ldx, w, ldw, kk, accs, True))
        sums = self._counted_loop(whole, 1, k, self.lanes_sums(vectors),        # the tail, one at a time
                                  lambda kk, accs: self._products(mr, nw, x, ldx, w, ldw, kk, accs, False))
        for i in range(mr):
            for j in range(nw):
                ptr = self.gep(out, b.add(b.mul(ir.Constant(i64, i), ldo), ir.Constant(i64, j)))
                total = sums[i * nw + j]
                b.store(b.select(accumulate, b.fadd(b.load(ptr), total), total), ptr)
        b.branch(done)

    def _products(self, mr, nw, x, ldx, w, ldw, kk, accs, vectors):
        """``accs`` plus the products at ``kk``: of vectors along ``K``, or of single elements."""
        b, i64 = self.b, self.i64
        load, fma = (self.vload, self.fma) if vectors else (b.load, self.scalar_fma)
        w_rows = [load(self.gep(w, b.add(b.mul(ir.Constant(i64, j), ldw), kk))) for j in range(nw)]
        new = []
        for i in range(mr):
            x_row = load(self.gep(x, b.add(b.mul(ir.Constant(i64, i), ldx), kk)))
            new += [b.call(fma, [x_row, w_rows[j], accs[i * nw + j]]) for j in range(nw)]
        return new

    def _counted_loop(self, start, step, stop, inits, body):
        """``accs = body(kk, accs)`` for ``kk`` from ``start`` by ``step`` while ``kk + step <= stop`` (never
        unrolled: no spills), the accumulators starting from ``inits``; returns them at the exit."""
        b, i64 = self.b, self.i64
        entry = b.block
        header, loop, exit_ = (b.append_basic_block(f"loop_{part}") for part in ("head", "body", "exit"))
        b.branch(header)
        b.position_at_end(header)
        kk = b.phi(i64)
        kk.add_incoming(start, entry)
        accs = [b.phi(value.type) for value in inits]
        for acc, value in zip(accs, inits, strict=True):
            acc.add_incoming(value, entry)
        b.cbranch(b.icmp_signed("<=", b.add(kk, ir.Constant(i64, step)), stop), loop, exit_)
        b.position_at_end(loop)
        new = body(kk, accs)
        kk.add_incoming(b.add(kk, ir.Constant(i64, step)), b.block)
        for acc, value in zip(accs, new, strict=True):
            acc.add_incoming(value, b.block)
        b.branch(header).set_metadata("llvm.loop", no_unroll(b.module))
        b.position_at_end(exit_)
        return accs


def _kernel_function(module: ir.Module, real: ir.Type, itemsize: int) -> ir.Function:
    """The module's copy of every ``(mr, nw)`` tile behind one switch (:func:`.simd_ir.switched_kernel`)."""
    i64, ptr = ir.IntType(64), real.as_pointer()

    def emit(builder, mr, nw, args, done):
        _DotEmitter(builder, real, itemsize).dot_tile(mr, nw, *args[2:], done)

    shapes = [(mr, nw) for nw in range(1, W_ROWS + 1) for mr in range(1, ROWS + 1)]
    return switched_kernel(module, f"arrayrnn_row_dot_{VARIANT}_f{8 * itemsize}",
                           [i64, i64, ptr, i64, ptr, i64, i64, ptr, i64, ir.IntType(1)], shapes, emit)


@intrinsic
def _tile_ir(typingctx, mr, nw, x, ldx, w, ldw, k, out, ldo, accumulate, like):
    """One tile of :func:`dot_rows`; addresses as integers, strides in elements, ``like`` a scalar of the
    element type."""
    if not isinstance(like, types.Float):
        return None
    i64, ptr = types.int64, types.uintp
    sig = types.void(i64, i64, ptr, i64, ptr, i64, i64, ptr, i64, types.boolean, like)

    def codegen(context, builder, signature, args):
        real = context.get_value_type(like)
        kernel = _kernel_function(builder.module, real, like.bitwidth // 8)
        values = list(args[:-1])
        for at in (2, 4, 7):                          # the addresses of x, w and out
            values[at] = builder.inttoptr(values[at], real.as_pointer())
        builder.call(kernel, values)
        return context.get_dummy_value()
    return sig, codegen


def dot_rows(x: np.ndarray, w: np.ndarray, out: np.ndarray, accumulate: bool = False) -> None:
    """``out = x @ w.T`` (``out += x @ w.T`` when ``accumulate``) for ``x (M, K)``, ``w (N, K)``
    (C-contiguous) and ``out (M, N)`` of one float dtype; each row of ``w`` read once (module doc). ``x`` is
    copied unless C-contiguous and writeable, and ``out`` must be both, ``w`` goes as its address: the kernel
    then has one signature per dtype (a read-only weight buffer needs none of its own)."""
    M, K = x.shape
    if w.shape != (out.shape[1], K) or out.shape[0] != M or not (x.dtype == w.dtype == out.dtype):
        raise ValueError(f"dot_rows: x {x.shape} {x.dtype}, w {w.shape} {w.dtype}, out {out.shape} "
                         f"{out.dtype}; expected x (M, K), w (N, K), out (M, N) of one dtype")
    if not w.flags.c_contiguous:
        raise ValueError(f"dot_rows: w (strides {w.strides}) must be C-contiguous")
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise ValueError(f"dot_rows: out ({out.dtype}, strides {out.strides}) must be C-contiguous, "
                         f"writeable, {x.dtype}")
    _dot_rows(writeable_rows(x), w.ctypes.data, out, accumulate)


def writeable_rows(a: np.ndarray) -> np.ndarray:
    """``a`` C-contiguous and writeable (the compiled callers' one signature per dtype), copied only where it
    is not."""
    flags = a.flags
    return a if flags.c_contiguous and flags.writeable else np.array(a, order="C")


@simd_jit(cache=True, nogil=True, error_model="numpy")
def _dot_rows(x, w, out, accumulate):
    """:func:`dot_rows` compiled: ``w`` an address."""
    rows_times_at(x, w, out, accumulate)


@register_jitable(inline="always")
def rows_times_at(x, w, out, accumulate):
    """``out (+)= x @ w.T`` inside compiled code (:func:`dot_rows`'s contract, ``w`` an address)."""
    M, K = x.shape
    N = out.shape[1]
    item = x.itemsize
    like = x.dtype.type(0)
    for j in range(0, N, W_ROWS):
        nw = min(W_ROWS, N - j)
        for i in range(0, M, ROWS):
            mr = min(ROWS, M - i)
            _tile_ir(mr, nw, x.ctypes.data + i * K * item, K, w + j * K * item, K, K,
                     out.ctypes.data + (i * N + j) * item, N, accumulate, like)
