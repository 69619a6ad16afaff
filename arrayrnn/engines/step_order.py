"""The time-step order of a direction's loop, written once: the reference engine iterates it in Python
(:func:`.reference.time_steps`), the numba loops inline it into their compiled code (this module is part of
their cache key, :data:`.numba.simd_ir.KERNEL_SOURCES`). No numba here: the reference engine runs without it.
"""

from __future__ import annotations


def step_time(s: int, T: int, reverse: bool) -> int:
    """The time index of step ``s`` of ``T``: ``s`` forward, ``T - 1 - s`` in the reverse direction."""
    return T - 1 - s if reverse else s
