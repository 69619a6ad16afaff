"""ONNX Runtime as a forward (inference) peer: our weights as an ONNX graph, run on ORT's CPU EP.

    peer = OnnxPeer(ar.from_torch(module), threads=2)
    y = peer(x, lengths)                  # (T, B, D*H) float32 = ar.rnn_forward(params, x, lengths=...).y
    run = peer.bound(x, lengths)          # zero-arg callable on pre-bound inputs/outputs (for timing)

The graph is the library's ONNX export (:func:`arrayrnn.onnx.build_model`: one ONNX ``LSTM`` / ``GRU`` /
``RNN`` node per layer, our weights exactly, in ONNX's gate order), built with ``states=False`` (input
``X`` and, for variable lengths, ``sequence_lens``; output ``Y``), so the peer times the operators alone.
ORT's CPU LSTM and GRU kernels run float32 only (float64 raises "does not support double yet"), so this
peer is float32 only. Inference only: ORT has no training.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import arrayrnn as ar
from arrayrnn import onnx as ar_onnx


def onnxruntime_unavailable_reason() -> str | None:
    """None when onnxruntime and onnx import, else why not (for a bench column that says n/a)."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as exc:
        return f"{exc} (pip install -e '.[bench]')"
    return None


def _check_supported(params: ar.PackedParams) -> None:
    """What the library cannot export is its ValueError; what ORT's CPU kernels cannot run is ours."""
    ar_onnx.check_exportable(params.spec)
    if np.dtype(params.spec.dtype) != np.float32:
        raise ValueError(f"params.spec.dtype = {params.spec.dtype!r}; OnnxPeer supports float32 only (ONNX "
                         "Runtime's CPU LSTM/GRU kernels have no float64)")
    if params.device != "cpu":
        raise ValueError(f"params.device = {params.device!r}; OnnxPeer takes CPU (NumPy) params")


def build_model(params: ar.PackedParams, variable_lengths: bool) -> Any:
    """The ONNX model of ``params``: input ``X`` [T, B, I] (and ``sequence_lens`` [B] int32 when
    ``variable_lengths``), output ``Y`` [T, B, D*H]."""
    _check_supported(params)
    return ar_onnx.build_model(params, variable_lengths=variable_lengths, states=False)


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
