"""The cupy engine's CuPy branch on CPU: the CuPy stand-in (:mod:`support.fake_cupy`) under numba's CUDA
simulator (``NUMBA_ENABLE_CUDASIM=1``, the ``tests_cudasim`` run).

The engine packs each kernel's arguments once (:mod:`arrayrnn.engines.cupy.launch`); under the simulator a
launch decodes that block back into arrays and runs the simulator's kernel as a host function of CuPy's
current stream, so the stand-in's stream capture records it like a kernel node. Inside :func:`installed`:

- every array a launch decodes must lie inside one live stand-in array (an address the packing got wrong,
  or a buffer freed while a graph still names it, fails the test instead of reading stray memory);
- every time loop is captured into a graph at its first call (``cuda_graphs.CAPTURE_AFTER = 0``) and
  replayed, so the shared suites run every program through capture, whose stand-in refuses any allocation,
  host read or synchronisation inside the loop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from arrayrnn.engines.cupy import graphs as cuda_graphs
from arrayrnn.engines.cupy import launch as cuda_launch

from . import fake_cupy

_host_array = cuda_launch.host_array


def checked_host_array(m: cuda_launch.Memory) -> np.ndarray:
    """:func:`cuda_launch.host_array`, after checking the memory lies inside one live stand-in array."""
    view = _host_array(m)
    span = sum((n - 1) * s for n, s in zip(m.shape, m.strides, strict=True)) + m.dtype.itemsize
    if view.size and not fake_cupy.device_memory_covers(m.ptr, span):
        raise AssertionError(f"a kernel argument points outside any live CuPy array: {m}")
    return view


@contextlib.contextmanager
def installed(capture_after: int = 0) -> Iterator[Any]:
    """The CuPy stand-in with checked kernel arguments and graphs from the ``capture_after``-th call of a
    shape (yields the stand-in ``cupy``)."""
    saved = cuda_graphs.CAPTURE_AFTER
    with fake_cupy.installed() as cupy:
        cuda_launch.host_array = checked_host_array
        cuda_graphs.CAPTURE_AFTER = capture_after
        try:
            yield cupy
        finally:
            cuda_launch.host_array = _host_array
            cuda_graphs.CAPTURE_AFTER = saved
