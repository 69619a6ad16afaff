"""Layer normalisation in the cupy engine's time loops (``RNNSpec(layer_norm=True)``, issue 38): what a
program of :mod:`.programs` adds for it. The input product arrives normalised (the stack driver's
:func:`..layer_norm.normalize_input`); per step, roughly::

    hh[:n] = h[:n] @ W_hh.T                     # the GEMM, as without the norm
    norm_step(t, n, ..., hh, g_hh, stats)       # hh = g_hh * LN(hh), a block of threads per row
    <the plain gate kernel>                     # GRU, RNN; the LSTM's one kernel does both (and the cell)

and backward, after ONE GEMM before the loop that computes every step's raw product again from ``h_{t-1}``
(``hh_all = h_prev @ W_hh.T``; the forward kept only each row's mean and ``1 / std``)::

    <the plain gate kernel>                     # the cotangent of g_hh * LN(hh): dpre_in (and the GRU's rec)
    norm_backward_step(t, n, ...)               # -> dpre_rec[t], the raw product's cotangent
    dh[:n] = dpre_rec[t, :n] @ W_hh             # the GEMM reads the raw product's cotangent

and after the loop one reduction per gain (:func:`..layer_norm.gain_grads`). The reset-before GRU has two such
pairs (its r, z part and its n part, each normalised over its own row); the LSTM's forward and backward are
each one kernel (:func:`.kernels.lstm_norm_forward_step`, ``lstm_norm_backward_step``).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any, Protocol

from ...core.spec import RNNSpec
from ..base import DirectionWeights
from ..cells import gate_slice
from ..layer_norm import gain_grads
from . import kernels as ck

Array = Any
Launch = Callable[[int, int], None]  # (t, n)


class NormProgram(Protocol):
    """What a norm needs from the program it joins (a :class:`~.programs.StepProgram`, which imports this
    module): its spec and shape, its buffers, its launch sites and its GEMM."""

    spec: RNNSpec
    shape: Any        # programs.Shape: T, B, dtype, keep
    xp: ModuleType
    one: Any          # 1 in the program's dtype

    def input(self, name: str, shape: tuple[int, ...]) -> Array: ...
    def zeros(self, shape: tuple[int, ...]) -> Array: ...
    def empty(self, shape: tuple[int, ...]) -> Array: ...
    def dummy(self, ndim: int) -> Array: ...
    def site(self, kernel: Any, *args: Any, block: int | None = None) -> Any: ...
    def product(self, a: Array, w: Array, out: Array) -> Launch: ...


class RecurrentMask(Protocol):
    """What a norm needs from a program's cell variants (a :class:`~.programs.Variants`): the recurrent
    dropout mask on ``h_{t-1}``, or None."""

    h_mask: Array | None


ROW = ck.ROW_THREADS  # a row's block


def rows(n: int) -> int:
    """The threads of a launch over ``n`` rows, one block of :data:`ROW` threads each."""
    return n * ROW


def no_launch(t: int, n: int) -> None:
    """A launch that does nothing (layer norm off)."""
    return None


def split_gru(spec: RNNSpec) -> bool:
    """Whether the recurrent product is normalised in two parts (the reset-before GRU's r, z and n)."""
    return spec.mode == "gru" and not spec.reset_after


def gain_inputs(spec: RNNSpec, w: DirectionWeights, shift: bool = True) -> dict[str, Array]:
    """The programs' gain inputs, by name (``{}`` without layer norm): ``g_hh`` (the reset-before GRU:
    ``g_rz`` and ``g_n``), and the LSTM's ``g_c`` and (``shift``: the forward's) ``b_c``."""
    if w.norm is None:
        return {}
    g_hh = w.norm.g_hh
    named = ({"g_rz": g_hh[gate_slice(spec, "r", "z")], "g_n": g_hh[gate_slice(spec, "n")]} if split_gru(spec)
             else {"g_hh": g_hh})
    if spec.has_cell:
        named["g_c"] = w.norm.g_c
        if shift:
            named["b_c"] = w.norm.b_c
    return named


class ForwardNorm:
    """A forward program's statistics (``(T, B, S, 2)`` when kept for a backward) and its launches of
    :func:`~.kernels.norm_step`; every launch is a no-op without layer norm."""

    def __init__(self, p: NormProgram):
        self.p, self.on, self.keep = p, p.spec.layer_norm, p.shape.keep
        s = p.shape
        self.stats = p.zeros((s.T, s.B, p.spec.norms_per_step, 2)) if self.on and s.keep else p.dummy(4)
        self.eps = s.dtype.type(p.spec.layer_norm_eps)

    def product(self, v: Array, gain: str, slot: int) -> Launch:
        """``(t, n) -> None``: ``v[:n] = gain * LN(v[:n])`` (``gain``: the input of that name), its statistics
        into slot ``slot``."""
        if not self.on:
            return no_launch
        g = self.p.input(gain, (v.shape[1],))
        site = self.p.site(ck.norm_step, one=self.p.one, eps=self.eps, v=v, g=g, keep=self.keep,
                           stats=self.stats, slot=slot, block=ROW)
        return lambda t, n: site(rows(n), t, n) if n else None

    def kept(self) -> Array | None:
        """The statistics for the cache (a copy), or None."""
        return self.stats.copy() if self.on and self.keep else None


class BackwardNorm:
    """A backward program's side of layer norm: the forward's statistics and ``h_{t-1}`` as inputs, every
    step's raw recurrent product(s) computed again before the loop (:meth:`recompute`), the launches of
    :func:`~.kernels.norm_backward_step` and the gains' reductions after the loop."""

    def __init__(self, p: NormProgram, v: RecurrentMask, h_prev: Array):
        s = p.shape
        self.p, self.v, self.h_prev = p, v, h_prev
        self.stats = p.input("stats", (s.T, s.B, p.spec.norms_per_step, 2))
        self.h_rec = p.empty(h_prev.shape) if v.h_mask is not None else h_prev   # h_{t-1} * mask
        # (r, scratch, the GEMM over every step's rows), every view made here (a capture of recompute may
        # only write into existing arrays)
        self._products: list[tuple[Array | None, Array | None, Callable[[], None]]] = []

    def product(self, W: Array, r: Array | None = None) -> Array:
        """``(T, B, rows of W)``: every step's ``h_rec @ W.T`` (of ``r * h_rec`` when ``r`` is given: the
        reset-before GRU's n part), filled by :meth:`recompute`."""
        s = self.p.shape
        raw = self.p.empty((s.T, s.B, W.shape[0]))
        scratch = self.p.empty(self.h_prev.shape) if r is not None else None
        h = self.h_rec if scratch is None else scratch
        gemm = self.p.product(h.reshape(s.T * s.B, -1), W.T, raw.reshape(s.T * s.B, -1))
        self._products.append((r, scratch, lambda: gemm(0, s.T * s.B)))
        return raw

    def recompute(self) -> None:
        """The raw products of every step (before the loop: one GEMM each, over ``T * B`` rows)."""
        xp = self.p.xp
        if self.v.h_mask is not None:
            xp.multiply(self.h_prev, self.v.h_mask, out=self.h_rec)
        for r, scratch, gemm in self._products:
            if r is not None:
                xp.multiply(r, self.h_rec, out=scratch)
            gemm()

    def grad(self, src: Array, per_step: bool, gain: Array, raw: Array, slot: int, dst: Array) -> Launch:
        """``(t, n) -> None``: ``dst[t, :n]``, the cotangent of ``raw[t, :n]`` through ``gain * LN(.)`` from
        ``src[t]`` (``per_step``) or ``src[0]``, that of the result."""
        p = self.p
        inverse = p.shape.dtype.type(1.0 / raw.shape[2])
        site = p.site(ck.norm_backward_step, one=p.one, inv_width=inverse, src=src, per_step=per_step, g=gain,
                      raw=raw, stats=self.stats, slot=slot, dst=dst, block=ROW)
        return lambda t, n: site(rows(n), t, n)


def product_grads(d_norm: Array, raw: Array, stats: Array, slot: int) -> tuple[Array, Array]:
    """``(g_hh's gradient, b_hh's)`` of one normalised product from ``d_norm``, the cotangent of
    ``g * LN(raw)`` at every step and row."""
    return gain_grads(d_norm, raw, stats[:, :, slot])
