"""ctypes bindings to cuDNN v9's RNN API: thin checked calls, owning descriptors, validated metadata.

Importing never loads cuDNN; the library is found and loaded on first use (see `cudnn_bindings._lib` for
the search order; ``ARRAYRNN_CUDNN_LIB`` points it at a specific library). Knows nothing of arrayrnn.
"""

from __future__ import annotations

from . import enums, prototypes, raw
from ._cuda import device_count
from ._lib import find_library, library_path, version
from .config import RNNConfig, SeqDataConfig, TensorConfig
from .descriptors import (
    DropoutDescriptor,
    Handle,
    RNNDataDescriptor,
    RNNDescriptor,
    TensorDescriptor,
    live_handles,
)
from .enums import (
    DataType,
    DirectionMode,
    ForwardMode,
    MathType,
    RNNAlgo,
    RNNBiasMode,
    RNNClipMode,
    RNNDataLayout,
    RNNInputMode,
    RNNMode,
    Status,
    WgradMode,
)
from .errors import CudnnError, CudnnLibraryError
from .prepared import PreparedCall, prepare_backward_data, prepare_backward_weights, prepare_forward
from .raw import check
from .rnn import (
    WeightParams,
    WeightRegion,
    backward_data,
    backward_weights,
    build_rnn_dynamic,
    forward,
    temp_space_sizes,
    weight_params,
    weight_space_size,
)

__all__ = [
    "enums", "prototypes", "raw", "version", "library_path", "find_library", "is_available", "device_count",
    "CudnnError", "CudnnLibraryError", "check",
    "RNNConfig", "SeqDataConfig", "TensorConfig",
    "Handle", "RNNDescriptor", "RNNDataDescriptor", "TensorDescriptor", "DropoutDescriptor", "live_handles",
    "DataType", "DirectionMode", "ForwardMode", "MathType", "RNNAlgo", "RNNBiasMode", "RNNClipMode",
    "RNNDataLayout", "RNNInputMode", "RNNMode", "Status", "WgradMode",
    "WeightParams", "WeightRegion", "weight_space_size", "temp_space_sizes", "weight_params", "forward",
    "backward_data", "backward_weights", "build_rnn_dynamic",
    "PreparedCall", "prepare_forward", "prepare_backward_data", "prepare_backward_weights",
]


def is_available() -> bool:
    """Whether a cuDNN >= 9.0 library can be loaded (does not check for a GPU; see `device_count`)."""
    try:
        version()
    except CudnnLibraryError:
        return False
    return True
