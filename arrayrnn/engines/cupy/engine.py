"""The cupy engine: the shared stack driver on CuPy arrays, cuBLAS GEMMs and fused numba-CUDA gate kernels.

The driver (:mod:`arrayrnn.engines.stack`) runs layers x directions and every GEMM that can be hoisted
out of the time loop (input projections, weight gradients, ``dx``) with CuPy, i.e. cuBLAS.
:class:`GpuKernel` runs each direction's time loop as a program of :mod:`.programs` (per step one cuBLAS
GEMM into a preallocated buffer and one fused kernel of :mod:`.kernels`, forward and backward), built
once per shape on buffers of its own; :mod:`.graphs` runs it step by step on the first call of a shape
and as ONE CUDA graph launch on every later one.

The kernels are numba-cuda code, but not launched through numba's dispatcher: :mod:`.launch` packs each
launch's arguments once per program in numba's ABI and launches with ``cuLaunchKernel`` on CuPy's current
stream (the stream CuPy's GEMMs run on), so nothing in the loop waits for the GPU.

Under ``NUMBA_ENABLE_CUDASIM=1`` (set before numba's CUDA module is imported) the same kernel code runs
on NumPy arrays in numba's CUDA simulator: :class:`GpuKernel` then takes NumPy arrays, which is how CI
checks it against the reference engine. float16 params run with float32 math (the driver upcasts).

A custom cell (``RNNSpec(mode=<a registered cell>)``) runs the programs of :mod:`.custom_programs` around
kernels generated for its cell object (:mod:`.custom_kernels`); its programs are keyed on that object too, so
a cell registered again under the same name never runs the old one's graphs.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numba
import numpy as np

from ...core.backend import cupy_module, get_xp
from ...core.spec import RNNSpec
from ..base import Call, DirectionForward, DirectionGrads, DirectionWeights
from ..stack import StackEngine
from . import launch
from .custom_programs import CustomBackward, CustomForward
from .graphs import GraphCache
from .programs import Shape, backward_program, forward_program

Array = Any


class Device:
    """Where a program's kernels run: CuPy arrays on the GPU, or NumPy under numba's CUDA simulator (also a
    CuPy-like module there: the tests' stand-in)."""

    def __init__(self, xp: ModuleType):
        self.xp = xp
        if numba.config.ENABLE_CUDASIM:
            self._launcher = launch.SimulatorLauncher(None if xp is np else xp)
        elif xp is np:
            raise TypeError("the GPU kernels got NumPy arrays; they run on CuPy arrays (NumPy only under "
                            "numba's CUDA simulator, NUMBA_ENABLE_CUDASIM=1)")
        else:
            self._launcher = launch.DeviceLauncher(xp)

    def site(self, kernel: Any, args: Sequence[Any], block: int | None = None) -> launch.LaunchSite:
        """``kernel`` with ``args`` packed once (the first two, ``t`` and ``n``, set per launch); ``block``:
        its blocks' fixed width (None: :func:`~.kernels.launch_shape`'s choice)."""
        return self._launcher.site(kernel, args, block)


def _contiguous(xp: ModuleType, a: Array) -> Array:
    return xp.ascontiguousarray(a)


class GpuKernel:
    """:class:`~arrayrnn.engines.base.DirectionKernel`: the time loops of :mod:`.programs`, as CUDA graphs
    from a shape's second call (``graphs``: this kernel's :class:`~.graphs.GraphCache`)."""

    def __init__(self) -> None:
        self.graphs = GraphCache()

    def forward(self, spec: RNNSpec, w: DirectionWeights, xw: Array, batch_sizes: np.ndarray, h0: Array,
                c0: Array | None, reverse: bool, keep_cache: bool) -> DirectionForward:
        xp = get_xp(xw)
        xw = _contiguous(xp, xw)  # the driver's fresh projection: it receives the gate cache
        shape = _shape(xw, batch_sizes, reverse, w, keep=keep_cache)
        program_type = CustomForward if spec.custom_cell is not None else forward_program(spec)
        program = self.graphs.run(xp, ("forward", spec, spec.custom_cell, shape),
                                  lambda: program_type(Device(xp), spec, shape),
                                  lambda p: p.load(w, xw, h0, c0))
        return program.result(xw)

    def backward(self, spec: RNNSpec, w: DirectionWeights, fwd: DirectionForward, h_prev: Array,
                 c_prev: Array | None, dy: Array, dh_n: Array, dc_n: Array | None, batch_sizes: np.ndarray,
                 reverse: bool, dc_seq: Array | None = None) -> DirectionGrads:
        xp = get_xp(dy)
        shape = _shape(dy, batch_sizes, reverse, w, dc_seq=dc_seq is not None)
        program_type = CustomBackward if spec.custom_cell is not None else backward_program(spec)
        program = self.graphs.run(xp, ("backward", spec, spec.custom_cell, shape),
                                  lambda: program_type(Device(xp), spec, shape),
                                  lambda p: p.load(w, fwd, h_prev, c_prev, dy, dh_n, dc_n, dc_seq))
        return program.result()


def _shape(a: Array, batch_sizes: np.ndarray, reverse: bool, w: DirectionWeights, **options: bool) -> Shape:
    T, B = a.shape[:2]
    lengths = np.ascontiguousarray(batch_sizes, dtype=np.int64).tobytes()
    return Shape(T, B, lengths, reverse, w.variants, a.dtype, **options)


class CupyEngine(StackEngine):
    """The shared stack driver over :class:`GpuKernel`; CuPy arrays (GPU) only."""

    def __init__(self) -> None:
        super().__init__("cupy", GpuKernel())

    def check(self, call: Call) -> str | None:
        """``None`` for every call on CuPy arrays: this engine runs every configuration, custom cells included
        (so ``"auto"``, which asks cuDNN first, reaches it wherever cuDNN declines); otherwise what is
        missing."""
        cupy = cupy_module()
        if cupy is None:
            return "CuPy is not installed (pip install 'arrayrnn[gpu]')"
        if call.xp is not cupy:
            return "the cupy engine runs on CuPy arrays (GPU); use engine='numba' or 'reference' on CPU"
        return None


ENGINE = CupyEngine()
