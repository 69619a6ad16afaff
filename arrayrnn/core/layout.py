"""The canonical weight layout: where every named block of a stack sits in the one flat buffer.

For each layer in order, for each direction (forward, then reverse), the blocks
``W_ih (G*H, I_l)``, ``W_hh (G*H, H_out)``, ``b_ih (G*H,)``, ``b_hh (G*H,)``, ``W_hr (P, H)``,
``P (3, H)`` (peephole weights, rows for the gates i, f, o; ``peepholes=True`` only),
``g_ih (G*H,)``, ``g_hh (G*H,)`` (the gains of the normalised input and recurrent products) and, for LSTM,
``g_c (H,)``, ``b_c (H,)`` (the normalised cell's gain and shift) (``layer_norm=True`` only),
each row-major and contiguous, absent ones skipped. Without peepholes and layer normalisation this is
PyTorch's parameter order, so ``torch.cat([p.flatten() for p in module.parameters()])`` equals the buffer.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from .spec import RNNSpec

BLOCK_NAMES = ("W_ih", "W_hh", "b_ih", "b_hh", "W_hr", "P", "g_ih", "g_hh", "g_c", "b_c")
LAYER_NORM_GAINS = ("g_ih", "g_hh", "g_c")  # start at ones (PackedParams.init); the shift b_c at zeros
PEEPHOLE_GATES = ("i", "f", "o")  # the rows of a "P" block
DIRECTION_NAMES = ("fwd", "rev")


@dataclass(frozen=True)
class Block:
    layer: int
    direction: int
    name: str
    offset: int
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def stop(self) -> int:
        return self.offset + self.size

    @property
    def key(self) -> str:
        """``"l0.fwd.W_ih"``: the name used by ``named_views`` and in saved files."""
        return f"l{self.layer}.{DIRECTION_NAMES[self.direction]}.{self.name}"


def block_shapes(spec: RNNSpec, layer: int) -> dict[str, tuple[int, ...]]:
    """Shapes of the blocks present in one layer-direction, in canonical order."""
    gh, h, h_out = spec.gate_size, spec.hidden_size, spec.output_size
    shapes: dict[str, tuple[int, ...]] = {"W_ih": (gh, spec.layer_input_size(layer)), "W_hh": (gh, h_out)}
    if spec.has_b_ih:
        shapes["b_ih"] = (gh,)
    if spec.has_b_hh:
        shapes["b_hh"] = (gh,)
    if spec.proj_size:
        shapes["W_hr"] = (spec.proj_size, h)
    if spec.peepholes:
        shapes["P"] = (len(PEEPHOLE_GATES), h)
    if spec.layer_norm:
        shapes["g_ih"], shapes["g_hh"] = (gh,), (gh,)
        if spec.has_cell:
            shapes["g_c"], shapes["b_c"] = (h,), (h,)
    return shapes


class Layout:
    """All offsets of one spec's canonical buffer. Use :func:`layout_of` to get the cached instance."""

    def __init__(self, spec: RNNSpec, blocks: tuple[Block, ...] | None = None):
        """The canonical layout of ``spec``; an engine's native layout passes its own ``blocks``
        (same names and shapes, other offsets; listed in buffer order)."""
        self.spec = spec
        if blocks is None:
            blocks = tuple(_canonical_blocks(spec))
        self.blocks: tuple[Block, ...] = tuple(blocks)
        self.size = max((b.stop for b in self.blocks), default=0)
        self._by_position = {(b.layer, b.direction, b.name): b for b in self.blocks}

    def block(self, layer: int, direction: int, name: str) -> Block:
        """The `Block` (offsets and shape) of ``name`` in one layer-direction; a ``ValueError`` naming
        the blocks present if it is absent.
        """
        try:
            return self._by_position[(layer, direction, name)]
        except KeyError:
            raise self._missing(layer, direction, name) from None

    def has(self, layer: int, direction: int, name: str) -> bool:
        """Whether the block ``name`` exists in that layer-direction (absent biases, projection, ... do
        not)."""
        return (layer, direction, name) in self._by_position

    def _missing(self, layer: int, direction: int, name: str) -> ValueError:
        spec = self.spec
        if not (isinstance(layer, int) and 0 <= layer < spec.num_layers):
            return ValueError(f"layer = {layer!r}; expected 0 <= layer < num_layers = {spec.num_layers}")
        if not (isinstance(direction, int) and 0 <= direction < spec.num_directions):
            return ValueError(f"direction = {direction!r}; expected 0 <= direction < {spec.num_directions} "
                              f"(bidirectional={spec.bidirectional})")
        present = tuple(block_shapes(spec, layer))
        if name in BLOCK_NAMES:
            return ValueError(f"name = {name!r} is absent for bias={spec.bias!r}, "
                              f"proj_size={spec.proj_size}, peepholes={spec.peepholes}, "
                              f"layer_norm={spec.layer_norm}; present blocks: {present}")
        return ValueError(f"name = {name!r}; expected one of {present}")

    def layer_direction_span(self, layer: int, direction: int) -> tuple[int, int]:
        """[start, stop) of one layer-direction's blocks in the buffer."""
        names = tuple(block_shapes(self.spec, layer))
        return self.block(layer, direction, names[0]).offset, self.block(layer, direction, names[-1]).stop


def _canonical_blocks(spec: RNNSpec):
    offset = 0
    for layer in range(spec.num_layers):
        for direction in range(spec.num_directions):
            for name, shape in block_shapes(spec, layer).items():
                yield Block(layer, direction, name, offset, shape)
                offset += math.prod(shape)


@functools.lru_cache(maxsize=256)
def layout_of(spec: RNNSpec) -> Layout:
    """The cached canonical `Layout` of ``spec`` (one instance per spec).

    Parameters
    ----------
    spec : RNNSpec
        The stack whose buffer layout is wanted.

    Returns
    -------
    Layout
        Offsets and shapes of every block; ``layout_of(spec).size`` is the buffer length.

    Examples
    --------
    >>> import arrayrnn as ar
    >>> ar.layout_of(ar.RNNSpec(mode="gru", input_size=3, hidden_size=2)).size
    42
    """
    return Layout(spec)
