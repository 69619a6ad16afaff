"""ONNX Runtime as a forward (inference) peer: our LSTM/GRU weights as an ONNX graph, run on ORT's CPU EP.

    peer = OnnxPeer(ar.from_torch(module), threads=2)
    y = peer(x, lengths)                  # (T, B, D*H) float32 = ar.rnn_forward(params, x, lengths=...).y
    run = peer.bound(x, lengths)          # zero-arg callable on pre-bound inputs/outputs (for timing)

One ONNX LSTM/GRU node per layer (opset 17, direction "forward" or "bidirectional"); between layers ONNX's
Y ``[T, D, B, H]`` becomes ``[T, B, D*H]`` (a squeeze for one direction, transpose + reshape for two).
The weights are converted exactly: ONNX LSTM gate order is ``i, o, f, c`` (ours/PyTorch ``i, f, g, o``),
ONNX GRU ``z, r, h`` (ours ``r, z, n``); our default GRU (reset-after) is ``linear_before_reset=1``;
``W``/``R``/``B`` are ``[D, G*H, in]``, ``[D, G*H, H]``, ``[D, 2*G*H]`` with ``B = [Wb, Rb]``.
Variable lengths go through ``sequence_lens`` (int32); ORT writes zeros at ``t >= len[b]``, as ours
does (zero-length rows included). ORT's CPU LSTM and GRU kernels run float32 only (float64 raises
"does not support double yet"), so this peer is float32 only. Inference only: ORT has no training.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import arrayrnn as ar

# row blocks of our (PyTorch) gate order, in ONNX's gate order
_GATE_ORDER = {"lstm": (0, 3, 1, 2),   # ours i, f, g, o -> ONNX i, o, f, c
               "gru": (1, 0, 2)}       # ours r, z, n -> ONNX z, r, h


def onnxruntime_unavailable_reason() -> str | None:
    """None when onnxruntime and onnx import, else why not (for a bench column that says n/a)."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as exc:
        return f"{exc} (pip install -e '.[bench]')"
    return None


def _check_supported(params: ar.PackedParams) -> None:
    spec = params.spec
    if spec.mode not in _GATE_ORDER:
        raise ValueError(f"params.spec.mode = {spec.mode!r}; OnnxPeer supports 'lstm' and 'gru'")
    if spec.proj_size:
        raise ValueError(f"params.spec.proj_size = {spec.proj_size}; OnnxPeer does not support LSTM "
                         "projections (ONNX's LSTM has none); expected proj_size = 0")
    if spec.cell_clip is not None:
        raise ValueError(f"params.spec.cell_clip = {spec.cell_clip!r}; OnnxPeer does not support cell "
                         "clipping (ONNX's symmetric `clip` differs from ours); expected cell_clip = None")
    if np.dtype(spec.dtype) != np.float32:
        raise ValueError(f"params.spec.dtype = {spec.dtype!r}; OnnxPeer supports float32 only (ONNX "
                         "Runtime's CPU LSTM/GRU kernels have no float64)")
    if params.device != "cpu":
        raise ValueError(f"params.device = {params.device!r}; OnnxPeer takes CPU (NumPy) params")


def _onnx_weights(params: ar.PackedParams, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """W ``[D, G*H, I_l]``, R ``[D, G*H, H]``, B ``[D, 2*G*H]`` of one layer, gates in ONNX order."""
    spec = params.spec
    H, order = spec.hidden_size, _GATE_ORDER[spec.mode]

    def reorder(a: np.ndarray) -> np.ndarray:
        return np.concatenate([a[g * H:(g + 1) * H] for g in order], axis=0)

    views = params.named_views()
    Ws, Rs, Bs = [], [], []
    for d in range(spec.num_directions):
        prefix = f"l{layer}.{'rev' if d else 'fwd'}."
        Ws.append(reorder(np.asarray(views[prefix + "W_ih"])))
        Rs.append(reorder(np.asarray(views[prefix + "W_hh"])))
        # an absent bias (single or no-bias modes) is an exact zero in ONNX's B
        zeros = np.zeros(spec.gate_size, np.float32)
        Bs.append(np.concatenate([reorder(np.asarray(views.get(prefix + name, zeros)))
                                  for name in ("b_ih", "b_hh")]))
    return (np.stack(Ws).astype(np.float32), np.stack(Rs).astype(np.float32),
            np.stack(Bs).astype(np.float32))


def build_model(params: ar.PackedParams, variable_lengths: bool) -> Any:
    """The ONNX model (opset 17) of ``params``: input ``X`` [T, B, I] (and ``sequence_lens`` [B] int32
    when ``variable_lengths``), output ``Y`` [T, B, D*H]."""
    from onnx import TensorProto, helper, numpy_helper

    _check_supported(params)
    spec = params.spec
    op = {"lstm": "LSTM", "gru": "GRU"}[spec.mode]
    D, H = spec.num_directions, spec.hidden_size
    direction = "bidirectional" if spec.bidirectional else "forward"
    extra = {"linear_before_reset": int(spec.reset_after)} if spec.mode == "gru" else {}
    lens = "sequence_lens" if variable_lengths else ""
    # Y [T, D, B, H] -> [T, B, D*H]: squeeze axis 1, or transpose and reshape to [0, 0, -1] (0 = keep)
    between = (np.array([1], np.int64), "axis_d") if D == 1 else (np.array([0, 0, -1], np.int64), "shape_tbx")
    nodes, inits = [], [numpy_helper.from_array(*between)]
    x = "X"
    for layer in range(spec.num_layers):
        W, R, B = _onnx_weights(params, layer)
        names = [f"W{layer}", f"R{layer}", f"B{layer}"]
        inits += [numpy_helper.from_array(a, n) for a, n in zip((W, R, B), names, strict=True)]
        y4, out = f"Y4_{layer}", ("Y" if layer == spec.num_layers - 1 else f"X{layer + 1}")
        nodes.append(helper.make_node(op, [x, *names, lens], [y4], hidden_size=H, direction=direction,
                                      name=f"{op}{layer}", **extra))
        if D == 1:
            nodes.append(helper.make_node("Squeeze", [y4, "axis_d"], [out]))
        else:
            nodes.append(helper.make_node("Transpose", [y4], [f"T{layer}"], perm=[0, 2, 1, 3]))
            nodes.append(helper.make_node("Reshape", [f"T{layer}", "shape_tbx"], [out]))
        x = out
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["T", "B", spec.input_size])]
    if variable_lengths:
        inputs.append(helper.make_tensor_value_info("sequence_lens", TensorProto.INT32, ["B"]))
    outputs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["T", "B", D * H])]
    graph = helper.make_graph(nodes, f"arrayrnn_{spec.mode}", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="arrayrnn bench")
    model.ir_version = min(model.ir_version, 10)  # ORT 1.2x reads IR <= 10
    return model


class OnnxPeer:
    """Inference on ONNX Runtime (CPU EP) with the exact weights of ``params`` (LSTM/GRU, float32).

    Two sessions are built lazily: one without ``sequence_lens`` (uniform lengths) and one with it.
    ``threads`` sets ``intra_op_num_threads``; ``inter_op_num_threads`` is 1, execution sequential,
    graph optimisation at ORT_ENABLE_ALL.
    """

    def __init__(self, params: ar.PackedParams, threads: int = 1):
        import onnxruntime  # noqa: F401  (fail here, not at the first call)

        if not isinstance(params, ar.PackedParams):
            raise TypeError(f"params has type {type(params).__name__}; expected arrayrnn.PackedParams")
        if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
            raise ValueError(f"threads = {threads!r}; expected an int >= 1")
        params = params.to_format("canonical")
        _check_supported(params)
        self.params, self.spec, self.threads = params, params.spec, int(threads)
        self._sessions: dict[bool, Any] = {}

    @classmethod
    def from_torch(cls, module: Any, threads: int = 1) -> OnnxPeer:
        """The peer of a ``torch.nn.LSTM``/``GRU`` (weights through ``ar.from_torch``)."""
        return cls(ar.from_torch(module), threads)

    def session(self, variable_lengths: bool) -> Any:
        """The ORT session for uniform (False) or variable (True) lengths, built on first use."""
        if variable_lengths not in self._sessions:
            import onnxruntime as ort

            opts = ort.SessionOptions()
            opts.intra_op_num_threads = self.threads
            opts.inter_op_num_threads = 1
            opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            opts.log_severity_level = 3  # errors only
            model = build_model(self.params, variable_lengths).SerializeToString()
            self._sessions[variable_lengths] = ort.InferenceSession(model, opts,
                                                                    providers=["CPUExecutionProvider"])
        return self._sessions[variable_lengths]

    def _inputs(self, x: Any, lengths: Any) -> dict[str, np.ndarray]:
        """Validated feeds: ``X`` float32 C-contiguous (T, B, I), ``sequence_lens`` int32 (B,) if given."""
        if not isinstance(x, np.ndarray):
            raise TypeError(f"x has type {type(x).__name__}; expected a numpy.ndarray")
        if x.ndim != 3 or x.shape[2] != self.spec.input_size:
            raise ValueError(f"x.shape = {x.shape}; expected (T, B, input_size = {self.spec.input_size})")
        if x.shape[0] < 1 or x.shape[1] < 1:
            raise ValueError(f"x.shape = {x.shape}; expected T >= 1 and B >= 1")
        if x.dtype != np.float32:
            raise TypeError(f"x.dtype = {x.dtype}; expected float32 (the params' dtype)")
        feeds = {"X": np.ascontiguousarray(x)}
        if lengths is not None:
            T, B = x.shape[:2]
            lens = np.asarray(lengths)
            if lens.shape != (B,) or not np.issubdtype(lens.dtype, np.integer):
                raise ValueError(f"lengths has shape {lens.shape} and dtype {lens.dtype}; expected an "
                                 f"integer array of shape (B,) = ({B},)")
            bad = np.flatnonzero((lens < 0) | (lens > T))
            if bad.size:
                raise ValueError(f"lengths[{bad[0]}] = {lens[bad[0]]}; every length must be in 0..T = {T}")
            feeds["sequence_lens"] = lens.astype(np.int32)
        return feeds

    def __call__(self, x: np.ndarray, lengths: Any = None) -> np.ndarray:
        """Output ``y`` (T, B, D*H) of the stack on ``x`` (T, B, I), zero at ``t >= lengths[b]``."""
        feeds = self._inputs(x, lengths)
        return self.session(lengths is not None).run(["Y"], feeds)[0]

    def bound(self, x: np.ndarray, lengths: Any = None) -> Callable[[], np.ndarray]:
        """A zero-arg callable running the session on ``x``/``lengths`` bound once (IOBinding).

        The inputs are copied once, here (a later change to ``x`` is not seen), into arrays that ORT
        reads in place; the output is bound to a preallocated NumPy array (returned by every call,
        overwritten each time), so a timed call is ORT's run alone.
        """
        import onnxruntime as ort

        feeds = {name: a.copy() for name, a in self._inputs(x, lengths).items()}
        sess = self.session(lengths is not None)
        binding = sess.io_binding()
        values = {name: ort.OrtValue.ortvalue_from_numpy(a) for name, a in feeds.items()}
        for name, value in values.items():
            binding.bind_ortvalue_input(name, value)
        T, B = x.shape[:2]
        y = np.empty((T, B, self.spec.num_directions * self.spec.hidden_size), np.float32)
        binding.bind_output("Y", "cpu", 0, np.float32, list(y.shape), y.ctypes.data)

        def run() -> np.ndarray:
            sess.run_with_iobinding(binding)
            return y

        run.keepalive = (values, feeds, y)  # the bound buffers must outlive the binding
        return run
