"""arrayrnn: fused RNN, LSTM and GRU over NumPy and CuPy arrays, with packed weights and hand-written BPTT."""

from . import (  # public paths of modules in the folders below
    activations,
    cellmath,
    cells,  # registers the example cells (mode="cifg", "slstm")
    distributed,
    nn,
    optim,
)
from .autodiff import grad, ops, value_and_grad
from .autodiff.bias_act import bias_act, dense_bias_act
from .autodiff.scan import scan
from .core.backend import as_array, get_xp
from .core.cell_registry import Cell, register_cell, registered_cells, unregister_cell
from .core.errors import EngineUnavailableError
from .core.interop import from_torch, to_torch_state_dict
from .core.io import load, save
from .core.layout import Layout, layout_of
from .core.params import PackedParams
from .core.spec import RNNSpec
from .engines.determinism import is_deterministic, set_deterministic
from .engines.thread_count import get_num_threads, set_num_threads
from .frontend.cell import CellGrads, CellResult, cell_step, cell_step_backward
from .frontend.check_cell import CellCheckError, check_cell
from .frontend.compile_ahead import warmup
from .frontend.dropout import cell_masks
from .frontend.rnn import RNNGrads, RNNResult, rnn_backward, rnn_forward

__version__ = "0.1.0"

__all__ = [
    "Cell",
    "CellCheckError",
    "CellGrads",
    "CellResult",
    "EngineUnavailableError",
    "Layout",
    "PackedParams",
    "RNNGrads",
    "RNNResult",
    "RNNSpec",
    "activations",
    "as_array",
    "bias_act",
    "cell_masks",
    "cellmath",
    "cells",
    "check_cell",
    "cell_step",
    "cell_step_backward",
    "dense_bias_act",
    "distributed",
    "grad",
    "nn",
    "ops",
    "optim",
    "scan",
    "value_and_grad",
    "warmup",
    "from_torch",
    "load",
    "save",
    "to_torch_state_dict",
    "get_xp",
    "get_num_threads",
    "set_num_threads",
    "is_deterministic",
    "set_deterministic",
    "layout_of",
    "rnn_backward",
    "rnn_forward",
    "register_cell",
    "registered_cells",
    "unregister_cell",
]
