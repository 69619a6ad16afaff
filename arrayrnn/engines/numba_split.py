"""Time loops for small batches, each step split by hidden units across threads.

At batch 1 a step of an LSTM is a vector-matrix product (``h @ W_hh.T``: every weight read once from
cache, tens of flops per byte) followed by the gate math: too little work for a multi-threaded BLAS call,
and one thread is bound by its own core's cache bandwidth. Here each of ``P`` threads owns a slice of
the hidden units for the whole time loop, roughly::

    Wp[k] = gate-interleaved columns of W_hh.T for units u0_k..u1_k   # packed once per call
    for t in steps:                                                  # on every thread k, side by side
        q = h_prev @ Wp[k]                  # this thread's slice of the recurrent product
        gates, c[:, u0_k:u1_k], y[t, :, u0_k:u1_k] = gate_math(xw[t], q)   # its own units only
        barrier()                           # y[t] is complete: the next step reads all of it

so each thread streams only its own ``1/P`` of ``W_hh`` (which then stays in its own core's cache) and
runs ``1/P`` of the gate math, with one barrier per step (:mod:`.spin_barrier`). The backward mirrors it:
each thread takes the gate gradients of its units, then, after the barrier, its units' slice of
``dh = d_gates @ W_hh`` from the columns ``W_hh[:, u0_k:u1_k]`` (packed once per call).

The loops compute exactly what the one-thread loops of :mod:`.numba_kernels` compute (same gate
formulas from :mod:`.gate_math`, same residual cache), so either backward runs after either forward.
They cover the LSTM without projection and the reset-after GRU; :func:`applies` says when the engine
uses them. The per-thread product is :func:`~.numba_blas.small_gemm` row by row (BLAS is not called
from these threads).
"""

from __future__ import annotations

import functools
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numba
import numpy as np

from ..spec import RNNSpec
from . import gate_math as gm
from .gate_math import GRU_N, GRU_R, GRU_Z, LSTM_F, LSTM_G, LSTM_I, LSTM_O
from .numba_blas import blas_binding, small_gemm
from .numba_kernels import one_of, sigmoid, tanh
from .spin_barrier import barrier_wait, new_barrier

_JIT = dict(cache=True, nogil=True, error_model="numpy")

MAX_BATCH = 4       # above this many rows the BLAS-per-step loops win (bench/RESULTS.md, split threshold)
MIN_UNITS = 32      # each thread gets at least this many hidden units


# -- when and with how many threads ----------------------------------------------------------------
def usable_threads() -> int:
    """Threads for a split loop: NumPy's BLAS thread count (set it with threadpoolctl), at most the cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(blas_binding().num_threads(), cores))


def applies(spec: RNNSpec, batch: int, has_projection: bool) -> int:
    """How many threads a split loop would use for this direction; 0 when the one-thread loop runs."""
    if batch > MAX_BATCH or has_projection:
        return 0
    if spec.mode == "gru" and not spec.reset_after or spec.mode not in ("lstm", "gru"):
        return 0
    threads = min(usable_threads(), spec.hidden_size // MIN_UNITS)
    return threads if threads >= 2 else 0


def unit_bounds(hidden: int, threads: int) -> np.ndarray:
    """``bounds[k]:bounds[k+1]``: the hidden units of thread ``k`` (equal slices, the last may be short)."""
    per = math.ceil(hidden / threads)
    return np.minimum(np.arange(threads + 1, dtype=np.int64) * per, hidden)


# -- weights, packed once per call ------------------------------------------------------------------
def pack_forward(W_hh: np.ndarray, gates: int, bounds: np.ndarray) -> np.ndarray:
    """``Wp (P, H_in, gates*U)``: ``Wp[k][:, g*U + j] = W_hh[g*H + bounds[k] + j, :]`` (zero padding)."""
    H = W_hh.shape[0] // gates
    P, U = len(bounds) - 1, int(bounds[1] - bounds[0])
    Wp = np.zeros((P, W_hh.shape[1], gates * U), W_hh.dtype)
    for k in range(P):
        u0, u1 = int(bounds[k]), int(bounds[k + 1])
        for g in range(gates):
            Wp[k, :, g * U:g * U + u1 - u0] = W_hh[g * H + u0:g * H + u1].T
    return Wp


def pack_backward(W_hh: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """``Wq (P, G*H, U)``: ``Wq[k][:, j] = W_hh[:, bounds[k] + j]`` (zero padding)."""
    P, U = len(bounds) - 1, int(bounds[1] - bounds[0])
    Wq = np.zeros((P, W_hh.shape[0], U), W_hh.dtype)
    for k in range(P):
        u0, u1 = int(bounds[k]), int(bounds[k + 1])
        Wq[k, :, :u1 - u0] = W_hh[:, u0:u1]
    return Wq


# -- running P copies of a loop side by side --------------------------------------------------------
_LOCK = threading.Lock()   # one split call at a time; a second caller waits (blocked, not spinning)


@functools.lru_cache(maxsize=None)
def _pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="arrayrnn-split")


def run_split(loop: Any, threads: int, *args: Any) -> None:
    """``loop(k, threads, barrier, *args)`` for ``k = 0..threads-1``, each on its own thread (0: the caller).

    The loops release the GIL (``nogil``); every one of them must reach every barrier, which they do:
    they share the step count and contain no early exit.
    """
    with _LOCK:
        barrier = new_barrier()
        pool = _pool(threads - 1)
        futures = [pool.submit(loop, k, threads, barrier, *args) for k in range(1, threads)]
        loop(0, threads, barrier, *args)
        for f in futures:
            f.result()


# -- LSTM ------------------------------------------------------------------------------------------
@numba.njit(**_JIT)
def lstm_forward_split(k, threads, barrier, bounds, xw, bs, reverse, Wp, h0, h, c, y, q, keep, c_all,
                       clip_lo, clip_hi):
    """Thread ``k`` of the split LSTM forward. ``xw (T,B,4H)`` in, overwritten by the activated gates
    (the thread's own units); ``h0 (B,H)`` in; ``h``, ``c (B,H)`` final states (``c`` in/out);
    ``y (T,B,H)``; ``q (P,B,4U)`` scratch; ``c_all (T,B,H)`` when ``keep``."""
    T, B, _ = xw.shape
    H = h.shape[1]
    u0, u1 = bounds[k], bounds[k + 1]
    W, qk = Wp[k], q[k]
    U = W.shape[1] // 4
    active_before = 0
    for s in range(T):
        t = T - 1 - s if reverse else s
        before = t + 1 if reverse else t - 1
        n = bs[t]
        for b in range(n):
            small_gemm(y[before, b:b + 1] if b < active_before else h0[b:b + 1], W, qk[b:b + 1], 0.0)
            g, qb, cb, yb, hb = xw[t, b], qk[b], c[b], y[t, b], h[b]
            for j in range(u1 - u0):
                u = u0 + j
                gi = sigmoid(g[LSTM_I * H + u] + qb[LSTM_I * U + j])
                gf = sigmoid(g[LSTM_F * H + u] + qb[LSTM_F * U + j])
                gg = tanh(g[LSTM_G * H + u] + qb[LSTM_G * U + j])
                go = sigmoid(g[LSTM_O * H + u] + qb[LSTM_O * U + j])
                cn = gm.lstm_cell(gi, gf, gg, cb[u], clip_lo, clip_hi)
                g[LSTM_I * H + u] = gi
                g[LSTM_F * H + u] = gf
                g[LSTM_G * H + u] = gg
                g[LSTM_O * H + u] = go
                cb[u] = cn
                out = go * tanh(cn)
                yb[u] = out
                hb[u] = out
            if keep:
                c_all[t, b, u0:u1] = cb[u0:u1]
        for b in range(n, B):
            y[t, b, u0:u1] = 0.0
            if keep:
                c_all[t, b, u0:u1] = 0.0
                for gate in range(4):
                    xw[t, b, gate * H + u0:gate * H + u1] = 0.0
        active_before = n
        barrier_wait(barrier, threads)


@numba.njit(**_JIT)
def lstm_backward_split(k, threads, barrier, bounds, gates, c_all, c_prev, bs, reverse, Wq, dy, dh, dc,
                        d_ih, dh_k, use_clip, clip_lo, clip_hi):
    """Thread ``k`` of the split LSTM backward. ``dh``, ``dc (B,H)``: carries in (``dh_n``, ``dc_n``) and
    out (``dh0``, ``dc0``); ``d_ih (T,B,4H)`` out; ``dh_k (P,B,U)`` scratch (this thread's ``dh``)."""
    T, B, _ = gates.shape
    H = dh.shape[1]
    u0, u1 = bounds[k], bounds[k + 1]
    W, dk = Wq[k], dh_k[k]
    one = one_of(gates)
    for b in range(B):
        dk[b, :u1 - u0] = dh[b, u0:u1]
    for s in range(T):
        t = s if reverse else T - 1 - s
        n = bs[t]
        for b in range(n):
            g, d, cb, cp, dcb, dyb, dkb = gates[t, b], d_ih[t, b], c_all[t, b], c_prev[t, b], dc[b], dy[t, b], dk[b]
            for j in range(u1 - u0):
                u = u0 + j
                go = g[LSTM_O * H + u]
                di, df, dg, do, dcp = gm.lstm_cell_grads(
                    one, g[LSTM_I * H + u], g[LSTM_F * H + u], g[LSTM_G * H + u], go, cb[u], tanh(cb[u]),
                    cp[u], dyb[u] + dkb[j], dcb[u], use_clip, clip_lo, clip_hi)
                d[LSTM_I * H + u] = di
                d[LSTM_F * H + u] = df
                d[LSTM_G * H + u] = dg
                d[LSTM_O * H + u] = do
                dcb[u] = dcp
        for b in range(n, B):
            for gate in range(4):
                d_ih[t, b, gate * H + u0:gate * H + u1] = 0.0
        barrier_wait(barrier, threads)
        for b in range(n):
            small_gemm(d_ih[t, b:b + 1], W, dk[b:b + 1], 0.0)
    for b in range(B):
        dh[b, u0:u1] = dk[b, :u1 - u0]


# -- GRU (reset after the product) ----------------------------------------------------------------
@numba.njit(**_JIT)
def gru_forward_split(k, threads, barrier, bounds, xw, bs, reverse, Wp, b_hn, h0, h, y, q, keep, hn_all):
    """Thread ``k`` of the split reset-after GRU forward; ``hn_all (T,B,H)`` = ``W_hn h + b_hn`` when
    ``keep``; other arguments as :func:`lstm_forward_split`."""
    T, B, _ = xw.shape
    H = h.shape[1]
    u0, u1 = bounds[k], bounds[k + 1]
    W, qk = Wp[k], q[k]
    U = W.shape[1] // 3
    active_before = 0
    for s in range(T):
        t = T - 1 - s if reverse else s
        before = t + 1 if reverse else t - 1
        n = bs[t]
        for b in range(n):
            src = y[before, b:b + 1] if b < active_before else h0[b:b + 1]
            small_gemm(src, W, qk[b:b + 1], 0.0)
            g, qb, hp, yb, hb = xw[t, b], qk[b], src[0], y[t, b], h[b]
            hn_out = hn_all[t if keep else 0, b]
            for j in range(u1 - u0):
                u = u0 + j
                r = sigmoid(g[GRU_R * H + u] + qb[GRU_R * U + j])
                z = sigmoid(g[GRU_Z * H + u] + qb[GRU_Z * U + j])
                hn = qb[GRU_N * U + j] + b_hn[u]
                nn = tanh(gm.gru_candidate_input(g[GRU_N * H + u], r, hn))
                g[GRU_R * H + u] = r
                g[GRU_Z * H + u] = z
                g[GRU_N * H + u] = nn
                hn_out[u] = hn
                out = gm.gru_output(z, nn, hp[u])
                yb[u] = out
                hb[u] = out
        for b in range(n, B):
            y[t, b, u0:u1] = 0.0
            if keep:
                hn_all[t, b, u0:u1] = 0.0
                for gate in range(3):
                    xw[t, b, gate * H + u0:gate * H + u1] = 0.0
        active_before = n
        barrier_wait(barrier, threads)


@numba.njit(**_JIT)
def gru_backward_split(k, threads, barrier, bounds, gates, hn_all, h_prev, bs, reverse, Wq, dy, dh, d_ih,
                       d_hh, dh_k):
    """Thread ``k`` of the split reset-after GRU backward: ``d_ih``, ``d_hh (T,B,3H)`` out; ``dh`` in/out;
    ``dh_k (P,B,U)`` scratch."""
    T, B, _ = gates.shape
    H = dh.shape[1]
    u0, u1 = bounds[k], bounds[k + 1]
    W, dk = Wq[k], dh_k[k]
    one = one_of(gates)
    for b in range(B):
        dk[b, :u1 - u0] = dh[b, u0:u1]
    for s in range(T):
        t = s if reverse else T - 1 - s
        n = bs[t]
        for b in range(n):
            g, hnb, hp, dyb, dkb = gates[t, b], hn_all[t, b], h_prev[t, b], dy[t, b], dk[b]
            d, e = d_ih[t, b], d_hh[t, b]
            for j in range(u1 - u0):
                u = u0 + j
                r = g[GRU_R * H + u]
                dz, dn, carry = gm.gru_zn_grads(one, g[GRU_Z * H + u], g[GRU_N * H + u], hp[u],
                                                dyb[u] + dkb[j])
                dr = gm.sigmoid_grad(one, r, dn * hnb[u])
                d[GRU_R * H + u] = dr
                d[GRU_Z * H + u] = dz
                d[GRU_N * H + u] = dn
                e[GRU_R * H + u] = dr
                e[GRU_Z * H + u] = dz
                e[GRU_N * H + u] = dn * r
                dkb[j] = carry
        for b in range(n, B):
            for gate in range(3):
                d_ih[t, b, gate * H + u0:gate * H + u1] = 0.0
                d_hh[t, b, gate * H + u0:gate * H + u1] = 0.0
        barrier_wait(barrier, threads)
        for b in range(n):
            small_gemm(d_hh[t, b:b + 1], W, dk[b:b + 1], 1.0)
    for b in range(B):
        dh[b, u0:u1] = dk[b, :u1 - u0]
