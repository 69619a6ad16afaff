"""An inference step from the caller's weights as they lie, products and gate math in ONE compiled call.

An inference step of a plain built-in cell over few rows (:meth:`.step.NumbaStep.steps_from_source`)
multiplies the caller's buffer itself. As NumPy calls and a kept one-step loop (two products, the summed
biases made and added, the states copied in and out, the loop's bundles unboxed) it cost ~8 us of Python at
``H = 64``, several times the arithmetic. Here one call per cell kind does it all, roughly::

    xw = x @ W_ih.T + (b_ih + b_hh)          # b_hh without its split part (the GRU's b_hn)
    xw += h @ W_hh.T                         # LSTM, RNN; the GRU's goes apart, into `product`
    h_out, c_out = cell(xw, h, c)            # the loops' own gate math (their tiles)

Each product is :mod:`.row_dot`'s (each weight row read once); the bias sums and their order are
:func:`~arrayrnn.engines.cells.split_biases`'s; the gate math is the time loops' (:mod:`.lstm_loops`,
:mod:`.gru_loops`, :mod:`.rnn_loops`). ``products=False``: the caller already put them in ``xw`` /
``product`` (BLAS's threaded GEMVs: :class:`SourceStep`). Weights and biases come as addresses in
``weights`` (one signature per dtype, whether the buffer is writeable or not): ``W_ih (G, I)``, ``W_hh
(G, H)`` (C-contiguous), ``b_ih``, ``b_hh`` ``(G,)`` (0: absent), the ``b_hh`` columns kept apart
``split_lo, split_hi`` (none: ``G, G``). ``x`` and ``h`` are C-contiguous and writeable. A step runs plain
cells (no peepholes: :func:`~arrayrnn.engines.step.check_cell_spec`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import carray, types
from numba.extending import intrinsic, register_jitable

from ...core.spec import RNNSpec
from .. import thresholds
from ..base import DirectionForward, DirectionWeights
from ..cells import gate_slice, split_biases
from ..thread_count import get_num_threads
from .gru_loops import gru_after_tile
from .loop_parts import JIT, one_of
from .lstm_loops import lstm_tile
from .rnn_loops import rnn_activation
from .row_dot import rows_times_at, writeable_rows
from .simd_ir import simd_jit


@intrinsic
def _pointer(typingctx, address, like):
    """``address`` (an integer) as a pointer to ``like``'s type."""
    if not isinstance(like, types.Float):
        return None
    pointer = types.CPointer(like)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(pointer))
    return pointer(types.intp, like), codegen


@register_jitable(inline="always")
def _add(row, b, lo, hi):
    for j in range(lo, hi):
        row[j] += b[j]


@register_jitable(inline="always")
def _add_sum(row, b1, b2, lo, hi):
    for j in range(lo, hi):
        row[j] += b1[j] + b2[j]


@register_jitable(inline="always")
def _biases(weights, like, G):
    """``b_ih``, ``b_hh`` as arrays (empty where absent)."""
    ih, hh = weights[2], weights[3]
    return carray(_pointer(ih, like), (G if ih else 0,)), carray(_pointer(hh, like), (G if hh else 0,))


@register_jitable(inline="always")
def _input_side(x, weights, xw):
    """``xw = x @ W_ih.T`` plus the biases outside the step."""
    w_ih, split_lo, split_hi = weights[0], weights[4], weights[5]
    G = xw.shape[1]
    b_ih, b_hh = _biases(weights, one_of(xw), G)
    has_ih, has_hh = b_ih.shape[0] > 0, b_hh.shape[0] > 0
    rows_times_at(x, w_ih, xw, False)
    for i in range(xw.shape[0]):
        row = xw[i]
        if has_ih and has_hh:
            _add_sum(row, b_ih, b_hh, 0, split_lo)
            _add(row, b_ih, split_lo, split_hi)
            _add_sum(row, b_ih, b_hh, split_hi, G)
        elif has_ih:
            _add(row, b_ih, 0, G)
        elif has_hh:
            _add(row, b_hh, 0, split_lo)
            _add(row, b_hh, split_hi, G)


@simd_jit(**JIT)
def lstm_source_step(x, h, c, weights, products, clip_lo, clip_hi, xw, tanh_c, h_out, c_out):
    """``h_out``, ``c_out`` of an LSTM step (``xw (1, B, 4H)``, ``tanh_c (B, H)``: scratch)."""
    B, H = c.shape
    if products:
        _input_side(x, weights, xw[0])
        rows_times_at(h, weights[1], xw[0], True)
    c_out[...] = c
    y, unused = h_out.reshape((1, B, H)), tanh_c.reshape((1, B, H))
    lstm_tile(xw, 0, 0, B, 0, H, H, c_out, y, tanh_c, False, False, unused, clip_lo, clip_hi)


@simd_jit(**JIT)
def gru_source_step(x, h, weights, products, xw, product, b_hn, hn, h_out):
    """``h_out`` of a reset-after GRU step (``xw (1, B, 3H)``, ``product (B, 3H)``, ``b_hn (H,)``, ``hn (1,
    B, H)``: scratch; ``b_hn`` is filled here from ``b_hh``)."""
    B, H = h.shape
    if products:
        _input_side(x, weights, xw[0])
        rows_times_at(h, weights[1], product, False)
    _, b_hh = _biases(weights, one_of(xw), xw.shape[2])
    for j in range(H):
        b_hn[j] = b_hh[weights[4] + j] if b_hh.shape[0] else 0
    gru_after_tile(xw, 0, 0, B, 0, H, H, h, product, b_hn, h_out.reshape((1, B, H)), hn, False)


@simd_jit(**JIT)
def rnn_source_step(x, h, weights, products, relu, xw, h_out):
    """``h_out`` of a plain RNN step (``xw (1, B, H)``: scratch)."""
    if products:
        _input_side(x, weights, xw[0])
        rows_times_at(h, weights[1], xw[0], True)
    zero = one_of(xw) * 0
    for b in range(h_out.shape[0]):
        for j in range(h_out.shape[1]):
            h_out[b, j] = rnn_activation(xw[0, b, j], relu, zero)


# -- the step's Python side ------------------------------------------------------------------------------
def serves(spec: RNNSpec) -> bool:
    """Whether :class:`SourceStep` runs ``spec``: the built-in cells without projection, layer norm or the
    reset-before GRU (whose n product needs the step's r first)."""
    plain = spec.custom_cell is None and not spec.proj_size and not spec.layer_norm
    return plain and (spec.mode != "gru" or spec.reset_after)


class SourceStep:
    """One thread's inference steps of ``rows`` rows over the weights ``w`` (views of the caller's buffer,
    read at each call): the scratch kept between calls, one compiled call a step (module doc). One row of
    weights from :data:`.thresholds.SOURCE_GEMV_MIN_BYTES` takes its products from BLAS's two GEMVs where
    the engine has more than one thread (OpenBLAS threads them)."""

    def __init__(self, spec: RNNSpec, w: DirectionWeights, rows: int, dtype: Any, nbytes: int):
        self.spec, self.w, self.rows, self.dtype = spec, w, rows, np.dtype(dtype)
        G, H = spec.gate_size, spec.hidden_size
        split = [gate_slice(spec, name) for name in spec.split_gates]
        lo, hi = (split[0].start, split[0].stop) if split else (G, G)
        self.weights = (*(_address(a) for a in (w.W_ih, w.W_hh, w.b_ih, w.b_hh)), lo, hi)
        self.xw = np.empty((1, rows, G), dtype)
        self.work = np.empty((rows, G if spec.mode == "gru" else H), dtype)  # the GRU's product; tanh(c)
        self.b_hn, self.hn = np.empty(H, dtype), np.empty((1, rows, H), dtype)
        lo, hi = spec.cell_clip if spec.cell_clip is not None else (-np.inf, np.inf)
        self.clip = (self.dtype.type(lo), self.dtype.type(hi))
        self.gemv_sized = rows == 1 and nbytes >= thresholds.SOURCE_GEMV_MIN_BYTES

    def run(self, x: np.ndarray, h: np.ndarray, c: np.ndarray | None) -> DirectionForward:
        """One step from ``x (B, I)``, ``h``, ``c`` (read, never written): new arrays ``h'``, ``c'``."""
        x, h = writeable_rows(x), writeable_rows(h)
        products = not (self.gemv_sized and get_num_threads() > 1)
        if not products:
            self._gemv_products(x, h)
        h_out, c_out = np.empty((self.rows, self.spec.hidden_size), self.dtype), None
        mode = self.spec.mode
        if mode == "lstm":
            c_out = np.empty_like(h_out)
            lstm_source_step(x, h, writeable_rows(c), self.weights, products, *self.clip, self.xw, self.work,
                             h_out, c_out)
        elif mode == "gru":
            gru_source_step(x, h, self.weights, products, self.xw, self.work, self.b_hn, self.hn, h_out)
        else:
            rnn_source_step(x, h, self.weights, products, mode == "rnn_relu", self.xw, h_out)
        return DirectionForward(h_out[None], h_out, c_out, None)

    def _gemv_products(self, x: np.ndarray, h: np.ndarray) -> None:
        """The products and the outer biases on NumPy's BLAS, into ``xw`` (and the GRU's product)."""
        w, xw = self.w, self.xw[0]
        input_bias, _ = split_biases(self.spec, w.b_ih, w.b_hh)
        np.matmul(x, w.W_ih.T, out=xw)
        if input_bias is not None:
            xw += input_bias
        if self.spec.mode == "gru":
            np.matmul(h, w.W_hh.T, out=self.work)
        else:
            xw += h @ w.W_hh.T


def _address(a: np.ndarray | None) -> int:
    if a is None:
        return 0
    if not a.flags.c_contiguous:
        raise ValueError(f"a weight block of strides {a.strides} is not C-contiguous")
    return a.ctypes.data
