"""The engine interface: what ``rnn_forward`` / ``rnn_backward`` hand to an engine and get back.

Two levels, so that an engine replaces exactly as much as it needs to:

**Stack level** (:class:`Engine`): one call runs every layer and direction. cuDNN implements this
directly. The frontend (``arrayrnn.rnn``) has already validated the inputs and hands the engine

- ``x`` ``(T, B, I)``: time-major, rows sorted by length (descending, stable), zero at padding;
- ``batch_sizes``: host ``numpy.int64`` array ``(T,)``, non-increasing; step ``t`` works on the
  contiguous prefix of rows ``[:batch_sizes[t]]`` (cuDNN's packed layout). Rows of length 0 are never
  active: their outputs are zero and their final state is their initial state;
- ``h0`` ``(L*D, B, H_out)`` and, for LSTM, ``c0`` ``(L*D, B, H)``: never ``None`` (zeros by default);
- ``masks``: ``None`` or ``L-1`` inter-layer dropout masks ``(T, B, D*H_out)`` (values 0 or
  ``1/(1-p)``, already in sorted row order), ``masks[l-1]`` multiplies the input of layer ``l``;
- ``keep_cache``: whether the backward pass will be asked for.

``forward`` returns :class:`StackForward` (``y (T, B, D*H_out)`` zero past each row's end, ``h_n``,
``c_n``, and an engine-private ``cache`` or ``None``). ``backward(params, cache, dy, dh_n, dc_n)``
takes cotangents of the same shapes (never ``None``; zeros by default) and returns :class:`StackGrads`
(``dx``, ``dh0``, ``dc0`` and ``dparams``, a :class:`~arrayrnn.params.PackedParams` of the params'
spec, format and layout).

**Direction level** (:class:`DirectionKernel`): engines built on the shared driver
(``arrayrnn.engines.stack.StackEngine``) supply only the per-direction time loop and gate math. The
driver runs layers x directions, does the hoisted GEMMs and hands the kernel

- ``forward(spec, w, xw, batch_sizes, h0, c0, reverse, keep_cache) -> DirectionForward`` where
  ``w`` is a :class:`DirectionWeights`, ``xw (T, B, G*H) = x @ W_ih.T + w.input_bias`` (ONE GEMM for
  all steps; ``input_bias`` folds ``b_ih`` and every part of ``b_hh`` that sits outside a product),
  ``h0 (B, H_out)``, ``c0 (B, H)`` or ``None``. The kernel adds ``w.inner_bias`` (the default GRU's
  ``b_hn``, inside ``r * (W_hn h + b_hn)``) itself. ``reverse`` runs ``t = T-1 .. 0``; a row of
  length ``len`` then starts at ``t = len-1`` from its initial state.
- ``backward(spec, w, fwd, h_prev, c_prev, dy, dh_n, dc_n, batch_sizes, reverse) -> DirectionGrads``
  where ``fwd`` is the kernel's own forward result (with cache), ``h_prev (T, B, H_out)`` /
  ``c_prev (T, B, H)`` the state entering each step (built by the driver from ``fwd.y`` / ``fwd.cache.c``
  and the initial states), ``dy (T, B, H_out)`` the cotangent of ``fwd.y`` (contiguous; entries of
  inactive rows are to be ignored), ``dh_n``/``dc_n`` ``(B, .)``.
  Only ``dgates @ W_hh`` (and, with projection, ``dh @ W_hr``) happens per step; the driver computes
  ``dx``, ``dW_ih``, ``dW_hh``, ``dW_hr`` and the biases afterwards, ONE GEMM / reduction each, from
  the stacks the kernel returns.

Contract for every array a kernel returns: ``(T, B, .)`` stacks are contiguous and their entries at
inactive rows (``b >= batch_sizes[t]``) are zero; cache entries there are finite (zero).

The residual cache (:class:`DirectionCache`), per step and row, in elements (bytes = elements x itemsize):

=====================  =======================================  ==============
mode                   fields                                   elements
=====================  =======================================  ==============
rnn_tanh, rnn_relu     none (the derivative comes from ``y``)   0
gru (reset_after)      ``gates`` r,z,n (3H) + ``hn`` (H)          4H
gru (reset_before)     ``gates`` r,z,n (3H)                     3H
lstm                   ``gates`` i,f,g,o (4H), ``c``, ``tanh_c``  6H
=====================  =======================================  ==============

plus each direction's output ``y`` (``H_out``), which the stack keeps per layer anyway. Derivatives
are taken from outputs (``1 - g*g`` for tanh, ``s*(1-s)`` for sigmoid, ``y > 0`` for relu); ``h_{t-1}``
and ``c_{t-1}`` are not stored but rebuilt from ``y`` / ``c`` and the initial states in the backward.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

import numpy as np

from ..params import PackedParams
from ..spec import RNNSpec

Array = Any  # a NumPy or CuPy ndarray


# -- stack level --------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class StackForward:
    y: Array                 # (T, B, D*H_out), sorted rows, zero past each row's end
    h_n: Array               # (L*D, B, H_out)
    c_n: Array | None        # (L*D, B, H), LSTM only
    cache: Any               # engine-private; None when keep_cache was False


@dataclass(frozen=True, eq=False)
class StackGrads:
    dx: Array                # (T, B, I)
    dh0: Array               # (L*D, B, H_out)
    dc0: Array | None        # (L*D, B, H), LSTM only
    dparams: PackedParams    # same spec, format and layout as the params


class Engine(ABC):
    """A way to run a whole stack. Subclasses set ``name`` and implement the three methods."""

    name: str = ""

    @abstractmethod
    def unavailable_reason(self, spec: RNNSpec, xp: ModuleType) -> str | None:
        """``None`` if this engine can run ``spec`` on arrays of ``xp``, else what is missing."""

    def auto_ok(self, spec: RNNSpec, xp: ModuleType, seq_len: int | None) -> bool:
        """Whether ``engine="auto"`` should pick this engine (given that it can run). Default: yes."""
        return True

    def supports_format(self, format: str) -> bool:
        return format == "canonical"

    @abstractmethod
    def forward(self, params: PackedParams, x: Array, batch_sizes: np.ndarray, h0: Array, c0: Array | None,
                masks: tuple[Array, ...] | None, keep_cache: bool) -> StackForward: ...

    @abstractmethod
    def backward(self, params: PackedParams, cache: Any, dy: Array, dh_n: Array,
                 dc_n: Array | None) -> StackGrads: ...

    def __repr__(self) -> str:
        return f"<arrayrnn engine {self.name!r}>"


# -- direction level ----------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class DirectionWeights:
    """Views of one layer-direction's blocks (absent ones ``None``) plus the biases split for kernels."""

    W_ih: Array               # (G*H, I_l)
    W_hh: Array               # (G*H, H_out)
    b_ih: Array | None        # (G*H,)
    b_hh: Array | None        # (G*H,)
    W_hr: Array | None        # (P, H), projection only
    input_bias: Array | None  # (G*H,): b_ih plus the parts of b_hh outside any product; added into xw
    inner_bias: Array | None  # (H,): b_hn of the reset-after GRU, inside r * (W_hn h + b_hn)


@dataclass(frozen=True, eq=False)
class DirectionCache:
    """What one direction's backward needs besides its output ``y`` (see the table in the module doc)."""

    gates: Array | None = None   # (T, B, G*H) gate activations in spec.gate_names order
    c: Array | None = None       # (T, B, H) LSTM cell state after clipping
    tanh_c: Array | None = None  # (T, B, H) tanh(c)
    hn: Array | None = None      # (T, B, H) reset-after GRU: W_hn h_{t-1} + b_hn

    def nbytes_per_step_row(self) -> int:
        parts = [a for a in (self.gates, self.c, self.tanh_c, self.hn) if a is not None]
        return sum(a.itemsize * a.shape[-1] for a in parts)


@dataclass(frozen=True, eq=False)
class DirectionForward:
    y: Array                      # (T, B, H_out), contiguous, zero at inactive rows
    h_n: Array                    # (B, H_out)
    c_n: Array | None             # (B, H), LSTM only
    cache: DirectionCache | None  # None unless keep_cache


@dataclass(frozen=True, eq=False)
class DirectionGrads:
    d_ih: Array         # (T, B, G*H): d loss / d xw (the input-side pre-activations), zero at inactive rows
    d_hh: Array         # (T, B, G*H): d loss / d (W_hh h_{t-1} + b_hh); may be the same object as d_ih
    d_h: Array | None   # (T, B, P): d loss / d h_t (projected), projection only (for dW_hr)
    dh0: Array          # (B, H_out)
    dc0: Array | None   # (B, H), LSTM only


class DirectionKernel(Protocol):
    """The per-direction time loop and fused gate math; see the module docstring for the contract."""

    def forward(self, spec: RNNSpec, w: DirectionWeights, xw: Array, batch_sizes: np.ndarray, h0: Array,
                c0: Array | None, reverse: bool, keep_cache: bool) -> DirectionForward: ...

    def backward(self, spec: RNNSpec, w: DirectionWeights, fwd: DirectionForward, h_prev: Array,
                 c_prev: Array | None, dy: Array, dh_n: Array, dc_n: Array | None,
                 batch_sizes: np.ndarray, reverse: bool) -> DirectionGrads: ...
