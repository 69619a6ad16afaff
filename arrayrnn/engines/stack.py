"""The shared stack driver: layers x directions over a pluggable direction kernel, with hoisted GEMMs.

:class:`StackEngine` implements the stack-level :class:`~arrayrnn.engines.base.Engine` for any
:class:`~arrayrnn.engines.base.DirectionKernel`. Roughly, for each layer ``l`` and direction ``d``::

    xw = (x_l @ W_ih.T + input_bias)                    # ONE GEMM over all T*B rows
    y_d, h_n, c_n, cache = kernel.forward(spec, w, xw, batch_sizes, h0[k], c0[k], reverse=d == 1)
    x_{l+1} = concat(y_0, y_1) * mask_l                 # inter-layer dropout (training only)

and backward, from the last layer down::

    grads = kernel.backward(...)                        # per step only dgates @ W_hh (and dh @ W_hr)
    dx_l    += dpre_in @ W_ih                              # ONE GEMM each, over all T*B rows;
    dW_ih    = dpre_in.T @ x_l                             # inactive rows have zero dpre_in / dpre_rec
    dW_hh    = dpre_rec.T @ h_prev                          # reset-before GRU: n rows use r * h_prev;
                                                           # reset-after: the n rows may come as dn_rec
    dW_hr    = d_h.T @ (o * tanh(c));  db_ih = dpre_in.sum();  db_hh = dpre_rec.sum()

The driver owns the row order: it sorts the caller's rows by length (descending, stable) with
:class:`~arrayrnn.engines.batch_order.BatchOrder`, moves ``batch_first`` input to time-major, hands the
kernels
the packed prefix layout (``batch_sizes``) and puts the results back in the caller's order and layout.

The engine cache keeps the layer-0 input, initial states, masks, batch sizes and each direction's
``DirectionForward`` (its ``y`` and residuals); the input of layer ``l > 0`` is rebuilt from the
outputs of layer ``l-1`` in the backward. float16 runs with float32 math (inputs upcast once, results
cast back).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import replace as _replace
from types import ModuleType
from typing import Any

import numpy as np

from ..core.backend import get_xp
from ..core.layout import layout_of
from ..core.params import PackedParams
from ..core.spec import RNNSpec
from . import derived, thresholds
from .base import (
    Call,
    CellMasks,
    DirectionForward,
    DirectionGrads,
    DirectionKernel,
    DirectionWeights,
    Engine,
    StackForward,
    StackGrads,
)
from .batch_order import BatchOrder
from .cells import gate, gate_slice, split_biases
from .in_flight import engine_call
from .layer_norm import input_backward, norm_weights, normalize_input

Array = Any
MatMul = Callable[..., Array]  # (a, b, out=None) -> a @ b, into out (a C-contiguous 2-D view) if given


@dataclass(frozen=True, eq=False)
class SortedInput:
    """The driver's copy of ``x`` (what :meth:`StackEngine.take_input` returns)."""

    x: Array                          # (T, B, I) rows sorted by length, time-major, zero at padding
    order: BatchOrder                 # the caller's rows <-> sorted rows


@dataclass(frozen=True, eq=False)
class StackCache:
    params: PackedParams              # the params the math ran with (float32 copies for float16)
    x: Array                          # (T, B, I) layer-0 input, sorted, zero at padding
    batch_sizes: np.ndarray
    h0: Array
    c0: Array | None
    masks: tuple[Array, ...] | None
    layers: tuple[tuple[DirectionForward, ...], ...]   # [layer][direction]
    io_dtype: Any                     # the dtype the caller sees (a NumPy dtype)
    order: BatchOrder                 # the caller's rows <-> sorted rows
    batch_first: bool                 # the caller's layout
    cell_masks: CellMasks | None = None   # sorted rows, compute dtype


@dataclass(frozen=True, eq=False)
class StackRun:
    """What every layer-direction of one stack forward shares (sorted rows, compute dtype)."""

    params: PackedParams
    x: Array                          # (T, B, I) layer-0 input
    batch_sizes: np.ndarray
    h0: Array
    c0: Array | None
    masks: tuple[Array, ...] | None   # inter-layer dropout, masks[l-1] multiplies the input of layer l
    cell_masks: CellMasks | None
    keep: bool                        # keep each direction's cache
    plan: Any = None                  # what the engine decided for this call (StackEngine.forward_sorted)

    def index(self, layer: int, direction: int) -> int:
        """The layer-direction's index in ``h0`` / ``c0``."""
        return layer * self.params.spec.num_directions + direction

    def states(self, layer: int, direction: int) -> tuple[Array, Array | None]:
        """The layer-direction's initial states ``h0``, ``c0`` (``None`` but for the LSTM)."""
        k = self.index(layer, direction)
        return self.h0[k], self.c0[k] if self.c0 is not None else None

    def weights(self, layer: int, direction: int) -> DirectionWeights:
        """The layer-direction's :func:`direction_weights`; made once per frozen weight buffer
        (:mod:`.derived`) where no cell-variant mask enters them."""
        params = self.params
        if self.cell_masks is not None:
            return direction_weights(params, layer, direction, self.cell_masks)
        key = ("direction weights", params.spec, params.format, layer, direction)
        return derived.cached(params.data, key, lambda: direction_weights(params, layer, direction))

    def layer_input(self, layer: int, below: Array, steps: slice = slice(None)) -> Array:
        """Steps ``steps`` of layer ``layer``'s input from ``below`` (those steps of the layer below's
        output, or ``x``): times the dropout mask above layer 0."""
        if layer == 0 or self.masks is None:
            return below
        return below * self.masks[layer - 1][steps]


@dataclass(frozen=True, eq=False)
class StackBackRun:
    """What every layer-direction of one stack backward shares: the forward's cache, the cotangents of the
    final (and every step's) states, and the outputs each direction writes its part of."""

    cache: StackCache
    dh_n: Array
    dc_n: Array | None
    dh_all: Array | None
    dc_all: Array | None
    grads: PackedParams               # out: each layer-direction's blocks
    dh0: Array                        # out: (L*D, B, H_out)
    dc0: Array | None                 # out: (L*D, B, H)
    plan: Any = None                  # what the engine decided for this call (StackEngine.backward_sorted)


def direction_weights(params: PackedParams, layer: int, direction: int,
                      cell_masks: CellMasks | None = None) -> DirectionWeights:
    """Views of one layer-direction's blocks; with ``cell_masks`` (rows sorted like the kernel's) also its
    cell-variant masks, and ``W_hh`` times its DropConnect mask (a new array)."""
    spec = params.spec

    def block(name: str) -> Array | None:
        return params.view(layer, direction, name) if params.layout.has(layer, direction, name) else None

    b_ih, b_hh = block("b_ih"), block("b_hh")
    input_bias, inner_bias = split_biases(spec, b_ih, b_hh)
    norm = None
    if spec.layer_norm:  # the biases join xw after the input product's norm (.layer_norm)
        norm, input_bias = norm_weights(block, input_bias, spec.layer_norm_eps), None
    k = layer * spec.num_directions + direction
    m = cell_masks if cell_masks is not None else CellMasks()

    def mine(a: Array | None) -> Array | None:
        return a[k] if a is not None else None

    W_hh = block("W_hh") if m.weight is None else block("W_hh") * m.weight[k]
    return DirectionWeights(W_ih=block("W_ih"), W_hh=W_hh, b_ih=b_ih, b_hh=b_hh, W_hr=block("W_hr"),
                            input_bias=input_bias, inner_bias=inner_bias, P=block("P"),
                            h_mask=mine(m.recurrent), zoneout_h=mine(m.zoneout_h),
                            zoneout_c=mine(m.zoneout_c), norm=norm)


def sorted_cell_masks(order: BatchOrder, masks: CellMasks | None) -> CellMasks | None:
    """``masks`` with their rows in the kernels' (sorted) order."""
    if masks is None:
        return None
    return CellMasks(recurrent=order.sort(masks.recurrent, axis=1), weight=masks.weight,
                     zoneout_h=order.sort(masks.zoneout_h, axis=2),
                     zoneout_c=order.sort(masks.zoneout_c, axis=2))


def xp_matmul(a: Array, b: Array, out: Array | None = None) -> Array:
    """``a @ b`` of the arrays' own module, into ``out`` if given."""
    return get_xp(a).matmul(a, b, out=out)


def input_projection(x: Array, w: DirectionWeights, matmul: MatMul = xp_matmul,
                     out: Array | None = None) -> Array:
    """``x @ W_ih.T + input_bias`` for every step at once: (T, B, I) -> (T, B, G*H); into ``out``
    (contiguous, that shape) if given. ``matmul(a, b, out=None)``."""
    T, B, I = x.shape
    xw = matmul(x.reshape(T * B, I), w.W_ih.T, out=None if out is None else out.reshape(T * B, -1))
    if w.input_bias is not None:
        xw += w.input_bias
    return xw.reshape(T, B, -1)


def previous_states(xp: ModuleType, seq: Array, init: Array, batch_sizes: np.ndarray, reverse: bool) -> Array:
    """``prev[t, b]``: the state entering step ``t`` of row ``b`` (``init`` at the row's first step).

    The forward direction starts every row at ``t = 0``; the reverse direction starts row ``b`` at
    ``t = len_b - 1``, i.e. rows ``[batch_sizes[t+1]:batch_sizes[t]]`` start at ``t``.
    """
    prev = xp.empty_like(seq)
    edge = 0 if not reverse else -1
    active = int(batch_sizes[edge])
    prev[edge, :active] = init[:active]
    prev[edge, active:] = 0  # rows idle at the edge step (length 0) never read init: it may be inf or NaN
    if not reverse:
        prev[1:] = seq[:-1]
        return prev
    prev[:-1] = seq[1:]
    for t in np.flatnonzero(batch_sizes[1:] < batch_sizes[:-1]):
        start, stop = int(batch_sizes[t + 1]), int(batch_sizes[t])
        prev[t, start:stop] = init[start:stop]
    return prev


def _rows(a: Array) -> Array:
    """(T, B, F) -> (T*B, F)."""
    return a.reshape(-1, a.shape[-1])


class ActiveRows:
    """``(T, B, F)`` stacks as the ``(rows, F)`` operands of the hoisted backward products: every entry, or,
    when most are padding (:data:`.thresholds.ACTIVE_ROWS_MAX_FILL`), only the active ones (``b <
    batch_sizes[t]``), each stack gathered once. Padding
    entries of the stacks are zero, so both give the same products; the gathered ones skip the zeros.
    Stacks in ``owned`` (the backward's own temporaries) are compacted in place, the rest copied."""

    def __init__(self, xp: ModuleType, batch_sizes: np.ndarray, rows: int, owned: tuple[Array, ...] = ()):
        T = len(batch_sizes)
        active = np.arange(rows)[None, :] < np.asarray(batch_sizes)[:, None]
        gather = xp is np and int(active.sum()) <= thresholds.ACTIVE_ROWS_MAX_FILL * T * rows
        self.index = np.flatnonzero(active) if gather else None
        self._owned = {id(a) for a in owned if a is not None}
        self._gathered: dict[int, tuple[Array, Array]] = {}

    def __call__(self, a: Array) -> Array:
        if self.index is None:
            return _rows(a)
        key = id(a)
        if key not in self._gathered:  # the stack is kept with its rows: its id stays its own
            flat = _rows(a)
            self._gathered[key] = (a, _compact(flat, self.index) if key in self._owned else flat[self.index])
        return self._gathered[key][1]

    def retain(self, a: Array) -> None:
        """Let go of every gathered stack but ``a``'s."""
        self._gathered = {k: v for k, v in self._gathered.items() if k == id(a)}

    def to_stack(self, product: Array, shape: tuple[int, ...]) -> Array:
        """The ``(rows, F)`` result of a product as a ``shape`` stack, zero at the entries not gathered."""
        if self.index is None:
            return product.reshape(shape)
        out = np.zeros((int(np.prod(shape[:-1])), shape[-1]), product.dtype)
        out[self.index] = product
        return out.reshape(shape)


def _compact(flat: np.ndarray, index: np.ndarray, block: int = 512) -> np.ndarray:
    """``flat[index]`` moved to the front of ``flat`` itself, a block of rows at a time (``index`` is
    increasing with ``index[k] >= k``, so no row is overwritten before it is read); returns that front."""
    for k0 in range(0, len(index), block):
        part = index[k0:k0 + block]
        flat[k0:k0 + len(part)] = flat[part]
    return flat[:len(index)]


class StackEngine(Engine):
    """An engine made of the shared driver and a direction kernel (reference, numba, cupy)."""

    def __init__(self, name: str, kernel: DirectionKernel):
        self.name = name
        self.kernel = kernel

    def check(self, call: Call) -> str | None:
        return None

    def kernel_for(self, plan: Any) -> DirectionKernel:
        """The direction kernel of a call the engine planned as ``plan`` (its one kernel, by default)."""
        return self.kernel

    def project_input(self, x: Array, w: DirectionWeights, out: Array | None = None,
                      batch_sizes: np.ndarray | None = None) -> Array:
        """The hoisted input projection of one layer-direction (:func:`input_projection`, into ``out`` if
        given; an engine may run it on its own GEMM). ``batch_sizes`` lets an engine whose kernels never
        read inactive rows (``b >= batch_sizes[t]``; the numba engine's) leave those entries unwritten."""
        return input_projection(x, w, out=out)

    def matmul(self, a: Array, b: Array, out: Array | None = None) -> Array:
        """``a @ b`` for the backward's hoisted products (``dx``, the weight gradients), into ``out`` (a
        C-contiguous view: a block of the gradient buffer) if given; an engine may run them on its own
        threads, and write ``out`` without a temporary."""
        if out is None:
            return a @ b
        out[...] = a @ b
        return out

    # -- forward --------------------------------------------------------------------------------
    def take_input(self, x: Array, lengths: np.ndarray, batch_first: bool) -> SortedInput:
        """ONE gather of the caller's ``x``: rows sorted by length, time-major, zero at padding."""
        order = BatchOrder.from_lengths(lengths, x.shape[1 if batch_first else 0])
        return SortedInput(order.gather_time_major(x, batch_first), order)

    def forward(self, params: PackedParams, x: SortedInput, lengths: np.ndarray, h0: Array, c0: Array | None,
                masks: tuple[Array, ...] | None, *, batch_first: bool, keep_cache: bool,
                cell_masks: CellMasks | None = None, all_states: bool = False) -> StackForward:
        xp, order = get_xp(x.x), x.order
        masks = tuple(order.sort(m) for m in masks) if masks is not None else None
        with engine_call():  # every engine's call: a fork waits for it (OpenBLAS's fork handler, workers.py)
            out = self.forward_sorted(params, x.x, order.batch_sizes, order.sort(h0), order.sort(c0), masks,
                                      keep_cache, sorted_cell_masks(order, cell_masks), all_states)
        cache = out.cache
        if cache is not None:
            cache = _replace(cache, order=order, batch_first=batch_first)
        return StackForward(_to_caller(xp, order.unsort(out.y), batch_first), order.unsort(out.h_n),
                            order.unsort(out.c_n), cache, order.unsort(out.h_all, axis=2),
                            order.unsort(out.c_all, axis=2))

    def forward_sorted(self, params: PackedParams, x: Array, batch_sizes: np.ndarray, h0: Array,
                       c0: Array | None, masks: tuple[Array, ...] | None, keep_cache: bool,
                       cell_masks: CellMasks | None = None, all_states: bool = False,
                       plan: Any = None) -> StackForward:
        """The stack on sorted, time-major rows (the kernels' packed layout); ``y`` stays sorted.

        ``cell_masks``: the cell variants' masks, rows sorted; ``all_states``: also return every layer's
        and direction's states (``h_all``, ``c_all``, rows sorted); ``plan``: what the engine decided for
        the call, carried to every layer and direction on the :class:`StackRun`."""
        io_dtype = x.dtype  # the dtype object: str() of one costs microseconds a call
        params, x, h0, c0, masks = _to_compute_dtype(params, x, h0, c0, masks)
        cell_masks = _masks_to(params.data.dtype, cell_masks)
        spec, xp = params.spec, get_xp(x)
        h_n, c_n = xp.empty_like(h0), (xp.empty_like(c0) if c0 is not None else None)
        keep_c = keep_cache or (all_states and spec.has_cell)  # c_all comes from the cache's c
        layers = self.run_layers(StackRun(params, x, batch_sizes, h0, c0, masks, cell_masks, keep_c, plan))
        for k, out in enumerate(out for outs in layers for out in outs):
            h_n[k] = out.h_n
            if c_n is not None:
                c_n[k] = out.c_n
        layer_input = _layer_output(xp, layers[-1])
        cache = None
        if keep_cache:
            cache = StackCache(params, x, batch_sizes, h0, c0, masks, tuple(layers), io_dtype,
                               BatchOrder.full(*x.shape[:2]), False, cell_masks)
        h_all = c_all = None
        if all_states:
            directions = [out for outs in layers for out in outs]
            h_all = _cast(xp.stack([out.y for out in directions]), io_dtype)
            if spec.has_cell:
                c_all = _cast(xp.stack([out.cache.c for out in directions]), io_dtype)
        return StackForward(_cast(layer_input, io_dtype), _cast(h_n, io_dtype), _cast(c_n, io_dtype), cache,
                            h_all, c_all)

    def run_layers(self, run: StackRun) -> list[tuple[DirectionForward, ...]]:
        """Every layer's directions' forwards, ``[layer][direction]``; one after the other, each layer on the
        output of the one below (an engine may overlap them: :mod:`.wavefront`)."""
        xp, layers, layer_input = get_xp(run.x), [], run.x
        for layer in range(run.params.spec.num_layers):
            layer_input = run.layer_input(layer, layer_input)
            outs = tuple(self.run_direction(run, layer, d, layer_input)
                         for d in range(run.params.spec.num_directions))
            layers.append(outs)
            layer_input = _layer_output(xp, outs)
        return layers

    def run_direction(self, run: StackRun, layer: int, direction: int,
                      layer_input: Array) -> DirectionForward:
        """One layer-direction's forward: the hoisted input projection, then the kernel's time loop."""
        w = run.weights(layer, direction)
        xw = self.project_input(layer_input, w, batch_sizes=run.batch_sizes if w.norm is None else None)
        if w.norm is not None:  # g_ih * LN(W_ih x) + the biases, every step at once (.layer_norm)
            normalize_input(xw, w.norm)
        return self.kernel_for(run.plan).forward(run.params.spec, w, xw, run.batch_sizes,
                                                 *run.states(layer, direction), direction == 1, run.keep)

    # -- backward -------------------------------------------------------------------------------
    def backward(self, cache: StackCache, dy: Array, dh_n: Array, dc_n: Array | None,
                 dh_all: Array | None = None, dc_all: Array | None = None) -> StackGrads:
        xp, order = get_xp(dy), cache.order
        dy = xp.ascontiguousarray(order.sort(xp.swapaxes(dy, 0, 1) if cache.batch_first else dy))
        with engine_call():
            g = self.backward_sorted(cache, dy, order.sort(dh_n), order.sort(dc_n),
                                     order.sort(dh_all, axis=2), order.sort(dc_all, axis=2))
        return StackGrads(_to_caller(xp, order.unsort(g.dx), cache.batch_first), order.unsort(g.dh0),
                          order.unsort(g.dc0), g.dparams)

    def backward_sorted(self, cache: StackCache, dy: Array, dh_n: Array, dc_n: Array | None,
                        dh_all: Array | None = None, dc_all: Array | None = None,
                        plan: Any = None) -> StackGrads:
        """BPTT on sorted, time-major rows (``dy`` like ``forward_sorted``'s ``y``; ``dh_all`` / ``dc_all``
        like its ``h_all`` / ``c_all``; ``plan`` as there, on the :class:`StackBackRun`)."""
        params = cache.params  # what the math ran with (the float32 copy for float16 params)
        spec, xp = params.spec, get_xp(cache.x)
        dtype = params.data.dtype
        dy, dh_n = dy.astype(dtype, copy=False), dh_n.astype(dtype, copy=False)
        dc_n = dc_n.astype(dtype, copy=False) if dc_n is not None else None
        dh_all = dh_all.astype(dtype, copy=False) if dh_all is not None else None
        dc_all = dc_all.astype(dtype, copy=False) if dc_all is not None else None
        grads = gradient_buffer(spec, xp)
        dh0 = xp.empty_like(cache.h0)
        dc0 = xp.empty_like(cache.c0) if cache.c0 is not None else None
        back = StackBackRun(cache, dh_n, dc_n, dh_all, dc_all, grads, dh0, dc0, plan)
        d_layer = dy
        for layer in reversed(range(spec.num_layers)):
            d_input = self.backward_layer(back, layer, d_layer, self._layer_input(xp, cache, layer))
            if layer > 0 and cache.masks is not None:
                d_input *= cache.masks[layer - 1]
            d_layer = d_input
        io = cache.io_dtype
        if io != dtype:
            grads = grads.astype(str(io))
        return StackGrads(_cast(d_layer, io), _cast(dh0, io), _cast(dc0, io), grads)

    def backward_layer(self, back: StackBackRun, layer: int, d_layer: Array, layer_input: Array) -> Array:
        """One layer's backward from the cotangent of its output: its gradients into ``back``, and the
        cotangent of its input (the directions' ``dx`` summed); one direction after the other (an engine
        may overlap them)."""
        d_input = None
        for direction in range(back.cache.params.spec.num_directions):
            dx = self.backward_direction(back, layer, direction, d_layer, layer_input)
            if d_input is None:
                d_input = dx
            else:
                d_input += dx
            del dx
        return d_input

    def backward_direction(self, back: StackBackRun, layer: int, direction: int, d_layer: Array,
                           layer_input: Array) -> Array:
        """One layer-direction's BPTT: its parameter gradients, ``dh0`` and ``dc0`` into ``back``; returns
        its ``dx`` (the cotangent of ``layer_input`` through this direction)."""
        cache, spec = back.cache, back.cache.params.spec
        xp, bs, H_out = get_xp(cache.x), cache.batch_sizes, spec.output_size
        k = layer * spec.num_directions + direction
        w = direction_weights(cache.params, layer, direction, cache.cell_masks)
        fwd = cache.layers[layer][direction]
        reverse = direction == 1
        h_prev = previous_states(xp, fwd.y, cache.h0[k], bs, reverse)
        c_prev = previous_states(xp, fwd.cache.c, cache.c0[k], bs, reverse) if cache.c0 is not None else None
        dy_d = xp.ascontiguousarray(d_layer[..., direction * H_out:(direction + 1) * H_out])
        if back.dh_all is not None:
            dy_d = dy_d + back.dh_all[k]  # dy_d may be the caller's dy itself
        per_step_dc = {"dc_seq": back.dc_all[k]} if back.dc_all is not None else {}  # only kernels taking it
        g = self.kernel_for(back.plan).backward(spec, w, fwd, h_prev, c_prev, dy_d, back.dh_n[k],
                                 back.dc_n[k] if back.dc_n is not None else None, bs, reverse, **per_step_dc)
        back.dh0[k] = g.dh0
        if back.dc0 is not None:
            back.dc0[k] = g.dc0
        d_product = None  # layer norm: the cotangent of W_ih x (g.dpre_in is that of g_ih * LN(W_ih x) + b)
        if w.norm is not None:
            d_product = self.norm_input_backward(back, layer, direction, w, g, fwd, layer_input)
        rows = ActiveRows(xp, bs, layer_input.shape[1],
                          (g.dpre_in, d_product, g.dpre_rec, g.dn_rec, g.d_h, h_prev))
        _weight_grads(self.matmul, spec, back.grads, layer, direction, w, g, fwd, layer_input, h_prev, c_prev,
                      cache.cell_masks, rows, d_product)
        d_input = g.dpre_in if d_product is None else d_product
        rows.retain(d_input)
        del h_prev, c_prev  # (T, B, H) each: gone before the dx GEMM's output (the peak of a step)
        return _input_grad(self.matmul, rows, d_input, w.W_ih, layer_input.shape)

    def norm_input_backward(self, back: StackBackRun, layer: int, direction: int, w: DirectionWeights,
                            g: DirectionGrads, fwd: DirectionForward, layer_input: Array) -> Array:
        """Layer norm: the gains' gradients into ``back.grads`` and the cotangent of the raw input product
        ``W_ih x`` (:func:`.layer_norm.input_backward`: the product computed again)."""
        return input_backward(self.project_input, back.grads, layer, direction, w, g, layer_input)

    @staticmethod
    def _layer_input(xp: ModuleType, cache: StackCache, layer: int) -> Array:
        if layer == 0:
            return cache.x
        below = _layer_output(xp, cache.layers[layer - 1])
        return below * cache.masks[layer - 1] if cache.masks is not None else below


def gradient_buffer(spec: RNNSpec, xp: ModuleType) -> PackedParams:
    """The backward's canonical gradient buffer, not initialised: the backward writes every block of every
    layer-direction (:func:`_weight_grads`, the layer norm's gains in :meth:`StackEngine.norm_input_backward`;
    tests/test_rnn_engines.py runs every variant with the buffer filled with NaN first), so zeros would be
    a pass over the whole buffer for nothing (25 us at 1.5 MiB, a T = 1 training step's)."""
    return PackedParams._wrap(spec, xp.empty(layout_of(spec).size, dtype=spec.dtype), "canonical")


def _input_grad(matmul: MatMul, rows: ActiveRows, dpre_in: Array, W_ih: Array,
                shape: tuple[int, ...]) -> Array:
    """``dpre_in @ W_ih`` as ``shape`` (a direction's ``dx``)."""
    return rows.to_stack(matmul(rows(dpre_in), W_ih), shape)


def _layer_output(xp: ModuleType, outs: list[DirectionForward] | tuple[DirectionForward, ...]) -> Array:
    return outs[0].y if len(outs) == 1 else xp.concatenate([o.y for o in outs], axis=2)


def _weight_grads(matmul: MatMul, spec: RNNSpec, grads: PackedParams, layer: int, direction: int,
                  w: DirectionWeights, g: DirectionGrads, fwd: DirectionForward, layer_input: Array,
                  h_prev: Array, c_prev: Array | None = None, cell_masks: CellMasks | None = None,
                  rows: Callable[[Array], Array] = _rows, d_product: Array | None = None) -> None:
    """The hoisted weight-gradient GEMMs and bias reductions of one layer-direction (with the cell
    variants: ``W_hh`` multiplies the recurrent-dropout-masked ``h_prev`` and its gradient goes through
    the DropConnect mask; the peephole weights' gradient is one reduction per gate). ``rows`` turns each
    ``(T, B, F)`` stack into the products' rows (:class:`ActiveRows`). With layer norm ``d_product`` is
    the cotangent of ``W_ih x`` (``g.dpre_in`` that of the normalised side) and ``b_hh``'s gradient was
    written by :func:`.layer_norm.input_backward`."""
    def block(name: str) -> Array:  # this layer-direction's block of the gradient buffer
        return grads.view(layer, direction, name)

    if w.P is not None:  # first: it reads the stacks whole, which ``rows`` may compact
        c_new = fwd.cache.c_cand if fwd.cache.c_cand is not None else fwd.cache.c
        dP = block("P")
        dP[0] = (gate(spec, g.dpre_in, "i") * c_prev).sum(axis=(0, 1))
        dP[1] = (gate(spec, g.dpre_in, "f") * c_prev).sum(axis=(0, 1))
        dP[2] = (gate(spec, g.dpre_in, "o") * c_new).sum(axis=(0, 1))
    dpre_in = rows(g.dpre_in)
    matmul((dpre_in if d_product is None else rows(d_product)).T, rows(layer_input), out=block("W_ih"))
    db_ih = block("b_ih") if w.b_ih is not None else None
    if db_ih is not None:
        db_ih[...] = dpre_in.sum(axis=0)
    if w.h_mask is not None:
        h_prev = h_prev * w.h_mask
    dW_hh = block("W_hh")
    db_hh = block("b_hh") if w.b_hh is not None and w.norm is None else None
    _recurrent_grads(matmul, spec, dW_hh, db_hh, g, fwd, rows(h_prev), rows, db_ih)
    if cell_masks is not None and cell_masks.weight is not None:
        dW_hh *= cell_masks.weight[layer * spec.num_directions + direction]
    if w.W_hr is not None:
        m = gate(spec, fwd.cache.gates, "o") * fwd.cache.tanh_c
        matmul(rows(g.d_h).T, rows(m), out=block("W_hr"))


def _recurrent_grads(matmul: MatMul, spec: RNNSpec, dW_hh: Array, db_hh: Array | None, g: DirectionGrads,
                     fwd: DirectionForward, h_prev: Array, rows: Callable[[Array], Array] = _rows,
                     db_ih: Array | None = None) -> None:
    """``dW_hh`` and ``db_hh`` (``None``: no ``b_hh``) from the gradient of ``W_hh h_prev + b_hh``, with
    ``h_prev`` as rows (of ``rows``). ``db_ih``, if written: the sum of ``dpre_in``, copied where ``db_hh``
    sums the same cotangent (the plain LSTM's whole ``dpre_rec``, the reset-after GRU's r, z parts)."""
    dpre_in, dpre_rec = rows(g.dpre_in), rows(g.dpre_rec)
    if g.dn_rec is not None:  # reset-after GRU: the n part apart, the r and z parts are dpre_in's
        rz, n, dn_rec = gate_slice(spec, "r", "z"), gate_slice(spec, "n"), rows(g.dn_rec)
        matmul(gate(spec, dpre_in, "r", "z").T, h_prev, out=dW_hh[rz])
        matmul(dn_rec.T, h_prev, out=dW_hh[n])
        if db_hh is not None:
            db_hh[rz] = db_ih[rz] if db_ih is not None else gate(spec, dpre_in, "r", "z").sum(axis=0)
            db_hh[n] = dn_rec.sum(axis=0)
        return
    if db_hh is not None:
        same = g.dpre_rec is g.dpre_in and db_ih is not None
        db_hh[...] = db_ih if same else dpre_rec.sum(axis=0)
    if spec.mode == "gru" and not spec.reset_after:
        # the n rows of W_hh multiply r * h_prev, the r and z rows multiply h_prev
        matmul(gate(spec, dpre_rec, "r", "z").T, h_prev, out=dW_hh[gate_slice(spec, "r", "z")])
        r_h = gate(spec, rows(fwd.cache.gates), "r") * h_prev
        matmul(gate(spec, dpre_rec, "n").T, r_h, out=dW_hh[gate_slice(spec, "n")])
    else:
        matmul(dpre_rec.T, h_prev, out=dW_hh)


# -- float16: float32 math ----------------------------------------------------------------------
def _to_compute_dtype(params: PackedParams, x: Array, h0: Array, c0: Array | None,
                      masks: tuple[Array, ...] | None):
    if params.spec.dtype != "float16":
        return params, x, h0, c0, masks
    up = "float32"
    return (params.astype(up), x.astype(up), h0.astype(up), c0.astype(up) if c0 is not None else None,
            tuple(m.astype(up) for m in masks) if masks is not None else None)


def _masks_to(dtype: Any, masks: CellMasks | None) -> CellMasks | None:
    if masks is None:
        return None
    return CellMasks(*(m.astype(dtype, copy=False) if m is not None else None for m in masks))


def _cast(a: Array | None, dtype: Any) -> Array | None:
    return a.astype(dtype, copy=False) if a is not None else None


def _to_caller(xp: ModuleType, a: Array, batch_first: bool) -> Array:
    return xp.ascontiguousarray(xp.swapaxes(a, 0, 1)) if batch_first else a
