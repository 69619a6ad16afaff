"""ONNX export of a :class:`arrayrnn.PackedParams` stack: the standard ``LSTM`` / ``GRU`` / ``RNN`` operators.

    import arrayrnn as ar
    from arrayrnn import onnx as ar_onnx

    ar_onnx.export(params, "model.onnx")          # inputs X [T, B, I], sequence_lens [B] (int32),
                                                  # initial_h [L*D, B, H] (and initial_c for LSTM);
                                                  # outputs Y [T, B, D*H], Y_h [L*D, B, H] (and Y_c)

The model (opset 17) has one ONNX ``LSTM`` / ``GRU`` / ``RNN`` node per layer, direction ``"forward"`` or
``"bidirectional"``; between layers ONNX's ``Y [T, D, B, H]`` becomes ``[T, B, D*H]`` (a squeeze for one
direction, a transpose and reshape for two). The weights are the params' exactly, reordered into ONNX's
gate order: LSTM ``i, o, f, c`` (ours, PyTorch's: ``i, f, g, o``), GRU ``z, r, h`` (ours: ``r, z, n``);
``W`` / ``R`` / ``B`` are ``[D, G*H, in]``, ``[D, G*H, H]``, ``[D, 2*G*H]`` with ``B = [Wb, Rb]`` (an absent
bias is an exact zero there). Our default GRU (reset-after) is ``linear_before_reset=1``, the reset-before
GRU ``0``; ``rnn_relu`` is the ``RNN`` operator with ``Relu`` activations. Variable lengths go through
``sequence_lens``: ONNX Runtime writes zeros at ``t >= len[b]`` and takes the final states at ``len[b] - 1``,
as ours does (zero-length rows included). Inference only (no dropout). Not expressible in ONNX, so a
``ValueError``: LSTM projections (``proj_size > 0``; ONNX's LSTM has none) and cell clipping (ONNX's
``clip`` bounds every gate pre-activation, ours the cell state), zoneout, layer normalisation and custom
cells (:func:`arrayrnn.register_cell`: ONNX has operators for the built-in cells only).
Peepholes (``peepholes=True``) are the LSTM node's input ``P`` (ONNX's order i, o, f). ONNX Runtime's
CPU kernels run float32 only; float64 and float16 models are written as asked.

The gate reordering (:func:`layer_weights`) is written against the array module it is given (NumPy here;
torch in :mod:`arrayrnn.torch`'s ``torch.onnx.export`` path), so the knowledge exists once.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

import arrayrnn as ar
from arrayrnn.core.layout import PEEPHOLE_GATES

OPSET = 17
"""The ONNX opset the exported models declare."""
OPERATORS = {"lstm": "LSTM", "gru": "GRU", "rnn_tanh": "RNN", "rnn_relu": "RNN"}
"""ONNX operator type for each arrayrnn mode (``"lstm"`` -> ``"LSTM"``, ...)."""
# ONNX's gate order, in our gate names (arrayrnn.RNNSpec.gate_names)
ONNX_GATES = {"lstm": ("i", "o", "f", "g"), "gru": ("z", "r", "n"), "rnn_tanh": ("h",), "rnn_relu": ("h",)}
"""ONNX's gate order for each mode, in arrayrnn's gate names (`arrayrnn.RNNSpec.gate_names`)."""
_ONNX_TYPES = {"float16": 10, "float32": 1, "float64": 11}  # onnx.TensorProto.FLOAT16 / FLOAT / DOUBLE


def refuse_custom_cell(spec: ar.RNNSpec) -> None:
    """``ValueError`` for a custom cell: ONNX has operators for the built-in cells only."""
    if spec.custom_cell is not None:
        raise ValueError(f"mode = {spec.mode!r} is a custom cell (arrayrnn.register_cell); ONNX has LSTM, "
                         "GRU and RNN operators only and this exporter writes no cell in elementary "
                         "operators, so it cannot be exported (expected mode in 'lstm', 'gru', 'rnn_tanh', "
                         "'rnn_relu'; keep its weights with arrayrnn.save)")


def check_exportable(spec: ar.RNNSpec) -> None:
    """``ValueError`` for what ONNX's operators cannot express."""
    refuse_custom_cell(spec)
    if spec.proj_size:
        raise ValueError(f"proj_size = {spec.proj_size}; ONNX's LSTM operator has no projection, so this "
                         "stack cannot be exported (expected proj_size = 0)")
    if spec.cell_clip is not None:
        raise ValueError(f"cell_clip = {spec.cell_clip!r}; ONNX's `clip` bounds every gate pre-activation "
                         "symmetrically, ours the cell state, so this stack cannot be exported (expected "
                         "cell_clip = None)")
    if spec.zoneout or spec.zoneout_cell:
        raise ValueError(f"zoneout = {spec.zoneout}, zoneout_cell = {spec.zoneout_cell}; ONNX's operators "
                         "have no zoneout (whose inference mixes the previous state in), so this stack "
                         "cannot be exported (expected zoneout = 0)")
    if spec.layer_norm:
        raise ValueError("layer_norm = True; ONNX's LSTM / GRU / RNN operators have no layer normalisation "
                         "inside the recurrence, so this stack cannot be exported as them (expected "
                         "layer_norm = False; arrayrnn.torch's modules export it in elementary operators)")


def peepholes(spec: ar.RNNSpec, layer: int, view: Callable[[int, int, str], Any]) -> np.ndarray:
    """ONNX's ``P [D, 3*H]`` of one layer: our rows i, f, o in ONNX's order i, o, f."""
    order = [PEEPHOLE_GATES.index(g) for g in ("i", "o", "f")]
    return np.stack([view(layer, d, "P")[order].reshape(-1) for d in range(spec.num_directions)])


def node_attributes(spec: ar.RNNSpec) -> dict[str, Any]:
    """The attributes of one layer's ONNX node."""
    attrs: dict[str, Any] = {"hidden_size": spec.hidden_size,
                             "direction": "bidirectional" if spec.bidirectional else "forward"}
    if spec.mode == "gru":
        attrs["linear_before_reset"] = int(spec.reset_after)
    if spec.mode.startswith("rnn"):
        attrs["activations"] = ["Relu" if spec.mode == "rnn_relu" else "Tanh"] * spec.num_directions
    return attrs


def gate_rows(spec: ar.RNNSpec) -> np.ndarray:
    """Row indices taking a ``(G*H, ...)`` block from our gate order to ONNX's."""
    H, ours = spec.hidden_size, spec.gate_names
    return np.concatenate([np.arange(ours.index(g) * H, (ours.index(g) + 1) * H)
                           for g in ONNX_GATES[spec.mode]])


def layer_weights(spec: ar.RNNSpec, layer: int, view: Callable[[int, int, str], Any],
                  xp: ModuleType) -> tuple[Any, Any, Any]:
    """``W [D, G*H, I_l]``, ``R [D, G*H, H]``, ``B [D, 2*G*H]`` of one layer in ONNX's gate order.

    ``view(layer, direction, name)``: the block (``"W_ih"``, ...) as an ``xp`` array (NumPy or torch), or
    None when absent; ``xp``: ``numpy`` or ``torch`` (for ``stack`` / ``zeros_like``).
    """
    rows = gate_rows(spec)
    if xp.__name__ == "torch":
        rows = xp.as_tensor(rows)
    Ws, Rs, Bs = [], [], []
    for d in range(spec.num_directions):
        W, R = view(layer, d, "W_ih"), view(layer, d, "W_hh")
        zeros = xp.zeros_like(W[:, 0])
        biases = [view(layer, d, name) for name in ("b_ih", "b_hh")]
        Ws.append(W[rows])
        Rs.append(R[rows])
        Bs.append(xp.concatenate([(b if b is not None else zeros)[rows] for b in biases]))
    return xp.stack(Ws), xp.stack(Rs), xp.stack(Bs)


def build_model(params: ar.PackedParams, variable_lengths: bool = True, states: bool = True) -> Any:
    """The ``onnx.ModelProto`` of ``params`` (see the module docstring).

    ``variable_lengths``: an input ``sequence_lens`` [B] (int32). ``states``: inputs ``initial_h`` /
    ``initial_c`` and outputs ``Y_h`` / ``Y_c`` (else only ``X`` in and ``Y`` out).
    """
    from onnx import helper, numpy_helper

    params = _checked(params)
    spec = params.spec
    views = params_views(params.to(np))
    elem = _ONNX_TYPES[spec.dtype]
    D, L = spec.num_directions, spec.num_layers
    op = OPERATORS[spec.mode]
    lens = "sequence_lens" if variable_lengths else ""
    between = (np.array([1], np.int64), "axis_d") if D == 1 else (np.array([0, 0, -1], np.int64), "shape_tbx")
    nodes, inits = [], [numpy_helper.from_array(*between)]
    if variable_lengths and states:
        nodes += _empty_rows_mask()
    x, outs_h, outs_c = "X", [], []
    for layer in range(L):
        names = [f"W{layer}", f"R{layer}", f"B{layer}"]
        arrays = layer_weights(spec, layer, views, np)
        inits += [numpy_helper.from_array(np.ascontiguousarray(a), n)
                  for a, n in zip(arrays, names, strict=True)]
        inputs, outputs, finals = [x, *names, lens], [f"Y4_{layer}"], []
        if states:
            kinds = ("h", "c") if spec.has_cell else ("h",)
            nodes += _state_slices(layer, D, kinds)
            inputs += [f"{k}0_{layer}" for k in kinds]
            outputs += [f"Y{k}_raw{layer}" for k in kinds]
            for k in kinds:  # ONNX Runtime ends a zero-length row's state at zeros, we at its initial state
                final = f"Y{k}_{layer}"
                raw = f"Y{k}_raw{layer}"
                finals.append(helper.make_node("Where", ["empty_rows", f"{k}0_{layer}", raw], [final])
                              if variable_lengths else helper.make_node("Identity", [raw], [final]))
                (outs_h if k == "h" else outs_c).append(final)
        if spec.peepholes:  # the LSTM node's 8th input; absent optional inputs before it are ""
            inputs += [""] * (7 - len(inputs)) + [f"P{layer}"]
            inits.append(numpy_helper.from_array(np.ascontiguousarray(peepholes(spec, layer, views)),
                                                 f"P{layer}"))
        nodes.append(helper.make_node(op, inputs, outputs, name=f"{op}{layer}", **node_attributes(spec)))
        nodes += finals
        out = "Y" if layer == L - 1 else f"X{layer + 1}"
        nodes += _to_time_major(f"Y4_{layer}", out, layer, D)
        x = out
    if states:
        nodes.append(helper.make_node("Concat", outs_h, ["Y_h"], axis=0))
        if spec.has_cell:
            nodes.append(helper.make_node("Concat", outs_c, ["Y_c"], axis=0))
    graph = helper.make_graph(nodes, f"arrayrnn_{spec.mode}",
                              _graph_inputs(spec, elem, variable_lengths, states),
                              _graph_outputs(spec, elem, states), inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="arrayrnn")
    model.ir_version = min(model.ir_version, 10)  # ONNX Runtime 1.2x-1.3x reads IR <= 10
    return model


def export(params: ar.PackedParams, path: str | os.PathLike, *, variable_lengths: bool = True,
           states: bool = True) -> str:
    """Write :func:`build_model` of ``params`` to ``path`` as an ONNX model using ONNX's ``LSTM`` / ``GRU`` /
    ``RNN`` operators (checked by ``onnx.checker``).

    Parameters
    ----------
    params : PackedParams
        Any format, any device (converted to canonical and copied to the host).
    path : str or os.PathLike
        Where to write the ``.onnx`` file.
    variable_lengths : bool, optional
        Add an input ``sequence_lens`` ``[B]`` (int32).
    states : bool, optional
        Add inputs ``initial_h`` / ``initial_c`` and outputs ``Y_h`` / ``Y_c`` (else only ``X`` in and
        ``Y`` out).

    Returns
    -------
    str
        The path written.

    Raises
    ------
    TypeError
        ``params`` is not a `arrayrnn.PackedParams`.
    ValueError
        A configuration ONNX's operators cannot express (see `check_exportable`: projection, cell
        clipping, single biases, cell variants, ...).

    Examples
    --------
    >>> import os, tempfile
    >>> import arrayrnn as ar
    >>> import arrayrnn.onnx
    >>> params = ar.PackedParams.init(ar.RNNSpec(mode="lstm", input_size=3, hidden_size=4), seed=0)
    >>> path = arrayrnn.onnx.export(params, os.path.join(tempfile.mkdtemp(), "lstm.onnx"))
    >>> path.endswith("lstm.onnx")
    True
    """
    import onnx

    model = build_model(params, variable_lengths, states)
    onnx.checker.check_model(model)
    path = os.fspath(path)
    onnx.save(model, path)
    return path


def params_views(params: ar.PackedParams) -> Callable[[int, int, str], Any]:
    """``view(layer, direction, name)`` over ``params``' named views (None for an absent block)."""
    layout = params.layout

    def view(layer: int, direction: int, name: str) -> Any:
        return params.view(layer, direction, name) if layout.has(layer, direction, name) else None
    return view


def _checked(params: Any) -> ar.PackedParams:
    if not isinstance(params, ar.PackedParams):
        raise TypeError(f"params has type {type(params).__name__}; expected an arrayrnn.PackedParams")
    check_exportable(params.spec)
    return params.to_format("canonical")


def _state_slices(layer: int, D: int, kinds: tuple[str, ...]) -> list[Any]:
    """``initial_h[layer*D:(layer+1)*D]`` (and ``initial_c``) as this layer's ``h0_l`` / ``c0_l``."""
    from onnx import helper

    nodes = [helper.make_node("Constant", [], [f"start{layer}"], value_ints=[layer * D]),
             helper.make_node("Constant", [], [f"stop{layer}"], value_ints=[(layer + 1) * D]),
             helper.make_node("Constant", [], [f"axis0_{layer}"], value_ints=[0])]
    for k in kinds:
        bounds = [f"start{layer}", f"stop{layer}", f"axis0_{layer}"]
        nodes.append(helper.make_node("Slice", [f"initial_{k}", *bounds], [f"{k}0_{layer}"]))
    return nodes


def _empty_rows_mask() -> list[Any]:
    """``empty_rows`` [1, B, 1]: ``sequence_lens == 0``."""
    from onnx import helper

    return [helper.make_node("Constant", [], ["zero_len"], value_int=0),
            helper.make_node("Cast", ["zero_len"], ["zero_len32"], to=6),  # INT32, as sequence_lens
            helper.make_node("Equal", ["sequence_lens", "zero_len32"], ["empty_b"]),
            helper.make_node("Constant", [], ["axes02"], value_ints=[0, 2]),
            helper.make_node("Unsqueeze", ["empty_b", "axes02"], ["empty_rows"])]


def _to_time_major(y4: str, out: str, layer: int, D: int) -> list[Any]:
    """ONNX's ``Y [T, D, B, H]`` as ``[T, B, D*H]``."""
    from onnx import helper

    if D == 1:
        return [helper.make_node("Squeeze", [y4, "axis_d"], [out])]
    return [helper.make_node("Transpose", [y4], [f"T{layer}"], perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", [f"T{layer}", "shape_tbx"], [out])]


def _graph_inputs(spec: ar.RNNSpec, elem: int, variable_lengths: bool, states: bool) -> list[Any]:
    from onnx import TensorProto, helper

    LD = spec.num_layers * spec.num_directions
    inputs = [helper.make_tensor_value_info("X", elem, ["T", "B", spec.input_size])]
    if variable_lengths:
        inputs.append(helper.make_tensor_value_info("sequence_lens", TensorProto.INT32, ["B"]))
    if states:
        inputs.append(helper.make_tensor_value_info("initial_h", elem, [LD, "B", spec.hidden_size]))
        if spec.has_cell:
            inputs.append(helper.make_tensor_value_info("initial_c", elem, [LD, "B", spec.hidden_size]))
    return inputs


def _graph_outputs(spec: ar.RNNSpec, elem: int, states: bool) -> list[Any]:
    from onnx import helper

    LD, H = spec.num_layers * spec.num_directions, spec.hidden_size
    outputs = [helper.make_tensor_value_info("Y", elem, ["T", "B", spec.num_directions * H])]
    if states:
        outputs.append(helper.make_tensor_value_info("Y_h", elem, [LD, "B", H]))
        if spec.has_cell:
            outputs.append(helper.make_tensor_value_info("Y_c", elem, [LD, "B", H]))
    return outputs
