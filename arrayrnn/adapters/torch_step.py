"""One fused time step of one cell as a torch operation: the cells' forward, and the drop-in sequence
modules' forward of a single step.

:func:`prepared_step` keeps, per module and slot (a cell has one; a stack one per layer-direction), the step
engine (:mod:`arrayrnn.engines.step`) and the weights it prepared (on CPU: packed), and reuses them while
they hold: the same weight tensors and memory and, where the engine keeps copies, the same values (the
numba step compares them, as no version counter sees a fused optimizer's step or a ``.data`` write; the
other engines derive their summed biases per call). The engine is chosen again when the engine choices
changed (numba finished loading in the background: a cell first called on the reference step moves to it).
:func:`run_step` runs the step, as an autograd node (:class:`_StepFunction`: the step's hand-written
backward, a torch-op re-run under ``create_graph=True``) when a gradient may follow. :func:`run_layers`
runs a whole stack over one time step as one step per layer-direction.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, replace
from typing import Any

import torch

import arrayrnn as ar
from arrayrnn.engines import StepEngine, StepWeights, choices_epoch, probe_call, select_engine, step_engine

from . import torch_call
from .torch_call import array_view, engine_stream, tensor_of

_Tensor = torch.Tensor


@dataclass(frozen=True, eq=False)
class Step:
    """One fused step's engine, its prepared weights, the step as a one-step sequence call (where each
    weight input sits in the buffer, for the torch-op re-run), the weight tensors it reads (the autograd
    node's inputs), their flat buffer and the :func:`~arrayrnn.engines.choices_epoch` its engine was chosen
    in, and whether it was chosen for a training call (one a backward may follow). A forward's autograd node
    keeps the Step it ran: a later call that prepares the weights again makes a new one."""

    stepper: StepEngine
    weights: StepWeights
    options: torch_call._ForwardOptions
    inputs: list[_Tensor]
    flat: _Tensor
    epoch: int
    training: bool


@functools.lru_cache(maxsize=256)
def cell_spec(mode: str, input_size: int, hidden_size: int, bias: bool, dtype: str,
              proj_size: int = 0) -> ar.RNNSpec:
    """The spec of one cell (one layer, one direction)."""
    return ar.RNNSpec(mode=mode, input_size=input_size, hidden_size=hidden_size, bias=bias, dtype=dtype,
                      proj_size=proj_size)


def prepared_step(cache: dict, slot: Any, spec: ar.RNNSpec, weights: list[_Tensor], device: torch.device,
                  inputs: tuple[_Tensor | None, ...] = (), rows: int = 0) -> Step | None:
    """The step of ``spec`` over ``weights`` (the cell's blocks in the canonical order) on ``device``.

    ``cache[slot]`` keeps the last one when the weights are views of one buffer (re-parametrised weights
    are concatenated per call): its engine while the tensors, their memory and the engine choices
    (:func:`~arrayrnn.engines.choices_epoch`) are the same, its prepared weights while the engine says they
    hold for the buffer's values (:meth:`~arrayrnn.engines.step.StepEngine.prepare`), unless the step will
    run without a gradient (no weight nor any of ``inputs``, the step's ``x`` / states, requires one:
    :func:`run_step`'s test) on an engine whose inference step of ``rows`` rows (0: not known) reads the
    buffer itself (:meth:`~arrayrnn.engines.step.StepEngine.steps_from_source`). None when the weights are
    not tensors the step can read (a ``torch.func`` transform's, another device or dtype)."""
    training = torch.is_grad_enabled() and any(w.requires_grad for w in weights)
    try:
        key = (device, spec, *((id(w), w.data_ptr()) for w in weights))
    except RuntimeError:  # a weight without storage (a torch.func transform's)
        return None
    last = cache.get(slot)
    # a step chosen for inference is chosen again for a training call: numba's step runs only once its
    # backward is loaded too ("auto" never waits for a compile); one chosen for training serves both
    fits = last is not None and last[1].epoch == choices_epoch() and last[1].training >= training
    if fits and last[0] == key:
        step = last[1]
        grad = training or (torch.is_grad_enabled() and _any_requires_grad(inputs))
        if grad or not step.stepper.steps_from_source(step.weights.spec, rows):
            step = _refreshed(step)
            if step is not last[1]:
                cache[slot] = (key, step)
        return step
    if not all(w.device == device and str(w.dtype).removeprefix("torch.") == spec.dtype for w in weights):
        return None
    step, kept = _new_step(spec, weights, device, training)
    if kept:
        cache[slot] = (key, step)
    return step


def _any_requires_grad(tensors: tuple[_Tensor | None, ...]) -> bool:
    return any(t is not None and t.requires_grad for t in tensors)


def _refreshed(step: Step) -> Step:
    """``step`` itself while its prepared weights hold for the buffer's values, else a Step with the
    weights prepared again (the same engine)."""
    # a GPU engine's prepare computes on torch's stream; on the CPU it only compares (no threads to limit)
    with engine_stream(step.flat) if step.flat.is_cuda else contextlib.nullcontext():
        prepared = step.stepper.prepare(step.weights.spec, step.weights.source, step.weights)
    return step if prepared is step.weights else replace(step, weights=prepared)


def _new_step(spec: ar.RNNSpec, weights: list[_Tensor], device: torch.device,
              training: bool) -> tuple[Step, bool]:
    """The step over ``weights`` and whether it may be kept (the weights are consecutive views of one
    storage: the flat buffer is a view of them, not a concatenation made for this call)."""
    first = weights[0].detach()
    one_buffer = _consecutive(weights)
    if one_buffer:
        flat = first.as_strided((sum(w.numel() for w in weights),), (1,), first.storage_offset())
    else:
        flat = torch.cat([w.detach().reshape(-1) for w in weights])
    data = array_view(flat, "weights")
    index = device.index if device.type == "cuda" else None
    epoch = choices_epoch()  # read before choosing: a load finishing meanwhile makes the next call ask again
    stepper = step_engine(select_engine("auto", probe_call(spec, ar.get_xp(data), device=index,
                                                           training=training)))
    with engine_stream(flat):
        prepared = stepper.prepare(spec, data)
    options = torch_call._ForwardOptions(spec, None, False, False, None, "auto", torch_call.split_of(spec))
    return Step(stepper, prepared, options, weights, flat, epoch, training), one_buffer


def _consecutive(tensors: list[_Tensor]) -> bool:
    """Consecutive contiguous views of one storage, in order."""
    first = tensors[0]
    ptr, offset = first.untyped_storage().data_ptr(), first.storage_offset()
    for t in tensors:
        if not t.is_contiguous() or t.untyped_storage().data_ptr() != ptr or t.storage_offset() != offset:
            return False
        offset += t.numel()
    return True


def run_step(step: Step, x: _Tensor, h: _Tensor, c: _Tensor | None = None) -> tuple[_Tensor, ...]:
    """``(h',)`` or ``(h', c')`` from ``x (B, I)``, ``h (B, H_out)``, ``c (B, H)``: the fused step, as an
    autograd node when a gradient may follow."""
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
    if t.is_cpu:
        return t.detach().numpy() if t.requires_grad else t.numpy()
    return array_view(t, "input")


class _StepFunction(torch.autograd.Function):
    """One fused step: the engine's step forward, its hand-written backward (a differentiable torch-op
    re-run under ``create_graph=True``)."""

    @staticmethod
    def forward(ctx, step: Step, x: _Tensor, h: _Tensor, c: _Tensor | None, *weights: _Tensor):
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


def _blocks_of(step: Step, dflat: Any) -> list[_Tensor]:
    """The weights' gradients in ``dflat`` (one buffer), each a tensor with a storage of its own over its
    block: autograd sums a loop's steps into the first step's tensors in place (it adds in place only into
    a storage no other tensor holds)."""
    return [tensor_of(dflat[where].reshape(shape)) for where, shape in step.weights.blocks.values()]


def _differentiable_grads(step: Step, x: _Tensor, h: _Tensor, c: _Tensor | None, weights: list[_Tensor],
                          dh: _Tensor | None, dc: _Tensor | None, needs: tuple[bool, ...]) -> tuple:
    """The step's vector-Jacobian products, differentiable: the torch-op recurrence over one step."""
    one_step = [t.unsqueeze(0) if t is not None else None for t in (x, h, c, dh, dc)]
    grads = torch_call.differentiable_grads(step.options, *one_step[:3], weights, (None, *one_step[3:]),
                                            needs)
    return tuple(g.squeeze(0) if g is not None and k < 3 else g for k, g in enumerate(grads))


def run_layers(cache: dict, spec: ar.RNNSpec, x: _Tensor, h0: _Tensor | None, c0: _Tensor | None,
               weights: list[list[_Tensor]]) -> tuple[_Tensor, _Tensor, _Tensor | None] | None:
    """``(y, h_n, c_n)`` of the stack ``spec`` over ONE time step, as one fused step per layer-direction
    (``cache``'s slots; ``weights``: each layer-direction's blocks in the canonical order); ``y`` is
    ``(B, D*H_out)``. ``x``: ``(B, I)``; ``h0`` / ``c0``: ``(L*D, B, .)`` or None (zeros). The reverse
    direction of a one-step sequence is a step from its own initial state over the same input. None when
    a layer's weights are not tensors the step can read. Inter-layer dropout is the caller's to exclude."""
    D = spec.num_directions
    upstream = (x, h0, c0, *(w for ws in weights for w in ws))  # any of them may give a layer's input a grad
    steps = [prepared_step(cache, k, _layer_spec(spec, k // D), w, x.device, upstream, x.shape[0])
             for k, w in enumerate(weights)]
    if any(step is None for step in steps):
        return None
    h0 = h0 if h0 is not None else x.new_zeros(spec.state_shape(x.shape[0]))
    if spec.has_cell and c0 is None:
        c0 = x.new_zeros(spec.state_shape(x.shape[0], cell=True))
    finals, inp = [], x
    for layer in range(spec.num_layers):
        outs = [run_step(steps[k], inp, h0[k], c0[k] if c0 is not None else None)
                for k in range(layer * D, (layer + 1) * D)]
        finals.extend(outs)
        inp = outs[0][0] if D == 1 else torch.cat([out[0] for out in outs], dim=1)
    h_n = torch.stack([out[0] for out in finals])
    return inp, h_n, (torch.stack([out[1] for out in finals]) if spec.has_cell else None)


def _layer_spec(spec: ar.RNNSpec, layer: int) -> ar.RNNSpec:
    return cell_spec(spec.mode, spec.layer_input_size(layer), spec.hidden_size, spec.bias, spec.dtype,
                     spec.proj_size)
