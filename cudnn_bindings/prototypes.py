"""The one prototype table: C function name -> (restype, argtypes), checked against the headers by tests.

Mapping rules from the C declarations (``const`` is ignored):

* ``cudnnStatus_t`` and every other enum -> ``c_int``; opaque handles/descriptors and ``cudaStream_t``
  -> ``c_void_p``;
* ``int`` -> ``c_int``, ``int32_t`` -> ``c_int32``, ``uint32_t`` -> ``c_uint32``, ``size_t`` -> ``c_size_t``,
  ``float``/``double`` -> ``c_float``/``c_double``, ``unsigned long long`` -> ``c_ulonglong``;
* ``void *`` and arrays ``T name[]`` (host or device addresses, passed as integers) -> ``c_void_p``;
  ``char *`` -> ``c_char_p``; ``void **`` -> ``POINTER(c_void_p)``; any other ``T *`` (an output scalar)
  -> ``POINTER(<T's type>)``.
"""

from __future__ import annotations

from ctypes import (
    POINTER,
    c_char_p,
    c_double,
    c_float,
    c_int,
    c_int32,
    c_size_t,
    c_uint32,
    c_ulonglong,
    c_void_p,
)

__all__ = ["PROTOTYPES", "OPTIONAL"]

_status = c_int  # cudnnStatus_t
_enum = c_int  # any cudnn*_t enum
_h = c_void_p  # an opaque handle or descriptor
_p = c_void_p  # a host or device address
_out_h = POINTER(c_void_p)  # T ** where T is opaque, and void **
_out_enum = POINTER(c_int)
_out_i32 = POINTER(c_int32)
_out_int = POINTER(c_int)
_out_size = POINTER(c_size_t)
_out_double = POINTER(c_double)

PROTOTYPES: dict[str, tuple[type | None, tuple[type, ...]]] = {
    # library, handle, stream, errors (cudnn_graph.h)
    "cudnnGetVersion": (c_size_t, ()),
    "cudnnGetErrorString": (c_char_p, (_enum,)),
    "cudnnGetLastErrorString": (None, (c_char_p, c_size_t)),
    "cudnnCreate": (_status, (_out_h,)),
    "cudnnDestroy": (_status, (_h,)),
    "cudnnSetStream": (_status, (_h, _h)),
    "cudnnGetStream": (_status, (_h, _out_h)),
    # tensor descriptor (cudnn_ops.h)
    "cudnnCreateTensorDescriptor": (_status, (_out_h,)),
    "cudnnDestroyTensorDescriptor": (_status, (_h,)),
    "cudnnSetTensorNdDescriptor": (_status, (_h, _enum, c_int, _p, _p)),
    "cudnnGetTensorNdDescriptor": (_status, (_h, c_int, _out_enum, _out_int, _p, _p)),
    "cudnnGetTensorSizeInBytes": (_status, (_h, _out_size)),
    # dropout descriptor (cudnn_ops.h)
    "cudnnCreateDropoutDescriptor": (_status, (_out_h,)),
    "cudnnDestroyDropoutDescriptor": (_status, (_h,)),
    "cudnnDropoutGetStatesSize": (_status, (_h, _out_size)),
    "cudnnSetDropoutDescriptor": (_status, (_h, _h, c_float, _p, c_size_t, c_ulonglong)),
    "cudnnRestoreDropoutDescriptor": (_status, (_h, _h, c_float, _p, c_size_t, c_ulonglong)),
    "cudnnGetDropoutDescriptor": (_status, (_h, _h, POINTER(c_float), _out_h, POINTER(c_ulonglong))),
    # RNN descriptor (cudnn_adv.h)
    "cudnnCreateRNNDescriptor": (_status, (_out_h,)),
    "cudnnDestroyRNNDescriptor": (_status, (_h,)),
    "cudnnSetRNNDescriptor_v8": (
        _status,
        (_h, _enum, _enum, _enum, _enum, _enum, _enum, _enum, _enum, c_int32, c_int32, c_int32, c_int32, _h,
         c_uint32),
    ),
    "cudnnGetRNNDescriptor_v8": (
        _status,
        (_h, _out_enum, _out_enum, _out_enum, _out_enum, _out_enum, _out_enum, _out_enum, _out_enum,
         _out_i32, _out_i32, _out_i32, _out_i32, _out_h, POINTER(c_uint32)),
    ),
    "cudnnRNNSetClip_v9": (_status, (_h, _enum, c_double, c_double)),
    "cudnnRNNGetClip_v9": (_status, (_h, _out_enum, _out_double, _out_double)),
    "cudnnRNNSetClip_v8": (_status, (_h, _enum, _enum, c_double, c_double)),
    "cudnnRNNGetClip_v8": (_status, (_h, _out_enum, _out_enum, _out_double, _out_double)),
    "cudnnBuildRNNDynamic": (_status, (_h, _h, c_int)),
    "cudnnGetRNNTempSpaceSizes": (_status, (_h, _h, _enum, _h, _out_size, _out_size)),
    "cudnnGetRNNWeightSpaceSize": (_status, (_h, _h, _out_size)),
    "cudnnGetRNNWeightParams": (_status, (_h, _h, c_int32, c_size_t, _p, c_int32, _h, _out_h, _h, _out_h)),
    # RNN data descriptor (cudnn_adv.h)
    "cudnnCreateRNNDataDescriptor": (_status, (_out_h,)),
    "cudnnDestroyRNNDataDescriptor": (_status, (_h,)),
    "cudnnSetRNNDataDescriptor": (_status, (_h, _enum, _enum, c_int, c_int, c_int, _p, _p)),
    "cudnnGetRNNDataDescriptor": (
        _status, (_h, _out_enum, _out_enum, _out_int, _out_int, _out_int, c_int, _p, _p)
    ),
    # compute (cudnn_adv.h)
    "cudnnRNNForward": (
        _status,
        (_h, _h, _enum, _p, _h, _p, _h, _p, _h, _p, _p, _h, _p, _p, c_size_t, _p, c_size_t, _p, c_size_t, _p),
    ),
    "cudnnRNNBackwardData_v8": (
        _status,
        (_h, _h, _p, _h, _p, _p, _h, _p, _h, _p, _p, _p, _h, _p, _p, _p, c_size_t, _p, c_size_t, _p, c_size_t,
         _p),
    ),
    "cudnnRNNBackwardWeights_v8": (
        _status,
        (_h, _h, _enum, _p, _h, _p, _h, _p, _h, _p, c_size_t, _p, c_size_t, _p, c_size_t, _p),
    ),
}

# Functions the loader tolerates missing (a fallback exists): the clip pair of the other generation.
OPTIONAL: frozenset[str] = frozenset({"cudnnRNNSetClip_v9", "cudnnRNNGetClip_v9", "cudnnRNNSetClip_v8",
                                      "cudnnRNNGetClip_v8"})
