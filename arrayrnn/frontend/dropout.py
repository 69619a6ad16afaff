"""Dropout and zoneout masks: ONE counter-based generator, so every engine and device sees the same mask.

:func:`dropout_masks` draws the inter-layer dropout masks, :func:`cell_masks` (public: ``ar.cell_masks``)
those of the cell variants (recurrent dropout, DropConnect on ``W_hh``, zoneout), from the same hash.

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

from ..core.spec import RNNSpec, check_count, check_seed
from ..engines.base import CellMasks
from ..engines.numba_cache import background_enabled, njit

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
    scale = np.dtype(spec.dtype).type(1.0 / (1.0 - p))  # a host scalar: no copy to the device
    masks = []
    for layer in range(layers - 1):
        u = uniform(xp, key, layer * per_layer, per_layer)
        keep = (u >= p).reshape(seq_len, batch, features)
        masks.append(keep.astype(spec.dtype) * scale)
    return tuple(masks)


def uniform(xp: ModuleType, key: int, start: int, count: int) -> Any:
    """Entries ``start .. start+count-1`` of the stream of ``key``: float64 in ``[0, 1)``."""
    # one compiled pass instead of NumPy's eight temporaries, once compiled (or where calls wait for numba)
    if xp is np and (_uniform_host.signatures or not background_enabled()):
        return _uniform_host(np.uint64(key), np.uint64(start), count)
    return uniform_arrays(xp, key, start, count)


def uniform_arrays(xp: ModuleType, key: int, start: int, count: int) -> Any:
    """`uniform` in array operations of ``xp`` (CuPy's path; the oracle of the host's compiled loop)."""
    counter = xp.arange(start + 1, start + count + 1, dtype=xp.uint64)
    state = xp.uint64(key) + counter * xp.uint64(_GOLDEN)
    return (_mix(xp, state) >> xp.uint64(11)).astype(xp.float64) * (1.0 / (1 << 53))


@njit(cache=True)
def _uniform_host(key: np.uint64, start: np.uint64, count: int) -> np.ndarray:
    """`uniform` on the host, the same bits: every operation on uint64, wrapping like NumPy's."""
    out = np.empty(count, np.float64)
    one, golden = np.uint64(1), np.uint64(_GOLDEN)
    m1, m2 = np.uint64(_M1), np.uint64(_M2)
    s30, s27, s31, s11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)
    scale = 1.0 / (1 << 53)
    counter = start
    for i in range(count):
        counter += one
        z = key + counter * golden
        z = (z ^ (z >> s30)) * m1
        z = (z ^ (z >> s27)) * m2
        z = z ^ (z >> s31)
        out[i] = np.float64(z >> s11) * scale
    return out


def _mix(xp: ModuleType, z: Any) -> Any:
    z = (z ^ (z >> xp.uint64(30))) * xp.uint64(_M1)
    z = (z ^ (z >> xp.uint64(27))) * xp.uint64(_M2)
    return z ^ (z >> xp.uint64(31))


def _mix_int(z: int) -> int:
    z &= _MASK64
    z = ((z ^ (z >> 30)) * _M1) & _MASK64
    z = ((z ^ (z >> 27)) * _M2) & _MASK64
    return z ^ (z >> 31)


# -- the cell variants' masks (recurrent dropout, DropConnect, zoneout) -----------------------------
_STREAMS = {"recurrent": 1, "weight": 2, "zoneout_h": 3, "zoneout_c": 4}


def cell_masks(spec: RNNSpec, seed: int | None, batch: int, seq_len: int, *, training: bool = True,
               xp: ModuleType = np) -> CellMasks | None:
    """The masks the engines apply for ``spec``'s cell variants in a call of ``batch`` rows and
    ``seq_len`` steps with this ``seed``: a :class:`~arrayrnn.engines.base.CellMasks`, or ``None`` when
    no variant is on for this call (the dropouts act only when ``training``). ``batch`` and ``seq_len`` are
    non-negative ints (Python or NumPy); anything else is an error naming the argument.

    The same generator as :func:`dropout_masks` with one key per kind of mask, ``key = mix(mix(seed) +
    s)`` for ``s`` = 1 (recurrent), 2 (weight), 3 (zoneout of h), 4 (zoneout of c), and ``i`` the
    entry's position in the row-major array of the shape below (``k = layer * D + direction``)::

        u = (mix(key + (i + 1) * 0x9E3779B97F4A7C15) >> 11) / 2**53
        recurrent[k, b, j]    = (u >= recurrent_dropout) / (1 - recurrent_dropout)   # (L*D, B, H_out)
        weight[k, r, j]       = (u >= weight_dropout) / (1 - weight_dropout)         # (L*D, G*H, H_out)
        zoneout_h[k, t, b, j] = u < zoneout           (training; zoneout in inference)  # (L*D, T, B, H_out)
        zoneout_c[k, t, b, j] = u < zoneout_cell      (training; zoneout_cell in inference)  # (.., H)

    Rows are in the caller's order and ``t`` is the step's time index (the reverse direction reads
    ``zoneout_h[k, t]`` at its step ``t`` too). Pass ``xp=cupy`` for masks on the current GPU: the same
    bits as on the host.
    """
    training = bool(training)
    B, T = check_count("batch", batch), check_count("seq_len", seq_len)
    kd = spec.num_layers * spec.num_directions
    h_out, dtype = spec.output_size, spec.dtype
    seed = check_seed(seed)
    if seed is None:
        seed = secrets.randbits(63)
    base = _mix_int(seed)

    def draw(kind: str, shape: tuple[int, ...]) -> Any:
        key = _mix_int((base + _STREAMS[kind]) & _MASK64)
        return uniform(xp, key, 0, int(np.prod(shape))).reshape(shape)

    drawn = spec.call_masks(training)

    def dropout(kind: str, p: float, shape: tuple[int, ...]) -> Any:
        if kind not in drawn:
            return None
        scale = np.dtype(dtype).type(1.0 / (1.0 - p))
        return (draw(kind, shape) >= p).astype(dtype) * scale

    def zoneout(kind: str, z: float | None, width: int) -> Any:
        shape = (kd, T, B, width)
        if kind not in drawn:
            return None
        return (draw(kind, shape) < z).astype(dtype) if training else xp.full(shape, z, dtype=dtype)

    masks = CellMasks(recurrent=dropout("recurrent", spec.recurrent_dropout, (kd, B, h_out)),
                      weight=dropout("weight", spec.weight_dropout, (kd, spec.gate_size, h_out)),
                      zoneout_h=zoneout("zoneout_h", spec.zoneout, h_out),
                      zoneout_c=zoneout("zoneout_c", spec.zoneout_cell, spec.hidden_size))
    return None if all(m is None for m in masks) else masks
