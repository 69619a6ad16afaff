"""The cupy engine's time loops, one :class:`StepProgram` per mode and pass, each on buffers of its own.

A program is built once per key (shape, lengths, options; :mod:`.graphs`): it allocates its buffers and
packs its kernels' arguments (:mod:`.launch`) once. Per call, ``load`` copies the inputs into its input
buffers, ``issue`` enqueues the loop and ``result`` copies the outputs out. ``issue`` only enqueues work on
the current stream into buffers that never move, and never allocates or reads a value back, so its stream
capture is a CUDA graph every later call replays. Per step, roughly (an LSTM forward)::

    product_step(t, n, h, W_hh.T, hh)              # hh[:n] = h[:n] @ W_hh.T, a kernel (.kernels)
    lstm_forward_step(t, n, xw, hh, c, h, y, ...)  # ONE fused kernel (.kernels): gates, state, y

The step's GEMMs are our own kernel, not ``cupy.matmul``: CuPy refuses every cuBLAS call while a stream
captures (``cupy_backends/cuda/libs/cublas.pyx``, ``setStream``; cupy#6290), so a captured cuBLAS GEMM
would fail every capture on a GPU.

and backward ``lstm_backward_step`` then ``dh[:n] = dpre_in[t, :n] @ W_hh``. The reset-before GRU needs
two GEMM + kernel pairs per step (``W_hn`` multiplies ``r * h``), and so does LSTM projection (``W_hr``);
recurrent dropout adds one multiply per step, zoneout one kernel (and one add backward). Inactive rows are
never written, so entries past a row's end keep the zeros the buffers were allocated with; the batch sizes
are part of the key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ...core.spec import RNNSpec
from ..base import DirectionCache, DirectionForward, DirectionGrads, DirectionWeights, VariantFlags
from ..cells import gate_slice
from ..layer_norm import gain_grads
from . import kernels as ck
from . import launch as cuda_launch
from .norms import ROW, BackwardNorm, ForwardNorm, gain_inputs, no_launch, product_grads, rows

Array = Any
Launch = Callable[[int, int], None]  # (t, n)


@dataclass(frozen=True)
class Shape:
    """A program's key apart from the spec: sizes, lengths, direction and options."""

    T: int
    B: int
    batch_sizes: bytes        # int64 per step: hashed at C speed (a tuple of ints costs O(T) in Python)
    reverse: bool
    flags: VariantFlags
    dtype: np.dtype
    keep: bool = False        # forward: keep the cache for a backward
    dc_seq: bool = False      # backward: a cotangent of every step's cell (all-states LSTM)


class StepProgram:
    """Buffers, launch sites and the loop of one direction (see the module docstring). ``dev`` is the
    engine's :class:`~.engine.Device` (its ``xp`` and ``site``)."""

    def __init__(self, dev: Any, spec: RNNSpec, shape: Shape):
        self.dev, self.xp, self.spec, self.shape = dev, dev.xp, spec, shape
        self.one = shape.dtype.type(1)
        self.batch_sizes = [int(n) for n in np.frombuffer(shape.batch_sizes, np.int64)]
        self._inputs: dict[str, Array] = {}
        self.nbytes = 0  # device memory its buffers hold (what graphs.GraphCache budgets)

    # -- buffers and sites -------------------------------------------------------------------------
    def input(self, name: str, shape: tuple[int, ...]) -> Array:
        """A buffer ``load`` fills from the call's array of that name."""
        self._inputs[name] = buffer = self.empty(shape)
        return buffer

    def zeros(self, shape: tuple[int, ...]) -> Array:
        return self._held(self.xp.zeros(shape, self.shape.dtype))

    def empty(self, shape: tuple[int, ...]) -> Array:
        return self._held(self.xp.empty(shape, self.shape.dtype))

    def _held(self, buffer: Array) -> Array:
        self.nbytes += buffer.nbytes
        return buffer

    def dummy(self, ndim: int) -> Array:
        """Stand-in for an absent array argument (same ndim, so one compiled signature per dtype)."""
        return self.zeros((1,) * ndim)

    def site(self, kernel: Any, /, *, block: int | None = None, **values: Any) -> Any:
        """``kernel`` with its arguments named by its parameters (every one but ``t, n``; a missing or extra
        name is an error, :func:`.launch.bind`) packed once: ``site(elements, t, n)`` launches it (in
        blocks of ``block`` threads if given)."""
        return self.dev.site(kernel, cuda_launch.bind(kernel, values), block=block)

    # -- per call -----------------------------------------------------------------------------------
    def copy_in(self, **arrays: Array | float) -> None:
        """Every input buffer from the array of its name (a scalar fills it)."""
        if set(arrays) != set(self._inputs):
            raise AssertionError(f"inputs {sorted(arrays)} != buffers {sorted(self._inputs)}")
        for name, value in arrays.items():
            self._inputs[name][...] = value

    def steps(self) -> Iterator[tuple[int, int]]:
        """``(t, n)``: every step in the direction's order and its active row count."""
        bs = self.batch_sizes
        order = range(len(bs) - 1, -1, -1) if self.shape.reverse else range(len(bs))
        return ((t, bs[t]) for t in order)

    def backward_steps(self) -> Iterator[tuple[int, int]]:
        """The active steps, last processed first."""
        return ((t, n) for t, n in reversed(list(self.steps())) if n)

    def product(self, a: Array, w: Array, out: Array) -> Launch:
        """``(t, n) -> None``: ``out[:n] = a[:n] @ w`` in one launch of :func:`~.kernels.product_step`
        (``a``, ``out``: a step buffer ``(B, .)``, or a stack ``(T, B, .)`` whose step ``t`` it takes)."""
        a_step, out_step = a.ndim == 3, out.ndim == 3
        slices, width = ck.product_slices(w.shape[0]), out.shape[-1]
        block = ck.PRODUCT_COLUMNS * slices if slices > 1 else None  # None: a thread per output
        site = self.site(ck.product_step, one=self.one, a=a if a_step else a[None], a_per_step=a_step, w=w,
                         out=out if out_step else out[None], out_per_step=out_step, slices=slices,
                         block=block)
        per_row = -(-width // ck.PRODUCT_COLUMNS) * block if block else width  # threads a row takes
        return lambda t, n: site(n * per_row, t, n) if n else None

    def add(self, a: Array, b: Array) -> None:
        """``a += b`` in one operation (``a[:n] += b`` would also copy ``a[:n]`` back onto itself)."""
        self.xp.add(a, b, out=a)

    def multiply(self, a: Array, b: Array) -> None:
        self.xp.multiply(a, b, out=a)

    def gates_into(self, xw: Array) -> Array:
        """The caller's projection buffer ``xw`` (the driver's fresh array), now holding this call's gate
        activations: the cache's ``gates``, without a new allocation."""
        xw[...] = self.xw
        return xw


class Variants:
    """One direction's cell-variant masks as program inputs, and the per-step work around the fused step
    kernels (recurrent dropout: ``h * mask`` into the GEMM and the GEMM's gradient times the mask;
    zoneout: the previous state kept for the mix)."""

    def __init__(self, p: StepProgram, H_out: int, H: int):
        s, flags = p.shape, p.shape.flags
        self.p, self.zone_h, self.zone_c = p, flags.zoneout_h, flags.zoneout_c
        self.h_mask = p.input("h_mask", (s.B, H_out)) if flags.recurrent else None
        self.h_rec = p.empty((s.B, H_out)) if flags.recurrent else None
        self.m_h = p.input("m_h", (s.T, s.B, H_out)) if self.zone_h else p.dummy(3)
        self.m_c = p.input("m_c", (s.T, s.B, H)) if self.zone_c else p.dummy(3)
        self.h_old = p.empty((s.B, H_out)) if self.zone_h else None
        self.c_old = p.empty((s.B, H)) if self.zone_c else None

    def zoneout(self, new: Array, y: Array, h: Array) -> Any:
        """The site of zoneout of ``h`` (None without it): ``y[t]`` and ``h`` become the mix of the state kept
        before the step and the step's own output ``new[t]``."""
        if not self.zone_h:
            return None
        return self.p.site(ck.zoneout_step, m=self.m_h, prev=self.h_old, new=new, y=y, h=h)

    @staticmethod
    def inputs(w: DirectionWeights) -> dict[str, Array]:
        named = {"h_mask": w.h_mask, "m_h": w.zoneout_h, "m_c": w.zoneout_c}
        return {name: a for name, a in named.items() if a is not None}

    def recurrent_product(self, h: Array, c: Array | None, W: Array, out: Array) -> Launch:
        """``(t, n) -> None``: a forward step's recurrent GEMM ``out[:n] = h[:n] @ W`` (``h * mask`` with
        recurrent dropout), the states it starts from kept first for zoneout's mix."""
        gemm = self.p.product(h if self.h_mask is None else self.h_rec, W, out)

        def launch(t: int, n: int) -> None:
            if not n:
                return
            if self.zone_h:
                self.h_old[:n] = h[:n]
            if self.zone_c:
                self.c_old[:n] = c[:n]
            if self.h_mask is not None:
                self.p.xp.multiply(h[:n], self.h_mask[:n], out=self.h_rec[:n])
            gemm(t, n)

        return launch

    def mask_gradient(self, d: Array, n: int) -> None:
        """``d[:n] *= mask``: a recurrent GEMM's gradient back through the recurrent dropout."""
        if self.h_mask is not None:
            self.p.multiply(d[:n], self.h_mask[:n])


# -- the LSTM step kernels' shared arguments ----------------------------------------------------------
class LstmForwardArgs(NamedTuple):
    """What every LSTM forward step kernel takes (plain, peephole, layer-normalised), by the kernels'
    parameter names: built once per program, bound by name at its one site (``c_all``: the step's own cell,
    ``c_cand`` under zoneout of ``c``)."""

    one: Any
    xw: Array
    hh: Array
    c: Array
    h: Array
    y: Array
    m: Array
    project: bool
    keep: bool
    c_all: Array
    tanh_c_all: Array
    lo: Any
    hi: Any


class LstmBackwardArgs(NamedTuple):
    """What every LSTM backward step kernel takes (plain, peephole, layer-normalised), by the kernels'
    parameter names: built once per program, bound by name at its one site (``c_all``: the step's own cell;
    ``dy``: the step's share of the cotangent, zoneout's split)."""

    one: Any
    gates: Array
    c_all: Array
    tanh_c_all: Array
    c_prev: Array
    dy: Array
    dh: Array
    dm: Array
    project: bool
    dc: Array
    dpre_in: Array
    use_clip: bool
    lo: Any
    hi: Any


# -- forward ------------------------------------------------------------------------------------------
class RnnForward(StepProgram):
    def __init__(self, dev: Any, spec: RNNSpec, shape: Shape):
        super().__init__(dev, spec, shape)
        T, B, H = shape.T, shape.B, spec.hidden_size
        self.xw, self.W_hhT = self.input("xw", (T, B, H)), self.input("W_hhT", (H, H))
        self.h = self.input("h", (B, H))
        self.y, self.hh = self.zeros((T, B, H)), self.empty((B, H))
        self.v = Variants(self, H, H)
        self.norm = ForwardNorm(self)
        self.norm_hh = self.norm.product(self.hh, "g_hh", 0)
        self.cand = self.zeros((T, B, H)) if self.v.zone_h else self.y  # zoneout: the step's own output
        relu = spec.mode == "rnn_relu"
        self.step = self.site(ck.rnn_forward_step, one=self.one, relu=relu, xw=self.xw, hh=self.hh, h=self.h,
                              y=self.cand)
        self.zone = self.v.zoneout(self.cand, self.y, self.h)
        self.rec = self.v.recurrent_product(self.h, None, self.W_hhT, self.hh)

    def load(self, w: DirectionWeights, xw: Array, h0: Array, c0: Array | None) -> None:
        self.copy_in(xw=xw, W_hhT=w.W_hh.T, h=h0, **Variants.inputs(w), **gain_inputs(self.spec, w))

    def issue(self) -> None:
        H = self.h.shape[1]
        for t, n in self.steps():
            if n:
                self.rec(t, n)
                self.norm_hh(t, n)
                self.step(n * H, t, n)
                if self.zone is not None:
                    self.zone(n * H, t, n)

    def result(self, xw: Array) -> DirectionForward:
        cache = None
        if self.shape.keep:
            cand = self.cand.copy() if self.v.zone_h else None
            cache = DirectionCache(gates=cand, norm_stats=self.norm.kept())
        return DirectionForward(self.y.copy(), self.h.copy(), None, cache)


class LstmForward(StepProgram):
    def __init__(self, dev: Any, spec: RNNSpec, shape: Shape):
        super().__init__(dev, spec, shape)
        T, B, H, P, G, keep = shape.T, shape.B, spec.hidden_size, spec.output_size, spec.gate_size, shape.keep
        self.project, self.peep = spec.proj_size > 0, spec.peepholes
        self.xw, self.W_hhT = self.input("xw", (T, B, G)), self.input("W_hhT", (P, G))
        self.W_hrT = self.input("W_hrT", (H, P)) if self.project else None
        self.h, self.c = self.input("h", (B, P)), self.input("c", (B, H))
        self.y, self.hh, self.m = self.zeros((T, B, P)), self.empty((B, G)), self.empty((B, H))
        self.v = Variants(self, P, H)
        self.c_all = self.zeros((T, B, H)) if keep else self.dummy(3)
        self.tanh_c = self.zeros((T, B, H)) if keep else self.dummy(3)
        self.c_cand = self.zeros((T, B, H)) if keep and self.v.zone_c else self.c_all  # the step's own cell
        lo, hi = spec.cell_clip if spec.cell_clip is not None else (-np.inf, np.inf)
        args = LstmForwardArgs(one=self.one, xw=self.xw, hh=self.hh, c=self.c, h=self.h, y=self.y, m=self.m,
                               project=self.project, keep=keep, c_all=self.c_cand, tanh_c_all=self.tanh_c,
                               lo=shape.dtype.type(lo), hi=shape.dtype.type(hi))
        self.P = self.input("P", (3, H)) if self.peep else self.dummy(2)
        self.norm = ForwardNorm(self)
        self.step_threads = rows(B) if spec.layer_norm else B * H  # every row: inactive ones get zero gates
        if spec.layer_norm:  # one kernel: the product's norm, the gates, the cell's norm (a block per row)
            self.step = self._norm_step(args)
        elif self.peep:
            self.step = self.site(ck.lstm_peephole_forward_step, P=self.P, **args._asdict())
        else:
            self.step = self.site(ck.lstm_forward_step, **args._asdict())
        v = self.v
        self.zone_h = v.zoneout(self.y, self.y, self.h)
        self.zone_c = (self.site(ck.zoneout_cell_step, m=v.m_c, prev=v.c_old, c=self.c, keep=keep,
                                 c_all=self.c_all) if v.zone_c else None)
        self.rec = v.recurrent_product(self.h, self.c, self.W_hhT, self.hh)
        self.out_proj = self.product(self.m, self.W_hrT, self.y) if self.project else None

    def _norm_step(self, args: LstmForwardArgs) -> Any:
        H, G, norm = self.spec.hidden_size, self.spec.gate_size, self.norm
        g_hh, g_c, b_c = self.input("g_hh", (G,)), self.input("g_c", (H,)), self.input("b_c", (H,))
        return self.site(ck.lstm_norm_forward_step, eps=norm.eps, g_hh=g_hh, P=self.P, peep=self.peep,
                         g_c=g_c, b_c=b_c, stats=norm.stats, **args._asdict(), block=ROW)

    def load(self, w: DirectionWeights, xw: Array, h0: Array, c0: Array | None) -> None:
        extra = {"W_hrT": w.W_hr.T} if self.project else {}
        if self.peep:
            extra["P"] = w.P
        self.copy_in(xw=xw, W_hhT=w.W_hh.T, h=h0, c=c0, **extra, **Variants.inputs(w),
                     **gain_inputs(self.spec, w))

    def issue(self) -> None:
        H, P = self.c.shape[1], self.h.shape[1]
        for t, n in self.steps():
            self.rec(t, n)
            self.step(self.step_threads, t, n)  # every row: inactive ones get zero gates (the cache's)
            if not n:
                continue
            if self.project:
                self.out_proj(t, n)
                self.h[:n] = self.y[t, :n]
            if self.zone_h is not None:
                self.zone_h(n * P, t, n)
            if self.zone_c is not None:
                self.zone_c(n * H, t, n)

    def result(self, xw: Array) -> DirectionForward:
        cache = None
        if self.shape.keep:
            c_cand = self.c_cand.copy() if self.v.zone_c else None
            cache = DirectionCache(gates=self.gates_into(xw), c=self.c_all.copy(), tanh_c=self.tanh_c.copy(),
                                   c_cand=c_cand, norm_stats=self.norm.kept())
        return DirectionForward(self.y.copy(), self.h.copy(), self.c.copy(), cache)


class GruForward(StepProgram):
    """The reset-after GRU (cuDNN's): one GEMM ``h @ W_hh.T`` and one kernel per step."""

    def __init__(self, dev: Any, spec: RNNSpec, shape: Shape):
        super().__init__(dev, spec, shape)
        T, B, H, G, keep = shape.T, shape.B, spec.hidden_size, spec.gate_size, shape.keep
        self.xw, self.W_hhT = self.input("xw", (T, B, G)), self.input("W_hhT", (H, G))
        self.b_hn, self.h = self.input("b_hn", (H,)), self.input("h", (B, H))
        self.y, self.hh = self.zeros((T, B, H)), self.empty((B, G))
        self.hn_all = self.zeros((T, B, H)) if keep else self.dummy(3)
        self.v = Variants(self, H, H)
        self.norm = ForwardNorm(self)
        self.norm_hh = self.norm.product(self.hh, "g_hh", 0)
        self.step = self.site(ck.gru_forward_step, one=self.one, xw=self.xw, hh=self.hh, b_hn=self.b_hn,
                              h=self.h, y=self.y, keep=keep, hn_all=self.hn_all)
        self.zone = self.v.zoneout(self.y, self.y, self.h)
        self.rec = self.v.recurrent_product(self.h, None, self.W_hhT, self.hh)

    def load(self, w: DirectionWeights, xw: Array, h0: Array, c0: Array | None) -> None:
        b_hn = w.inner_bias if w.inner_bias is not None else 0
        self.copy_in(xw=xw, W_hhT=w.W_hh.T, b_hn=b_hn, h=h0, **Variants.inputs(w),
                     **gain_inputs(self.spec, w))

    def issue(self) -> None:
        B, H = self.shape.B, self.h.shape[1]
        for t, n in self.steps():
            if n:
                self.rec(t, n)
                self.norm_hh(t, n)
            self.step(B * H, t, n)
            if n and self.zone is not None:
                self.zone(n * H, t, n)

    def result(self, xw: Array) -> DirectionForward:
        cache = None
        if self.shape.keep:
            cache = DirectionCache(gates=self.gates_into(xw), hn=self.hn_all.copy(),
                                   norm_stats=self.norm.kept())
        return DirectionForward(self.y.copy(), self.h.copy(), None, cache)


class GruResetBeforeForward(StepProgram):
    """The reset-before GRU: ``h @ W_rz.T`` and the r, z kernel, then ``(r*h) @ W_hn.T`` and the n kernel."""

    def __init__(self, dev: Any, spec: RNNSpec, shape: Shape):
        super().__init__(dev, spec, shape)
        T, B, H = shape.T, shape.B, spec.hidden_size
        self.xw, self.h = self.input("xw", (T, B, spec.gate_size)), self.input("h", (B, H))
        self.W_rzT, self.W_nT = self.input("W_rzT", (H, 2 * H)), self.input("W_nT", (H, H))
        self.y, self.hrz = self.zeros((T, B, H)), self.empty((B, 2 * H))
        self.rh, self.hn = self.empty((B, H)), self.empty((B, H))
        v = self.v = Variants(self, H, H)
        self.norm = ForwardNorm(self)  # the r, z part and the n part, each over its own row
        self.norm_rz = self.norm.product(self.hrz, "g_rz", 0)
        self.norm_n = self.norm.product(self.hn, "g_n", 1)
        h_seen = v.h_rec if v.h_rec is not None else self.h  # r * (h * mask) with recurrent dropout
        self.rz = self.site(ck.gru_rz_step, one=self.one, xw=self.xw, hrz=self.hrz, h=h_seen, rh=self.rh)
        self.n_step = self.site(ck.gru_n_step, xw=self.xw, hn=self.hn, h=self.h, y=self.y)
        self.zone = v.zoneout(self.y, self.y, self.h)
        self.rec_rz = v.recurrent_product(self.h, None, self.W_rzT, self.hrz)
        self.rec_n = self.product(self.rh, self.W_nT, self.hn)

    def load(self, w: DirectionWeights, xw: Array, h0: Array, c0: Array | None) -> None:
        spec = self.spec
        self.copy_in(xw=xw, h=h0, W_rzT=w.W_hh[gate_slice(spec, "r", "z")].T,
                     W_nT=w.W_hh[gate_slice(spec, "n")].T, **Variants.inputs(w), **gain_inputs(spec, w))

    def issue(self) -> None:
        B, H = self.shape.B, self.h.shape[1]
        for t, n in self.steps():
            if n:
                self.rec_rz(t, n)
                self.norm_rz(t, n)
            self.rz(B * H, t, n)
            if not n:
                continue
            self.rec_n(t, n)
            self.norm_n(t, n)
            self.n_step(n * H, t, n)
            if self.zone is not None:
                self.zone(n * H, t, n)

    def result(self, xw: Array) -> DirectionForward:
        keep = self.shape.keep
        cache = DirectionCache(gates=self.gates_into(xw), norm_stats=self.norm.kept()) if keep else None
        return DirectionForward(self.y.copy(), self.h.copy(), None, cache)


# -- backward -----------------------------------------------------------------------------------------
class ZoneoutSplit:
    """The backward's side of zoneout of ``h``: before a step, the total cotangent ``dy[t] + carry`` is
    split into the step's own share (a stack the step kernel reads as its ``dy``, with ``carry`` zeroed) and
    ``h_{t-1}``'s (kept); after the step's GEMM that share is added to the carry. Without zoneout the step
    kernel reads ``dy`` itself (``self.dy``) and nothing else happens."""

    def __init__(self, p: StepProgram, v: Variants, dy: Array, carry: Array):
        self.p, self.zone, self.dy = p, v.zone_h, dy
        if self.zone:
            self.direct, self.dy = p.empty(carry.shape), p.empty(dy.shape)
            self.site = p.site(ck.zoneout_split_step, one=p.one, m=v.m_h, dy=dy, dh=carry, dy_new=self.dy,
                               direct=self.direct)

    def before(self, t: int, n: int) -> None:
        if self.zone:
            self.site(n * self.direct.shape[1], t, n)

    def after(self, carry: Array, n: int) -> None:
        if self.zone:
            self.p.add(carry[:n], self.direct[:n])


class RnnBackward(StepProgram):
    def __init__(self, dev: Any, spec: RNNSpec, shape: Shape):
        super().__init__(dev, spec, shape)
        T, B, H = shape.T, shape.B, spec.hidden_size
        self.dy, self.own = self.input("dy", (T, B, H)), self.input("own", (T, B, H))
        self.W_hh, self.dh = self.input("W_hh", (H, H)), self.input("dh", (B, H))
        self.d_pre = self.zeros((T, B, H))
        self.v = Variants(self, H, H)
        self.split = ZoneoutSplit(self, self.v, self.dy, self.dh)
        relu = spec.mode == "rnn_relu"
        self.step = self.site(ck.rnn_backward_step, one=self.one, relu=relu, y=self.own, dy=self.split.dy,
                              dh=self.dh, d_pre=self.d_pre)
        self.d_rec = self.d_pre  # the GEMM's operand: with layer norm the raw product's cotangent
        if spec.layer_norm:
            self.norm = BackwardNorm(self, self.v, self.input("h_prev", (T, B, H)))
            self.raw = self.norm.product(self.W_hh)
            self.d_rec = self.zeros((T, B, H))
            g_hh = self.input("g_hh", (H,))
            self.norm_grad = self.norm.grad(self.d_pre, True, g_hh, self.raw, 0, self.d_rec)
        self.rec = self.product(self.d_rec, self.W_hh, self.dh)

    def load(self, w: DirectionWeights, fwd: DirectionForward, h_prev: Array, c_prev: Array | None, dy: Array,
             dh_n: Array, dc_n: Array | None, dc_seq: Array | None) -> None:
        own = fwd.cache.gates if self.v.zone_h else fwd.y  # the step's own output (before zoneout)
        norm = {"h_prev": h_prev, "stats": fwd.cache.norm_stats} if self.spec.layer_norm else {}
        self.copy_in(dy=dy, own=own, W_hh=w.W_hh, dh=dh_n, **Variants.inputs(w), **norm,
                     **gain_inputs(self.spec, w))

    def issue(self) -> None:
        H = self.dh.shape[1]
        if self.spec.layer_norm:
            self.norm.recompute()
        for t, n in self.backward_steps():
            self.split.before(t, n)
            self.step(n * H, t, n)
            if self.spec.layer_norm:
                self.norm_grad(t, n)
            self.rec(t, n)
            self.v.mask_gradient(self.dh, n)
            self.split.after(self.dh, n)

    def result(self) -> DirectionGrads:
        d_pre = self.d_pre.copy()
        if not self.spec.layer_norm:
            return DirectionGrads(d_pre, d_pre, None, self.dh.copy(), None)
        g_hh, b_hh = product_grads(d_pre, self.raw, self.norm.stats, 0)
        return DirectionGrads(d_pre, self.d_rec.copy(), None, self.dh.copy(), None,
                              norm={"g_hh": g_hh, "b_hh": b_hh})


class LstmBackward(StepProgram):
    def __init__(self, dev: Any, spec: RNNSpec, shape: Shape):
        super().__init__(dev, spec, shape)
        T, B, H, P, G = shape.T, shape.B, spec.hidden_size, spec.output_size, spec.gate_size
        self.project, self.peep = spec.proj_size > 0, spec.peepholes
        self.dy, self.gates = self.input("dy", (T, B, P)), self.input("gates", (T, B, G))
        self.c_own, self.tanh_c = self.input("c_own", (T, B, H)), self.input("tanh_c", (T, B, H))
        self.c_prev, self.W_hh = self.input("c_prev", (T, B, H)), self.input("W_hh", (G, P))
        self.dh, self.dc = self.input("dh", (B, P)), self.input("dc", (B, H))
        self.W_hr = self.input("W_hr", (P, H)) if self.project else None
        self.dc_seq = self.input("dc_seq", (T, B, H)) if shape.dc_seq else self.dummy(3)
        self.dpre_in, self.dm = self.zeros((T, B, G)), self.empty((B, H))
        self.d_h = self.zeros((T, B, P)) if self.project else self.dummy(3)
        v = self.v = Variants(self, P, H)
        self.split = ZoneoutSplit(self, v, self.dy, self.dh)
        self.dc_direct = self.empty((B, H)) if v.zone_c else self.dummy(2)
        self.carry = (self.site(ck.cell_carry_step, one=self.one, zone=v.zone_c, m=v.m_c,
                                has_seq=shape.dc_seq, dc_seq=self.dc_seq, dc=self.dc, direct=self.dc_direct)
                      if v.zone_c or shape.dc_seq else None)
        self.add_carry = (self.site(ck.add_carry_step, dy=self.split.dy, dh=self.dh, d_h=self.d_h)
                          if self.project else None)
        self.P = self.input("P", (3, H)) if self.peep else self.dummy(2)
        self.d_rec = self.dpre_in  # the GEMM's operand: with layer norm the raw product's cotangent
        args = self._step_args()
        if spec.layer_norm:  # one kernel: the cell's norm, the gates, the product's norm (a block per row)
            self.step = self._norm_step(args)
        elif self.peep:
            self.step = self.site(ck.lstm_peephole_backward_step, P=self.P, **args._asdict())
        else:
            self.step = self.site(ck.lstm_backward_step, **args._asdict())
        self.rec = self.product(self.d_rec, self.W_hh, self.dh)
        self.out_proj = self.product(self.d_h, self.W_hr, self.dm) if self.project else None

    def _step_args(self) -> LstmBackwardArgs:
        use_clip, dtype = self.spec.cell_clip is not None, self.shape.dtype
        lo, hi = self.spec.cell_clip if use_clip else (-np.inf, np.inf)
        return LstmBackwardArgs(one=self.one, gates=self.gates, c_all=self.c_own, tanh_c_all=self.tanh_c,
                                c_prev=self.c_prev, dy=self.split.dy, dh=self.dh, dm=self.dm,
                                project=self.project, dc=self.dc, dpre_in=self.dpre_in, use_clip=use_clip,
                                lo=dtype.type(lo), hi=dtype.type(hi))

    def _norm_step(self, args: LstmBackwardArgs) -> Any:
        T, B, spec = self.shape.T, self.shape.B, self.spec
        H, P, G = spec.hidden_size, spec.output_size, spec.gate_size
        self.norm = BackwardNorm(self, self.v, self.input("h_prev", (T, B, P)))
        self.raw = self.norm.product(self.W_hh)
        self.d_u, self.d_rec = self.zeros((T, B, H)), self.zeros((T, B, G))
        g_hh, g_c = self.input("g_hh", (G,)), self.input("g_c", (H,))
        inv = self.shape.dtype.type
        site = self.site(ck.lstm_norm_backward_step, inv_gates=inv(1.0 / G), inv_hidden=inv(1.0 / H),
                         hh_all=self.raw, stats=self.norm.stats, g_hh=g_hh, g_c=g_c, P=self.P, peep=self.peep,
                         d_u=self.d_u, dpre_rec=self.d_rec, **args._asdict(), block=ROW)
        return lambda elements, t, n: site(rows(n), t, n)

    def load(self, w: DirectionWeights, fwd: DirectionForward, h_prev: Array, c_prev: Array | None, dy: Array,
             dh_n: Array, dc_n: Array | None, dc_seq: Array | None) -> None:
        cache = fwd.cache
        extra = {"W_hr": w.W_hr} if self.project else {}
        if self.peep:
            extra["P"] = w.P
        if dc_seq is not None:
            extra["dc_seq"] = dc_seq
        if self.spec.layer_norm:
            extra.update(h_prev=h_prev, stats=cache.norm_stats, **gain_inputs(self.spec, w, shift=False))
        own_c = cache.c_cand if cache.c_cand is not None else cache.c  # the step's own cell
        self.copy_in(dy=dy, gates=cache.gates, c_own=own_c, tanh_c=cache.tanh_c, c_prev=c_prev, W_hh=w.W_hh,
                     dh=dh_n, dc=dc_n, **extra, **Variants.inputs(w))

    def issue(self) -> None:
        H, P, v = self.dc.shape[1], self.dh.shape[1], self.v
        if self.spec.layer_norm:
            self.norm.recompute()
        for t, n in self.backward_steps():
            self.split.before(t, n)
            if self.carry is not None:
                self.carry(n * H, t, n)
            if self.project:
                self.add_carry(n * P, t, n)
                self.out_proj(t, n)
            self.step(n * H, t, n)
            self.rec(t, n)
            v.mask_gradient(self.dh, n)
            self.split.after(self.dh, n)
            if v.zone_c:
                self.add(self.dc[:n], self.dc_direct[:n])

    def result(self) -> DirectionGrads:
        dpre_in = self.dpre_in.copy()
        d_h = self.d_h.copy() if self.project else None
        if not self.spec.layer_norm:
            return DirectionGrads(dpre_in, dpre_in, d_h, self.dh.copy(), self.dc.copy())
        g_hh, b_hh = product_grads(dpre_in, self.raw, self.norm.stats, 0)
        g_c, b_c = gain_grads(self.d_u, self.c_own, self.norm.stats[:, :, 1])
        return DirectionGrads(dpre_in, self.d_rec.copy(), d_h, self.dh.copy(), self.dc.copy(),
                              norm={"g_hh": g_hh, "b_hh": b_hh, "g_c": g_c, "b_c": b_c})


class GruBackward(StepProgram):
    """Both GRU variants. The carry into step ``t-1`` is split in two buffers so that no GEMM has to
    accumulate (beta = 1): ``dh = dh_gemm`` (the GEMM's output) ``+ dh_carry`` (the elementwise part,
    ``dh * z`` [+ ``drh * r``])."""

    def __init__(self, dev: Any, spec: RNNSpec, shape: Shape):
        super().__init__(dev, spec, shape)
        T, B, H, G = shape.T, shape.B, spec.hidden_size, spec.gate_size
        after = self.reset_after = spec.reset_after
        self.dy, self.gates = self.input("dy", (T, B, H)), self.input("gates", (T, B, G))
        self.h_prev, self.dh_gemm = self.input("h_prev", (T, B, H)), self.input("dh_gemm", (B, H))
        self.dh_carry, self.dpre_in = self.zeros((B, H)), self.zeros((T, B, G))
        self.dn, self.drz, self.drh = self.empty((B, H)), self.empty((B, 2 * H)), self.empty((B, H))
        if after:
            # the recurrent gradient differs from dpre_in in its n part only: that part is kept (T, B, H), the
            # whole of it only for the step's GEMM (B, 3H)
            self.hn_all, self.W_hh = self.input("hn_all", (T, B, H)), self.input("W_hh", (G, H))
            self.dn_rec, self.rec = self.zeros((T, B, H)), self.empty((B, G))
        else:
            self.W_rz, self.W_n = self.input("W_rz", (2 * H, H)), self.input("W_n", (H, H))
            self.hn_all, self.dn_rec, self.rec = self.dummy(3), self.dummy(3), self.dummy(2)
        v = self.v = Variants(self, H, H)
        self.split = ZoneoutSplit(self, v, self.dy, self.dh_gemm)
        self.step = self.site(ck.gru_backward_step, one=self.one, reset_after=after, gates=self.gates,
                              hn_all=self.hn_all, h_prev=self.h_prev, dy=self.split.dy, dh_gemm=self.dh_gemm,
                              dh_carry=self.dh_carry, dpre_in=self.dpre_in, dn_rec=self.dn_rec, rec=self.rec,
                              dn_buf=self.dn, drz=self.drz)
        self.r_step = (None if after else
                       self.site(ck.gru_r_backward_step, one=self.one, gates=self.gates, h_prev=self.h_prev,
                                 drh=self.drh, dpre_in=self.dpre_in, dh_carry=self.dh_carry, drz=self.drz))
        self.d_rec = self.d_rz = self.d_n = None  # with layer norm: the raw products' cotangents, every step
        self.norm_rec = self.norm_rz = self.norm_n = no_launch
        if spec.layer_norm:
            self._init_norm()
        self._init_products()

    def _init_products(self) -> None:
        """The step's GEMMs, from the step buffers or, with layer norm, the raw products' cotangents."""
        if self.reset_after:
            self.gemm = self.product(_operand(self.rec, self.d_rec), self.W_hh, self.dh_gemm)
            return
        self.gemm_n = self.product(_operand(self.dn, self.d_n), self.W_n, self.drh)
        self.gemm_rz = self.product(_operand(self.drz, self.d_rz), self.W_rz, self.dh_gemm)

    def _init_norm(self) -> None:
        """The layer norm's launches: the reset-after GRU's one product, or the r, z and the n parts."""
        T, B, H, G = self.shape.T, self.shape.B, self.spec.hidden_size, self.spec.gate_size
        norm = self.norm = BackwardNorm(self, self.v, self.h_prev)
        if self.reset_after:
            self.raw, self.d_rec = norm.product(self.W_hh), self.zeros((T, B, G))
            g_hh = self.input("g_hh", (G,))
            self.norm_rec = norm.grad(self.rec[None], False, g_hh, self.raw, 0, self.d_rec)
            return
        self.raw_rz = norm.product(self.W_rz)
        self.raw_n = norm.product(self.W_n, r=self.gates[:, :, gate_slice(self.spec, "r")])
        self.d_rz, self.d_n = self.zeros((T, B, 2 * H)), self.zeros((T, B, H))
        g_rz, g_n = self.input("g_rz", (2 * H,)), self.input("g_n", (H,))
        self.norm_rz = norm.grad(self.drz[None], False, g_rz, self.raw_rz, 0, self.d_rz)
        self.norm_n = norm.grad(self.dn[None], False, g_n, self.raw_n, 1, self.d_n)

    def load(self, w: DirectionWeights, fwd: DirectionForward, h_prev: Array, c_prev: Array | None, dy: Array,
             dh_n: Array, dc_n: Array | None, dc_seq: Array | None) -> None:
        spec = self.spec
        if self.reset_after:
            weights = {"hn_all": fwd.cache.hn, "W_hh": w.W_hh}
        else:
            weights = {"W_rz": w.W_hh[gate_slice(spec, "r", "z")], "W_n": w.W_hh[gate_slice(spec, "n")]}
        if spec.layer_norm:
            weights.update(stats=fwd.cache.norm_stats, **gain_inputs(spec, w))
        self.copy_in(dy=dy, gates=fwd.cache.gates, h_prev=h_prev, dh_gemm=dh_n, **weights,
                     **Variants.inputs(w))

    def issue(self) -> None:
        H, v = self.dh_gemm.shape[1], self.v
        self.dh_carry[...] = 0
        if self.spec.layer_norm:
            self.norm.recompute()
        for t, n in self.backward_steps():
            if v.zone_h:  # one carry buffer for the split
                self.add(self.dh_gemm[:n], self.dh_carry[:n])
                self.dh_carry[:n] = 0
            self.split.before(t, n)
            self.step(n * H, t, n)
            if self.reset_after:
                self.norm_rec(t, n)
                self.gemm(t, n)
            else:
                self.norm_n(t, n)
                self.gemm_n(t, n)
                v.mask_gradient(self.drh, n)  # r * (h * mask): drh * mask is r*h's gradient w.r.t. r and h
                self.r_step(n * H, t, n)
                self.norm_rz(t, n)
                self.gemm_rz(t, n)
            v.mask_gradient(self.dh_gemm, n)
            self.split.after(self.dh_carry, n)

    def result(self) -> DirectionGrads:
        dpre_in = self.dpre_in.copy()
        if self.spec.layer_norm:
            return self._norm_result(dpre_in)
        dn_rec = self.dn_rec.copy() if self.reset_after else None
        return DirectionGrads(dpre_in, dpre_in, None, self.dh_gemm + self.dh_carry, None, dn_rec)

    def _norm_result(self, dpre_in: Array) -> DirectionGrads:
        """With layer norm: the raw products' cotangents as ``dpre_rec`` and the gain reductions."""
        xp, spec, stats = self.xp, self.spec, self.norm.stats
        if self.reset_after:  # the normalised side's cotangent: dpre_in's r, z parts and r * dn (= b_hn's)
            d_norm = dpre_in.copy()
            d_norm[..., gate_slice(spec, "n")] = self.dn_rec
            g_hh, b_hh = product_grads(d_norm, self.raw, stats, 0)
            dpre_rec = self.d_rec.copy()
        else:
            rz, n = gate_slice(spec, "r", "z"), gate_slice(spec, "n")
            parts = (product_grads(dpre_in[..., rz], self.raw_rz, stats, 0),
                     product_grads(dpre_in[..., n], self.raw_n, stats, 1))
            g_hh, b_hh = (xp.concatenate([part[k] for part in parts]) for k in (0, 1))
            dpre_rec = xp.concatenate([self.d_rz, self.d_n], axis=-1)
        return DirectionGrads(dpre_in, dpre_rec, None, self.dh_gemm + self.dh_carry, None,
                              norm={"g_hh": g_hh, "b_hh": b_hh})


def _operand(buffer: Array, normed: Array | None) -> Array:
    """A step GEMM's left operand: the step buffer, or with layer norm the raw product's cotangents (every
    step's)."""
    return buffer if normed is None else normed


def forward_program(spec: RNNSpec) -> type[StepProgram]:
    if spec.mode == "lstm":
        return LstmForward
    if spec.mode == "gru":
        return GruForward if spec.reset_after else GruResetBeforeForward
    return RnnForward


def backward_program(spec: RNNSpec) -> type[StepProgram]:
    return {"lstm": LstmBackward, "gru": GruBackward}.get(spec.mode, RnnBackward)

