"""Custom cells: a cell defined by its pointwise math, registered under a name for ``RNNSpec(mode=...)``.

A cell is what happens to one unit ``j`` of one row in one step once the products are done. Its weights are
the built-ins' (``W_ih (G*H, I)``, ``W_hh (G*H, H)``, ``b_ih``, ``b_hh``: G gate blocks of H rows); the
engines compute every pre-activation ``W_ih x + b_ih + W_hh h + b_hh`` with their GEMMs (the input product
hoisted out of the time loop), then call the cell's scalar functions, in the style of ``jax.custom_vjp``::

    (new_states, residuals) = forward(*pre, *states)      # pre: one value per gate (two per split gate)
    (*d_pre, *d_states)     = backward(residuals, d_new_states)

Semantics of one step, roughly equal to this Python loop (``@`` as in ``x @ W.T``)::

    xw, hw = x @ W_ih.T + b_ih, h @ W_hh.T + b_hh              # (B, G*H) each
    for b, j in rows x units:
        pre = [xw[b, k*H+j] + hw[b, k*H+j] for gate k]          # a split gate: xw and hw apart, in that order
        new, res = forward(*pre, h[b, j], *(s[b, j] for s in other states))
        h[b, j], (s[b, j] for s in other states) = new

The first state is ``h``, the output: it feeds the next layer and the recurrent product. The others are
carried inside the cell (an LSTM's ``c``); the API carries them as one array ``c`` of ``(S-1)*H`` columns,
state ``k`` (``k >= 1``) in columns ``(k-1)*H .. k*H``: ``c0``, ``res.c_n``, ``res.c_all``, ``dc_n``.
``backward`` returns one cotangent per argument of ``forward``, in order; for the previous ``h`` it is only
the pointwise part (the recurrent product's is added by the engine).

The functions are plain Python on floats: numba compiles them for the CPU loops and for the CUDA kernels,
the reference engine runs them on whole arrays. They may use arithmetic, comparisons inside
:mod:`arrayrnn.cellmath`'s ``where``, and ``arrayrnn.cellmath`` (``sigmoid``, ``tanh``, ``exp``, ...); no
``if`` on values, no Python ``math``. This module keeps the registry (the spec asks it whether a mode
names a cell); the engines compile what it holds.
"""

from __future__ import annotations

import keyword
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

BUILTIN_MODES = ("rnn_tanh", "rnn_relu", "lstm", "gru")
_PROBE = 0.25  # a probe input (never 0: a forward dividing by a state would look broken on zeros)


class CellDefinitionError(ValueError):
    """A cell whose definition is wrong (a ``ValueError`` naming the cell, what was wrong and the fix)."""


@dataclass(frozen=True, eq=False)
class Cell:
    """A recurrent cell given by its pointwise math; register it with :func:`register_cell`.

    Parameters
    ----------
    name : str
        The mode name (``RNNSpec(mode=name)``): a lowercase identifier, not a built-in mode.
    gates : tuple of str
        The gate blocks, in weight order (``W_ih`` has ``len(gates) * H`` rows).
    forward : callable
        ``forward(*pre, *states) -> (new_states, residuals)``, both tuples; ``pre`` holds one
        pre-activation per gate, two for a gate in ``split`` (the input part, then the recurrent part).
    backward : callable
        ``backward(residuals, d_new_states) -> (*d_pre, *d_states)``: one cotangent per argument of
        ``forward``, in its order.
    states : tuple of str
        The carried states, ``h`` (the output) first; default ``("h",)``.
    split : tuple of str
        Gates whose recurrent part ``W_hh h + b_hh`` reaches ``forward`` apart from the input part (the
        reset-after GRU's ``n``: ``tanh(x_n + r * (W_hn h + b_hn))``).

    Examples
    --------
    >>> import arrayrnn as ar
    >>> from arrayrnn import cellmath as cm
    >>> def forward(pre, h):
    ...     y = cm.tanh(pre)
    ...     return (y,), (y,)
    >>> def backward(res, d_new):
    ...     (y,), (dh,) = res, d_new
    ...     return dh * cm.dtanh(y), 0.0
    >>> cell = ar.Cell("my_tanh", gates=("a",), forward=forward, backward=backward)
    >>> cell.num_residuals
    1
    """

    name: str
    gates: tuple[str, ...]
    forward: Callable[..., Any] = field(repr=False)
    backward: Callable[..., Any] = field(repr=False)
    states: tuple[str, ...] = ("h",)
    split: tuple[str, ...] = ()
    num_residuals: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if not (isinstance(self.name, str) and self.name.isidentifier() and self.name == self.name.lower()
                and not keyword.iskeyword(self.name)):
            raise CellDefinitionError(f"Cell name = {self.name!r}; expected a lowercase identifier "
                                      "(it becomes RNNSpec(mode=name))")
        if self.name in BUILTIN_MODES:
            raise CellDefinitionError(f"cell {self.name!r}: that is a built-in mode; choose another name")
        for what in ("gates", "states", "split"):
            names = self._names(what, getattr(self, what), allow_empty=what == "split")
            object.__setattr__(self, what, names)
        if self.states[0] != "h":
            raise CellDefinitionError(f"cell {self.name!r}: states = {self.states}; the first state must be "
                                      "'h' (the output, which the recurrent product reads)")
        unknown = [g for g in self.split if g not in self.gates]
        if unknown:
            raise CellDefinitionError(f"cell {self.name!r}: split = {self.split} names {unknown}, not gates; "
                                      f"expected a subset of gates = {self.gates}")
        object.__setattr__(self, "split", tuple(g for g in self.gates if g in self.split))  # weight order
        for what in ("forward", "backward"):
            if not callable(getattr(self, what)):
                raise CellDefinitionError(f"cell {self.name!r}: {what} = {getattr(self, what)!r}; expected a "
                                          "function")
        object.__setattr__(self, "num_residuals", self._probe())

    def _names(self, what: str, value: Any, allow_empty: bool) -> tuple[str, ...]:
        names = (value,) if isinstance(value, str) else value
        ok = isinstance(names, (tuple, list)) and all(isinstance(n, str) and n.isidentifier() for n in names)
        if not ok or (not names and not allow_empty) or len(set(names)) != len(names):
            raise CellDefinitionError(f"cell {self.name!r}: {what} = {value!r}; expected a tuple of distinct "
                                      f"names{'' if allow_empty else ' (at least one)'}")
        return tuple(names)

    # -- derived facts ----------------------------------------------------------------------------
    @property
    def input_names(self) -> tuple[str, ...]:
        """The names of ``forward``'s pre-activation arguments: a gate, or ``g_x, g_h`` for a split gate."""
        names: list[str] = []
        for g in self.gates:
            names += [f"{g}_x", f"{g}_h"] if g in self.split else [g]
        return tuple(names)

    @property
    def num_inputs(self) -> int:
        """How many pre-activation arguments ``forward`` takes (gates, split ones counted twice)."""
        return len(self.gates) + len(self.split)

    @property
    def argument_names(self) -> tuple[str, ...]:
        """Every argument of ``forward``, in order: the pre-activations, then the states."""
        return self.input_names + self.states

    def split_index(self, gate: str) -> int | None:
        """The position of ``gate`` among the split gates (its slot in the kernels' recurrent part)."""
        return self.split.index(gate) if gate in self.split else None

    # -- the probe: run both functions once on floats ---------------------------------------------
    def _probe(self) -> int:
        count = len(self.argument_names)
        args = [np.float64(_PROBE * (k + 1) / count) for k in range(count)]
        out = self._run("forward", self.forward, *args)
        if not (isinstance(out, tuple) and len(out) == 2 and all(isinstance(o, tuple) for o in out)):
            raise CellDefinitionError(f"cell {self.name!r}: forward returned {_kind(out)}; expected a pair "
                                      f"of tuples (new_states, residuals), new_states one value per state "
                                      f"{self.states}")
        new_states, residuals = out
        if len(new_states) != len(self.states):
            raise CellDefinitionError(f"cell {self.name!r}: forward returned {len(new_states)} new states; "
                                      f"expected {len(self.states)}, one per state {self.states}")
        grads = self._run("backward", self.backward, residuals, tuple(np.float64(1.0) for _ in self.states))
        expected = len(self.argument_names)
        if not isinstance(grads, tuple) or len(grads) != expected:
            got = f"{len(grads)} values" if isinstance(grads, tuple) else _kind(grads)
            raise CellDefinitionError(f"cell {self.name!r}: backward returned {got}; expected a tuple of "
                                      f"{expected} cotangents, one per forward argument "
                                      f"{self.argument_names}")
        return len(residuals)

    def _run(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as e:
            raise CellDefinitionError(f"cell {self.name!r}: {what} failed on float inputs with "
                                      f"{type(e).__name__}: {e}; a cell's functions take and return floats "
                                      "(use arrayrnn.cellmath for sigmoid, tanh, exp, ...)") from e


def _kind(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"[:120]


_CELLS: dict[str, Cell] = {}


def register_cell(cell: Cell, *, replace: bool = False) -> Cell:
    """Make ``cell`` usable as ``RNNSpec(mode=cell.name)``; returns it (so a module can write
    ``CELL = register_cell(Cell(...))``). Registering the same object twice is a no-op; another cell under
    a registered name is a ``ValueError`` unless ``replace=True`` (engines compile per cell object, so the
    new definition is what later calls run)."""
    if not isinstance(cell, Cell):
        raise TypeError(f"cell has type {type(cell).__name__}; expected an arrayrnn.Cell")
    known = _CELLS.get(cell.name)
    if known is not None and known is not cell and not replace:
        raise ValueError(f"a cell named {cell.name!r} is already registered; pass replace=True to replace it "
                         "or choose another name")
    _CELLS[cell.name] = cell
    return cell


def unregister_cell(name: str) -> None:
    """Forget the cell registered as ``name`` (a ``ValueError`` if there is none)."""
    if name not in _CELLS:
        raise ValueError(f"no cell named {name!r} is registered; registered: {registered_cells()}")
    del _CELLS[name]


def registered_cells() -> tuple[str, ...]:
    """The names of the registered cells, in registration order."""
    return tuple(_CELLS)


def cell_of(mode: str) -> Cell | None:
    """The registered cell named ``mode``, or ``None`` (a built-in mode or an unknown name)."""
    return _CELLS.get(mode)
