"""Exact weight interop with PyTorch's ``nn.RNN`` / ``nn.LSTM`` / ``nn.GRU``. torch is imported lazily.

The canonical layout is PyTorch's parameter order, so import and export are copies block by block,
with names mapped ``W_ih`` <-> ``weight_ih_l{layer}{_reverse}`` and so on.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .backend import to_host
from .layout import Block, layout_of
from .params import PackedParams
from .spec import RNNSpec

TORCH_NAMES = {"W_ih": "weight_ih", "W_hh": "weight_hh", "b_ih": "bias_ih", "b_hh": "bias_hh",
               "W_hr": "weight_hr"}
TORCH_MODES = {"LSTM": "lstm", "GRU": "gru", "RNN_TANH": "rnn_tanh", "RNN_RELU": "rnn_relu"}


def torch_key(block: Block) -> str:
    """PyTorch's ``state_dict`` key of a canonical block: ``l1.rev.W_hh`` -> ``weight_hh_l1_reverse``."""
    return f"{TORCH_NAMES[block.name]}_l{block.layer}{'_reverse' if block.direction else ''}"


def spec_from_torch(module: Any) -> RNNSpec:
    """The :class:`RNNSpec` of a ``torch.nn.RNN/LSTM/GRU`` module."""
    mode = TORCH_MODES.get(getattr(module, "mode", None))
    if mode is None:
        raise TypeError(f"module has type {type(module).__name__}; expected torch.nn.RNN, LSTM or GRU")
    if getattr(module, "layer_norm", False):
        raise ValueError(f"module {type(module).__name__} has layer_norm=True; {_NO_LAYER_NORM} (its weights "
                         "are arrayrnn.torch.ArrayRNN.from_torch(module)'s, or the module's own buffer: "
                         "module.flat)")
    dtype = _check_torch_dtype(module)
    return RNNSpec(mode=mode, input_size=module.input_size, hidden_size=module.hidden_size,
                   num_layers=module.num_layers, bidirectional=module.bidirectional, bias=module.bias,
                   proj_size=getattr(module, "proj_size", 0), dropout=float(module.dropout),
                   dtype=str(dtype).removeprefix("torch."))


def _check_torch_dtype(module: Any) -> Any:
    import torch

    tensors = list(module.parameters())
    if not tensors:
        raise ValueError(f"module {type(module).__name__} has no parameters")
    dtypes = {t.dtype for t in tensors}
    allowed = (torch.float16, torch.float32, torch.float64)
    if len(dtypes) != 1 or next(iter(dtypes)) not in allowed:
        raise TypeError(f"module's parameters have dtypes {sorted(map(str, dtypes))}; expected one of "
                        "torch.float16, float32, float64 (convert with module.float() or module.double())")
    meta = [t for t in tensors if t.device.type == "meta"]
    if meta:
        raise ValueError("module's parameters are on the meta device (no values); materialise them first "
                         "(module.to_empty(device='cpu') and initialise, or load a state_dict)")
    return tensors[0].dtype


def from_torch(module: Any) -> PackedParams:
    """Copy a PyTorch RNN module's weights into a new canonical :class:`PackedParams` on the host.

    Bit-exact: every block equals the module's parameter of the same name. ``batch_first`` is a call
    option here (``rnn_forward(..., batch_first=True)``), not part of the weights.

    Parameters
    ----------
    module : torch.nn.LSTM, torch.nn.GRU or torch.nn.RNN
        Any number of layers, either direction, LSTM projection included (CPU or CUDA).

    Returns
    -------
    PackedParams
        Its spec mirrors the module's configuration and dtype.

    Raises
    ------
    ValueError
        A module on the meta device, or with re-parametrised weights (``weight_norm``, ``parametrize``).
    TypeError
        Not a ``torch.nn.LSTM``/``GRU``/``RNN``.

    See Also
    --------
    to_torch_state_dict : the way back.

    Examples
    --------
    >>> import torch
    >>> import arrayrnn as ar
    >>> lstm = torch.nn.LSTM(3, 4, num_layers=2)
    >>> params = ar.from_torch(lstm)
    >>> params.spec.mode, params.spec.num_layers, params.data.size
    ('lstm', 2, 304)
    """
    spec = spec_from_torch(module)
    state = module.state_dict()
    params = PackedParams.zeros(spec)
    for block in params.layout.blocks:
        key = torch_key(block)
        tensor = state.get(key)
        if tensor is None:
            raise ValueError(f"module's state_dict has no {key!r} (it has {sorted(state)}); a module with "
                             "re-parametrised weights (weight_norm, parametrize) must be exported with the "
                             "plain weights first (torch.nn.utils.parametrize.remove_parametrizations)")
        if tuple(tensor.shape) != tuple(block.shape):
            raise ValueError(f"module's {key} has shape {tuple(tensor.shape)}; expected {tuple(block.shape)} "
                             f"for {spec}")
        params.block_view(block)[...] = tensor.detach().cpu().numpy()
    return params


def to_torch_state_dict(params: PackedParams) -> dict[str, Any]:
    """``{torch key: tensor}`` loadable with ``module.load_state_dict`` into the matching module.

    Keys, shapes and order equal ``module.state_dict()``.

    Parameters
    ----------
    params : PackedParams
        Any format, any device (converted to canonical and copied to the host).

    Returns
    -------
    dict of str to torch.Tensor
        ``weight_ih_l0``, ``weight_hh_l0``, ``bias_ih_l0``, ... (``_reverse`` for the reverse direction).

    Raises
    ------
    TypeError
        ``params`` is not a `PackedParams`.
    ValueError
        A configuration PyTorch cannot express (single-bias modes, reset-before GRU, cell clipping,
        peepholes, zoneout, layer normalisation, a custom cell), rather than export weights that would
        compute something else there.

    Examples
    --------
    >>> import torch
    >>> import arrayrnn as ar
    >>> params = ar.PackedParams.init(ar.RNNSpec(mode="gru", input_size=3, hidden_size=4), seed=0)
    >>> gru = torch.nn.GRU(3, 4)
    >>> gru.load_state_dict(ar.to_torch_state_dict(params))
    <All keys matched successfully>
    """
    import torch

    if not isinstance(params, PackedParams):
        raise TypeError(f"params has type {type(params).__name__}; expected an arrayrnn.PackedParams")
    spec = params.spec
    _check_torch_expressible(spec)
    host = to_host(params.to_format("canonical").data)
    layout = layout_of(spec)
    return {torch_key(b): torch.from_numpy(np.array(host[b.offset:b.stop]).reshape(b.shape))
            for b in layout.blocks}


_NO_LAYER_NORM = ("torch.nn.LSTM / GRU / RNN have no layer normalisation and no place for its gains "
                  "(g_ih, g_hh, g_c, b_c), so nn.* would compute something else")


def _check_torch_expressible(spec: RNNSpec) -> None:
    if spec.custom_cell is not None:
        raise ValueError(f"mode = {spec.mode!r} is a custom cell (arrayrnn.register_cell); torch.nn has no "
                         "module that computes it, so there is no state_dict to load into one; keep the "
                         "weights in arrayrnn (ar.save) or run them in torch as "
                         "arrayrnn.torch.ArrayRNN(params.spec), whose flat parameter takes params.data")
    if spec.bias in ("single_inp", "single_rec"):
        raise ValueError(f"bias = {spec.bias!r} has no PyTorch equivalent; PyTorch has bias=True "
                         "(double) or bias=False (none)")
    if not spec.reset_after:
        raise ValueError("reset_after = False (reset-before GRU) has no PyTorch equivalent; "
                         "PyTorch's GRU is reset_after=True")
    if spec.cell_clip is not None:
        raise ValueError(f"cell_clip = {spec.cell_clip} has no PyTorch equivalent; "
                         "the module would compute something else")
    if spec.peepholes:
        raise ValueError("peepholes = True has no PyTorch equivalent (nn.LSTM has no peephole weights); "
                         "export to ONNX instead, or use a spec with peepholes=False")
    if spec.zoneout or spec.zoneout_cell:
        raise ValueError(f"zoneout = {spec.zoneout}, zoneout_cell = {spec.zoneout_cell} have no PyTorch "
                         "equivalent; nn.LSTM/GRU/RNN would compute something else in inference")
    if spec.layer_norm:
        raise ValueError(f"layer_norm = True has no PyTorch equivalent: {_NO_LAYER_NORM}; keep the weights "
                         "in arrayrnn (ar.save, or arrayrnn.torch.LSTM(..., layer_norm=True))")
