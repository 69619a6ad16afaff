"""The CuPy stand-in (support/fake_cupy.py) refuses during a stream capture what CuPy 14 or CUDA refuse, with
their exception and message; each test names where the real library does it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from support import fake_cupy

CUBLAS = "calling cuBLAS API during stream capture is currently unsupported"


@pytest.fixture
def cp() -> Iterator[Any]:
    with fake_cupy.installed() as module:
        yield module


@contextlib.contextmanager
def capturing(cp: Any) -> Iterator[Any]:
    """A new stream, current and capturing inside the block (its capture ended on the way out)."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            yield stream
        finally:
            if stream._capture is not None:
                with contextlib.suppress(cp.cuda.runtime.CUDARuntimeError):
                    stream.end_capture()


def _operands(cp: Any, dtype: Any = np.float64) -> tuple[Any, Any, Any]:
    a = cp.asarray(np.arange(6, dtype=dtype).reshape(2, 3))
    b = cp.asarray(np.arange(12, dtype=dtype).reshape(3, 4))
    return a, b, cp.empty((2, 4), dtype)


PRODUCTS = {
    "cupy.matmul": lambda cp, a, b, c: cp.matmul(a, b, out=c),
    "numpy.matmul": lambda cp, a, b, c: np.matmul(a, b, out=c),
    "@": lambda cp, a, b, c: a @ b,
    "ndarray.dot": lambda cp, a, b, c: a.dot(b, out=c),
    "cupy.dot": lambda cp, a, b, c: cp.dot(a, b, out=c),
    "cupy.tensordot": lambda cp, a, b, c: cp.tensordot(a, b, axes=1),
    "cupy.inner": lambda cp, a, b, c: cp.inner(a, b.T),
    "cupy.vdot": lambda cp, a, b, c: cp.vdot(a, a),
    "cupy.einsum": lambda cp, a, b, c: cp.einsum("ij,jk->ik", a, b, out=c),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64])
@pytest.mark.parametrize("name", PRODUCTS)
def test_cublas_products_are_refused_while_capturing(cp, name, dtype):
    """cupy_backends/cuda/libs/cublas.pyx, ``setStream`` (called first by every cuBLAS wrapper through
    ``_setStream``): ``NotImplementedError`` while the stream captures; cupy/_core/_routines_linalg.pyx
    (``tensordot_core``, ``matmul``) and cupy/linalg/_einsum.py (``reduced_binary_einsum``) route these to
    cuBLAS. CUDA never sees the call, so the capture stays valid."""
    a, b, c = _operands(cp, dtype)
    with capturing(cp) as stream:
        with pytest.raises(NotImplementedError, match=f"^{CUBLAS}$"):
            PRODUCTS[name](cp, a, b, c)
        assert stream.is_capturing()
        assert stream.end_capture().nodes == ()


def test_products_cublas_does_not_serve_are_captured(cp):
    """cupy/_core/_routines_linalg.pyx: integer products run CuPy's own ``_integral_tensordot_core`` kernels
    and a one-operand ``einsum`` is a reduction (cupy/linalg/_einsum.py), no cuBLAS: captured like any kernel
    writing into ``out``; outside a capture a float product runs at once."""
    a, b, c = _operands(cp, np.int64)
    f, r = cp.asarray(np.ones((2, 3))), cp.empty((2,))
    with capturing(cp) as stream:
        cp.matmul(a, b, out=c)
        cp.einsum("ij->i", f, out=r)
        graph = stream.end_capture()
    assert graph.nodes == ("matmul", "einsum")
    graph.launch(stream)
    np.testing.assert_array_equal(c.get(), np.arange(6).reshape(2, 3) @ np.arange(12).reshape(3, 4))
    assert r.get().tolist() == [3.0, 3.0]
    assert (f @ cp.asarray(np.ones((3, 1)))).get().tolist() == [[3.0], [3.0]]


D2H = "^the current stream is capturing, so D2H transfers are disallowed$"
READS = {
    "get": lambda cp, a: a.get(),
    "asnumpy": lambda cp, a: cp.asnumpy(a),
    "bool": lambda cp, a: bool(a[:1]),
    "float": lambda cp, a: float(a[:1]),
    "int": lambda cp, a: int(a[:1]),
    "item": lambda cp, a: a[:1].item(),
    "tolist": lambda cp, a: a.tolist(),
}


@pytest.mark.parametrize("name", READS)
def test_reads_to_the_host_are_refused_while_capturing(cp, name):
    """cupy/cuda/memory.pyx, ``MemoryPointer.copy_to_host_async``: ``RuntimeError`` while the stream
    captures; cupy/_core/core.pyx: ``get`` copies through it, and ``asnumpy``, ``__nonzero__``, ``__int__``,
    ``__float__``, ``item`` and ``tolist`` through ``get``. An empty array's ``get`` copies nothing and
    returns before the check."""
    a = cp.asarray(np.array([1.0, 2.0]))
    with capturing(cp):
        with pytest.raises(RuntimeError, match=D2H):
            READS[name](cp, a)
        assert a[:0].get().shape == (0,)


H2D = "^the current stream is capturing, so H2D transfers are disallowed$"


@pytest.mark.parametrize("write", [lambda cp, a: cp.asarray(np.ones(2)), lambda cp, a: cp.array([1.0, 2.0]),
                                   lambda cp, a: a.set(np.ones(2))], ids=["asarray", "array", "set"])
def test_copies_from_the_host_are_refused_while_capturing(cp, write):
    """cupy/cuda/memory.pyx, ``MemoryPointer.copy_from_host_async``: ``RuntimeError`` while the stream
    captures (``ndarray.set`` and an array made from host data copy through it: cupy/_core/core.pyx)."""
    a = cp.asarray(np.zeros(2))
    with capturing(cp):
        with pytest.raises(RuntimeError, match=H2D):
            write(cp, a)


def test_synchronising_the_capturing_stream_fails_and_invalidates_the_capture(cp):
    """cupy/cuda/stream.pyx, ``Stream.synchronize`` -> ``cudaStreamSynchronize``: CUDA refuses it on a
    capturing stream (``cudaErrorStreamCaptureUnsupported``) and invalidates the capture (CUDA Programming
    Guide, "Prohibited and Unhandled Operations"); then cupy_backends/cuda/api/runtime.pyx,
    ``streamIsCapturing``, raises, and ``end_capture`` (``cudaStreamEndCapture``) fails with
    ``cudaErrorStreamCaptureInvalidated``, ending the capture."""
    with capturing(cp) as stream:
        err = cp.cuda.runtime.CUDARuntimeError
        with pytest.raises(err, match="^cudaErrorStreamCaptureUnsupported: operation not permitted when "
                                      "stream is capturing$"):
            stream.synchronize()
        with pytest.raises(RuntimeError, match="an error has invalidated the capture sequence"):
            stream.is_capturing()
        with pytest.raises(err, match="^cudaErrorStreamCaptureInvalidated: ") as raised:
            stream.end_capture()
        assert raised.value.status == 901
        assert not stream.is_capturing()
        stream.begin_capture()
        assert stream.end_capture().nodes == ()


def test_synchronising_the_device_fails_while_any_stream_captures(cp):
    """cupy/cuda/device.pyx, ``Device.synchronize`` -> ``cudaDeviceSynchronize``: invalid while any stream
    of the device captures (CUDA Programming Guide, "Prohibited and Unhandled Operations"), even from a
    thread whose current stream does not."""
    stream = cp.cuda.Stream(non_blocking=True)
    stream.begin_capture()
    with pytest.raises(cp.cuda.runtime.CUDARuntimeError, match="^cudaErrorStreamCaptureUnsupported"):
        cp.cuda.Device().synchronize()
    with pytest.raises(cp.cuda.runtime.CUDARuntimeError, match="^cudaErrorStreamCaptureInvalidated"):
        stream.end_capture()
    cp.cuda.Device().synchronize()


def test_an_event_recorded_in_a_capture_cannot_be_waited_for(cp):
    """cupy/cuda/stream.pyx, ``Event.synchronize`` / ``Event.done`` -> ``cudaEventSynchronize`` /
    ``cudaEventQuery``: ``cudaErrorCapturedEvent`` for an event last recorded in a capturing stream (CUDA
    runtime API); one recorded before the capture is waited for as usual."""
    before = cp.cuda.Event()
    before.record()
    with capturing(cp):
        during = cp.cuda.Event()
        during.record()
        for wait in (during.synchronize, lambda: during.done):
            with pytest.raises(cp.cuda.runtime.CUDARuntimeError,
                               match="^cudaErrorCapturedEvent: operation not permitted on an event last "
                                     "recorded in a capturing stream$"):
                wait()
        before.synchronize()
        assert before.done


def test_allocations_are_refused_while_capturing_a_rule_stricter_than_cupy(cp):
    """The project's rule: CuPy 14's pool serves an allocation during a (relaxed) capture
    (cupy/cuda/memory.pyx, ``SingleDeviceMemoryPool._malloc``; cupy/cuda/stream.pyx, ``begin_capture``), but
    the graph would write that memory at every replay after the pool handed it to someone else."""
    a = cp.empty((2,))
    with capturing(cp):
        for allocate in (lambda: cp.empty((2,)), lambda: a + a, lambda: a.copy()):
            with pytest.raises(RuntimeError, match="while the current stream captures a graph"):
                allocate()


def test_a_device_copy_in_a_capture_is_a_node_replayed_at_every_launch(cp):
    """CUDA records ``cudaMemcpyAsync`` on a capturing stream as a memcpy node (CUDA programming guide, stream
    capture; CuPy passes it through: ``cupy_backends/cuda/api/runtime.pyx``, ``memcpyAsync``): the stand-in
    records it, copies nothing at capture time and copies again at each launch."""
    src, dst = cp.asarray(np.arange(4.0)), cp.zeros(4)
    rt = cp.cuda.runtime
    with capturing(cp) as stream:
        rt.memcpyAsync(dst.data.ptr, src.data.ptr, dst.nbytes, rt.memcpyDeviceToDevice, stream.ptr)
        graph = stream.end_capture()
    assert graph.nodes == ("memcpyAsync",)
    np.testing.assert_array_equal(cp.asnumpy(dst), 0.0)  # not copied at capture time
    graph.launch(stream)
    np.testing.assert_array_equal(cp.asnumpy(dst), np.arange(4.0))
    src += 1
    graph.launch(stream)
    np.testing.assert_array_equal(cp.asnumpy(dst), np.arange(4.0) + 1)
