"""``torch.onnx.export`` of :mod:`arrayrnn.torch`'s modules: ONNX's standard ``LSTM`` / ``GRU`` / ``RNN``.

While ``torch.onnx.export`` traces (``torch.onnx.is_in_onnx_export()``), the forward emits one ONNX
operator per layer through :func:`torch.onnx.ops.symbolic_multi_out` (the exporter's documented way to
place an ONNX operator in the graph) instead of running the engines. Its ``W`` / ``R`` / ``B`` inputs are
torch operations on the module's weights (the gate reordering of :func:`arrayrnn.onnx.layer_weights`,
folded into initializers by the exporter's optimizer); per-row lengths become ``sequence_lens``. The
graph is the one :func:`arrayrnn.onnx.build_model` writes. The legacy TorchScript exporter
(``torch.onnx.export(..., dynamo=False)``) cannot record that call; there each layer is an
``autograd.Function`` whose ``symbolic`` writes the same node (that exporter's documented hook).
What ONNX's operators cannot express (an LSTM projection, cell clipping) is exported as the
recurrence in elementary operators instead (:mod:`.torch_recurrence`, unrolled over the traced
sequence length). Inference only: a module in
training mode exports without dropout.
"""

from __future__ import annotations

from typing import Any

import torch

import arrayrnn as ar
from arrayrnn.core.layout import PEEPHOLE_GATES

from . import onnx as onnx_graph
from . import torch_recurrence
from .torch_recurrence import block_views

_Tensor = torch.Tensor


def emit(spec: ar.RNNSpec, batch_first: bool, x: _Tensor, h0: _Tensor | None, c0: _Tensor | None,
         flat: _Tensor, lengths: Any) -> tuple[_Tensor, _Tensor, _Tensor | None]:
    """``(y, h_n, c_n)`` as ONNX operators over ``x`` (3-D) and the canonical weights ``flat``."""
    try:
        onnx_graph.check_exportable(spec)
    except ValueError:
        lengths = torch.as_tensor(lengths) if lengths is not None else None
        return torch_recurrence.run(spec, flat, x, lengths, h0, c0, batch_first)
    if batch_first:
        x = x.transpose(0, 1)
    T, B = x.shape[0], x.shape[1]
    D, H = spec.num_directions, spec.hidden_size
    views = block_views(spec, flat)
    seq = torch.as_tensor(lengths).to(device=x.device, dtype=torch.int32) if lengths is not None else None
    n_out = 3 if spec.has_cell else 2
    hs, cs, inp = [], [], x
    for layer in range(spec.num_layers):
        W, R, bias = onnx_graph.layer_weights(spec, layer, lambda *key: views.get(key), torch)
        rows = slice(layer * D, (layer + 1) * D)
        inputs = [inp, W, R, bias, seq, h0[rows] if h0 is not None else None]
        if spec.has_cell:
            inputs.append(c0[rows] if c0 is not None else None)
        if spec.peepholes:  # the LSTM node's input P [D, 3*H], rows in ONNX's order i, o, f
            order = [PEEPHOLE_GATES.index(g) for g in ("i", "o", "f")]
            inputs.append(torch.stack([views[(layer, d, "P")][order].reshape(-1) for d in range(D)]))
        if torch.jit.is_tracing():  # the legacy exporter
            outputs = _LegacyLayer.apply(spec, *inputs)
        else:
            outputs = torch.onnx.ops.symbolic_multi_out(
                onnx_graph.OPERATORS[spec.mode], inputs, onnx_graph.node_attributes(spec),
                dtypes=[x.dtype] * n_out, shapes=[[T, D, B, H]] + [[D, B, H]] * (n_out - 1),
                version=onnx_graph.OPSET)
        inp = outputs[0].permute(0, 2, 1, 3).reshape(T, B, D * H)
        hs.append(_initial_where_empty(outputs[1], inputs[5], seq))
        if spec.has_cell:
            cs.append(_initial_where_empty(outputs[2], inputs[6], seq))
    y = inp.transpose(0, 1) if batch_first else inp
    return y, torch.cat(hs), (torch.cat(cs) if spec.has_cell else None)


def _initial_where_empty(final: _Tensor, initial: _Tensor | None, seq: _Tensor | None) -> _Tensor:
    """ONNX Runtime ends a zero-length row's state at zeros; arrayrnn (and this export) at the initial one."""
    if initial is None or seq is None:
        return final
    return torch.where((seq == 0)[None, :, None], initial, final)


class _LegacyLayer(torch.autograd.Function):
    """One layer's ONNX node for the legacy TorchScript exporter (``dynamo=False``).

    The forward only gives the tracer outputs of the node's shapes (zeros); the exported graph holds
    the node that :meth:`symbolic` writes, never these values.
    """

    @staticmethod
    def forward(ctx, spec: ar.RNNSpec, x: _Tensor, *_: _Tensor | None) -> tuple[_Tensor, ...]:
        T, B, D, H = x.shape[0], x.shape[1], spec.num_directions, spec.hidden_size
        states = [x.new_zeros(D, B, H) for _ in range(2 if spec.has_cell else 1)]
        return (x.new_zeros(T, D, B, H), *states)

    @staticmethod
    def symbolic(g, spec: ar.RNNSpec, *inputs):
        attrs = {_legacy_attribute_name(k, v): v for k, v in onnx_graph.node_attributes(spec).items()}
        inputs = [i if i is not None else _absent(g) for i in inputs]
        return g.op(onnx_graph.OPERATORS[spec.mode], *inputs, outputs=3 if spec.has_cell else 2, **attrs)


def _legacy_attribute_name(name: str, value: Any) -> str:
    """The legacy ``g.op`` spells an attribute's type as a suffix: ``_i`` (int), ``_s`` (string[s])."""
    if isinstance(value, int):
        return f"{name}_i"
    return f"{name}_s"


def _absent(g) -> Any:
    """An omitted optional input of an ONNX node, as the legacy exporter writes it."""
    node = g.op("prim::Constant")
    node.setType(torch._C.OptionalType.ofTensor())
    return node
