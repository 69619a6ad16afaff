"""Test-only engines whose native weight formats are permutations of the canonical one.

Registered exactly like a built-in engine (``register_engine(name, "support.permuted_engine")``: a module that
exposes ``ENGINE``), so the tests exercise the real path: ``params.to_format(name)`` finds the engine at
call time, the frontend converts canonical params for it, and ``dparams`` come back in its format.

- ``ENGINE`` (format ``"permuted"``): the canonical blocks in reverse order, each block kept contiguous
  and row-major, so it publishes a native layout and per-block views work.
- ``REVERSED`` (format ``"reversed"``): the whole buffer reversed elementwise; no native layout, so views
  are refused with a message saying to convert.

Both run the math through the reference engine on canonical weights and record what the frontend handed
them (``calls``), so the tests can check the seam: unsorted rows, the caller's layout, host lengths, masks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from arrayrnn.core.layout import Block, Layout, layout_of
from arrayrnn.core.params import PackedParams
from arrayrnn.engines import load_engine
from arrayrnn.engines.base import Call, Engine, StackForward, StackGrads


@dataclass
class Seen:
    """What one forward received."""

    params: PackedParams
    x: Any
    lengths: Any
    h0: Any
    c0: Any
    masks: Any
    batch_first: bool
    keep_cache: bool


@dataclass
class _Cache:
    inner: Any
    params: PackedParams = field(repr=False)


class _PermutationEngine(Engine):
    """Shared body: convert native -> canonical, run the reference engine, convert the gradient back."""

    def __init__(self, name: str) -> None:
        self.name = self.native_format = name
        self.calls: list[Seen] = []
        self.checks: list[Call] = []
        self.refuse: str | None = None            # a reason to refuse every call
        self.refuse_zero_length = False
        self.prefer_not: str | None = None        # a preference reason, given only to "auto"

    # selection
    def check(self, call: Call) -> str | None:
        self.checks.append(call)
        if self.refuse is not None:
            return self.refuse
        if self.refuse_zero_length and call.has_zero_length:
            return f"the {self.name} test engine cannot run rows of length 0"
        if self.prefer_not is not None and not call.explicit:
            return self.prefer_not
        return None

    # the format: subclasses define _gather(spec) -> index array with native[i] = canonical[index[i]]
    def to_native(self, params: PackedParams) -> PackedParams:
        assert params.format == "canonical"
        index = self._gather(params.spec)
        return PackedParams._wrap(params.spec, params.data[index].copy(), self.native_format)

    def to_canonical(self, params: PackedParams) -> PackedParams:
        assert params.format == self.native_format
        index = self._gather(params.spec)
        data = np.empty_like(params.data)
        data[index] = params.data
        return PackedParams(params.spec, data)

    # the stack
    def forward(self, params, x, lengths, h0, c0, masks, *, batch_first, keep_cache):
        assert params.format == self.native_format, params.format
        self.calls.append(Seen(params, x, lengths, h0, c0, masks, batch_first, keep_cache))
        canonical = self.to_canonical(params)
        reference = load_engine("reference")
        taken = reference.take_input(x, lengths, batch_first)
        out = reference.forward(canonical, taken, lengths, h0, c0, masks, batch_first=batch_first,
                                keep_cache=keep_cache)
        cache = _Cache(out.cache, params) if keep_cache else None
        return StackForward(out.y, out.h_n, out.c_n, cache)

    def backward(self, cache, dy, dh_n, dc_n):
        g = load_engine("reference").backward(cache.inner, dy, dh_n, dc_n)
        return StackGrads(g.dx, g.dh0, g.dc0, self.to_native(g.dparams))


class BlockReversed(_PermutationEngine):
    """Canonical blocks in reverse order (each block contiguous): has a native layout."""

    def _gather(self, spec) -> np.ndarray:
        layout = self.native_layout(spec, spec.dtype)
        canonical = layout_of(spec)
        return np.concatenate([np.arange(canonical.block(b.layer, b.direction, b.name).offset,
                                         canonical.block(b.layer, b.direction, b.name).stop)
                               for b in layout.blocks])

    def native_layout(self, spec, dtype) -> Layout:
        blocks, offset = [], 0
        for b in reversed(layout_of(spec).blocks):
            blocks.append(Block(b.layer, b.direction, b.name, offset, b.shape))
            offset += b.size
        return Layout(spec, tuple(blocks))


class ElementReversed(_PermutationEngine):
    """The buffer reversed elementwise: no per-block layout."""

    def _gather(self, spec) -> np.ndarray:
        return np.arange(layout_of(spec).size)[::-1].copy()


ENGINE = BlockReversed("permuted")
REVERSED = ElementReversed("reversed")
