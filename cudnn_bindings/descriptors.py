"""Owning objects over cuDNN handles and descriptors.

Each object starts with its pointer at ``None``, owns exactly one cuDNN object once created, frees it in
``close()`` (safe to call any number of times), is a context manager, and has a ``weakref.finalize``
finalizer as a last resort (not run at interpreter exit, when the CUDA context may already be gone).
`live_handles()` counts what is alive, per kind.
"""

from __future__ import annotations

import copy
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import _cuda, raw
from .args import address, owned
from .config import (
    RNNConfig,
    SeqDataConfig,
    TensorConfig,
    _as_float,
    _as_int,
    _seq_lengths,
    _set,
    fill_bytes,
    fill_value,
)
from .enums import (
    DataType,
    DirectionMode,
    MathType,
    RNNAlgo,
    RNNBiasMode,
    RNNClipMode,
    RNNDataLayout,
    RNNInputMode,
    RNNMode,
)
from .errors import CudnnError

__all__ = ["Handle", "RNNDescriptor", "RNNDataDescriptor", "TensorDescriptor", "DropoutDescriptor",
           "live_handles"]

_live: Counter[str] = Counter()
_live_lock = threading.Lock()


def live_handles() -> dict[str, int]:
    """Number of live cuDNN objects owned by this package, per class name (zero counts omitted)."""
    with _live_lock:
        return {k: v for k, v in _live.items() if v}


def _release(kind: str, destroy: Callable[[int], None], ptr: int) -> None:
    try:
        destroy(ptr)
    finally:
        with _live_lock:
            _live[kind] -= 1


class _Owned:
    """Base of the owning objects: pointer bookkeeping, close(), context manager, finalizer."""

    _destroy: Callable[[int], None]

    def __init__(self) -> None:
        self._ptr: int | None = None
        self._finalizer: weakref.finalize | None = None

    def _adopt(self, ptr: int) -> None:
        kind = type(self).__name__
        with _live_lock:
            _live[kind] += 1
        self._ptr = ptr
        self._finalizer = weakref.finalize(self, _release, kind, type(self)._destroy, ptr)
        self._finalizer.atexit = False

    @property
    def ptr(self) -> int:
        """The cuDNN object's address. Raises ``ValueError`` once closed."""
        if self._ptr is None:
            raise ValueError(f"{type(self).__name__} is closed")
        return self._ptr

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def close(self) -> None:
        """Destroy the cuDNN object now; later calls do nothing."""
        finalizer, self._ptr = self._finalizer, None
        if finalizer is not None:
            finalizer()  # runs _release at most once, even if close() races with garbage collection

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __int__(self) -> int:
        return self.ptr

    def __repr__(self) -> str:
        state = "closed" if self._ptr is None else hex(self._ptr)
        return f"<{type(self).__name__} {state}>"

    def _refuse(self, what: str) -> None:
        raise TypeError(f"{type(self).__name__} owns a cuDNN object and cannot be {what}: two Python "
                        "objects would free the same pointer (and a pickled address means nothing in another "
                        "process); "
                        "create a new one from the same configuration instead")

    def __copy__(self):
        self._refuse("copied")

    def __deepcopy__(self, memo: dict):
        self._refuse("deep-copied")

    def __reduce_ex__(self, protocol: object):
        self._refuse("pickled")

    def _create_then(self, create: Callable[[], int], setup: Callable[[], None]) -> None:
        self._adopt(create())
        try:
            setup()
        except BaseException:
            self.close()
            raise


class Handle(_Owned):
    """A cuDNN handle on ``device`` (made current first, like ``cudaSetDevice``), optionally bound to
    ``stream``. Keep ``device`` current while using the handle. See `cudnnCreate`."""

    _destroy = staticmethod(raw.destroy)

    def __init__(self, device: int = 0, stream: Any = None) -> None:
        super().__init__()
        self.device = _as_int("device", device, 0)
        self._stream_obj: Any = None
        _cuda.stream_address(stream)  # a bad stream is refused before a handle is created
        _cuda.select_device(self.device)
        try:
            ptr = raw.create()
        except CudnnError as exc:
            raise CudnnError(exc.status, exc.function, exc.detail, _cuda.diagnose(self.device)) from None
        self._create_then(lambda: ptr, lambda: self.set_stream(stream) if stream is not None else None)

    @property
    def stream(self) -> int:
        """The bound ``cudaStream_t`` address (0 for the default stream), see ``cudnnGetStream``."""
        return raw.get_stream(self.ptr)

    def set_stream(self, stream: Any) -> None:
        """Bind a stream (int address, ``__cuda_stream__``, CuPy or cuda.core stream, or None).
        See `cudnnSetStream`."""
        raw.set_stream(self.ptr, _cuda.stream_address(stream))
        self._stream_obj = stream  # keep the Python stream object alive while bound


class DropoutDescriptor(_Owned):
    """A dropout descriptor. Without a handle it is created empty (dropout 0, which is all an RNN
    without dropout needs); with one it is set. See `cudnnSetDropoutDescriptor`."""

    _destroy = staticmethod(raw.destroy_dropout_descriptor)

    def __init__(self, handle: Handle | None = None, dropout: float = 0.0, *, states: int = 0,
                 states_size: int = 0, seed: int = 0) -> None:
        super().__init__()
        self._handle: Handle | None = None
        dropout = _as_float("dropout", dropout)
        if handle is None and dropout != 0.0:
            raise ValueError(f"dropout = {dropout} needs a Handle (and a states buffer); got handle = None")
        setup = (lambda: self.set(handle, dropout, states=states, states_size=states_size, seed=seed)
                 ) if handle is not None else (lambda: None)
        self._create_then(raw.create_dropout_descriptor, setup)

    @staticmethod
    def states_size(handle: Handle) -> int:
        """Bytes of device memory the RNG states need. See `cudnnDropoutGetStatesSize`."""
        return raw.dropout_get_states_size(owned("handle", handle, Handle))

    def _args(self, handle: Handle, dropout: float, states: int, states_size: int, seed: int) -> tuple:
        p = _as_float("dropout", dropout)
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout = {p}; expected a probability in [0, 1)")
        states = address("states", states) or 0
        states_size = _as_int("states_size", states_size, 0, 2**64 - 1)
        if p > 0.0 and not states:
            raise ValueError(f"dropout = {p} needs a device states buffer of "
                             f"DropoutDescriptor.states_size(handle) bytes; got states = 0")
        return (self.ptr, owned("handle", handle, Handle), p, states, states_size,
                _as_int("seed", seed, 0, 2**64 - 1))

    def set(self, handle: Handle, dropout: float, *, states: int = 0, states_size: int = 0,
            seed: int = 0) -> None:
        """Initialise the RNG states (when given) and the probability. See `cudnnSetDropoutDescriptor`."""
        raw.set_dropout_descriptor(*self._args(handle, dropout, states, states_size, seed))
        self._handle = handle

    def restore(self, handle: Handle, dropout: float, *, states: int, states_size: int,
                seed: int = 0) -> None:
        """Reuse already initialised states. See `cudnnRestoreDropoutDescriptor`."""
        raw.restore_dropout_descriptor(*self._args(handle, dropout, states, states_size, seed))
        self._handle = handle

    def get(self, handle: Handle) -> tuple[float, int, int]:
        """``(dropout, states address, seed)``. See `cudnnGetDropoutDescriptor`."""
        return raw.get_dropout_descriptor(self.ptr, owned("handle", handle, Handle))


class TensorDescriptor(_Owned):
    """An N-d tensor descriptor (2..8 dims; strides default to packed row-major); created unset when
    ``dims`` is None (an output of `weight_params`). See `cudnnSetTensorNdDescriptor`."""

    _destroy = staticmethod(raw.destroy_tensor_descriptor)

    def __init__(self, dims: Sequence[int] | TensorConfig | None = None, data_type: DataType | int | str =
                 DataType.FLOAT, strides: Sequence[int] | None = None) -> None:
        super().__init__()
        if dims is None:
            config = None
        elif isinstance(dims, TensorConfig):
            config = dims
        else:
            config = TensorConfig(data_type=data_type, dims=tuple(dims), strides=strides)
        self._create_then(raw.create_tensor_descriptor, lambda: self.set(config) if config else None)

    def set(self, config: TensorConfig) -> None:
        """See `cudnnSetTensorNdDescriptor`."""
        if not isinstance(config, TensorConfig):
            raise TypeError(f"config must be a TensorConfig; got {type(config).__name__}")
        raw.set_tensor_nd_descriptor(self.ptr, config.data_type, config.dims, config.strides)

    def get(self) -> TensorConfig:
        """The configuration read back from cuDNN. See `cudnnGetTensorNdDescriptor`."""
        dt, dims, strides = raw.get_tensor_nd_descriptor(self.ptr)
        if not dims:
            raise ValueError("TensorDescriptor has not been set")
        return TensorConfig(data_type=dt, dims=dims, strides=strides)

    def size_in_bytes(self) -> int:
        """See `cudnnGetTensorSizeInBytes`."""
        return raw.get_tensor_size_in_bytes(self.ptr)


class RNNDescriptor(_Owned):
    """An RNN descriptor set from an `RNNConfig` (and an optional `DropoutDescriptor`, kept alive here).
    See `cudnnSetRNNDescriptor_v8` and `cudnnRNNSetClip_v9`."""

    _destroy = staticmethod(raw.destroy_rnn_descriptor)

    def __init__(self, config: RNNConfig, dropout: DropoutDescriptor | None = None) -> None:
        super().__init__()
        self.config: RNNConfig | None = None
        self.dropout: DropoutDescriptor | None = None
        self._create_then(raw.create_rnn_descriptor, lambda: self.set(config, dropout))

    def set(self, config: RNNConfig, dropout: DropoutDescriptor | None = None) -> None:
        """Configure (all fields and clip). See `cudnnSetRNNDescriptor_v8`."""
        if not isinstance(config, RNNConfig):
            raise TypeError(f"config must be an RNNConfig; got {type(config).__name__}")
        if dropout is not None and not isinstance(dropout, DropoutDescriptor):
            raise TypeError(f"dropout must be a DropoutDescriptor or None; got {type(dropout).__name__}")
        dropout_ptr = owned("dropout", dropout, DropoutDescriptor, optional=True)
        c = config
        try:
            raw.set_rnn_descriptor_v8(self.ptr, c.algo, c.cell_mode, c.bias_mode, c.dir_mode, c.input_mode,
                                      c.data_type, c.math_prec, c.math_type, c.input_size, c.hidden_size,
                                      c.proj_size, c.num_layers, dropout_ptr,
                                      c.aux_flags)
        except CudnnError as exc:
            if exc.status < 3000 or exc.status >= 4000:  # only NOT_SUPPORTED* needs the configuration named
                raise
            hint = f"cuDNN does not support this configuration: {_describe(c)}"
            raise CudnnError(exc.status, exc.function, exc.detail, hint) from None
        raw.rnn_set_clip(self.ptr, c.clip_mode, c.lclip, c.rclip)
        self.config, self.dropout = config, dropout

    def get(self) -> RNNConfig:
        """The configuration read back from cuDNN. See `cudnnGetRNNDescriptor_v8`, `cudnnRNNGetClip_v9`."""
        (algo, cell, bias, dirm, inp, dt, prec, math, isz, hsz, psz, layers, _drop, aux
         ) = raw.get_rnn_descriptor_v8(self.ptr)
        clip_mode, lclip, rclip = raw.rnn_get_clip(self.ptr)
        return RNNConfig(algo=RNNAlgo(algo), cell_mode=RNNMode(cell), bias_mode=RNNBiasMode(bias),
                         dir_mode=DirectionMode(dirm), input_mode=RNNInputMode(inp), data_type=DataType(dt),
                         math_prec=DataType(prec), math_type=MathType(math), input_size=isz, hidden_size=hsz,
                         proj_size=psz, num_layers=layers, aux_flags=aux, clip_mode=RNNClipMode(clip_mode),
                         lclip=lclip, rclip=rclip)

    def dropout_address(self) -> int:
        """The dropout descriptor address cuDNN holds (0 when none). See `cudnnGetRNNDescriptor_v8`."""
        return raw.get_rnn_descriptor_v8(self.ptr)[12]


def _describe(c: RNNConfig) -> str:
    parts = [f"{k}={v.name if hasattr(v, 'name') else v}" for k, v in vars(c).items()]
    return ", ".join(parts)


class RNNDataDescriptor(_Owned):
    """An RNN data descriptor set from a `SeqDataConfig`. See `cudnnSetRNNDataDescriptor`."""

    _destroy = staticmethod(raw.destroy_rnn_data_descriptor)

    def __init__(self, config: SeqDataConfig) -> None:
        super().__init__()
        self.config: SeqDataConfig | None = None
        self._create_then(raw.create_rnn_data_descriptor, lambda: self.set(config))

    def set(self, config: SeqDataConfig) -> None:
        """See `cudnnSetRNNDataDescriptor` (cuDNN copies the lengths and the fill value)."""
        if not isinstance(config, SeqDataConfig):
            raise TypeError(f"config must be a SeqDataConfig; got {type(config).__name__}")
        lengths = np.ascontiguousarray(config.seq_lengths, dtype=np.intc)
        fill = np.zeros(8, np.uint8)
        encoded = fill_bytes(config.data_type, config.padding_fill)
        fill[: len(encoded)] = np.frombuffer(encoded, np.uint8)
        raw.set_rnn_data_descriptor(self.ptr, config.data_type, config.layout, config.max_seq_length,
                                    config.batch_size, config.vector_size, lengths.ctypes.data,
                                    fill.ctypes.data)
        self.config = config

    def set_lengths(self, seq_lengths: Any) -> None:
        """The configuration set last, with other ``seq_lengths`` (checked against its ``batch_size`` and
        ``max_seq_length`` as `SeqDataConfig` does), set again in place: what a caller whose lengths change
        from call to call under one shape needs, without building and checking a whole configuration."""
        config = self.config
        if config is None:
            raise ValueError("RNNDataDescriptor has not been set")
        updated = copy.copy(config)
        _set(updated, "seq_lengths", _seq_lengths(seq_lengths, config.batch_size, config.max_seq_length))
        self.set(updated)

    def get(self) -> SeqDataConfig:
        """The configuration read back from cuDNN. See `cudnnGetRNNDataDescriptor`."""
        fill = np.zeros(8, np.uint8)
        batch = raw.get_rnn_data_descriptor(self.ptr, 0, None, fill.ctypes.data)[3]
        if batch < 1:
            raise ValueError("RNNDataDescriptor has not been set")
        lengths = np.zeros(batch, np.intc)
        dt, layout, t, b, v = raw.get_rnn_data_descriptor(self.ptr, batch, lengths.ctypes.data,
                                                          fill.ctypes.data)
        return SeqDataConfig(data_type=DataType(dt), layout=RNNDataLayout(layout), max_seq_length=t,
                             batch_size=b, vector_size=v, seq_lengths=lengths,
                             padding_fill=fill_value(DataType(dt), fill.tobytes()))
