"""IntEnums mirrored from the cuDNN 9 headers (checked value by value against them by the tests).

Member names are the C names without ``CUDNN_`` and without the prefix all members of that enum share:
``CUDNN_RNN_DOUBLE_BIAS -> RNNBiasMode.DOUBLE_BIAS``, ``CUDNN_LSTM -> RNNMode.LSTM``,
``CUDNN_STATUS_BAD_PARAM -> Status.BAD_PARAM``. Deprecated aliases of the headers are kept as aliases.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = [
    "Status", "DataType", "MathType", "NanPropagation", "RNNAlgo", "ForwardMode", "RNNMode", "RNNBiasMode",
    "DirectionMode", "RNNInputMode", "RNNClipMode", "RNNDataLayout", "WgradMode",
    "RNN_PADDED_IO_DISABLED", "RNN_PADDED_IO_ENABLED", "C_NAMES", "C_DEFINES",
]


class Status(IntEnum):
    """``cudnnStatus_t``."""

    SUCCESS = 0
    NOT_INITIALIZED = 1001
    SUBLIBRARY_VERSION_MISMATCH = 1002
    SERIALIZATION_VERSION_MISMATCH = 1003
    DEPRECATED = 1004
    LICENSE_ERROR = 1005
    RUNTIME_IN_PROGRESS = 1006
    RUNTIME_FP_OVERFLOW = 1007
    SUBLIBRARY_LOADING_FAILED = 1008
    BAD_PARAM = 2000
    INVALID_VALUE = 2001  # deprecated alias in the header: use BAD_PARAM
    BAD_PARAM_NULL_POINTER = 2002
    BAD_PARAM_MISALIGNED_POINTER = 2003
    BAD_PARAM_NOT_FINALIZED = 2004
    BAD_PARAM_OUT_OF_BOUND = 2005
    BAD_PARAM_SIZE_INSUFFICIENT = 2006
    BAD_PARAM_STREAM_MISMATCH = 2007
    BAD_PARAM_SHAPE_MISMATCH = 2008
    BAD_PARAM_DUPLICATED_ENTRIES = 2009
    BAD_PARAM_ATTRIBUTE_TYPE = 2010
    BAD_PARAM_CUDA_GRAPH_MISMATCH = 2011
    BAD_PARAM_DESCRIPTOR_TYPE = 2012
    NOT_SUPPORTED = 3000
    NOT_SUPPORTED_GRAPH_PATTERN = 3001
    NOT_SUPPORTED_SHAPE = 3002
    NOT_SUPPORTED_DATA_TYPE = 3003
    NOT_SUPPORTED_LAYOUT = 3004
    NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER = 3005
    NOT_SUPPORTED_INCOMPATIBLE_CUDART = 3006
    NOT_SUPPORTED_ARCH_MISMATCH = 3007
    NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING = 3008
    NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE = 3009
    NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT = 3010
    NOT_SUPPORTED_PADDING = 3011
    NOT_SUPPORTED_BAD_LAUNCH_PARAM = 3012
    NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API = 3013
    NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE = 3014
    INTERNAL_ERROR = 4000
    INTERNAL_ERROR_COMPILATION_FAILED = 4001
    INTERNAL_ERROR_UNEXPECTED_VALUE = 4002
    INTERNAL_ERROR_HOST_ALLOCATION_FAILED = 4003
    INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED = 4004
    INTERNAL_ERROR_BAD_LAUNCH_PARAM = 4005
    INTERNAL_ERROR_TEXTURE_CREATION_FAILED = 4006
    EXECUTION_FAILED = 5000
    EXECUTION_FAILED_CUDA_DRIVER = 5001
    EXECUTION_FAILED_CUBLAS = 5002
    EXECUTION_FAILED_CUDART = 5003
    EXECUTION_FAILED_CURAND = 5004
    # deprecated aliases (same values as the members above)
    ALLOC_FAILED = 4003
    ARCH_MISMATCH = 3007
    MAPPING_ERROR = 4006
    RUNTIME_PREREQUISITE_MISSING = 3008
    VERSION_MISMATCH = 1002


class DataType(IntEnum):
    """``cudnnDataType_t``."""

    FLOAT = 0
    DOUBLE = 1
    HALF = 2
    INT8 = 3
    INT32 = 4
    INT8x4 = 5
    UINT8 = 6
    UINT8x4 = 7
    INT8x32 = 8
    BFLOAT16 = 9
    INT64 = 10
    BOOLEAN = 11
    FP8_E4M3 = 12
    FP8_E5M2 = 13
    FAST_FLOAT_FOR_FP8 = 14
    FP8_E8M0 = 15
    FP4_E2M1 = 16
    INT4 = 17
    UINT4 = 18
    UINT32 = 19
    COMPLEX_FP32 = 20
    COMPLEX_FP64 = 21


class MathType(IntEnum):
    """``cudnnMathType_t``."""

    DEFAULT_MATH = 0
    TENSOR_OP_MATH = 1
    TENSOR_OP_MATH_ALLOW_CONVERSION = 2
    FMA_MATH = 3


class NanPropagation(IntEnum):
    """``cudnnNanPropagation_t`` (deprecated in cuDNN 9; only used by the ``_v8`` clip fallback)."""

    NOT_PROPAGATE_NAN = 0
    PROPAGATE_NAN = 1


class RNNAlgo(IntEnum):
    """``cudnnRNNAlgo_t``."""

    STANDARD = 0
    PERSIST_STATIC = 1
    PERSIST_DYNAMIC = 2
    PERSIST_STATIC_SMALL_H = 3
    COUNT = 4


class ForwardMode(IntEnum):
    """``cudnnForwardMode_t``."""

    INFERENCE = 0
    TRAINING = 1


class RNNMode(IntEnum):
    """``cudnnRNNMode_t``."""

    RNN_RELU = 0
    RNN_TANH = 1
    LSTM = 2
    GRU = 3


class RNNBiasMode(IntEnum):
    """``cudnnRNNBiasMode_t``."""

    NO_BIAS = 0
    SINGLE_INP_BIAS = 1
    DOUBLE_BIAS = 2
    SINGLE_REC_BIAS = 3


class DirectionMode(IntEnum):
    """``cudnnDirectionMode_t``."""

    UNIDIRECTIONAL = 0
    BIDIRECTIONAL = 1


class RNNInputMode(IntEnum):
    """``cudnnRNNInputMode_t``."""

    LINEAR_INPUT = 0
    SKIP_INPUT = 1


class RNNClipMode(IntEnum):
    """``cudnnRNNClipMode_t``."""

    NONE = 0
    MINMAX = 1


class RNNDataLayout(IntEnum):
    """``cudnnRNNDataLayout_t``."""

    SEQ_MAJOR_UNPACKED = 0
    SEQ_MAJOR_PACKED = 1
    BATCH_MAJOR_UNPACKED = 2


class WgradMode(IntEnum):
    """``cudnnWgradMode_t``."""

    ADD = 0
    SET = 1


# auxFlags of cudnnSetRNNDescriptor_v8 (#defines in cudnn_adv.h)
RNN_PADDED_IO_DISABLED = 0
"""``CUDNN_RNN_PADDED_IO_DISABLED``: the ``aux_flags`` value without padded input/output."""
RNN_PADDED_IO_ENABLED = 1
"""``CUDNN_RNN_PADDED_IO_ENABLED``: the ``aux_flags`` bit for padded input/output (the default here)."""

# Python enum -> the C typedef it mirrors; #define name -> our constant (used by the header tests).
C_NAMES: dict[type[IntEnum], str] = {
    Status: "cudnnStatus_t", DataType: "cudnnDataType_t", MathType: "cudnnMathType_t",
    NanPropagation: "cudnnNanPropagation_t", RNNAlgo: "cudnnRNNAlgo_t", ForwardMode: "cudnnForwardMode_t",
    RNNMode: "cudnnRNNMode_t", RNNBiasMode: "cudnnRNNBiasMode_t", DirectionMode: "cudnnDirectionMode_t",
    RNNInputMode: "cudnnRNNInputMode_t", RNNClipMode: "cudnnRNNClipMode_t",
    RNNDataLayout: "cudnnRNNDataLayout_t", WgradMode: "cudnnWgradMode_t",
}
"""Each Python enum -> the C typedef it mirrors (used by the header tests)."""
C_DEFINES: dict[str, int] = {
    "CUDNN_RNN_PADDED_IO_DISABLED": RNN_PADDED_IO_DISABLED,
    "CUDNN_RNN_PADDED_IO_ENABLED": RNN_PADDED_IO_ENABLED,
}
"""Each ``#define`` name -> its constant here (used by the header tests)."""
