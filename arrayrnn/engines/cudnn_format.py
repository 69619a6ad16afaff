"""The parts of the cuDNN engine that need no GPU: spec -> cuDNN configuration, the canonical <-> cudnn
index map, the configurations cuDNN refuses, and the zero-length-row fix-ups (pure array functions).

Kept apart from ``cudnn_engine`` (which needs CuPy and a device) so that CI tests every line of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import cudnn_bindings as cb

from ..core.layout import layout_of
from ..core.spec import RNNSpec

Array = Any

# "auto" leaves sequences shorter than this to the CuPy engine. NOT MEASURED: no GPU was available when
# this was written; 16 is a placeholder to be replaced by bench/bench_gpu.py's crossover on a GPU.
AUTO_MIN_SEQ_LEN = 16

_MODES = {"rnn_tanh": cb.RNNMode.RNN_TANH, "rnn_relu": cb.RNNMode.RNN_RELU, "lstm": cb.RNNMode.LSTM,
          "gru": cb.RNNMode.GRU}
_BIAS = {"double": cb.RNNBiasMode.DOUBLE_BIAS, "single_inp": cb.RNNBiasMode.SINGLE_INP_BIAS,
         "single_rec": cb.RNNBiasMode.SINGLE_REC_BIAS, "none": cb.RNNBiasMode.NO_BIAS}
_DATA = {"float16": cb.DataType.HALF, "float32": cb.DataType.FLOAT, "float64": cb.DataType.DOUBLE}
_MATH = {"float16": cb.DataType.FLOAT, "float32": cb.DataType.FLOAT, "float64": cb.DataType.DOUBLE}
PADDED_IO_ENABLED = 1  # CUDNN_RNN_PADDED_IO_ENABLED (cudnn_adv.h)


def refusal(spec: RNNSpec) -> str | None:
    """Why cuDNN (as this engine uses it) cannot run ``spec``, or ``None``."""
    if spec.mode == "gru" and not spec.reset_after:
        return "cuDNN cannot run the reset-before GRU (reset_after=False); use engine='cupy' or 'reference'"
    if spec.cell_clip is not None:
        return ("cell_clip is not accepted yet: cudnnRNNSetClip_v9's semantics have not been checked "
                "against the reference engine on a GPU (tests/test_cudnn_engine.py::test_gpu_cell_clip)")
    if spec.dtype not in _DATA:
        return f"dtype = {spec.dtype!r}; cuDNN runs float16, float32 and float64"
    return None


def check(call: Any) -> str | None:
    """The engine's answer to a ``Call``: ``None`` (it runs it) or the reason. Under ``"auto"`` it also
    declines short sequences, unless the params are already in the cudnn format (converting them for
    another engine would cost more than cuDNN's fixed overhead)."""
    if call.xp is np:
        return "cuDNN runs on CuPy (GPU) arrays; these are NumPy arrays"
    reason = refusal(call.spec)
    if (reason is None and not call.explicit and call.params_format != "cudnn"
            and call.seq_len < AUTO_MIN_SEQ_LEN):
        reason = (f"T = {call.seq_len} is below cuDNN's threshold of {AUTO_MIN_SEQ_LEN} steps "
                  "(a placeholder, not yet measured on a GPU)")
    return reason


def rnn_config(spec: RNNSpec, dtype: str | None = None) -> cb.RNNConfig:
    """The cuDNN RNN configuration of ``spec`` (in ``dtype``, default ``spec.dtype``; float16 computes in
    float32). cuDNN means "no projection" by proj_size = hidden_size."""
    dtype = dtype or spec.dtype
    lo, hi = spec.cell_clip if spec.cell_clip is not None else (0.0, 0.0)
    clip = cb.RNNClipMode.MINMAX if spec.cell_clip is not None else cb.RNNClipMode.NONE
    return cb.RNNConfig(
        cell_mode=_MODES[spec.mode], bias_mode=_BIAS[spec.bias],
        dir_mode=cb.DirectionMode.BIDIRECTIONAL if spec.bidirectional else cb.DirectionMode.UNIDIRECTIONAL,
        data_type=_DATA[dtype], math_prec=_MATH[dtype], input_size=spec.input_size,
        hidden_size=spec.hidden_size, proj_size=spec.proj_size or spec.hidden_size,
        num_layers=spec.num_layers, aux_flags=PADDED_IO_ENABLED, clip_mode=clip, lclip=lo, rclip=hi)


def _lin_ids(spec: RNNSpec, name: str) -> tuple[list[int], str]:
    """cuDNN's linLayerIDs holding canonical block ``name`` (gate order i,f,g,o / r,z,n = cuDNN's), and
    whether the block is the region's matrix or bias."""
    g = spec.gates
    return {"W_ih": (list(range(g)), "matrix"), "W_hh": (list(range(g, 2 * g)), "matrix"),
            "b_ih": (list(range(g)), "bias"), "b_hh": (list(range(g, 2 * g)), "bias"),
            "W_hr": ([8], "matrix")}[name]


Query = Callable[[int, int], cb.WeightParams]  # (pseudo_layer, lin_layer_id) -> regions, offsets in bytes


def index_map(spec: RNNSpec, itemsize: int, native_bytes: int, query: Query) -> np.ndarray:
    """``idx`` (int64, canonical size): canonical element ``k`` lives at cudnn element ``idx[k]``.

    Every region cuDNN reports is checked: a contiguous row-major region of exactly the canonical block's
    per-gate shape, element-aligned, inside the weight space, and no element claimed twice.
    """
    if native_bytes % itemsize:
        raise ValueError(f"weight space of {native_bytes} bytes is not a whole number of "
                         f"{itemsize}-byte items")
    idx = np.empty(layout_of(spec).size, np.int64)
    for block in layout_of(spec).blocks:
        ids, part = _lin_ids(spec, block.name)
        rows = block.shape[0] // len(ids)
        cols = block.shape[1] if len(block.shape) == 2 else 1
        pseudo = block.layer * spec.num_directions + block.direction
        for k, lin in enumerate(ids):
            region = getattr(query(pseudo, lin), part)
            where = f"pseudo-layer {pseudo}, linLayerID {lin}, {part} ({block.key})"
            start = _checked_start(region, rows, cols, itemsize, native_bytes, where)
            first = block.offset + k * rows * cols
            idx[first:first + rows * cols] = np.arange(start, start + rows * cols)
    if len(np.unique(idx)) != len(idx):
        raise ValueError("cuDNN reported overlapping weight regions; refusing to convert")
    return idx


def _checked_start(region: cb.WeightRegion | None, rows: int, cols: int, itemsize: int, native_bytes: int,
                   where: str) -> int:
    if region is None:
        raise ValueError(f"cuDNN reports no region for {where}, which the canonical layout has")
    dims = tuple(d for d in region.dims if d != 1) or (1,)
    want = tuple(d for d in (rows, cols) if d != 1) or (1,)
    if dims != want or region.strides[-1] != 1 or (len(region.dims) > 1 and cols > 1
                                                   and region.strides[-2] != cols):
        raise ValueError(f"cuDNN describes {where} as dims {region.dims}, strides {region.strides}; "
                         f"expected a contiguous row-major ({rows}, {cols}) region")
    if region.offset % itemsize or region.offset + rows * cols * itemsize > native_bytes:
        raise ValueError(f"cuDNN places {where} at byte {region.offset}, outside the {native_bytes}-byte "
                         "weight space or not element-aligned")
    return region.offset // itemsize


def to_cudnn(xp: Any, canonical: Array, idx: Array, native_size: int) -> Array:
    """One scatter: a zeroed weight space of ``native_size`` elements with canonical's values placed."""
    out = xp.zeros(native_size, canonical.dtype)
    out[idx] = canonical
    return out


def to_canonical(native: Array, idx: Array) -> Array:
    """One gather: the canonical buffer from a weight space."""
    return native[idx]


# ---------------------------------------------------------------- zero-length rows (cuDNN fails on them)
def stand_in_lengths(lengths: np.ndarray) -> np.ndarray:
    """Host int32 lengths for cuDNN: every 0 run as 1 (the stand-in step reads x = 0 at padding)."""
    return np.maximum(np.asarray(lengths), 1).astype(np.int32)


def restore_forward(xp: Any, zero: Array, y: Array, h_n: Array, c_n: Array | None, h0: Array,
                    c0: Array | None, batch_first: bool) -> None:
    """In place: rows where ``zero`` (bool (B,)) get zero outputs and final states equal to the initial."""
    y *= _row_keep(xp, zero, y.dtype, batch_first)
    state_zero = xp.asarray(zero)[None, :, None]
    h_n[...] = xp.where(state_zero, h0, h_n)
    if c_n is not None:
        c_n[...] = xp.where(state_zero, c0, c_n)


def mask_cotangents(xp: Any, zero: Array, dy: Array, dh_n: Array, dc_n: Array | None,
                    batch_first: bool) -> tuple[Array, Array, Array | None]:
    """New cotangents with zero-length rows zeroed, so the stand-in step adds exactly nothing to dW
    (every product in its backward has a zero factor)."""
    dy = dy * _row_keep(xp, zero, dy.dtype, batch_first)
    keep_state = _row_keep(xp, zero, dh_n.dtype, batch_first=False)
    dh = dh_n * keep_state
    dc = None if dc_n is None else dc_n * keep_state
    return dy, dh, dc


def restore_backward(xp: Any, zero: Array, dx: Array, dh0: Array, dc0: Array | None, dh_n: Array,
                     dc_n: Array | None, batch_first: bool) -> None:
    """In place: zero-length rows get zero ``dx`` and ``dh0``/``dc0`` equal to ``dh_n``/``dc_n``."""
    dx *= _row_keep(xp, zero, dx.dtype, batch_first)
    state_zero = xp.asarray(zero)[None, :, None]
    dh0[...] = xp.where(state_zero, dh_n, dh0)
    if dc0 is not None:
        dc0[...] = xp.where(state_zero, dc_n, dc0)


def _row_keep(xp: Any, zero: Array, dtype: Any, batch_first: bool) -> Array:
    """1 for rows with a length, 0 for zero-length rows, shaped to broadcast over ``(T, B, .)`` arrays
    (``(B, T, .)`` with ``batch_first``; the states' ``(L*D, B, .)`` share the time-major shape)."""
    keep = xp.asarray(~zero, dtype=dtype)
    return keep[:, None, None] if batch_first else keep[None, :, None]
