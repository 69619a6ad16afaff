"""`PackedParams`: every weight of a recurrent stack in one contiguous 1-D buffer, with named views."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any, Protocol

import numpy as np

from .backend import as_array, device_of, get_xp, module_for, on_device, to_host
from .layout import LAYER_NORM_GAINS, Block, Layout, layout_of
from .spec import RNNSpec, check_seed


class FormatOwner(Protocol):
    """The engine that owns a weight format (what ``to_format`` and ``layout`` ask of it)."""

    native_format: str

    def to_native(self, params: PackedParams) -> PackedParams: ...

    def to_canonical(self, params: PackedParams) -> PackedParams: ...

    def native_layout(self, spec: RNNSpec, dtype: Any) -> Layout | None: ...


_format_lookup: Callable[[str], FormatOwner] | None = None


def set_format_lookup(lookup: Callable[[str], FormatOwner]) -> None:
    """Install the name -> owning engine lookup (``arrayrnn.engines`` does, when it is imported), so this
    module reaches a format's engine without importing the engines."""
    global _format_lookup
    _format_lookup = lookup


def _format_owner(format: str) -> FormatOwner:
    if _format_lookup is None:  # only if arrayrnn.core.params is used without the arrayrnn package
        raise RuntimeError("no weight format other than 'canonical' is known: import arrayrnn first")
    return _format_lookup(format)


class PackedParams:
    """One flat buffer (``data``) plus the spec that says what every slice of it means.

    ``view(layer, direction, name)`` returns an array aliasing ``data``: writing the view writes the
    buffer. Gradients come back as a ``PackedParams`` of the same spec, format and layout, so an
    optimizer step, a norm or a save is one call on ``data``.

    ``PackedParams(spec, buffer)`` wraps an existing 1-D buffer (NumPy, CuPy, or any DLPack array)
    without copying; its size and dtype are checked against the spec. `PackedParams.init` draws new weights.

    Parameters
    ----------
    spec : RNNSpec
        The stack the buffer holds.
    buffer : array
        1-D, ``layout_of(spec).size`` elements of ``spec.dtype``.
    format : str, optional
        ``"canonical"`` (PyTorch's order, what is saved); an engine's format (``"cudnn"``) comes from
        `to_format`, not from wrapping.

    Raises
    ------
    ValueError
        A buffer that is not 1-D or has the wrong size, or a format other than canonical.
    TypeError
        A buffer of another dtype than ``spec.dtype``, or not an array.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayrnn as ar
    >>> spec = ar.RNNSpec(mode="gru", input_size=3, hidden_size=2)
    >>> params = ar.PackedParams(spec, np.zeros(ar.layout_of(spec).size, dtype=np.float32))
    >>> params.view(0, 0, "W_ih").shape
    (6, 3)
    >>> params.view(0, 0, "b_hh")[:] = 1.0  # writes the buffer
    >>> float(params.data.sum())
    6.0
    >>> sorted(params.named_views())[:2]
    ['l0.fwd.W_hh', 'l0.fwd.W_ih']
    """

    __slots__ = ("spec", "data", "format")

    def __init__(self, spec: RNNSpec, buffer: Any, format: str = "canonical"):
        if not isinstance(spec, RNNSpec):
            raise TypeError(f"spec has type {type(spec).__name__}; expected an arrayrnn.RNNSpec")
        if format != "canonical":
            # an engine's own format: its size and offsets come from that engine, which wraps its buffers
            raise ValueError(f"format = {format!r}; PackedParams(spec, buffer) wraps canonical buffers only; "
                             "use params.to_format(...) to get another format")
        data = as_array(buffer, "buffer")
        _check_canonical_buffer(spec, data, layout_of(spec).size)
        self.spec = spec
        self.data = data
        self.format = format

    @classmethod
    def _wrap(cls, spec: RNNSpec, data: Any, format: str) -> PackedParams:
        """For engines: wrap a buffer of any format (its engine checked it), without the canonical check."""
        self = object.__new__(cls)
        self.spec, self.data, self.format = spec, data, format
        return self

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def init(cls, spec: RNNSpec, seed: int | None = 0, xp: ModuleType = np) -> PackedParams:
        """New weights for ``spec``: uniform(-1/sqrt(hidden_size), 1/sqrt(hidden_size)) for every parameter,
        like PyTorch.

        Layer normalisation's gains (``g_ih``, ``g_hh``, ``g_c``) are ones and the cell's shift ``b_c`` zeros.
        Drawn on the host with ``numpy.random.default_rng(seed)`` so a seed gives the same numbers on every
        device.

        Parameters
        ----------
        spec : RNNSpec
            The stack to initialise.
        seed : int or None, optional
            The generator's seed (None: fresh entropy).
        xp : module, optional
            ``numpy`` (default) or ``cupy``: where the buffer lives.

        Returns
        -------
        PackedParams
            A canonical buffer of ``layout_of(spec).size`` elements of ``spec.dtype``.

        Examples
        --------
        >>> import numpy as np
        >>> import arrayrnn as ar
        >>> params = ar.PackedParams.init(ar.RNNSpec(mode="lstm", input_size=3, hidden_size=4), seed=0)
        >>> params.data.shape, params.format, bool(np.abs(params.data).max() <= 0.5)
        ((144,), 'canonical', True)
        """
        bound = 1.0 / math.sqrt(spec.hidden_size)
        host = np.random.default_rng(check_seed(seed)).uniform(-bound, bound, layout_of(spec).size)
        for block in layout_of(spec).blocks if spec.layer_norm else ():
            if block.name in LAYER_NORM_GAINS or block.name == "b_c":  # gains start at ones, the shift at 0
                host[block.offset:block.stop] = 1.0 if block.name in LAYER_NORM_GAINS else 0.0
        xp = module_for(xp)
        return cls(spec, xp.asarray(host.astype(spec.dtype)))

    @classmethod
    def zeros(cls, spec: RNNSpec, xp: ModuleType = np) -> PackedParams:
        """Parameters of ``spec`` filled with zeros, in the canonical format, on ``xp``'s device.

        Parameters
        ----------
        spec : RNNSpec
            The stack the buffer is for.
        xp : module, optional
            ``numpy`` (default) or ``cupy``.

        Returns
        -------
        PackedParams
            A new buffer of ``layout_of(spec).size`` zeros of ``spec.dtype``.
        """
        xp = module_for(xp)
        return cls(spec, xp.zeros(layout_of(spec).size, dtype=spec.dtype))

    def zeros_like(self) -> PackedParams:
        """A zero buffer with the same spec, format, dtype and device (e.g. an accumulator of gradients)."""
        xp = get_xp(self.data)
        return PackedParams._wrap(self.spec, xp.zeros_like(self.data), self.format)

    def copy(self) -> PackedParams:
        """A copy of the buffer (same spec, format, dtype and device); views are rebuilt on the copy."""
        return PackedParams._wrap(self.spec, self.data.copy(), self.format)

    def astype(self, dtype: Any) -> PackedParams:
        """Same values (rounded), same format, new dtype; a new buffer.

        Parameters
        ----------
        dtype : str or dtype
            ``"float32"``, ``"float64"`` or (GPU) ``"float16"``.

        Returns
        -------
        PackedParams
            A copy whose spec has ``dtype``.

        Examples
        --------
        >>> import arrayrnn as ar
        >>> params = ar.PackedParams.init(ar.RNNSpec(mode="gru", input_size=3, hidden_size=2), seed=0)
        >>> params.astype("float64").data.dtype
        dtype('float64')
        """
        spec = self.spec.replace(dtype=dtype)
        if self.format != "canonical":
            return self.to_format("canonical").astype(dtype).to_format(self.format)
        return PackedParams(spec, self.data.astype(spec.dtype))

    def to(self, target: Any) -> PackedParams:
        """A canonical copy on another device.

        Parameters
        ----------
        target : module or str
            ``numpy``, ``cupy``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.

        Returns
        -------
        PackedParams
            A new buffer there (canonical format), views rebuilt on it.

        Raises
        ------
        TypeError
            ``cupy`` / ``"cuda"`` asked for where CuPy is not installed.

        Examples
        --------
        >>> import arrayrnn as ar
        >>> params = ar.PackedParams.init(ar.RNNSpec(mode="gru", input_size=3, hidden_size=2), seed=0)
        >>> params.to("cpu").device
        'cpu'
        """
        canonical = self.to_format("canonical")
        xp = module_for(target)
        if xp is np:
            return PackedParams(self.spec, np.array(to_host(canonical.data), copy=True))
        index = int(target.split(":")[1]) if isinstance(target, str) and ":" in target else None
        with on_device(xp, index):
            return PackedParams(self.spec, xp.array(canonical.data, copy=True))

    def to_format(self, format: str) -> PackedParams:
        """The same weights in another format: ``"canonical"`` or an engine's own (such as ``"cudnn"``).

        A format other than canonical is named after the engine that owns it; that engine is looked up by
        name (and imported) now, and converts: ``engine.to_native(canonical)`` /
        ``engine.to_canonical(native)``. Convert once, before a training loop: gradients come back in the
        params' format, and optimizers work on any format.

        Parameters
        ----------
        format : str
            ``"canonical"`` or an engine's format name.

        Returns
        -------
        PackedParams
            ``self`` when already in ``format``, else a new buffer.

        Raises
        ------
        TypeError
            ``format`` is not a str.
        ValueError
            An unknown format, or a spec the format's engine cannot hold.
        EngineUnavailableError
            The owning engine cannot run here (e.g. ``"cudnn"`` without cuDNN).

        Examples
        --------
        >>> import arrayrnn as ar
        >>> params = ar.PackedParams.init(ar.RNNSpec(mode="gru", input_size=3, hidden_size=2), seed=0)
        >>> params.to_format("canonical") is params
        True
        """
        if not isinstance(format, str):
            raise TypeError(f"format has type {type(format).__name__}; expected a str such as 'canonical'")
        if format == self.format:
            return self
        canonical = self if self.format == "canonical" else _format_owner(self.format).to_canonical(self)
        return canonical if format == "canonical" else _format_owner(format).to_native(canonical)

    # -- views ----------------------------------------------------------------------------------
    @property
    def layout(self) -> Layout:
        """Offsets and shapes of every block of ``data`` (a `Layout`).

        The canonical layout, or the native layout of the engine owning ``format`` (``ValueError`` saying to
        convert when that format has none).
        """
        if self.format == "canonical":
            return layout_of(self.spec)
        native = _format_owner(self.format).native_layout(self.spec, self.data.dtype)
        if native is None:
            raise ValueError(f"params.format = {self.format!r} has no per-block layout (its blocks are not "
                             "contiguous row-major regions); convert first: params.to_format('canonical')")
        return native

    @property
    def device(self) -> str:
        """Where the buffer lives, ``"cpu"`` for NumPy or ``"cuda:N"`` for CuPy."""
        return device_of(self.data)

    @property
    def dtype(self) -> Any:
        """The dtype of the buffer (``float32``, ``float64`` or, on GPU, ``float16``)."""
        return self.data.dtype

    @property
    def size(self) -> int:
        """The number of elements of the flat buffer."""
        return int(self.data.size)

    def block_view(self, block: Block) -> Any:
        """The region of ``data`` that ``block`` (a block of ``self.layout``) describes, aliasing ``data``.

        A block of another layout (e.g. a canonical block on a non-canonical buffer) is a ``ValueError``.
        """
        layout = self.layout
        if not layout.has(block.layer, block.direction, block.name) or \
                layout.block(block.layer, block.direction, block.name) != block:
            raise ValueError(f"block = {block!r} is not a block of this buffer's layout (params.format = "
                             f"{self.format!r}); take blocks from params.layout")
        return self.data[block.offset:block.stop].reshape(block.shape)

    def view(self, layer: int, direction: int, name: str) -> Any:
        """The block ``name`` of one layer-direction (0 = forward, 1 = reverse), aliasing ``data``."""
        layout = self.layout
        block = layout.block(layer, direction, name)
        return self.data[block.offset:block.stop].reshape(block.shape)

    def named_views(self) -> dict[str, Any]:
        """``{"l0.fwd.W_ih": view, ...}`` in buffer order; absent biases are absent."""
        return {b.key: self.data[b.offset:b.stop].reshape(b.shape) for b in self.layout.blocks}

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return iter(self.named_views().items())

    def __repr__(self) -> str:
        return (f"PackedParams(spec={self.spec!r}, format={self.format!r}, size={self.size}, "
                f"dtype={self.data.dtype}, device={self.device!r})")


def _check_canonical_buffer(spec: RNNSpec, data: Any, size: int) -> None:
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
