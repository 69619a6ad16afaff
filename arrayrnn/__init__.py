"""arrayrnn: fused RNN, LSTM and GRU over NumPy and CuPy arrays, with packed weights and hand-written BPTT."""

from .backend import as_array, get_xp
from .errors import EngineUnavailableError
from .layout import Layout, layout_of
from .params import PackedParams
from .spec import RNNSpec

__version__ = "0.1.0"

__all__ = [
    "EngineUnavailableError",
    "Layout",
    "PackedParams",
    "RNNSpec",
    "as_array",
    "get_xp",
    "layout_of",
]
