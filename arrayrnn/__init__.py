"""arrayrnn: fused RNN, LSTM and GRU over NumPy and CuPy arrays, with packed weights and hand-written BPTT."""

from . import activations, distributed, nn, optim
from .autodiff import grad, ops, value_and_grad
from .backend import as_array, get_xp
from .bias_act import bias_act, dense_bias_act
from .errors import EngineUnavailableError
from .interop import from_torch, to_torch_state_dict
from .io import load, save
from .layout import Layout, layout_of
from .params import PackedParams
from .rnn import RNNGrads, RNNResult, rnn_backward, rnn_forward
from .scan import scan
from .spec import RNNSpec

__version__ = "0.1.0"

__all__ = [
    "EngineUnavailableError",
    "Layout",
    "PackedParams",
    "RNNGrads",
    "RNNResult",
    "RNNSpec",
    "activations",
    "as_array",
    "bias_act",
    "dense_bias_act",
    "distributed",
    "grad",
    "nn",
    "ops",
    "optim",
    "scan",
    "value_and_grad",
    "from_torch",
    "load",
    "save",
    "to_torch_state_dict",
    "get_xp",
    "layout_of",
    "rnn_backward",
    "rnn_forward",
]
