"""``rnn``: arrayrnn's fused engines as a differentiable JAX function (the ``jax`` extra; CPU).

A ``jax.custom_vjp`` whose forward and backward are host callbacks (``jax.pure_callback``) into
:func:`arrayrnn.rnn_forward` / :func:`arrayrnn.rnn_backward` (JAX's read-only buffers are copied once
per callback, see ``_writable``), so it composes with ``jax.jit`` and
``jax.grad``. Semantics roughly equal to::

    def rnn(spec, params, x, lengths=None, h0=None, c0=None):
        res = ar.rnn_forward(ar.PackedParams(spec, params), x, lengths, h0, c0)
        return res.y, res.h_n, res.c_n

The residuals kept from forward to backward are the inputs themselves (``params``, ``x``, ``lengths``,
``h0``, ``c0``: arrays, so they live happily inside ``jit``); the backward callback recomputes the forward
with the cache and then runs the hand-written BPTT. Inter-layer dropout, recurrent dropout and DropConnect
are not applied and zoneout is its expectation (forward and gradient are the inference computation,
``training=False``); use :mod:`arrayrnn.torch` or ``rnn_forward`` for the training masks.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import arrayrnn as ar
from arrayrnn.frontend import guard


def rnn(spec: ar.RNNSpec, params: Any, x: Any, lengths: Any = None, h0: Any = None,
        c0: Any = None) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """``(y, h_n, c_n)`` of the stack ``spec`` with flat canonical ``params`` on time-major ``x``, as a
    ``jax.custom_vjp`` over `arrayrnn.rnn_forward` / `arrayrnn.rnn_backward`.

    Differentiable in ``params``, ``x``, ``h0`` and ``c0``; works under ``jax.jit``, ``jax.grad`` and
    ``jax.vjp``, and under ``jax.vmap`` as a loop of calls (``vmap_method="sequential"``). Everything JAX
    knows at trace time is checked here, before any callback: types, shapes (``T`` and ``B`` at least 1),
    dtypes (float32/float64), and the ``lengths`` values when they are concrete. Only traced ``lengths``
    (under ``jit``) are checked by ``rnn_forward`` in the callback, whose error JAX re-raises wrapped in its
    runtime error.

    Parameters
    ----------
    spec : RNNSpec
        The stack (static: not traced).
    params : jax.Array
        The 1-D canonical buffer (``PackedParams.data``), ``layout_of(spec).size`` elements.
    x : jax.Array
        ``(T, B, input_size)``.
    lengths : jax.Array of int, optional
        ``(B,)`` in ``0..T``.
    h0, c0 : jax.Array, optional
        Initial states ``(L*D, B, H_out)`` / ``(L*D, B, spec.cell_width)`` (``c0`` only for a cell with a
        state besides ``h``: LSTM, a registered custom cell of two states or more, its states besides ``h``
        side by side); None means zeros.

    Returns
    -------
    y : jax.Array
        ``(T, B, D*H_out)``.
    h_n : jax.Array
        ``(L*D, B, H_out)``.
    c_n : jax.Array or None
        ``(L*D, B, spec.cell_width)``, None unless ``spec.has_cell`` (like ``rnn_forward``).

    Raises
    ------
    ValueError
        Bad shapes or concrete lengths out of range.
    TypeError
        Wrong types or dtypes.

    Examples
    --------
    >>> import jax, jax.numpy as jnp
    >>> import arrayrnn as ar
    >>> from arrayrnn.jax import rnn
    >>> spec = ar.RNNSpec(mode="gru", input_size=3, hidden_size=4)
    >>> flat = jnp.asarray(ar.PackedParams.init(spec, seed=0).data)
    >>> y, h_n, c_n = rnn(spec, flat, jnp.ones((5, 2, 3), jnp.float32))
    >>> y.shape, h_n.shape, c_n is None
    ((5, 2, 4), (1, 2, 4), True)
    >>> g = jax.grad(lambda p: rnn(spec, p, jnp.ones((5, 2, 3), jnp.float32))[0].sum())(flat)
    >>> g.shape == flat.shape
    True
    """
    if not isinstance(spec, ar.RNNSpec):
        raise TypeError(f"spec has type {type(spec).__name__}; expected an arrayrnn.RNNSpec")
    params, x = _as_array("params", params), _as_array("x", x)
    _check_static(spec, params, x)
    T, B = x.shape[:2]
    lengths = jnp.full((B,), T, jnp.int64 if jax.config.jax_enable_x64 else jnp.int32) \
        if lengths is None else _as_array("lengths", lengths)
    h0 = jnp.zeros(spec.state_shape(B), x.dtype) if h0 is None else _as_array("h0", h0)
    _check_state("h0", h0, spec.state_shape(B), x.dtype)
    _check_lengths(lengths, T, B)
    if spec.has_cell:
        c0 = jnp.zeros(spec.state_shape(B, cell=True), x.dtype) if c0 is None else _as_array("c0", c0)
        _check_state("c0", c0, spec.state_shape(B, cell=True), x.dtype)
        return _rnn(spec, params, x, lengths, h0, c0)
    if c0 is not None:
        raise ValueError(f"c0 was given for mode = {spec.mode!r}, which has no cell state (no state besides "
                         "h); pass c0=None")
    y, h_n = _rnn(spec, params, x, lengths, h0, None)
    return y, h_n, None


def _as_array(name: str, value: Any) -> jax.Array:
    """``value`` as a JAX array, or a ``TypeError`` saying what to pass."""
    if isinstance(value, ar.PackedParams):
        fix = ("pass its flat canonical buffer, params.to_format('canonical').data (the spec is rnn's first "
               "argument)") if name == "params" else "expected an array"
        raise TypeError(f"{name} is an arrayrnn.PackedParams; {fix}")
    if value is None:
        raise TypeError(f"{name} is None; expected an array")
    try:
        return jnp.asarray(value)
    except (TypeError, ValueError, RuntimeError) as e:
        raise TypeError(f"{name} ({type(value).__name__}) cannot become a JAX array: {e}; expected a JAX or "
                        f"NumPy array of float32/float64 in host memory") from None


# Shapes, dtypes and concrete values are known at trace time, so they are checked here; only traced
# lengths are left to rnn_forward inside the callback, whose ValueError then surfaces wrapped by JAX.
def _check_static(spec: ar.RNNSpec, params: jax.Array, x: jax.Array) -> None:
    size = ar.layout_of(spec).size
    if params.shape != (size,):
        raise ValueError(f"params has shape {params.shape}; expected ({size},), the flat canonical buffer "
                         f"of this spec")
    if params.dtype not in (jnp.float32, jnp.float64):
        raise TypeError(f"params has dtype {params.dtype}; expected float32 or float64 (the engines behind "
                        f"this adapter run on the CPU: convert with params.astype(jnp.float32))")
    if x.ndim != 3 or x.shape[2] != spec.input_size:
        raise ValueError(f"x has shape {x.shape}; expected (T, B, input_size = {spec.input_size})")
    if x.dtype != params.dtype:
        raise TypeError(f"x has dtype {x.dtype}; expected params' dtype {params.dtype}")
    if 0 in x.shape[:2]:
        raise ValueError(f"x has shape {x.shape} with T = {x.shape[0]}, B = {x.shape[1]}; expected at least "
                         f"one step and one row")


def _check_state(name: str, state: jax.Array, shape: tuple[int, ...], dtype: Any) -> None:
    if state.shape != shape:
        raise ValueError(f"{name} has shape {state.shape}; expected {shape}")
    if state.dtype != dtype:
        raise TypeError(f"{name} has dtype {state.dtype}; expected x's dtype {dtype}")


def _check_lengths(lengths: jax.Array, T: int, B: int) -> None:
    if lengths.shape != (B,) or not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise ValueError(f"lengths has shape {lengths.shape} and dtype {lengths.dtype}; expected "
                         f"integers of shape ({B},)")
    if isinstance(lengths, jax.core.Tracer):
        return  # values unknown until run time: rnn_forward checks them in the callback
    host = np.asarray(lengths)
    bad = np.flatnonzero((host < 0) | (host > T))
    if bad.size:
        b = int(bad[0])
        raise ValueError(f"lengths[{b}] = {int(host[b])}; every length must be in 0..T = {T}")


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _rnn(spec, params, x, lengths, h0, c0):
    return _forward_callback(spec, params, x, lengths, h0, c0)


def _rnn_fwd(spec, params, x, lengths, h0, c0):
    return _forward_callback(spec, params, x, lengths, h0, c0), (params, x, lengths, h0, c0)


def _rnn_bwd(spec, residuals, cotangents):
    params, x, lengths, h0, c0 = residuals
    inputs = (params, x, h0) + ((c0,) if c0 is not None else ())
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in inputs]
    grads = jax.pure_callback(partial(_host_backward, spec), shapes, params, x, lengths, h0, c0,
                              *cotangents, vmap_method="sequential")
    dlengths = np.zeros(lengths.shape, dtype=jax.dtypes.float0)
    dparams, dx, dh0 = grads[:3]
    return dparams, dx, dlengths, dh0, (grads[3] if c0 is not None else None)


_rnn.defvjp(_rnn_fwd, _rnn_bwd)


def _forward_callback(spec, params, x, lengths, h0, c0):
    T, B = x.shape[:2]
    out = [jax.ShapeDtypeStruct((T, B, spec.num_directions * spec.output_size), x.dtype),
           jax.ShapeDtypeStruct(h0.shape, x.dtype)]
    if c0 is not None:
        out.append(jax.ShapeDtypeStruct(c0.shape, x.dtype))
    return tuple(jax.pure_callback(partial(_host_forward, spec), out, params, x, lengths, h0, c0,
                                   vmap_method="sequential"))


def _run(spec: ar.RNNSpec, params, x, lengths, h0, c0, training: bool) -> ar.RNNResult:
    spec = spec if str(np.dtype(params.dtype)) == spec.dtype else _with_dtype(spec, params.dtype)
    return ar.rnn_forward(ar.PackedParams(spec, _writable(params)), _writable(x), np.asarray(lengths),
                          _writable(h0), None if c0 is None else _writable(c0), training=training)


def _writable(a: Any) -> np.ndarray:
    """``a`` as a NumPy array the engines may take as is.

    JAX hands callbacks read-only views of its buffers; the numba engine would compile (and cache) a
    second signature of every kernel for read-only arrays, so read-only inputs are copied here. The
    copies are O(size of the inputs), small next to the O(T * B * H^2) work of the call.
    """
    a = np.asarray(a)
    return a if a.flags.writeable else a.copy()


def _with_dtype(spec: ar.RNNSpec, dtype: Any) -> ar.RNNSpec:
    return dataclasses.replace(spec, dtype=str(np.dtype(dtype)))


def _host_forward(spec, params, x, lengths, h0, c0):
    with guard.no_backward():  # the backward runs its own forward (_host_backward)
        res = _run(spec, params, x, lengths, h0, c0, training=False)
    return (res.y, res.h_n) + ((res.c_n,) if c0 is not None else ())


def _host_backward(spec, params, x, lengths, h0, c0, dy, dh_n, dc_n=None):
    # the inference forward again (rnn_backward recomputes it with the cache): a training forward would
    # draw dropout masks and zoneout's training masks that the forward never used
    res = _run(spec, params, x, lengths, h0, c0, training=False)
    g = ar.rnn_backward(res, _writable(dy), _writable(dh_n), None if dc_n is None else _writable(dc_n))
    return (g.dparams.data, g.dx, g.dh0) + ((g.dc0,) if c0 is not None else ())
