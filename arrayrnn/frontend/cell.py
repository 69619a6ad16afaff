"""``cell_step`` / ``cell_step_backward``: one time step of one cell, for loops written by the caller.

A decoder with attention, a sampler, a model that feeds each output back as the next input: the loop
is the caller's, and each call is one step of a single-layer, one-direction cell (``nn.LSTMCell``'s
counterpart on NumPy and CuPy arrays)::

    res = ar.cell_step(params, x, h, c)            # x (B, I), h (B, H_out), c (B, C): res.h, res.c
    g = ar.cell_step_backward(res, dh, dc)         # g.dx, g.dh, g.dc, g.dparams (one flat buffer)

``params`` is a :class:`~arrayrnn.PackedParams` of a cell spec (``num_layers=1``, one direction, no
dropout or cell variants; every mode, bias mode, ``proj_size``, ``cell_clip`` and the reset-before GRU),
so the canonical layout is ``W_ih, W_hh, b_ih, b_hh`` (``nn.LSTMCell``'s parameters in order); a
registered custom cell too (``C = spec.cell_width``: ``H`` for LSTM, ``(S-1)*H`` for a custom cell of ``S``
states, its states besides ``h`` side by side). The step
runs on the engine's fused step (:mod:`arrayrnn.engines.step`: the numba engine's compiled loops on
CPU, the CuPy engine's kernels on GPU) and its hand-written backward; the numba engine packs the weights
on each call (a cell module that knows when its weights change keeps them packed: ``arrayrnn.torch``'s
cells). As with :func:`~arrayrnn.rnn_backward`, a backward after a ``training=False`` step recomputes
the step first, and an in-place change of ``params.data`` between the two raises; do not write into
``res.h`` / ``res.c`` before the backward (an engine may keep them as residuals).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.backend import as_array, device_id, get_xp, on_device
from ..core.params import PackedParams
from ..core.spec import RNNSpec, check_flag
from ..engines import (
    DirectionForward,
    StepEngine,
    StepWeights,
    check_cell_spec,
    probe_call,
    select_engine,
    step_engine,
)
from . import guard
from .rnn import _check_cotangent, _check_params, state_width

Array = Any


@dataclass(frozen=True, eq=False)
class _StepSaved:
    """What ``cell_step_backward`` needs: the step engine, its weights and the step's own inputs."""

    engine: StepEngine
    weights: StepWeights
    x: Array
    h: Array
    c: Array | None
    fwd: DirectionForward  # its cache is None after an inference step
    weights_then: guard.HostSnapshot | guard.DeviceFingerprint | None  # None inside guard.no_backward()


@dataclass(frozen=True, eq=False)
class CellResult:
    """The new states of :func:`cell_step`: ``h (B, H_out)``, ``c (B, spec.cell_width)`` (None without a
    state besides ``h``)."""

    h: Array
    c: Array | None
    params: PackedParams
    training: bool
    engine: str
    _saved: _StepSaved = field(repr=False)


@dataclass(frozen=True, eq=False)
class CellGrads:
    """Gradients from :func:`cell_step_backward`; ``dparams`` has the params' spec and layout."""

    dx: Array
    dh: Array
    dc: Array | None
    dparams: PackedParams


def cell_step(params: PackedParams, x: Any, h: Any = None, c: Any = None, *, training: bool = False,
              engine: str = "auto") -> CellResult:
    """One step of the cell ``params`` (one layer, one direction) from the input and the states.

    Parameters
    ----------
    params : PackedParams
        A single-layer, unidirectional stack's weights.
    x : array
        ``(B, input_size)``, the params' dtype and device.
    h, c : array, optional
        States ``(B, H_out)`` and ``(B, spec.cell_width)`` (``c`` only for a cell with a state besides
        ``h``: LSTM, a custom cell of two states or more); None means zeros.
    training : bool, optional
        ``True`` keeps the residuals for :func:`cell_step_backward`.
    engine : str, optional
        ``"auto"`` or an engine name (``"numba"``, ``"cupy"``, ``"reference"``).

    Returns
    -------
    CellResult
        The new states ``h`` ``(B, H_out)`` and ``c`` ``(B, spec.cell_width)`` (None without a state
        besides ``h``).

    Raises
    ------
    ValueError
        Bad shapes, a stack of more than one layer or direction, or an unknown engine.
    TypeError
        Wrong types, or inputs of mixed dtype or device.
    EngineUnavailableError
        The engine asked for cannot run here.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayrnn as ar
    >>> params = ar.PackedParams.init(ar.RNNSpec(mode="lstm", input_size=3, hidden_size=4), seed=0)
    >>> step = ar.cell_step(params, np.ones((2, 3), dtype=np.float32))
    >>> step.h.shape, step.c.shape
    ((2, 4), (2, 4))
    """
    guard.raise_pending()
    spec = _check_params(params)
    check_cell_spec(spec)
    if params.format != "canonical":
        raise ValueError(f"params.format = {params.format!r}; a cell step reads the canonical layout "
                         "(params.to_format('canonical'))")
    training = check_flag("training", training, TypeError)
    x = as_array(x, "x")
    h = as_array(h, "h") if h is not None else None
    c = as_array(c, "c") if c is not None else None
    xp = get_xp(params.data, x, h, c, names=("params.data", "x", "h", "c"))
    B = _check_x(spec, params, x)
    h = _state(xp, "h", h, (B, spec.output_size), params)
    if c is not None and not spec.has_cell:
        raise ValueError(f"c was given but mode = {spec.mode!r} has no cell state (no state besides h); "
                         "pass c=None")
    c = _state(xp, "c", c, (B, spec.cell_width), params) if spec.has_cell else None
    call = probe_call(spec, xp, device=device_id(params.data), batch=B, training=training)
    stepper = step_engine(select_engine(engine, call))
    with on_device(xp, call.device):
        weights = stepper.prepare(spec, params.data)
        fwd = stepper.forward(weights, x, h, c, keep_cache=training)
        # the result owns what its backward reads: the caller may refill x, h, c
        saved = _StepSaved(stepper, weights, xp.array(x, copy=True), xp.array(h, copy=True),
                           xp.array(c, copy=True) if c is not None else None, fwd,
                           guard.snapshot(params.data, xp))
    return CellResult(fwd.h_n, fwd.c_n, params, training, stepper.name, saved)


def cell_step_backward(res: CellResult, dh: Any = None, dc: Any = None) -> CellGrads:
    """The hand-written backward of the step that produced ``res``.

    Parameters
    ----------
    res : CellResult
        What :func:`cell_step` returned (``training=True`` keeps the residuals the backward uses).
    dh, dc : array, optional
        Cotangents of ``res.h`` ``(B, H_out)`` and ``res.c`` ``(B, spec.cell_width)`` (a cell with a state
        besides ``h`` only); None means zeros.

    Returns
    -------
    CellGrads
        ``dx`` ``(B, input_size)``, ``dh`` and ``dc`` (of the step's input states) and ``dparams``.

    Raises
    ------
    ValueError
        A cotangent of the wrong shape.
    TypeError
        A cotangent of another dtype or device than the step's states.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayrnn as ar
    >>> params = ar.PackedParams.init(ar.RNNSpec(mode="gru", input_size=3, hidden_size=4), seed=0)
    >>> step = ar.cell_step(params, np.ones((2, 3)).astype(np.float32), training=True)
    >>> g = ar.cell_step_backward(step, dh=np.ones((2, 4), dtype=np.float32))
    >>> g.dx.shape, g.dh.shape, g.dc is None
    ((2, 3), (2, 4), True)
    """
    if not isinstance(res, CellResult):
        raise TypeError(f"res has type {type(res).__name__}; expected the CellResult returned by cell_step")
    guard.raise_pending()
    saved, spec = res._saved, res.params.spec
    dh = _check_cotangent("dh", dh, res.h, "res.h")
    if dc is not None and res.c is None:
        raise ValueError(f"dc was given but mode = {spec.mode!r} has no cell state (no state besides h); "
                         "pass dc=None")
    dc = _check_cotangent("dc", dc, res.c, "res.c") if res.c is not None else None
    guard.assert_unchanged(saved.weights_then, res.params.data)
    fwd, weights = saved.fwd, saved.weights
    if fwd.cache is None:  # an inference step: recompute it with the residuals, from the same weights
        fwd = saved.engine.forward(weights, saved.x, saved.h, saved.c, keep_cache=True)
    g = saved.engine.backward(weights, fwd, saved.x, saved.h, saved.c, dh, dc)
    return CellGrads(g.dx, g.dh, g.dc, PackedParams(spec, g.dflat))


def _check_x(spec: RNNSpec, params: PackedParams, x: Array) -> int:
    if x.ndim != 2 or x.shape[1] != spec.input_size:
        raise ValueError(f"x has shape {tuple(x.shape)}; expected a 2-D array (B, input_size = "
                         f"{spec.input_size}) (one step; a sequence goes to rnn_forward)")
    _check_dtype("x", x, params)
    if x.shape[0] == 0:
        raise ValueError(f"x has shape {tuple(x.shape)}; expected at least one row")
    return int(x.shape[0])


def _state(xp: Any, name: str, state: Array | None, shape: tuple[int, int], params: PackedParams) -> Array:
    """``state`` checked against ``shape`` and the params' dtype, or zeros."""
    if state is None:
        return xp.zeros(shape, dtype=params.data.dtype)
    if tuple(state.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(state.shape)}; expected (B, "
                         f"{state_width(params.spec, cell=name == 'c')}) = {shape}")
    _check_dtype(name, state, params)
    return state


def _check_dtype(name: str, a: Array, params: PackedParams) -> None:
    if a.dtype != params.data.dtype:
        raise TypeError(f"{name} has dtype {a.dtype}; expected the params' dtype {params.data.dtype} "
                        f"(convert with {name}.astype(params.data.dtype))")
    if np.dtype(a.dtype) == np.float16:
        raise TypeError("a cell step runs float32 and float64; convert the params and arrays with "
                        "astype('float32')")
