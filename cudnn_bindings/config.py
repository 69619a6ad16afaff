"""Hand-managed metadata: frozen, validated dataclasses mirroring what cuDNN descriptors hold.

Validation happens in Python before any cuDNN call: wrong types raise ``TypeError``, bad values raise
``ValueError`` naming the field, the value and what is allowed. Enum fields accept a member, its integer
value or its name (``"LSTM"``, case-insensitive) and are stored as the member.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field, fields
from enum import IntEnum
from typing import Any

import numpy as np

from .args import integer
from .enums import (
    RNN_PADDED_IO_ENABLED,
    DataType,
    DirectionMode,
    MathType,
    RNNAlgo,
    RNNBiasMode,
    RNNClipMode,
    RNNDataLayout,
    RNNInputMode,
    RNNMode,
)

__all__ = ["RNNConfig", "SeqDataConfig", "TensorConfig", "MATH_PRECISIONS", "RNN_DATA_TYPES"]

INT32_MAX = 2**31 - 1
MAX_TENSOR_DIMS = 8  # CUDNN_DIM_MAX
# data_type -> the math precisions cuDNN accepts with it (cudnnSetRNNDescriptor_v8)
MATH_PRECISIONS: dict[DataType, tuple[DataType, ...]] = {
    DataType.HALF: (DataType.HALF, DataType.FLOAT),
    DataType.BFLOAT16: (DataType.FLOAT,),
    DataType.FLOAT: (DataType.FLOAT,),
    DataType.DOUBLE: (DataType.DOUBLE,),
}
RNN_DATA_TYPES = tuple(MATH_PRECISIONS)


def _choices(members) -> str:
    return ", ".join(f"{m.name} ({int(m)})" for m in members)


def _as_enum(name: str, value: Any, cls: type[IntEnum], allowed=None) -> IntEnum:
    allowed = tuple(cls) if allowed is None else tuple(allowed)
    if isinstance(value, str):
        member = cls.__members__.get(value.upper())
        if member is None:
            raise ValueError(f"{name} = {value!r}; expected one of {cls.__name__}: {_choices(allowed)}")
    elif isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be a {cls.__name__} member, its int value or its name; got {value!r}")
    else:
        try:
            member = cls(operator.index(value))
        except ValueError:
            msg = f"{name} = {value!r}; expected one of {cls.__name__}: {_choices(allowed)}"
            raise ValueError(msg) from None
    if member not in allowed:
        raise ValueError(f"{name} = {cls.__name__}.{member.name}; allowed here: {_choices(allowed)}")
    return member


def _as_int(name: str, value: Any, lo: int, hi: int = INT32_MAX) -> int:
    """:func:`.args.integer` with a C int's upper bound unless told otherwise."""
    return integer(name, value, lo, hi)


def _as_float(name: str, value: Any, allow_nan: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number; got {value!r} ({type(value).__name__})")
    v = float(value)
    if math.isnan(v) and not allow_nan:
        raise ValueError(f"{name} = nan; expected a number (inf is allowed)")
    return v


def _set(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)


@dataclass(frozen=True, kw_only=True)
class RNNConfig:
    """Every field of `cudnnSetRNNDescriptor_v8` plus the clip settings of `cudnnRNNSetClip_v9`.

    ``proj_size=None`` means ``hidden_size`` (cuDNN's "no projection"); a smaller value is LSTM-only.
    """

    algo: RNNAlgo = RNNAlgo.STANDARD
    cell_mode: RNNMode = RNNMode.LSTM
    bias_mode: RNNBiasMode = RNNBiasMode.DOUBLE_BIAS
    dir_mode: DirectionMode = DirectionMode.UNIDIRECTIONAL
    input_mode: RNNInputMode = RNNInputMode.LINEAR_INPUT
    data_type: DataType = DataType.FLOAT
    math_prec: DataType = DataType.FLOAT
    math_type: MathType = MathType.DEFAULT_MATH
    input_size: int
    hidden_size: int
    proj_size: int | None = None
    num_layers: int = 1
    aux_flags: int = RNN_PADDED_IO_ENABLED
    clip_mode: RNNClipMode = RNNClipMode.NONE
    lclip: float = 0.0
    rclip: float = 0.0

    def __post_init__(self) -> None:
        algos = [a for a in RNNAlgo if a is not RNNAlgo.COUNT]
        _set(self, "algo", _as_enum("algo", self.algo, RNNAlgo, algos))
        _set(self, "cell_mode", _as_enum("cell_mode", self.cell_mode, RNNMode))
        _set(self, "bias_mode", _as_enum("bias_mode", self.bias_mode, RNNBiasMode))
        _set(self, "dir_mode", _as_enum("dir_mode", self.dir_mode, DirectionMode))
        _set(self, "input_mode", _as_enum("input_mode", self.input_mode, RNNInputMode))
        _set(self, "data_type", _as_enum("data_type", self.data_type, DataType, RNN_DATA_TYPES))
        precisions = MATH_PRECISIONS[self.data_type]
        _set(self, "math_prec", _as_enum("math_prec", self.math_prec, DataType, precisions))
        _set(self, "math_type", _as_enum("math_type", self.math_type, MathType))
        for name in ("input_size", "hidden_size", "num_layers"):
            _set(self, name, _as_int(name, getattr(self, name), 1))
        self._check_proj()
        if self.input_mode is RNNInputMode.SKIP_INPUT and self.input_size != self.hidden_size:
            raise ValueError(f"input_size = {self.input_size} with input_mode = SKIP_INPUT; SKIP_INPUT needs "
                             f"input_size == hidden_size = {self.hidden_size}")
        _set(self, "aux_flags", _as_int("aux_flags", self.aux_flags, 0, RNN_PADDED_IO_ENABLED))
        self._check_clip()

    def _check_proj(self) -> None:
        proj = self.hidden_size if self.proj_size is None else self.proj_size
        proj = _as_int("proj_size", proj, 1, self.hidden_size)
        if proj < self.hidden_size and self.cell_mode is not RNNMode.LSTM:
            raise ValueError(f"proj_size = {proj} < hidden_size = {self.hidden_size} with cell_mode = "
                             f"{self.cell_mode.name}; recurrent projection is LSTM-only (use proj_size = "
                             f"hidden_size for none)")
        _set(self, "proj_size", proj)

    def _check_clip(self) -> None:
        _set(self, "clip_mode", _as_enum("clip_mode", self.clip_mode, RNNClipMode))
        _set(self, "lclip", _as_float("lclip", self.lclip))
        _set(self, "rclip", _as_float("rclip", self.rclip))
        if self.lclip > self.rclip:
            raise ValueError(f"lclip = {self.lclip} > rclip = {self.rclip}; expected lclip <= rclip")

    @property
    def num_directions(self) -> int:
        """2 for BIDIRECTIONAL, else 1."""
        return 2 if self.dir_mode is DirectionMode.BIDIRECTIONAL else 1

    @property
    def padded_io(self) -> bool:
        """Whether ``aux_flags`` has ``CUDNN_RNN_PADDED_IO_ENABLED``."""
        return bool(self.aux_flags & RNN_PADDED_IO_ENABLED)


_NP_DTYPES = {DataType.HALF: np.float16, DataType.FLOAT: np.float32, DataType.DOUBLE: np.float64}


def _round_bf16(v: float) -> float:
    bits = int(np.array(v, np.float32).view(np.uint32))
    if not math.isnan(v):
        bits += 0x7FFF + ((bits >> 16) & 1)  # round to nearest even
    return float(np.array((bits >> 16) << 16 & 0xFFFFFFFF, np.uint32).view(np.float32))


def fill_bytes(data_type: DataType, value: float) -> bytes:
    """``value`` encoded as one element of ``data_type`` (what cuDNN reads through ``paddingFill``);
    values beyond the type's range become inf."""
    with np.errstate(over="ignore"):
        if data_type is DataType.BFLOAT16:
            return (int(np.array(_round_bf16(value), np.float32).view(np.uint32)) >> 16).to_bytes(2, "little")
        return np.array(value, _NP_DTYPES[data_type]).tobytes()


def fill_value(data_type: DataType, raw: bytes) -> float:
    """Inverse of `fill_bytes`."""
    if data_type is DataType.BFLOAT16:
        return float(np.array(int.from_bytes(raw[:2], "little") << 16, np.uint32).view(np.float32))
    dt = np.dtype(_NP_DTYPES[data_type])
    return float(np.frombuffer(raw[: dt.itemsize], dt)[0])


def _seq_lengths(value: Any, batch_size: int, max_len: int) -> np.ndarray:
    if value is None:
        arr = np.full(batch_size, max_len, dtype=np.int32)
    else:
        src = np.asarray(value)
        if src.dtype == np.bool_ or not np.issubdtype(src.dtype, np.integer):
            raise TypeError(f"seq_lengths must hold integers; got dtype {src.dtype}")
        if src.shape != (batch_size,):
            raise ValueError(f"seq_lengths has shape {src.shape}; expected (batch_size,) = ({batch_size},)")
        bad = np.flatnonzero((src < 0) | (src > max_len))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"seq_lengths[{i}] = {int(src[i])}; every length must be in 0..max_seq_length "
                             f"= {max_len}")
        arr = src.astype(np.int32, copy=True)
    arr.flags.writeable = False
    return arr


@dataclass(frozen=True, kw_only=True, eq=False)
class SeqDataConfig:
    """What `cudnnSetRNNDataDescriptor` takes. ``seq_lengths`` (default: all ``max_seq_length``) is held
    as a read-only int32 host array; ``padding_fill`` is rounded to ``data_type`` as cuDNN stores it."""

    data_type: DataType = DataType.FLOAT
    layout: RNNDataLayout = RNNDataLayout.SEQ_MAJOR_UNPACKED
    max_seq_length: int
    batch_size: int
    vector_size: int
    seq_lengths: Any = None
    padding_fill: float = 0.0

    def __post_init__(self) -> None:
        _set(self, "data_type", _as_enum("data_type", self.data_type, DataType, RNN_DATA_TYPES))
        _set(self, "layout", _as_enum("layout", self.layout, RNNDataLayout))
        for name in ("max_seq_length", "batch_size", "vector_size"):
            _set(self, name, _as_int(name, getattr(self, name), 1))
        _set(self, "seq_lengths", _seq_lengths(self.seq_lengths, self.batch_size, self.max_seq_length))
        fill = _as_float("padding_fill", self.padding_fill, allow_nan=True)
        stored = fill_value(self.data_type, fill_bytes(self.data_type, fill))
        if math.isinf(stored) and not math.isinf(fill):
            raise ValueError(f"padding_fill = {fill} overflows data_type = {self.data_type.name}")
        _set(self, "padding_fill", stored)

    def _key(self) -> tuple:
        fill = "nan" if math.isnan(self.padding_fill) else self.padding_fill
        return (self.data_type, self.layout, self.max_seq_length, self.batch_size, self.vector_size,
                tuple(self.seq_lengths.tolist()), fill)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SeqDataConfig):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        names = [f.name for f in fields(self) if f.name != "seq_lengths"]
        parts = ", ".join(f"{n}={getattr(self, n)!r}" for n in names)
        lengths = self.seq_lengths
        shown = repr(lengths.tolist()) if lengths.size <= 16 else (
            f"[{', '.join(map(str, lengths[:8].tolist()))}, ... ({lengths.size} lengths)]")
        return f"SeqDataConfig({parts}, seq_lengths={shown})"


def _packed_strides(dims: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(dims):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


@dataclass(frozen=True, kw_only=True)
class TensorConfig:
    """What `cudnnSetTensorNdDescriptor` takes; ``strides=None`` means packed row-major."""

    data_type: DataType = DataType.FLOAT
    dims: tuple[int, ...] = field(default=())
    strides: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        _set(self, "data_type", _as_enum("data_type", self.data_type, DataType))
        if isinstance(self.dims, (str, bytes)) or not hasattr(self.dims, "__len__"):
            raise TypeError(f"dims must be a sequence of integers; got {self.dims!r}")
        n = len(self.dims)
        if not 2 <= n <= MAX_TENSOR_DIMS:
            raise ValueError(f"dims has {n} entries; expected 2..{MAX_TENSOR_DIMS}")
        _set(self, "dims", tuple(_as_int(f"dims[{i}]", d, 1) for i, d in enumerate(self.dims)))
        strides = _packed_strides(self.dims) if self.strides is None else self.strides
        if self.strides is None and strides[0] > INT32_MAX:
            raise ValueError(f"dims = {self.dims} is too large to pack: the outer stride would be "
                             f"{strides[0]} > {INT32_MAX} (cuDNN's strides are C ints)")
        if len(strides) != n:
            raise ValueError(f"strides has {len(strides)} entries; expected len(dims) = {n}")
        _set(self, "strides", tuple(_as_int(f"strides[{i}]", s, 0) for i, s in enumerate(strides)))
