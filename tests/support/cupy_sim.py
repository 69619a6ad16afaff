"""The cupy engine's CuPy branch on CPU: the CuPy stand-in (:mod:`support.fake_cupy`) under numba's CUDA
simulator (``NUMBA_ENABLE_CUDASIM=1``, the ``tests_cudasim`` run).

The engine wraps CuPy buffers with ``numba.cuda.from_cuda_array_interface(..., sync=False)`` and launches
on ``numba.cuda.external_stream(<CuPy's current stream>)``; the simulator has neither (its kernels take
NumPy arrays and run synchronously). Inside :func:`installed` both exist:

- ``from_cuda_array_interface`` builds the NumPy view the interface describes (address, shape, strides,
  typestr), after checking the address range lies inside one live stand-in array, that an ``owner`` keeps
  the buffer alive and that ``sync=False`` was asked for (numba would otherwise synchronise with CuPy's
  stream at every launch);
- ``external_stream`` records the pointer (:data:`STREAMS`) and gives the simulator's stream.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from typing import Any

import numpy as np
from numba import cuda

from . import fake_cupy

STREAMS: list[int] = []  # every pointer handed to external_stream, in order


def from_cuda_array_interface(desc: dict, owner: Any = None, sync: bool = True) -> np.ndarray:
    """What numba's ``from_cuda_array_interface`` returns, for the simulator: a view of the memory."""
    if sync:
        raise AssertionError("from_cuda_array_interface(..., sync=True): every launch would wait for the GPU")
    if owner is None:
        raise AssertionError("from_cuda_array_interface without owner: nothing keeps the buffer alive")
    ptr, _readonly = desc["data"]
    dtype, shape = np.dtype(desc["typestr"]), tuple(desc["shape"])
    strides = desc.get("strides") or tuple(int(s) for s in np.empty(shape, dtype).strides)
    steps = sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
    span = steps + dtype.itemsize
    if 0 in shape:
        return np.empty(shape, dtype)
    if not fake_cupy.device_memory_covers(ptr, span):
        raise AssertionError(f"__cuda_array_interface__ points outside any live CuPy array: {desc}")
    buffer = (ctypes.c_char * span).from_address(ptr)
    return np.ndarray(shape, dtype, buffer=buffer, strides=strides)


def external_stream(ptr: int) -> Any:
    """The simulator's stream (it runs everything synchronously); ``ptr`` is recorded."""
    STREAMS.append(int(ptr))
    return cuda.default_stream()


@contextlib.contextmanager
def installed() -> Iterator[Any]:
    """The CuPy stand-in, plus the two numba calls the simulator lacks (yields the stand-in ``cupy``)."""
    saved = {name: getattr(cuda, name, None) for name in ("from_cuda_array_interface", "external_stream")}
    with fake_cupy.installed() as cupy:
        cuda.from_cuda_array_interface = from_cuda_array_interface
        cuda.external_stream = external_stream
        try:
            yield cupy
        finally:
            for name, value in saved.items():
                if value is None:
                    delattr(cuda, name)
                else:
                    setattr(cuda, name, value)
