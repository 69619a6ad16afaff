"""A NumPy-backed stand-in for CuPy, so that the GPU engines' CuPy code runs on a machine without a GPU.

``MODULE`` is a module named ``cupy``; :func:`installed` puts it in ``sys.modules["cupy"]`` for a while,
so ``import cupy`` and ``arrayrnn.core.backend.get_xp`` find it. Its :class:`ndarray` behaves like
``cupy.ndarray`` where that matters to a caller:

- memory is host memory, and ``a.data.ptr`` is its address (0 for an empty array, like CuPy's pool), so
  code that hands raw pointers to a library (cuDNN) hands working addresses; ``__cuda_array_interface__``
  describes it (version 3);
- it does not mix with NumPy arrays: a NumPy array in an arithmetic operation, a ufunc or a function of this
  module is a ``TypeError``; ``np.asarray(a)`` is a ``TypeError`` (``.get()`` / ``cupy.asnumpy`` copy to the
  host); ``a[...] = numpy_array`` with basic indexing is CuPy's ``ValueError``; NumPy arrays are accepted
  where CuPy accepts them (``cupy.asarray``, ``cupy.array``, indices);
- reductions and scalar indexing give 0-d arrays, not NumPy scalars;
- ``flags`` is CuPy's: no ``writeable``;
- floating ``empty`` / ``empty_like`` / ``ndarray(shape)`` are filled with NaN, like stale device memory, so
  code that reads memory it never wrote sees garbage, not zeros;
- streams capture like CuPy's (``Stream.begin_capture`` / ``end_capture`` / ``is_capturing``, a
  :class:`Graph` with ``launch``): while the current stream captures, an operation that writes into existing
  arrays (``out=``, ``a[...] = b``, ``a += b``, ``Stream.launch_host_func``) is recorded, not run, and runs at
  every ``Graph.launch`` on the memory it named at capture. What CuPy 14 or CUDA refuse during a capture is
  refused with their exception and message (the rules and where the real library does it:
  :func:`_refuse_cublas_in_capture`, :func:`_refuse_transfer_in_capture`, :func:`_capture_unsupported`,
  :meth:`Event.synchronize`); after a refusal by CUDA the capture is invalidated, as CUDA does, and
  ``end_capture`` fails. One rule is the project's own, stricter than CuPy: an allocation (a result without
  ``out=``, a new array) is a ``RuntimeError`` (:func:`_refuse_in_capture`).

Every operation is logged while :func:`issued` is open (its name, the stream it went to, whether it was
captured): what a test counts to see how much host work a call issues.

:func:`device_memory_covers` says whether ``[ptr, ptr + nbytes)`` lies inside one live array of this module
(the dry run's check that a library is only ever handed "device" memory of the right size).

:data:`TRANSFERS` counts what would make the host wait for a real GPU, by kind: ``"sync"`` (``bool``,
``int``, ``float``, ``.item()``, ``.tolist()``, ``.get()``, ``asnumpy``, a device, stream or event
``synchronize``) and ``"h2d"`` (an array made from host data: ``asarray`` / ``array`` of a NumPy array or
list, which CUDA copies from pageable memory synchronously). ``cuda.runtime.memcpyAsync`` into pinned
memory (``cuda.alloc_pinned_memory``) and ``cuda.Event`` do not wait.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import types
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

# -- memory ---------------------------------------------------------------------------------------
_LIVE: dict[int, weakref.ref] = {}  # id of a root buffer -> the buffer (the "device allocations")
TRANSFERS: Counter[str] = Counter()  # host waits a real GPU would have: "sync", "h2d"


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _track(a: np.ndarray) -> None:
    root = _root(a)
    key = id(root)
    if key not in _LIVE:
        _refuse_in_capture(lambda: f"allocating a {a.dtype} array of shape {a.shape}")
        _LIVE[key] = weakref.ref(root, lambda _: _LIVE.pop(key, None))


def device_memory_covers(ptr: int, nbytes: int) -> bool:
    """Whether ``[ptr, ptr + nbytes)`` lies inside one live array of this module."""
    if nbytes == 0:
        return True
    for ref in list(_LIVE.values()):
        root = ref()
        if root is not None and root.size:
            start = root.__array_interface__["data"][0]
            if start <= ptr and ptr + nbytes <= start + root.nbytes:
                return True
    return False


def _poisoned(shape: Any, dtype: Any, order: str = "C") -> np.ndarray:
    """Uninitialised memory: NaN for floating arrays, untouched for the rest (cuDNN's byte-typed work and
    reserve spaces, tens of megabytes each, are scratch space nobody reads before writing)."""
    out = np.empty(shape, dtype, order=order)
    if out.dtype.kind in "fc":
        out.fill(np.nan)
    return out


class MemoryPointer:
    """What ``a.data`` is: ``.ptr``, the address of the array's first element."""

    def __init__(self, ptr: int):
        self.ptr = ptr


class Device:
    """``cupy.cuda.Device``: one device, id 0; a context manager like CuPy's."""

    compute_capability = "90"  # stands in for a Hopper GPU (H100 / H200)

    def __init__(self, device: int | None = None):
        self.id = 0 if device is None else int(device)
        if self.id != 0:
            raise ValueError(f"the CuPy stand-in has one device (0); got device = {device!r}")

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def use(self) -> None:
        return None

    def synchronize(self) -> None:
        _capture_unsupported(list(_CAPTURING))
        TRANSFERS["sync"] += 1


class Stream:
    """``cupy.cuda.Stream``: a made-up non-zero ``ptr``; ``with stream:`` makes it the current one. It
    captures like CuPy's (see the module docstring); host functions run at once unless captured."""

    _next_ptr = 0x5000

    def __init__(self, null: bool = False, non_blocking: bool = False):
        self._capture: list[tuple[str, Callable[[], Any]]] | None = None
        self._invalidated = False  # CUDA invalidated the capture (a refused call): end_capture fails
        if null:
            self.ptr = 0
        else:
            Stream._next_ptr += 0x10
            self.ptr = Stream._next_ptr

    def __enter__(self) -> Stream:
        _STREAMS.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _STREAMS.pop()

    def synchronize(self) -> None:
        _capture_unsupported([self, get_current_stream()])
        TRANSFERS["sync"] += 1

    def begin_capture(self, mode: Any = None) -> None:
        if self.ptr == 0:
            raise RuntimeError("cannot capture on the default (legacy) stream")
        if self._capture is not None:
            raise RuntimeError("the stream is already capturing")
        self._capture = []
        _CAPTURING.add(self)

    def end_capture(self) -> Graph:
        if self._capture is None:
            raise RuntimeError("the stream is not capturing")
        nodes, self._capture, invalidated, self._invalidated = self._capture, None, self._invalidated, False
        _CAPTURING.discard(self)
        if invalidated:  # cudaStreamEndCapture ends the capture and fails (cupy/cuda/stream.pyx, end_capture)
            raise CUDARuntimeError(901)
        return Graph(nodes)

    def is_capturing(self) -> bool:
        """``cupy_backends/cuda/api/runtime.pyx``, ``streamIsCapturing``: an invalidated capture raises."""
        if self._invalidated:
            raise RuntimeError("the stream was capturing, but an error has invalidated the capture sequence")
        return self._capture is not None

    def launch_host_func(self, callback: Callable[[Any], None], arg: Any) -> None:
        _issue("host_func", lambda: callback(arg), self)


REPLAY_GRAPHS = True  # False: a Graph.launch is logged, its nodes not run (a host-time benchmark's stub)


class Graph:
    """``cupy.cuda.Graph``: the operations a capture recorded, run in order at each ``launch``;
    ``nodes`` names them (the stand-in's view of the graph's nodes)."""

    def __init__(self, nodes: list[tuple[str, Callable[[], Any]]]):
        self._nodes = tuple(nodes)
        self.nodes = tuple(name for name, _ in nodes)

    def launch(self, stream: Stream | None = None) -> None:
        _issue("graph_launch", self._replay, stream)

    def upload(self, stream: Stream | None = None) -> None:
        return None

    def _replay(self) -> None:
        if REPLAY_GRAPHS:
            for _, run in self._nodes:
                run()


_STREAMS = [Stream(null=True)]
_CAPTURING: set[Stream] = set()  # streams between begin_capture and end_capture
_DEVICE = Device(0)


def get_current_stream() -> Stream:
    return _STREAMS[-1]


class Event:
    """``cupy.cuda.Event``: the stand-in's work is done when it is enqueued, so an event is always done,
    unless it was last recorded in a stream that still captures: then ``done`` and ``synchronize`` are
    CUDA's ``cudaErrorCapturedEvent`` (``cudaEventQuery`` / ``cudaEventSynchronize``, CUDA runtime API docs,
    cited from them; CuPy passes it on: ``cupy/cuda/stream.pyx``, ``Event.done`` / ``Event.synchronize``)."""

    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False):
        self.recorded = False
        self._stream: Stream | None = None  # where it was last recorded

    def record(self, stream: Stream | None = None) -> None:
        self.recorded = True
        self._stream = stream if stream is not None else get_current_stream()

    def _refuse_captured(self) -> None:
        if self._stream is not None and self._stream._capture is not None:
            raise CUDARuntimeError(907)

    @property
    def done(self) -> bool:
        self._refuse_captured()
        return True

    def synchronize(self) -> None:
        self._refuse_captured()
        TRANSFERS["sync"] += 1


def alloc_pinned_memory(size: int) -> bytearray:
    """``cupy.cuda.alloc_pinned_memory``: host memory usable with ``numpy.frombuffer``."""
    return bytearray(size)


def _memcpy_async(dst: int, src: int, size: int, kind: int, stream: int) -> None:
    """``cupy.cuda.runtime.memcpyAsync``: the stand-in's "device" memory is host memory. On the current
    stream it is an operation like any other: recorded while that stream captures (CUDA makes it a memcpy
    node of the graph, ``cudaMemcpyAsync`` in stream capture, CUDA programming guide), run now otherwise."""
    current = get_current_stream()
    if stream != current.ptr:
        ctypes.memmove(dst, src, size)
        return
    _issue("memcpyAsync", lambda: ctypes.memmove(dst, src, size), current)


# -- what was issued ------------------------------------------------------------------------------
class Issued(tuple):
    """One logged operation: ``(name, stream pointer, captured)``."""

    @property
    def name(self) -> str:
        return self[0]


_LOGS: list[list[Issued]] = []


@contextlib.contextmanager
def issued() -> Iterator[list[Issued]]:
    """A list of every operation issued inside the block, in order."""
    log: list[Issued] = []
    _LOGS.append(log)
    try:
        yield log
    finally:
        _LOGS.remove(log)


def _log(name: str, stream: Stream, captured: bool) -> None:
    for log in _LOGS:
        log.append(Issued((name, stream.ptr, captured)))


def _issue(name: str, run: Callable[[], Any], stream: Stream | None = None) -> None:
    """An operation on ``stream`` (the current one by default): recorded if it captures, else run now."""
    stream = stream if stream is not None else get_current_stream()
    captured = stream._capture is not None
    _log(name, stream, captured)
    if captured:
        stream._capture.append((name, run))
    else:
        run()


def _refuse_in_capture(what: str | Callable[[], str]) -> None:
    """The project's rule, stricter than CuPy's: no allocation while the current stream captures. CuPy 14's
    pool refuses none (``cupy/cuda/memory.pyx``, ``SingleDeviceMemoryPool._malloc``: a cached chunk of the
    capturing stream's arena or ``cudaMalloc``, which the relaxed capture mode of ``Stream.begin_capture``,
    ``cupy/cuda/stream.pyx``, lets through), but the graph keeps writing that memory at every replay after
    the array that owned it went back to the pool."""
    if get_current_stream()._capture is not None:
        what = what() if callable(what) else what  # formatted only when refused (an allocation's is costly)
        raise RuntimeError(f"{what} while the current stream captures a graph: the GPU would refuse it or "
                           "replay the graph on memory it no longer owns")


CUBLAS_IN_CAPTURE = "calling cuBLAS API during stream capture is currently unsupported"
_CUBLAS = frozenset({"matmul", "dot", "vdot", "inner", "tensordot", "einsum"})


def _refuse_cublas_in_capture(name: str, args: tuple) -> None:
    """CuPy's ``NotImplementedError`` for a cuBLAS call while the current stream captures
    (``cupy_backends/cuda/libs/cublas.pyx``, ``setStream``, which every cuBLAS wrapper calls first through
    ``_setStream``; cupy#6290). CuPy sends ``matmul``, ``dot`` (``@``, ``ndarray.dot``), ``vdot``, ``inner``
    and ``tensordot`` of floating or complex arrays to cuBLAS (``cupy/_core/_routines_linalg.pyx``,
    ``tensordot_core`` and ``matmul``; integers go to its own ``_integral_tensordot_core`` kernels, a 0-d
    operand to ``multiply``), and ``einsum`` of two or more operands through ``cupy.matmul``
    (``cupy/linalg/_einsum.py``, ``reduced_binary_einsum``)."""
    if name not in _CUBLAS or get_current_stream()._capture is None:
        return
    arrays = [a for a in (args[1:] if name == "einsum" else args) if isinstance(a, np.ndarray)]
    if len(arrays) < 2 or any(a.ndim == 0 for a in arrays):
        return
    if np.result_type(*arrays).kind in "fc":
        raise NotImplementedError(CUBLAS_IN_CAPTURE)


def _refuse_transfer_in_capture(direction: str, stream: Stream | None = None) -> None:
    """CuPy's ``RuntimeError`` for a copy between host and device while the stream captures
    (``cupy/cuda/memory.pyx``, ``MemoryPointer.copy_to_host_async`` / ``copy_from_host_async``, which
    ``ndarray.get`` / ``set`` use, so ``asnumpy``, ``bool``, ``int``, ``float``, ``item``, ``tolist`` and an
    array made from host data too: ``cupy/_core/core.pyx``)."""
    stream = stream if stream is not None else get_current_stream()
    if stream._capture is not None:
        raise RuntimeError(f"the current stream is capturing, so {direction} transfers are disallowed")


_CUDA_ERRORS = {  # status: (cudaGetErrorName, cudaGetErrorString), CUDA's driver_types.h / runtime API docs
    900: ("cudaErrorStreamCaptureUnsupported", "operation not permitted when stream is capturing"),
    901: ("cudaErrorStreamCaptureInvalidated", "operation failed due to a previous error during capture"),
    907: ("cudaErrorCapturedEvent",
          "operation not permitted on an event last recorded in a capturing stream"),
}


class CUDARuntimeError(RuntimeError):
    """``cupy_backends.cuda.api.runtime.CUDARuntimeError``: ``status`` and the message
    ``"<cudaGetErrorName>: <cudaGetErrorString>"`` (``cupy_backends/cuda/api/runtime.pyx``)."""

    def __init__(self, status: int):
        self.status = status
        name, text = _CUDA_ERRORS[status]
        super().__init__(f"{name}: {text}")


def _capture_unsupported(streams: list[Stream]) -> None:
    """CUDA's ``cudaErrorStreamCaptureUnsupported`` for synchronising a capturing stream
    (``cudaStreamSynchronize``; ``cudaDeviceSynchronize`` while any stream of the device captures), which
    also invalidates those captures (CUDA Programming Guide, "Prohibited and Unhandled Operations"; cited
    from memory of the guide, not read here). CuPy passes it on as ``CUDARuntimeError``
    (``cupy/cuda/stream.pyx``, ``Stream.synchronize``; ``cupy/cuda/device.pyx``, ``Device.synchronize``)."""
    capturing = [s for s in streams if s._capture is not None]
    for s in capturing:
        s._invalidated = True
    if capturing:
        raise CUDARuntimeError(900)


# -- arrays ---------------------------------------------------------------------------------------
def _refuse_numpy(obj: Any) -> None:
    if isinstance(obj, np.ndarray):
        raise TypeError(f"Unsupported type {type(obj)}")


def _unwrap(obj: Any) -> Any:
    """NumPy arrays inside ``obj`` (device arrays unwrapped); host NumPy arrays are refused like CuPy."""
    if isinstance(obj, ndarray):
        return obj._a
    _refuse_numpy(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_unwrap(o) for o in obj)
    return obj


def _unwrap_index(key: Any) -> Any:
    """An index: device arrays unwrapped; NumPy arrays accepted (CuPy converts them)."""
    if isinstance(key, ndarray):
        return key._a
    if isinstance(key, tuple):
        return tuple(_unwrap_index(k) for k in key)
    return key


def _wrap(obj: Any) -> Any:
    """Results on the "device": arrays and NumPy scalars become :class:`ndarray` (0-d for scalars)."""
    if isinstance(obj, np.ndarray):
        return ndarray._of(obj)
    if isinstance(obj, np.generic):
        return ndarray._of(np.asarray(obj))
    if isinstance(obj, tuple):
        return tuple(_wrap(o) for o in obj)
    if isinstance(obj, list):
        return [_wrap(o) for o in obj]
    return obj


def _call(func: Callable, args: tuple, kwargs: dict, name: str | None = None) -> Any:
    """``func`` on the unwrapped arguments: issued (so captured) when it writes into ``out`` arrays of this
    module, else run now (it allocates its result, so capture refuses it)."""
    outs = kwargs.get("out")
    name = name or getattr(func, "__name__", type(func).__name__)
    u_args, u_kwargs = _unwrap(args), {k: _unwrap(v) for k, v in kwargs.items()}
    _refuse_cublas_in_capture(name, u_args)
    if isinstance(outs, ndarray) or (isinstance(outs, tuple) and outs
                                     and all(isinstance(o, ndarray) for o in outs)):
        _issue(name, lambda: func(*u_args, **u_kwargs))
        return outs if not isinstance(outs, tuple) or len(outs) > 1 else outs[0]
    _refuse_in_capture(f"{name} without out=")
    _log(name, get_current_stream(), False)
    return _wrap(func(*u_args, **u_kwargs))


def _binary(ufunc: np.ufunc, reflected: bool = False, inplace: bool = False) -> Callable:
    def op(self: ndarray, other: Any) -> Any:
        if inplace:
            return _call(ufunc, (self, other), {"out": self})
        return _call(ufunc, (other, self) if reflected else (self, other), {})

    return op


class Flags:
    """``cupy.ndarray.flags``: CuPy's ``Flags`` has ``c_contiguous``, ``f_contiguous`` and ``owndata``, and
    no ``writeable`` (device memory is always writeable)."""

    __slots__ = ("c_contiguous", "f_contiguous", "owndata")

    def __init__(self, flags: Any):
        self.c_contiguous, self.f_contiguous = flags.c_contiguous, flags.f_contiguous
        self.owndata = flags.owndata


class ndarray:  # noqa: N801 - the name CuPy gives it
    """A device array of the stand-in: a NumPy array it does not let mix with host arrays."""

    __slots__ = ("_a", "_pointer", "__weakref__")
    __array_priority__ = 100.0

    def __init__(self, shape: Any, dtype: Any = float, order: str = "C"):
        self._a = _poisoned(shape, dtype, order)
        self._pointer = None
        _track(self._a)

    @classmethod
    def _of(cls, a: np.ndarray) -> ndarray:
        self = object.__new__(cls)
        self._a, self._pointer = a, None
        _track(a)
        return self

    # -- CuPy's cheap attributes (plain reads there, not array operations) ------------------------
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)

    # -- what CuPy exposes about memory ---------------------------------------------------------
    @property
    def data(self) -> MemoryPointer:
        if self._pointer is None:  # an array's memory never moves: read its address once, like CuPy
            self._pointer = MemoryPointer(self._a.__array_interface__["data"][0] if self._a.size else 0)
        return self._pointer

    @property
    def device(self) -> Device:
        return _DEVICE

    @property
    def flags(self) -> Flags:
        return Flags(self._a.flags)

    @property
    def __cuda_array_interface__(self) -> dict:
        a = self._a
        ptr = get_current_stream().ptr
        return {"shape": a.shape, "typestr": a.dtype.str, "descr": [("", a.dtype.str)],
                "data": (self.data.ptr, False), "version": 3,
                "strides": None if a.flags.c_contiguous else a.strides, "stream": ptr or 1}

    def get(self, stream: Any = None, order: str = "C", out: np.ndarray | None = None,
            blocking: bool = True) -> np.ndarray:
        """A host copy."""
        if self._a.size:  # an empty array returns before any copy (cupy/_core/core.pyx, get)
            _refuse_transfer_in_capture("D2H", stream)
        if blocking:
            TRANSFERS["sync"] += 1
        if out is not None:
            out[...] = self._a
            return out
        return np.array(self._a, order=order, copy=True)

    def set(self, arr: np.ndarray, stream: Any = None) -> None:
        """Copy a host array into this one."""
        _refuse_transfer_in_capture("H2D", stream)
        self._a[...] = arr

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to "
                        "construct a NumPy array explicitly.")

    # -- NumPy protocols: device arrays only --------------------------------------------------
    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return _call(getattr(ufunc, method), inputs, kwargs, ufunc.__name__ if method == "__call__" else None)

    def __array_function__(self, func: Callable, types: Any, args: tuple, kwargs: dict) -> Any:
        return _call(func, args, kwargs)

    # -- indexing -------------------------------------------------------------------------------
    def __getitem__(self, key: Any) -> Any:
        return _wrap(self._a[_unwrap_index(key)])

    def __setitem__(self, key: Any, value: Any) -> None:
        index = _unwrap_index(key)
        if isinstance(value, np.ndarray) and value.ndim and not _advanced(index):
            raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
        target, source = self._a, value._a if isinstance(value, ndarray) else value
        _issue("setitem", lambda: target.__setitem__(index, source))

    def __len__(self) -> int:
        return len(self._a)

    def __iter__(self) -> Iterator[Any]:
        return (_wrap(row) for row in self._a)

    # -- conversions CuPy allows (they synchronise) -------------------------------------------
    def __bool__(self) -> bool:
        _refuse_transfer_in_capture("D2H")
        TRANSFERS["sync"] += 1
        return bool(self._a)

    def __float__(self) -> float:
        _refuse_transfer_in_capture("D2H")
        TRANSFERS["sync"] += 1
        return float(self._a)

    def __int__(self) -> int:
        _refuse_transfer_in_capture("D2H")
        TRANSFERS["sync"] += 1
        return int(self._a)

    def __repr__(self) -> str:
        return repr(self._a)

    def __str__(self) -> str:
        return str(self._a)

    # -- everything else: NumPy's methods and attributes, results on the device -----------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # never NumPy's own protocols (__array_interface__ would let NumPy in)
            raise AttributeError(name)
        if name in ("item", "tolist"):
            _refuse_transfer_in_capture("D2H")
            TRANSFERS["sync"] += 1
        attr = getattr(self._a, name)
        if not callable(attr):
            return _wrap(attr)

        def method(*args: Any, **kwargs: Any) -> Any:
            _refuse_cublas_in_capture(name, (self._a, *_unwrap(args)))  # ndarray.dot
            result = _call(attr, args, kwargs)
            return self if isinstance(result, ndarray) and result._a is self._a else result

        return method

    __hash__ = None  # type: ignore[assignment]


def _advanced(index: Any) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, (np.ndarray, list)) for p in parts)


_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "truediv": np.true_divide,
           "floordiv": np.floor_divide, "mod": np.remainder, "pow": np.power, "matmul": np.matmul,
           "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor, "lshift": np.left_shift,
           "rshift": np.right_shift}
for _name, _ufunc in _BINARY.items():
    setattr(ndarray, f"__{_name}__", _binary(_ufunc))
    setattr(ndarray, f"__r{_name}__", _binary(_ufunc, reflected=True))
    setattr(ndarray, f"__i{_name}__", _binary(_ufunc, inplace=True))
for _name, _ufunc in {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
                      "eq": np.equal, "ne": np.not_equal}.items():
    setattr(ndarray, f"__{_name}__", _binary(_ufunc))
_UNARY = {"neg": np.negative, "pos": np.positive, "abs": np.absolute, "invert": np.invert}
for _name, _ufunc in _UNARY.items():
    setattr(ndarray, f"__{_name}__", lambda self, _u=_ufunc: _call(_u, (self,), {}))
ndarray.__module__ = "cupy"


# -- module functions -----------------------------------------------------------------------------
def asarray(a: Any, dtype: Any = None, order: Any = None) -> ndarray:
    if isinstance(a, ndarray):
        return a if dtype is None or np.dtype(dtype) == a.dtype else a.astype(dtype)
    _refuse_transfer_in_capture("H2D")
    TRANSFERS["h2d"] += 1
    return ndarray._of(np.array(a, dtype=dtype, order=order or "K", copy=True))  # host -> device copy


def array(obj: Any, dtype: Any = None, copy: bool = True, order: str = "K", ndmin: int = 0) -> ndarray:
    if isinstance(obj, ndarray):
        if not copy and (dtype is None or np.dtype(dtype) == obj.dtype):
            return obj
        return ndarray._of(np.array(obj._a, dtype=dtype, order=order, copy=True, ndmin=ndmin))
    _refuse_transfer_in_capture("H2D")
    TRANSFERS["h2d"] += 1
    return ndarray._of(np.array(obj, dtype=dtype, order=order, copy=True, ndmin=ndmin))


def asnumpy(a: Any, stream: Any = None, order: str = "C", blocking: bool = True) -> np.ndarray:
    return a.get(order=order, blocking=blocking) if isinstance(a, ndarray) else np.asarray(a, order=order)


def get_array_module(*args: Any) -> types.ModuleType:
    return MODULE if any(isinstance(a, ndarray) for a in args) else np


def empty(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    return ndarray(shape, dtype, order)


def empty_like(a: ndarray, dtype: Any = None, order: str = "K", shape: Any = None) -> ndarray:
    if not isinstance(a, ndarray):
        raise TypeError(f"Unsupported type {type(a)}")
    return ndarray(a.shape if shape is None else shape, a.dtype if dtype is None else dtype)


def _numpy_function(name: str) -> Callable:
    func = getattr(np, name)

    def device_function(*args: Any, **kwargs: Any) -> Any:
        return _call(func, args, kwargs)

    device_function.__name__ = name
    return device_function


class _Runtime(types.SimpleNamespace):
    CUDARuntimeError = CUDARuntimeError

    memcpyDeviceToHost = 2  # noqa: N815 - CuPy's name
    memcpyDeviceToDevice = 3  # noqa: N815 - CuPy's name (cupy_backends/cuda/api/runtime.pyx, CUDA's value)
    memcpyAsync = staticmethod(_memcpy_async)  # noqa: N815 - CuPy's name

    @staticmethod
    def getDeviceCount() -> int:  # noqa: N802 - CuPy's name
        return 1


class _Testing(types.SimpleNamespace):
    @staticmethod
    def assert_allclose(actual: Any, desired: Any, **kw: Any) -> None:
        np.testing.assert_allclose(asnumpy(actual), asnumpy(desired), **kw)

    @staticmethod
    def assert_array_equal(actual: Any, desired: Any, **kw: Any) -> None:
        np.testing.assert_array_equal(asnumpy(actual), asnumpy(desired), **kw)


class _CupyModule(types.ModuleType):
    """``cupy``: the functions above, and every other NumPy function working on device arrays only."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        attr = getattr(np, name)
        if isinstance(attr, type) or not callable(attr):
            return attr  # dtypes (cupy.float32 is numpy.float32), constants
        return _numpy_function(name)


MODULE = _CupyModule("cupy", "A NumPy-backed stand-in for CuPy (tests/support/fake_cupy.py).")
MODULE.__version__ = "0+numpy-stand-in"
MODULE.ndarray = ndarray
for _func in (asarray, array, asnumpy, get_array_module, empty, empty_like):
    setattr(MODULE, _func.__name__, _func)
MODULE.cuda = types.SimpleNamespace(Device=Device, Stream=Stream, Graph=Graph,
                                    get_current_stream=get_current_stream, runtime=_Runtime(),
                                    MemoryPointer=MemoryPointer, Event=Event,
                                    alloc_pinned_memory=alloc_pinned_memory)
MODULE.testing = _Testing()


@contextlib.contextmanager
def installed() -> Iterator[types.ModuleType]:
    """``sys.modules["cupy"]`` is the stand-in inside the block (and ``arrayrnn``'s backend sees it)."""
    from arrayrnn.core import backend

    saved = sys.modules.get("cupy")
    sys.modules["cupy"] = MODULE
    backend.cupy_module.cache_clear()
    try:
        yield MODULE
    finally:
        if saved is None:
            sys.modules.pop("cupy", None)
        else:
            sys.modules["cupy"] = saved
        backend.cupy_module.cache_clear()
