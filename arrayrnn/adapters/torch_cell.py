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

from typing import Any

import torch

from . import torch_call
from .torch_buffer import OneBuffer
from .torch_step import Step, cell_spec, prepared_step, run_step

_Tensor = torch.Tensor
_FUSED_DTYPES = (torch.float32, torch.float64)
_NAMES = ["weight_ih", "weight_hh", "bias_ih", "bias_hh"]


class _FusedCell(OneBuffer):
    """The fused forward of a ``torch.nn.RNNCellBase`` subclass whose weights are views of one buffer."""

    def _init_buffer(self) -> None:
        self.__dict__["_prepared"] = {}  # the last call's fused step (:func:`.torch_step.prepared_step`)
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
        return {**self.__dict__, "_prepared": {}}  # packed copies, engine objects: rebuilt when called

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
        out = run_step(step, x, *states)
        if not batched:
            out = tuple(t.squeeze(0) for t in out)
        return out if lstm else out[0]

    def _prepare(self, input: _Tensor, states: list[_Tensor]) -> Step | None:
        """The fused step for this call (:func:`.torch_step.prepared_step`), or None where ``nn``'s
        forward runs instead: what the step does not serve, and every input ``nn`` refuses (it raises its
        error)."""
        if not self._takes(input, states):
            return None
        spec = cell_spec(self._mode, self.input_size, self.hidden_size, self.bias,
                         str(input.dtype).removeprefix("torch."))
        return prepared_step(self.__dict__["_prepared"], 0, spec, self._weights(), input.device,
                             (input, *states), input.shape[0] if input.dim() == 2 else 1)

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


class LSTMCell(_FusedCell, torch.nn.LSTMCell):
    """``torch.nn.LSTMCell`` on arrayrnn's fused step (a subclass): ``cell(input, (h, c)) -> (h', c')``.

    The signature, checks and weights of ``nn.LSTMCell``.

    Parameters
    ----------
    input_size, hidden_size : int
        As ``nn.LSTMCell``: ``input`` ``(B, input_size)`` or ``(input_size,)``, states
        ``(B, hidden_size)``.
    bias : bool, optional
        Both biases, or none.
    device, dtype : optional
        As ``nn.LSTMCell``.

    Examples
    --------
    >>> import torch
    >>> from arrayrnn.torch import LSTMCell
    >>> cell = LSTMCell(3, 4)
    >>> h, c = cell(torch.ones(2, 3))
    >>> tuple(h.shape), tuple(c.shape)
    ((2, 4), (2, 4))
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._init_buffer()

    _mode = "lstm"


class GRUCell(_FusedCell, torch.nn.GRUCell):
    """``torch.nn.GRUCell`` on arrayrnn's fused step (a subclass): ``cell(input, h) -> h'``.

    The signature, checks and weights of ``nn.GRUCell``.

    Parameters
    ----------
    input_size, hidden_size : int
        As ``nn.GRUCell``: ``input`` ``(B, input_size)`` or ``(input_size,)``, states
        ``(B, hidden_size)``.
    bias : bool, optional
        Both biases, or none.
    device, dtype : optional
        As ``nn.GRUCell``.

    Examples
    --------
    >>> import torch
    >>> from arrayrnn.torch import GRUCell
    >>> tuple(GRUCell(3, 4)(torch.ones(2, 3)).shape)
    (2, 4)
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._init_buffer()

    _mode = "gru"


class RNNCell(_FusedCell, torch.nn.RNNCell):
    """``torch.nn.RNNCell`` on arrayrnn's fused step (a subclass): ``cell(input, h) -> h'``.

    The signature, checks and weights of ``nn.RNNCell``.
    ``nonlinearity`` is ``"tanh"`` or ``"relu"``; as with ``nn.RNNCell``, another value is refused
    by the call.

    Parameters
    ----------
    input_size, hidden_size : int
        As ``nn.RNNCell``: ``input`` ``(B, input_size)`` or ``(input_size,)``, states
        ``(B, hidden_size)``.
    bias : bool, optional
        Both biases, or none.
    nonlinearity : str, optional
        ``"tanh"`` or ``"relu"``.
    device, dtype : optional
        As ``nn.RNNCell``.

    Examples
    --------
    >>> import torch
    >>> from arrayrnn.torch import RNNCell
    >>> tuple(RNNCell(3, 4, nonlinearity="relu")(torch.ones(2, 3)).shape)
    (2, 4)
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._init_buffer()

    @property
    def _mode(self) -> str | None:
        return {"tanh": "rnn_tanh", "relu": "rnn_relu"}.get(self.nonlinearity)

