"""The cupy engine: the shared stack driver on CuPy arrays, cuBLAS GEMMs and fused numba-CUDA gate kernels.

The driver (:mod:`arrayrnn.engines.stack`) runs layers x directions and every GEMM that can be hoisted
out of the time loop (input projections, weight gradients, ``dx``) with CuPy, i.e. cuBLAS.
:class:`GpuKernel` runs the per-direction time loop; per step, roughly::

    hh[:n] = h[:n] @ W_hh.T               # ONE cuBLAS GEMM into a preallocated buffer (cupy.matmul, out=)
    gate_step[grid](t, n, xw, hh, h, c, y, cache...)   # ONE fused kernel (.cuda_kernels): gates, state, y

and backward ``gate_grad_step`` then ``dh[:n] = dpre_in[t, :n] @ W_hh``. The reset-before GRU needs two
GEMM + kernel pairs per step (``W_hn`` multiplies ``r * h``), and so does LSTM projection (``W_hr``).
Every buffer is allocated once per call; the kernels index the whole ``(T, B, .)`` stacks with the step
``t`` and the active row count ``n`` as arguments, so nothing is allocated or sliced on the GPU per step.

Launching numba kernels on CuPy arrays: the buffers are wrapped ONCE per call with
``numba.cuda.from_cuda_array_interface(..., sync=False)`` and every launch goes to
``numba.cuda.external_stream(<CuPy's current stream>)``, the stream CuPy's GEMMs run on; by the CUDA
Array Interface's default numba would otherwise synchronise the host with that stream at every launch.

Under ``NUMBA_ENABLE_CUDASIM=1`` (set before numba's CUDA module is imported) the same kernel code runs
on NumPy arrays in numba's CUDA simulator: :class:`GpuKernel` then takes NumPy arrays, which is how CI
checks it against the reference engine. float16 params run with float32 math (the driver upcasts).
Not done: capturing the time loop in a CUDA graph (unmeasured here; there was no GPU to measure the
per-step launch cost against).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numba
import numpy as np
from numba import cuda

from ..core.backend import cupy_module, get_xp
from ..core.spec import RNNSpec
from . import cuda_kernels as ck
from .base import Call, DirectionCache, DirectionForward, DirectionGrads, DirectionWeights
from .cells import gate_slice
from .stack import StackEngine

Array = Any


class Device:
    """Where one call's kernels run: CuPy arrays on CuPy's current stream, or NumPy under the simulator."""

    def __init__(self, xp: ModuleType):
        self.xp = xp
        self.stream = None
        if xp is np:
            if not numba.config.ENABLE_CUDASIM:
                raise TypeError("the GPU kernels got NumPy arrays; they run on CuPy arrays (NumPy only under "
                                "numba's CUDA simulator, NUMBA_ENABLE_CUDASIM=1)")
            return
        ptr = xp.cuda.get_current_stream().ptr
        self.stream = cuda.external_stream(ptr) if ptr else cuda.default_stream()

    def wrap(self, a: Array) -> Any:
        """A kernel argument for ``a``: CuPy arrays as numba device arrays that never synchronise."""
        if self.xp is np:
            return a
        return cuda.from_cuda_array_interface(a.__cuda_array_interface__, owner=a, sync=False)

    def launch(self, kernel: Callable, elements: int, *args: Any) -> None:
        """One launch covering ``elements`` threads, on the call's stream. A step has only ``B x H`` threads
        by design, so numba-cuda's low-occupancy warning (any grid under 128 blocks) is off for it."""
        shape = ck.launch_shape(elements)
        with _no_low_occupancy_warning():
            configured = kernel[shape] if self.stream is None else kernel[(*shape, self.stream)]
        configured(*args)

    def dummy(self, dtype: Any, ndim: int) -> Any:
        """Stand-in for an absent array (same ndim, so one compiled signature per dtype)."""
        return self.wrap(self.xp.zeros((1,) * ndim, dtype=dtype))


@contextlib.contextmanager
def _no_low_occupancy_warning():
    """numba-cuda's ``CUDA_LOW_OCCUPANCY_WARNINGS`` off while a launch is configured (where it warns)."""
    saved = getattr(numba.config, "CUDA_LOW_OCCUPANCY_WARNINGS", 0)
    numba.config.CUDA_LOW_OCCUPANCY_WARNINGS = 0
    try:
        yield
    finally:
        numba.config.CUDA_LOW_OCCUPANCY_WARNINGS = saved


class Variants:
    """One direction's cell variants on the kernels' side: its masks wrapped once, and the per-step work
    around the fused step kernel (recurrent dropout: ``h * mask`` into the GEMM and the GEMM's gradient
    times the mask; zoneout: the previous state kept for the mix, the cotangent split)."""

    def __init__(self, dev: Device, w: DirectionWeights, B: int, H_out: int, H: int, dt: Any):
        xp = dev.xp
        self.h_mask = w.h_mask
        self.zone_h, self.zone_c = w.zoneout_h is not None, w.zoneout_c is not None
        self.h_rec = xp.empty((B, H_out), dt) if self.h_mask is not None else None
        self.h_old = xp.empty((B, H_out), dt) if self.zone_h else None
        self.c_old = xp.empty((B, H), dt) if self.zone_c else None
        self.m_h = _contiguous(xp, w.zoneout_h) if self.zone_h else None  # kept alive with their wrappers
        self.m_c = _contiguous(xp, w.zoneout_c) if self.zone_c else None
        self.k_mh = dev.wrap(self.m_h) if self.zone_h else dev.dummy(dt, 3)
        self.k_mc = dev.wrap(self.m_c) if self.zone_c else dev.dummy(dt, 3)
        self.k_h_old = dev.wrap(self.h_old) if self.zone_h else None
        self.k_c_old = dev.wrap(self.c_old) if self.zone_c else None

    def recurrent_input(self, xp: ModuleType, h: Array, n: int) -> Array:
        """What enters the recurrent GEMM: ``h[:n]``, or ``h[:n] * mask`` (recurrent dropout)."""
        if self.h_mask is None:
            return h[:n]
        return xp.multiply(h[:n], self.h_mask[:n], out=self.h_rec[:n])

    def keep_previous(self, h: Array, c: Array | None, n: int) -> None:
        if self.zone_h:
            self.h_old[:n] = h[:n]
        if self.zone_c:
            self.c_old[:n] = c[:n]

    def mask_gradient(self, d: Array, n: int) -> None:
        """``d[:n] *= mask``: a recurrent GEMM's gradient back through the recurrent dropout."""
        if self.h_mask is not None:
            d[:n] *= self.h_mask[:n]


def _steps(T: int, reverse: bool) -> range:
    return range(T - 1, -1, -1) if reverse else range(T)


def _contiguous(xp: ModuleType, a: Array) -> Array:
    return xp.ascontiguousarray(a)


class GpuKernel:
    """:class:`~arrayrnn.engines.base.DirectionKernel`: cuBLAS GEMM + one fused CUDA kernel per step."""

    # -- forward --------------------------------------------------------------------------------
    def forward(self, spec: RNNSpec, w: DirectionWeights, xw: Array, batch_sizes: np.ndarray, h0: Array,
                c0: Array | None, reverse: bool, keep_cache: bool) -> DirectionForward:
        dev = Device(get_xp(xw))
        xw = _contiguous(dev.xp, xw)  # the driver's fresh projection; its gate activations become the cache
        bs = [int(n) for n in batch_sizes]
        v = Variants(dev, w, xw.shape[1], spec.output_size, spec.hidden_size, xw.dtype)
        if spec.mode == "lstm":
            return self._lstm_forward(dev, spec, w, xw, bs, h0, c0, reverse, keep_cache, v)
        if spec.mode == "gru":
            return self._gru_forward(dev, spec, w, xw, bs, h0, reverse, keep_cache, v)
        return self._rnn_forward(dev, spec, w, xw, bs, h0, reverse, keep_cache, v)

    @staticmethod
    def _rnn_forward(dev, spec, w, xw, bs, h0, reverse, keep, v):
        xp, (T, B, H), dt = dev.xp, xw.shape, xw.dtype
        W_hhT = _contiguous(xp, w.W_hh.T)
        y, h, hh = xp.zeros((T, B, H), dt), h0.astype(dt, copy=True), xp.empty((B, H), dt)
        cand = xp.zeros((T, B, H), dt) if v.zone_h else y  # zoneout: the step's own output, kept
        k_xw, k_hh, k_h, k_y, k_cand = (dev.wrap(a) for a in (xw, hh, h, y, cand))
        one, relu = dt.type(1), spec.mode == "rnn_relu"
        for t in _steps(T, reverse):
            n = bs[t]
            if n:
                v.keep_previous(h, None, n)
                xp.matmul(v.recurrent_input(xp, h, n), W_hhT, out=hh[:n])
                dev.launch(ck.rnn_forward_step, n * H, t, n, one, relu, k_xw, k_hh, k_h, k_cand)
                if v.zone_h:
                    dev.launch(ck.zoneout_step, n * H, t, n, v.k_mh, v.k_h_old, k_cand, k_y, k_h)
        cache = DirectionCache(gates=cand if v.zone_h else None) if keep else None
        return DirectionForward(y, h, None, cache)

    @staticmethod
    def _lstm_forward(dev, spec, w, xw, bs, h0, c0, reverse, keep, v):
        xp, (T, B, _), dt = dev.xp, xw.shape, xw.dtype
        H, P = spec.hidden_size, spec.output_size
        project = w.W_hr is not None
        W_hhT = _contiguous(xp, w.W_hh.T)
        W_hrT = _contiguous(xp, w.W_hr.T) if project else None
        y, h, c = xp.zeros((T, B, P), dt), h0.astype(dt, copy=True), c0.astype(dt, copy=True)
        hh, m = xp.empty((B, spec.gate_size), dt), xp.empty((B, H), dt)
        c_all = xp.zeros((T, B, H), dt) if keep else None
        tanh_c_all = xp.zeros((T, B, H), dt) if keep else None
        c_cand = xp.zeros((T, B, H), dt) if keep and v.zone_c else c_all  # the step kernel's own cell
        k_c_all, k_c_cand, k_tanh_c = ((dev.wrap(c_all), dev.wrap(c_cand), dev.wrap(tanh_c_all)) if keep
                                       else (dev.dummy(dt, 3), dev.dummy(dt, 3), dev.dummy(dt, 3)))
        k_xw, k_hh, k_c, k_h, k_y, k_m = (dev.wrap(a) for a in (xw, hh, c, h, y, m))
        lo, hi = spec.cell_clip if spec.cell_clip is not None else (-np.inf, np.inf)
        one, lo, hi = dt.type(1), dt.type(lo), dt.type(hi)
        peep = (ck.lstm_peephole_forward_step, dev.wrap(_contiguous(xp, w.P))) if w.P is not None else None
        for t in _steps(T, reverse):
            n = bs[t]
            if n:
                v.keep_previous(h, c, n)
                xp.matmul(v.recurrent_input(xp, h, n), W_hhT, out=hh[:n])
            if peep is not None:
                dev.launch(peep[0], B * H, t, n, one, k_xw, k_hh, peep[1], k_c, k_h, k_y, k_m, project, keep,
                           k_c_cand, k_tanh_c, lo, hi)
            else:
                dev.launch(ck.lstm_forward_step, B * H, t, n, one, k_xw, k_hh, k_c, k_h, k_y, k_m, project,
                           keep, k_c_cand, k_tanh_c, lo, hi)
            if not n:
                continue
            if project:
                xp.matmul(m[:n], W_hrT, out=y[t, :n])
                h[:n] = y[t, :n]
            if v.zone_h:
                dev.launch(ck.zoneout_step, n * P, t, n, v.k_mh, v.k_h_old, k_y, k_y, k_h)
            if v.zone_c:
                dev.launch(ck.zoneout_cell_step, n * H, t, n, v.k_mc, v.k_c_old, k_c, keep, k_c_all)
        cache = None
        if keep:
            cache = DirectionCache(gates=xw, c=c_all, tanh_c=tanh_c_all, c_cand=c_cand if v.zone_c else None)
        return DirectionForward(y, h, c, cache)

    @staticmethod
    def _gru_forward(dev, spec, w, xw, bs, h0, reverse, keep, v):
        xp, (T, B, _), dt = dev.xp, xw.shape, xw.dtype
        H = spec.hidden_size
        y, h = xp.zeros((T, B, H), dt), h0.astype(dt, copy=True)
        k_xw, k_h, k_y = (dev.wrap(a) for a in (xw, h, y))
        one = dt.type(1)
        hn_all = None
        if spec.reset_after:
            W_hhT = _contiguous(xp, w.W_hh.T)
            hh = xp.empty((B, spec.gate_size), dt)
            b_hn = _contiguous(xp, w.inner_bias) if w.inner_bias is not None else xp.zeros(H, dt)
            hn_all = xp.zeros((T, B, H), dt) if keep else None
            k_hh, k_b_hn = dev.wrap(hh), dev.wrap(b_hn)
            k_hn_all = dev.wrap(hn_all) if keep else dev.dummy(dt, 3)
            for t in _steps(T, reverse):
                n = bs[t]
                if n:
                    v.keep_previous(h, None, n)
                    xp.matmul(v.recurrent_input(xp, h, n), W_hhT, out=hh[:n])
                dev.launch(ck.gru_forward_step, B * H, t, n, one, k_xw, k_hh, k_b_hn, k_h, k_y, keep,
                           k_hn_all)
                if n and v.zone_h:
                    dev.launch(ck.zoneout_step, n * H, t, n, v.k_mh, v.k_h_old, k_y, k_y, k_h)
        else:
            W_rzT = _contiguous(xp, w.W_hh[gate_slice(spec, "r", "z")].T)
            W_nT = _contiguous(xp, w.W_hh[gate_slice(spec, "n")].T)
            hrz, rh, hn = xp.empty((B, 2 * H), dt), xp.empty((B, H), dt), xp.empty((B, H), dt)
            k_hrz, k_rh, k_hn = dev.wrap(hrz), dev.wrap(rh), dev.wrap(hn)
            k_h_rec = dev.wrap(v.h_rec) if v.h_rec is not None else k_h  # r * (h * mask) with dropout
            for t in _steps(T, reverse):
                n = bs[t]
                if n:
                    v.keep_previous(h, None, n)
                    xp.matmul(v.recurrent_input(xp, h, n), W_rzT, out=hrz[:n])
                dev.launch(ck.gru_rz_step, B * H, t, n, one, k_xw, k_hrz, k_h_rec, k_rh)
                if n:
                    xp.matmul(rh[:n], W_nT, out=hn[:n])
                    dev.launch(ck.gru_n_step, n * H, t, n, k_xw, k_hn, k_h, k_y)
                    if v.zone_h:
                        dev.launch(ck.zoneout_step, n * H, t, n, v.k_mh, v.k_h_old, k_y, k_y, k_h)
        cache = DirectionCache(gates=xw, hn=hn_all) if keep else None
        return DirectionForward(y, h, None, cache)

    # -- backward -------------------------------------------------------------------------------
    def backward(self, spec: RNNSpec, w: DirectionWeights, fwd: DirectionForward, h_prev: Array,
                 c_prev: Array | None, dy: Array, dh_n: Array, dc_n: Array | None, batch_sizes: np.ndarray,
                 reverse: bool, dc_seq: Array | None = None) -> DirectionGrads:
        dev = Device(get_xp(dy))
        dy = _contiguous(dev.xp, dy)
        bs = [int(n) for n in batch_sizes]
        v = Variants(dev, w, dy.shape[1], spec.output_size, spec.hidden_size, dy.dtype)
        split = _ZoneoutSplit(dev, v, dy)
        if spec.mode == "lstm":
            return self._lstm_backward(dev, spec, w, fwd, c_prev, dy, dh_n, dc_n, bs, reverse, v, split,
                                       dc_seq)
        if spec.mode == "gru":
            return self._gru_backward(dev, spec, w, fwd, h_prev, dy, dh_n, bs, reverse, v, split)
        return self._rnn_backward(dev, spec, w, fwd, dy, dh_n, bs, reverse, v, split)

    @staticmethod
    def _rnn_backward(dev, spec, w, fwd, dy, dh_n, bs, reverse, v, split):
        xp, (T, B, H), dt = dev.xp, dy.shape, dy.dtype
        W_hh = _contiguous(xp, w.W_hh)
        dh, d_pre = dh_n.astype(dt, copy=True), xp.zeros((T, B, H), dt)
        own = fwd.cache.gates if v.zone_h else fwd.y  # the step's own output (before zoneout)
        k_y, k_dh, k_d = (dev.wrap(a) for a in (_contiguous(xp, own), dh, d_pre))
        one, relu = dt.type(1), spec.mode == "rnn_relu"
        for t in reversed(_steps(T, reverse)):
            n = bs[t]
            if n:
                k_dy = split.before(t, n, k_dh, dh.shape[1])
                dev.launch(ck.rnn_backward_step, n * H, t, n, one, relu, k_y, k_dy, k_dh, k_d)
                xp.matmul(d_pre[t, :n], W_hh, out=dh[:n])
                v.mask_gradient(dh, n)
                split.after(dh, n)
        return DirectionGrads(d_pre, d_pre, None, dh, None)

    @staticmethod
    def _lstm_backward(dev, spec, w, fwd, c_prev, dy, dh_n, dc_n, bs, reverse, v, split, dc_seq):
        xp, (T, B, P), dt = dev.xp, dy.shape, dy.dtype
        H = spec.hidden_size
        project = w.W_hr is not None
        W_hh = _contiguous(xp, w.W_hh)
        W_hr = _contiguous(xp, w.W_hr) if project else None
        dh, dc = dh_n.astype(dt, copy=True), dc_n.astype(dt, copy=True)
        dpre_in = xp.zeros((T, B, spec.gate_size), dt)
        d_h = xp.zeros((T, B, P), dt) if project else None
        dm = xp.empty((B, H), dt)
        cache = fwd.cache
        own_c = cache.c_cand if cache.c_cand is not None else cache.c  # the step's own cell
        k_gates, k_c_all, k_tanh_c, k_c_prev = (dev.wrap(_contiguous(xp, a))
                                                 for a in (cache.gates, own_c, cache.tanh_c, c_prev))
        k_dh, k_dc, k_dpre_in, k_dm = (dev.wrap(a) for a in (dh, dc, dpre_in, dm))
        k_d_h = dev.wrap(d_h) if project else dev.dummy(dt, 3)
        use_clip = spec.cell_clip is not None
        lo, hi = spec.cell_clip if use_clip else (-np.inf, np.inf)
        one, lo, hi = dt.type(1), dt.type(lo), dt.type(hi)
        dc_direct = xp.empty((B, H), dt) if v.zone_c else None
        k_dc_direct = dev.wrap(dc_direct) if v.zone_c else dev.dummy(dt, 2)
        k_dc_seq = dev.wrap(_contiguous(xp, dc_seq)) if dc_seq is not None else dev.dummy(dt, 3)
        k_P = dev.wrap(_contiguous(xp, w.P)) if w.P is not None else None
        for t in reversed(_steps(T, reverse)):
            n = bs[t]
            if not n:
                continue
            k_dy = split.before(t, n, k_dh, dh.shape[1])
            if v.zone_c or dc_seq is not None:
                dev.launch(ck.cell_carry_step, n * H, t, n, one, v.zone_c, v.k_mc, dc_seq is not None,
                           k_dc_seq, k_dc, k_dc_direct)
            if project:
                dev.launch(ck.add_carry_step, n * P, t, n, k_dy, k_dh, k_d_h)
                xp.matmul(d_h[t, :n], W_hr, out=dm[:n])
            if k_P is not None:
                dev.launch(ck.lstm_peephole_backward_step, n * H, t, n, one, k_gates, k_c_all, k_tanh_c,
                           k_c_prev, k_P, k_dy, k_dh, k_dm, project, k_dc, k_dpre_in, use_clip, lo, hi)
            else:
                dev.launch(ck.lstm_backward_step, n * H, t, n, one, k_gates, k_c_all, k_tanh_c, k_c_prev,
                           k_dy, k_dh, k_dm, project, k_dc, k_dpre_in, use_clip, lo, hi)
            xp.matmul(dpre_in[t, :n], W_hh, out=dh[:n])
            v.mask_gradient(dh, n)
            split.after(dh, n)
            if v.zone_c:
                dc[:n] += dc_direct[:n]
        return DirectionGrads(dpre_in, dpre_in, d_h, dh, dc)

    @staticmethod
    def _gru_backward(dev, spec, w, fwd, h_prev, dy, dh_n, bs, reverse, v, split):
        # the carry into step t-1 is split in two buffers so that no GEMM has to accumulate (beta = 1):
        # dh = dh_gemm (the GEMM's output) + dh_carry (the elementwise part, dh * z [+ drh * r])
        xp, (T, B, H), dt = dev.xp, dy.shape, dy.dtype
        reset_after = spec.reset_after
        dh_gemm, dh_carry = dh_n.astype(dt, copy=True), xp.zeros((B, H), dt)
        dpre_in = xp.zeros((T, B, spec.gate_size), dt)
        # reset-after: the recurrent gradient differs from dpre_in in its n part only; that part is kept
        # (T, B, H), the whole of it only for the step's GEMM (B, 3H)
        dn_rec = xp.zeros((T, B, H), dt) if reset_after else None
        rec = xp.empty((B, spec.gate_size), dt) if reset_after else None
        dn_buf, drz, drh = xp.empty((B, H), dt), xp.empty((B, 2 * H), dt), xp.empty((B, H), dt)
        cache = fwd.cache
        k_gates, k_h_prev = dev.wrap(_contiguous(xp, cache.gates)), dev.wrap(_contiguous(xp, h_prev))
        k_hn_all = dev.wrap(_contiguous(xp, cache.hn)) if reset_after else dev.dummy(dt, 3)
        k_dn_rec = dev.wrap(dn_rec) if reset_after else dev.dummy(dt, 3)
        k_rec = dev.wrap(rec) if reset_after else dev.dummy(dt, 2)
        k_dh_gemm, k_dh_carry, k_dpre_in, k_dn, k_drz, k_drh = (
            dev.wrap(a) for a in (dh_gemm, dh_carry, dpre_in, dn_buf, drz, drh))
        W_hh = _contiguous(xp, w.W_hh)
        W_rz = _contiguous(xp, w.W_hh[gate_slice(spec, "r", "z")])
        W_n = _contiguous(xp, w.W_hh[gate_slice(spec, "n")])
        one = dt.type(1)
        for t in reversed(_steps(T, reverse)):
            n = bs[t]
            if not n:
                continue
            if v.zone_h:  # one carry buffer for the split
                dh_gemm[:n] += dh_carry[:n]
                dh_carry[:n] = 0
            k_dy = split.before(t, n, k_dh_gemm, H)
            dev.launch(ck.gru_backward_step, n * H, t, n, one, reset_after, k_gates, k_hn_all, k_h_prev, k_dy,
                       k_dh_gemm, k_dh_carry, k_dpre_in, k_dn_rec, k_rec, k_dn, k_drz)
            if reset_after:
                xp.matmul(rec[:n], W_hh, out=dh_gemm[:n])
            else:
                xp.matmul(dn_buf[:n], W_n, out=drh[:n])
                v.mask_gradient(drh, n)  # r * (h * mask): drh * mask is r*h's gradient w.r.t. r and h
                dev.launch(ck.gru_r_backward_step, n * H, t, n, one, k_gates, k_h_prev, k_drh, k_dpre_in,
                           k_dh_carry, k_drz)
                xp.matmul(drz[:n], W_rz, out=dh_gemm[:n])
            v.mask_gradient(dh_gemm, n)
            split.after(dh_carry, n)
        return DirectionGrads(dpre_in, dpre_in, None, dh_gemm + dh_carry, None, dn_rec)


class _ZoneoutSplit:
    """The backward's side of zoneout of ``h``: before a step, the total cotangent ``dy[t] + dh`` is split
    into the step's own share (a stack the step kernel reads as its ``dy``, with ``dh`` zeroed) and
    ``h_{t-1}``'s (kept); after the step's GEMM that share is added to the carry. Without zoneout the step
    reads ``dy`` itself and nothing else happens."""

    def __init__(self, dev: Device, v: Variants, dy: Array):
        self.dev, self.v, self.one = dev, v, dy.dtype.type(1)
        self.k_dy = dev.wrap(dy)
        if v.zone_h:
            xp, (_, B, width) = dev.xp, dy.shape
            self.direct, self.dy_new = xp.empty((B, width), dy.dtype), xp.empty_like(dy)  # kept alive here
            self.k_dy_new, self.k_direct = dev.wrap(self.dy_new), dev.wrap(self.direct)

    def before(self, t: int, n: int, k_dh: Any, width: int) -> Any:
        """The ``dy`` the step kernel reads (``k_dh``: this step's carry buffer, ``(B, width)``)."""
        if not self.v.zone_h:
            return self.k_dy
        self.dev.launch(ck.zoneout_split_step, n * width, t, n, self.one, self.v.k_mh, self.k_dy, k_dh,
                        self.k_dy_new, self.k_direct)
        return self.k_dy_new

    def after(self, carry: Array, n: int) -> None:
        if self.v.zone_h:
            carry[:n] += self.direct[:n]


class CupyEngine(StackEngine):
    """The shared stack driver over :class:`GpuKernel`; CuPy arrays (GPU) only."""

    def __init__(self) -> None:
        super().__init__("cupy", GpuKernel())

    def check(self, call: Call) -> str | None:
        """``None`` for every call on CuPy arrays: this engine runs every configuration (so ``"auto"``, which
        asks cuDNN first, reaches it wherever cuDNN declines); otherwise what is missing."""
        cupy = cupy_module()
        if cupy is None:
            return "CuPy is not installed (pip install 'arrayrnn[gpu]')"
        if call.xp is not cupy:
            return "the cupy engine runs on CuPy arrays (GPU); use engine='numba' or 'reference' on CPU"
        return None


ENGINE = CupyEngine()
