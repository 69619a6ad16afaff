"""The SIMD micro-kernel of the packed GEMM: a numba intrinsic emitting LLVM vector IR, one variant per CPU.

One call of :func:`tile` computes an ``mr x nv`` register tile of ``C = A @ B`` (``mr`` rows of ``A``,
``nv`` vectors of ``W`` columns of ``B``) over a ``K`` range and stores it into ``C`` (or, accumulating,
goes on from ``C``'s tile). ``B`` is packed (:mod:`.packed_gemm`): vector column ``v`` is a contiguous
``(K, W)`` block, so every step of the K loop loads ``nv`` vectors, broadcasts ``mr`` elements of ``A``
and issues ``mr * nv`` fused multiply-adds into accumulators that stay in registers::

    for kk in range(K):                                   # no unrolling (loop metadata): no spills
        b_v = B[v, kk, :]                                 # <W x float> loads, v < nv
        acc[i][v] = fma(splat(A[i, kk]), b_v, acc[i][v])  # i < mr
    C[i, v * cvs : v * cvs + W] = acc[i][v]               # acc starts from C's tile when accumulating

Variants (:data:`VARIANT`), chosen at import from the CPU numba compiles for (numba's
``NUMBA_CPU_NAME``/``NUMBA_CPU_FEATURES`` when set, else the host's features), or forced with the
environment variable ``ARRAYRNN_SIMD``:

- ``avx512``: 512-bit vectors (16 float32 / 8 float64 lanes), 32 registers, ``llvm.fma``;
- ``avx2``: 256-bit vectors with FMA, 16 registers;
- ``portable``: 128-bit generic LLVM vectors and ``llvm.fmuladd`` (a fused multiply-add where the CPU
  has one, multiply then add where not): LLVM lowers these on every target numba supports (e.g.
  aarch64 NEON), so this variant runs anywhere.

``mr`` and ``nv`` are run-time arguments: the intrinsic emits one K loop per supported ``(nv, mr)``
pair (:func:`max_rows`) behind a switch, so a caller compiles the kernel once.

Pitfalls this module avoids (each measured to cost speed or correctness): without the
``llvm.loop.unroll.disable`` metadata LLVM unrolls the K loop and spills accumulators; llvmlite cannot
declare vector intrinsics by itself (they are declared by full name, e.g. ``llvm.fma.v16f32``); numba's
on-disk cache does not see IR selected by an environment variable, so every cached function that
reaches this kernel is compiled with :func:`simd_jit`, whose cache key includes the variant and a digest
of the kernel modules' source (numba's cache of a caller does not notice a change in a callee's module).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numba
from llvmlite import binding as llvm
from llvmlite import ir
from numba import types
from numba.core import caching
from numba.extending import intrinsic

from ..numba_cache import njit

VARIANTS = ("avx512", "avx2", "portable")
_VECTOR_BITS = {"avx512": 512, "avx2": 256, "portable": 128}
_REGISTERS = {"avx512": 32, "avx2": 16, "portable": 16}
MAX_NV = 4  # vectors per tile, at most


def _numba_target_features() -> set[str] | None:
    """The features numba was told to compile for (``NUMBA_CPU_FEATURES``), or ``None``."""
    forced = numba.config.CPU_FEATURES
    if not forced:
        return None
    return {f[1:] for f in forced.split(",") if f.startswith("+")}


def detect_variant() -> str:
    """The variant for the CPU numba compiles for: ``ARRAYRNN_SIMD`` if set, else from its features."""
    forced = os.environ.get("ARRAYRNN_SIMD", "").strip().lower()
    if forced:
        if forced not in VARIANTS:
            raise ValueError(f"ARRAYRNN_SIMD={forced!r} is not a SIMD variant; expected one of {VARIANTS} "
                             "(or unset it to choose from the CPU's features)")
        return forced
    features = _numba_target_features()
    if features is None:
        features = {name for name, on in llvm.get_host_cpu_features().items() if on}
    if {"avx512f", "fma"} <= features:
        return "avx512"
    if {"avx2", "fma"} <= features:
        return "avx2"
    return "portable"


VARIANT = detect_variant()


def lanes(itemsize: int, variant: str = VARIANT) -> int:
    """Elements per vector for ``itemsize``-byte floats."""
    return _VECTOR_BITS[variant] // (8 * itemsize)


# the most rows of an nv-vector tile, by register count: mr * nv accumulators, nv loads and the
# broadcasts must fit the register file (with 32 registers, 11x2 and 12x2 tiles spilled: LLVM hoists
# the broadcasts of A, each used twice, into registers ahead of the FMAs)
_MAX_ROWS = {32: (14, 10, 8, 6), 16: (12, 6, 3, 2)}


def max_rows(nv: int, variant: str = VARIANT) -> int:
    """The most rows of an ``nv``-vector tile (``1 <= nv <= MAX_NV``)."""
    return _MAX_ROWS[_REGISTERS[variant]][nv - 1]


REGISTERS = _REGISTERS[VARIANT]
"""The vector registers of this variant."""

ROWS_BY_NV = (0,) + _MAX_ROWS[_REGISTERS[VARIANT]]
"""``ROWS_BY_NV[nv] == max_rows(nv)`` for this variant, as a tuple compiled code can index."""

SMALL_TILE = 4
"""A tile of at most this many accumulators (``mr * nv``) sums :data:`SMALL_TILE_SETS` sets: its bits depend
on where its K range starts and ends, so a K-blocked product runs such a tile over the whole K at once."""

SMALL_TILE_SETS = 4 if _REGISTERS[VARIANT] == 32 else 2
"""Accumulator sets of a tile of at most 4 accumulators (a batch-1 step's GEMV): with 32 registers, 4 sets
(16 accumulators) keep more of the weights' L2 reads in flight than 2 (a GRU step's 128 x 384 GEMV 3.4-3.5
-> 3.1-3.2 us, bench/RESULTS.md); with 16 registers 2 (8 accumulators), which fit."""


# -- numba cache keyed on the variant -------------------------------------------------------------
KERNEL_SOURCES = ("numba/simd_ir.py", "numba/packed_gemm.py", "gate_math.py", "step_order.py",
                  "numba/spin_barrier.py", "numba/bundles.py", "numba/loop_parts.py")
"""The modules whose compiled code the time loops call into, relative to ``arrayrnn/engines/`` (their
digest keys the cache)."""


def _kernel_sources_digest() -> str:
    """A digest of the source of this module and of the other modules the time loops call into
    (:mod:`.packed_gemm`, :mod:`arrayrnn.engines.gate_math`, :mod:`arrayrnn.engines.step_order`,
    :mod:`.spin_barrier`, the cells' common parts :mod:`.loop_parts`) or read their arguments with
    (:mod:`.bundles`): numba's cache of a caller does not notice a change in a callee's module (nor in a named
    tuple's fields), so the key of every function compiled with :func:`simd_jit` carries it."""
    engines = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for name in KERNEL_SOURCES:
        digest.update((engines / name).read_bytes())
    return digest.hexdigest()[:16]


_CACHE_TAG = ("arrayrnn-simd", VARIANT, _kernel_sources_digest())


def _variant_index_key(cache: caching.FunctionCache):
    """numba's index key of ``cache`` with the variant and the kernel sources' digest appended."""
    plain = cache._index_key

    def key(sig, codegen):
        return plain(sig, codegen) + (_CACHE_TAG,)
    return key


def simd_jit(**options):
    """``numba.njit(**options)`` whose ``cache=True`` on-disk cache is keyed on the SIMD variant too."""
    def decorate(fn):
        dispatcher = njit(**options)(fn)
        cache = getattr(dispatcher, "_cache", None)
        if isinstance(cache, caching.FunctionCache):
            cache._index_key = _variant_index_key(cache)
        return dispatcher
    return decorate


# -- IR generation --------------------------------------------------------------------------------
def declare(module: ir.Module, name: str, fnty: ir.FunctionType) -> ir.Function:
    existing = module.globals.get(name)
    return existing if existing is not None else ir.Function(module, fnty, name=name)


def no_unroll(module: ir.Module) -> ir.MDValue:
    """A fresh self-referencing ``!llvm.loop`` node that forbids unrolling."""
    disable = module.add_metadata([ir.MetaDataString(module, "llvm.loop.unroll.disable")])
    node = module.add_metadata([ir.MetaDataString(module, f"arrayrnn.loop.{len(module.metadata)}"), disable])
    node.operands = (node, disable)
    return node


class Emitter:
    """Emits the K loops of one element type for one variant into the current function."""

    def __init__(self, builder: ir.IRBuilder, real: ir.Type, itemsize: int):
        self.b = builder
        self.real = real
        self.W = lanes(itemsize)
        self.align = itemsize
        self.vec = ir.VectorType(real, self.W)
        suffix = f"v{self.W}f{8 * itemsize}"
        name = "llvm.fmuladd" if VARIANT == "portable" else "llvm.fma"
        self.fma = declare(builder.module, f"{name}.{suffix}", ir.FunctionType(self.vec, [self.vec] * 3))
        self.scalar_fma = declare(builder.module, f"{name}.f{8 * itemsize}",
                                  ir.FunctionType(real, [real] * 3))
        self.i64 = ir.IntType(64)
        self.zero_vec = ir.Constant(self.vec, [0.0] * self.W)

    def gep(self, base, offset):
        return self.b.gep(base, [offset], inbounds=True)

    def splat(self, scalar):
        b = self.b
        one = b.insert_element(ir.Constant(self.vec, ir.Undefined), scalar, ir.Constant(ir.IntType(32), 0))
        return b.shuffle_vector(one, ir.Constant(self.vec, ir.Undefined),
                                ir.Constant(ir.VectorType(ir.IntType(32), self.W), [0] * self.W))

    def lanes_sums(self, vecs):
        """The sum of each vector's lanes, all in one tree: two vectors of ``g`` sums of ``s`` lanes each
        become one of ``2 g`` sums of ``s / 2`` lanes (each sum's low half plus its high half), until every
        lane is a sum. A sum's order is fixed by the lane count alone (lane ``l`` plus ``l + W/2``, then
        ``l + W/4``, ...), not by how many vectors are summed with it."""
        b, i32, W = self.b, ir.IntType(32), self.W
        level, per = list(vecs), W  # the vectors, each holding W // per sums of `per` lanes
        while per > 1:
            if len(level) % 2:
                level.append(self.zero_vec)
            half, groups = per // 2, W // per
            low = [q * per + r for q in range(2 * groups) for r in range(half)]
            high = [i + half for i in low]
            shuffle = [ir.Constant(ir.VectorType(i32, W), lanes) for lanes in (low, high)]
            level = [b.fadd(b.shuffle_vector(one, two, shuffle[0]), b.shuffle_vector(one, two, shuffle[1]))
                     for one, two in zip(level[::2], level[1::2], strict=True)]
            per = half
        return [b.extract_element(level[n // W], ir.Constant(i32, n % W)) for n in range(len(vecs))]

    def vload(self, ptr):
        return self.b.load(self.b.bitcast(ptr, self.vec.as_pointer()), align=self.align)

    def vstore(self, value, ptr):
        self.b.store(value, self.b.bitcast(ptr, self.vec.as_pointer()), align=self.align)

    def k_loop(self, mr, nv, a, lda, bp, pstride, k, kk_start, init_sets):
        """A K loop from ``kk_start`` taking one ``k`` per accumulator set per iteration while all fit
        (``kk + len(sets) <= k``); returns the ``kk`` it stopped at and the sets."""
        b, i64 = self.b, self.i64
        split = len(init_sets)
        entry = b.block
        header = b.append_basic_block(f"k_head_{mr}x{nv}")
        body = b.append_basic_block(f"k_body_{mr}x{nv}")
        exit_ = b.append_basic_block(f"k_exit_{mr}x{nv}")
        b.branch(header)
        b.position_at_end(header)
        kk = b.phi(i64, name="kk")
        kk.add_incoming(kk_start, entry)
        sets = [[[b.phi(self.vec) for _ in range(nv)] for _ in range(mr)] for _ in range(split)]
        for acc_set, init in zip(sets, init_sets, strict=True):
            for row, init_row in zip(acc_set, init, strict=True):
                for acc, value in zip(row, init_row, strict=True):
                    acc.add_incoming(value, entry)
        b.cbranch(b.icmp_signed("<=", b.add(kk, ir.Constant(i64, split)), k), body, exit_)
        b.position_at_end(body)
        new_sets = []
        for part, accs in enumerate(sets):
            at = b.add(kk, ir.Constant(i64, part))
            b_at = b.mul(at, ir.Constant(i64, self.W))
            bvecs = [self.vload(self.gep(bp, b.add(b.mul(ir.Constant(i64, v), pstride), b_at)))
                     for v in range(nv)]
            new = []
            for i in range(mr):
                a_vec = self.splat(b.load(self.gep(a, b.add(b.mul(ir.Constant(i64, i), lda), at))))
                new.append([b.call(self.fma, [a_vec, bvecs[v], accs[i][v]]) for v in range(nv)])
            new_sets.append(new)
        latch = b.block
        kk.add_incoming(b.add(kk, ir.Constant(i64, split)), latch)
        for accs, new in zip(sets, new_sets, strict=True):
            for row, new_row in zip(accs, new, strict=True):
                for acc, value in zip(row, new_row, strict=True):
                    acc.add_incoming(value, latch)
        b.branch(header).set_metadata("llvm.loop", no_unroll(b.module))
        b.position_at_end(exit_)
        return kk, sets

    def tile(self, mr, nv, a, lda, bp, pstride, k, c, ldc, cvs, accumulate, done):
        """One ``mr x nv`` tile: the K loop, then the stores; branches to ``done``. ``accumulate`` starts the
        accumulators from ``C`` (the FMA chain goes on from it), so a product split into K blocks, each
        accumulating, has the bits of the whole product at once (but for a small tile, below). A tile of at
        most :data:`SMALL_TILE` accumulators would
        wait on the FMA latency: it runs :data:`SMALL_TILE_SETS` sets (``k`` modulo the sets), then a
        remainder loop, and adds the sets."""
        b, i64 = self.b, self.i64
        zeros = [[self.zero_vec] * nv for _ in range(mr)]
        ptrs = [[self.gep(c, b.add(b.mul(ir.Constant(i64, i), ldc), b.mul(ir.Constant(i64, v), cvs)))
                 for v in range(nv)] for i in range(mr)]
        start = self.from_c_if(accumulate, ptrs, zeros)
        split = SMALL_TILE_SETS if mr * nv <= SMALL_TILE else 1
        first = [start] + [zeros] * (split - 1)
        kk, sets = self.k_loop(mr, nv, a, lda, bp, pstride, k, ir.Constant(i64, 0), first)
        finals = sets[0]
        if split > 1:
            _, (finals,) = self.k_loop(mr, nv, a, lda, bp, pstride, k, kk, [sets[0]])
            for other in sets[1:]:
                finals = [[b.fadd(finals[i][v], other[i][v]) for v in range(nv)] for i in range(mr)]
        for i in range(mr):
            for v in range(nv):
                self.vstore(finals[i][v], ptrs[i][v])
        b.branch(done)

    def from_c_if(self, accumulate, ptrs, zeros):
        """The accumulators' start: the tile of ``C`` at ``ptrs`` when ``accumulate``, else ``zeros``."""
        b = self.b
        with b.if_else(accumulate) as (load, zero):
            with load:
                loaded = [[self.vload(p) for p in row] for row in ptrs]
                load_end = b.block
            with zero:
                zero_end = b.block
        start = []
        for loaded_row, zero_row in zip(loaded, zeros, strict=True):
            row = []
            for value, zero_value in zip(loaded_row, zero_row, strict=True):
                phi = b.phi(self.vec)
                phi.add_incoming(value, load_end)
                phi.add_incoming(zero_value, zero_end)
                row.append(phi)
            start.append(row)
        return start


@intrinsic
def _tile_ir(typingctx, mr, nv, a, lda, bp, pstride, k, c, ldc, cvs, accumulate, like):
    """The intrinsic behind :func:`tile`; ``like`` (a scalar) gives the element type."""
    real_type = like
    if not isinstance(real_type, types.Float):
        return None
    i64, ptr = types.int64, types.uintp
    sig = types.void(i64, i64, ptr, i64, ptr, i64, i64, ptr, i64, i64, types.boolean, real_type)

    def codegen(context, builder, signature, args):
        real = context.get_value_type(real_type)
        kernel = _kernel_function(builder.module, real, real_type.bitwidth // 8)
        values = list(args[:-1])
        for at in (2, 4, 7):                          # the addresses of A, B and C
            values[at] = builder.inttoptr(values[at], real.as_pointer())
        builder.call(kernel, values)
        return context.get_dummy_value()
    return sig, codegen


def switched_kernel(module: ir.Module, name: str, args: list[ir.Type], shapes: list[tuple[int, int]],
                    emit_case) -> ir.Function:
    """The module's copy of the kernel function ``name``, ``noinline`` (its callers share one body instead of
    inlining every case each: compile time): one case per ``(rows, cols)`` of ``shapes``, chosen by its
    first two arguments, each emitted by ``emit_case(builder, rows, cols, fn.args, done)``, which branches
    to ``done``."""
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), args), name=name)
    fn.linkage = "linkonce_odr"
    fn.attributes.add("noinline")
    fn.attributes.add("nounwind")
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    done = builder.append_basic_block("done")
    switch_bb = builder.block
    cases = []
    for rows, cols in shapes:
        case = builder.append_basic_block(f"case_{rows}x{cols}")
        builder.position_at_end(case)
        emit_case(builder, rows, cols, fn.args, done)
        cases.append((cols * 64 + rows, case))
    builder.position_at_end(switch_bb)
    i64 = ir.IntType(64)
    switch = builder.switch(builder.add(builder.mul(fn.args[1], ir.Constant(i64, 64)), fn.args[0]), done)
    for value, case in cases:
        switch.add_case(ir.Constant(i64, value), case)
    builder.position_at_end(done)
    builder.ret_void()
    return fn


def _kernel_function(module: ir.Module, real: ir.Type, itemsize: int) -> ir.Function:
    """The module's copy of the whole kernel: every tile shape behind one switch (:func:`switched_kernel`)."""
    i64, ptr = ir.IntType(64), real.as_pointer()

    def emit(builder, mr, nv, args, done):
        Emitter(builder, real, itemsize).tile(mr, nv, *args[2:], done)

    shapes = [(mr, nv) for nv in range(1, MAX_NV + 1) for mr in range(1, max_rows(nv) + 1)]
    return switched_kernel(module, f"arrayrnn_simd_tile_{VARIANT}_f{8 * itemsize}",
                           [i64, i64, ptr, i64, ptr, i64, i64, ptr, i64, i64, ir.IntType(1)], shapes, emit)


@intrinsic
def prefer_full_vectors(typingctx):
    """Lets LLVM's loop vectoriser use the variant's full vector width in the calling compiled function.

    LLVM tunes AVX-512 CPUs (Skylake-X and later) to prefer 256-bit vectors in the loops it vectorises;
    the kernels' gate math, vectorised by LLVM, ran 1.45x faster at 512 bits (S1's LSTM gate pass alone,
    one thread: 18.5 ms -> 12.7 ms). The two function attributes are LLVM's own; llvmlite's attribute set
    knows only enum attributes, so the key-value pairs are added to the set directly."""
    def codegen(context, builder, signature, args):
        if VARIANT == "avx512":
            width = _VECTOR_BITS[VARIANT]
            for key in ("prefer-vector-width", "min-legal-vector-width"):
                set.add(builder.function.attributes, f'"{key}"="{width}"')
        return context.get_dummy_value()
    return types.none(), codegen


@numba.njit(nogil=True)
def tile(mr, nv, a, lda, bp, pstride, k, c, ldc, cvs, accumulate, like):
    """``C[i, v*cvs : v*cvs + W] (+)= sum_kk A[i, kk] * B[v, kk, :]`` for ``i < mr``, ``v < nv``.

    Addresses (``.ctypes.data``) and strides in elements: ``A[i, kk]`` at ``a + i*lda + kk``,
    ``B[v, kk, :]`` at ``bp + v*pstride + kk*W``, ``C[i, col]`` at ``c + i*ldc + col``; ``accumulate``
    starts each sum from ``C`` instead of zero (so products over consecutive K blocks, all but the first
    accumulating, give the whole product's bits); ``like`` is any scalar of the element type. ``1 <= mr <=
    max_rows(nv)``, ``1 <= nv <= MAX_NV`` (other values do nothing).
    """
    _tile_ir(mr, nv, a, lda, bp, pstride, k, c, ldc, cvs, accumulate, like)
