"""``ArrayRNN``: arrayrnn's fused engines inside a PyTorch model (the ``torch`` extra).

A ``torch.nn.Module`` that behaves like ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` but holds ONE
``nn.Parameter``, ``flat``: the canonical packed buffer (PyTorch's parameter order, concatenated). Its
forward and backward are one ``torch.autograd.Function`` calling :func:`arrayrnn.rnn_forward` and
:func:`arrayrnn.rnn_backward` on zero-copy DLPack views of the tensors: CPU tensors run the NumPy
engines, CUDA tensors the CuPy engines on torch's current stream. Roughly::

    params = ar.PackedParams(spec, as_array(module.flat))       # no copy
    res = ar.rnn_forward(params, as_array(x), lengths, h0, c0, training=module.training, seed=...)
    # backward: ar.rnn_backward(res, dy, dh_n, dc_n) -> dparams.data is flat.grad

Dropout seeding: in training mode with ``dropout > 0`` each forward draws its mask seed from torch's
default generator (``torch.randint``), so ``torch.manual_seed`` makes a run reproducible; the masks
themselves come from :mod:`arrayrnn.frontend.dropout` (not torch's dropout masks). ``forward(seed=...)``
fixes it.

``state_dict()`` holds the canonical blocks under ``nn.LSTM``'s keys (``weight_ih_l0``, ...), so
``nn.LSTM.load_state_dict`` takes it, and ``load_state_dict`` takes ``nn.LSTM``'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import numpy as np
import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

import arrayrnn as ar

_TORCH_NAMES = {"W_ih": "weight_ih", "W_hh": "weight_hh", "b_ih": "bias_ih", "b_hh": "bias_hh",
                "W_hr": "weight_hr"}
_MODE_ALIASES = {"rnn": "rnn_tanh", "rnn_tanh": "rnn_tanh", "rnn_relu": "rnn_relu", "lstm": "lstm",
                 "gru": "gru"}


@dataclasses.dataclass(frozen=True)
class _Call:
    """The non-tensor arguments of one forward call."""

    spec: ar.RNNSpec
    lengths: Any
    batch_first: bool
    training: bool
    seed: int | None
    engine: str


class ArrayRNN(torch.nn.Module):
    """A multi-layer RNN / LSTM / GRU whose weights are one flat ``nn.Parameter``.

    ``ArrayRNN("lstm", input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
    bidirectional=False, proj_size=0)`` mirrors ``nn.LSTM``'s arguments (mode ``"lstm"``, ``"gru"``,
    ``"rnn_tanh"`` / ``"rnn"``, ``"rnn_relu"``); ``ArrayRNN(spec)`` takes an :class:`arrayrnn.RNNSpec`
    (for arrayrnn-only options: cell clipping, single biases, reset-before GRU). Weights are drawn like
    PyTorch's (uniform(-1/sqrt(H), 1/sqrt(H))) from ``seed``, or from torch's generator when ``None``.
    """

    def __init__(self, mode: str | ar.RNNSpec, input_size: int | None = None, hidden_size: int | None = None,
                 num_layers: int = 1, bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, proj_size: int = 0, *, nonlinearity: str = "tanh",
                 dtype: torch.dtype | None = None, device: Any = None, seed: int | None = None):
        super().__init__()
        if isinstance(mode, ar.RNNSpec):
            if input_size is not None or hidden_size is not None or dtype is not None:
                raise ValueError("input_size, hidden_size or dtype was given with an RNNSpec; the spec "
                                 "already fixes them (use dataclasses.replace on the spec instead)")
            spec = mode
        else:
            spec = _spec_from_args(mode, nonlinearity, input_size, hidden_size, num_layers, bias, dropout,
                                   bidirectional, proj_size, dtype or torch.get_default_dtype())
        if seed is None:
            seed = int(torch.randint(0, 2**31 - 1, ()).item())
        host = ar.PackedParams.init(spec, seed=seed).data
        self._spec = spec
        self.batch_first = bool(batch_first)
        self.flat = torch.nn.Parameter(torch.from_numpy(host).to(device))

    @classmethod
    def from_torch(cls, module: torch.nn.Module) -> ArrayRNN:
        """An ``ArrayRNN`` with the weights (bit-exact), configuration and device of ``nn.LSTM/GRU/RNN``."""
        params = ar.from_torch(module)
        new = cls(params.spec, batch_first=getattr(module, "batch_first", False), seed=0)
        device = next(module.parameters()).device
        new.flat = torch.nn.Parameter(torch.from_numpy(params.data).to(device))
        return new

    @property
    def spec(self) -> ar.RNNSpec:
        """The spec, with the dtype the parameter has now (``module.double()`` changes it)."""
        return dataclasses.replace(self._spec, dtype=str(self.flat.dtype).removeprefix("torch."))

    @property
    def mode(self) -> str:
        return self._spec.mode

    def extra_repr(self) -> str:
        s = self._spec
        return (f"{s.mode}, {s.input_size}, {s.hidden_size}, num_layers={s.num_layers}, "
                f"bidirectional={s.bidirectional}, proj_size={s.proj_size}, batch_first={self.batch_first}, "
                f"dropout={s.dropout}, parameters={self.flat.numel()}")

    def forward(self, x: torch.Tensor | PackedSequence, hx: Any = None, lengths: Any = None,
                engine: str = "auto", seed: int | None = None):
        """Like ``nn.LSTM.forward``: ``y, (h_n, c_n)`` for LSTM, ``y, h_n`` otherwise.

        ``x``: ``(T, B, I)`` (``(B, T, I)`` with ``batch_first``) or a ``PackedSequence`` (then ``y`` is a
        ``PackedSequence`` with the same ``batch_sizes`` and indices). ``hx``: ``h0`` or, for LSTM,
        ``(h0, c0)``; ``None`` means zeros. ``lengths``: optional per-row lengths ``(B,)`` for a padded
        ``x`` (not with a ``PackedSequence``). ``engine``: as in :func:`arrayrnn.rnn_forward`.
        """
        packed = isinstance(x, PackedSequence)
        if packed:
            if lengths is not None:
                raise ValueError("lengths was given with a PackedSequence input; a PackedSequence "
                                 "carries its own lengths")
            source = x
            x, lengths = pad_packed_sequence(x, batch_first=self.batch_first)
        h0, c0 = self._split_hx(hx)
        spec = self.spec
        call = _Call(spec, _lengths_array(lengths), self.batch_first, self.training,
                     self._dropout_seed(spec, seed), engine)
        y, h_n, c_n = _RNNFunction.apply(self.flat, x, h0, c0, call)
        if packed:
            y = _repack(y, source, lengths, self.batch_first)
        return (y, (h_n, c_n)) if spec.mode == "lstm" else (y, h_n)

    def _split_hx(self, hx: Any) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if hx is None:
            return None, None
        if self._spec.mode == "lstm":
            if not (isinstance(hx, (tuple, list)) and len(hx) == 2):
                raise TypeError(f"hx has type {type(hx).__name__}; expected (h0, c0) for an LSTM")
            return hx[0], hx[1]
        if not isinstance(hx, torch.Tensor):
            raise TypeError(f"hx has type {type(hx).__name__}; expected a tensor h0 for {self._spec.mode}")
        return hx, None

    def _dropout_seed(self, spec: ar.RNNSpec, seed: int | None) -> int | None:
        if seed is not None or not self.training or spec.dropout == 0.0 or spec.num_layers == 1:
            return seed
        return int(torch.randint(0, 2**31 - 1, ()).item())

    # -- state_dict: the canonical blocks under PyTorch's keys ------------------------------------
    def _blocks(self) -> dict[str, Any]:
        return {_torch_key(b): b for b in ar.layout_of(self._spec).blocks}

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
        if strict:
            unexpected_keys.extend(k for k in state_dict if k.startswith(prefix)
                                   and "." not in k[len(prefix):] and k[len(prefix):] not in blocks)


class _RNNFunction(torch.autograd.Function):
    """One autograd node: ``rnn_forward`` forward, ``rnn_backward`` backward (first order only)."""

    @staticmethod
    def forward(ctx, flat, x, h0, c0, call: _Call):
        _check_tensors(flat, x, h0, c0)
        with _engine_stream(flat):  # the results are wrapped on the same stream they were computed on
            params = ar.PackedParams(call.spec, ar.as_array(flat.detach(), "flat"))
            res = ar.rnn_forward(params, _view(x, "x"), call.lengths, _view(h0, "h0"), _view(c0, "c0"),
                                 batch_first=call.batch_first, training=call.training, seed=call.seed,
                                 engine=call.engine)
            y, h_n = _tensor(res.y), _tensor(res.h_n)
            c_n = _tensor(res.c_n) if res.c_n is not None else None
        ctx.res = res
        ctx.set_materialize_grads(False)
        # saved so that torch's version counters catch an in-place change before the backward (an optimizer
        # step on flat, a write into y, which the engine may keep as its residual)
        ctx.save_for_backward(flat, x, y)
        return y, h_n, c_n

    @staticmethod
    def backward(ctx, dy, dh_n, dc_n):
        flat, x, _ = ctx.saved_tensors
        needs = ctx.needs_input_grad
        with _engine_stream(flat):
            g = ar.rnn_backward(ctx.res, _view(dy, "dy"), _view(dh_n, "dh_n"), _view(dc_n, "dc_n"))
            grads = (_tensor(g.dparams.data) if needs[0] else None, _tensor(g.dx) if needs[1] else None,
                     _tensor(g.dh0) if needs[2] else None,
                     _tensor(g.dc0) if needs[3] and g.dc0 is not None else None)
        if torch.is_grad_enabled():  # create_graph=True: first-order grads, but no path to a second order
            grads = _FirstOrderOnly.apply(flat, x, *grads)
        return (*grads, None)


class _FirstOrderOnly(torch.autograd.Function):
    """Identity on the gradients; differentiating it again (double backward) is a clear error."""

    @staticmethod
    def forward(ctx, flat, x, *grads):
        return tuple(g.clone() if g is not None else None for g in grads)

    @staticmethod
    def backward(ctx, *cotangents):
        raise RuntimeError("ArrayRNN does not support double backward (a gradient of its gradient): its "
                           "backward is arrayrnn's hand-written BPTT, which is not itself differentiable")


def _spec_from_args(mode: Any, nonlinearity: str, input_size, hidden_size, num_layers, bias, dropout,
                    bidirectional, proj_size, dtype: torch.dtype) -> ar.RNNSpec:
    if not isinstance(mode, str) or mode.lower() not in _MODE_ALIASES:
        raise ValueError(f"mode = {mode!r}; expected an RNNSpec or one of 'lstm', 'gru', 'rnn_tanh', "
                         "'rnn_relu', 'rnn'")
    if nonlinearity not in ("tanh", "relu"):
        raise ValueError(f"nonlinearity = {nonlinearity!r}; expected 'tanh' or 'relu' (like nn.RNN)")
    if mode.lower() == "rnn":
        mode = f"rnn_{nonlinearity}"
    if input_size is None or hidden_size is None:
        raise ValueError(f"input_size = {input_size}, hidden_size = {hidden_size}; both are required "
                         "unless an RNNSpec is given")
    return ar.RNNSpec(mode=_MODE_ALIASES[mode.lower()], input_size=input_size, hidden_size=hidden_size,
                      num_layers=num_layers, bias=bias, dropout=dropout, bidirectional=bidirectional,
                      proj_size=proj_size, dtype=str(dtype).removeprefix("torch."))


def _torch_key(block: Any) -> str:
    return f"{_TORCH_NAMES[block.name]}_l{block.layer}{'_reverse' if block.direction else ''}"


def _check_tensors(flat: torch.Tensor, x: Any, h0: Any, c0: Any) -> None:
    for name, value in (("x", x), ("h0", h0), ("c0", c0)):
        if value is not None and not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} has type {type(value).__name__}; expected a torch.Tensor")
        if value is not None and value.device != flat.device:
            raise TypeError(f"{name} is on {value.device}; expected the module's device {flat.device}")


def _view(t: torch.Tensor | None, name: str) -> Any:
    """A NumPy / CuPy view of ``t`` through DLPack (no copy), or None."""
    if t is None:
        return None
    return ar.as_array(t.detach(), name)


def _tensor(a: Any) -> torch.Tensor:
    """A torch tensor sharing ``a``'s memory (NumPy or CuPy)."""
    if isinstance(a, np.ndarray):
        return torch.from_numpy(a if a.flags.writeable else a.copy())
    return torch.from_dlpack(a)


def _lengths_array(lengths: Any) -> Any:
    if isinstance(lengths, torch.Tensor):
        return ar.as_array(lengths.detach(), "lengths")
    return lengths


def _engine_stream(flat: torch.Tensor) -> contextlib.AbstractContextManager:
    """For CUDA tensors: CuPy's current device and stream = the tensor's device and torch's current stream
    there, so the engines' kernels are ordered with torch's work and DLPack exchanges need no sync."""
    if not flat.is_cuda:
        return contextlib.nullcontext()
    import cupy

    device = flat.device.index if flat.device.index is not None else torch.cuda.current_device()
    stack = contextlib.ExitStack()
    stack.enter_context(cupy.cuda.Device(device))
    stream = torch.cuda.current_stream(device)
    stack.enter_context(cupy.cuda.ExternalStream(stream.cuda_stream, device))
    return stack


def _repack(y: torch.Tensor, source: PackedSequence, lengths: torch.Tensor,
            batch_first: bool) -> PackedSequence:
    """``y`` (padded) as a PackedSequence with ``source``'s batch_sizes and indices (like nn.LSTM)."""
    order = source.sorted_indices
    if order is not None:
        y = y.index_select(0 if batch_first else 1, order)
        lengths = lengths.index_select(0, order.cpu())
    data = pack_padded_sequence(y, lengths, batch_first=batch_first, enforce_sorted=True).data
    return PackedSequence(data, source.batch_sizes, source.sorted_indices, source.unsorted_indices)
