"""Inter-layer dropout masks: drawn once on the host from a seed, so every engine sees the same mask.

Semantics, exactly (``F = D * H_out``, row order as the caller passed the batch, time-major)::

    keep = numpy.random.default_rng(seed).random((L - 1, T, B, F)) >= p
    masks[l - 1] = keep[l - 1] / (1 - p)       # multiplies the input of layer l (the output of l - 1)

No mask follows the last layer. ``seed=None`` draws fresh entropy (the masks are still kept with the
result, so the backward pass uses the same ones).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .spec import RNNSpec


def dropout_masks(spec: RNNSpec, seq_len: int, batch: int, seed: int | None) -> tuple[np.ndarray, ...] | None:
    """``L - 1`` host masks ``(T, B, D*H_out)`` in ``spec.dtype``, or ``None`` when there is no dropout."""
    p, layers = spec.dropout, spec.num_layers
    if p == 0.0 or layers == 1:
        return None
    features = spec.num_directions * spec.output_size
    keep = np.random.default_rng(seed).random((layers - 1, seq_len, batch, features)) >= p
    scaled = keep.astype(spec.dtype) * np.asarray(1.0 / (1.0 - p), dtype=spec.dtype)
    return tuple(scaled)


def check_seed(seed: Any) -> int | None:
    """``seed`` as accepted by ``rnn_forward``: ``None`` or a non-negative integer."""
    if seed is None:
        return None
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed has type {type(seed).__name__}; expected None or a non-negative int")
    if seed < 0:
        raise ValueError(f"seed = {seed}; expected None or a non-negative int")
    return int(seed)
