"""``rnn_forward`` / ``rnn_backward``: a whole sequence through every layer and direction in one call.

This is the frontend every engine shares. It validates the inputs (before an engine is chosen),
describes the call (:class:`~arrayrnn.engines.base.Call`) to :func:`~arrayrnn.engines.select_engine`,
has that engine convert the params to its weight format if they are in another one (once per call, with
a one-time :class:`~arrayrnn.core.errors.FormatConversionWarning`; the gradient is converted back), has
it take its one copy of ``x`` (``engine.take_input``: a gather into the order it computes in, zero at
padding), draws the dropout masks on the arrays' device (:mod:`arrayrnn.frontend.dropout`) and runs the
engine. Semantics per row ``b`` with ``len_b >= 1`` equal PyTorch's ``nn.LSTM/GRU/RNN`` on
``pack_padded_sequence(x, lengths, enforce_sorted=False)``; roughly::

    for l in layers:                       # input of l > 0: output of l-1 (times the dropout mask)
        for d in directions:               # d = 1 runs t = len_b - 1 .. 0
            h, c = h0[l*D+d, b], c0[l*D+d, b]
            for t in steps of row b:       # t < len_b only
                h, c = cell(x_l[t, b], h, c);  y_l[t, b, d] = h
            h_n[l*D+d, b], c_n[l*D+d, b] = h, c

Outputs past a row's end are zero; a row of length 0 has zero outputs and ``h_n = h0``, ``c_n = c0``.

``rnn_backward`` runs the engine's hand-written BPTT. After a ``training=False`` forward (which keeps no
cache) it first recomputes the forward with the cache from the inputs the result references (``x``,
``h0``, ``c0`` and the params), then runs the backward: backward after inference works, at the cost of
one more forward. The result keeps its own copies of ``x``, ``h0``, ``c0``; updating the params in
place between forward and backward is detected and raises (:mod:`arrayrnn.frontend.guard`), so step the
optimizer after ``rnn_backward``. Do not write into ``res.y`` before the backward (the engine may keep
it as its residual).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.backend import as_array, device_id, get_xp, on_device, to_host
from ..core.errors import FormatConversionWarning
from ..core.params import PackedParams
from ..core.spec import RNNSpec, check_flag, check_seed
from ..engines import one_step_forward, select_engine, serves_one_step
from ..engines.base import Call, Engine
from . import guard
from .dropout import cell_masks, dropout_masks

Array = Any


@dataclass(eq=False, slots=True)
class _Saved:
    """What ``rnn_backward`` needs from the forward call (the caller's row order and layout)."""

    engine: Engine
    run_params: PackedParams  # the params in the engine's native format (a converted copy, or the params)
    batch_first: bool
    x: Any  # the engine's take_input, for the recompute after an inference forward; else None
    lengths: np.ndarray
    h0: Array
    c0: Array | None
    masks: tuple[Array, ...] | None
    cache: Any  # None after an inference forward
    weights: guard.HostSnapshot | guard.DeviceFingerprint | None  # None inside guard.no_backward()
    variants: dict[str, Any] = field(default_factory=dict)  # cell_masks= / all_states= (only when used)


@dataclass(frozen=True, eq=False)
class RNNResult:
    """Outputs of :func:`rnn_forward` plus what :func:`rnn_backward` needs.

    ``y``: ``(T, B, D*H_out)`` (``(B, T, D*H_out)`` with ``batch_first``); ``h_n``: ``(L*D, B, H_out)``;
    ``c_n``: ``(L*D, B, C)`` for a cell with a state besides ``h``, else ``None`` (``C = spec.cell_width``:
    ``H`` for LSTM, ``(S-1)*H`` for a custom cell of ``S`` states, state ``k`` in columns ``(k-1)*H ..
    k*H``). With ``return_all_states=True``: ``h_all`` ``(L*D, T, B, H_out)`` and, for a cell with a state
    besides ``h``, ``c_all`` ``(L*D, T, B, C)``, every layer's and direction's state after every step
    (time-major whatever ``batch_first``; zeros past each row's end); else ``None``.
    """

    y: Array
    h_n: Array
    c_n: Array | None
    params: PackedParams
    training: bool
    engine: str
    _saved: _Saved = field(repr=False)
    h_all: Array | None = None
    c_all: Array | None = None


@dataclass(frozen=True, eq=False)
class RNNGrads:
    """Gradients from :func:`rnn_backward`; ``dparams`` has the params' spec, format and layout."""

    dx: Array
    dh0: Array
    dc0: Array | None
    dparams: PackedParams


def rnn_forward(params: PackedParams, x: Any, lengths: Any = None, h0: Any = None, c0: Any = None,
                batch_first: bool = False, training: bool = False, seed: int | None = None,
                engine: str = "auto", return_all_states: bool = False) -> RNNResult:
    """Run ``x`` through every layer and direction of ``params`` in one fused call.

    Parameters
    ----------
    params : PackedParams
        The stack's weights (its `RNNSpec` says mode, sizes, layers, directions and options), in the
        canonical format or an engine's own (``"cudnn"``).
    x : array
        ``(T, B, input_size)``, or ``(B, T, input_size)`` with ``batch_first``; the params' dtype and device
        (NumPy, CuPy, or any DLPack array).
    lengths : array of int, optional
        ``(B,)`` valid steps per row, each in ``0..T``, any order, host or device. Outputs past a row's end
        are zero; a zero-length row gives zero outputs and final states equal to its initial states.
    h0, c0 : array, optional
        Initial states ``(L*D, B, H_out)`` / ``(L*D, B, C)``, ``C = spec.cell_width`` (``c0`` only for a
        cell with a state besides ``h``: LSTM, a custom cell of two states or more); None means zeros.
    batch_first : bool, optional
        Whether ``x`` and ``y`` are ``(B, T, ...)``.
    training : bool, optional
        ``True`` keeps the cache for :func:`rnn_backward` and applies inter-layer dropout with masks drawn
        from ``seed`` (see :mod:`arrayrnn.frontend.dropout`); the spec's recurrent dropout and DropConnect
        act only then too, and zoneout uses its training masks (its expectation otherwise); all of them
        come from ``seed`` (:func:`arrayrnn.cell_masks`).
    seed : int, optional
        Seed of the dropout and zoneout masks (training only).
    engine : str, optional
        ``"auto"`` (the first engine that accepts the call; it never waits for a numba compile) or one of
        ``"reference"``, ``"numba"``, ``"cupy"``, ``"cudnn"``.
    return_all_states : bool, optional
        Also return every step's states ``h_all`` / ``c_all`` (see :class:`RNNResult`).

    Returns
    -------
    RNNResult
        ``y`` ``(T, B, D*H_out)`` (batch-first with ``batch_first``), ``h_n`` ``(L*D, B, H_out)``, ``c_n``
        ``(L*D, B, spec.cell_width)`` (None without a state besides ``h``), and ``h_all`` / ``c_all`` with
        ``return_all_states``.

    Raises
    ------
    ValueError
        Bad shapes or values (a 1-D or 2-D ``x``, a length out of ``0..T``, a state of the wrong shape),
        or an unknown engine name; the message names the value and what was expected.
    TypeError
        Wrong types, or inputs of mixed dtype or device (never a silent cast).
    EngineUnavailableError
        The engine asked for cannot run here (numba or CuPy not installed, no GPU, cuDNN missing).

    See Also
    --------
    rnn_backward : the hand-written backward of this call.
    cell_step : one step of the cell.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayrnn as ar
    >>> spec = ar.RNNSpec(mode="lstm", input_size=3, hidden_size=4, num_layers=2)
    >>> params = ar.PackedParams.init(spec, seed=0)
    >>> x = np.ones((5, 2, 3), dtype=np.float32)
    >>> res = ar.rnn_forward(params, x, lengths=np.array([5, 3]))
    >>> res.y.shape, res.h_n.shape, res.c_n.shape
    ((5, 2, 4), (2, 2, 4), (2, 2, 4))
    >>> float(np.abs(res.y[3:, 1]).max())  # row 1 has 3 steps
    0.0
    """
    guard.raise_pending()
    spec = _check_params(params)
    batch_first = check_flag("batch_first", batch_first, TypeError)
    training = check_flag("training", training, TypeError)
    seed = check_seed(seed)
    return_all_states = check_flag("return_all_states", return_all_states, TypeError)
    x = as_array(x, "x")
    h0 = as_array(h0, "h0") if h0 is not None else None
    c0 = as_array(c0, "c0") if c0 is not None else None
    xp = get_xp(params.data, x, h0, c0, names=("params.data", "x", "h0", "c0"))
    T, B = _check_x(spec, params, x, batch_first, xp)
    _check_state("h0", h0, spec.state_shape(B), params)
    _check_c0(spec, c0, B, params)
    host_lengths = _lengths(lengths, T, B)
    call = Call(spec=spec, xp=xp, device=device_id(params.data), seq_len=T, batch=B, training=training,
                params_format=params.format, has_zero_length=lengths is not None and not host_lengths.all(),
                all_states=return_all_states)
    chosen = select_engine(engine, call)
    run_params = _in_format(params, chosen)
    # on a GPU the fingerprint is taken after the engine's launches: the stream orders it after the forward's
    # reads of the weights, and its host work no longer delays the forward's first kernel
    weights = guard.snapshot(params.data, xp) if xp is np else None
    frozen = None
    if run_params is params and xp is np and chosen.keeps_derived_weights:  # packed once per frozen copy
        frozen = weights if weights is not None else guard.frozen_copy(params.data)
        run_params = frozen.params(params)

    with on_device(xp, call.device):
        x = chosen.take_input(x, host_lengths, batch_first)  # the one copy of x, in the engine's order
        # the result owns what its backward reads: the caller may refill h0 / c0
        zeros = not chosen.zero_states_as_none
        if h0 is not None:
            h0 = xp.array(h0, copy=True)
        elif zeros:
            h0 = _zero_state(xp, spec, B)
        if c0 is not None:
            c0 = xp.array(c0, copy=True)
        elif spec.has_cell and zeros:
            c0 = _zero_state(xp, spec, B, cell=True)
        masks = dropout_masks(spec, T, B, seed, xp) if training else None
        variants = _variant_arguments(spec, seed, B, T, training, xp, return_all_states)
    if frozen is not None and serves_one_step(chosen, call):  # a streaming call
        out = one_step_forward(chosen, run_params.data, spec, x, h0, c0, batch_first)
    else:
        out = chosen.forward(run_params, x, host_lengths, h0, c0, masks, batch_first=batch_first,
                             keep_cache=training, **variants)
    if xp is not np:
        weights = guard.snapshot(params.data, xp)
    # with a cache the engine holds its input itself; without one, the recompute needs it
    saved = _Saved(chosen, run_params, batch_first, x if out.cache is None else None, host_lengths, h0, c0,
                   masks, out.cache, weights, variants)
    return RNNResult(y=out.y, h_n=out.h_n, c_n=out.c_n, params=params, training=training, engine=chosen.name,
                     _saved=saved, h_all=out.h_all, c_all=out.c_all)


def _variant_arguments(spec: RNNSpec, seed: int | None, batch: int, seq_len: int, training: bool, xp: Any,
                       all_states: bool) -> dict[str, Any]:
    """The engine keywords of the cell variants, only those in use (an engine without variants never
    sees them)."""
    arguments: dict[str, Any] = {}
    if spec.variants:
        masks = cell_masks(spec, seed, batch, seq_len, training=training, xp=xp)
        if masks is not None:
            arguments["cell_masks"] = masks
    if all_states:
        arguments["all_states"] = True
    return arguments


def rnn_backward(res: RNNResult, dy: Any = None, dh_n: Any = None, dc_n: Any = None, *,
                 params: PackedParams | None = None, dh_all: Any = None, dc_all: Any = None) -> RNNGrads:
    """Hand-written BPTT through the call that produced ``res``.

    After a ``training=False`` forward the forward is recomputed with the cache first.

    Parameters
    ----------
    res : RNNResult
        What :func:`rnn_forward` returned.
    dy, dh_n, dc_n : array, optional
        Cotangents of ``res.y``, ``res.h_n``, ``res.c_n`` (same shapes); None means zeros.
    params : PackedParams, optional
        If given, must be the params ``res`` was computed with.
    dh_all, dc_all : array, optional
        Cotangents of ``res.h_all``, ``res.c_all`` (after a ``return_all_states=True`` forward only).

    Returns
    -------
    RNNGrads
        ``dx`` (shaped like ``x``), ``dh0`` ``(L*D, B, H_out)``, ``dc0`` (shaped like ``c0``; None without a
        state besides ``h``) and ``dparams``, a
        `PackedParams` of gradients with the params' spec, format and layout.

    Raises
    ------
    ValueError
        A cotangent of the wrong shape, ``params`` other than those of ``res``, or ``dh_all`` / ``dc_all``
        without a ``return_all_states=True`` forward.
    TypeError
        A cotangent of another dtype or device than ``res``.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayrnn as ar
    >>> spec = ar.RNNSpec(mode="gru", input_size=3, hidden_size=4)
    >>> params = ar.PackedParams.init(spec, seed=0)
    >>> x = np.ones((5, 2, 3), dtype=np.float32)
    >>> res = ar.rnn_forward(params, x, training=True)
    >>> g = ar.rnn_backward(res, dy=np.ones_like(res.y))
    >>> g.dx.shape, g.dh0.shape, g.dparams.data.shape == params.data.shape
    ((5, 2, 3), (1, 2, 4), True)
    """
    if not isinstance(res, RNNResult):
        raise TypeError(f"res has type {type(res).__name__}; expected the RNNResult returned by rnn_forward")
    guard.raise_pending()
    if params is not None:
        _check_same_params(res, params)
    spec, saved = res.params.spec, res._saved
    dy = _check_cotangent("dy", dy, res.y, "res.y")
    none_ok = saved.engine.zero_states_as_none
    dh_n = _check_cotangent("dh_n", dh_n, res.h_n, "res.h_n", none_ok)
    if dc_n is not None and res.c_n is None:
        raise ValueError(f"dc_n was given but mode = {spec.mode!r} has no cell state (no state besides h); "
                         "pass dc_n=None")
    dc_n = _check_cotangent("dc_n", dc_n, res.c_n, "res.c_n", none_ok) if res.c_n is not None else None
    all_states = _all_states_cotangents(res, dh_all, dc_all)

    guard.assert_unchanged(saved.weights, res.params.data)
    cache = saved.cache
    if cache is None:  # inference forward: recompute it with the cache, from the same weights
        cache = saved.engine.forward(saved.run_params, saved.x, saved.lengths, saved.h0, saved.c0,
                                     saved.masks, batch_first=saved.batch_first, keep_cache=True,
                                     **saved.variants).cache
    g = saved.engine.backward(cache, _contiguous(dy), dh_n, dc_n, **all_states)
    dparams = g.dparams if saved.run_params.format == res.params.format else _back_to_format(
        g.dparams, saved.engine, res.params.format)
    return RNNGrads(dx=g.dx, dh0=g.dh0, dc0=g.dc0, dparams=dparams)


def _all_states_cotangents(res: RNNResult, dh_all: Any, dc_all: Any) -> dict[str, Array]:
    """``{"dh_all": ..., "dc_all": ...}`` for the cotangents given (checked against ``res``)."""
    given = {}
    for name, value, like in (("dh_all", dh_all, res.h_all), ("dc_all", dc_all, res.c_all)):
        if value is None:
            continue
        if like is None and res.h_all is not None:
            raise ValueError(f"dc_all was given but mode = {res.params.spec.mode!r} has no cell state "
                             "(no state besides h); pass dc_all=None")
        if like is None:
            raise ValueError(f"{name} was given but res has no {name[1:]} (the forward ran with "
                             f"return_all_states=False); call rnn_forward(..., return_all_states=True)")
        given[name] = _contiguous(_check_cotangent(name, value, like, "res." + name[1:]))
    return given


# -- validation ---------------------------------------------------------------------------------
def _check_params(params: Any) -> RNNSpec:
    if not isinstance(params, PackedParams):
        raise TypeError(f"params has type {type(params).__name__}; expected an arrayrnn.PackedParams "
                        "(e.g. PackedParams.init(spec) or PackedParams(spec, buffer))")
    return params.spec


def _check_x(spec: RNNSpec, params: PackedParams, x: Array, batch_first: bool, xp: Any) -> tuple[int, int]:
    layout = "(B, T, input_size)" if batch_first else "(T, B, input_size)"
    if x.ndim != 3:
        raise ValueError(f"x has shape {tuple(x.shape)}; expected a 3-D array {layout} "
                         "(add the missing axis explicitly, e.g. x[:, None, :] for a batch of one)")
    if np.dtype(x.dtype).kind != "f" or x.dtype != params.data.dtype:
        raise TypeError(f"x has dtype {x.dtype}; expected the params' dtype {params.data.dtype} "
                        "(convert with x.astype(params.data.dtype))")
    if xp is np and spec.dtype == "float16":
        raise TypeError("float16 runs on GPU only (with float32 math); on CPU use "
                        "params.astype('float32') and x.astype('float32')")
    T, B, features = (x.shape[1], x.shape[0], x.shape[2]) if batch_first else x.shape
    if features != spec.input_size:
        raise ValueError(f"x has {features} features (shape {tuple(x.shape)}); expected "
                         f"spec.input_size = {spec.input_size} in the last axis of {layout}")
    if T == 0 or B == 0:
        raise ValueError(f"x has shape {tuple(x.shape)} with T = {T}, B = {B}; expected at least one step "
                         "and one row")
    return int(T), int(B)


def _check_state(name: str, state: Array | None, shape: tuple[int, ...], params: PackedParams) -> None:
    if state is None:
        return
    if tuple(state.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(state.shape)}; expected (num_layers * num_directions, B, "
                         f"{state_width(params.spec, cell=name == 'c0')}) = {shape}")
    if state.dtype != params.data.dtype:
        raise TypeError(f"{name} has dtype {state.dtype}; expected the params' dtype {params.data.dtype} "
                        f"(convert with {name}.astype(params.data.dtype))")


def state_width(spec: RNNSpec, cell: bool) -> str:
    """How an error message names a state's width: ``H_out`` (h), ``hidden_size`` (an LSTM's c),
    ``spec.cell_width`` (a custom cell's states besides h, side by side)."""
    if not cell:
        return "H_out"
    return "hidden_size" if spec.custom_cell is None else "spec.cell_width"


def _check_c0(spec: RNNSpec, c0: Array | None, B: int, params: PackedParams) -> None:
    if c0 is not None and not spec.has_cell:
        raise ValueError(f"c0 was given but mode = {spec.mode!r} has no cell state (no state besides h); "
                         "pass c0=None")
    _check_state("c0", c0, spec.state_shape(B, cell=True), params)


def _lengths(lengths: Any, T: int, B: int) -> np.ndarray:
    """Host int64 ``(B,)`` lengths in the caller's order (all ``T`` when ``lengths`` is None)."""
    if lengths is None:
        return np.full(B, T, dtype=np.int64)
    if isinstance(lengths, (list, tuple)):
        try:
            host = np.asarray(lengths)
        except ValueError:
            raise ValueError(f"lengths = {lengths!r} is ragged; expected one integer per row of x, "
                             f"shape ({B},)") from None
    else:
        host = to_host(as_array(lengths, "lengths"))
    if host.dtype.kind not in "iu":
        raise TypeError(f"lengths has dtype {host.dtype}; expected an integer array of shape ({B},)")
    if host.shape != (B,):
        raise ValueError(f"lengths has shape {host.shape}; expected ({B},), one length per row of x")
    bad = np.flatnonzero((host < 0) | (host > T))
    if bad.size:
        b = int(bad[0])
        raise ValueError(f"lengths[{b}] = {int(host[b])}; every length must be in 0..T = {T}")
    return host.astype(np.int64)


def _check_same_params(res: RNNResult, params: Any) -> None:
    if not isinstance(params, PackedParams):
        raise TypeError(f"params has type {type(params).__name__}; expected an arrayrnn.PackedParams")
    if params.spec != res.params.spec:
        raise ValueError(f"res was computed with spec {res.params.spec} but params has spec {params.spec}; "
                         "pass the result of rnn_forward with these params")
    if params.format != res.params.format or not _same_buffer(params.data, res.params.data):
        raise ValueError("res was computed with another params buffer (same spec, different data); "
                         "pass the params that rnn_forward was called with")


def _same_buffer(a: Array, b: Array) -> bool:
    def address(arr: Array) -> int:
        iface = getattr(arr, "__cuda_array_interface__", None) or arr.__array_interface__
        return int(iface["data"][0])

    return a is b or (a.shape == b.shape and a.dtype == b.dtype and address(a) == address(b))


def _check_cotangent(name: str, value: Any, like: Array, like_name: str,
                     none_ok: bool = False) -> Array | None:
    """``value`` checked against ``like``; ``None`` becomes zeros (stays ``None`` where ``none_ok``)."""
    if value is None:
        return None if none_ok else get_xp(like).zeros_like(like)
    if (type(value) is not type(like) or value.dtype != like.dtype
            or getattr(value, "device", None) != getattr(like, "device", None)):
        value = as_array(value, name)  # another array type, dtype or device: converted, or refused by name
        get_xp(like, value, names=(like_name, name))
    if tuple(value.shape) != tuple(like.shape):
        raise ValueError(f"{name} has shape {tuple(value.shape)}; expected {like_name}'s shape "
                         f"{tuple(like.shape)}")
    if value.dtype != like.dtype:
        raise TypeError(f"{name} has dtype {value.dtype}; expected {like_name}'s dtype {like.dtype}")
    return value


# -- layout helpers -----------------------------------------------------------------------------
def _contiguous(a: Array) -> Array:
    return a if a.flags.c_contiguous else get_xp(a).ascontiguousarray(a)


def _zero_state(xp: Any, spec: RNNSpec, B: int, cell: bool = False) -> Array:
    return xp.zeros(spec.state_shape(B, cell), dtype=spec.dtype)


_WARNED: set[tuple[str, str]] = set()


def _in_format(params: PackedParams, engine: Engine) -> PackedParams:
    """``params`` in ``engine``'s native format: themselves, or a copy converted by ``engine`` itself (warned
    once per pair of formats)."""
    target = engine.native_format
    if params.format == target:
        return params
    if (params.format, target) not in _WARNED:
        _WARNED.add((params.format, target))
        warnings.warn(f"engine {engine.name!r} reads the {target!r} weight format but params.format = "
                      f"{params.format!r}: the params are converted on every call (and their gradient "
                      f"converted back). Convert once with params = params.to_format({target!r}) (or, for a "
                      f"layer, layer.to_format({target!r}))", FormatConversionWarning, stacklevel=3)
    canonical = params if params.format == "canonical" else params.to_format("canonical")
    return canonical if target == "canonical" else engine.to_native(canonical)


def _back_to_format(grads: PackedParams, engine: Engine, format: str) -> PackedParams:
    """The engine's gradient (in its native format) in the params' ``format``."""
    canonical = grads if grads.format == "canonical" else engine.to_canonical(grads)
    return canonical if format == "canonical" else canonical.to_format(format)
