"""A custom cell's compiled time loops (:class:`arrayrnn.Cell`): the built-in loops' scheme around the
cell's own scalar functions.

The loops (:func:`_forward_loop`, :func:`_backward_loop`) are written once here, as the built-ins are
(:mod:`.lstm_loops`, :mod:`.gru_loops`: row range, bundles, active prefix ``bs[t]``, the packed product per
step, recurrent dropout); the contract is :mod:`.loop_parts`'. Each cell gets its own compiled copy of them
(:class:`CompiledCell`): the functions rebound to the cell's globals, its gate count and whether it has
split gates as constants, and its two row adapters, generated from its counts (:func:`forward_rows_source`,
:func:`backward_rows_source`): a call of ``forward`` / ``backward`` with a fixed arity (``G + len(split)``
pre-activations and ``S`` states; ``R`` residuals) per unit, over views of one row, which LLVM vectorises
once the cell's functions (compiled with ``numba.njit``, :mod:`.cell_overloads` for ``arrayrnn.cellmath``)
are inlined. Per active row of step ``t``, roughly::

    xw[t] += h @ W_hh.T                        # split gates: rows = h @ W_hh.T apart, the parts kept apart
    for j in units:
        (h', *s'), res = forward(*pre[:, j], h[j], *s[:, j])     # y[t] = h', c = s', res_all[t] = res
    # backward, in reverse:
    (*d_pre, dh_point, *ds) = backward(res[t, j], (dy[t] + dh, *dc))
    dh = dh_point + dpre_rec[t] @ W_hh         # times h_mask under recurrent dropout

The pieces a loop calls into (the packed GEMM, :mod:`.loop_parts`' helpers) are the built-ins' and come
from numba's on-disk cache; the per-cell loops and adapters cannot (a generated function has no source
file to key a cache entry on, and a cache entry keyed on this module's loops would not see the cell), so
they compile once per process and dtype, at the first call (``engine="numba"``) or in
:func:`arrayrnn.warmup` (a few seconds; :func:`loaded` says whether they have). Compiled code is keyed on
the :class:`~arrayrnn.core.cell_registry.Cell` object, not its name: a name registered again with
``replace=True`` compiles the new definition. A cell numba cannot compile is a
:class:`~arrayrnn.core.cell_registry.CellDefinitionError` naming the cell, the function and numba's reason.
"""

from __future__ import annotations

import linecache
import re
import threading
import types as pytypes
import weakref
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from numba import types
from numba.core.errors import NumbaError

from ...core.cell_registry import Cell, CellDefinitionError
from ..numba_cache import njit
from . import cell_overloads  # noqa: F401 - registers arrayrnn.cellmath's overloads
from .loop_parts import JIT, add_masked, add_rows, copy_row, copy_rows, masked_rows, step_time, unit_groups
from .packed_gemm import gemm, new_scratch
from .simd_ir import MAX_NV, prefer_full_vectors

LOOP_JIT = dict(JIT, cache=False)
"""The per-cell loops' options: the built-ins' without the on-disk cache (module doc)."""

# -- what each cell's copy of the loops binds (placeholders here; :func:`_rebound` replaces them) --------
GATES = 1          # G, the cell's gate blocks
GROUPED = True     # the forward product on gate-grouped packed weights (G <= MAX_NV)
SPLIT = False      # the cell has split gates: the product into ``rows``, apart from ``xw``
UNIT_OUTPUTS = 1   # S + R, what ``forward`` returns per unit


def cell_forward_rows(xw, rows, inner, t, r0, n, h, c, y, res, ts, units):
    """The cell's forward over rows ``r0 .. n`` of step ``t`` (generated: :func:`forward_rows_source`)."""
    raise NotImplementedError


def cell_backward_rows(t, r0, n, res, dy, dh, dc, dpre, dpre_rec):
    """The cell's backward over rows ``r0 .. n`` of step ``t`` (generated: :func:`backward_rows_source`)."""
    raise NotImplementedError


# -- the loops, written once ------------------------------------------------------------------------
def _forward_loop(r0, r1, steps, state, cell, cache, variants, work, scratch):
    """A custom cell's forward of rows ``r0 .. r1`` (bundles: :class:`.Steps`, ``xw (T,B,G*H)`` the input
    side; :class:`.State` ``h``, ``c`` the other states; :class:`.CustomCell` packed for the forward;
    :class:`.CustomCache`; :class:`.Variants` (recurrent dropout: the product reads ``hm = h * h_mask``);
    :class:`.ForwardWork`, ``rows (B,G*H)`` the product with split gates). Idle rows: zero ``y`` and zero
    kept residuals and states."""
    prefer_full_vectors()
    xw, bs, y, reverse = steps
    h, c = state
    W_hh_p, inner = cell
    keep, c_all, res_all = cache
    masked, h_mask, zone_h, m_h, zone_c, m_c = variants
    rows, hm, c_prev = work
    T = xw.shape[0]
    units = np.empty(h.shape[1] * UNIT_OUTPUTS, xw.dtype)  # one row's outputs, unit-major
    for s in range(T):
        t = step_time(s, T, reverse)
        n = min(bs[t], r1)
        if n > r0:
            if masked:
                masked_rows(h, h_mask, hm, r0, n)
            src = hm if masked else h
            target = rows if SPLIT else xw[t]
            if GROUPED:
                unit_groups(src, r0, n, W_hh_p, GATES, 0, W_hh_p.shape[0] // GATES, target, not SPLIT,
                            scratch)
            else:
                gemm(src[r0:n], W_hh_p, 1, target[r0:n], not SPLIT, scratch)
            cell_forward_rows(xw, rows, inner, t, r0, n, h, c, y, res_all, t if keep else 0, units)
            if keep:
                for b in range(r0, n):
                    copy_row(c_all[t, b], c[b])
            copy_rows(h[r0:n], y[t, r0:n])
        y[t, max(n, r0):r1] = 0.0
        if keep:
            res_all[t, max(n, r0):r1] = 0.0
            c_all[t, max(n, r0):r1] = 0.0


def _backward_loop(r0, r1, residuals, grads, carry, cell, variants, work, scratch):
    """A custom cell's backward of rows ``r0 .. r1``, steps in reverse order of the forward (bundles:
    :class:`.CustomResiduals`; :class:`.CustomBackSteps`; :class:`.Cotangents` ``dh``, ``dc`` carried in and
    out; :class:`.CustomCell` packed for the backward; :class:`.Variants`; :class:`.BackwardWork`, ``drh
    (B,H)`` the product before its mask). Per step: ``dc_seq`` joins ``dc``, the cell's backward per unit
    (``dh`` becomes its pointwise part), then ``dh += dpre_rec[t] @ W_hh`` (times ``h_mask``)."""
    prefer_full_vectors()
    (res_all,) = residuals
    bs, reverse, dy, dpre, dpre_rec, has_seq, dc_seq = grads
    dh, dc = carry
    W_hh_p, inner = cell
    masked, h_mask, zone_h, m_h, zone_c, m_c = variants
    rows, drh, carry_h, carry_c = work
    T = dy.shape[0]
    for s in range(T):
        t = step_time(T - 1 - s, T, reverse)
        n = min(bs[t], r1)
        if n > r0:
            if has_seq:
                add_rows(dc_seq[t], dc, r0, n)
            cell_backward_rows(t, r0, n, res_all, dy, dh, dc, dpre, dpre_rec)
            if masked:
                gemm(dpre_rec[t, r0:n], W_hh_p, 1, drh[r0:n], False, scratch)
                add_masked(drh, h_mask, dh, r0, n)
            else:
                gemm(dpre_rec[t, r0:n], W_hh_p, 1, dh[r0:n], True, scratch)
        dpre[t, max(n, r0):r1] = 0.0
        if SPLIT:
            dpre_rec[t, max(n, r0):r1] = 0.0


# -- the generated row adapters -------------------------------------------------------------------
def _views(prefix: str, row: str, count: int, first: int = 0) -> list[str]:
    """``prefix{k} = row[(first+k)*H:(first+k+1)*H]`` for ``k < count``: one unit block of a row."""
    return [f"{prefix}{k} = {row}[{first + k} * H:{first + k + 1} * H]" for k in range(count)]


def _tuple(items: list[str]) -> str:
    return "(" + "".join(f"{item}, " for item in items).rstrip() + ")" if items else "()"


DIRECT_MAX_ROWS = 13
"""The most row views (inputs and outputs) a forward adapter's units' loop reads and writes directly. Past
it, LLVM gave up vectorising the loop ("too many memory checks needed": sLSTM's 18, S1 forward 130 ms ->
50 ms staged), so the loop writes every output into ``units`` (one row's, unit-major: one pointer) and
short loops copy them out; at or below it, direct stores are a little faster (the twin LSTM's 13)."""


def forward_rows_source(cell: Cell) -> str:
    """The source of ``cell_forward_rows``: per row, views of its gates (the product apart with split
    gates), states and residuals; per unit one call ``FORWARD(*pre, h, *others)`` and its stores, direct
    or staged through ``units`` (:data:`DIRECT_MAX_ROWS`)."""
    split, S, R = bool(cell.split), len(cell.states), cell.num_residuals
    setup = ["g, hb, yb, rb = xw[t, b], h[b], y[t, b], res[ts, b]"] + (["cb = c[b]"] if S > 1 else [])
    setup += _views("x", "g", len(cell.gates)) + (_views("q", "rows[b]", len(cell.gates)) if split else [])
    args = []
    for k, gate in enumerate(cell.gates):
        slot = cell.split_index(gate)
        if slot is not None:
            setup.append(f"i{k} = inner[{slot} * H:{slot + 1} * H]")
            args += [f"x{k}[j]", f"q{k}[j] + i{k}[j]"]
        else:
            args.append(f"x{k}[j] + q{k}[j]" if split else f"x{k}[j]")
    setup += _views("s", "cb", S - 1) + _views("sv", "rb", R)
    call = f"new, saved = FORWARD({', '.join(args + ['hb[j]'] + [f's{k}[j]' for k in range(S - 1)])})"
    outputs = ["yb"] + [f"s{k}" for k in range(S - 1)] + [f"sv{k}" for k in range(R)]
    signature = "cell_forward_rows(xw, rows, inner, t, r0, n, h, c, y, res, ts, units)"
    views = len(cell.gates) * (2 if split else 1) + len(cell.split) + 1 + len(outputs)  # h, and s{k} once
    if views <= DIRECT_MAX_ROWS:
        body = [call] + [f"{out}[j] = {value}[{k}]" for out, (value, k) in
                         zip(outputs, [("new", k) for k in range(S)] + [("saved", k) for k in range(R)],
                             strict=True)]
        return _function(signature, "h", setup, body)
    W = S + R
    body = [call] + [f"units[j * {W} + {k}] = new[{k}]" for k in range(S)]
    body += [f"units[j * {W} + {S + k}] = saved[{k}]" for k in range(R)]
    after = [line for k, out in enumerate(outputs)
             for line in ("for j in range(H):", f"    {out}[j] = units[j * {W} + {k}]")]
    return _function(signature, "h", setup, body, after)


def backward_rows_source(cell: Cell) -> str:
    """The source of ``cell_backward_rows``: per row, views of its residuals, cotangents and gradient rows;
    per unit one call ``BACKWARD(residuals, (dy + dh, *dc))`` and its stores (``dh`` takes the pointwise
    part of the previous ``h``'s cotangent, ``dc`` the other states')."""
    split, S, R = bool(cell.split), len(cell.states), cell.num_residuals
    setup = ["rb, dyb, dhb = res[t, b], dy[t, b], dh[b]", "d, e = dpre[t, b], dpre_rec[t, b]"]
    setup += ["dcb = dc[b]"] if S > 1 else []
    setup += _views("sv", "rb", R) + _views("s", "dcb", S - 1) + _views("d", "d", len(cell.gates))
    setup += _views("e", "e", len(cell.gates)) if split else []
    residuals = _tuple([f"sv{k}[j]" for k in range(R)])
    d_new = _tuple(["dyb[j] + dhb[j]"] + [f"s{k}[j]" for k in range(S - 1)])
    body, position = [f"grads = BACKWARD({residuals}, {d_new})"], 0
    for k, gate in enumerate(cell.gates):
        body.append(f"d{k}[j] = grads[{position}]")
        if split:
            body.append(f"e{k}[j] = grads[{position + (1 if gate in cell.split else 0)}]")
        position += 2 if gate in cell.split else 1
    body.append(f"dhb[j] = grads[{position}]")
    body += [f"s{k}[j] = grads[{position + 1 + k}]" for k in range(S - 1)]
    return _function("cell_backward_rows(t, r0, n, res, dy, dh, dc, dpre, dpre_rec)", "dh", setup, body)


def _function(signature: str, state: str, setup: list[str], body: list[str], after: list[str] = ()) -> str:
    """A row adapter: ``H`` from ``state``'s width, ``setup`` per row, ``body`` per unit ``j``, then
    ``after`` per row."""
    lines = [f"def {signature}:", "    prefer_full_vectors()", f"    H = {state}.shape[1]",
             "    for b in range(r0, n):"]
    lines += [f"        {line}" for line in setup] + ["        for j in range(H):"]
    lines += [f"            {line}" for line in body] + [f"        {line}" for line in after]
    return "\n".join(lines) + "\n"


# -- one cell's compiled code -----------------------------------------------------------------------
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def numba_reason(err: Exception, lines: int = 6) -> str:
    """The first lines of numba's message (without its terminal colours), for an error of ours."""
    text = [line.rstrip() for line in _ANSI.sub("", str(err)).splitlines() if line.strip()]
    return " | ".join(text[:lines])


class CompiledCell:
    """A cell's functions compiled by numba and its own copy of the loops (module doc); made once per
    :class:`~arrayrnn.core.cell_registry.Cell` object (:func:`compiled`)."""

    def __init__(self, cell: Cell):
        self.cell = cell
        # inlined by numba into the row adapters: left to LLVM's inliner, the tuples they return kept the
        # units' loop scalar (S1's twin LSTM forward ran 2.1x the built-in's time)
        self.forward_fn = njit(nogil=True, error_model="numpy", inline="always")(cell.forward)
        self.backward_fn = njit(nogil=True, error_model="numpy", inline="always")(cell.backward)
        bound = {"GATES": len(cell.gates), "GROUPED": self.grouped, "SPLIT": bool(cell.split),
                 "UNIT_OUTPUTS": len(cell.states) + cell.num_residuals,
                 "cell_forward_rows": self._adapter(forward_rows_source(cell), "FORWARD", self.forward_fn),
                 "cell_backward_rows": self._adapter(backward_rows_source(cell), "BACKWARD",
                                                     self.backward_fn)}
        self.forward_loop = njit(**LOOP_JIT)(_rebound(_forward_loop, bound))
        self.backward_loop = njit(**LOOP_JIT)(_rebound(_backward_loop, bound))
        self._checked: set[str] = set()
        self._prepared: set[tuple[int, str]] = set()  # (loop, dtype) compiled: prepare returns at once

    @property
    def grouped(self) -> bool:
        """Whether the forward product runs on gate-grouped packed weights (at most MAX_NV gates)."""
        return len(self.cell.gates) <= MAX_NV

    def _adapter(self, source: str, name: str, fn: Any) -> Any:
        """``source`` compiled with ``name`` bound to ``fn``; its lines kept for tracebacks."""
        filename = f"<arrayrnn cell {self.cell.name!r}: {source.split('(')[0][4:]}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        namespace: dict[str, Any] = {name: fn, "prefer_full_vectors": prefer_full_vectors}
        exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - source generated from counts
        return njit(nogil=True, error_model="numpy", inline="always")(namespace[source.split("(")[0][4:]])

    def check_functions(self, dtype: Any) -> None:
        """Compile the cell's ``forward`` and ``backward`` for ``dtype`` on their own (a
        :class:`CellDefinitionError` naming the function and numba's reason where numba refuses one)."""
        real = numba.from_dtype(np.dtype(dtype))
        if real.name in self._checked:
            return
        cell = self.cell
        S, R = len(cell.states), cell.num_residuals
        self._compile("forward", self.forward_fn, (real,) * len(cell.argument_names))
        self._compile("backward", self.backward_fn, (types.Tuple([real] * R), types.UniTuple(real, S)))
        self._checked.add(real.name)

    def _compile(self, what: str, fn: Any, signature: tuple) -> None:
        try:
            fn.compile(signature)
        except NumbaError as err:
            raise CellDefinitionError(
                f"cell {self.cell.name!r}: numba cannot compile its {what} for {signature[0]} arguments "
                f"({numba_reason(err)}); the numba engine compiles a cell's functions: use arithmetic, "
                "arrayrnn.cellmath (cm.sigmoid, cm.where, ...) and no Python objects, or run the cell on "
                "engine='reference'") from err

    def prepare(self, loop: Any, args: tuple[Any, ...], dtype: Any) -> None:
        """Compile ``loop`` (:attr:`forward_loop` or :attr:`backward_loop`) for these plain arguments now,
        on the calling thread (a :class:`CellDefinitionError` naming the cell where numba refuses)."""
        if (id(loop), np.dtype(dtype).str) in self._prepared:  # one signature per dtype: compiled already
            return
        self.check_functions(dtype)
        signature = tuple(numba.typeof(a) for a in (0, 0, *args, new_scratch(dtype)))
        if signature in loop.signatures:
            self._prepared.add((id(loop), np.dtype(dtype).str))
            return
        what = "forward" if loop is self.forward_loop else "backward"
        try:
            loop.compile(signature)
        except NumbaError as err:
            raise CellDefinitionError(
                f"cell {self.cell.name!r}: numba cannot compile the {what} time loop around the cell's "
                f"functions ({numba_reason(err)}); check that {what} returns what the Cell declares "
                f"(states {self.cell.states}, {self.cell.num_residuals} residuals)") from err
        self._prepared.add((id(loop), np.dtype(dtype).str))
        from .. import forget_choices

        forget_choices()  # engine="auto" may take the numba engine for this cell now (loaded)

    def loaded(self, dtype: Any, training: bool) -> bool:
        """Whether this process has compiled the cell's forward loop (and ``training``: its backward loop)
        for ``dtype``."""
        real = numba.from_dtype(np.dtype(dtype))
        loops = (self.forward_loop, self.backward_loop) if training else (self.forward_loop,)
        return all(any(sig[2][0].dtype == real for sig in loop.signatures) for loop in loops)


def _rebound(fn: Callable[..., Any], names: dict[str, Any]) -> Callable[..., Any]:
    """A copy of ``fn`` reading ``names`` as its globals (the module's others kept)."""
    copy = pytypes.FunctionType(fn.__code__, {**fn.__globals__, **names}, fn.__name__, fn.__defaults__,
                                fn.__closure__)
    copy.__qualname__, copy.__doc__ = fn.__qualname__, fn.__doc__
    return copy


_compiled: weakref.WeakKeyDictionary[Cell, CompiledCell] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def compiled(cell: Cell) -> CompiledCell:
    """``cell``'s :class:`CompiledCell`, made on first use (keyed on the object)."""
    with _lock:
        found = _compiled.get(cell)
        if found is None:
            found = _compiled[cell] = CompiledCell(cell)
        return found


def loaded(cell: Cell, dtype: Any, training: bool) -> bool:
    """Whether ``cell``'s loops for ``dtype`` (and ``training``, its backward's) have compiled in this
    process (``engine="auto"`` takes the numba engine for it from then on)."""
    with _lock:
        found = _compiled.get(cell)
    return found is not None and found.loaded(dtype, training)
