"""How one forward call of :mod:`arrayrnn.torch`'s modules runs, and how its backward does.

:func:`run` takes the weights (one flat tensor, or the per-weight tensors of a drop-in module together
with where each sits in the flat buffer), the input and the states, and picks the path:

- eager (the usual case): :class:`_RNNFunction`, one autograd node. Forward: :func:`arrayrnn.rnn_forward`
  on zero-copy DLPack views (the flat buffer is a view over the weights' one storage). Backward:
  :func:`arrayrnn.rnn_backward`; the weight gradient is ONE flat buffer, and a drop-in module's
  per-weight gradients are views into it. A backward called with ``create_graph=True`` (double
  backward) instead re-runs the forward in torch operations (:mod:`.torch_recurrence`) and
  differentiates that, so the gradients are themselves differentiable;
- ``torch.compile`` / ``torch.export`` (:func:`torch.compiler.is_compiling`): the ``torch.library``
  custom op ``arrayrnn::rnn`` with a fake kernel (shapes only), so the compiler sees one opaque node.
  Its backward is the custom op ``arrayrnn::rnn_backward``, which recomputes the forward before the
  BPTT (custom-op residuals must be tensors; the engines' caches are not): one more forward per
  training step under ``torch.compile``;
- ``torch.jit.trace``: the same custom op, so a trace can be saved (``torch.jit.save``) and loaded in a
  process that imported :mod:`arrayrnn.torch` (which registers the op). The dropout seed is a tensor input
  of the op that the graph draws (``torch.randint``), so a compiled or traced module draws new masks on
  every call without recompiling;
- ``torch.onnx.export``: the standard ONNX ``LSTM`` / ``GRU`` / ``RNN`` operators (:mod:`.torch_onnx`);
- an empty batch, ``meta`` tensors, ``dropout = 1`` in training and tensors of a ``torch.func`` transform
  (``grad``, ``vmap``, ``jacrev``, ...: their wrapper tensors have no memory the engines could read):
  :mod:`.torch_recurrence` directly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

import arrayrnn as ar
from arrayrnn.engines import thread_count
from arrayrnn.frontend import guard
from arrayrnn.frontend.dropout import dropout_masks

from . import torch_recurrence

_Tensor = torch.Tensor


@dataclasses.dataclass(frozen=True)
class _ForwardOptions:
    """The non-tensor arguments of one forward call.

    ``spec``: the stack as computed (its dtype is the computation's; its dropout the one applied in
    training mode). ``split``: offset and shape of each weight input in the flat canonical buffer, or
    None when the only weight input is the flat buffer itself. ``drop_all``: training-mode dropout with
    ``p = 1`` (which :class:`arrayrnn.RNNSpec` cannot hold).
    """

    spec: ar.RNNSpec
    lengths: np.ndarray | None  # host int64 (B,); set by run()
    batch_first: bool
    training: bool
    seed: int | None
    engine: str
    split: tuple[tuple[int, tuple[int, ...]], ...] | None = None
    drop_all: bool = False
    # a backward may follow (grad mode on and an input requires grad); set by run(); not in the repr, which
    # torch.jit.trace compares between its trace and its check run (under no_grad)
    keep_cache: bool = dataclasses.field(default=True, repr=False)


def run(opts: _ForwardOptions, x: _Tensor, h0: _Tensor | None, c0: _Tensor | None,
        weights: Sequence[_Tensor], lengths: Any = None) -> tuple[_Tensor, _Tensor, _Tensor | None]:
    """``(y, h_n, c_n)`` for ``x`` (3-D, the computation's dtype) through the stack ``opts.spec``.

    ``lengths``: per-row lengths ``(B,)`` (a tensor, a sequence or an array) or None.
    """
    if exporting_to_onnx():
        from . import torch_onnx

        spec = exported_spec(opts.spec, opts.training, opts.drop_all)
        return torch_onnx.emit(spec, opts.batch_first, x, h0, c0, flat_of(opts, weights), lengths)
    inputs = (x, h0, c0, *weights)
    if _needs_torch_ops(opts, x) or _any_transformed((*inputs, lengths)):  # (the latter is not traceable)
        return _torch_ops_forward(opts, x, h0, c0, weights, lengths)  # lengths: maybe a wrapper tensor
    keep_cache = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs)
    opts = dataclasses.replace(opts, lengths=_host_lengths(lengths), keep_cache=keep_cache)
    return _RNNFunction.apply(opts, x, h0, c0, *weights)


def capturing_graph() -> bool:
    """True while ``torch.compile`` / ``torch.export`` / ``torch.jit.trace`` (and the ONNX exporters) trace:
    the forward is then the custom op (a trace cannot save a Python ``autograd.Function``)."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing()


def needs_seed(spec: ar.RNNSpec, training: bool) -> bool:
    """Whether a call draws masks: in training mode, with inter-layer dropout (two layers or more), recurrent
    dropout, DropConnect or zoneout (whose inference masks are constants)."""
    return spec.draws_masks(training)


@torch.compiler.assume_constant_result
def _needs_seed_text(spec: str, training: bool) -> bool:
    return needs_seed(ar.RNNSpec.from_dict(json.loads(spec)), training)


def seed_tensor(training: bool, spec: str) -> _Tensor | None:
    """The mask seed of one call as a tensor the traced graph draws itself (so each call of a compiled
    or traced module draws a new one), or None when no mask applies. ``spec``: :func:`spec_text`."""
    if not _needs_seed_text(spec, training):
        return None
    return torch.randint(0, 2**31 - 1, (), dtype=torch.int64)


def inference_spec(spec: ar.RNNSpec) -> ar.RNNSpec:
    """``spec`` as an eval-mode call computes it: without the training-only dropouts (zoneout stays: its
    inference form is its expectation)."""
    if not (spec.dropout or spec.recurrent_dropout or spec.weight_dropout):
        return spec
    return spec.replace(dropout=0.0, recurrent_dropout=0.0, weight_dropout=0.0)


@torch.compiler.assume_constant_result
def exporting_to_onnx() -> bool:
    """``torch.onnx.is_in_onnx_export()``, evaluated for real under ``torch.export(strict=True)`` too (its
    dynamo tracing answers False, so the dynamo exporter's second strategy took the custom op)."""
    return torch.onnx.is_in_onnx_export()


def exported_spec(spec: ar.RNNSpec, training: bool, drop_all: bool = False) -> ar.RNNSpec:
    """The stack ``torch.onnx.export`` writes: the eval-mode forward (ONNX's ``LSTM`` / ``GRU`` / ``RNN``
    have no dropout, DropConnect or zoneout). A module in ``training`` mode with one of those on is refused,
    naming it, as ``nn.LSTM``'s exporter refuses its dropout in training mode: the graph would not compute
    what the module computes. ``drop_all``: inter-layer dropout 1, which ``spec`` cannot hold."""
    inter_layer = 1.0 if drop_all else spec.dropout if spec.num_layers > 1 else 0.0
    cell = spec.zoneout_cell if spec.zoneout_cell != spec.zoneout else None   # named where it differs
    options = {"dropout": inter_layer, "recurrent_dropout": spec.recurrent_dropout,
               "weight_dropout": spec.weight_dropout, "zoneout": spec.zoneout, "zoneout_cell": cell}
    on = [f"{name} = {value}" for name, value in options.items() if value] if training else []
    if on:
        raise ValueError(f"torch.onnx.export of a module with {' and '.join(on)} in training mode: ONNX's "
                         f"recurrent operators have none of them (the graph would compute the eval-mode "
                         f"forward); call module.eval() before exporting (or export with "
                         f"training=torch.onnx.TrainingMode.EVAL)")
    return inference_spec(spec)


def _host_lengths(lengths: Any) -> np.ndarray | None:
    if isinstance(lengths, torch.Tensor):
        return ar.as_array(lengths.detach().cpu(), "lengths")
    return lengths


def _any_transformed(values: Sequence[Any]) -> bool:
    return any(isinstance(v, _Tensor) and is_transformed(v) for v in values)


def is_transformed(t: _Tensor | None) -> bool:
    """True for a tensor of a ``torch.func`` transform (a functorch wrapper: no storage to share)."""
    return t is not None and torch._C._functorch.is_functorch_wrapped_tensor(t)


def _needs_torch_ops(opts: _ForwardOptions, x: _Tensor) -> bool:
    dropping_all = opts.drop_all and opts.training and opts.spec.num_layers > 1
    return x.shape[1] == 0 or x.device.type == "meta" or dropping_all


def flat_of(opts: _ForwardOptions, weights: Sequence[_Tensor]) -> _Tensor:
    """The flat canonical buffer as a differentiable tensor (a concatenation when split)."""
    if opts.split is None:
        return weights[0]
    return torch.cat([w.reshape(-1) for w in weights])


def _torch_ops_forward(opts: _ForwardOptions, x: _Tensor, h0: _Tensor | None, c0: _Tensor | None,
                       weights: Sequence[_Tensor], lengths: Any) -> tuple[_Tensor, _Tensor, _Tensor | None]:
    T, B = (x.shape[1], x.shape[0]) if opts.batch_first else x.shape[:2]
    lengths = torch.as_tensor(lengths) if lengths is not None else None
    spec = opts.spec if opts.training else inference_spec(opts.spec)
    return torch_recurrence.run(spec, flat_of(opts, weights), x, lengths, h0, c0, opts.batch_first,
                                _masks(opts, T, B, x))


def _masks(opts: _ForwardOptions, T: int, B: int, like: _Tensor) -> list[_Tensor] | None:
    """The inter-layer dropout masks of this call (the engines' masks: same seed, same values)."""
    spec = opts.spec
    if not opts.training or spec.num_layers == 1:
        return None
    shape = (T, B, spec.num_directions * spec.output_size)
    if opts.drop_all:
        return [like.new_zeros(shape)] * (spec.num_layers - 1)
    masks = dropout_masks(spec, T, B, opts.seed)
    return None if masks is None else [torch.from_numpy(m).to(like) for m in masks]


# -- eager: one autograd node over the fused engines --------------------------------------------------
class _RNNFunction(torch.autograd.Function):
    """``rnn_forward`` forward, ``rnn_backward`` backward; a differentiable re-run under create_graph."""

    @staticmethod
    def forward(ctx, opts: _ForwardOptions, x, h0, c0, *weights):
        flat = _flat_view(opts, weights)
        with engine_stream(flat):  # the results are wrapped on the stream they were computed on
            res = _engine_forward(opts, flat, x, h0, c0, opts.keep_cache)
            y, h_n = tensor_of(res.y), tensor_of(res.h_n)
            c_n = tensor_of(res.c_n) if res.c_n is not None else None
        ctx.res, ctx.opts = res, opts
        ctx.set_materialize_grads(False)
        # saved so that torch's version counters catch an in-place change before the backward (an optimizer
        # step on a weight, a write into y, which the engine may keep as its residual), and for the
        # double-backward re-run
        ctx.save_for_backward(x, h0, c0, y, *weights)
        return y, h_n, c_n

    @staticmethod
    def backward(ctx, dy, dh_n, dc_n):
        x, h0, c0, _, *weights = ctx.saved_tensors
        needs = ctx.needs_input_grad[1:]
        if torch.is_grad_enabled():  # create_graph=True: gradients that are themselves differentiable
            grads = differentiable_grads(ctx.opts, x, h0, c0, weights, (dy, dh_n, dc_n), needs)
        else:
            grads = _engine_grads(ctx.opts, ctx.res, (dy, dh_n, dc_n), needs, weights[0])
        return (None, *grads)


def _flat_view(opts: _ForwardOptions, weights: Sequence[_Tensor]) -> _Tensor:
    """The flat buffer without a copy: the weights are consecutive views of one storage (the caller
    checked) or the one flat tensor."""
    if opts.split is None:
        return weights[0].detach()
    first = weights[0].detach()
    start = first.storage_offset() - opts.split[0][0]
    return first.as_strided((ar.layout_of(opts.spec).size,), (1,), start)


def _engine_forward(opts: _ForwardOptions, flat: _Tensor, x: _Tensor, h0: _Tensor | None,
                    c0: _Tensor | None, keep_cache: bool) -> ar.RNNResult:
    """``rnn_forward`` on views. ``opts.training`` is the module's mode (the dropouts, zoneout's masks).
    An eval-mode forward that a backward may follow runs with ``training=True`` and the dropouts off, which
    keeps the cache; with zoneout it runs as inference (``training=True`` would draw zoneout's training
    masks) and :func:`arrayrnn.rnn_backward` recomputes it with the cache."""
    spec = opts.spec if opts.training else inference_spec(opts.spec)
    zoneout = bool(spec.zoneout or spec.zoneout_cell)
    training = opts.training or (keep_cache and not zoneout)
    params = ar.PackedParams(spec, array_view(flat, "flat"))
    with contextlib.nullcontext() if keep_cache else guard.no_backward():  # no copy of the weights kept
        return ar.rnn_forward(params, array_view(x, "x"), opts.lengths, array_view(h0, "h0"),
                              array_view(c0, "c0"), batch_first=opts.batch_first, training=training,
                              seed=opts.seed, engine=opts.engine)


def _engine_grads(opts: _ForwardOptions, res: ar.RNNResult, cotangents: Sequence[_Tensor | None],
                  needs: Sequence[bool], like: _Tensor) -> tuple[_Tensor | None, ...]:
    dy, dh_n, dc_n = cotangents
    with engine_stream(like):
        g = ar.rnn_backward(res, array_view(dy, "dy"), array_view(dh_n, "dh_n"), array_view(dc_n, "dc_n"))
        dflat = tensor_of(g.dparams.data) if any(needs[3:]) else None
        return (tensor_of(g.dx) if needs[0] else None, tensor_of(g.dh0) if needs[1] else None,
                tensor_of(g.dc0) if needs[2] and g.dc0 is not None else None, *split_grad(opts, dflat))


def split_grad(opts: _ForwardOptions, dflat: _Tensor | None) -> tuple[_Tensor | None, ...]:
    """The gradient of each weight input: views into the one flat gradient ``dflat``."""
    if opts.split is None:
        return (dflat,)
    if dflat is None:
        return (None,) * len(opts.split)
    start = dflat.storage_offset()  # one as_strided per weight: half the cost of a slice and a view
    return tuple(dflat.as_strided(shape, _row_major(shape), start + offset) for offset, shape in opts.split)


@functools.lru_cache(maxsize=256)
def _row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a contiguous tensor of ``shape``."""
    return tuple(math.prod(shape[k + 1:]) for k in range(len(shape)))


def differentiable_grads(opts: _ForwardOptions, x: _Tensor, h0: _Tensor | None, c0: _Tensor | None,
                         weights: Sequence[_Tensor], cotangents: Sequence[_Tensor | None],
                         needs: Sequence[bool]) -> tuple[_Tensor | None, ...]:
    """Vector-Jacobian products from the torch-op re-run of the forward, with ``create_graph=True``."""
    inputs = (x, h0, c0, *weights)
    wanted = [i for i, (t, need) in enumerate(zip(inputs, needs, strict=True)) if need and t is not None]
    with torch.enable_grad():
        outputs = _torch_ops_forward(opts, x, h0, c0, weights, opts.lengths)
        pairs = [(o, g) for o, g in zip(outputs, cotangents, strict=True) if o is not None and g is not None]
        if not pairs or not wanted:
            return (None,) * len(inputs)
        found = torch.autograd.grad([o for o, _ in pairs], [inputs[i] for i in wanted],
                                    [g for _, g in pairs], create_graph=True, allow_unused=True)
    grads: list[_Tensor | None] = [None] * len(inputs)
    for i, g in zip(wanted, found, strict=True):
        grads[i] = g if g is not None else torch.zeros_like(inputs[i])
    return tuple(grads)


# -- torch.compile / torch.export: the custom ops ------------------------------------------------------
def run_compiled(options: str, has_cell: bool, x: _Tensor, h0: _Tensor | None, c0: _Tensor | None,
                 weights: Sequence[_Tensor], lengths: Any = None,
                 seed: _Tensor | None = None) -> tuple[_Tensor, _Tensor, _Tensor | None]:
    """:func:`run` while a graph is captured (:func:`capturing_graph`): the custom op ``arrayrnn::rnn``.

    ``options``: :func:`options_text` (a compile-time constant, so the tracer needs no spec object);
    ``seed``: :func:`seed_tensor` (it replaces the seed of ``options``) or None.
    """
    if exporting_to_onnx():
        from . import torch_onnx

        opts = _decode(options, None)
        spec = exported_spec(opts.spec, opts.training, opts.drop_all)
        return torch_onnx.emit(spec, opts.batch_first, x, h0, c0, flat_of(opts, weights), lengths)
    lengths = torch.as_tensor(lengths, device="cpu") if lengths is not None else None
    y, h_n, c_n = torch.ops.arrayrnn.rnn(x, h0, c0, list(weights), lengths, seed, options)
    return y, h_n, (c_n if has_cell else None)


@torch.compiler.assume_constant_result
def options_text(spec: str, dtype: str, batch_first: bool, training: bool, engine: str,
                 per_weight: bool) -> str:
    """The options of a call as the custom ops' one string argument (a custom op takes no Python objects):
    ``spec``: :func:`spec_text` of the stack, computed in ``dtype``; ``per_weight``: the weights come one per
    block (else as the one flat buffer). The seed is the op's tensor argument (:func:`seed_tensor`)."""
    spec = ar.RNNSpec.from_dict({**json.loads(spec), "dtype": dtype})
    split = split_of(spec) if per_weight else None
    return _encode(_ForwardOptions(spec, None, batch_first, training, None, engine, split))


def spec_text(fields: dict[str, Any]) -> str:
    """:meth:`arrayrnn.RNNSpec.to_dict`'s fields as a string, kept on a module: a string attribute is a
    constant to ``torch.compile``, where ints and floats read from a module may become symbolic once they
    differ between compilations (and :func:`options_text` needs constants)."""
    return json.dumps(fields, sort_keys=True)


@functools.lru_cache(maxsize=64)
def split_of(spec: ar.RNNSpec) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """Offset and shape of every block of ``spec`` in the flat buffer (the weight inputs' ``split``)."""
    return tuple((b.offset, b.shape) for b in ar.layout_of(spec).blocks)


def _encode(opts: _ForwardOptions) -> str:
    return json.dumps({"spec": opts.spec.to_dict(), "batch_first": opts.batch_first,
                       "training": opts.training, "seed": opts.seed, "engine": opts.engine,
                       "split": opts.split})


def _decode(text: str, lengths: _Tensor | None, seed: _Tensor | None = None) -> _ForwardOptions:
    d = json.loads(text)
    split = tuple((offset, tuple(shape)) for offset, shape in d["split"]) if d["split"] is not None else None
    host = lengths.detach().cpu().numpy() if lengths is not None else None
    seed = int(seed) if seed is not None else d["seed"]
    return _ForwardOptions(ar.RNNSpec.from_dict(d["spec"]), host, d["batch_first"], d["training"], seed,
                           d["engine"], split)


@torch.library.custom_op("arrayrnn::rnn", mutates_args=())
def _rnn_op(x: _Tensor, h0: _Tensor | None, c0: _Tensor | None, weights: list[_Tensor],
            lengths: _Tensor | None, seed: _Tensor | None, options: str) -> tuple[_Tensor, _Tensor, _Tensor]:
    if _batch_size(x, options) == 0:  # nothing to compute (the engines take at least one row)
        return _forward_outputs(x, options, torch.zeros)
    opts = _decode(options, lengths, seed)
    flat = _contiguous_flat(opts, weights)
    with engine_stream(flat):
        res = _engine_forward(opts, flat, x, h0, c0, keep_cache=False)
        c_n = tensor_of(res.c_n) if res.c_n is not None else x.new_empty(0)
        return tensor_of(res.y).clone(), tensor_of(res.h_n).clone(), c_n.clone()


@_rnn_op.register_fake
def _(x, h0, c0, weights, lengths, seed, options):
    return _forward_outputs(x, options, torch.empty)


def _batch_size(x: _Tensor, options: str) -> int:
    return x.shape[0] if json.loads(options)["batch_first"] else x.shape[1]


def _forward_outputs(x: _Tensor, options: str, make) -> tuple[_Tensor, _Tensor, _Tensor]:
    """``(y, h_n, c_n)`` of the right shapes made by ``make`` (``torch.empty`` / ``torch.zeros``)."""
    d = json.loads(options)
    spec, batch_first = ar.RNNSpec.from_dict(d["spec"]), d["batch_first"]
    T, B = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    width = spec.num_directions * spec.output_size
    like = {"dtype": x.dtype, "device": x.device}
    y = make((B, T, width) if batch_first else (T, B, width), **like)
    c_n = make(spec.state_shape(B, cell=True), **like) if spec.has_cell else make(0, **like)
    return y, make(spec.state_shape(B), **like), c_n


def _setup_context(ctx, inputs, output) -> None:
    x, h0, c0, weights, lengths, seed, options = inputs
    ctx.options, ctx.n_weights = options, len(weights)
    ctx.save_for_backward(x, h0, c0, lengths, seed, *weights)


def _op_backward(ctx, dy, dh_n, dc_n):
    x, h0, c0, lengths, seed, *weights = ctx.saved_tensors
    needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2],
             *([ctx.needs_input_grad[3]] * ctx.n_weights))
    opts = _decode(ctx.options, None)
    if torch.is_grad_enabled():  # the masks need the seed's value: a double backward is run eagerly
        opts = dataclasses.replace(opts, lengths=lengths, seed=int(seed) if seed is not None else opts.seed)
        cotangents = (dy, dh_n, dc_n if opts.spec.has_cell else None)
        grads = differentiable_grads(opts, x, h0, c0, weights, cotangents, needs)
    else:
        grads = torch.ops.arrayrnn.rnn_backward(x, h0, c0, weights, lengths, seed, dy, dh_n,
                                                dc_n if opts.spec.has_cell else None, ctx.options)
        grads = [g if need else None for g, need in zip(grads, needs, strict=True)]
    dx, dh0, dc0, *dweights = grads
    return dx, dh0, dc0, list(dweights), None, None, None


_rnn_op.register_autograd(_op_backward, setup_context=_setup_context)


@torch.library.custom_op("arrayrnn::rnn_backward", mutates_args=())
def _rnn_backward_op(x: _Tensor, h0: _Tensor | None, c0: _Tensor | None, weights: list[_Tensor],
                     lengths: _Tensor | None, seed: _Tensor | None, dy: _Tensor, dh_n: _Tensor,
                     dc_n: _Tensor | None, options: str) -> list[_Tensor]:
    """``[dx, dh0, dc0, *dweights]`` (zeros where an input is absent): the forward recomputed with its
    cache (the same seed, so the same dropout masks), then the BPTT."""
    if _batch_size(x, options) == 0:
        return _backward_outputs(x, weights, options, torch.zeros)
    opts = _decode(options, lengths, seed)
    flat = _contiguous_flat(opts, weights)
    with engine_stream(flat):
        res = _engine_forward(opts, flat, x, h0, c0, keep_cache=True)
        g = ar.rnn_backward(res, array_view(dy, "dy"), array_view(dh_n, "dh_n"), array_view(dc_n, "dc_n"))
        dflat = tensor_of(g.dparams.data).clone()
        dc0 = tensor_of(g.dc0).clone() if g.dc0 is not None else x.new_zeros(0)
        grads = [tensor_of(g.dx).clone(), tensor_of(g.dh0).clone(), dc0]
    return grads + [g.clone() for g in split_grad(opts, dflat)]


@_rnn_backward_op.register_fake
def _(x, h0, c0, weights, lengths, seed, dy, dh_n, dc_n, options):
    return _backward_outputs(x, weights, options, torch.empty)


def _backward_outputs(x: _Tensor, weights: Sequence[_Tensor], options: str, make) -> list[_Tensor]:
    """``[dx, dh0, dc0, *dweights]`` of the right shapes made by ``make``."""
    spec, B = ar.RNNSpec.from_dict(json.loads(options)["spec"]), _batch_size(x, options)
    like = {"dtype": x.dtype, "device": x.device}
    dc0 = make(spec.state_shape(B, cell=True), **like) if spec.has_cell else make(0, **like)
    dweights = [make(w.shape, dtype=w.dtype, device=w.device) for w in weights]
    return [make(x.shape, **like), make(spec.state_shape(B), **like), dc0, *dweights]


def _contiguous_flat(opts: _ForwardOptions, weights: Sequence[_Tensor]) -> _Tensor:
    """Inside a custom op the weights are plain tensors (maybe copies): one flat buffer from them."""
    return flat_of(opts, [w.detach() for w in weights]).contiguous()


# -- zero-copy exchange with the engines ----------------------------------------------------------------
def array_view(t: _Tensor | None, name: str) -> Any:
    """A NumPy / CuPy view of ``t`` (no copy; a CPU tensor through ``Tensor.numpy``, the shortest way, else
    DLPack), or None."""
    if t is None:
        return None
    if t.is_cpu and t.dtype in _NUMPY_DTYPES:
        return t.detach().numpy()
    return ar.as_array(t.detach(), name)


_NUMPY_DTYPES = (torch.float32, torch.float64, torch.float16)


def tensor_of(a: Any) -> _Tensor:
    """A torch tensor sharing ``a``'s memory (NumPy or CuPy)."""
    if isinstance(a, np.ndarray):
        return torch.from_numpy(a if a.flags.writeable else a.copy())
    return torch.from_dlpack(a)


def engine_stream(like: _Tensor) -> contextlib.AbstractContextManager:
    """Where the engines run for torch's tensors. CUDA: CuPy's current device and stream = the tensor's
    device and torch's current stream there, so the engines' kernels are ordered with torch's work and
    DLPack exchanges need no sync. CPU: at most ``torch.get_num_threads()`` threads unless
    ``arrayrnn.set_num_threads`` says otherwise (a host that limits torch to one thread gets one)."""
    if not like.is_cuda:
        return thread_count.at_most(torch.get_num_threads())
    import cupy

    device = like.device.index if like.device.index is not None else torch.cuda.current_device()
    stack = contextlib.ExitStack()
    stack.enter_context(cupy.cuda.Device(device))
    stream = torch.cuda.current_stream(device)
    stack.enter_context(cupy.cuda.ExternalStream(stream.cuda_stream, device))
    return stack
