"""Thin call wrappers for the RNN compute API: sizes, weight layout, forward, backward data and weights.

Descriptors and handles are the owning objects of `descriptors` (or raw int addresses); device memory is
passed as integer addresses (``0`` is NULL) with sizes in bytes; the stream is the handle's stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import raw
from .args import address, owned
from .config import _as_enum, _as_int
from .descriptors import Handle, RNNDataDescriptor, RNNDescriptor, TensorDescriptor
from .enums import DataType, ForwardMode, WgradMode

__all__ = ["WeightRegion", "WeightParams", "weight_space_size", "temp_space_sizes", "weight_params",
           "forward", "backward_data", "backward_weights", "build_rnn_dynamic"]

_U64 = 2**64 - 1


# the kind of owning object each descriptor argument takes (an int address is accepted too)
_KINDS: dict[str, type] = {"handle": Handle, "rnn_desc": RNNDescriptor, "x_desc": RNNDataDescriptor,
                           "y_desc": RNNDataDescriptor, "h_desc": TensorDescriptor,
                           "c_desc": TensorDescriptor}


def _desc(value: Any, name: str, optional: bool = False) -> int | None:
    """The address of an open owning object of the kind ``name`` takes (see `args.owned`)."""
    return owned(name, value, _KINDS[name], optional=optional)


def _mem(value: Any, name: str) -> int | None:
    """A device address (int; 0 or None is NULL)."""
    return address(name, value)


def _size(value: Any, name: str) -> int:
    return _as_int(name, value, 0, _U64)


@dataclass(frozen=True)
class WeightRegion:
    """Where one matrix or bias lives in the weight space: ``offset`` in bytes from its start, and the
    tensor cuDNN describes it with (``dims``, ``strides``, ``data_type``)."""

    offset: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    data_type: DataType

    @property
    def size(self) -> int:
        """Number of elements."""
        return int(np.prod(self.dims))


@dataclass(frozen=True)
class WeightParams:
    """The matrix and the bias of one linear layer; ``None`` where cuDNN reports none (e.g. NO_BIAS)."""

    matrix: WeightRegion | None
    bias: WeightRegion | None


def weight_space_size(handle: Handle, rnn_desc: RNNDescriptor) -> int:
    """Bytes of the weight space. See `cudnnGetRNNWeightSpaceSize`."""
    return raw.get_rnn_weight_space_size(_desc(handle, "handle"), _desc(rnn_desc, "rnn_desc"))


def temp_space_sizes(handle: Handle, rnn_desc: RNNDescriptor, x_desc: RNNDataDescriptor,
                     fwd_mode: ForwardMode = ForwardMode.TRAINING) -> tuple[int, int]:
    """``(work_space_size, reserve_space_size)`` in bytes. See `cudnnGetRNNTempSpaceSizes`."""
    return raw.get_rnn_temp_space_sizes(_desc(handle, "handle"), _desc(rnn_desc, "rnn_desc"),
                                        _as_enum("fwd_mode", fwd_mode, ForwardMode), _desc(x_desc, "x_desc"))


def _region(addr: int, base: int, desc: TensorDescriptor) -> WeightRegion | None:
    if not addr:
        return None
    cfg = desc.get()
    return WeightRegion(offset=addr - base, dims=cfg.dims, strides=cfg.strides, data_type=cfg.data_type)


def weight_params(handle: Handle, rnn_desc: RNNDescriptor, pseudo_layer: int, lin_layer_id: int, *,
                  weight_space: int, weight_space_size: int) -> WeightParams:
    """Offset and shape of the matrix and bias ``lin_layer_id`` of ``pseudo_layer`` (layer * directions +
    direction). ``weight_space`` must be non-zero; it is only used for address arithmetic.
    See `cudnnGetRNNWeightParams`."""
    base = address("weight_space", weight_space, nullable=False)
    with TensorDescriptor() as m_desc, TensorDescriptor() as b_desc:
        m_addr, b_addr = raw.get_rnn_weight_params(
            _desc(handle, "handle"), _desc(rnn_desc, "rnn_desc"), _as_int("pseudo_layer", pseudo_layer, 0),
            _size(weight_space_size, "weight_space_size"), base, _as_int("lin_layer_id", lin_layer_id, 0),
            m_desc.ptr, b_desc.ptr)
        return WeightParams(_region(m_addr, base, m_desc), _region(b_addr, base, b_desc))


def forward(handle: Handle, rnn_desc: RNNDescriptor, *, fwd_mode: ForwardMode, dev_seq_lengths: int,
            x_desc: RNNDataDescriptor, x: int, y_desc: RNNDataDescriptor, y: int, h_desc: TensorDescriptor,
            hx: int = 0, hy: int = 0, c_desc: TensorDescriptor | None = None, cx: int = 0, cy: int = 0,
            weight_space: int, weight_space_size: int, work_space: int, work_space_size: int,
            reserve_space: int = 0, reserve_space_size: int = 0) -> None:
    """Forward pass over the whole sequence (``dev_seq_lengths``: int32 lengths in device memory).
    See `cudnnRNNForward`."""
    raw.rnn_forward(
        _desc(handle, "handle"), _desc(rnn_desc, "rnn_desc"), _as_enum("fwd_mode", fwd_mode, ForwardMode),
        _mem(dev_seq_lengths, "dev_seq_lengths"), _desc(x_desc, "x_desc"), _mem(x, "x"),
        _desc(y_desc, "y_desc"), _mem(y, "y"), _desc(h_desc, "h_desc"), _mem(hx, "hx"), _mem(hy, "hy"),
        _desc(c_desc, "c_desc", optional=True), _mem(cx, "cx"), _mem(cy, "cy"),
        _size(weight_space_size, "weight_space_size"), _mem(weight_space, "weight_space"),
        _size(work_space_size, "work_space_size"), _mem(work_space, "work_space"),
        _size(reserve_space_size, "reserve_space_size"), _mem(reserve_space, "reserve_space"))


def backward_data(handle: Handle, rnn_desc: RNNDescriptor, *, dev_seq_lengths: int,
                  y_desc: RNNDataDescriptor, y: int, dy: int, x_desc: RNNDataDescriptor, dx: int,
                  h_desc: TensorDescriptor, hx: int = 0, dhy: int = 0, dhx: int = 0,
                  c_desc: TensorDescriptor | None = None, cx: int = 0, dcy: int = 0, dcx: int = 0,
                  weight_space: int, weight_space_size: int, work_space: int,
                  work_space_size: int, reserve_space: int, reserve_space_size: int) -> None:
    """Gradients with respect to the input and the initial states. See `cudnnRNNBackwardData_v8`."""
    raw.rnn_backward_data_v8(
        _desc(handle, "handle"), _desc(rnn_desc, "rnn_desc"), _mem(dev_seq_lengths, "dev_seq_lengths"),
        _desc(y_desc, "y_desc"), _mem(y, "y"), _mem(dy, "dy"), _desc(x_desc, "x_desc"), _mem(dx, "dx"),
        _desc(h_desc, "h_desc"), _mem(hx, "hx"), _mem(dhy, "dhy"), _mem(dhx, "dhx"),
        _desc(c_desc, "c_desc", optional=True), _mem(cx, "cx"), _mem(dcy, "dcy"), _mem(dcx, "dcx"),
        _size(weight_space_size, "weight_space_size"), _mem(weight_space, "weight_space"),
        _size(work_space_size, "work_space_size"), _mem(work_space, "work_space"),
        _size(reserve_space_size, "reserve_space_size"), _mem(reserve_space, "reserve_space"))


def backward_weights(handle: Handle, rnn_desc: RNNDescriptor, *, add_grad: WgradMode = WgradMode.ADD,
                     dev_seq_lengths: int, x_desc: RNNDataDescriptor, x: int, h_desc: TensorDescriptor,
                     hx: int = 0, y_desc: RNNDataDescriptor, y: int, dweight_space: int,
                     weight_space_size: int, work_space: int, work_space_size: int, reserve_space: int,
                     reserve_space_size: int) -> None:
    """Weight gradients, added to (ADD) or written over (SET) ``dweight_space``; call after
    `backward_data` with the same reserve space. See `cudnnRNNBackwardWeights_v8`."""
    raw.rnn_backward_weights_v8(
        _desc(handle, "handle"), _desc(rnn_desc, "rnn_desc"), _as_enum("add_grad", add_grad, WgradMode),
        _mem(dev_seq_lengths, "dev_seq_lengths"), _desc(x_desc, "x_desc"), _mem(x, "x"),
        _desc(h_desc, "h_desc"), _mem(hx, "hx"), _desc(y_desc, "y_desc"), _mem(y, "y"),
        _size(weight_space_size, "weight_space_size"), _mem(dweight_space, "dweight_space"),
        _size(work_space_size, "work_space_size"), _mem(work_space, "work_space"),
        _size(reserve_space_size, "reserve_space_size"), _mem(reserve_space, "reserve_space"))


def build_rnn_dynamic(handle: Handle, rnn_desc: RNNDescriptor, mini_batch: int) -> None:
    """Compile the persistent kernels of a PERSIST_DYNAMIC descriptor for ``mini_batch``.
    See `cudnnBuildRNNDynamic`."""
    raw.build_rnn_dynamic(_desc(handle, "handle"), _desc(rnn_desc, "rnn_desc"),
                          _as_int("mini_batch", mini_batch, 1))
