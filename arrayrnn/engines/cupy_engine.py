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
        if spec.mode == "lstm":
            return self._lstm_forward(dev, spec, w, xw, bs, h0, c0, reverse, keep_cache)
        if spec.mode == "gru":
            return self._gru_forward(dev, spec, w, xw, bs, h0, reverse, keep_cache)
        return self._rnn_forward(dev, spec, w, xw, bs, h0, reverse, keep_cache)

    @staticmethod
    def _rnn_forward(dev, spec, w, xw, bs, h0, reverse, keep):
        xp, (T, B, H), dt = dev.xp, xw.shape, xw.dtype
        W_hhT = _contiguous(xp, w.W_hh.T)
        y, h, hh = xp.zeros((T, B, H), dt), h0.astype(dt, copy=True), xp.empty((B, H), dt)
        k_xw, k_hh, k_h, k_y = (dev.wrap(a) for a in (xw, hh, h, y))
        one, relu = dt.type(1), spec.mode == "rnn_relu"
        for t in _steps(T, reverse):
            n = bs[t]
            if n:
                xp.matmul(h[:n], W_hhT, out=hh[:n])
                dev.launch(ck.rnn_forward_step, n * H, t, n, one, relu, k_xw, k_hh, k_h, k_y)
        return DirectionForward(y, h, None, DirectionCache() if keep else None)

    @staticmethod
    def _lstm_forward(dev, spec, w, xw, bs, h0, c0, reverse, keep):
        xp, (T, B, _), dt = dev.xp, xw.shape, xw.dtype
        H, P = spec.hidden_size, spec.output_size
        project = w.W_hr is not None
        W_hhT = _contiguous(xp, w.W_hh.T)
        W_hrT = _contiguous(xp, w.W_hr.T) if project else None
        y, h, c = xp.zeros((T, B, P), dt), h0.astype(dt, copy=True), c0.astype(dt, copy=True)
        hh, m = xp.empty((B, spec.gate_size), dt), xp.empty((B, H), dt)
        c_all = xp.zeros((T, B, H), dt) if keep else None
        tanh_c_all = xp.zeros((T, B, H), dt) if keep else None
        k_c_all, k_tanh_c = ((dev.wrap(c_all), dev.wrap(tanh_c_all)) if keep
                             else (dev.dummy(dt, 3), dev.dummy(dt, 3)))
        k_xw, k_hh, k_c, k_h, k_y, k_m = (dev.wrap(a) for a in (xw, hh, c, h, y, m))
        lo, hi = spec.cell_clip if spec.cell_clip is not None else (-np.inf, np.inf)
        one, lo, hi = dt.type(1), dt.type(lo), dt.type(hi)
        for t in _steps(T, reverse):
            n = bs[t]
            if n:
                xp.matmul(h[:n], W_hhT, out=hh[:n])
            dev.launch(ck.lstm_forward_step, B * H, t, n, one, k_xw, k_hh, k_c, k_h, k_y, k_m, project, keep,
                       k_c_all, k_tanh_c, lo, hi)
            if project and n:
                xp.matmul(m[:n], W_hrT, out=y[t, :n])
                h[:n] = y[t, :n]
        cache = DirectionCache(gates=xw, c=c_all, tanh_c=tanh_c_all) if keep else None
        return DirectionForward(y, h, c, cache)

    @staticmethod
    def _gru_forward(dev, spec, w, xw, bs, h0, reverse, keep):
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
                    xp.matmul(h[:n], W_hhT, out=hh[:n])
                dev.launch(ck.gru_forward_step, B * H, t, n, one, k_xw, k_hh, k_b_hn, k_h, k_y, keep,
                           k_hn_all)
        else:
            W_rzT = _contiguous(xp, w.W_hh[gate_slice(spec, "r", "z")].T)
            W_nT = _contiguous(xp, w.W_hh[gate_slice(spec, "n")].T)
            hrz, rh, hn = xp.empty((B, 2 * H), dt), xp.empty((B, H), dt), xp.empty((B, H), dt)
            k_hrz, k_rh, k_hn = dev.wrap(hrz), dev.wrap(rh), dev.wrap(hn)
            for t in _steps(T, reverse):
                n = bs[t]
                if n:
                    xp.matmul(h[:n], W_rzT, out=hrz[:n])
                dev.launch(ck.gru_rz_step, B * H, t, n, one, k_xw, k_hrz, k_h, k_rh)
                if n:
                    xp.matmul(rh[:n], W_nT, out=hn[:n])
                    dev.launch(ck.gru_n_step, n * H, t, n, k_xw, k_hn, k_h, k_y)
        cache = DirectionCache(gates=xw, hn=hn_all) if keep else None
        return DirectionForward(y, h, None, cache)

    # -- backward -------------------------------------------------------------------------------
    def backward(self, spec: RNNSpec, w: DirectionWeights, fwd: DirectionForward, h_prev: Array,
                 c_prev: Array | None, dy: Array, dh_n: Array, dc_n: Array | None, batch_sizes: np.ndarray,
                 reverse: bool) -> DirectionGrads:
        dev = Device(get_xp(dy))
        dy = _contiguous(dev.xp, dy)
        bs = [int(n) for n in batch_sizes]
        if spec.mode == "lstm":
            return self._lstm_backward(dev, spec, w, fwd, c_prev, dy, dh_n, dc_n, bs, reverse)
        if spec.mode == "gru":
            return self._gru_backward(dev, spec, w, fwd, h_prev, dy, dh_n, bs, reverse)
        return self._rnn_backward(dev, spec, w, fwd, dy, dh_n, bs, reverse)

    @staticmethod
    def _rnn_backward(dev, spec, w, fwd, dy, dh_n, bs, reverse):
        xp, (T, B, H), dt = dev.xp, dy.shape, dy.dtype
        W_hh = _contiguous(xp, w.W_hh)
        dh, d_pre = dh_n.astype(dt, copy=True), xp.zeros((T, B, H), dt)
        k_y, k_dy, k_dh, k_d = (dev.wrap(a) for a in (_contiguous(xp, fwd.y), dy, dh, d_pre))
        one, relu = dt.type(1), spec.mode == "rnn_relu"
        for t in reversed(_steps(T, reverse)):
            n = bs[t]
            if n:
                dev.launch(ck.rnn_backward_step, n * H, t, n, one, relu, k_y, k_dy, k_dh, k_d)
                xp.matmul(d_pre[t, :n], W_hh, out=dh[:n])
        return DirectionGrads(d_pre, d_pre, None, dh, None)

    @staticmethod
    def _lstm_backward(dev, spec, w, fwd, c_prev, dy, dh_n, dc_n, bs, reverse):
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
        k_gates, k_c_all, k_tanh_c, k_c_prev = (dev.wrap(_contiguous(xp, a))
                                                 for a in (cache.gates, cache.c, cache.tanh_c, c_prev))
        k_dy, k_dh, k_dc, k_dpre_in, k_dm = (dev.wrap(a) for a in (dy, dh, dc, dpre_in, dm))
        k_d_h = dev.wrap(d_h) if project else dev.dummy(dt, 3)
        use_clip = spec.cell_clip is not None
        lo, hi = spec.cell_clip if use_clip else (-np.inf, np.inf)
        one, lo, hi = dt.type(1), dt.type(lo), dt.type(hi)
        for t in reversed(_steps(T, reverse)):
            n = bs[t]
            if not n:
                continue
            if project:
                dev.launch(ck.add_carry_step, n * P, t, n, k_dy, k_dh, k_d_h)
                xp.matmul(d_h[t, :n], W_hr, out=dm[:n])
            dev.launch(ck.lstm_backward_step, n * H, t, n, one, k_gates, k_c_all, k_tanh_c, k_c_prev, k_dy,
                       k_dh, k_dm, project, k_dc, k_dpre_in, use_clip, lo, hi)
            xp.matmul(dpre_in[t, :n], W_hh, out=dh[:n])
        return DirectionGrads(dpre_in, dpre_in, d_h, dh, dc)

    @staticmethod
    def _gru_backward(dev, spec, w, fwd, h_prev, dy, dh_n, bs, reverse):
        # the carry into step t-1 is split in two buffers so that no GEMM has to accumulate (beta = 1):
        # dh = dh_gemm (the GEMM's output) + dh_carry (the elementwise part, dh * z [+ drh * r])
        xp, (T, B, H), dt = dev.xp, dy.shape, dy.dtype
        reset_after = spec.reset_after
        dh_gemm, dh_carry = dh_n.astype(dt, copy=True), xp.zeros((B, H), dt)
        dpre_in = xp.zeros((T, B, spec.gate_size), dt)
        dpre_rec = xp.zeros_like(dpre_in) if reset_after else None
        dn_buf, drz, drh = xp.empty((B, H), dt), xp.empty((B, 2 * H), dt), xp.empty((B, H), dt)
        cache = fwd.cache
        k_gates, k_h_prev = dev.wrap(_contiguous(xp, cache.gates)), dev.wrap(_contiguous(xp, h_prev))
        k_hn_all = dev.wrap(_contiguous(xp, cache.hn)) if reset_after else dev.dummy(dt, 3)
        k_dpre_rec = dev.wrap(dpre_rec) if reset_after else dev.dummy(dt, 3)
        k_dy, k_dh_gemm, k_dh_carry, k_dpre_in, k_dn, k_drz, k_drh = (
            dev.wrap(a) for a in (dy, dh_gemm, dh_carry, dpre_in, dn_buf, drz, drh))
        W_hh = _contiguous(xp, w.W_hh)
        W_rz = _contiguous(xp, w.W_hh[gate_slice(spec, "r", "z")])
        W_n = _contiguous(xp, w.W_hh[gate_slice(spec, "n")])
        one = dt.type(1)
        for t in reversed(_steps(T, reverse)):
            n = bs[t]
            if not n:
                continue
            dev.launch(ck.gru_backward_step, n * H, t, n, one, reset_after, k_gates, k_hn_all, k_h_prev, k_dy,
                       k_dh_gemm, k_dh_carry, k_dpre_in, k_dpre_rec, k_dn, k_drz)
            if reset_after:
                xp.matmul(dpre_rec[t, :n], W_hh, out=dh_gemm[:n])
                continue
            xp.matmul(dn_buf[:n], W_n, out=drh[:n])
            dev.launch(ck.gru_r_backward_step, n * H, t, n, one, k_gates, k_h_prev, k_drh, k_dpre_in,
                       k_dh_carry, k_drz)
            xp.matmul(drz[:n], W_rz, out=dh_gemm[:n])
        return DirectionGrads(dpre_in, dpre_rec if reset_after else dpre_in, None, dh_gemm + dh_carry, None)


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
