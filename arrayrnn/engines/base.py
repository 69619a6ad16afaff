"""The engine interface: what ``rnn_forward`` / ``rnn_backward`` hand to an engine and get back.

Two levels, so that an engine replaces exactly as much as it needs to:

**Selection** (:class:`Call`, :meth:`Engine.check`): the frontend describes the whole call once (spec,
array module and device, ``T``, batch, training, the params' format, zero-length rows, whether
the user named the engine) and asks each candidate ``check(call)``: ``None`` means "I run this call",
anything else is the reason it does not, a phrase ready to print.

**Stack level** (:class:`Engine`): one call runs every layer and direction. A whole-stack engine (cuDNN)
implements this directly. The frontend (``arrayrnn.frontend.rnn``) has already validated the inputs and
hands the
engine

- ``params`` in the engine's ``native_format`` (the frontend converts canonical params for the call);
- ``x``: what the engine's own ``take_input(x, lengths, batch_first)`` returned for the caller's ``x``.
  That is the ONE copy of ``x`` a call makes: a gather into the order the engine computes in, zero at
  padding (``t >= lengths[b]``), owned by the engine (its cache may keep it; the frontend keeps it for the
  recompute after an inference forward, so ``forward`` must not write into it). The default is a
  contiguous copy in the caller's layout, ``(T, B, I)`` or ``(B, T, I)`` when ``batch_first``;
- ``lengths``: host ``numpy.int64`` ``(B,)`` in the caller's row order, each in ``0..T``. Rows of length 0
  are never active: their outputs are zero and their final state is their initial state;
- ``h0`` ``(L*D, B, H_out)`` and, for LSTM, ``c0`` ``(L*D, B, H)``: zeros by default, caller's row order;
  ``None`` for zeros only to an engine whose ``zero_states_as_none`` is True (likewise ``dh_n``/``dc_n``);
- ``masks``: ``None`` or ``L-1`` inter-layer dropout masks ``(T, B, D*H_out)`` (time-major, caller's row
  order, values 0 or ``1/(1-p)``, drawn by :func:`arrayrnn.frontend.dropout.dropout_masks`), ``masks[l-1]``
  multiplies the input of layer ``l``;
- ``keep_cache``: whether the backward pass will be asked for.

``forward`` returns :class:`StackForward` (``y`` in the caller's layout, zero past each row's end,
``h_n``, ``c_n``, and an engine-private ``cache`` or ``None``). ``backward(cache, dy, dh_n, dc_n)`` takes
cotangents of the same shapes and layout (never ``None``; zeros by default) and returns
:class:`StackGrads` (``dx`` in the caller's layout, ``dh0``, ``dc0`` and ``dparams``, a
:class:`~arrayrnn.core.params.PackedParams` of the params' spec and (native) format).

**Weight formats**: an engine whose ``native_format`` is not ``"canonical"`` owns that format: it
converts with ``to_native`` / ``to_canonical`` and may describe the buffer with ``native_layout``.
``PackedParams.to_format(name)`` finds the engine of format ``name`` at call time
(:func:`arrayrnn.engines.engine_for_format`).

The shared driver (:class:`arrayrnn.engines.stack.StackEngine`) sorts rows by length itself and hands
its direction kernels the sorted, time-major, packed layout described next.

**Direction level** (:class:`DirectionKernel`): engines built on the shared driver
(``arrayrnn.engines.stack.StackEngine``) supply only the per-direction time loop and gate math. The
driver runs layers x directions, does the hoisted GEMMs and hands the kernel

- ``forward(spec, w, xw, batch_sizes, h0, c0, reverse, keep_cache) -> DirectionForward`` where
  ``w`` is a :class:`DirectionWeights`, ``xw (T, B, G*H) = x @ W_ih.T + w.input_bias`` (ONE GEMM for
  all steps; ``input_bias`` folds ``b_ih`` and every part of ``b_hh`` that sits outside a product),
  ``h0 (B, H_out)``, ``c0 (B, H)`` or ``None``. The kernel adds ``w.inner_bias`` (a split gate's part of
  ``b_hh``: the default GRU's ``b_hn``, inside ``r * (W_hn h + b_hn)``) itself. ``reverse`` runs
  ``t = T-1 .. 0``; a row of length ``len`` then starts at ``t = len-1`` from its initial state.
- ``backward(spec, w, fwd, h_prev, c_prev, dy, dh_n, dc_n, batch_sizes, reverse) -> DirectionGrads``
  where ``fwd`` is the kernel's own forward result (with cache), ``h_prev (T, B, H_out)`` /
  ``c_prev (T, B, H)`` the state entering each step (built by the driver from ``fwd.y`` / ``fwd.cache.c``
  and the initial states), ``dy (T, B, H_out)`` the cotangent of ``fwd.y`` (contiguous; entries of
  inactive rows are to be ignored), ``dh_n``/``dc_n`` ``(B, .)``.
  Only ``dgates @ W_hh`` (and, with projection, ``dh @ W_hr``) happens per step; the driver computes
  ``dx``, ``dW_ih``, ``dW_hh``, ``dW_hr`` and the biases afterwards, ONE GEMM / reduction each, from
  the stacks the kernel returns.

**Cell variants** (``DirectionWeights.P``, ``h_mask``, ``zoneout_h``, ``zoneout_c``; see
:class:`CellMasks`): a kernel that implements them reads them from ``w``; one that does not must belong to
an engine whose ``check`` declines such calls (:func:`call_variants`). With zoneout, ``y`` is the zoned-out
``h_t`` and ``cache.c`` the carried (zoned-out) cell; ``cache.c_cand`` keeps the cell before zoneout, and a
plain RNN keeps its candidate ``h~_t`` as ``cache.gates``. ``backward`` of such a kernel also takes
``dc_seq=`` ``(T, B, H)``, the cotangent of every step's cell state (LSTM ``return_all_states``), passed
only when given.

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
custom cell            ``residuals`` (R*H), ``c`` ((S-1)*H)      (R+S-1)H
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

from ..core.backend import get_xp
from ..core.params import PackedParams
from ..core.spec import RNNSpec

Array = Any  # a NumPy or CuPy ndarray


# -- selection ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Call:
    """Everything engine selection may look at; built once per ``rnn_forward``."""

    spec: RNNSpec
    xp: ModuleType            # numpy or cupy
    device: int | None        # CUDA device id of the arrays (cupy), None for NumPy
    seq_len: int              # T
    batch: int                # B
    training: bool            # keep_cache: a backward will follow
    params_format: str        # params.format
    has_zero_length: bool     # some row has length 0
    explicit: bool = False    # True: the user named this engine; False: "auto" asks (set by select_engine)
    all_states: bool = False  # rnn_forward(..., return_all_states=True)


def call_variants(call: Call) -> tuple[str, ...]:
    """The cell variants and options beyond the plain stack that ``call`` uses, as ``"name=value"``
    phrases (``()`` for a plain call): what an engine that lacks them names when it declines. Recurrent
    dropout and DropConnect act only in training; zoneout (its expectation), peepholes and layer
    normalisation always."""
    spec, masks = call.spec, call.spec.call_masks(call.training)
    fields = {"recurrent": "recurrent_dropout", "weight": "weight_dropout", "zoneout_h": "zoneout",
              "zoneout_c": "zoneout_cell"}
    on = [f"{field}={getattr(spec, field)}" for mask, field in fields.items() if mask in masks]
    if spec.peepholes:
        on.append("peepholes=True")
    if spec.layer_norm:
        on.append("layer_norm=True")
    if call.all_states:
        on.append("return_all_states=True")
    return tuple(on)


# -- stack level --------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class CellMasks:
    """The masks of the cell variants for one call (:func:`arrayrnn.frontend.dropout.cell_masks` draws
    them), caller's row order, index ``k = layer * D + direction`` first; ``None`` where off.

    ``recurrent``: ``(L*D, B, H_out)``, 0 or ``1/(1-p)``, multiplies ``h_{t-1}`` where it enters the
    recurrent products. ``weight``: ``(L*D, G*H, H_out)``, 0 or ``1/(1-p)``, multiplies ``W_hh``.
    ``zoneout_h`` ``(L*D, T, B, H_out)`` and ``zoneout_c`` ``(L*D, T, B, H)``: the weight ``m`` of the
    previous state in ``h_t = m*h_{t-1} + (1-m)*h~_t`` (0 or 1 in training, ``z`` in inference).
    """

    recurrent: Array | None = None
    weight: Array | None = None
    zoneout_h: Array | None = None
    zoneout_c: Array | None = None

    def __iter__(self):
        return iter((self.recurrent, self.weight, self.zoneout_h, self.zoneout_c))

    def applied(self) -> tuple[str, ...]:
        """The masks in use, by field name (``()`` for none)."""
        names = ("recurrent", "weight", "zoneout_h", "zoneout_c")
        return tuple(name for name, m in zip(names, self, strict=True) if m is not None)


@dataclass(frozen=True, eq=False)
class StackForward:
    y: Array                 # caller's layout (T, B, D*H_out) or (B, T, D*H_out), zero past each row's end
    h_n: Array               # (L*D, B, H_out)
    c_n: Array | None        # (L*D, B, H), LSTM only
    cache: Any               # engine-private; None when keep_cache was False
    h_all: Array | None = None   # all_states: (L*D, T, B, H_out), caller's rows, zero past each row's end
    c_all: Array | None = None   # all_states, LSTM: (L*D, T, B, H)


@dataclass(frozen=True, eq=False)
class StackGrads:
    dx: Array                # caller's layout, like x
    dh0: Array               # (L*D, B, H_out)
    dc0: Array | None        # (L*D, B, H), LSTM only
    dparams: PackedParams    # same spec and format as the params the engine ran with


class Engine(ABC):
    """A way to run a whole stack. Subclasses set ``name`` and implement ``check``, ``forward``, ``backward``.

    An engine of a non-canonical ``native_format`` also implements ``to_native`` and ``to_canonical``
    (and, optionally, ``native_layout``).
    """

    name: str = ""
    native_format: str = "canonical"
    # True: ``forward`` takes h0 / c0 of None (zeros) and ``backward`` dh_n / dc_n of None (zeros), so the
    # frontend allocates no zero states for it (cuDNN reads NULL as zeros); False: they are never None
    zero_states_as_none: bool = False
    # True: the engine keeps what it derives from the weights (:mod:`.derived`), so the frontend hands it a
    # private frozen copy of a NumPy params buffer (reused while the buffer keeps its bits) instead of it
    keeps_derived_weights: bool = False

    @abstractmethod
    def check(self, call: Call) -> str | None:
        """``None`` if this engine runs ``call``, else the reason (a phrase ready to print).

        With ``call.explicit`` False (``"auto"`` asking) an engine may also decline by preference.
        """

    def to_native(self, params: PackedParams) -> PackedParams:
        """Canonical params -> this engine's native format (a new buffer)."""
        raise NotImplementedError(f"engine {self.name!r} reads the canonical format; it has no other")

    def to_canonical(self, params: PackedParams) -> PackedParams:
        """Params in this engine's native format -> canonical (a new buffer)."""
        raise NotImplementedError(f"engine {self.name!r} reads the canonical format; it has no other")

    def native_layout(self, spec: RNNSpec, dtype: Any) -> Any:
        """Offsets and shapes of each named block of the native buffer (a ``Layout``), or ``None``.

        ``None`` (the default) means the native buffer has no per-block views: ``params.view(...)`` on it
        raises an error saying to convert to canonical first.
        """
        return None

    def take_input(self, x: Array, lengths: np.ndarray, batch_first: bool) -> Any:
        """The engine's own copy of the caller's ``x``, zero at padding, in the order its ``forward`` wants.

        The default keeps the caller's rows and layout (a whole-stack engine such as cuDNN takes them so).
        """
        return copy_zero_padded(x, lengths, batch_first)

    @abstractmethod
    def forward(self, params: PackedParams, x: Any, lengths: np.ndarray, h0: Array, c0: Array | None,
                masks: tuple[Array, ...] | None, *, batch_first: bool, keep_cache: bool) -> StackForward:
        """The whole stack. An engine that accepts calls with cell variants or ``return_all_states`` (see
        :func:`call_variants`) also takes the keywords ``cell_masks`` (a :class:`CellMasks`) and
        ``all_states`` (then it fills ``StackForward.h_all`` / ``c_all``); they are passed only when used."""

    @abstractmethod
    def backward(self, cache: Any, dy: Array, dh_n: Array, dc_n: Array | None) -> StackGrads:
        """BPTT. After an ``all_states`` forward it may also get the keywords ``dh_all`` / ``dc_all``
        (cotangents of ``h_all`` / ``c_all``), passed only when given."""

    def own_step_engine(self) -> Any:
        """The engine's own cell-step engine, where it has one (numba: the compiled loops on weights packed
        once); ``None`` (the default): a stack engine steps through the shared
        :class:`~arrayrnn.engines.step.StepEngine` (:func:`~arrayrnn.engines.step.step_engine` picks)."""
        return None

    def __repr__(self) -> str:
        return f"<arrayrnn engine {self.name!r}>"


def copy_zero_padded(x: Array, lengths: np.ndarray, batch_first: bool) -> Array:
    """A contiguous copy of ``x`` in its own layout, zero where ``t >= lengths[b]``."""
    xp = get_xp(x)
    out = xp.array(x, order="C", copy=True)
    T = x.shape[1] if batch_first else x.shape[0]
    if int(lengths.min(initial=T)) < T:
        padding = lengths[None, :] <= np.arange(T)[:, None]            # (T, B)
        out[xp.asarray(padding.T if batch_first else padding)] = 0
    return out


# -- direction level ----------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class LayerNormWeights:
    """One layer-direction's layer-normalisation blocks (``layer_norm=True``; :mod:`.layer_norm`)."""

    g_ih: Array          # (G*H,) gain of the normalised input product (the driver applies it, with ``bias``)
    g_hh: Array          # (G*H,) gain of the normalised recurrent product (the kernel applies it)
    g_c: Array | None    # (H,) LSTM: gain of the normalised cell state
    b_c: Array | None    # (H,) LSTM: its shift
    bias: Array | None   # (G*H,) what a plain stack folds into xw (b_ih + b_hh outside products): added
                         # after the input product's norm; DirectionWeights.input_bias is None then
    eps: float


@dataclass(frozen=True, eq=False)
class DirectionWeights:
    """Views of one layer-direction's blocks (absent ones ``None``) plus the biases split for kernels."""

    W_ih: Array               # (G*H, I_l)
    W_hh: Array               # (G*H, H_out)
    b_ih: Array | None        # (G*H,)
    b_hh: Array | None        # (G*H,)
    W_hr: Array | None        # (P, H), projection only
    input_bias: Array | None  # (G*H,): b_ih plus the parts of b_hh outside any product; added into xw
    inner_bias: Array | None  # (H,): b_hn of the reset-after GRU, inside r * (W_hn h + b_hn); a custom
                              # cell: b_hh of its split gates, (len(split)*H,), in gate order
    # cell variants (None when off; rows sorted like the kernel's). With weight dropout W_hh above is
    # already W_hh * mask: the kernels never see the mask.
    P: Array | None = None          # (3, H) peephole weights, rows i, f, o: i, f see c_{t-1}, o sees c_t
    h_mask: Array | None = None     # (B, H_out) recurrent dropout: h_{t-1} * h_mask enters W_hh
    zoneout_h: Array | None = None  # (T, B, H_out): h_t = m*h_{t-1} + (1-m)*h~_t
    zoneout_c: Array | None = None  # (T, B, H): c_t = m*c_{t-1} + (1-m)*c~_t (LSTM)
    norm: LayerNormWeights | None = None  # layer_norm=True: xw arrives normalised; the kernel normalises
                                          # the recurrent product (and the LSTM's cell) itself

    @property
    def variants(self) -> VariantFlags:
        """Which cell-variant masks this direction carries."""
        return VariantFlags(self.h_mask is not None, self.zoneout_h is not None, self.zoneout_c is not None)


@dataclass(frozen=True)
class VariantFlags:
    """Which per-call cell-variant masks one layer-direction carries (:attr:`DirectionWeights.variants`):
    the one place every engine reads them from (the CuPy engine's program key, the numba engine's loop
    arguments and plan). DropConnect is not among them: it reaches a kernel as ``W_hh`` already masked."""

    recurrent: bool
    zoneout_h: bool
    zoneout_c: bool

    @property
    def names(self) -> tuple[str, ...]:
        """The variants on, by :class:`CellMasks` field name."""
        return tuple(name for name in ("recurrent", "zoneout_h", "zoneout_c") if getattr(self, name))


@dataclass(frozen=True, eq=False)
class DirectionCache:
    """What one direction's backward needs besides its output ``y`` (see the table in the module doc)."""

    gates: Array | None = None   # (T, B, G*H) gate activations in spec.gate_names order
    c: Array | None = None       # (T, B, H) LSTM cell state after clipping
    tanh_c: Array | None = None  # (T, B, H) tanh(c)
    hn: Array | None = None      # (T, B, H) reset-after GRU: W_hn h_{t-1} + b_hn
    c_cand: Array | None = None  # (T, B, H) LSTM with cell zoneout: the cell before zoneout (``c`` is after)
    # layer_norm=True: (T, B, S, 2) mean and 1/sqrt(var + eps) of each row the step normalised, S =
    # spec.norms_per_step (the recurrent product [the reset-before GRU: its r, z part, then its n part],
    # then the LSTM's cell); ``tanh_c`` is then tanh(g_c * LN(c) + b_c), ``hn`` g_hn * LN(.)_n + b_hn
    norm_stats: Array | None = None
    # layer_norm=True on the numba engine: (T, B, G*H) the raw products W_hh h_{t-1} (the reset-before GRU:
    # its two parts) and W_ih x, kept for the backward instead of computed again there
    raw_recurrent: Array | None = None
    raw_input: Array | None = None
    # a custom cell (spec.custom_cell): (T, B, R*H) what its forward returned as residuals, residual k in
    # columns k*H .. (k+1)*H; ``c`` then holds its carried states besides h, (T, B, (S-1)*H)
    residuals: Array | None = None

    def nbytes_per_step_row(self) -> int:
        parts = [a for a in (self.gates, self.c, self.tanh_c, self.hn, self.c_cand, self.raw_recurrent,
                             self.raw_input, self.residuals) if a is not None]
        stats = self.norm_stats.itemsize * self.norm_stats[0, 0].size if self.norm_stats is not None else 0
        return sum(a.itemsize * a.shape[-1] for a in parts) + stats


@dataclass(frozen=True, eq=False)
class DirectionForward:
    y: Array                      # (T, B, H_out), contiguous, zero at inactive rows
    h_n: Array                    # (B, H_out)
    c_n: Array | None             # (B, H), LSTM only
    cache: DirectionCache | None  # None unless keep_cache


@dataclass(frozen=True, eq=False)
class DirectionGrads:
    """Pre-activation gradients of one direction (``dpre_*``), from which the driver's hoisted GEMMs make
    ``dx`` and every weight gradient, plus the gradients of the initial states."""

    dpre_in: Array        # (T, B, G*H): d loss / d xw (the input-side pre-activations), zero at inactive rows
    dpre_rec: Array       # (T, B, G*H): d loss / d (W_hh h_{t-1} + b_hh); may be the same object as dpre_in
    d_h: Array | None     # (T, B, P): d loss / d h_t (projected), projection only (for dW_hr)
    dh0: Array            # (B, H_out)
    dc0: Array | None     # (B, H), LSTM only
    # reset-after GRU, where a kernel keeps only the part of dpre_rec that differs from dpre_in: (T, B, H),
    # d loss / d (W_hn h_{t-1} + b_hn); dpre_rec is then dpre_in, whose r, z parts are dpre_rec's
    dn_rec: Array | None = None
    # layer_norm=True: dpre_in is d loss / d xw (the normalised input side, as always), dpre_rec the cotangent
    # of the raw product W_hh h_{t-1} (through its norm; dn_rec None), and ``norm`` the kernel's reductions
    # over every step and row: "g_hh" (G*H,), "b_hh" (G*H,: the cotangent of the normalised recurrent side,
    # which b_hh sits beside), and for LSTM "g_c", "b_c" (H,)
    norm: dict[str, Array] | None = None


class DirectionKernel(Protocol):
    """The per-direction time loop and fused gate math; see the module docstring for the contract."""

    def forward(self, spec: RNNSpec, w: DirectionWeights, xw: Array, batch_sizes: np.ndarray, h0: Array,
                c0: Array | None, reverse: bool, keep_cache: bool) -> DirectionForward: ...

    def backward(self, spec: RNNSpec, w: DirectionWeights, fwd: DirectionForward, h_prev: Array,
                 c_prev: Array | None, dy: Array, dh_n: Array, dc_n: Array | None,
                 batch_sizes: np.ndarray, reverse: bool) -> DirectionGrads: ...
