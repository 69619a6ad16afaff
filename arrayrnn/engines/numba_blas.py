"""GEMM from compiled code through NumPy's own BLAS: one BLAS library in the process, no SciPy.

numba's ``np.dot`` goes through SciPy's BLAS, a second OpenBLAS copy with its own thread pool (measured
2-3x slower next to NumPy's). Instead we look up ``cblas_sgemm`` / ``cblas_dgemm`` in the BLAS library
NumPy itself loaded (found through threadpoolctl), register their addresses with LLVM under fixed
names (``arrayrnn_cblas_{s,d}gemm_{ilp64,lp64}``), and declare those names as numba external
functions. Compiled code refers to the fixed names only, so ``cache=True`` stays valid across processes:
each process binds the names to its own library at import.

:func:`transposed` copies ``W.T`` contiguous with the same library's ``cblas_?omatcopy`` (an OpenBLAS
and MKL extension; 6-12x faster than NumPy's strided copy here, e.g. 0.26 vs 3.1 ms for 2048 x 512),
falling back to NumPy where the library lacks it.

Semantics of :func:`gemm` (row-major, ``@`` = matrix product, ``lda`` etc. are row strides in elements)::

    C[:m, :n] = alpha * A[:m, :k] @ (B[:k, :n] if not trans_b else B[:n, :k].T) + beta * C[:m, :n]

For a few rows (one row at batch 1) BLAS's per-call overhead dominates, so :func:`gemm` runs
:func:`small_gemm`, a vectorised loop, below :data:`SMALL_M` rows.
"""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
import threadpoolctl
from llvmlite import binding as llvm
from numba import types
from numba.extending import overload

CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_TRANS = 101, 111, 112

# symbol name in the library -> integer width of its interface (64: ILP64, 32: LP64), in preference order
_SYMBOLS = {
    kind: ((f"scipy_cblas_{kind}gemm64_", 64), (f"cblas_{kind}gemm64_", 64), (f"scipy_cblas_{kind}gemm", 32),
           (f"cblas_{kind}gemm", 32))
    for kind in "sd"
}

SMALL_M = 4  # below this many rows, small_gemm beats a BLAS call (measured: 1 x 128 x 512: 1.3 vs 3.1 us)
# gemm_step runs a per-step product flipped for SMALL_M..FLIPPED_MAX_M rows by a weight of at least
# FLIPPED_MIN_WEIGHT elements, where it measured faster (bench/bench_step_gemm.py, bench/RESULTS.md)
FLIPPED_MAX_M = 16
FLIPPED_MIN_WEIGHT = 256 * 1024


@dataclass(frozen=True)
class BlasBinding:
    """Where the GEMMs go: NumPy's BLAS library, its interface width, and its out-of-place transposes."""

    filepath: str
    ilp64: bool
    omatcopy: dict[str, Any]   # {"float32": ctypes function, "float64": ...}; empty where absent

    def describe(self) -> str:
        return f"{os.path.basename(self.filepath)} ({'ILP64' if self.ilp64 else 'LP64'} CBLAS)"


class BlasNotFoundError(RuntimeError):
    pass


def _numpy_blas_candidates() -> list[threadpoolctl.LibController]:
    """BLAS libraries loaded in the process, NumPy's own first."""
    controllers = [c for c in threadpoolctl.ThreadpoolController().lib_controllers if c.user_api == "blas"]
    numpy_root = os.path.dirname(os.path.dirname(os.path.abspath(np.__file__)))
    own = [c for c in controllers if os.path.abspath(c.filepath).startswith(numpy_root)
           and "numpy" in os.path.abspath(c.filepath)]
    return own + [c for c in controllers if c not in own]


def _omatcopy(lib: ctypes.CDLL, kind: str, width: int) -> Any:
    """``cblas_{kind}omatcopy`` of the library (same integer width as its GEMM), or ``None``."""
    names = ((f"scipy_cblas_{kind}omatcopy64_", f"cblas_{kind}omatcopy64_") if width == 64
             else (f"scipy_cblas_{kind}omatcopy", f"cblas_{kind}omatcopy"))
    for name in names:
        fn = getattr(lib, name, None)
        if fn is not None:
            i = ctypes.c_int64 if width == 64 else ctypes.c_int32
            real = ctypes.c_float if kind == "s" else ctypes.c_double
            fn.argtypes = [i, i, i, i, real, ctypes.c_void_p, i, ctypes.c_void_p, i]
            fn.restype = None
            return fn
    return None


def _lookup(lib: ctypes.CDLL, kind: str) -> tuple[int, int] | None:
    for symbol, width in _SYMBOLS[kind]:
        try:
            return ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value, width
        except AttributeError:
            continue
    return None


@functools.lru_cache(maxsize=1)
def blas_binding() -> BlasBinding:
    """Find NumPy's CBLAS GEMMs and bind the fixed LLVM names to them (once per process).

    Raises :class:`BlasNotFoundError` naming the libraries searched when none exports a CBLAS GEMM.
    """
    np.zeros((2, 2)) @ np.zeros((2, 2))  # make sure NumPy's BLAS is loaded
    searched = []
    for controller in _numpy_blas_candidates():
        lib = ctypes.CDLL(controller.filepath)
        found = {kind: _lookup(lib, kind) for kind in "sd"}
        searched.append(controller.filepath)
        if found["s"] is None or found["d"] is None or found["s"][1] != found["d"][1]:
            continue
        width = found["s"][1]
        for kind, (address, _) in found.items():
            # both widths get an address so that every name the compiled code mentions resolves;
            # only the one matching the library's width is ever called (the ilp64 flag)
            for suffix in ("ilp64", "lp64"):
                llvm.add_symbol(f"arrayrnn_cblas_{kind}gemm_{suffix}", address)
        omatcopy = {dtype: fn for dtype, kind in (("float32", "s"), ("float64", "d"))
                    if (fn := _omatcopy(lib, kind, width)) is not None}
        return BlasBinding(controller.filepath, width == 64, omatcopy)
    raise BlasNotFoundError("no BLAS library loaded by NumPy exports cblas_sgemm/cblas_dgemm "
                            f"(searched: {searched or 'none found by threadpoolctl'})")


def _external_gemm(kind: str, width: int) -> types.ExternalFunction:
    i = types.int64 if width == 64 else types.int32
    real = types.float32 if kind == "s" else types.float64
    sig = types.void(i, i, i, i, i, i, real, types.voidptr, i, types.voidptr, i, real, types.voidptr, i)
    return types.ExternalFunction(f"arrayrnn_cblas_{kind}gemm_{'ilp64' if width == 64 else 'lp64'}", sig)


_sgemm64, _sgemm32 = _external_gemm("s", 64), _external_gemm("s", 32)
_dgemm64, _dgemm32 = _external_gemm("d", 64), _external_gemm("d", 32)


def _blas_gemm(ilp64, a, b, c, beta, trans_b):
    """BLAS ``c = a @ (b.T if trans_b else b) + beta * c``; typed per dtype by the overload below."""


@overload(_blas_gemm, inline="always")
def _blas_gemm_impl(ilp64, a, b, c, beta, trans_b):
    single = c.dtype == types.float32
    real = np.float32 if single else np.float64
    f64, f32 = (_sgemm64, _sgemm32) if single else (_dgemm64, _dgemm32)

    def impl(ilp64, a, b, c, beta, trans_b):
        m, k = a.shape
        n = b.shape[0] if trans_b else b.shape[1]
        item = a.itemsize
        lda, ldb, ldc = a.strides[0] // item, b.strides[0] // item, c.strides[0] // item
        one, scale = real(1.0), real(beta)
        op_b = CBLAS_TRANS if trans_b else CBLAS_NO_TRANS
        if ilp64:
            f64(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, op_b, m, n, k, one, a.ctypes.data, lda,
                b.ctypes.data, ldb, scale, c.ctypes.data, ldc)
        else:
            i32 = np.int32
            f32(i32(CBLAS_ROW_MAJOR), i32(CBLAS_NO_TRANS), i32(op_b), i32(m), i32(n), i32(k), one,
                a.ctypes.data, i32(lda), b.ctypes.data, i32(ldb), scale, c.ctypes.data, i32(ldc))
    return impl


@numba.njit(cache=True, nogil=True, error_model="numpy")
def small_gemm(a, b, c, beta):
    """``c = a @ b + beta * c`` for a few rows of ``a``; the inner loop runs along the rows of ``b``.

    Eight rows of ``b`` per pass over ``c[row]``: one load and one store of ``c`` per eight multiply-adds
    (four per pass: 8% slower at 1 x 128 x 512).
    """
    m, k = a.shape
    n = b.shape[1]
    for row in range(m):
        if beta == 0.0:
            c[row, :] = 0.0
        a_row, c_row = a[row], c[row]
        k8 = k - k % 8
        for kk in range(0, k8, 8):
            a0, a1, a2, a3 = a_row[kk], a_row[kk + 1], a_row[kk + 2], a_row[kk + 3]
            a4, a5, a6, a7 = a_row[kk + 4], a_row[kk + 5], a_row[kk + 6], a_row[kk + 7]
            b0, b1, b2, b3, b4, b5, b6, b7 = b[kk], b[kk + 1], b[kk + 2], b[kk + 3], b[kk + 4], b[kk + 5], \
                b[kk + 6], b[kk + 7]
            for j in range(n):
                c_row[j] += ((a0 * b0[j] + a1 * b1[j]) + (a2 * b2[j] + a3 * b3[j])) + \
                    ((a4 * b4[j] + a5 * b5[j]) + (a6 * b6[j] + a7 * b7[j]))
        for kk in range(k8, k):
            ak, bk = a_row[kk], b[kk]
            for j in range(n):
                c_row[j] += ak * bk[j]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def gemm(ilp64, a, b, c, beta):
    """``c = a @ b + beta * c`` for 2-D views with unit inner stride (rows may be strided).

    ``a (m, k)``, ``b (k, n)``, ``c (m, n)``; ``beta`` is 0.0 (overwrite) or 1.0 (accumulate).
    """
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0:
        return
    if m < SMALL_M or k == 0:
        small_gemm(a, b, c, beta)
        return
    _blas_gemm(ilp64, a, b, c, beta, False)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def gemm_step(ilp64, a, b, b_t, c, beta, scratch):
    """:func:`gemm` (``c = a @ b + beta * c``) for the per-step products of the time loops.

    ``b_t`` is ``b.T`` with contiguous rows and ``scratch`` a 1-D buffer of at least ``n * FLIPPED_MAX_M``
    elements (:func:`flipped_scratch`), or both zero-size. With them, a product of :data:`SMALL_M` to
    :data:`FLIPPED_MAX_M` rows runs flipped: ``scratch = b_t @ a.T``, an ``(n, m)`` GEMM with the weight as
    BLAS's left operand, then added to ``c`` transposed. OpenBLAS ran the flipped product of 4-16 rows
    by a large LSTM weight 1.3-2x faster here (bench/bench_step_gemm.py).
    """
    m, k = a.shape
    n = b.shape[1]
    if scratch.shape[0] == 0 or m < SMALL_M or m > FLIPPED_MAX_M or k == 0 or n == 0:
        gemm(ilp64, a, b, c, beta)
        return
    flipped_gemm(ilp64, a, b_t, c, beta, scratch[:n * m].reshape((n, m)))


@numba.njit(cache=True, nogil=True, error_model="numpy")
def flipped_gemm(ilp64, a, b_t, c, beta, prod):
    """``c = a @ b_t.T + beta * c`` as ``prod = b_t @ a.T`` (one BLAS GEMM into ``prod (n, m)``), then
    ``prod.T`` written or added into ``c``; ``m >= 1``, ``k >= 1``."""
    m, n = a.shape[0], b_t.shape[0]
    _blas_gemm(ilp64, b_t, a, prod, 0.0, True)
    for i in range(m):
        c_row = c[i]
        if beta == 0.0:
            for j in range(n):
                c_row[j] = prod[j, i]
        else:
            for j in range(n):
                c_row[j] += prod[j, i]


def flipped_scratch(rows: int, k: int, n: int, dtype: Any) -> np.ndarray:
    """The ``scratch`` of :func:`gemm_step` for per-step products ``(<= rows, k) @ (k, n)``: a buffer where
    some step can run flipped (:data:`SMALL_M` <= rows and a weight of at least :data:`FLIPPED_MIN_WEIGHT`
    elements), else zero-size (every step direct)."""
    flips = rows >= SMALL_M and k * n >= FLIPPED_MIN_WEIGHT
    return np.empty(min(rows, FLIPPED_MAX_M) * n if flips else 0, dtype=dtype)


def transposed(W: np.ndarray) -> np.ndarray:
    """``W.T`` as a new C-contiguous array (``W``: 2-D, float32 or float64)."""
    rows, cols = W.shape
    fn = blas_binding().omatcopy.get(str(W.dtype))
    if fn is None or W.size == 0:
        return np.ascontiguousarray(W.T)
    W = np.ascontiguousarray(W)
    out = np.empty((cols, rows), dtype=W.dtype)
    fn(CBLAS_ROW_MAJOR, CBLAS_TRANS, rows, cols, 1.0, W.ctypes.data, cols, out.ctypes.data, rows)
    return out
