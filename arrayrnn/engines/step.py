"""One time step of one cell (a single-layer, one-direction stack): what a cell module or a decoder loop
calls once per step, on the direction kernel of a stack engine.

A step is a sequence of length one through the stack driver's pieces, without the driver:
``direction_weights`` for the views, the input projection, ``kernel.forward`` / ``kernel.backward`` for
the recurrent product and the gate math (and their hand-written backward), and the driver's
weight-gradient products (:func:`.stack._weight_grads`) for ``dparams``. Roughly::

    xw = x @ W_ih.T + input_bias                        # (1, B, G*H)
    fwd = kernel.forward(spec, w, xw, [B], h, c)        # h', c' and the residuals
    g = kernel.backward(spec, w, fwd, h, c, 0, dh', dc')  # dpre (1, B, G*H), dh, dc
    dW_ih = dpre.T @ x;  dW_hh = dpre.T @ h;  db = dpre.sum(0);  dx = dpre @ W_ih

:class:`StepEngine` works on any stack engine (reference, cupy, numba through its generic kernel);
:class:`~.numba.step.NumbaStep` replaces the parts where per-call work dominates a step: it packs the
weights once (:meth:`StepEngine.prepare`, which the caller keeps while the weights are unchanged) and
calls the compiled loops directly. :func:`step_engine` picks one: the engine's own
(:meth:`~arrayrnn.engines.base.Engine.own_step_engine`), else a :class:`StepEngine` over a stack engine.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from ..core.backend import get_xp
from ..core.params import PackedParams
from ..core.spec import RNNSpec
from .base import DirectionForward, DirectionGrads, DirectionWeights, Engine
from .in_flight import engine_call
from .stack import StackEngine, _weight_grads, direction_weights

Array = Any


@dataclass(frozen=True, eq=False)
class StepWeights:
    """The weights of one cell as a step engine reads them: ``params`` (canonical, one layer, one
    direction: the values the step computes with), their views ``w`` and whatever the engine prepared from
    them (``packed``: the numba engine's packed matrices, filled on first use). ``source`` is the caller's
    buffer they were prepared from; ``params.data`` is ``source`` itself or, for an engine that keeps
    derived copies, a private copy of its values (:meth:`StepEngine.prepare`)."""

    params: PackedParams
    w: DirectionWeights
    packed: dict[str, np.ndarray]
    source: Array

    @property
    def spec(self) -> RNNSpec:
        return self.params.spec

    @functools.cached_property
    def xp(self) -> ModuleType:
        """The array module of the weights (NumPy or CuPy)."""
        return get_xp(self.params.data)

    @functools.cached_property
    def blocks(self) -> dict[str, tuple[slice, tuple[int, ...]]]:
        """Where each block sits in the buffer: ``{name: (slice, shape)}``."""
        return {b.name: (slice(b.offset, b.stop), b.shape) for b in self.params.layout.blocks}


class _GradBlocks:
    """A flat gradient buffer with ``PackedParams.view``'s access to its blocks (the one layer-direction of
    a cell), for the stack driver's weight-gradient code."""

    def __init__(self, data: Array, blocks: dict[str, tuple[slice, tuple[int, ...]]]):
        self.data, self._blocks = data, blocks

    def view(self, layer: int, direction: int, name: str) -> Array:
        where, shape = self._blocks[name]
        return self.data[where].reshape(shape)


@dataclass(frozen=True, eq=False)
class StepGrads:
    """Gradients of one step: ``dx (B, I)``, ``dh (B, H_out)``, ``dc (B, H)`` (LSTM, else None) and
    ``dflat``, the weights' gradient in the canonical layout (one buffer)."""

    dx: Array | None
    dh: Array
    dc: Array | None
    dflat: Array | None


def check_cell_spec(spec: RNNSpec) -> None:
    """A cell is one layer, one direction, without cell variants (they need whole sequences: masks per
    step, zoneout); ``ValueError`` naming what is not."""
    if spec.num_layers != 1 or spec.bidirectional:
        raise ValueError(f"spec has num_layers = {spec.num_layers}, bidirectional = {spec.bidirectional}; a "
                         "cell step runs one layer in one direction (num_layers=1, bidirectional=False)")
    if spec.variants or spec.dropout:
        raise ValueError(f"spec has {spec.variants or ('dropout',)}; a cell step runs plain cells (use "
                         "rnn_forward for dropout and the cell variants)")


class StepEngine:
    """One cell step on ``engine``'s direction kernel (any :class:`~.stack.StackEngine`)."""

    def __init__(self, engine: StackEngine):
        self.engine = engine
        self.name = engine.name

    def prepare(self, spec: RNNSpec, data: Array, previous: StepWeights | None = None) -> StepWeights:
        """The weights ``data`` (the canonical buffer of the cell ``spec``) for :meth:`forward` /
        :meth:`backward`. ``previous``, weights this engine prepared before, comes back as it is only while
        it holds for ``data`` (:meth:`holds`): the same spec, memory and values."""
        if previous is not None and previous.spec == spec and self.holds(previous, data):
            return previous
        return self.weights_of(spec, data)

    def weights_of(self, spec: RNNSpec, data: Array) -> StepWeights:
        """New weights over ``data``: views of the buffer itself (the summed biases are computed here)."""
        params = PackedParams(spec, data)
        return StepWeights(params, direction_weights(params, 0, 0), {}, data)

    def holds(self, sw: StepWeights, data: Array) -> bool:
        """Whether ``sw`` still holds for ``data``. Never, here: the views would read the values as they
        are, but ``w.input_bias`` (``b_ih + b_hh``) is a sum made by :meth:`weights_of`, which a write into
        a bias (an optimizer's step) leaves stale; making them again costs one small addition."""
        return False

    def steps_from_source(self, spec: RNNSpec, rows: int) -> bool:
        """Whether an inference step (``keep_cache=False``) of ``spec`` over ``rows`` rows reads the caller's
        buffer (``StepWeights.source``) as it is at the call, not what :meth:`prepare` made of it: then
        such a step needs no :meth:`prepare` (no comparison) while the buffer is the same memory. Not here
        (the summed biases are made by :meth:`weights_of`)."""
        return False

    def serves_one_step(self, spec: RNNSpec, rows: int) -> bool:
        """Whether an inference call of the stack ``spec`` over ONE time step of ``rows`` rows runs here, one
        step per layer-direction (:mod:`arrayrnn.engines.one_step`), rather than through the stack
        driver. Not here: the driver's own steps are the same work."""
        return False

    # -- forward --------------------------------------------------------------------------------------
    def forward(self, sw: StepWeights, x: Array, h: Array, c: Array | None,
                keep_cache: bool) -> DirectionForward:
        """One step from ``x (B, I)``, ``h (B, H_out)``, ``c (B, H)``: ``h_n``, ``c_n`` are the new states
        (new arrays; the inputs are not written), ``cache`` the residuals when ``keep_cache``."""
        with engine_call():  # a fork waits for it (.stack)
            xw = self.project(sw, x)
            return self.run_forward(sw, xw, h, c, keep_cache)

    def project(self, sw: StepWeights, x: Array) -> Array:
        """``x @ W_ih.T + input_bias`` as ``(1, B, G*H)``."""
        return self.engine.project_input(x[None], sw.w)

    def run_forward(self, sw: StepWeights, xw: Array, h: Array, c: Array | None, keep_cache: bool):
        return self.engine.kernel.forward(sw.spec, sw.w, xw, self._batch_sizes(xw), h, c, False, keep_cache)

    # -- backward -------------------------------------------------------------------------------------
    def backward(self, sw: StepWeights, fwd: DirectionForward, x: Array, h: Array, c: Array | None,
                 dh: Array | None, dc: Array | None, need_dx: bool = True,
                 need_weights: bool = True) -> StepGrads:
        """The step's hand-written backward for the cotangents ``dh`` (of ``fwd.h_n``) and ``dc`` (of
        ``fwd.c_n``, LSTM only), None meaning zeros; ``x``, ``h``, ``c``: the forward's inputs. ``dx`` /
        ``dflat`` are None where not ``need_dx`` / ``need_weights``."""
        with engine_call():
            return self._backward(sw, fwd, x, h, c, dh, dc, need_dx, need_weights)

    def _backward(self, sw: StepWeights, fwd: DirectionForward, x: Array, h: Array, c: Array | None,
                  dh: Array | None, dc: Array | None, need_dx: bool, need_weights: bool) -> StepGrads:
        spec, xp = sw.spec, sw.xp
        dh = dh if dh is not None else xp.zeros_like(fwd.h_n)
        if spec.has_cell and dc is None:
            dc = xp.zeros_like(fwd.c_n)
        g = self.run_backward(sw, fwd, h, c, dh, dc)
        dflat = None
        if need_weights:
            grads = _GradBlocks(xp.empty_like(sw.params.data), sw.blocks)  # every block is written below
            _weight_grads(self.matmul, spec, grads, 0, 0, sw.w, g, fwd, x[None], h[None],
                          c[None] if c is not None else None)
            dflat = grads.data
        dx = self.input_grad(sw, g.dpre_in[0]) if need_dx else None
        return StepGrads(dx, g.dh0, g.dc0, dflat)

    def run_backward(self, sw: StepWeights, fwd: DirectionForward, h: Array, c: Array | None, dh: Array,
                     dc: Array | None) -> DirectionGrads:
        dy = sw.xp.zeros_like(fwd.y)
        return self.engine.kernel.backward(sw.spec, sw.w, fwd, h[None], c[None] if c is not None else None,
                                           dy, dh, dc, self._batch_sizes(fwd.y), False)

    def matmul(self, a: Array, b: Array, out: Array | None = None) -> Array:
        """``a @ b`` for the weight gradients' products (into ``out``, a block of the gradient, if given)."""
        return self.engine.matmul(a, b, out=out)

    def input_grad(self, sw: StepWeights, dpre: Array) -> Array:
        """``dx = dpre @ W_ih`` (``dpre``: ``(B, G*H)``)."""
        return self.engine.matmul(dpre, sw.w.W_ih)

    @staticmethod
    def _batch_sizes(stack: Array) -> np.ndarray:
        return np.array([stack.shape[1]], dtype=np.int64)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


@functools.cache
def step_engine(engine: Engine) -> StepEngine:
    """The step engine over ``engine`` (an engine :func:`~arrayrnn.engines.select_engine` chose): the
    engine's own (:meth:`~arrayrnn.engines.base.Engine.own_step_engine`: numba's
    :class:`~arrayrnn.engines.numba.step.NumbaStep`), else a :class:`StepEngine` over a stack engine;
    ``ValueError`` for an engine that runs whole sequences only (cuDNN)."""
    own = engine.own_step_engine()
    if own is not None:
        return own
    if not isinstance(engine, StackEngine):
        raise ValueError(f"engine = {engine.name!r} runs whole sequences only; a cell step runs on the "
                         "numba, cupy or reference engine (or engine='auto')")
    return StepEngine(engine)


__all__ = ["StepEngine", "StepGrads", "StepWeights", "check_cell_spec", "step_engine"]
