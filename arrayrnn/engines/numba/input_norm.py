"""The backward of the input side's layer norm on the numba engine: ``xw = g_ih * LN(W_ih x) + bias``,
which the forward loop normalised step by step, keeping the raw product ``W_ih x``
(``DirectionCache.raw_input``).

One compiled pass per batch row over every step, roughly::

    for t, b in active steps and rows:
        x = LN(raw[t, b])                       # its statistics computed again: the row is in L1
        d_gain[b] += dpre[t, b] * x
        d_product[t, b] = rstd * (d - mean(d) - x * mean(d * x)),  d = dpre[t, b] * g_ih

(``dpre``: the cotangent of ``xw``; ``d_product``: that of ``W_ih x``, the operand of ``dW_ih`` and ``dx``;
zero at idle rows). The batch rows split over the engine's threads, each with its own rows of ``d_gain``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import gate_math as gm
from ..base import LayerNormWeights
from .loop_parts import one_of, row_stats
from .loop_threads import in_parallel_split, split_rows
from .simd_ir import prefer_full_vectors, simd_jit


@simd_jit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc"})  # the sums vectorise
def input_norm_backward(b0, b1, raw, dpre, g_ih, eps, bs, d_product, d_gain):
    """Rows ``b0 .. b1`` of every step (module doc)."""
    prefer_full_vectors()
    one = one_of(raw)
    inv = one / raw.shape[2]
    for t in range(raw.shape[0]):
        n = max(b0, min(bs[t], b1))
        for b in range(b0, n):
            v, d, out, acc = raw[t, b], dpre[t, b], d_product[t, b], d_gain[b]
            mean, rstd = row_stats(one, v, eps)
            sum_d, sum_dx = one - one, one - one
            for k in range(v.shape[0]):
                x = gm.layer_normalized(v[k], mean, rstd)
                acc[k] += d[k] * x
                dd = d[k] * g_ih[k]
                sum_d += dd
                sum_dx += dd * x
            mean_d, mean_dx = sum_d * inv, sum_dx * inv
            for k in range(v.shape[0]):
                x = gm.layer_normalized(v[k], mean, rstd)
                out[k] = gm.layer_norm_grad(rstd, d[k] * g_ih[k], x, mean_d, mean_dx)
        for b in range(n, b1):
            d_product[t, b] = 0.0


def backward(norm: LayerNormWeights, raw: np.ndarray, dpre: np.ndarray, batch_sizes: np.ndarray,
             threads: int) -> tuple[np.ndarray, np.ndarray]:
    """``(d_product, g_ih's gradient)`` from ``dpre``, the cotangent of the normalised input side, and the
    kept raw products ``raw`` (both ``(T, B, G*H)``), on up to ``threads`` threads."""
    B, G = raw.shape[1], raw.shape[2]
    dtype: Any = raw.dtype
    d_product, d_gain = np.empty_like(raw), np.zeros((B, G), dtype)
    dpre, g_ih = np.ascontiguousarray(dpre), np.ascontiguousarray(norm.g_ih)
    bs, eps = np.ascontiguousarray(batch_sizes, dtype=np.int64), dtype.type(norm.eps)
    in_parallel_split(lambda b0, b1: input_norm_backward(b0, b1, raw, dpre, g_ih, eps, bs, d_product, d_gain),
                      lambda n: split_rows(B, n, align=1), threads)
    return d_product, d_gain.sum(axis=0)
