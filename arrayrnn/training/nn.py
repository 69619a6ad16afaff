"""Thin layers: ``LSTM``, ``GRU``, ``RNN``, ``Recurrent`` (any registered cell), ``Dense``, ``Embedding``.

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

    Initialized like PyTorch's ``nn.Linear``: ``uniform(-1/sqrt(in), 1/sqrt(in))`` for both. Calling
    ``layer(x)`` maps ``x`` ``(..., in_features)`` to ``(..., out_features)``; ``layer.apply(params, x)`` does
    it with another (e.g. traced) buffer.

    Parameters
    ----------
    in_features, out_features : int
        Sizes of the input's last axis and of the output's.
    activation : str or Activation, optional
        Applied after the product (a name of :mod:`arrayrnn.activations` or an ``Activation``).
    bias : bool, optional
        Whether ``b`` exists.
    seed : int or None, optional
        Seed of the initial weights.
    dtype : str, optional
        ``"float32"`` or ``"float64"`` (``"float16"`` on GPU).
    xp : module, optional
        ``numpy`` or ``cupy``.

    Attributes
    ----------
    params : array
        The flat buffer ``(out*in + out,)`` (``(out*in,)`` without bias).

    Raises
    ------
    ValueError
        A size below 1 or an unknown activation.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayrnn as ar
    >>> head = ar.nn.Dense(8, 3, activation="tanh")
    >>> head.params.shape, head(np.ones((5, 8), dtype=np.float32)).shape
    ((27,), (5, 3))
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
        """The weight matrix ``(out_features, in_features)``, a view of `params`."""
        return self.unpack(self.params)[0]

    @property
    def b(self) -> Any:
        """The bias ``(out_features,)``, a view of `params`; None without bias."""
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
        """``activation(x @ W.T + b)`` with the weights in ``params`` (this layer's `params` or the traced
        buffer `arrayrnn.value_and_grad` passes): ``x`` ``(..., in_features)`` -> ``(..., out_features)``.
        """
        W, b = self.unpack(params)
        return dense_bias_act(self.activation, W, x, b)

    def __call__(self, x: Any) -> Any:
        return self.apply(self.params, x)

    def __repr__(self) -> str:
        return (f"Dense({self.in_features}, {self.out_features}, activation={self.activation.name!r}, "
                f"bias={self.bias}, dtype={self.dtype})")


class Embedding:
    """A ``(num_embeddings, embedding_dim)`` table; ``layer(ids)`` / ``apply(table, ids)`` gathers rows.

    Initialised from ``N(0, 1)`` like PyTorch. Repeated ids accumulate their gradients.

    Parameters
    ----------
    num_embeddings, embedding_dim : int
        Rows and columns of the table.
    seed : int or None, optional
        Seed of the initial table.
    dtype : str, optional
        ``"float32"`` or ``"float64"`` (``"float16"`` on GPU).
    xp : module, optional
        ``numpy`` or ``cupy``.

    Attributes
    ----------
    params : array
        The table ``(num_embeddings, embedding_dim)``.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayrnn as ar
    >>> emb = ar.nn.Embedding(10, 4)
    >>> emb(np.array([[1, 2, 2]])).shape
    (1, 3, 4)
    """

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
        """The rows of ``params`` (``(num_embeddings, embedding_dim)``) at the integer ``ids``: ``ids`` of any
        shape -> ``ids.shape + (embedding_dim,)``; a ``ValueError`` for an id out of range.
        """
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
        """``(y, h_n, c_n)`` (``c_n`` None without a state besides ``h``); shapes and semantics of
        ``ar.rnn_forward``.
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
        """Zero ``(h0, c0)`` for ``batch_size`` rows (``c0`` ``(L*D, B, spec.cell_width)``, None without a
        state besides ``h``)."""
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

    Calling ``layer(x, lengths=None, h0=None, c0=None)`` (or ``layer.apply(params, x, ...)`` inside
    `arrayrnn.value_and_grad`) returns ``(y, h_n, c_n)`` with the shapes and semantics of
    `arrayrnn.rnn_forward`. The layer is stateless: the caller carries the state.

    Parameters
    ----------
    input_size, hidden_size : int
        Features of ``x`` and of the cell state.
    num_layers : int, optional
        Stacked layers.
    bias : bool or str, optional
        A bias mode of `arrayrnn.RNNSpec` (``True`` = both biases).
    bidirectional : bool, optional
        Add a reverse direction (``y`` has ``2 * H_out`` features).
    proj_size : int, optional
        LSTM projection of ``h`` to ``proj_size`` features (0: none).
    cell_clip : float or (float, float), optional
        Clip the cell state to ``(lo, hi)``.
    dropout : float, optional
        Dropout between layers, under differentiation.
    recurrent_dropout, weight_dropout, zoneout : float, optional
        Cell variants (`arrayrnn.RNNSpec`'s fields of the same names): dropout of the recurrent ``h``,
        DropConnect on ``W_hh``, zoneout of ``h``; they act under differentiation (training).
    layer_norm : bool, optional
        Layer normalisation inside the recurrence (gains in the one buffer).
    layer_norm_eps : float, optional
        Its epsilon.
    zoneout_cell : float, optional
        Zoneout of ``c`` (default ``zoneout``); zoneout's expectation applies outside training.
    peepholes : bool, optional
        Peephole connections (view ``"P"``).
    batch_first : bool, optional
        ``x`` and ``y`` are ``(B, T, ...)`` instead of ``(T, B, ...)``.
    dtype : str, optional
        ``"float32"``, ``"float64"`` or (GPU) ``"float16"``.
    seed : int or None, optional
        Seed of the initial weights (PyTorch's uniform(-1/sqrt(H), 1/sqrt(H))).
    xp : module, optional
        ``numpy`` or ``cupy``: where the weights live.
    engine : str, optional
        The engine of every call (``"auto"`` or a name, as in `arrayrnn.rnn_forward`).

    Attributes
    ----------
    params : PackedParams
        All the layer's weights in one flat buffer; differentiate and optimise this.
    spec : RNNSpec
        The stack's configuration.

    Raises
    ------
    ValueError
        A configuration `arrayrnn.RNNSpec` refuses, or an unknown engine name.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayrnn as ar
    >>> lstm = ar.nn.LSTM(3, 4, num_layers=2, bidirectional=True)
    >>> y, h_n, c_n = lstm(np.ones((5, 2, 3), dtype=np.float32))
    >>> y.shape, h_n.shape, c_n.shape
    ((5, 2, 8), (4, 2, 4), (4, 2, 4))
    """

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
    """A stacked GRU; ``reset_after=True`` is the cuDNN/PyTorch variant.

    Calling ``layer(x, lengths=None, h0=None, c0=None)`` (or ``layer.apply(params, x, ...)`` inside
    `arrayrnn.value_and_grad`) returns ``(y, h_n, c_n)`` with the shapes and semantics of
    `arrayrnn.rnn_forward`. The layer is stateless: the caller carries the state. ``c_n`` is None.

    Parameters
    ----------
    input_size, hidden_size : int
        Features of ``x`` and of the state.
    num_layers : int, optional
        Stacked layers.
    bias : bool or str, optional
        A bias mode of `arrayrnn.RNNSpec` (``True`` = both biases).
    bidirectional : bool, optional
        Add a reverse direction.
    reset_after : bool, optional
        False is the reset-before variant (Keras ``reset_after=False``).
    dropout : float, optional
        Dropout between layers, under differentiation.
    recurrent_dropout, weight_dropout, zoneout : float, optional
        Cell variants (`arrayrnn.RNNSpec`'s fields of the same names): dropout of the recurrent ``h``,
        DropConnect on ``W_hh``, zoneout of ``h``; they act under differentiation (training).
    layer_norm : bool, optional
        Layer normalisation inside the recurrence (gains in the one buffer).
    layer_norm_eps : float, optional
        Its epsilon.
    batch_first : bool, optional
        ``x`` and ``y`` are ``(B, T, ...)`` instead of ``(T, B, ...)``.
    dtype : str, optional
        ``"float32"``, ``"float64"`` or (GPU) ``"float16"``.
    seed : int or None, optional
        Seed of the initial weights (PyTorch's uniform(-1/sqrt(H), 1/sqrt(H))).
    xp : module, optional
        ``numpy`` or ``cupy``: where the weights live.
    engine : str, optional
        The engine of every call (``"auto"`` or a name, as in `arrayrnn.rnn_forward`).

    Attributes
    ----------
    params : PackedParams
        All the layer's weights in one flat buffer; differentiate and optimise this.
    spec : RNNSpec
        The stack's configuration.

    Raises
    ------
    ValueError
        A configuration `arrayrnn.RNNSpec` refuses, or an unknown engine name.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayrnn as ar
    >>> gru = ar.nn.GRU(3, 4, batch_first=True)
    >>> y, h_n, c_n = gru(np.ones((2, 5, 3), dtype=np.float32), lengths=np.array([5, 2]))
    >>> y.shape, h_n.shape, c_n is None
    ((2, 5, 4), (1, 2, 4), True)
    """

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
    """A stacked Elman RNN with ``nonlinearity`` ``"tanh"`` or ``"relu"``.

    Calling ``layer(x, lengths=None, h0=None, c0=None)`` (or ``layer.apply(params, x, ...)`` inside
    `arrayrnn.value_and_grad`) returns ``(y, h_n, c_n)`` with the shapes and semantics of
    `arrayrnn.rnn_forward`. The layer is stateless: the caller carries the state. ``c_n`` is None.

    Parameters
    ----------
    input_size, hidden_size : int
        Features of ``x`` and of the state.
    num_layers : int, optional
        Stacked layers.
    nonlinearity : str, optional
        ``"tanh"`` or ``"relu"``.
    bias : bool or str, optional
        A bias mode of `arrayrnn.RNNSpec` (``True`` = both biases).
    bidirectional : bool, optional
        Add a reverse direction.
    dropout : float, optional
        Dropout between layers, under differentiation.
    recurrent_dropout, weight_dropout, zoneout : float, optional
        Cell variants (`arrayrnn.RNNSpec`'s fields of the same names): dropout of the recurrent ``h``,
        DropConnect on ``W_hh``, zoneout of ``h``; they act under differentiation (training).
    layer_norm : bool, optional
        Layer normalisation inside the recurrence (gains in the one buffer).
    layer_norm_eps : float, optional
        Its epsilon.
    batch_first : bool, optional
        ``x`` and ``y`` are ``(B, T, ...)`` instead of ``(T, B, ...)``.
    dtype : str, optional
        ``"float32"``, ``"float64"`` or (GPU) ``"float16"``.
    seed : int or None, optional
        Seed of the initial weights (PyTorch's uniform(-1/sqrt(H), 1/sqrt(H))).
    xp : module, optional
        ``numpy`` or ``cupy``: where the weights live.
    engine : str, optional
        The engine of every call (``"auto"`` or a name, as in `arrayrnn.rnn_forward`).

    Attributes
    ----------
    params : PackedParams
        All the layer's weights in one flat buffer; differentiate and optimise this.
    spec : RNNSpec
        The stack's configuration.

    Raises
    ------
    ValueError
        A configuration `arrayrnn.RNNSpec` refuses, or an unknown engine name.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayrnn as ar
    >>> rnn = ar.nn.RNN(3, 4, nonlinearity="relu")
    >>> y, h_n, _ = rnn(np.ones((5, 2, 3), dtype=np.float32))
    >>> y.shape, h_n.shape
    ((5, 2, 4), (1, 2, 4))
    """

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


class Recurrent(_Recurrent):
    """A stacked recurrent layer of any mode: a cell registered with `arrayrnn.register_cell` (or a
    built-in mode, with the built-in layers' common options only).

    Calling ``layer(x, lengths=None, h0=None, c0=None)`` (or ``layer.apply(params, x, ...)`` inside
    `arrayrnn.value_and_grad`) returns ``(y, h_n, c_n)`` with the shapes and semantics of
    `arrayrnn.rnn_forward`; the caller carries the state as for `LSTM`. ``c_n`` holds the cell's states
    besides ``h`` side by side, ``(L*D, B, spec.cell_width)`` (state ``k >= 1`` in columns
    ``(k-1)*H .. k*H``), and is None for a cell whose only state is ``h``.

    Parameters
    ----------
    mode : str
        The name of a registered cell (``"cifg"``, or one of your own), or a built-in mode.
    input_size, hidden_size : int
        Features of ``x`` and of each state.
    num_layers : int, optional
        Stacked layers.
    bias : bool or str, optional
        A bias mode of `arrayrnn.RNNSpec` (``True`` = both biases).
    bidirectional : bool, optional
        Add a reverse direction.
    dropout : float, optional
        Dropout between layers, under differentiation.
    recurrent_dropout, weight_dropout : float, optional
        Dropout of the recurrent ``h`` and DropConnect on ``W_hh`` (`arrayrnn.RNNSpec`'s fields); they act
        under differentiation (training).
    batch_first : bool, optional
        ``x`` and ``y`` are ``(B, T, ...)`` instead of ``(T, B, ...)``.
    dtype : str, optional
        ``"float32"``, ``"float64"`` or (GPU) ``"float16"``.
    seed : int or None, optional
        Seed of the initial weights (uniform(-1/sqrt(H), 1/sqrt(H)), as the built-ins).
    xp : module, optional
        ``numpy`` or ``cupy``: where the weights live.
    engine : str, optional
        The engine of every call (``"auto"`` or a name, as in `arrayrnn.rnn_forward`).

    Attributes
    ----------
    params : PackedParams
        All the layer's weights in one flat buffer (``W_ih``, ``W_hh``, ``b_ih``, ``b_hh`` per layer and
        direction, G gate blocks of H rows); differentiate and optimise this.
    spec : RNNSpec
        The stack's configuration.

    Raises
    ------
    ValueError
        An unregistered mode (the message lists the registered cells) or a configuration
        `arrayrnn.RNNSpec` refuses; an unknown engine name.
    TypeError
        ``mode`` is not a string.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayrnn as ar
    >>> cifg = ar.nn.Recurrent("cifg", 3, 4, num_layers=2)
    >>> y, h_n, c_n = cifg(np.ones((5, 2, 3), dtype=np.float32))
    >>> y.shape, h_n.shape, c_n.shape
    ((5, 2, 4), (2, 2, 4), (2, 2, 4))
    >>> y, h_n, c_n = cifg(np.ones((5, 2, 3), dtype=np.float32), h0=h_n, c0=c_n)  # carry the state on
    """

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1, *,
                 bias: bool | str = True, bidirectional: bool = False, dropout: float = 0.0,
                 recurrent_dropout: float = 0.0, weight_dropout: float = 0.0, batch_first: bool = False,
                 dtype: str = "float32", seed: int | None = 0, xp: ModuleType = np, engine: str = "auto"):
        if not isinstance(mode, str):
            raise TypeError(f"Recurrent: mode = {mode!r} has type {type(mode).__name__}; expected a str, the "
                            "name of a registered cell (arrayrnn.registered_cells()) or a built-in mode")
        spec = RNNSpec(mode, input_size, hidden_size, num_layers, bidirectional, bias, dropout=dropout,
                       dtype=dtype, recurrent_dropout=recurrent_dropout, weight_dropout=weight_dropout)
        super().__init__(spec, batch_first=batch_first, seed=seed, xp=xp, engine=engine)
