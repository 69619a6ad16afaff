"""Per-step recurrent product, direct against flipped (``numba_blas.gemm_step``), by rows and weight shape.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_step_gemm.py

``c += a @ b`` with ``a`` (m, k) and ``b`` (k, n) as the time loops call it: direct is ``numba_blas.gemm``
(one BLAS GEMM, the weight on the right, :func:`small_gemm` below 4 rows); flipped is
``numba_blas.flipped_gemm``: ``b.T @ a.T`` (the weight on the left) into a scratch buffer, added to ``c``
transposed. Each cell: microseconds per product, median of 5 batches of repeated
calls in one compiled loop, 2 BLAS threads (``--threads``). The engine flips where this measured faster
(``FLIPPED_MAX_M``, ``FLIPPED_MIN_WEIGHT`` in ``arrayrnn/engines/numba_blas.py``). Never asserts timings.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numba
import numpy as np
import threadpoolctl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from arrayrnn.engines import numba_blas as nb  # noqa: E402

# (k, n, what): the per-step products of BENCH_SHAPES.md's layers (forward h @ W_hh.T, backward d @ W_hh)
PRODUCTS = ((256, 1024, "S1 LSTM forward"), (512, 2048, "S2 LSTM forward"), (256, 768, "S1 GRU forward"),
            (512, 1536, "S2 GRU forward"), (1024, 256, "S1 LSTM backward"), (2048, 512, "S2 LSTM backward"),
            (128, 512, "S3 LSTM forward"))
ROWS = (4, 8, 16, 32, 64)


@numba.njit(nogil=True)
def _direct(ilp64, a, b, c, reps):
    for _ in range(reps):
        nb.gemm(ilp64, a, b, c, 1.0)


@numba.njit(nogil=True)
def _flipped(ilp64, a, b_t, c, prod, reps):
    for _ in range(reps):
        nb.flipped_gemm(ilp64, a, b_t, c, 1.0, prod)


def _median_us(run, reps: int) -> float:
    run(1)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        run(reps)
        times.append((time.perf_counter() - t0) / reps)
    return float(np.median(times)) * 1e6


def measure(k: int, n: int, m: int, rng: np.random.Generator) -> tuple[float, float]:
    """(direct, flipped) microseconds for one ``(m, k) @ (k, n)`` product, after checking both agree."""
    ilp64 = nb.blas_binding().ilp64
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    b_t, c = np.ascontiguousarray(b.T), np.zeros((m, n), np.float32)
    prod = np.empty((n, m), np.float32)
    check = [np.zeros((m, n), np.float32) for _ in range(2)]
    nb.gemm(ilp64, a, b, check[0], 1.0)
    nb.flipped_gemm(ilp64, a, b_t, check[1], 1.0, prod)
    np.testing.assert_allclose(check[0], check[1], rtol=1e-4, atol=1e-3)
    reps = max(3, int(3e8 / (2 * m * k * n)))
    return (_median_us(lambda r: _direct(ilp64, a, b, c, r), reps),
            _median_us(lambda r: _flipped(ilp64, a, b_t, c, prod, r), reps))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    threadpoolctl.threadpool_limits(args.threads)
    rng = np.random.default_rng(0)
    print("| product (k x n) | " + " | ".join(f"m = {m}" for m in ROWS) + " |")
    print("|---|" + "---|" * len(ROWS))
    for k, n, what in PRODUCTS:
        cells = []
        for m in ROWS:
            direct, flipped = measure(k, n, m, rng)
            cells.append(f"{direct:.0f} / {flipped:.0f} ({direct / flipped:.2f}x)")
        print(f"| {what} ({k} x {n}) | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
