"""The cupy engine's time loops of a custom cell (:mod:`arrayrnn.core.cell_registry`): one
:class:`~.programs.StepProgram` per pass, around the cell's generated kernels (:mod:`.custom_kernels`).

Per step, as the built-in programs of :mod:`.programs` (``H``: the hidden size, ``G*H`` the gate width)::

    forward:   hh[:n] = (h * h_mask)[:n] @ W_hh.T      # the step's recurrent product (a kernel)
               custom_forward_step(t, n, ...)          # the cell's forward: y[t], h, c, residuals
    backward:  custom_backward_step(t, n, ...)         # the cell's backward: dpre_in[t] (dpre_rec[t]),
                                                       #   dh_carry (h's pointwise part), dc
               dh_gemm[:n] = dpre_rec[t, :n] @ W_hh;  dh_gemm[:n] *= h_mask[:n]

The carry into step ``t-1`` is ``dh_gemm + dh_carry`` (two buffers, so that no GEMM accumulates); a split
gate's cotangents reach the GEMM through ``dpre_rec``, a stack of its own (the reference engine's
``DirectionGrads.dpre_rec``), which equals ``dpre_in`` elsewhere. What a custom cell leaves out: zoneout
(refused by ``RNNSpec``) and layer normalisation (declined by the engine's ``check``).
"""

from __future__ import annotations

from typing import Any

from ...core.spec import RNNSpec
from ..base import DirectionCache, DirectionForward, DirectionGrads, DirectionWeights
from . import custom_kernels
from .programs import Shape, StepProgram, Variants

Array = Any


class CustomForward(StepProgram):
    def __init__(self, dev: Any, spec: RNNSpec, shape: Shape):
        super().__init__(dev, spec, shape)
        cell, keep = spec.custom_cell, shape.keep
        T, B, H, G, W = shape.T, shape.B, spec.hidden_size, spec.gate_size, spec.cell_width
        self.xw, self.W_hhT = self.input("xw", (T, B, G)), self.input("W_hhT", (H, G))
        self.h, self.y, self.hh = self.input("h", (B, H)), self.zeros((T, B, H)), self.empty((B, G))
        self.res_all = self.zeros((T, B, cell.num_residuals * H)) if keep else self.dummy(3)
        named = dict(xw=self.xw, hh=self.hh, h=self.h, y=self.y, keep=keep, res_all=self.res_all)
        self.c = self.c_all = None
        if W:
            self.c = named["c"] = self.input("c", (B, W))
            self.c_all = named["c_all"] = self.zeros((T, B, W)) if keep else self.dummy(3)
        if cell.split:
            named["inner"] = self.input("inner", (len(cell.split) * H,))
        self.v = Variants(self, H, H)
        self.step = custom_kernels.site(self, cell, "forward", **named)
        self.rec = self.v.recurrent_product(self.h, None, self.W_hhT, self.hh)

    def load(self, w: DirectionWeights, xw: Array, h0: Array, c0: Array | None) -> None:
        extra = {"c": c0} if self.c is not None else {}
        if self.spec.custom_cell.split:
            extra["inner"] = w.inner_bias if w.inner_bias is not None else 0
        self.copy_in(xw=xw, W_hhT=w.W_hh.T, h=h0, **extra, **Variants.inputs(w))

    def issue(self) -> None:
        H = self.h.shape[1]
        for t, n in self.steps():
            if n:
                self.rec(t, n)
                self.step(n * H, t, n)

    def result(self, xw: Array) -> DirectionForward:
        c = self.c.copy() if self.c is not None else None
        cache = None
        if self.shape.keep:
            cache = DirectionCache(residuals=self.res_all.copy(),
                                   c=self.c_all.copy() if self.c is not None else None)
        return DirectionForward(self.y.copy(), self.h.copy(), c, cache)


class CustomBackward(StepProgram):
    def __init__(self, dev: Any, spec: RNNSpec, shape: Shape):
        super().__init__(dev, spec, shape)
        cell = spec.custom_cell
        T, B, H, G, W = shape.T, shape.B, spec.hidden_size, spec.gate_size, spec.cell_width
        self.dy, self.W_hh = self.input("dy", (T, B, H)), self.input("W_hh", (G, H))
        self.res_all = self.input("res_all", (T, B, cell.num_residuals * H))
        self.dh_gemm, self.dh_carry = self.input("dh_gemm", (B, H)), self.zeros((B, H))
        self.dpre_in = self.zeros((T, B, G))
        self.dpre_rec = self.zeros((T, B, G)) if cell.split else self.dpre_in
        named = {"res_all": self.res_all, "dy": self.dy, "dh_gemm": self.dh_gemm, "dh_carry": self.dh_carry,
                 "dpre_in": self.dpre_in}
        if cell.split:
            named["dpre_rec"] = self.dpre_rec
        self.dc = None
        if W:
            self.dc = named["dc"] = self.input("dc", (B, W))
            named["dc_seq"] = self.input("dc_seq", (T, B, W)) if shape.dc_seq else self.dummy(3)
            named["has_seq"] = shape.dc_seq
        self.v = Variants(self, H, H)
        self.step = custom_kernels.site(self, cell, "backward", **named)
        self.gemm = self.product(self.dpre_rec, self.W_hh, self.dh_gemm)

    def load(self, w: DirectionWeights, fwd: DirectionForward, h_prev: Array, c_prev: Array | None, dy: Array,
             dh_n: Array, dc_n: Array | None, dc_seq: Array | None) -> None:
        extra = {"dc": dc_n} if self.dc is not None else {}
        if dc_seq is not None:
            extra["dc_seq"] = dc_seq
        self.copy_in(dy=dy, res_all=fwd.cache.residuals, W_hh=w.W_hh, dh_gemm=dh_n, **extra,
                     **Variants.inputs(w))

    def issue(self) -> None:
        H = self.dh_gemm.shape[1]
        self.dh_carry[...] = 0
        for t, n in self.backward_steps():
            self.step(n * H, t, n)
            self.gemm(t, n)
            self.v.mask_gradient(self.dh_gemm, n)

    def result(self) -> DirectionGrads:
        dpre_in = self.dpre_in.copy()
        dpre_rec = self.dpre_rec.copy() if self.spec.custom_cell.split else dpre_in
        dc = self.dc.copy() if self.dc is not None else None
        return DirectionGrads(dpre_in, dpre_rec, None, self.dh_gemm + self.dh_carry, dc)

