"""A spinning barrier for threads that run compiled numba code side by side.

numba has no atomics on the CPU target, so the three operations a barrier needs are LLVM atomic
instructions emitted by ``@intrinsic``s on an ``int64`` array. The barrier state is one array::

    state = np.zeros(BARRIER_SIZE, np.int64)   # [arrivals, generation], shared by every thread

:func:`barrier_wait` is a generation-counting barrier: the last thread to arrive resets the arrival
count and bumps the generation; the others spin (with the x86 ``pause`` hint) until the generation
changes. A step of a recurrent network on a small batch takes microseconds, far below what a sleeping
barrier (futex) costs to wake, hence spinning. Every participating thread must be running on its own
core (the caller guarantees it, see :mod:`.numba_split`), or the spinning threads wait for a time slice.
"""

from __future__ import annotations

import platform

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

BARRIER_SIZE = 2
_ARRIVALS, _GENERATION = 0, 1
_HAS_PAUSE = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")


def _element_pointer(context, builder, array_type, array, index):
    ary = context.make_array(array_type)(context, builder, array)
    return cgutils.get_item_pointer(context, builder, array_type, ary, [index])


@intrinsic
def atomic_add(typingctx, array, index, value):
    """``old = array[index]; array[index] += value; return old`` as one sequentially consistent step."""
    def codegen(context, builder, signature, args):
        ptr = _element_pointer(context, builder, signature.args[0], args[0], args[1])
        return builder.atomic_rmw("add", ptr, args[2], "seq_cst")
    return types.int64(array, types.intp, types.int64), codegen


@intrinsic
def atomic_load(typingctx, array, index):
    def codegen(context, builder, signature, args):
        ptr = _element_pointer(context, builder, signature.args[0], args[0], args[1])
        return builder.load_atomic(ptr, "seq_cst", 8)
    return types.int64(array, types.intp), codegen


@intrinsic
def atomic_store(typingctx, array, index, value):
    def codegen(context, builder, signature, args):
        ptr = _element_pointer(context, builder, signature.args[0], args[0], args[1])
        builder.store_atomic(args[2], ptr, "seq_cst", 8)
        return context.get_dummy_value()
    return types.none(array, types.intp, types.int64), codegen


@intrinsic
def cpu_pause(typingctx):
    """The spin-wait hint (x86 ``pause``); nothing elsewhere."""
    def codegen(context, builder, signature, args):
        if _HAS_PAUSE:
            pause = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                   "llvm.x86.sse2.pause")
            builder.call(pause, [])
        return context.get_dummy_value()
    return types.none(), codegen


@numba.njit(cache=True, nogil=True, inline="always")
def barrier_wait(state, nthreads):
    """Block until ``nthreads`` threads have called this with the same ``state``; reusable at once."""
    generation = atomic_load(state, _GENERATION)
    if atomic_add(state, _ARRIVALS, 1) == nthreads - 1:
        atomic_store(state, _ARRIVALS, 0)
        atomic_add(state, _GENERATION, 1)
    else:
        while atomic_load(state, _GENERATION) == generation:
            cpu_pause()


def new_barrier() -> np.ndarray:
    return np.zeros(BARRIER_SIZE, np.int64)
