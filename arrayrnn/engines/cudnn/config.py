"""The parts of the cuDNN engine that need no GPU: spec -> cuDNN configuration (and its precision), the
canonical <-> cudnn index maps, the configurations cuDNN refuses, and the masks that keep padding and
empty rows out of cuDNN's arithmetic (pure array functions).

Kept apart from :mod:`.engine` (which needs CuPy and a device) so that CI tests every line of it.

**Precision.** float32 runs with ``CUDNN_FMA_MATH``: ``CUDNN_DEFAULT_MATH`` lets cuDNN use TF32 tensor cores
on Ampere and later GPUs (10-bit mantissa products, about 1e-3 relative error). Setting
``arrayrnn.engines.cudnn.config.allow_tf32 = True`` (read at every call, like
``torch.backends.cudnn.allow_tf32``) allows it, for speed. float16 runs with ``CUDNN_TENSOR_OP_MATH``
(float32 accumulation), float64 with ``CUDNN_DEFAULT_MATH``.

**Algorithm.** ``arrayrnn.engines.cudnn.config.algo`` (read when a call's plan is made) is ``"auto"`` or one
of :data:`ALGOS`. ``"auto"`` follows PyTorch's rule (aten/src/ATen/native/cudnn/RNN.cpp, ``get_algo``; see
:func:`choose_algo`); a named algorithm is asked for as it is. Either way cuDNN may refuse it for a call
(lengths, dtype, sizes, device): the plan then runs ``CUDNN_RNN_ALGO_STANDARD`` and says why
(``arrayrnn.engines.cudnn.engine.ENGINE.plan_for(...)``, and the ``arrayrnn.cudnn`` logger at INFO).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import cudnn_bindings as cb

from ...core.layout import layout_of
from ...core.spec import RNNSpec
from .. import thresholds
from ..base import call_variants

Array = Any

allow_tf32 = False  # float32 on TF32 tensor cores (CUDNN_DEFAULT_MATH) instead of CUDNN_FMA_MATH
algo = "auto"  # cuDNN's RNN algorithm: "auto" (PyTorch's rule) or one of ALGOS

ALGOS = {"standard": cb.RNNAlgo.STANDARD, "persist_static": cb.RNNAlgo.PERSIST_STATIC,
         "persist_dynamic": cb.RNNAlgo.PERSIST_DYNAMIC,
         "persist_static_small_h": cb.RNNAlgo.PERSIST_STATIC_SMALL_H}
# PyTorch's PERSIST_STATIC_SMALL_H limits on hidden_size (RNN.cpp, use_rnn_persist_small_h): forward
# (inference) and backward; a training forward uses the backward's, so that its reserve space is made by
# the descriptor the backward runs with
SMALL_H_LIMITS = {"rnn_tanh": (384, 256), "rnn_relu": (384, 256), "lstm": (192, 128), "gru": (192, 128)}

_MODES = {"rnn_tanh": cb.RNNMode.RNN_TANH, "rnn_relu": cb.RNNMode.RNN_RELU, "lstm": cb.RNNMode.LSTM,
          "gru": cb.RNNMode.GRU}
_BIAS = {"double": cb.RNNBiasMode.DOUBLE_BIAS, "single_inp": cb.RNNBiasMode.SINGLE_INP_BIAS,
         "single_rec": cb.RNNBiasMode.SINGLE_REC_BIAS, "none": cb.RNNBiasMode.NO_BIAS}
DATA_TYPES = {"float16": cb.DataType.HALF, "float32": cb.DataType.FLOAT, "float64": cb.DataType.DOUBLE}
_MATH_PREC = {"float16": cb.DataType.FLOAT, "float32": cb.DataType.FLOAT, "float64": cb.DataType.DOUBLE}
PADDED_IO_ENABLED = 1  # CUDNN_RNN_PADDED_IO_ENABLED (cudnn_adv.h)
WEIGHT_ALIGN_BYTES = 256  # where each layer's weight space starts inside one buffer (dropout: layer by layer)


def refusal(spec: RNNSpec) -> str | None:
    """Why cuDNN (as this engine uses it) cannot run ``spec``, or ``None``."""
    if spec.mode == "gru" and not spec.reset_after:
        return "cuDNN cannot run the reset-before GRU (reset_after=False); use engine='cupy' or 'reference'"
    if spec.cell_clip is not None:
        return ("cell_clip: cuDNN's clip (cudnnRNNSetClip_v9) is not arrayrnn's: it also clips c0 on entry "
                "and returns the cell state before its last clip as c_n (measured on a GPU: "
                "tests/test_cudnn_engine.py::test_gpu_cell_clip_is_cudnns_own); use engine='cupy' or "
                "'reference'")
    if spec.dtype not in DATA_TYPES:
        return f"dtype = {spec.dtype!r}; cuDNN runs float16, float32 and float64"
    if spec.peepholes:
        return "peepholes=True: cuDNN's LSTM has no peephole weights; use engine='cupy' or 'reference'"
    if spec.layer_norm:
        return ("layer_norm=True: cuDNN's RNN has no layer normalisation inside the recurrence; use "
                "engine='cupy' or 'reference'")
    return None


def variant_refusal(call: Any) -> str | None:
    """Why cuDNN cannot run this call's cell variants (see ``arrayrnn.engines.base.call_variants``), or
    ``None``: cuDNN's RNN has neither recurrent dropout, DropConnect nor zoneout (its dropout acts between
    layers only), no peepholes, and returns the states of the last layer only."""
    variants = call_variants(call)
    if not variants:
        return None
    return (f"{', '.join(variants)}: cuDNN's RNN has no recurrent dropout, DropConnect, zoneout or "
            "peepholes, and returns only the last layer's states; use engine='cupy' or 'reference'")


def library_reason() -> str | None:
    """Why libcudnn cannot be used here (the bindings' own answer), or ``None``."""
    try:
        cb.version()
    except cb.CudnnLibraryError as err:
        return f"libcudnn cannot be loaded ({' '.join(str(err).split())})"
    return None


def check(call: Any) -> str | None:
    """The engine's answer to a ``Call``: ``None`` (it runs it) or the reason. Under ``"auto"`` it also
    declines short sequences, unless the params are already in the cudnn format (converting them for
    another engine would cost more than cuDNN's fixed overhead)."""
    if call.xp is np:
        return "cuDNN runs on CuPy (GPU) arrays; these are NumPy arrays"
    reason = library_reason() or refusal(call.spec) or variant_refusal(call)
    if (reason is None and not call.explicit and call.params_format != "cudnn"
            and call.seq_len < thresholds.AUTO_MIN_SEQ_LEN):
        reason = (f"T = {call.seq_len} is below cuDNN's threshold of {thresholds.AUTO_MIN_SEQ_LEN} steps "
                  "(a placeholder, not yet measured on a GPU)")
    return reason


def math_type(dtype: str, tf32: bool | None = None) -> cb.MathType:
    """``cudnnMathType_t`` for ``dtype``: float32 FMA_MATH (DEFAULT_MATH, which permits TF32, only when
    ``tf32`` or, when ``None``, the module's ``allow_tf32``), float16 TENSOR_OP_MATH, float64 DEFAULT_MATH."""
    if dtype == "float16":
        return cb.MathType.TENSOR_OP_MATH
    if dtype == "float32" and not (allow_tf32 if tf32 is None else tf32):
        return cb.MathType.FMA_MATH
    return cb.MathType.DEFAULT_MATH


def rnn_config(spec: RNNSpec, dtype: str | None = None, tf32: bool | None = None,
               algo: cb.RNNAlgo = cb.RNNAlgo.STANDARD) -> cb.RNNConfig:
    """The cuDNN RNN configuration of ``spec`` (in ``dtype``, default ``spec.dtype``; float16 computes in
    float32) run with ``algo``. cuDNN means "no projection" by proj_size = hidden_size."""
    dtype = dtype or spec.dtype
    lo, hi = spec.cell_clip if spec.cell_clip is not None else (0.0, 0.0)
    clip = cb.RNNClipMode.MINMAX if spec.cell_clip is not None else cb.RNNClipMode.NONE
    return cb.RNNConfig(
        algo=algo, cell_mode=_MODES[spec.mode], bias_mode=_BIAS[spec.bias],
        dir_mode=cb.DirectionMode.BIDIRECTIONAL if spec.bidirectional else cb.DirectionMode.UNIDIRECTIONAL,
        data_type=DATA_TYPES[dtype], math_prec=_MATH_PREC[dtype], math_type=math_type(dtype, tf32),
        input_size=spec.input_size, hidden_size=spec.hidden_size,
        proj_size=spec.proj_size or spec.hidden_size, num_layers=spec.num_layers,
        aux_flags=PADDED_IO_ENABLED, clip_mode=clip, lclip=lo, rclip=hi)


def requested_algo(value: Any = None) -> str:
    """The algorithm setting (``value``, default the module's :data:`algo`), checked."""
    value = algo if value is None else value
    if value != "auto" and value not in ALGOS:
        raise ValueError(f"arrayrnn.engines.cudnn.config.algo = {value!r}; expected 'auto' or one of "
                         f"{tuple(ALGOS)}")
    return value


def is_refusal(err: cb.CudnnError) -> bool:
    """Whether ``err`` is cuDNN's "not for this call" (BAD_PARAM* / NOT_SUPPORTED*), which an algorithm
    other than STANDARD may meet where STANDARD would run."""
    return 2000 <= err.status < 4000


def choose_algo(spec: RNNSpec, dtype: str, equal_lengths: bool, training: bool, compute_major: int,
                requested: str = "auto") -> tuple[cb.RNNAlgo, str]:
    """The algorithm a plan asks cuDNN for, and why (a phrase). ``"auto"`` is PyTorch's rule: a
    projection, float64 or unequal lengths run STANDARD; else PERSIST_STATIC_SMALL_H where ``hidden_size``
    is within :data:`SMALL_H_LIMITS` (compute capability >= 6.0); else PERSIST_STATIC for float16 single-layer
    unidirectional stacks with ``hidden_size`` and ``input_size`` multiples of 128 (PyTorch adds batch-size
    conditions per device, which this leaves to cuDNN's own refusal); else STANDARD."""
    if requested != "auto":
        return ALGOS[requested], f"algo = {requested!r} was asked for"
    if spec.proj_size:
        return cb.RNNAlgo.STANDARD, "projection runs the standard algorithm only"
    if dtype == "float64":
        return cb.RNNAlgo.STANDARD, "float64 runs the standard algorithm only"
    if not equal_lengths:
        return cb.RNNAlgo.STANDARD, "unequal lengths run the standard algorithm (persistent ones refuse them)"
    limit = SMALL_H_LIMITS[spec.mode][1 if training else 0]
    if compute_major >= 6 and spec.hidden_size <= limit:
        return (cb.RNNAlgo.PERSIST_STATIC_SMALL_H,
                f"hidden_size = {spec.hidden_size} <= {limit} ({'training' if training else 'inference'})")
    if (dtype == "float16" and spec.num_layers == 1 and not spec.bidirectional and spec.hidden_size <= 1024
            and spec.hidden_size % 128 == 0 and spec.input_size % 128 == 0):
        return cb.RNNAlgo.PERSIST_STATIC, "float16, one unidirectional layer, sizes multiples of 128"
    return cb.RNNAlgo.STANDARD, "no persistent algorithm fits"


def layer_spec(spec: RNNSpec, layer: int) -> RNNSpec:
    """The one-layer spec of ``spec``'s layer ``layer`` (its input is the previous layer's output)."""
    return spec.replace(num_layers=1, input_size=spec.layer_input_size(layer), dropout=0.0)


# ---------------------------------------------------------------- canonical <-> cudnn
def _lin_ids(spec: RNNSpec, name: str) -> tuple[list[int], str]:
    """cuDNN's linLayerIDs holding canonical block ``name`` (gate order i,f,g,o / r,z,n = cuDNN's), and
    whether the block is the region's matrix or bias."""
    g = spec.gates
    return {"W_ih": (list(range(g)), "matrix"), "W_hh": (list(range(g, 2 * g)), "matrix"),
            "b_ih": (list(range(g)), "bias"), "b_hh": (list(range(g, 2 * g)), "bias"),
            "W_hr": ([8], "matrix")}[name]


Query = Callable[[int, int], cb.WeightParams]  # (pseudo_layer, lin_layer_id) -> regions, offsets in bytes


def index_map(spec: RNNSpec, itemsize: int, native_bytes: int, query: Query) -> np.ndarray:
    """``idx`` (int32, canonical size): canonical element ``k`` lives at cudnn element ``idx[k]``.

    Every region cuDNN reports is checked: a contiguous row-major region of exactly the canonical block's
    per-gate shape, element-aligned, inside the weight space, and no element claimed twice.
    """
    if native_bytes % itemsize:
        raise ValueError(f"weight space of {native_bytes} bytes is not a whole number of "
                         f"{itemsize}-byte items")
    if native_bytes // itemsize >= 2**31:
        raise ValueError(f"weight space of {native_bytes // itemsize} elements; the int32 index map holds "
                         "fewer than 2**31")
    if spec.peepholes or spec.layer_norm:  # blocks cuDNN's weight space has no place for
        blocks = "peepholes" if spec.peepholes else "layer_norm"
        raise ValueError(f"spec {spec} has {blocks}; {refusal(spec)}")
    idx = np.empty(layout_of(spec).size, np.int32)
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


@dataclass(frozen=True, eq=False)
class LayerMaps:
    """The whole-stack weight space <-> one buffer holding every layer's own weight space (for running the
    stack layer by layer, as inter-layer dropout needs), composed once per (spec, dtype):

        stacked = whole[gather];  stacked[holes] = 0       # forward: ONE gather
        whole_grad = stacked_grad[back]                    # backward: ONE gather; stacked_grad has one
                                                           # extra zero element at the end, for whole's holes
    Layer ``l``'s weight space is ``stacked[offsets[l]:offsets[l] + sizes[l]]`` (each start 256-byte aligned).
    """

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    gather: Array     # int32 (size,)
    holes: Array      # int32: positions of ``stacked`` no weight maps to
    back: Array       # int32 (whole size,)

    @property
    def size(self) -> int:
        return self.offsets[-1] + self.sizes[-1]

    def to(self, xp: Any) -> LayerMaps:
        return LayerMaps(self.offsets, self.sizes, xp.asarray(self.gather), xp.asarray(self.holes),
                         xp.asarray(self.back))


def layer_maps(spec: RNNSpec, whole_idx: np.ndarray, whole_size: int, layer_idx: list[np.ndarray],
               layer_sizes: list[int], itemsize: int) -> LayerMaps:
    """Compose the whole stack's index map with each layer's (host, int32; see :class:`LayerMaps`)."""
    align = max(WEIGHT_ALIGN_BYTES // itemsize, 1)
    offsets, cursor = [], 0
    for size in layer_sizes:
        offsets.append(cursor)
        cursor = -(-(cursor + size) // align) * align
    total = offsets[-1] + layer_sizes[-1]
    gather, covered = np.zeros(total, np.int32), np.zeros(total, bool)
    back = np.full(whole_size, total, np.int32)  # whole's holes read the extra zero element
    layout, last = layout_of(spec), spec.num_directions - 1
    for layer, (offset, idx) in enumerate(zip(offsets, layer_idx, strict=True)):
        start, stop = layout.layer_direction_span(layer, 0)[0], layout.layer_direction_span(layer, last)[1]
        dest, src = offset + idx, whole_idx[start:stop]
        gather[dest], covered[dest], back[src] = src, True, dest
    return LayerMaps(tuple(offsets), tuple(layer_sizes), gather, np.flatnonzero(~covered).astype(np.int32),
                     back)


# ---------------------------------------------------------------- padding and empty rows
def stand_in_lengths(lengths: np.ndarray) -> np.ndarray:
    """Host int32 lengths for cuDNN: every 0 run as 1 (cuDNN has no empty sequences; see :class:`Rows`)."""
    return np.maximum(np.asarray(lengths), 1).astype(np.int32)


@dataclass(frozen=True, eq=False)
class Rows:
    """Where a call's sequences have padding and empty rows, as device masks for ``xp.where``.

    cuDNN runs an empty row as one step from a zero state on zero input (:func:`stand_in_lengths`), and
    everything it reads or writes for that row, like everything at padding, is kept out of the results
    with ``where``, never by multiplying (``inf * 0`` is NaN): the row's ``h0``/``c0`` and cotangents go in
    as zeros; its outputs come back as zero, its final states as its initial ones, its ``dx`` as zero and
    its ``dh0``/``dc0`` as ``dh_n``/``dc_n``; ``dy`` is zero at every padding position before cuDNN sees it
    and ``dx`` is zero there after."""

    valid: Array | None   # (T, B, 1) / (B, T, 1) bool, True at t < len[b]; None without padding
    empty: Array | None   # (1, B, 1) bool, True for rows of length 0; None without empty rows
    seq_lengths: Array    # (B,) int32: cuDNN's devSeqLengths (:func:`stand_in_lengths`)
    host_lengths: np.ndarray  # the same on the host, for the RNN data descriptors

    @classmethod
    def of(cls, xp: Any, lengths: np.ndarray, seq_len: int, batch_first: bool) -> Rows:
        lengths = np.asarray(lengths)
        host = stand_in_lengths(lengths)
        valid = empty = None
        if (lengths < seq_len).any():
            mask = np.arange(seq_len)[:, None] < lengths[None, :]
            valid = xp.asarray((mask.T if batch_first else mask)[:, :, None])
        if (lengths == 0).any():
            empty = xp.asarray((lengths == 0)[None, :, None])
        return cls(valid, empty, xp.asarray(host), host)

    def states_in(self, xp: Any, h0: Array | None, c0: Array | None) -> tuple[Array | None, Array | None]:
        """Initial states for cuDNN: zero for empty rows (``None``, zeros, stays ``None``)."""
        return self._zero_empty(xp, h0), self._zero_empty(xp, c0)

    def forward_out(self, xp: Any, y: Array, h_n: Array, c_n: Array | None, h0: Array,
                    c0: Array | None) -> tuple[Array, Array, Array | None]:
        """cuDNN's outputs with the contract restored for empty rows."""
        if self.empty is None:
            return y, h_n, c_n
        y = xp.where(self.valid, y, 0).astype(y.dtype, copy=False)
        return y, self._restore(xp, h_n, h0), self._restore(xp, c_n, c0)

    def cotangents_in(self, xp: Any, dy: Array, dh_n: Array | None, dc_n: Array | None):
        """Cotangents for cuDNN: ``dy`` zero at padding, ``dh_n``/``dc_n`` zero for empty rows (``None``,
        zeros, stays ``None``)."""
        if self.valid is not None:
            dy = xp.where(self.valid, dy, 0).astype(dy.dtype, copy=False)
        return dy, self._zero_empty(xp, dh_n), self._zero_empty(xp, dc_n)

    def backward_out(self, xp: Any, dx: Array, dh0: Array, dc0: Array | None, dh_n: Array,
                     dc_n: Array | None) -> tuple[Array, Array, Array | None]:
        """cuDNN's gradients with ``dx`` zero at padding and the contract restored for empty rows."""
        if self.valid is not None:
            dx = xp.where(self.valid, dx, 0).astype(dx.dtype, copy=False)
        if self.empty is None:
            return dx, dh0, dc0
        return dx, self._restore(xp, dh0, dh_n), self._restore(xp, dc0, dc_n)

    def _restore(self, xp: Any, out: Array | None, given: Array | None) -> Array | None:
        """``out`` with the empty rows' entries taken from ``given`` (zeros where ``given`` is None)."""
        if out is None:
            return None
        return xp.where(self.empty, 0 if given is None else given, out).astype(out.dtype, copy=False)

    def _zero_empty(self, xp: Any, state: Array | None) -> Array | None:
        if state is None or self.empty is None:
            return state
        return xp.where(self.empty, 0, state).astype(state.dtype, copy=False)
