"""``rnn_forward`` over ONE time step, as one fused cell step per layer-direction.

A streaming call (``T = 1``, inference) spends most of its time in the stack driver's per-call Python (the
batch order, the plan, each direction's loop buffers and bundles), not in its arithmetic. Where the
engine's own step engine (:class:`~arrayrnn.engines.numba.step.NumbaStep`) serves such a call
(:meth:`~arrayrnn.engines.step.StepEngine.serves_one_step`: the driver would run all of it on one thread), the
frontend runs it through :func:`one_step_forward` instead, on step weights made once per frozen copy of
``params.data`` (:mod:`.derived`) and each thread's kept one-step loops. Semantics roughly equal to::

    inp = x[0]                                      # (B, I): every row has its one step
    for layer in range(L):
        outs = [cell(inp, h0[layer*D + d], c0[layer*D + d]) for d in range(D)]  # the reverse direction
        inp = concatenate([h for h, c in outs], axis=1)      # of one step: a step from its own state
    y = inp[None]; h_n, c_n = stack of every (h, c)

which is what the stack driver computes for ``T = 1``, bit for bit: the same cell loops (compiled once for
both) and the same packed products (a step over a frozen copy never reads the weights as they lie through
the row-dot kernel, which would round a row otherwise).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.layout import layout_of
from ..core.params import PackedParams
from ..core.spec import RNNSpec
from . import derived
from .base import Call, Engine, StackForward
from .stack import SortedInput, direction_weights
from .step import StepEngine, StepWeights, step_engine

Array = Any


def serves_one_step(engine: Engine, call: Call) -> bool:
    """Whether :func:`one_step_forward` runs ``call`` on ``engine``: one time step of every row (no zero
    length), inference, no cell variants nor ``return_all_states``, NumPy in the canonical format, on an
    engine whose step engine serves it (numba's, where its driver would run the call on one thread)."""
    spec = call.spec
    return (call.seq_len == 1 and not call.training and not call.has_zero_length and not call.all_states
            and call.xp is np and call.params_format == "canonical" and engine.keeps_derived_weights
            and not spec.variants
            and step_engine(engine).serves_one_step(spec, call.batch))


def one_step_forward(engine: Engine, frozen: np.ndarray, spec: RNNSpec, x: SortedInput, h0: Array,
                     c0: Array | None, batch_first: bool) -> StackForward:
    """The stack ``spec``'s forward over one step (no cache) of ``x``, the engine's copy of the input (its
    ``take_input``: every row full, so the caller's order), from ``h0`` / ``c0`` (``(L*D, B, .)`` arrays), on
    ``frozen``, a frozen canonical buffer of ``spec`` (the guard's private copy of ``params.data``)."""
    stepper, D = step_engine(engine), spec.num_directions
    states, inp = [], x.x[0]
    for layer in range(spec.num_layers):
        outs = [stepper.forward(_weights(stepper, spec, frozen, layer, d), inp, h0[k],
                                c0[k] if c0 is not None else None, keep_cache=False)
                for d, k in enumerate(range(layer * D, (layer + 1) * D))]
        states += outs
        inp = outs[0].h_n if D == 1 else np.concatenate([out.h_n for out in outs], axis=1)
    h_n = np.stack([out.h_n for out in states])
    c_n = np.stack([out.c_n for out in states]) if c0 is not None else None
    return StackForward(inp[:, None] if batch_first else inp[None], h_n, c_n, None)


def _weights(stepper: StepEngine, spec: RNNSpec, frozen: np.ndarray, layer: int, direction: int
             ) -> StepWeights:
    """The step weights of one layer-direction: views of its contiguous part of ``frozen`` (which never
    changes, so they are made once per frozen buffer and never compared)."""

    def make() -> StepWeights:
        cell = spec.replace(num_layers=1, bidirectional=False, dropout=0.0,
                            input_size=spec.layer_input_size(layer))
        first = layout_of(spec).block(layer, direction, "W_ih").offset
        part = frozen[first:first + layout_of(cell).size]
        params = PackedParams._wrap(cell, part, "canonical")
        return StepWeights(params, direction_weights(params, 0, 0), {}, part)

    return derived.cached(frozen, ("one step", stepper.name, spec, layer, direction), make)


__all__ = ["one_step_forward", "serves_one_step"]
