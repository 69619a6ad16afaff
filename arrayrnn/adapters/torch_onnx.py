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
sequence length). Inference only: a module in training mode with a dropout, DropConnect or zoneout on is
refused, naming it (:func:`.torch_call.exported_spec`; ``nn.LSTM``'s exporter refuses its dropout too).

A ``PackedSequence`` input under the legacy exporter (:func:`export_packed`) is exported as ``nn.LSTM``
exports it: the layers' nodes take the packed data and its ``batch_sizes`` as ``sequence_lens``, each
followed by a ``Squeeze`` (one direction) or a ``Transpose`` and ``Reshape`` (two), and the exporter's
peephole pass moves the ``pack_padded_sequence`` / ``pad_packed_sequence`` pair around them (the padded
input goes in, the lengths become ``sequence_lens``): the pair the user's code makes is kept a pair.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.utils.rnn import PackedSequence

import arrayrnn as ar
from arrayrnn.core.layout import PEEPHOLE_GATES

from . import onnx as onnx_graph
from . import torch_recurrence
from .torch_recurrence import block_views

_Tensor = torch.Tensor


def emit(spec: ar.RNNSpec, batch_first: bool, x: _Tensor, h0: _Tensor | None, c0: _Tensor | None,
         flat: _Tensor, lengths: Any) -> tuple[_Tensor, _Tensor, _Tensor | None]:
    """``(y, h_n, c_n)`` as ONNX operators over ``x`` (3-D) and the canonical weights ``flat`` (a custom
    cell: a ``ValueError``, it has no ONNX form)."""
    onnx_graph.refuse_custom_cell(spec)
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
        inputs.extend(_peepholes(spec, views, layer))
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


def legacy_export() -> bool:
    """True while the legacy TorchScript exporter (``torch.onnx.export(..., dynamo=False)``) traces."""
    return torch.onnx.is_in_onnx_export() and torch.jit.is_tracing()


def export_packed(spec: ar.RNNSpec, input: PackedSequence, h0: _Tensor | None, c0: _Tensor | None,
                  flat: _Tensor) -> tuple[PackedSequence, _Tensor, _Tensor | None]:
    """``(output, h_n, c_n)`` for a ``PackedSequence`` under the legacy exporter, in the steps of
    ``nn.LSTM``'s forward (the initial states made from ``batch_sizes[0]`` or put in the packed order, the
    final ones back in the caller's), each layer a node of :class:`_LegacyPackedLayer`."""
    try:
        onnx_graph.check_exportable(spec)
    except ValueError as err:
        raise ValueError(f"{err}; nor can a PackedSequence through it be exported by the legacy exporter "
                         "(nn.LSTM's is refused too): export the padded batch with lengths=, or use "
                         "torch.onnx.export(..., dynamo=True)") from None
    data, batch_sizes, sorted_indices, unsorted_indices = input
    if h0 is None:  # as nn.LSTM: zeros of the packed batch's size
        rows, like = batch_sizes[0], {"dtype": data.dtype, "device": data.device}
        layers = spec.num_layers * spec.num_directions
        h0 = torch.zeros(layers, rows, spec.output_size, **like)
        c0 = torch.zeros(layers, rows, spec.hidden_size, **like) if spec.has_cell else None
    elif sorted_indices is not None:
        h0, c0 = (s.index_select(1, sorted_indices) if s is not None else None for s in (h0, c0))
    views, D = block_views(spec, flat), spec.num_directions
    hs, cs, inp = [], [], data
    for layer in range(spec.num_layers):
        W, R, bias = onnx_graph.layer_weights(spec, layer, lambda *key: views.get(key), torch)
        rows = slice(layer * D, (layer + 1) * D)
        states = [h0[rows]] + ([c0[rows]] if spec.has_cell else [])
        inp, *finals = _LegacyPackedLayer.apply(spec, inp, W, R, bias, batch_sizes, *states,
                                                *_peepholes(spec, views, layer))
        hs.append(finals[0])
        cs.extend(finals[1:])
    h_n, c_n = torch.cat(hs), (torch.cat(cs) if spec.has_cell else None)
    if unsorted_indices is not None:
        h_n, c_n = (s.index_select(1, unsorted_indices) if s is not None else None for s in (h_n, c_n))
    return PackedSequence(inp, batch_sizes, sorted_indices, unsorted_indices), h_n, c_n


def _peepholes(spec: ar.RNNSpec, views: dict, layer: int) -> list[_Tensor]:
    """The LSTM node's input ``P [D, 3*H]`` (rows in ONNX's order i, o, f), or nothing."""
    if not spec.peepholes:
        return []
    order = [PEEPHOLE_GATES.index(g) for g in ("i", "o", "f")]
    return [torch.stack([views[(layer, d, "P")][order].reshape(-1) for d in range(spec.num_directions)])]


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
        return _rnn_node(g, spec, inputs)


class _LegacyPackedLayer(torch.autograd.Function):
    """One layer's ONNX node over packed data for the legacy exporter (:func:`export_packed`): the node
    with ``batch_sizes`` as ``sequence_lens``, then ``nn.LSTM``'s ``Squeeze`` or ``Transpose`` and
    ``Reshape`` (the pattern the exporter's peephole pass moves the packing around). The forward gives the
    tracer zeros of the packed output's shapes."""

    @staticmethod
    def forward(ctx, spec: ar.RNNSpec, data: _Tensor, *inputs: _Tensor | None) -> tuple[_Tensor, ...]:
        D, H, rows = spec.num_directions, spec.hidden_size, inputs[4].shape[1]
        states = [data.new_zeros(D, rows, H) for _ in range(2 if spec.has_cell else 1)]
        return (data.new_zeros(data.shape[0], D * H), *states)

    @staticmethod
    def symbolic(g, spec: ar.RNNSpec, *inputs):
        y, *finals = _rnn_node(g, spec, inputs)
        if spec.num_directions == 1:
            y = (g.op("Squeeze", y, g.op("Constant", value_t=torch.tensor([1]))) if g.opset >= 13
                 else g.op("Squeeze", y, axes_i=[1]))
        else:  # [T, D, B, H] -> [T, B, D*H]
            y = g.op("Transpose", y, perm_i=[0, 2, 1, 3])
            y = g.op("Reshape", y, g.op("Constant", value_t=torch.tensor([0, 0, -1])))
        return (y, *finals)


def _rnn_node(g, spec: ar.RNNSpec, inputs: tuple) -> Any:
    """The ONNX ``LSTM`` / ``GRU`` / ``RNN`` node of one layer, as the legacy ``g.op`` writes it."""
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
