"""Drop-in ``nn.LSTMCell`` / ``nn.GRUCell`` / ``nn.RNNCell`` on arrayrnn's fused step.

:class:`LSTMCell`, :class:`GRUCell` and :class:`RNNCell` are subclasses of the ``torch.nn`` cells: the same
constructor, parameters (``weight_ih``, ``weight_hh``, ``bias_ih``, ``bias_hh``: views of ONE buffer, which
is the canonical layout of a one-layer stack), ``state_dict``, checks and errors. A call is one time step
(:mod:`arrayrnn.engines.step`): on CPU the numba engine's compiled loops, the weights packed once and
reused while their values are unchanged; on CUDA tensors the GPU engine's step kernels on torch's current
stream. Its backward is the step's hand-written backward (one flat weight gradient, every ``weight.grad`` a
view into it); a backward with ``create_graph=True`` differentiates the step re-run in torch operations.

Whatever the fused step does not serve runs ``nn``'s own forward (the parent class): a graph capture
(``torch.compile``, ``torch.jit.trace``, ``torch.export``, ONNX export), ``torch.func`` transforms,
autocast, dtypes other than float32 / float64, devices other than CPU / CUDA, an empty batch or
``hidden_size = 0``, and any input ``nn`` refuses (so it raises ``nn``'s errors, with its messages).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

import arrayrnn as ar
from arrayrnn.engines import probe_call, select_engine
from arrayrnn.engines.step import StepEngine, StepWeights
from arrayrnn.frontend.cell import step_engine

from . import torch_call
from .torch_buffer import OneBuffer
from .torch_call import array_view, engine_stream, tensor_of

_Tensor = torch.Tensor
_FUSED_DTYPES = (torch.float32, torch.float64)
_NAMES = ["weight_ih", "weight_hh", "bias_ih", "bias_hh"]


@dataclass(frozen=True, eq=False)
class _Step:
    """One fused step's engine, its prepared weights and the step as a one-step sequence call (where each
    weight input sits in the buffer, for the gradient split and the torch-op re-run)."""

    stepper: StepEngine
    weights: StepWeights
    options: torch_call._ForwardOptions
    inputs: list[_Tensor]  # the module's weights the step reads (the autograd node's inputs)


class _FusedCell(OneBuffer):
    """The fused forward of a ``torch.nn.RNNCellBase`` subclass whose weights are views of one buffer."""

    def _init_buffer(self) -> None:
        self.__dict__["_prepared"] = None  # (key, _Step) of the last call (:meth:`_prepare`)
        self.flatten_parameters()

    @property
    def _flat_weights_names(self) -> list[str]:
        return _NAMES if self.bias else _NAMES[:2]

    def _weights(self) -> list[_Tensor]:
        params = self._parameters  # a plain Parameter; else a re-parametrised weight's attribute
        return [params[name] if name in params else getattr(self, name) for name in self._flat_weights_names]

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        module = super()._apply(fn, recurse)
        self.flatten_parameters()  # .to() / .double() / .cuda() replace each weight on its own
        return module

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_prepared": None}  # packed copies, engine objects: rebuilt when called

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.flatten_parameters()  # deepcopy and unpickling copy each weight on its own

    _mode: str | None  # "lstm", "gru", "rnn_tanh", "rnn_relu"; None: a nonlinearity nn.RNNCell refuses

    def forward(self, input: _Tensor, hx: Any = None) -> Any:
        """As the ``nn`` cell's forward: ``h'`` (GRUCell, RNNCell) or ``(h', c')`` (LSTMCell) from ``input``
        ``(B, input_size)`` or unbatched ``(input_size,)`` and ``hx`` (None: zeros)."""
        lstm = self._mode == "lstm"
        states = _states(hx, lstm)
        step = self._prepare(input, states) if states is not None else None
        if step is None:
            return super().forward(input, hx)
        batched = input.dim() == 2
        x = input if batched else input.unsqueeze(0)
        if not states:
            zeros = x.new_zeros(x.shape[0], self.hidden_size)
            states = [zeros, zeros] if lstm else [zeros]
        elif not batched:
            states = [s.unsqueeze(0) for s in states]
        out = _run(step, x, *states)
        if not batched:
            out = tuple(t.squeeze(0) for t in out)
        return out if lstm else out[0]

    def _prepare(self, input: _Tensor, states: list[_Tensor]) -> _Step | None:
        """The fused step for this call: the last call's while it still holds (the same weight tensors and
        memory and, where the engine keeps copies, values), else made anew; None where ``nn``'s forward
        runs instead: what the step does not serve, and every input ``nn`` refuses (it raises its error)."""
        if not self._takes(input, states):
            return None
        weights = self._weights()
        device, dtype = input.device, input.dtype
        try:
            key = (device, dtype, self._mode, *((id(w), w.data_ptr()) for w in weights))
        except RuntimeError:  # a weight without storage (a torch.func transform's)
            return None
        last = self.__dict__.get("_prepared")
        if last is not None and last[0] == key:
            step = last[1]
            if step.stepper.holds(step.weights, step.weights.params.data):
                return step
        elif not all(w.device == device and w.dtype == dtype for w in weights):
            return None
        step = self._new_step(weights, device, dtype)
        if self._in_one_buffer(weights):  # a concatenation (re-parametrised weights) is made per call
            self.__dict__["_prepared"] = (key, step)
        return step

    def _takes(self, input: _Tensor, states: list[_Tensor]) -> bool:
        """Whether the fused step serves ``input`` and ``states`` (the weights: :meth:`_prepare`)."""
        dtype = input.dtype
        if dtype not in _FUSED_DTYPES or self._mode is None or torch_call.capturing_graph():
            return False
        device = input.device
        if device.type not in ("cpu", "cuda") or torch.is_autocast_enabled(device.type):
            return False
        dims, I, H = input.dim(), self.input_size, self.hidden_size
        if dims not in (1, 2) or input.shape[-1] != I or input.numel() == 0 or H == 0:
            return False
        shape = (input.shape[0], H) if dims == 2 else (H,)
        return not torch_call.is_transformed(input) and all(
            t.shape == shape and t.dtype == dtype and t.device == device and not torch_call.is_transformed(t)
            for t in states)

    def _new_step(self, weights: list[_Tensor], device: torch.device, dtype: torch.dtype) -> _Step:
        spec = _cell_spec(self._mode, self.input_size, self.hidden_size, self.bias,
                          str(dtype).removeprefix("torch."))
        if self._in_one_buffer(weights):
            flat = self._flat_from(weights[0].detach())
        else:  # re-parametrised weights: one concatenation per call
            flat = torch.cat([w.detach().reshape(-1) for w in weights])
        data = array_view(flat, "weights")
        index = device.index if device.type == "cuda" else None
        stepper = step_engine(select_engine("auto", probe_call(spec, ar.get_xp(data), device=index)))
        with engine_stream(flat):
            prepared = stepper.prepare(spec, data)
        options = torch_call._ForwardOptions(spec, None, False, False, None, "auto",
                                             torch_call.split_of(spec))
        return _Step(stepper, prepared, options, weights)


def _run(step: _Step, x: _Tensor, h: _Tensor, c: _Tensor | None = None) -> tuple[_Tensor, ...]:
    """``(h',)`` or ``(h', c')``: the fused step, as an autograd node when a gradient may follow."""
    weights = step.inputs
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, h, c, *weights) if t is not None):
        out = _StepFunction.apply(step, x, h, c, *weights)
        return out if isinstance(out, tuple) else (out,)
    with engine_stream(x):
        fwd = step.stepper.forward(step.weights, _array(x), _array(h), _array(c), keep_cache=False)
        return tuple(tensor_of(a) for a in (fwd.h_n, fwd.c_n) if a is not None)


def _array(t: _Tensor | None) -> Any:
    """``t``'s memory as NumPy (CPU) or CuPy (CUDA), no copy."""
    if t is None:
        return None
    return t.detach().numpy() if t.is_cpu else array_view(t, "input")


def _states(hx: Any, lstm: bool) -> list[_Tensor] | None:
    """``hx`` as a list of tensors (``[]`` for None), or None where it is not what the cell takes."""
    if hx is None:
        return []
    if lstm:
        if not (isinstance(hx, (tuple, list)) and len(hx) == 2):
            return None
        states = list(hx)
    else:
        states = [hx]
    return states if all(isinstance(s, _Tensor) for s in states) else None


@functools.lru_cache(maxsize=64)
def _cell_spec(mode: str, input_size: int, hidden_size: int, bias: bool, dtype: str) -> ar.RNNSpec:
    return ar.RNNSpec(mode=mode, input_size=input_size, hidden_size=hidden_size, bias=bias, dtype=dtype)


class _StepFunction(torch.autograd.Function):
    """One fused step: the engine's step forward, its hand-written backward (a differentiable torch-op
    re-run under ``create_graph=True``)."""

    @staticmethod
    def forward(ctx, step: _Step, x: _Tensor, h: _Tensor, c: _Tensor | None, *weights: _Tensor):
        arrays = (_array(x), _array(h), _array(c))
        with engine_stream(x):
            fwd = step.stepper.forward(step.weights, *arrays, keep_cache=True)
            out = tuple(tensor_of(a) for a in (fwd.h_n, fwd.c_n) if a is not None)
        ctx.step, ctx.fwd, ctx.arrays = step, fwd, arrays
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, h, c, *weights)  # torch's version counters then catch in-place writes
        return out if len(out) == 2 else out[0]

    @staticmethod
    def backward(ctx, dh: _Tensor | None, dc: _Tensor | None = None):
        x, h, c, *weights = ctx.saved_tensors
        needs = ctx.needs_input_grad[1:]
        if dh is None and dc is None:
            return (None,) * (1 + len(needs))
        if torch.is_grad_enabled():  # create_graph=True: gradients that are themselves differentiable
            return (None, *_differentiable_grads(ctx.step, x, h, c, weights, dh, dc, needs))
        step, need_weights = ctx.step, any(needs[3:])
        with engine_stream(x):
            g = step.stepper.backward(step.weights, ctx.fwd, *ctx.arrays, _array(dh), _array(dc),
                                      need_dx=needs[0], need_weights=need_weights)
            grads = [tensor_of(a) if a is not None else None for a in (g.dx, g.dh, g.dc)]
            weight_grads = _blocks_of(step, g.dflat) if need_weights else [None] * len(step.inputs)
        return (None, *(t if need else None for t, need in zip((*grads, *weight_grads), needs, strict=True)))


def _blocks_of(step: _Step, dflat: Any) -> list[_Tensor]:
    """The weights' gradients in ``dflat`` (one buffer), each a tensor with a storage of its own over its
    block: autograd sums a loop's steps into the first step's tensors in place (it adds in place only into
    a storage no other tensor holds)."""
    return [tensor_of(dflat[where].reshape(shape)) for where, shape in step.weights.blocks.values()]


def _differentiable_grads(step: _Step, x: _Tensor, h: _Tensor, c: _Tensor | None, weights: list[_Tensor],
                          dh: _Tensor | None, dc: _Tensor | None, needs: tuple[bool, ...]) -> tuple:
    """The step's vector-Jacobian products, differentiable: the torch-op recurrence over one step."""
    one_step = [t.unsqueeze(0) if t is not None else None for t in (x, h, c, dh, dc)]
    grads = torch_call.differentiable_grads(step.options, *one_step[:3], weights, (None, *one_step[3:]),
                                            needs)
    return tuple(g.squeeze(0) if g is not None and k < 3 else g for k, g in enumerate(grads))


class LSTMCell(_FusedCell, torch.nn.LSTMCell):
    """``torch.nn.LSTMCell`` on arrayrnn's fused step (a subclass): ``LSTMCell(input_size, hidden_size,
    bias=True, device=None, dtype=None)``; ``cell(input, (h, c)) -> (h', c')``."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._init_buffer()

    _mode = "lstm"


class GRUCell(_FusedCell, torch.nn.GRUCell):
    """``torch.nn.GRUCell`` on arrayrnn's fused step (a subclass): ``GRUCell(input_size, hidden_size,
    bias=True, device=None, dtype=None)``; ``cell(input, h) -> h'``."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._init_buffer()

    _mode = "gru"


class RNNCell(_FusedCell, torch.nn.RNNCell):
    """``torch.nn.RNNCell`` on arrayrnn's fused step (a subclass): ``RNNCell(input_size, hidden_size,
    bias=True, nonlinearity="tanh", device=None, dtype=None)``; ``cell(input, h) -> h'``. As ``nn.RNNCell``,
    a ``nonlinearity`` other than ``"tanh"`` / ``"relu"`` is refused by the call."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._init_buffer()

    @property
    def _mode(self) -> str | None:
        return {"tanh": "rnn_tanh", "relu": "rnn_relu"}.get(self.nonlinearity)

