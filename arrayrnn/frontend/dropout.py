"""Inter-layer dropout masks: ONE counter-based generator, so every engine and device sees the same mask.

Semantics, exactly (``F = D * H_out``, rows in the caller's order, time-major; all integers uint64,
arithmetic modulo ``2**64``)::

    def mix(z):                                   # SplitMix64's finaliser
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB
        return z ^ (z >> 31)

    key = mix(seed)
    i = ((l - 1) * T + t) * B * F + b * F + f     # the entry's position in a (L-1, T, B, F) array
    u = (mix(key + (i + 1) * 0x9E3779B97F4A7C15) >> 11) / 2**53      # uniform in [0, 1)
    masks[l - 1][t, b, f] = (u >= p) / (1 - p)    # multiplies the input of layer l (output of l - 1)

No mask follows the last layer. The masks are computed with integer array operations of the arrays'
module (NumPy or CuPy) on the arrays' device, so the same seed gives bit-identical masks everywhere.
``seed=None`` draws a fresh seed (the masks are still kept with the result, so the backward pass uses
the same ones).
"""

from __future__ import annotations

import secrets
from types import ModuleType
from typing import Any

import numpy as np

from ..core.spec import RNNSpec, check_seed

_GOLDEN = 0x9E3779B97F4A7C15
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_MASK64 = (1 << 64) - 1


def dropout_masks(spec: RNNSpec, seq_len: int, batch: int, seed: int | None,
                  xp: ModuleType = np) -> tuple[Any, ...] | None:
    """``L - 1`` masks ``(T, B, D*H_out)`` in ``spec.dtype`` on ``xp``'s current device, or ``None``
    when there is no dropout (``p = 0`` or one layer)."""
    p, layers = spec.dropout, spec.num_layers
    if p == 0.0 or layers == 1:
        return None
    seed = check_seed(seed)
    if seed is None:
        seed = secrets.randbits(63)
    features = spec.num_directions * spec.output_size
    per_layer = seq_len * batch * features
    key = _mix_int(seed)
    scale = xp.asarray(1.0 / (1.0 - p), dtype=spec.dtype)
    masks = []
    for layer in range(layers - 1):
        u = uniform(xp, key, layer * per_layer, per_layer)
        keep = (u >= p).reshape(seq_len, batch, features)
        masks.append(keep.astype(spec.dtype) * scale)
    return tuple(masks)


def uniform(xp: ModuleType, key: int, start: int, count: int) -> Any:
    """Entries ``start .. start+count-1`` of the stream of ``key``: float64 in ``[0, 1)``."""
    counter = xp.arange(start + 1, start + count + 1, dtype=xp.uint64)
    state = xp.uint64(key) + counter * xp.uint64(_GOLDEN)
    return (_mix(xp, state) >> xp.uint64(11)).astype(xp.float64) * (1.0 / (1 << 53))


def _mix(xp: ModuleType, z: Any) -> Any:
    z = (z ^ (z >> xp.uint64(30))) * xp.uint64(_M1)
    z = (z ^ (z >> xp.uint64(27))) * xp.uint64(_M2)
    return z ^ (z >> xp.uint64(31))


def _mix_int(z: int) -> int:
    z &= _MASK64
    z = ((z ^ (z >> 30)) * _M1) & _MASK64
    z = ((z ^ (z >> 27)) * _M2) & _MASK64
    return z ^ (z >> 31)
