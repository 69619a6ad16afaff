"""Thin checked wrappers: one Python function per C function of the prototype table.

Handles, descriptors, streams and memory are plain integer addresses here (``0``/``None`` is NULL); every
status goes through `check` (defined here). Outputs come back as Python values. Ownership lives in
`descriptors`. Each parameter is annotated with its C type from `args`, and `checked` refuses a value that
C would truncate, wrap or dereference blindly (see `args` for the rules) before any C call.
"""

from __future__ import annotations

import ctypes
from ctypes import byref, c_double, c_float, c_int, c_int32, c_size_t, c_uint32, c_ulonglong, c_void_p
from typing import Annotated

from . import _lib
from .args import (
    Address,
    CDouble,
    CFloat,
    CInt,
    CInt32,
    CUInt32,
    Enum,
    IntArray,
    IntIn,
    SizeT,
    Stream,
    ULongLong,
    checked,
    integer,
)
from .errors import CudnnError

Ptr = Address  # an address; None or 0 is NULL
_MAX_ERR = 4096
MAX_DIMS = 8  # CUDNN_DIM_MAX
Dims = Annotated[tuple[int, ...], IntArray(1, MAX_DIMS)]
DimsRequested = Annotated[int, IntIn(1, MAX_DIMS, "dimensions to read back; CUDNN_DIM_MAX is 8")]
ArrayLength = Annotated[int, IntIn(0, 2**31 - 1, "C int; entries the seq_lengths buffer holds")]


def check(status: int, function: str, hint: str = "") -> None:
    """Raise `CudnnError` unless ``status`` is ``CUDNN_STATUS_SUCCESS``; reads cuDNN's last error text."""
    status = integer("status", status, -2**31, 2**31 - 1, "a cudnnStatus_t: C int")
    if status == 0:
        return
    try:
        detail = get_last_error_string()
    except Exception:  # the error is what matters; never mask it while describing it
        detail = ""
    raise CudnnError(status, function, detail, hint)


def _call(name: str, *args, hint: str = "") -> None:
    check(_lib.function(name)(*args), name, hint)


def _create(name: str, hint: str = "") -> int:
    out = c_void_p()
    _call(name, byref(out), hint=hint)
    return int(out.value or 0)


# ---------------------------------------------------------------- library, errors, handle, stream
def get_version() -> int:
    """See `cudnnGetVersion`."""
    return int(_lib.function("cudnnGetVersion")())


@checked
def get_error_string(status: Enum) -> str:
    """See `cudnnGetErrorString`."""
    return (_lib.function("cudnnGetErrorString")(int(status)) or b"").decode(errors="replace")


def get_last_error_string() -> str:
    """See `cudnnGetLastErrorString` (reading it clears it)."""
    buf = ctypes.create_string_buffer(_MAX_ERR)
    _lib.function("cudnnGetLastErrorString")(buf, _MAX_ERR)
    return buf.value.decode(errors="replace").strip()


def create(hint: str = "") -> int:
    """See `cudnnCreate`. Returns the handle address."""
    return _create("cudnnCreate", hint)


@checked
def destroy(handle: Ptr) -> None:
    """See `cudnnDestroy`."""
    _call("cudnnDestroy", handle)


@checked
def set_stream(handle: Ptr, stream: Stream) -> None:
    """See `cudnnSetStream`."""
    _call("cudnnSetStream", handle, stream or None)


@checked
def get_stream(handle: Ptr) -> int:
    """See `cudnnGetStream`."""
    out = c_void_p()
    _call("cudnnGetStream", handle, byref(out))
    return int(out.value or 0)


# ---------------------------------------------------------------- tensor descriptor
def create_tensor_descriptor() -> int:
    """See `cudnnCreateTensorDescriptor`."""
    return _create("cudnnCreateTensorDescriptor")


@checked
def destroy_tensor_descriptor(desc: Ptr) -> None:
    """See `cudnnDestroyTensorDescriptor`."""
    _call("cudnnDestroyTensorDescriptor", desc)


@checked
def set_tensor_nd_descriptor(desc: Ptr, data_type: Enum, dims: Dims, strides: Dims) -> None:
    """See `cudnnSetTensorNdDescriptor`."""
    n = len(dims)
    if len(strides) != n:
        raise ValueError(f"set_tensor_nd_descriptor: strides has {len(strides)} entries; expected len(dims) "
                         f"= {n}")
    dim_a, stride_a = (c_int * n)(*dims), (c_int * n)(*strides)
    _call("cudnnSetTensorNdDescriptor", desc, int(data_type), n, ctypes.addressof(dim_a),
          ctypes.addressof(stride_a))


@checked
def get_tensor_nd_descriptor(desc: Ptr, max_dims: DimsRequested = MAX_DIMS
                             ) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """See `cudnnGetTensorNdDescriptor`. Returns ``(data_type, dims, strides)``."""
    dt, nb = c_int(), c_int()
    dim_a, stride_a = (c_int * max_dims)(), (c_int * max_dims)()
    _call("cudnnGetTensorNdDescriptor", desc, max_dims, byref(dt), byref(nb), ctypes.addressof(dim_a),
          ctypes.addressof(stride_a))
    n = min(nb.value, max_dims)
    return dt.value, tuple(dim_a[:n]), tuple(stride_a[:n])


@checked
def get_tensor_size_in_bytes(desc: Ptr) -> int:
    """See `cudnnGetTensorSizeInBytes`."""
    out = c_size_t()
    _call("cudnnGetTensorSizeInBytes", desc, byref(out))
    return out.value


# ---------------------------------------------------------------- dropout descriptor
def create_dropout_descriptor() -> int:
    """See `cudnnCreateDropoutDescriptor`."""
    return _create("cudnnCreateDropoutDescriptor")


@checked
def destroy_dropout_descriptor(desc: Ptr) -> None:
    """See `cudnnDestroyDropoutDescriptor`."""
    _call("cudnnDestroyDropoutDescriptor", desc)


@checked
def dropout_get_states_size(handle: Ptr) -> int:
    """See `cudnnDropoutGetStatesSize`."""
    out = c_size_t()
    _call("cudnnDropoutGetStatesSize", handle, byref(out))
    return out.value


@checked
def set_dropout_descriptor(desc: Ptr, handle: Ptr, dropout: CFloat, states: Ptr, states_size: SizeT,
                           seed: ULongLong) -> None:
    """See `cudnnSetDropoutDescriptor`."""
    _call("cudnnSetDropoutDescriptor", desc, handle, dropout, states or None, states_size, seed)


@checked
def restore_dropout_descriptor(desc: Ptr, handle: Ptr, dropout: CFloat, states: Ptr, states_size: SizeT,
                               seed: ULongLong) -> None:
    """See `cudnnRestoreDropoutDescriptor`."""
    _call("cudnnRestoreDropoutDescriptor", desc, handle, dropout, states or None, states_size, seed)


@checked
def get_dropout_descriptor(desc: Ptr, handle: Ptr) -> tuple[float, int, int]:
    """See `cudnnGetDropoutDescriptor`. Returns ``(dropout, states address, seed)``."""
    p, states, seed = c_float(), c_void_p(), c_ulonglong()
    _call("cudnnGetDropoutDescriptor", desc, handle, byref(p), byref(states), byref(seed))
    return p.value, int(states.value or 0), seed.value


# ---------------------------------------------------------------- RNN descriptor
def create_rnn_descriptor() -> int:
    """See `cudnnCreateRNNDescriptor`."""
    return _create("cudnnCreateRNNDescriptor")


@checked
def destroy_rnn_descriptor(desc: Ptr) -> None:
    """See `cudnnDestroyRNNDescriptor`."""
    _call("cudnnDestroyRNNDescriptor", desc)


@checked
def set_rnn_descriptor_v8(desc: Ptr, algo: Enum, cell_mode: Enum, bias_mode: Enum, dir_mode: Enum,
                          input_mode: Enum, data_type: Enum, math_prec: Enum, math_type: Enum,
                          input_size: CInt32, hidden_size: CInt32, proj_size: CInt32, num_layers: CInt32,
                          dropout_desc: Ptr, aux_flags: CUInt32) -> None:
    """See `cudnnSetRNNDescriptor_v8`."""
    _call("cudnnSetRNNDescriptor_v8", desc, algo, cell_mode, bias_mode, dir_mode, input_mode, data_type,
          math_prec, math_type, input_size, hidden_size, proj_size, num_layers, dropout_desc or None,
          aux_flags)


@checked
def get_rnn_descriptor_v8(desc: Ptr) -> tuple[int, ...]:
    """See `cudnnGetRNNDescriptor_v8`. Returns the 14 outputs in C order (dropout_desc as an address)."""
    enums = [c_int() for _ in range(8)]
    sizes = [c_int32() for _ in range(4)]
    drop, aux = c_void_p(), c_uint32()
    _call("cudnnGetRNNDescriptor_v8", desc, *(byref(v) for v in enums), *(byref(v) for v in sizes),
          byref(drop), byref(aux))
    return (*(v.value for v in enums), *(v.value for v in sizes), int(drop.value or 0), aux.value)


@checked
def rnn_set_clip(desc: Ptr, clip_mode: Enum, lclip: CDouble, rclip: CDouble) -> None:
    """See `cudnnRNNSetClip_v9` (falls back to `cudnnRNNSetClip_v8` with NOT_PROPAGATE_NAN)."""
    if _lib.has_function("cudnnRNNSetClip_v9"):
        _call("cudnnRNNSetClip_v9", desc, clip_mode, lclip, rclip)
    else:
        _call("cudnnRNNSetClip_v8", desc, clip_mode, 0, lclip, rclip)


@checked
def rnn_get_clip(desc: Ptr) -> tuple[int, float, float]:
    """See `cudnnRNNGetClip_v9` (falls back to `cudnnRNNGetClip_v8`). Returns ``(mode, lclip, rclip)``."""
    mode, lo, hi = c_int(), c_double(), c_double()
    if _lib.has_function("cudnnRNNGetClip_v9"):
        _call("cudnnRNNGetClip_v9", desc, byref(mode), byref(lo), byref(hi))
    else:
        nan_opt = c_int()
        _call("cudnnRNNGetClip_v8", desc, byref(mode), byref(nan_opt), byref(lo), byref(hi))
    return mode.value, lo.value, hi.value


@checked
def build_rnn_dynamic(handle: Ptr, desc: Ptr, mini_batch: CInt) -> None:
    """See `cudnnBuildRNNDynamic`."""
    _call("cudnnBuildRNNDynamic", handle, desc, mini_batch)


@checked
def get_rnn_temp_space_sizes(handle: Ptr, desc: Ptr, fwd_mode: Enum, x_desc: Ptr) -> tuple[int, int]:
    """See `cudnnGetRNNTempSpaceSizes`. Returns ``(work_space_size, reserve_space_size)`` in bytes."""
    work, reserve = c_size_t(), c_size_t()
    _call("cudnnGetRNNTempSpaceSizes", handle, desc, fwd_mode, x_desc, byref(work), byref(reserve))
    return work.value, reserve.value


@checked
def get_rnn_weight_space_size(handle: Ptr, desc: Ptr) -> int:
    """See `cudnnGetRNNWeightSpaceSize`. Returns bytes."""
    out = c_size_t()
    _call("cudnnGetRNNWeightSpaceSize", handle, desc, byref(out))
    return out.value


@checked
def get_rnn_weight_params(handle: Ptr, desc: Ptr, pseudo_layer: CInt32, weight_space_size: SizeT,
                          weight_space: Ptr, lin_layer_id: CInt32, m_desc: Ptr, b_desc: Ptr
                          ) -> tuple[int, int]:
    """See `cudnnGetRNNWeightParams`. Returns ``(m_addr, b_addr)``; 0 where cuDNN reports NULL."""
    m_addr, b_addr = c_void_p(), c_void_p()
    _call("cudnnGetRNNWeightParams", handle, desc, pseudo_layer, weight_space_size, weight_space or None,
          lin_layer_id, m_desc or None, byref(m_addr), b_desc or None, byref(b_addr))
    return int(m_addr.value or 0), int(b_addr.value or 0)


# ---------------------------------------------------------------- RNN data descriptor
def create_rnn_data_descriptor() -> int:
    """See `cudnnCreateRNNDataDescriptor`."""
    return _create("cudnnCreateRNNDataDescriptor")


@checked
def destroy_rnn_data_descriptor(desc: Ptr) -> None:
    """See `cudnnDestroyRNNDataDescriptor`."""
    _call("cudnnDestroyRNNDataDescriptor", desc)


@checked
def set_rnn_data_descriptor(desc: Ptr, data_type: Enum, layout: Enum, max_seq_length: CInt, batch_size: CInt,
                            vector_size: CInt, seq_lengths: Ptr, padding_fill: Ptr) -> None:
    """See `cudnnSetRNNDataDescriptor`. ``seq_lengths``: host address of ``batch_size`` C ints."""
    _call("cudnnSetRNNDataDescriptor", desc, data_type, layout, max_seq_length, batch_size, vector_size,
          seq_lengths or None, padding_fill or None)


@checked
def get_rnn_data_descriptor(desc: Ptr, array_length: ArrayLength, seq_lengths: Ptr,
                            padding_fill: Ptr) -> tuple[int, int, int, int, int]:
    """See `cudnnGetRNNDataDescriptor`. Returns ``(data_type, layout, max_seq_length, batch_size,
    vector_size)``; the lengths and the fill value are written to the given host addresses."""
    outs = [c_int() for _ in range(5)]
    _call("cudnnGetRNNDataDescriptor", desc, *(byref(v) for v in outs), array_length, seq_lengths or None,
          padding_fill or None)
    return tuple(v.value for v in outs)  # type: ignore[return-value]


# ---------------------------------------------------------------- compute
@checked
def rnn_forward(handle: Ptr, desc: Ptr, fwd_mode: Enum, dev_seq_lengths: Ptr, x_desc: Ptr, x: Ptr,
                y_desc: Ptr, y: Ptr, h_desc: Ptr, hx: Ptr, hy: Ptr, c_desc: Ptr, cx: Ptr, cy: Ptr,
                weight_space_size: SizeT, weight_space: Ptr, work_space_size: SizeT, work_space: Ptr,
                reserve_space_size: SizeT, reserve_space: Ptr) -> None:
    """See `cudnnRNNForward`."""
    _call("cudnnRNNForward", handle, desc, fwd_mode, dev_seq_lengths, x_desc, x, y_desc, y, h_desc, hx, hy,
          c_desc, cx, cy, weight_space_size, weight_space, work_space_size, work_space, reserve_space_size,
          reserve_space)


@checked
def rnn_backward_data_v8(handle: Ptr, desc: Ptr, dev_seq_lengths: Ptr, y_desc: Ptr, y: Ptr, dy: Ptr,
                         x_desc: Ptr, dx: Ptr, h_desc: Ptr, hx: Ptr, dhy: Ptr, dhx: Ptr, c_desc: Ptr, cx: Ptr,
                         dcy: Ptr, dcx: Ptr, weight_space_size: SizeT, weight_space: Ptr,
                         work_space_size: SizeT, work_space: Ptr, reserve_space_size: SizeT,
                         reserve_space: Ptr) -> None:
    """See `cudnnRNNBackwardData_v8`."""
    _call("cudnnRNNBackwardData_v8", handle, desc, dev_seq_lengths, y_desc, y, dy, x_desc, dx, h_desc, hx,
          dhy, dhx, c_desc, cx, dcy, dcx, weight_space_size, weight_space, work_space_size, work_space,
          reserve_space_size, reserve_space)


@checked
def rnn_backward_weights_v8(handle: Ptr, desc: Ptr, add_grad: Enum, dev_seq_lengths: Ptr, x_desc: Ptr,
                            x: Ptr, h_desc: Ptr, hx: Ptr, y_desc: Ptr, y: Ptr, weight_space_size: SizeT,
                            dweight_space: Ptr, work_space_size: SizeT, work_space: Ptr,
                            reserve_space_size: SizeT, reserve_space: Ptr) -> None:
    """See `cudnnRNNBackwardWeights_v8`."""
    _call("cudnnRNNBackwardWeights_v8", handle, desc, add_grad, dev_seq_lengths, x_desc, x, h_desc, hx,
          y_desc, y, weight_space_size, dweight_space, work_space_size, work_space, reserve_space_size,
          reserve_space)


__all__ = sorted(n for n, v in globals().items() if callable(v) and not n.startswith("_")
                 and getattr(v, "__module__", None) == __name__)
