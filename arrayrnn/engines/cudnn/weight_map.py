"""The cudnn weight format: where each canonical weight lives in cuDNN's weight space, as index maps
(canonical element ``k`` -> cudnn element ``idx[k]``) checked against every region cuDNN reports, the whole
stack's and, layer by layer, each layer's. Pure array functions (no GPU), so CI tests every line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import cudnn_bindings as cb

from ...core.layout import layout_of
from ...core.spec import RNNSpec
from .config import refusal

Array = Any
WEIGHT_ALIGN_BYTES = 256  # where each layer's weight space starts inside one buffer (dropout: layer by layer)


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
