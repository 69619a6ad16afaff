"""The per-step kernels of a custom cell (:mod:`arrayrnn.core.cell_registry`), generated per cell.

A custom cell's arity (G gates, ``len(split)`` of them split, S states, R residuals) is known only when it is
registered, so its two kernels are generated then (once per :class:`~arrayrnn.core.cell_registry.Cell`
object, which is what they are keyed on: a cell registered again under its name gets kernels of its own). The
cell's ``forward`` and ``backward`` become inlined device functions, their ``cellmath`` calls the CUDA forms
of :mod:`.cell_math`. One thread per ``(row b, unit j)`` of the active rows; semantics of the forward step,
roughly (``hh = h @ W_hh.T``, the step's recurrent product, launched before it)::

    for b < n, j < H:   # in parallel
        pre = [xw[t,b,k*H+j] + hh[b,k*H+j] for gate k]     # split gate k: xw[t,b,k*H+j] and
                                                           #   hh[b,k*H+j] + inner[slot*H+j], apart
        new, res = forward(*pre, h[b,j], *(c[b,s*H+j] for the states s past h))
        y[t,b,j] = h[b,j] = new[0];  c[b,s*H+j] = new[1+s]
        if keep: res_all[t,b,r*H+j] = res[r];  c_all[t,b,s*H+j] = new[1+s]

and of the backward step (the GEMM ``dh_gemm = dpre_rec[t] @ W_hh`` follows it)::

    for b < n, j < H:
        d = backward(res_all[t,b,:,j], (dy[t,b,j] + dh_gemm[b,j] + dh_carry[b,j],
                                        *(dc[b,s*H+j] (+ dc_seq[t,b,s*H+j]) for s)))
        dpre_in[t,b,k*H+j] = d[gate k's input part];  dpre_rec[t,b,k*H+j] = d[its recurrent part]
        dh_carry[b,j] = d[the h argument];  dc[b,s*H+j] = d[state s]

Inactive rows (``b >= n``) are never written: their entries keep the zeros their buffers were made with.
A cell numba-cuda cannot compile raises :class:`CellCompileError` naming the cell and the function.
"""

from __future__ import annotations

import contextlib
import linecache
import threading
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from numba import cuda
from numba.core.errors import NumbaError

from ...core.cell_registry import Cell, CellDefinitionError
from . import kernels as ck

SIMULATED = ck.SIMULATED


class CellCompileError(CellDefinitionError):
    """numba-cuda could not compile a custom cell's function for the GPU (the message names the cell, the
    function and numba's reason)."""


@dataclass(frozen=True)
class CellKernels:
    """A cell's two generated step kernels and their sources."""

    forward: Any
    backward: Any
    forward_source: str
    backward_source: str


# -- source generation ------------------------------------------------------------------------------------
def _tuple(items: Sequence[str]) -> str:
    return "(" + "".join(f"{item}, " for item in items) + ")"


def _column(k: int) -> str:
    return f"{k} * H + j"


def _indented(lines: Sequence[str]) -> str:
    return "".join(f"    {line}\n" for line in lines)


def forward_parameters(cell: Cell) -> tuple[str, ...]:
    """The forward kernel's parameters (``inner``: with split gates; ``c``, ``c_all``: with states past h)."""
    split, states = ("inner",) if cell.split else (), len(cell.states) > 1
    return ("t", "n", "xw", "hh", *split, "h", *(("c",) if states else ()), "y", "keep", "res_all",
            *(("c_all",) if states else ()))


def backward_parameters(cell: Cell) -> tuple[str, ...]:
    """The backward kernel's parameters (``dc``, ``has_seq``, ``dc_seq``: with states past h; ``dpre_rec``:
    with split gates)."""
    states = ("dc", "has_seq", "dc_seq") if len(cell.states) > 1 else ()
    return ("t", "n", "res_all", "dy", "dh_gemm", "dh_carry", *states, "dpre_in",
            *(("dpre_rec",) if cell.split else ()))


def _forward_arguments(cell: Cell) -> list[str]:
    args = []
    for k, gate in enumerate(cell.gates):
        slot = cell.split_index(gate)
        if slot is None:
            args.append(f"xw[t, b, {_column(k)}] + hh[b, {_column(k)}]")
        else:
            args += [f"xw[t, b, {_column(k)}]", f"hh[b, {_column(k)}] + inner[{_column(slot)}]"]
    return args + ["h[b, j]"] + [f"c[b, {_column(s)}]" for s in range(len(cell.states) - 1)]


def forward_source(cell: Cell) -> str:
    """The Python source of ``cell``'s forward step kernel (see the module docstring)."""
    others = range(len(cell.states) - 1)
    kept = ([f"res_all[t, b, {_column(r)}] = res[{r}]" for r in range(cell.num_residuals)]
            + [f"c_all[t, b, {_column(s)}] = new[{s + 1}]" for s in others])
    body = ["H = h.shape[1]", "b, j = element(n, H)", "if b < 0:", "    return",
            f"new, res = cell_forward({', '.join(_forward_arguments(cell))})",
            "out = new[0]", "y[t, b, j] = out", "h[b, j] = out",
            *[f"c[b, {_column(s)}] = new[{s + 1}]" for s in others],
            "if keep:", *[f"    {line}" for line in kept or ["pass"]]]
    return f"def custom_forward_step({', '.join(forward_parameters(cell))}):\n{_indented(body)}"


def _store_gradients(cell: Cell) -> list[str]:
    lines, position = [], 0
    for k, gate in enumerate(cell.gates):
        rec = position + 1 if gate in cell.split else position
        lines.append(f"dpre_in[t, b, {_column(k)}] = d[{position}]")
        if cell.split:
            lines.append(f"dpre_rec[t, b, {_column(k)}] = d[{rec}]")
        position = rec + 1
    lines.append(f"dh_carry[b, j] = d[{position}]")
    return lines + [f"dc[b, {_column(s)}] = d[{position + 1 + s}]" for s in range(len(cell.states) - 1)]


def backward_source(cell: Cell) -> str:
    """The Python source of ``cell``'s backward step kernel (see the module docstring)."""
    d_states = ["dy[t, b, j] + dh_gemm[b, j] + dh_carry[b, j]"]
    carries = []
    for s in range(len(cell.states) - 1):
        carries += [f"dc{s} = dc[b, {_column(s)}]", "if has_seq:", f"    dc{s} += dc_seq[t, b, {_column(s)}]"]
        d_states.append(f"dc{s}")
    residuals = [f"res_all[t, b, {_column(r)}]" for r in range(cell.num_residuals)]
    body = ["H = dh_carry.shape[1]", "b, j = element(n, H)", "if b < 0:", "    return", *carries,
            f"d = cell_backward({_tuple(residuals)}, {_tuple(d_states)})", *_store_gradients(cell)]
    return f"def custom_backward_step({', '.join(backward_parameters(cell))}):\n{_indented(body)}"


def _compile_source(cell: Cell, source: str, what: str, function: Any) -> Any:
    """``source`` as a ``@cuda.jit`` kernel calling ``function`` (the cell's, as a device function)."""
    filename = f"<arrayrnn: cell {cell.name!r} {what} step kernel>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # tracebacks show it
    namespace = {"cuda": cuda, "element": ck.element, f"cell_{what}": cuda.jit(device=True, inline="always")(
        function)}
    exec(compile(source, filename, "exec"), namespace)
    return cuda.jit(namespace[f"custom_{what}_step"])


_KERNELS: weakref.WeakKeyDictionary[Cell, CellKernels] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def kernels_for(cell: Cell) -> CellKernels:
    """``cell``'s step kernels, generated once per cell object."""
    with _LOCK:
        found = _KERNELS.get(cell)
        if found is None:
            if not SIMULATED:
                from . import cell_math

                cell_math.install()
            sources = forward_source(cell), backward_source(cell)
            found = _KERNELS[cell] = CellKernels(_compile_source(cell, sources[0], "forward", cell.forward),
                                                 _compile_source(cell, sources[1], "backward", cell.backward),
                                                 *sources)
        return found


# -- compile errors ------------------------------------------------------------------------------------------
@contextlib.contextmanager
def compiling(cell: Cell, what: str) -> Iterator[None]:
    """numba's errors while compiling ``cell``'s ``what`` ("forward" or "backward") kernel, as a
    :class:`CellCompileError` naming the cell and the function."""
    try:
        yield
    except NumbaError as err:
        reason = str(err).strip()
        raise CellCompileError(
            f"cell {cell.name!r}: numba-cuda cannot compile its {what} function for the GPU: {reason}\n"
            f"A cell's functions may use arithmetic, comparisons inside arrayrnn.cellmath.where and the "
            f"functions of arrayrnn.cellmath on floats; they cannot call other Python functions or build "
            f"Python objects. Check the cell with ar.check_cell; engine='reference' runs it as plain "
            f"Python.") from err


def site(program: Any, cell: Cell, what: str, **values: Any) -> Any:
    """The launch site of ``cell``'s ``what`` kernel in ``program`` (a :class:`~.programs.StepProgram`),
    arguments by name; compiling it is where numba's errors arise (:func:`compiling`)."""
    kernels = kernels_for(cell)
    with compiling(cell, what):
        return program.site(getattr(kernels, what), **values)


def compile_ptx(cell: Cell, what: str, args: Sequence[Any], cc: tuple[int, int]) -> str:
    """The PTX of ``cell``'s ``what`` kernel for the parameter kinds of ``args`` (the engine's path:
    :func:`.launch.compile_ptx`), numba's errors as :class:`CellCompileError`."""
    from . import launch

    kernel = getattr(kernels_for(cell), what)
    specs = tuple(launch.describe(a, i, f"{cell.name} {what}") for i, a in enumerate(args))
    with compiling(cell, what):
        return launch.compile_ptx(kernel, specs, cc)
