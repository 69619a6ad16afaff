"""What the cuDNN engine asks of cuDNN, decided without a GPU: what it refuses, spec -> cuDNN configuration
(and its precision), and the algorithm. The weight format's index maps are :mod:`.weight_map`'s, the masks
that keep padding and empty rows out of cuDNN's arithmetic :mod:`.padding`'s.

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

from typing import Any

import numpy as np

import cudnn_bindings as cb

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


def refusal(spec: RNNSpec) -> str | None:
    """Why cuDNN (as this engine uses it) cannot run ``spec``, or ``None``."""
    if spec.custom_cell is not None:
        return (f"mode = {spec.mode!r} is a custom cell; cuDNN runs only its four built-in cells (use "
                "engine='cupy' or 'reference')")
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
