"""The CPU's measured FMA peak: independent vector FMA chains in registers, per core and for all cores.

    python bench/cpu_peak.py [--threads 2]

A numba intrinsic emits a loop of 24 independent ``llvm.fma`` chains on vectors of the SIMD variant's
width (:mod:`arrayrnn.engines.numba.simd_ir`); nothing touches memory in the loop, so the rate is the core's
FMA throughput at the clock it runs at. Each thread runs its own loop (numba ``prange`` over threads);
the best of several runs is reported, in GFLOP/s (float32), with the FLOP/cycle it implies at the
nominal clock of ``/proc/cpuinfo`` when known.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from arrayrnn.engines.numba import simd_ir  # noqa: E402

CHAINS = 24
W = simd_ir.lanes(4)


@intrinsic
def _fma_loop(typingctx, iters):
    sig = types.float32(types.int64)

    def codegen(context, builder, signature, args):
        vec = ir.VectorType(ir.FloatType(), W)
        fma = simd_ir.declare(builder.module, f"llvm.fma.v{W}f32", ir.FunctionType(vec, [vec] * 3))
        entry = builder.block
        loop, done = builder.append_basic_block("loop"), builder.append_basic_block("done")
        builder.branch(loop)
        builder.position_at_end(loop)
        i = builder.phi(ir.IntType(64))
        i.add_incoming(ir.Constant(ir.IntType(64), 0), entry)
        accs = [builder.phi(vec) for _ in range(CHAINS)]
        for k, acc in enumerate(accs):
            acc.add_incoming(ir.Constant(vec, [float(k)] * W), entry)
        mul, add = ir.Constant(vec, [0.999999] * W), ir.Constant(vec, [1e-7] * W)
        new = [builder.call(fma, [acc, mul, add]) for acc in accs]
        nxt = builder.add(i, ir.Constant(ir.IntType(64), 1))
        for acc, value in zip(accs, new, strict=True):
            acc.add_incoming(value, loop)
        i.add_incoming(nxt, loop)
        br = builder.cbranch(builder.icmp_signed("<", nxt, args[0]), loop, done)
        br.set_metadata("llvm.loop", simd_ir.no_unroll(builder.module))
        builder.position_at_end(done)
        total = new[0]
        for value in new[1:]:
            total = builder.fadd(total, value)
        return builder.extract_element(total, ir.Constant(ir.IntType(32), 0))
    return sig, codegen


@numba.njit(parallel=True)
def _run(threads, iters, out):
    for t in numba.prange(threads):
        out[t] = _fma_loop(iters)


def measure(threads: int, iters: int = 20_000_000, runs: int = 5) -> float:
    """Best GFLOP/s (float32 FMAs) of ``threads`` threads each running ``iters`` loop iterations."""
    out = np.zeros(threads, np.float32)
    _run(threads, 1000, out)
    best = 0.0
    for _ in range(runs):
        start = time.perf_counter()
        _run(threads, iters, out)
        best = max(best, 2 * CHAINS * W * iters * threads / (time.perf_counter() - start) / 1e9)
    return best


def nominal_ghz() -> float | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                return float(line.split(":")[1]) / 1000
    except OSError:
        pass
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    numba.set_num_threads(args.threads)
    one, all_ = measure(1), measure(args.threads)
    ghz = nominal_ghz()
    print(f"SIMD variant: {simd_ir.VARIANT} ({W} float32 lanes)")
    print(f"peak float32 FMA rate: 1 thread {one:.1f} GFLOP/s, {args.threads} threads {all_:.1f} GFLOP/s")
    if ghz:
        print(f"at the nominal {ghz:.2f} GHz: {one / ghz:.1f} FLOP/cycle per core")


if __name__ == "__main__":
    main()
