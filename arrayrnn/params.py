"""`PackedParams`: every weight of a recurrent stack in one contiguous 1-D buffer, with named views."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np

from .backend import as_array, device_of, get_xp, module_for, to_host
from .layout import Block, Layout, layout_of
from .spec import RNNSpec

FORMATS = ("canonical", "cudnn")


class PackedParams:
    """One flat buffer (``data``) plus the spec that says what every slice of it means.

    ``view(layer, direction, name)`` returns an array aliasing ``data``: writing the view writes the
    buffer. Gradients come back as a ``PackedParams`` of the same spec, format and layout, so an
    optimizer step, a norm or a save is one call on ``data``.

    ``PackedParams(spec, buffer)`` wraps an existing 1-D buffer (NumPy, CuPy, or any DLPack array)
    without copying; its size and dtype are checked against the spec.
    """

    __slots__ = ("spec", "data", "format", "_backend_state")

    def __init__(self, spec: RNNSpec, buffer: Any, format: str = "canonical"):
        if not isinstance(spec, RNNSpec):
            raise TypeError(f"spec has type {type(spec).__name__}; expected an arrayrnn.RNNSpec")
        if format != "canonical":
            # A backend format's size and offsets come from the backend, which wraps its own buffers.
            raise ValueError(f"format = {format!r}; PackedParams(spec, buffer) wraps canonical buffers only; "
                             "use params.to_format(...) to get another format")
        data = as_array(buffer, "buffer")
        _check_buffer(spec, data, layout_of(spec).size)
        self.spec = spec
        self.data = data
        self.format = format
        self._backend_state = None

    @classmethod
    def _wrap(cls, spec: RNNSpec, data: Any, format: str, backend_state: Any = None) -> PackedParams:
        """Internal: wrap a buffer in any format without the canonical size check."""
        self = object.__new__(cls)
        self.spec, self.data, self.format, self._backend_state = spec, data, format, backend_state
        return self

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def init(cls, spec: RNNSpec, seed: int | None = 0, xp: ModuleType = np) -> PackedParams:
        """Uniform(-1/sqrt(hidden_size), 1/sqrt(hidden_size)) for every parameter, like PyTorch.

        Drawn on the host with ``numpy.random.default_rng(seed)`` so a seed gives the same numbers on
        every device.
        """
        bound = 1.0 / math.sqrt(spec.hidden_size)
        from .dropout import check_seed  # the one seed rule; local import keeps the seam's edits apart

        host = np.random.default_rng(check_seed(seed)).uniform(-bound, bound, layout_of(spec).size)
        xp = module_for(xp)
        return cls(spec, xp.asarray(host.astype(spec.dtype)))

    @classmethod
    def zeros(cls, spec: RNNSpec, xp: ModuleType = np) -> PackedParams:
        xp = module_for(xp)
        return cls(spec, xp.zeros(layout_of(spec).size, dtype=spec.dtype))

    def zeros_like(self) -> PackedParams:
        xp = get_xp(self.data)
        return PackedParams._wrap(self.spec, xp.zeros_like(self.data), self.format, self._backend_state)

    def copy(self) -> PackedParams:
        return PackedParams._wrap(self.spec, self.data.copy(), self.format, self._backend_state)

    def astype(self, dtype: Any) -> PackedParams:
        """Same values (rounded), same format, new dtype; a new buffer."""
        spec = self.spec.replace(dtype=dtype)
        if self.format != "canonical":
            return self.to_format("canonical").astype(dtype).to_format(self.format)
        return PackedParams(spec, self.data.astype(spec.dtype))

    def to(self, target: Any) -> PackedParams:
        """A canonical copy on another device: ``numpy``, ``cupy``, ``"cpu"``, ``"cuda"``, ``"cuda:N"``."""
        canonical = self.to_format("canonical")
        xp = module_for(target)
        if xp is np:
            return PackedParams(self.spec, np.array(to_host(canonical.data), copy=True))
        device_id = int(target.split(":")[1]) if isinstance(target, str) and ":" in target else None
        with xp.cuda.Device(device_id) if device_id is not None else contextlib.nullcontext():
            return PackedParams(self.spec, xp.array(canonical.data, copy=True))

    def to_format(self, format: str) -> PackedParams:
        """The same weights in another format (``"canonical"`` or a backend's, such as ``"cudnn"``)."""
        if format not in FORMATS:
            raise ValueError(f"format = {format!r}; expected one of {FORMATS}")
        if format == self.format:
            return self
        from . import formats  # a backend format needs its engine; resolved lazily

        return formats.convert(self, format)

    # -- views ----------------------------------------------------------------------------------
    @property
    def layout(self) -> Layout:
        return layout_of(self.spec)

    @property
    def device(self) -> str:
        return device_of(self.data)

    @property
    def dtype(self) -> Any:
        return self.data.dtype

    @property
    def size(self) -> int:
        return int(self.data.size)

    def _require_canonical(self, what: str) -> None:
        if self.format != "canonical":
            raise ValueError(f"{what} needs the canonical layout but params.format = {self.format!r}; "
                             "call params.to_format('canonical') first")

    def block_view(self, block: Block) -> Any:
        return self.data[block.offset:block.stop].reshape(block.shape)

    def view(self, layer: int, direction: int, name: str) -> Any:
        """The block ``name`` of one layer-direction (0 = forward, 1 = reverse), aliasing ``data``."""
        self._require_canonical("view()")
        return self.block_view(self.layout.block(layer, direction, name))

    def named_views(self) -> dict[str, Any]:
        """``{"l0.fwd.W_ih": view, ...}`` in buffer order; absent biases are absent."""
        self._require_canonical("named_views()")
        return {b.key: self.block_view(b) for b in self.layout.blocks}

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return iter(self.named_views().items())

    def __repr__(self) -> str:
        return (f"PackedParams(spec={self.spec!r}, format={self.format!r}, size={self.size}, "
                f"dtype={self.data.dtype}, device={self.device!r})")


def _check_buffer(spec: RNNSpec, data: Any, size: int) -> None:
    if data.ndim != 1:
        raise ValueError(f"buffer has shape {tuple(data.shape)}; expected a 1-D buffer of {size} elements")
    if data.shape[0] != size:
        raise ValueError(f"buffer has {data.shape[0]} elements; expected {size} for {spec}")
    if str(data.dtype) != spec.dtype:
        raise TypeError(f"buffer has dtype {data.dtype}; expected spec.dtype = {spec.dtype} "
                        "(convert with buffer.astype(...) or build the spec with that dtype)")
    contiguous = data.flags.c_contiguous
    if not contiguous:
        raise ValueError(f"buffer has strides {data.strides}; expected a contiguous 1-D buffer "
                         "(pass buffer.copy() or xp.ascontiguousarray(buffer))")
