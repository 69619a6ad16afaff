"""Thin layers: ``LSTM``, ``GRU``, ``RNN``, ``Dense``, ``Embedding``.

A layer holds its parameters in ONE buffer (``.params``: a PackedParams for the recurrent layers, a flat
array for ``Dense`` holding ``W`` then ``b``, the table for ``Embedding``) and is otherwise stateless:
``layer.apply(params, x, ...)`` is a pure function of its arguments (differentiate it by passing the
params through ``value_and_grad``), ``layer(x, ...)`` is ``layer.apply(layer.params, x, ...)``, and the
caller carries recurrent state from call to call::

    lstm = ar.nn.LSTM(32, 64)
    y, h, c = lstm(x)                      # zero initial state
    y, h, c = lstm(x_next, h0=h, c0=c)     # continue where the last call stopped
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import numpy as np

from ..autodiff import ops
from ..autodiff.activations import Activation
from ..autodiff.activations import get as get_activation
from ..autodiff.api import TracedParams
from ..autodiff.bias_act import dense_bias_act
from ..autodiff.tape import value_of
from ..core.backend import get_xp, module_for
from ..core.params import PackedParams
from ..core.spec import RNNSpec, check_flag, check_positive_int, check_seed, normalize_dtype
from ..engines import engine_names


def _check_layer_params(name: str, params: Any, shape: tuple[int, ...], dtype: str) -> None:
    value = value_of(params)
    if not hasattr(value, "shape") or tuple(value.shape) != shape:
        raise ValueError(f"{name}: params has shape {tuple(getattr(value, 'shape', ()))}; expected {shape}")
    if str(value.dtype) != dtype:
        raise TypeError(f"{name}: params has dtype {value.dtype}; expected {dtype}")


class Dense:
    """``act(x @ W.T + b)`` with ``W`` ``(out, in)`` and ``b`` ``(out,)`` packed in one flat buffer.

    Initialized like PyTorch's ``nn.Linear``: ``uniform(-1/sqrt(in), 1/sqrt(in))`` for both.
    """

    def __init__(self, in_features: int, out_features: int, activation: str | Activation = "identity",
                 bias: bool = True, *, seed: int | None = 0, dtype: str = "float32", xp: ModuleType = np):
        for name, n in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1:
                raise ValueError(f"Dense: {name} = {n!r}; expected an integer >= 1")
        in_features, out_features = int(in_features), int(out_features)
        self.in_features, self.out_features = in_features, out_features
        self.bias = check_flag("bias", bias)
        self.activation = get_activation(activation)
        self.dtype = normalize_dtype(dtype)
        size = out_features * in_features + (out_features if self.bias else 0)
        bound = 1.0 / math.sqrt(in_features)
        host = np.random.default_rng(check_seed(seed)).uniform(-bound, bound, size).astype(self.dtype)
        self.params = module_for(xp).asarray(host)

    @property
    def W(self) -> Any:
        return self.unpack(self.params)[0]

    @property
    def b(self) -> Any:
        return self.unpack(self.params)[1]

    def unpack(self, params: Any) -> tuple[Any, Any]:
        """``(W, b)`` views of a flat buffer (traced views of a traced one); ``b`` is None without bias."""
        _check_layer_params("Dense", params, value_of(self.params).shape, self.dtype)
        n_weight = self.out_features * self.in_features
        if self.bias:
            flat_w, b = ops.split(params, [n_weight])
        else:
            flat_w, b = params, None
        return ops.reshape(flat_w, self.out_features, self.in_features), b

    def apply(self, params: Any, x: Any) -> Any:
        W, b = self.unpack(params)
        return dense_bias_act(self.activation, W, x, b)

    def __call__(self, x: Any) -> Any:
        return self.apply(self.params, x)

    def __repr__(self) -> str:
        return (f"Dense({self.in_features}, {self.out_features}, activation={self.activation.name!r}, "
                f"bias={self.bias}, dtype={self.dtype})")


class Embedding:
    """A ``(num_embeddings, embedding_dim)`` table; ``apply(table, ids)`` gathers rows (``N(0, 1)`` init, like
    PyTorch). Repeated ids accumulate their gradients."""

    def __init__(self, num_embeddings: int, embedding_dim: int, *, seed: int | None = 0,
                 dtype: str = "float32", xp: ModuleType = np):
        for name, n in (("num_embeddings", num_embeddings), ("embedding_dim", embedding_dim)):
            if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1:
                raise ValueError(f"Embedding: {name} = {n!r}; expected an integer >= 1")
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        self.dtype = normalize_dtype(dtype)
        rng = np.random.default_rng(check_seed(seed))
        host = rng.standard_normal((num_embeddings, embedding_dim)).astype(self.dtype)
        self.params = module_for(xp).asarray(host)

    def apply(self, params: Any, ids: Any) -> Any:
        _check_layer_params("Embedding", params, (self.num_embeddings, self.embedding_dim), self.dtype)
        _check_no_negative_ids(ids, self.num_embeddings)
        return ops.take(params, ids, axis=0)

    def __call__(self, ids: Any) -> Any:
        return self.apply(self.params, ids)

    def __repr__(self) -> str:
        return f"Embedding({self.num_embeddings}, {self.embedding_dim}, dtype={self.dtype})"


def _check_no_negative_ids(ids: Any, num_embeddings: int) -> None:
    """Refuse negative ids (``take`` would count them from the end; torch.nn.Embedding refuses them)."""
    array = ids if hasattr(ids, "dtype") and hasattr(ids, "min") else np.asarray(ids)
    if np.dtype(array.dtype).kind in "iu" and array.size and int(array.min()) < 0:
        raise ValueError(f"Embedding: ids has the entry {int(array.min())}; expected ids in "
                         f"0..{num_embeddings - 1}")


class _Recurrent:
    """A recurrent stack (all layers and directions) over one PackedParams; calls ``ar.ops.rnn``."""

    def __init__(self, spec: RNNSpec, *, batch_first: bool, seed: int | None, xp: ModuleType, engine: str):
        if not isinstance(engine, str) or engine not in engine_names():
            raise ValueError(f"{type(self).__name__}: engine = {engine!r}; expected one of {engine_names()}")
        self.spec = spec
        self.batch_first = check_flag("batch_first", batch_first)
        self.engine = engine
        self.params = PackedParams.init(spec, seed=seed, xp=xp)

    def apply(self, params: PackedParams | TracedParams, x: Any, lengths: Any = None, h0: Any = None,
              c0: Any = None, *, seed: int | None = None) -> tuple[Any, Any, Any]:
        """``(y, h_n, c_n)`` (``c_n`` None unless LSTM); shapes and semantics of ``ar.rnn_forward``.
        ``seed`` seeds inter-layer dropout when differentiating a stack with ``dropout > 0``."""
        if not isinstance(params, (PackedParams, TracedParams)):
            raise TypeError(f"{type(self).__name__}: params has type {type(params).__name__}; expected a "
                            "PackedParams (this layer's .params, or the traced one value_and_grad passes)")
        if params.spec != self.spec:
            raise ValueError(f"{type(self).__name__}: params.spec = {params.spec}; expected this "
                             f"layer's spec "
                             f"{self.spec}")
        return ops.rnn(params, x, lengths=lengths, h0=h0, c0=c0, batch_first=self.batch_first,
                       engine=self.engine, seed=seed)

    def __call__(self, x: Any, lengths: Any = None, h0: Any = None, c0: Any = None) -> tuple[Any, Any, Any]:
        return self.apply(self.params, x, lengths, h0, c0)

    def to_format(self, format: str) -> _Recurrent:
        """Keep ``self.params`` in weight format ``format`` (e.g. the engine's own, ``"cudnn"``) from now on.

        Converts once, so a training loop does not convert on every call; returns the layer. Optimizers
        built on the old ``layer.params`` must be rebuilt on the new one.
        """
        self.params = self.params.to_format(format)
        return self

    def initial_state(self, batch_size: int) -> tuple[Any, Any]:
        """Zero ``(h0, c0)`` for ``batch_size`` rows (``c0`` None unless LSTM)."""
        batch_size = check_positive_int("batch_size", batch_size, minimum=0)
        xp = get_xp(self.params.data)
        s = self.spec
        h0 = xp.zeros(s.state_shape(batch_size), dtype=s.dtype)
        c0 = xp.zeros(s.state_shape(batch_size, cell=True), dtype=s.dtype) if s.has_cell else None
        return h0, c0

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec})"


class LSTM(_Recurrent):
    """A stacked (optionally bidirectional, projected, cell-clipped) LSTM; PyTorch's ``nn.LSTM`` weights.

    Cell variants (``arrayrnn.RNNSpec``'s fields of the same names): ``recurrent_dropout``,
    ``weight_dropout`` (DropConnect on ``W_hh``) and zoneout (``zoneout`` of h, ``zoneout_cell`` of c,
    default ``zoneout``) act under differentiation (training); zoneout's expectation, ``peepholes`` and
    ``layer_norm`` (layer normalisation of both products and of the cell inside the recurrence, gains in
    the one buffer; ``RNNSpec.layer_norm``) always."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, *, bias: bool | str = True,
                 bidirectional: bool = False, proj_size: int = 0, cell_clip: Any = None, dropout: float = 0.0,
                 recurrent_dropout: float = 0.0, weight_dropout: float = 0.0, zoneout: float = 0.0,
                 zoneout_cell: float | None = None, peepholes: bool = False, layer_norm: bool = False,
                 layer_norm_eps: float = 1e-5, batch_first: bool = False, dtype: str = "float32",
                 seed: int | None = 0, xp: ModuleType = np, engine: str = "auto"):
        spec = RNNSpec("lstm", input_size, hidden_size, num_layers, bidirectional, bias, proj_size, cell_clip,
                       dropout, dtype=dtype, recurrent_dropout=recurrent_dropout,
                       weight_dropout=weight_dropout, zoneout=zoneout, zoneout_cell=zoneout_cell,
                       peepholes=peepholes, layer_norm=layer_norm, layer_norm_eps=layer_norm_eps)
        super().__init__(spec, batch_first=batch_first, seed=seed, xp=xp, engine=engine)


class GRU(_Recurrent):
    """A stacked GRU; ``reset_after=True`` is the cuDNN/PyTorch variant. Cell variants as :class:`LSTM`'s
    (``recurrent_dropout``, ``weight_dropout``, ``zoneout``, ``layer_norm``)."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, *, bias: bool | str = True,
                 bidirectional: bool = False, reset_after: bool = True, dropout: float = 0.0,
                 recurrent_dropout: float = 0.0, weight_dropout: float = 0.0, zoneout: float = 0.0,
                 layer_norm: bool = False, layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 dtype: str = "float32", seed: int | None = 0, xp: ModuleType = np, engine: str = "auto"):
        spec = RNNSpec("gru", input_size, hidden_size, num_layers, bidirectional, bias, dropout=dropout,
                       reset_after=reset_after, dtype=dtype, recurrent_dropout=recurrent_dropout,
                       weight_dropout=weight_dropout, zoneout=zoneout, layer_norm=layer_norm,
                       layer_norm_eps=layer_norm_eps)
        super().__init__(spec, batch_first=batch_first, seed=seed, xp=xp, engine=engine)


class RNN(_Recurrent):
    """A stacked Elman RNN with ``nonlinearity`` ``"tanh"`` or ``"relu"``. Cell variants as :class:`LSTM`'s
    (``recurrent_dropout``, ``weight_dropout``, ``zoneout``, ``layer_norm``)."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, *, nonlinearity: str = "tanh",
                 bias: bool | str = True, bidirectional: bool = False, dropout: float = 0.0,
                 recurrent_dropout: float = 0.0, weight_dropout: float = 0.0, zoneout: float = 0.0,
                 layer_norm: bool = False, layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 dtype: str = "float32", seed: int | None = 0, xp: ModuleType = np, engine: str = "auto"):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNN: nonlinearity = {nonlinearity!r}; expected 'tanh' or 'relu'")
        spec = RNNSpec(f"rnn_{nonlinearity}", input_size, hidden_size, num_layers, bidirectional, bias,
                       dropout=dropout, dtype=dtype, recurrent_dropout=recurrent_dropout,
                       weight_dropout=weight_dropout, zoneout=zoneout, layer_norm=layer_norm,
                       layer_norm_eps=layer_norm_eps)
        super().__init__(spec, batch_first=batch_first, seed=seed, xp=xp, engine=engine)
