"""arrayrnn's fused engines inside PyTorch (the ``torch`` extra): drop-in ``LSTM`` / ``GRU`` / ``RNN`` and
``ArrayRNN``.

``from arrayrnn.torch import LSTM`` is the whole change in a PyTorch program: :class:`LSTM`, :class:`GRU`
and :class:`RNN` are subclasses of ``nn.LSTM`` / ``GRU`` / ``RNN`` (the same constructor, attributes,
methods, parameters, ``state_dict``, input checks and error messages) with another forward. Their
per-weight ``nn.Parameter``\\ s (``weight_ih_l0``, ...) are views into ONE flat buffer in the canonical
layout (PyTorch's parameter order), as PyTorch's own flattened cuDNN weights are, and a backward writes
ONE flat gradient buffer of which every ``weight.grad`` is a view. Roughly::

    flat = <the weights' one storage>                 # module.flat; module.flat_grad after a backward
    res = ar.rnn_forward(PackedParams(spec, flat), x, lengths, h0, c0, training=..., seed=...)
    # backward: ar.rnn_backward(res, dy, dh_n, dc_n).dparams.data -> weight_ih_l0.grad, ... (views)

A call of one time step (no lengths, dropout masks or cell variants) runs one fused cell step per
layer-direction instead (:mod:`.torch_step`, the cells' step, its packed weights kept between calls; its
weight gradients come per layer-direction, ``flat_grad`` concatenates them).
Weights that are not such views (``weight_norm``, ``parametrize``, pruning, a reassigned Parameter) are
concatenated for the call instead (one copy per forward; gradients reach them through autograd);
``flatten_parameters()`` puts plain Parameters back into one buffer. ``module.to()`` / ``.double()`` /
``.cuda()`` re-flatten. Half precision and bfloat16 run in float32 (on CPU; bfloat16 everywhere) and
come back in the input's dtype; under CPU autocast the results come back in the dtypes ``nn.*`` returns
there (:func:`_autocast_dtypes`). An empty batch, ``meta`` tensors, ``dropout = 1`` in training mode,
``torch.func`` transforms and gradients of gradients run the differentiable torch-op path
(:mod:`.torch_recurrence`); ``torch.compile`` (which breaks the graph at every ``nn.LSTM`` / ``GRU`` /
``RNN``, these included, unless ``torch._dynamo.config.allow_rnn``), ``torch.export`` and
``torch.jit.trace`` see the custom op ``arrayrnn::rnn``; both ``torch.onnx.export`` exporters emit ONNX's
``LSTM`` / ``GRU`` / ``RNN`` operators (:mod:`.torch_call`); ``torch.jit.script`` is refused with the
alternatives.

Errors: the drop-in classes run ``nn.RNNBase``'s own input checks, so they raise what ``nn.LSTM``
raises, with its messages. Everything arrayrnn itself refuses is :class:`InputError` (a
``RuntimeError`` and a ``ValueError``) or :class:`InputTypeError` (a ``RuntimeError`` and a
``TypeError``): PyTorch code catching ``RuntimeError`` and arrayrnn code catching ``ValueError`` /
``TypeError`` both keep working.

Dropout: in training mode each forward draws its mask seed from torch's default generator
(``torch.randint``; in a captured graph the graph draws it), so ``torch.manual_seed`` makes a run
reproducible; the masks are arrayrnn's
(:mod:`arrayrnn.frontend.dropout`), not the ones ``nn.LSTM`` would draw. ``dropout`` may be reassigned
between calls, as on ``nn.LSTM``. The cell variants (:mod:`.torch_variants`: ``recurrent_dropout``,
``weight_dropout``, ``zoneout``, ``zoneout_cell``, ``peepholes``) are keyword-only extras of the
constructors; the seed is drawn whenever one of them acts in training mode too.

``ArrayRNN`` is the arrayrnn-native module: ONE ``nn.Parameter``, ``flat``, any :class:`arrayrnn.RNNSpec`
(cell clipping, single biases, reset-before GRU, a cell registered with :func:`arrayrnn.register_cell`),
``forward(x, hx=None, lengths=None, engine=, seed=)``; its ``state_dict()`` holds ``nn.LSTM``'s keys
(``weight_ih_l0``, ...; a custom cell's blocks under the same names). The drop-in classes run the
built-in cells only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any

import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

import arrayrnn as ar
from arrayrnn.core.cell_registry import cell_of
from arrayrnn.core.interop import TORCH_MODES, torch_key

from . import torch_call, torch_onnx, torch_step, torch_variants
from .torch_buffer import OneBuffer
from .torch_call import _ForwardOptions
from .torch_cell import GRUCell, LSTMCell, RNNCell
from .torch_errors import InputError, InputTypeError, as_torch_errors

__all__ = ["GRU", "LSTM", "RNN", "ArrayRNN", "GRUCell", "InputError", "InputTypeError", "LSTMCell", "RNNCell"]

_MODE_ALIASES = {"rnn": "rnn_tanh", "rnn_tanh": "rnn_tanh", "rnn_relu": "rnn_relu", "lstm": "lstm",
                 "gru": "gru"}


def _compute_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """float32 for bfloat16 (no engine has it) and for float16 on CPU (the GPU engines run it)."""
    if dtype == torch.bfloat16 or (dtype == torch.float16 and device.type != "cuda"):
        return torch.float32
    return dtype


def _autocast_dtypes(module: torch.nn.RNNBase, x: torch.Tensor,
                     packed: bool) -> tuple[torch.dtype, torch.dtype, torch.dtype] | None:
    """The dtypes of ``(y, h_n, c_n)`` that ``nn.LSTM`` / ``GRU`` / ``RNN`` return for ``x`` under CPU
    autocast, or None outside it (then: the input's dtype).

    On CPU, PyTorch's recurrences run their matrix products in autocast's dtype ``low`` and their
    elementwise state updates promote with the state's dtype; oneDNN's LSTM layer (an unpacked LSTM
    without projection) is itself on autocast's list and returns ``low``. We compute in float32 and
    return what PyTorch returns.
    """
    if x.device.type != "cpu" or not torch.is_autocast_enabled("cpu") or x.dtype == torch.float64:
        return None
    low = torch.get_autocast_dtype("cpu")
    wide = torch.promote_types(low, x.dtype)
    if module.mode == "GRU":  # h' = (1 - z) * n + z * h
        return wide, wide, wide
    if module.mode != "LSTM":  # h' = act(x W_ih^T + h W_hh^T + b)
        return low, low, low
    if module.proj_size:  # c' = f * c + i * g; h' = (o * tanh(c')) W_hr^T
        return low, low, wide
    return (low, low, low) if not packed and _onednn_lstm(x.dtype, x.numel() == 0) else (wide, wide, wide)


def _without_autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """Autocast off on ``device`` (the torch-op paths would otherwise run their products in its dtype)."""
    if device.type in ("cpu", "cuda") and torch.is_autocast_enabled(device.type):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


@torch.compiler.assume_constant_result  # a compile-time constant (dynamo does not trace the queries)
def _onednn_lstm(dtype: torch.dtype, empty: bool) -> bool:
    """Whether ``nn.LSTM``'s CPU forward takes oneDNN's LSTM layer for an input of ``dtype`` (ATen's
    condition)."""
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled) or empty:
        return False
    if dtype == torch.bfloat16:
        return torch.ops.mkldnn._is_mkldnn_bf16_supported()
    if dtype == torch.float16:
        return not torch.is_grad_enabled() and torch.ops.mkldnn._is_mkldnn_fp16_supported()
    return dtype == torch.float32


def _draw_seed(spec: ar.RNNSpec, training: bool, seed: int | None) -> int | None:
    """``seed``, or when None and the call draws masks, one from torch's generator (``torch.manual_seed``
    reproduces the call)."""
    if seed is not None or not torch_call.needs_seed(spec, training):
        return seed
    return int(torch.randint(0, 2**31 - 1, ()).item())


def _repack(y: torch.Tensor, source: PackedSequence, lengths: torch.Tensor,
            batch_first: bool) -> PackedSequence:
    """``y`` (padded) as a PackedSequence with ``source``'s batch_sizes and indices (like nn.LSTM)."""
    order = source.sorted_indices
    if order is not None:
        y = y.index_select(0 if batch_first else 1, order)
        lengths = lengths.index_select(0, order.cpu())
    data = pack_padded_sequence(y, lengths, batch_first=batch_first, enforce_sorted=True).data
    return PackedSequence(data, source.batch_sizes, source.sorted_indices, source.unsorted_indices)


def _check_state_tensors(x: torch.Tensor, states: dict[str, torch.Tensor | None]) -> None:
    for name, state in states.items():
        if state is None:
            continue
        if not isinstance(state, torch.Tensor):
            raise InputTypeError(f"{name} has type {type(state).__name__}; expected a torch.Tensor")
        if state.device != x.device:
            raise InputTypeError(f"Input and hidden tensors are not at the same device, found input tensor "
                                 f"at {x.device} and {name} at {state.device}; move {name} with "
                                 f".to({x.device})")
        if state.dtype != x.dtype:
            raise InputTypeError(f"{name} has dtype {state.dtype}; expected the input's dtype {x.dtype} "
                                 f"(convert with {name}.to({x.dtype}))")


# -- the drop-in classes ------------------------------------------------------------------------------
_SPEC_ATTRIBUTES = ("mode", "input_size", "hidden_size", "num_layers", "bias", "bidirectional", "proj_size",
                    "dropout", *torch_variants.DEFAULTS)


class _FlatWeights(OneBuffer):
    """The arrayrnn forward of a ``torch.nn.RNNBase`` subclass whose weights are views of one buffer."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in torch_variants.FIXED and "_flat_weights_names" in self.__dict__ and value != getattr(self,
                                                                                                     name):
            raise AttributeError(f"{name} = {value!r}: the {name} weights are fixed at construction (this "
                                 f"module has {name}={getattr(self, name)}); build a new module instead")
        super().__setattr__(name, value)
        if name in _SPEC_ATTRIBUTES:
            self._refresh_spec_text()

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state.pop("_steps", None)  # packed copies, engine objects: rebuilt when called
        return state

    def __setstate__(self, state: dict) -> None:
        for name, default in torch_variants.DEFAULTS.items():  # a module saved before the options existed
            state.setdefault(name, default)
        super().__setstate__(state)
        self._refresh_spec_text()

    def _set_variants(self, kwargs: dict[str, Any], mode: str) -> None:
        """The cell variants' keyword-only options (:mod:`.torch_variants`), set before ``RNNBase``'s
        constructor builds the weights."""
        for name, value in torch_variants.pop_options(kwargs, mode).items():
            setattr(self, name, value)

    def _variants(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in torch_variants.DEFAULTS}

    def _init_flat_weights(self) -> None:
        torch_variants.add_extra_weights(self)
        super()._init_flat_weights()

    def reset_parameters(self) -> None:
        """``nn.RNNBase``'s uniform draw, then the layer-norm gains to ones and the cell's shift to zeros."""
        super().reset_parameters()
        torch_variants.init_layer_norm(self)

    def extra_repr(self) -> str:
        return super().extra_repr() + torch_variants.extra_repr(self._variants())

    def _refresh_spec_text(self) -> None:
        """``_spec_text``: the configuration as :func:`torch_call.spec_text` (what a compiled call reads),
        once every attribute exists and while ``dropout`` is a number (the forward refuses it otherwise)."""
        if not all(name in self.__dict__ for name in _SPEC_ATTRIBUTES):
            return
        p = self.dropout
        if isinstance(p, (int, float)) and not isinstance(p, bool) and 0 <= p <= 1:
            self.__dict__["_spec_text"] = torch_call.spec_text(self._spec_dict(float(p)))

    def __prepare_scriptable__(self) -> Any:
        raise _refuse_scripting(type(self).__name__)

    def forward(self, input: torch.Tensor | PackedSequence, hx: Any = None, lengths: Any = None):
        """As ``nn.LSTM.forward`` (``nn.GRU``, ``nn.RNN``): ``output, (h_n, c_n)`` / ``output, h_n``.

        ``input``: ``(T, B, input_size)`` (``(B, T, input_size)`` with ``batch_first``), unbatched
        ``(T, input_size)``, or a ``PackedSequence``. ``hx``: initial states or None (zeros). arrayrnn's
        addition: ``lengths`` (keyword, per-row lengths ``(B,)`` of a padded batched ``input``): the
        results equal those of packing ``input`` with these lengths, without the packing.
        """
        self._check_dropout()
        packed = isinstance(input, PackedSequence)
        if packed:
            if lengths is not None:
                raise InputError("lengths was given with a PackedSequence input; a PackedSequence carries "
                                 "its own lengths")
            if torch_onnx.legacy_export():
                return self._export_packed(input, hx)
            x, lengths = pad_packed_sequence(input, batch_first=self.batch_first)
            batched = True
        else:
            if not isinstance(input, torch.Tensor):
                raise InputTypeError(f"input has type {type(input).__name__}; expected a torch.Tensor or a "
                                     "PackedSequence")
            if input.dim() not in (2, 3):
                raise ValueError(f"{type(self).__name__}: Expected input to be 2D or 3D, got "
                                 f"{input.dim()}D instead")
            batched = input.dim() == 3
            if not batched and lengths is not None:
                raise InputError("lengths was given with an unbatched (2-D) input; lengths are per row of "
                                 "a batched (3-D) input")
            x = input if batched else input.unsqueeze(0 if self.batch_first else 1)
        h0, c0 = self._initial_states(hx, batched)
        self._check_args(x, h0, c0)
        y, h_n, c_n = self._run(x, h0, c0, lengths, _autocast_dtypes(self, x, packed))
        if packed:
            y = _repack(y, input, lengths, self.batch_first)
        elif not batched:
            y, h_n = y.squeeze(0 if self.batch_first else 1), h_n.squeeze(1)
            c_n = c_n.squeeze(1) if c_n is not None else None
        return (y, (h_n, c_n)) if self.mode == "LSTM" else (y, h_n)

    def _export_packed(self, input: PackedSequence, hx: Any):
        """A ``PackedSequence`` under the legacy ONNX exporter: :func:`.torch_onnx.export_packed`."""
        h0, c0 = self._initial_states(hx, batched=True)
        dtype = str(input.data.dtype).removeprefix("torch.")
        spec = torch_call.exported_spec(self._spec(dtype, self.dropout), self.training, self.dropout == 1)
        flat = torch.cat([w.reshape(-1) for w in self._weights()])
        output, h_n, c_n = torch_onnx.export_packed(spec, input, h0, c0, flat)
        return (output, (h_n, c_n)) if self.mode == "LSTM" else (output, h_n)

    # -- pieces of the forward ------------------------------------------------------------------------
    def _check_dropout(self) -> None:
        p = self.dropout
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
            raise ValueError(f"dropout = {p!r}; dropout should be a number in range [0, 1] representing the "
                             "probability of an element being zeroed")

    def _initial_states(self, hx: Any, batched: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``(h0, c0)`` 3-D (or None), following nn.LSTM's rules for unbatched input."""
        if hx is None:
            return None, None
        lstm = self.mode == "LSTM"
        if lstm and not (isinstance(hx, (tuple, list)) and len(hx) == 2):
            raise InputTypeError(f"hx has type {type(hx).__name__}; expected a tuple (h_0, c_0) for an LSTM")
        if not lstm and not isinstance(hx, torch.Tensor):
            raise InputTypeError(f"hx has type {type(hx).__name__}; expected a tensor h_0 for "
                                 f"{type(self).__name__} (only an LSTM takes a tuple (h_0, c_0))")
        states = tuple(hx) if lstm else (hx,)
        for state in states:
            if not isinstance(state, torch.Tensor):
                raise InputTypeError(f"hx holds a {type(state).__name__}; expected tensors")
        want = 3 if batched else 2
        if any(s.dim() != want for s in states):
            dims = ", ".join(f"{s.dim()}-D" for s in states)
            kind = "batched 3-D" if batched else "unbatched 2-D"
            raise InputError(f"For {kind} input, hx{' and cx' if lstm else ''} should also be {want}-D but "
                             f"got ({dims}) tensors")
        if not batched:
            states = tuple(s.unsqueeze(1) for s in states)
        return states[0], (states[1] if lstm else None)

    def _check_args(self, x: torch.Tensor, h0: torch.Tensor | None, c0: torch.Tensor | None) -> None:
        """nn.RNNBase's own checks (its exception types and messages), then devices, dtypes, T = 0."""
        weight = self._weights()[0]
        if x.device != weight.device:
            raise InputTypeError(f"Input and parameter tensors are not at the same device, found input "
                                 f"tensor at {x.device} and parameter tensor at {weight.device}")
        self.check_input(x, None)
        if h0 is not None:
            message = "Expected hidden[0] size {}, got {}" if c0 is not None else \
                "Expected hidden size {}, got {}"
            self.check_hidden_size(h0, self.get_expected_hidden_size(x, None), message)
        if c0 is not None:
            self.check_hidden_size(c0, self.get_expected_cell_size(x, None),
                                   "Expected hidden[1] size {}, got {}")
        _check_state_tensors(x, {"h_0": h0, "c_0": c0})
        if x.shape[0 if not self.batch_first else 1] == 0:
            raise InputError(f"Expected sequence length to be larger than 0 in RNN (input has shape "
                             f"{tuple(x.shape)}: T = 0 steps)")

    def _run(self, x: torch.Tensor, h0: torch.Tensor | None, c0: torch.Tensor | None, lengths: Any,
             out_dtypes: tuple[torch.dtype, ...] | None):
        """``(y, h_n, c_n)`` in ``out_dtypes`` (None: the input's dtype), computed without autocast."""
        out_dtypes = out_dtypes or (x.dtype,) * 3
        with _without_autocast(x.device):
            outputs = self._compute(x, h0, c0, lengths)
        return tuple(t.to(d) if t is not None else None for t, d in zip(outputs, out_dtypes, strict=True))

    def _compute(self, x: torch.Tensor, h0: torch.Tensor | None, c0: torch.Tensor | None, lengths: Any):
        compute = _compute_dtype(x.dtype, x.device)
        dtype, p = str(compute).removeprefix("torch."), float(self.dropout)
        weights, has_cell = self._weights(), self.mode == "LSTM"
        states = [t.to(compute) if t is not None else None for t in (x, h0, c0)]
        capturing = torch_call.capturing_graph()
        if capturing and not (p == 1 and self.training):  # the custom op; options: a compile-time constant
            options = torch_call.options_text(self._spec_text, dtype, self.batch_first, self.training,
                                              "auto", per_weight=True)
            return torch_call.run_compiled(options, has_cell, *states, [w.to(compute) for w in weights],
                                           lengths, torch_call.seed_tensor(self.training, self._spec_text))
        spec = self._spec(dtype, p if p < 1 else 0.0)
        if not capturing and self._one_step(x, h0, c0, lengths, spec, compute):
            out = self._step_layers(x, h0, c0, spec)
            if out is not None:
                return out
        if compute == x.dtype and not capturing and self._in_one_buffer(weights):
            inputs, split = weights, torch_call.split_of(spec)
        else:  # re-parametrised weights, or a computation in float32: one concatenation per call
            inputs, split = (torch.cat([w.reshape(-1) for w in weights]).to(compute),), None
        seed = _draw_seed(spec, self.training, None)
        opts = _ForwardOptions(spec, None, self.batch_first, self.training, seed, "auto", split,
                               drop_all=p == 1)
        with as_torch_errors():
            return torch_call.run(opts, *states, inputs, lengths)

    def _one_step(self, x: torch.Tensor, h0: torch.Tensor | None, c0: torch.Tensor | None, lengths: Any,
                  spec: ar.RNNSpec, compute: torch.dtype) -> bool:
        """Whether the call is one the fused step serves (:meth:`_step_layers`): one time step of every row
        (no lengths), in float32 / float64 on CPU or CUDA, without dropout masks or cell variants."""
        T, B = (x.shape[1], x.shape[0]) if self.batch_first else x.shape[:2]
        masks = self.training and self.dropout > 0 and spec.num_layers > 1
        return (T == 1 and B > 0 and lengths is None and compute == x.dtype and not masks
                and not spec.variants and x.device.type in ("cpu", "cuda")
                and not any(torch_call.is_transformed(t) for t in (x, h0, c0) if t is not None))

    def _step_layers(self, x: torch.Tensor, h0: torch.Tensor | None, c0: torch.Tensor | None,
                     spec: ar.RNNSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
        """``(y, h_n, c_n)`` of a one-step call as one fused step per layer-direction
        (:func:`.torch_step.run_layers`, its packed weights kept in ``_steps``), or None where the weights
        are not tensors the step reads."""
        weights = [[getattr(self, name) for name in names] for names in self._all_weights]
        rows = x.reshape(x.shape[0] * x.shape[1], -1)  # (1, B, I) or (B, 1, I): the step's (B, I)
        out = torch_step.run_layers(self.__dict__.setdefault("_steps", {}), spec, rows, h0, c0, weights)
        if out is None:
            return None
        y, h_n, c_n = out
        return y.unsqueeze(1 if self.batch_first else 0), h_n, c_n

    def _spec_dict(self, dropout: float) -> dict[str, Any]:
        return {"mode": TORCH_MODES[self.mode], "input_size": self.input_size,
                "hidden_size": self.hidden_size, "num_layers": self.num_layers, "bias": self.bias,
                "bidirectional": self.bidirectional,
                "proj_size": self.proj_size, "dropout": dropout if dropout < 1 else 0.0, **self._variants()}

    def _spec(self, dtype: str, dropout: float) -> ar.RNNSpec:
        return _spec_of(TORCH_MODES[self.mode], self.input_size, self.hidden_size, self.num_layers, self.bias,
                        self.bidirectional, self.proj_size, dropout, dtype,
                        tuple(sorted(self._variants().items())))

class LSTM(_FlatWeights, torch.nn.LSTM):
    """``torch.nn.LSTM`` on arrayrnn's fused engines (a subclass); the weights are views of one flat buffer.

    Constructed positionally or by keyword exactly as ``nn.LSTM``, whose constructor, checks, attributes and
    methods it runs; ``forward(input, hx=None)`` returns ``output, (h_n, c_n)`` as ``nn.LSTM`` does
    (``PackedSequence`` inputs included).

    Parameters
    ----------
    input_size, hidden_size : int
        As ``nn.LSTM``.
    num_layers : int, optional
        Stacked layers.
    bias : bool, optional
        Both biases, or none.
    batch_first : bool, optional
        ``(B, T, I)`` input and output.
    dropout : float, optional
        Dropout between layers in training mode (arrayrnn's masks, seeded from torch's generator).
    bidirectional : bool, optional
        Add a reverse direction.
    proj_size : int, optional
        LSTM projection (0: none).
    device, dtype : optional
        As ``nn.LSTM``.

    Raises
    ------
    InputError
        What arrayrnn itself refuses as a value (a ``RuntimeError`` and a ``ValueError``).
    InputTypeError
        What arrayrnn itself refuses as a type (a ``RuntimeError`` and a ``TypeError``).
        ``nn.RNNBase``'s own checks raise what PyTorch raises.

    Examples
    --------
    >>> import torch
    >>> from arrayrnn.torch import LSTM
    >>> lstm = LSTM(3, 4, num_layers=2, batch_first=True)
    >>> y, (h_n, c_n) = lstm(torch.ones(2, 5, 3))
    >>> tuple(y.shape), tuple(h_n.shape)
    ((2, 5, 4), (2, 2, 4))
    >>> y.sum().backward()
    >>> lstm.weight_ih_l0.grad.shape
    torch.Size([16, 3])
    """

    def __init__(self, *args: Any, **kwargs: Any):
        self._set_variants(kwargs, "lstm")
        super().__init__(*args, **kwargs)


class GRU(_FlatWeights, torch.nn.GRU):
    """``torch.nn.GRU`` on arrayrnn's fused engines (a subclass); the weights are views of one flat buffer.

    Constructed exactly as ``nn.GRU`` (``proj_size`` is its ``ValueError``); ``forward(input, hx=None)``
    returns ``output, h_n``.

    Parameters
    ----------
    input_size, hidden_size : int
        As ``nn.GRU``.
    num_layers : int, optional
        Stacked layers.
    bias : bool, optional
        Both biases, or none.
    batch_first : bool, optional
        ``(B, T, I)`` input and output.
    dropout : float, optional
        Dropout between layers in training mode.
    bidirectional : bool, optional
        Add a reverse direction.
    device, dtype : optional
        As ``nn.GRU``.

    Raises
    ------
    InputError
        What arrayrnn itself refuses as a value (a ``RuntimeError`` and a ``ValueError``).
    InputTypeError
        What arrayrnn itself refuses as a type (a ``RuntimeError`` and a ``TypeError``).
        ``nn.RNNBase``'s own checks raise what PyTorch raises.

    Examples
    --------
    >>> import torch
    >>> from arrayrnn.torch import GRU
    >>> gru = GRU(3, 4, bidirectional=True)
    >>> y, h_n = gru(torch.ones(5, 2, 3))
    >>> tuple(y.shape), tuple(h_n.shape)
    ((5, 2, 8), (2, 2, 4))
    """

    def __init__(self, *args: Any, **kwargs: Any):
        self._set_variants(kwargs, "gru")
        super().__init__(*args, **kwargs)


class RNN(_FlatWeights, torch.nn.RNN):
    """``torch.nn.RNN`` on arrayrnn's fused engines (a subclass); the weights are views of one flat buffer.

    Constructed exactly as ``nn.RNN`` (the fourth positional argument is ``nonlinearity``);
    ``forward(input, hx=None)`` returns ``output, h_n``.

    Parameters
    ----------
    input_size, hidden_size : int
        As ``nn.RNN``.
    num_layers : int, optional
        Stacked layers.
    nonlinearity : str, optional
        ``"tanh"`` or ``"relu"``.
    bias : bool, optional
        Both biases, or none.
    batch_first : bool, optional
        ``(B, T, I)`` input and output.
    dropout : float, optional
        Dropout between layers in training mode.
    bidirectional : bool, optional
        Add a reverse direction.
    device, dtype : optional
        As ``nn.RNN``.

    Raises
    ------
    InputError
        What arrayrnn itself refuses as a value (a ``RuntimeError`` and a ``ValueError``).
    InputTypeError
        What arrayrnn itself refuses as a type (a ``RuntimeError`` and a ``TypeError``).
        ``nn.RNNBase``'s own checks raise what PyTorch raises.

    Examples
    --------
    >>> import torch
    >>> from arrayrnn.torch import RNN
    >>> rnn = RNN(3, 4, 1, "relu")
    >>> y, h_n = rnn(torch.ones(5, 2, 3))
    >>> tuple(y.shape)
    (5, 2, 4)
    """

    def __init__(self, *args: Any, **kwargs: Any):
        nonlinearity = args[3] if len(args) > 3 else kwargs.get("nonlinearity", "tanh")
        self._set_variants(kwargs, "rnn_relu" if nonlinearity == "relu" else "rnn_tanh")  # nn.RNN checks it
        super().__init__(*args, **kwargs)


def _refuse_scripting(name: str) -> RuntimeError:
    """``torch.jit.script`` compiles the forward's Python source; ours calls the engines from Python."""
    return RuntimeError(f"torch.jit.script cannot compile arrayrnn.torch.{name}: its forward calls "
                        "arrayrnn's engines from Python. Use torch.jit.trace instead (a saved trace calls "
                        "the custom op arrayrnn::rnn; import arrayrnn.torch before torch.jit.load), or "
                        "torch.compile / torch.export")


@functools.lru_cache(maxsize=64)
def _spec_of(mode: str, input_size: int, hidden_size: int, num_layers: int, bias: bool, bidirectional: bool,
             proj_size: int, dropout: float, dtype: str, variants: tuple[tuple[str, Any], ...]) -> ar.RNNSpec:
    return ar.RNNSpec(mode=mode, input_size=input_size, hidden_size=hidden_size, num_layers=num_layers,
                      bias=bias, bidirectional=bidirectional, proj_size=proj_size, dropout=dropout,
                      dtype=dtype, **dict(variants))


# -- ArrayRNN: one flat Parameter -------------------------------------------------------------------------
class ArrayRNN(torch.nn.Module):
    """A multi-layer RNN / LSTM / GRU, or a stack of a registered custom cell, whose weights are one flat
    ``nn.Parameter``.

    Weights are drawn like PyTorch's (uniform(-1/sqrt(H), 1/sqrt(H))) from ``seed``, or from torch's
    generator when None. ``forward(x, hx=None, lengths=None)`` returns ``y, (h_n, c_n)`` for a cell with a
    state besides ``h`` (LSTM; a custom cell of two states or more, ``c_n`` holding them side by side,
    ``(L*D, B, spec.cell_width)``) and ``y, h_n`` otherwise, with autograd through
    `arrayrnn.rnn_forward` / `arrayrnn.rnn_backward`. A custom cell runs first-order autograd; gradients of
    gradients and ``torch.func`` transforms of it are refused (they need the cell in torch operations).

    Parameters
    ----------
    mode : str or RNNSpec
        ``"lstm"``, ``"gru"``, ``"rnn_tanh"`` / ``"rnn"``, ``"rnn_relu"``, or the name of a registered cell
        (``"cifg"``, `arrayrnn.registered_cells`); or an `arrayrnn.RNNSpec` (for arrayrnn-only options:
        cell clipping, single biases, reset-before GRU), then no sizes are given.
    input_size, hidden_size : int
        As ``nn.LSTM``.
    num_layers, bias, batch_first, dropout, bidirectional, proj_size : optional
        As ``nn.LSTM``.
    nonlinearity : str, optional
        ``"tanh"`` or ``"relu"`` for ``mode="rnn"``.
    dtype, device : optional
        Of the flat parameter.
    seed : int, optional
        Seed of the initial weights (None: torch's generator).
    **variants
        Further `arrayrnn.RNNSpec` fields (``zoneout``, ``layer_norm``, ...).

    Raises
    ------
    InputError
        A configuration or input value arrayrnn refuses (a ``RuntimeError`` and a ``ValueError``).
    InputTypeError
        A wrong type, dtype or device (a ``RuntimeError`` and a ``TypeError``).

    Examples
    --------
    >>> import torch
    >>> from arrayrnn.torch import ArrayRNN
    >>> model = ArrayRNN("lstm", 3, 4, num_layers=2, seed=0)
    >>> [p.dim() for p in model.parameters()]
    [1]
    >>> y, (h_n, c_n) = model(torch.ones(5, 2, 3), lengths=torch.tensor([5, 3]))
    >>> tuple(y.shape), tuple(c_n.shape)
    ((5, 2, 4), (2, 2, 4))
    """

    def __init__(self, mode: str | ar.RNNSpec, input_size: int | None = None, hidden_size: int | None = None,
                 num_layers: int = 1, bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, proj_size: int = 0, *, nonlinearity: str = "tanh",
                 dtype: torch.dtype | None = None, device: Any = None, seed: int | None = None,
                 **variants: Any):
        super().__init__()
        unknown = sorted(set(variants) - set(torch_variants.DEFAULTS))
        if unknown:
            raise TypeError(f"ArrayRNN got unexpected keyword arguments {unknown}; the cell variants' "
                            f"options are {list(torch_variants.DEFAULTS)}")
        if isinstance(mode, ar.RNNSpec):
            if input_size is not None or hidden_size is not None or dtype is not None or variants:
                given = sorted(variants) or "a variant option"
                raise ValueError(f"input_size, hidden_size, dtype or {given} was given with an RNNSpec; the "
                                 "spec already fixes them (use "
                                 "dataclasses.replace on the spec instead)")
            spec = mode
        else:
            spec = _spec_from_args(mode, nonlinearity, input_size, hidden_size, num_layers, bias, dropout,
                                   bidirectional, proj_size, dtype or torch.get_default_dtype(), variants)
        if seed is None:
            seed = int(torch.randint(0, 2**31 - 1, ()).item())
        host = ar.PackedParams.init(spec, seed=seed).data
        self._spec = spec
        self._spec_text = torch_call.spec_text(spec.to_dict())  # what a compiled call reads: a constant
        self.batch_first = bool(batch_first)
        self.flat = torch.nn.Parameter(torch.from_numpy(host).to(device))

    def __prepare_scriptable__(self) -> Any:
        raise _refuse_scripting(type(self).__name__)

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        if "_spec_text" not in self.__dict__:  # saved before the attribute existed
            self._spec_text = torch_call.spec_text(self._spec.to_dict())

    @classmethod
    def from_torch(cls, module: torch.nn.Module) -> ArrayRNN:
        """An ``ArrayRNN`` with the weights (bit-exact), configuration and device of an ``nn.LSTM/GRU/RNN``.

        Parameters
        ----------
        module : torch.nn.LSTM, torch.nn.GRU or torch.nn.RNN
            The module to copy.

        Returns
        -------
        ArrayRNN

        Examples
        --------
        >>> import torch
        >>> from arrayrnn.torch import ArrayRNN
        >>> model = ArrayRNN.from_torch(torch.nn.GRU(3, 4))
        >>> model.mode
        'gru'
        """
        if isinstance(module, _FlatWeights) and torch_variants.changed(module._variants()):
            return cls._from_variant_drop_in(module)
        params = ar.from_torch(module)
        new = cls(params.spec, batch_first=getattr(module, "batch_first", False), seed=0)
        device = next(module.parameters()).device
        new.flat = torch.nn.Parameter(torch.from_numpy(params.data).to(device))
        return new

    @classmethod
    def _from_variant_drop_in(cls, module: _FlatWeights) -> ArrayRNN:
        """A drop-in with cell variants (which ``ar.from_torch``'s ``nn.*`` configuration cannot hold): its
        spec and its weights in the canonical order (peepholes included)."""
        weights = [w.detach() for w in module._weights()]
        dropout = float(module.dropout)
        spec = module._spec(str(weights[0].dtype).removeprefix("torch."), dropout if dropout < 1 else 0.0)
        new = cls(spec, batch_first=module.batch_first, seed=0)
        new.flat = torch.nn.Parameter(torch.cat([w.reshape(-1) for w in weights]))
        return new

    @property
    def spec(self) -> ar.RNNSpec:
        """The spec, with the dtype the parameter has now (``module.double()`` changes it)."""
        dtype = _compute_dtype(self.flat.dtype, self.flat.device)
        return dataclasses.replace(self._spec, dtype=str(dtype).removeprefix("torch."))

    @property
    def mode(self) -> str:
        """The recurrent mode, ``"lstm"``, ``"gru"``, ``"rnn_tanh"``, ``"rnn_relu"`` or a custom cell's
        name."""
        return self._spec.mode

    def extra_repr(self) -> str:
        s = self._spec
        return (f"{s.mode}, {s.input_size}, {s.hidden_size}, num_layers={s.num_layers}, "
                f"bidirectional={s.bidirectional}, proj_size={s.proj_size}, batch_first={self.batch_first}, "
                f"dropout={s.dropout}{torch_variants.extra_repr(_variant_fields(s))}, "
                f"parameters={self.flat.numel()}")

    def forward(self, x: torch.Tensor | PackedSequence, hx: Any = None, lengths: Any = None,
                engine: str = "auto", seed: int | None = None):
        """Like ``nn.LSTM.forward``: ``y, (h_n, c_n)`` for a cell with a state besides ``h``, ``y, h_n``
        otherwise.

        Parameters
        ----------
        x : torch.Tensor or PackedSequence
            ``(T, B, I)`` (``(B, T, I)`` with ``batch_first``) or a ``PackedSequence`` (then ``y`` is a
            ``PackedSequence`` with the same ``batch_sizes`` and indices).
        hx : torch.Tensor or tuple, optional
            ``h0`` or, for a cell with a state besides ``h``, ``(h0, c0)``, shaped ``(L*D, B, H_out)`` /
            ``(L*D, B, spec.cell_width)``; None means zeros.
        lengths : torch.Tensor or sequence of int, optional
            Per-row lengths ``(B,)`` for a padded ``x`` (not with a ``PackedSequence``).
        engine : str, optional
            As in :func:`arrayrnn.rnn_forward`.
        seed : int, optional
            Seed of the dropout masks in training mode (None: drawn from torch's generator).

        Returns
        -------
        y : torch.Tensor or PackedSequence
            ``(T, B, D*H_out)`` (batch-first with ``batch_first``).
        h_n or (h_n, c_n) : torch.Tensor
            ``(L*D, B, H_out)`` and, for a cell with a state besides ``h``, ``(L*D, B, spec.cell_width)``.

        Raises
        ------
        InputError
            Bad shapes or lengths.
        InputTypeError
            Wrong types, dtypes or devices.
        """
        packed = isinstance(x, PackedSequence)
        if packed:
            if lengths is not None:
                raise InputError("lengths was given with a PackedSequence input; a PackedSequence "
                                 "carries its own lengths")
            if torch_onnx.legacy_export():  # the weights enter as constants: see _compute
                spec = torch_call.exported_spec(self.spec, self.training)
                output, h_n, c_n = torch_onnx.export_packed(spec, x, *self._split_hx(hx), self.flat.data)
                return (output, (h_n, c_n)) if self._spec.has_cell else (output, h_n)
            source = x
            x, lengths = pad_packed_sequence(x, batch_first=self.batch_first)
        h0, c0 = self._split_hx(hx)
        y, h_n, c_n = self._run(x, h0, c0, lengths, engine, seed)
        if packed:
            y = _repack(y, source, lengths, self.batch_first)
        return (y, (h_n, c_n)) if self._spec.has_cell else (y, h_n)

    def _run(self, x: Any, h0: Any, c0: Any, lengths: Any, engine: str, seed: int | None):
        for name, value in (("x", x), ("h0", h0), ("c0", c0)):
            if value is not None and not isinstance(value, torch.Tensor):
                raise InputTypeError(f"{name} has type {type(value).__name__}; expected a torch.Tensor")
            if value is not None and value.device != self.flat.device:
                raise InputTypeError(f"{name} is on {value.device}; expected the module's device "
                                     f"{self.flat.device}")
            if value is not None and value.dtype != self.flat.dtype:
                raise InputTypeError(f"{name} has dtype {value.dtype}; expected the module's dtype "
                                     f"{self.flat.dtype} (convert with {name}.to({self.flat.dtype}))")
        compute = _compute_dtype(self.flat.dtype, self.flat.device)
        if x.dim() == 3 and x.shape[1 if self.batch_first else 0] == 0:
            raise InputError(f"x has shape {tuple(x.shape)}: T = 0 steps; expected at least one step")
        states = [t.to(compute) if t is not None else None for t in (x, h0, c0)]
        with _without_autocast(x.device):
            outputs = self._compute(states, lengths, engine, seed, compute)
        return tuple(t.to(self.flat.dtype) if t is not None else None for t in outputs)

    def _compute(self, states: list, lengths: Any, engine: str, seed: int | None, compute: torch.dtype):
        spec = self._spec
        if torch_call.capturing_graph():  # the custom op; the options are a compile-time constant
            flat = self.flat
            if torch.onnx.is_in_onnx_export() and torch.jit.is_tracing():
                # the legacy exporter knows a module's tensors by state_dict(keep_vars=True), which holds
                # nn.LSTM's per-weight views here, not `flat`: the weights enter as constants (initializers)
                flat = flat.data
            options = torch_call.options_text(self._spec_text, str(compute).removeprefix("torch."),
                                              self.batch_first, self.training, engine, per_weight=False)
            if seed is None:
                drawn = torch_call.seed_tensor(self.training, self._spec_text)
            else:
                drawn = torch.full((), seed, dtype=torch.int64)
            return torch_call.run_compiled(options, spec.has_cell, *states, [flat.to(compute)], lengths,
                                           drawn)
        seed = _draw_seed(spec, self.training, seed)
        opts = _ForwardOptions(self.spec, None, self.batch_first, self.training, seed, engine)
        with as_torch_errors():
            return torch_call.run(opts, *states, (self.flat.to(compute),), lengths)

    def _split_hx(self, hx: Any) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if hx is None:
            return None, None
        if self._spec.has_cell:
            if not (isinstance(hx, (tuple, list)) and len(hx) == 2):
                what = "an LSTM" if self._spec.mode == "lstm" else f"the cell {self._spec.mode!r} (states " \
                    f"{self._spec.custom_cell.states}: c0 holds those besides h side by side)"
                raise InputTypeError(f"hx has type {type(hx).__name__}; expected (h0, c0) for {what}")
            return hx[0], hx[1]
        if not isinstance(hx, torch.Tensor):
            raise InputTypeError(f"hx has type {type(hx).__name__}; expected a tensor h0 for "
                                 f"{self._spec.mode}")
        return hx, None

    # -- state_dict: the canonical blocks under PyTorch's keys ------------------------------------
    def _blocks(self) -> dict[str, Any]:
        return {_state_key(b): b for b in ar.layout_of(self._spec).blocks}

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        flat = self.flat if keep_vars else self.flat.detach()
        for key, block in self._blocks().items():
            destination[prefix + key] = flat[block.offset:block.stop].view(block.shape)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, local_metadata: Any, strict: bool,
                              missing_keys: list, unexpected_keys: list, error_msgs: list) -> None:
        blocks = self._blocks()
        for key, block in blocks.items():
            if prefix + key not in state_dict:
                missing_keys.append(prefix + key)
                continue
            value = state_dict[prefix + key]
            if tuple(value.shape) != tuple(block.shape):
                error_msgs.append(f"{prefix + key} has shape {tuple(value.shape)}; expected "
                                  f"{tuple(block.shape)} for this module")
                continue
            with torch.no_grad():
                self.flat[block.offset:block.stop].copy_(value.reshape(-1))
        if strict:  # as nn.Module: a key under this prefix must name one of our blocks (no children here)
            unexpected_keys.extend(k for k in state_dict
                                   if k.startswith(prefix) and k[len(prefix):].split(".", 1)[0] not in blocks)


def _state_key(block: Any) -> str:
    """nn.LSTM's key of a block; the blocks nn.LSTM has not as the drop-ins name them
    (``weight_peephole_l0``, ``layer_norm_weight_hh_l0``, ...: :func:`.torch_variants.extra_name`)."""
    if block.name in torch_variants.EXTRA_NAMES:
        return torch_variants.extra_name(block.name, block.layer, block.direction)
    return torch_key(block)


def _variant_fields(spec: ar.RNNSpec) -> dict[str, Any]:
    """The spec's cell-variant options; ``zoneout_cell`` only where it differs from ``zoneout``."""
    fields = {name: getattr(spec, name) for name in torch_variants.DEFAULTS}
    if fields["zoneout_cell"] == spec.zoneout:
        fields["zoneout_cell"] = None
    return fields


def _spec_from_args(mode: Any, nonlinearity: str, input_size, hidden_size, num_layers, bias, dropout,
                    bidirectional, proj_size, dtype: torch.dtype, variants: dict[str, Any]) -> ar.RNNSpec:
    if nonlinearity not in ("tanh", "relu"):
        raise ValueError(f"nonlinearity = {nonlinearity!r}; expected 'tanh' or 'relu' (like nn.RNN)")
    if input_size is None or hidden_size is None:
        raise ValueError(f"input_size = {input_size}, hidden_size = {hidden_size}; both are required "
                         "unless an RNNSpec is given")
    return ar.RNNSpec(mode=_mode_of(mode, nonlinearity), input_size=input_size, hidden_size=hidden_size,
                      num_layers=num_layers, bias=bias, dropout=dropout, bidirectional=bidirectional,
                      proj_size=proj_size, dtype=str(dtype).removeprefix("torch."), **variants)


def _mode_of(mode: Any, nonlinearity: str) -> str:
    """The spec's mode for ``ArrayRNN``'s ``mode`` argument: a built-in alias (``"rnn"`` with
    ``nonlinearity``) or the name of a registered cell."""
    if isinstance(mode, str) and mode.lower() in _MODE_ALIASES:
        return f"rnn_{nonlinearity}" if mode.lower() == "rnn" else _MODE_ALIASES[mode.lower()]
    if isinstance(mode, str) and cell_of(mode) is not None:
        return mode
    raise ValueError(f"mode = {mode!r}; expected an RNNSpec, one of 'lstm', 'gru', 'rnn_tanh', 'rnn_relu', "
                     f"'rnn' or the name of a cell registered with arrayrnn.register_cell (registered: "
                     f"{ar.registered_cells()})")


# torch.save(module) / torch.load(path, weights_only=True): the classes a saved module's pickle names
torch.serialization.add_safe_globals([LSTM, GRU, RNN, LSTMCell, GRUCell, RNNCell, ArrayRNN, ar.RNNSpec])
