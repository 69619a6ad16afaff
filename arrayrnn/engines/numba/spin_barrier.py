"""A spinning barrier for compiled code: threads running one time loop meet once per step.

numba has no atomics on the CPU target, so the three it needs are intrinsics emitting LLVM's atomic
instructions on an ``int64`` array: :func:`atomic_add` (returns the old value), :func:`atomic_load`
(acquire) and :func:`atomic_store` (release). :func:`barrier` is a generation barrier over
``sync = new_sync()``: the last thread to arrive resets the count and bumps the generation; the others spin
on the generation, with the CPU's pause hint, and after :data:`SPINS_BEFORE_YIELD` spins give their core
away (``sched_yield``) on every further spin, so a loaded machine, where the last thread waits for a core,
degrades gently instead of burning its time slices. :func:`cancel_barrier` releases every waiter for good:
:func:`barrier` then returns ``False`` (the caller's loop ends), so parts whose partner was interrupted
before it arrived, or failed, never spin forever. Semantics roughly::

    with lock: sync[0] += 1; last = sync[0] == parties
    if last: sync[0] = 0; sync[1] += 1            # release everyone
    else: wait until sync[1] changes or sync[cancelled] is set
    return not sync[cancelled]
"""

from __future__ import annotations

import sys

import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..numba_cache import njit

SPINS_BEFORE_YIELD = 1 << 10
# the slots of ``sync``: arrivals, then the generation and the cancel flag on the next cache line (the one
# waiters read)
_ARRIVED, _GENERATION, _CANCELLED = 0, 8, 9
_X86 = llvm.get_process_triple().startswith(("x86_64", "i386", "i686"))
_POSIX = sys.platform != "win32"


def new_sync() -> np.ndarray:
    """The barrier's state: arrivals, then generation and cancel flag a cache line further."""
    return np.zeros(16, np.int64)


def _pointer(context, builder, signature, args):
    arrty, idxty = signature.args[0], signature.args[1]
    ary = context.make_array(arrty)(context, builder, args[0])
    index = context.cast(builder, args[1], idxty, types.intp)
    return cgutils.get_item_pointer(context, builder, arrty, ary, [index])


def _int64_slot(arr, index, *values) -> bool:
    """Typing check: ``arr[index]`` of an int64 array, integer ``values``."""
    return (isinstance(arr, types.Array) and arr.dtype == types.int64 and isinstance(index, types.Integer)
            and all(isinstance(v, types.Integer) for v in values))


def _pointer_and_value(context, builder, signature, args):
    """The slot's pointer and the third argument as an int64 (for the intrinsics that write)."""
    value = context.cast(builder, args[2], signature.args[2], types.int64)
    return _pointer(context, builder, signature, args), value


@intrinsic
def atomic_add(typingctx, arr, index, value):
    """``old = arr[index]; arr[index] += value`` atomically (sequentially consistent); returns ``old``."""
    if not _int64_slot(arr, index, value):
        return None

    def codegen(context, builder, signature, args):
        return builder.atomic_rmw("add", *_pointer_and_value(context, builder, signature, args), "seq_cst")
    return types.int64(arr, index, value), codegen


@intrinsic
def atomic_load(typingctx, arr, index):
    """``arr[index]`` with acquire ordering."""
    if not _int64_slot(arr, index):
        return None

    def codegen(context, builder, signature, args):
        return builder.load_atomic(_pointer(context, builder, signature, args), "acquire", 8)
    return types.int64(arr, index), codegen


@intrinsic
def atomic_store(typingctx, arr, index, value):
    """``arr[index] = value`` with release ordering."""
    if not _int64_slot(arr, index, value):
        return None

    def codegen(context, builder, signature, args):
        ptr, value = _pointer_and_value(context, builder, signature, args)
        builder.store_atomic(value, ptr, "release", 8)
        return context.get_dummy_value()
    return types.none(arr, index, value), codegen


@intrinsic
def _pause(typingctx):
    """The spin-wait hint (x86 ``pause``); nothing elsewhere."""
    def codegen(context, builder, signature, args):
        if _X86:  # numba's JIT has no inline-asm parser: the pause instruction's LLVM intrinsic
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse2.pause")
            builder.call(fn, [])
        return context.get_dummy_value()
    return types.none(), codegen


@intrinsic
def _yield_core(typingctx):
    """``sched_yield()`` (POSIX; resolved by name, so functions calling it stay cacheable)."""
    def codegen(context, builder, signature, args):
        if _POSIX:
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), []),
                                                "sched_yield")
            builder.call(fn, [])
        return context.get_dummy_value()
    return types.none(), codegen


@njit(cache=True, nogil=True)
def barrier(sync, parties):
    """Wait until ``parties`` threads have called ``barrier(sync, parties)`` (reusable, once per step);
    ``True``, or ``False`` once the barrier is cancelled (:func:`cancel_barrier`): stop then."""
    if parties <= 1:
        return atomic_load(sync, _CANCELLED) == 0
    generation = atomic_load(sync, _GENERATION)
    if atomic_add(sync, _ARRIVED, 1) == parties - 1:
        atomic_store(sync, _ARRIVED, 0)
        atomic_add(sync, _GENERATION, 1)
        return atomic_load(sync, _CANCELLED) == 0
    spins = 0
    while atomic_load(sync, _GENERATION) == generation:
        if atomic_load(sync, _CANCELLED) != 0:
            return False
        spins += 1
        if spins < SPINS_BEFORE_YIELD:
            _pause()
        else:
            _yield_core()
    return atomic_load(sync, _CANCELLED) == 0


@njit(cache=True, nogil=True)
def _cancel(sync):
    atomic_store(sync, _CANCELLED, 1)


def cancel_barrier(sync: np.ndarray) -> None:
    """Release every thread waiting at ``sync``'s barrier, now and later (they return ``False``)."""
    _cancel(sync)
