"""How the numba engine runs one call: a frozen :class:`NumbaPlan`, made once per call and carried on the
driver's run objects (``StackRun.plan``, ``StackBackRun.plan``); the thresholds come from
:mod:`arrayrnn.engines.thresholds`.

A forward's plan (:func:`forward_plan`), from the spec, the batch (sorted rows), the threads the call may
use (:func:`.loop_threads.available_threads`; one for a call of fewer multiply-adds than
:data:`~arrayrnn.engines.thresholds.MIN_SPLIT_CALL_FMAS`, :func:`available_to`) and the cell variants it
applies:

- ``schedule`` (:func:`wavefront_schedule`): a bidirectional layer's directions side by side, a
  unidirectional stack's layers pipelined (:mod:`.wavefront`), or layer by layer;
- each time loop's threads: its rows split (:func:`rows_split`), or, for the plain LSTM and reset-after GRU
  forwards (:func:`column_loop`, the one rule of which forwards have a column-split loop), its hidden
  units split (:func:`column_parts`); under a schedule every loop runs on its task's one thread;
- ``threads``: the call's, where any of these may split (then NumPy's BLAS is held to one thread and the
  hoisted products split their rows, :func:`.loop_threads.engine_threads`), else 1;
- the input projection of each layer: on each step's active rows (:func:`active_projection`), on the
  packed kernel (:func:`packed_projection`) or on BLAS.

A backward's plan (:func:`backward_plan`) has the threads and the schedule only (a bidirectional layer's
directions side by side below the rows split); its loops split their rows. A small one-thread backward
(:func:`backward_holds_blas`) also holds NumPy's BLAS to one thread.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...core.spec import RNNSpec
from .. import thresholds as th
from ..base import CellMasks
from .loop_threads import available_threads, small_calls_split_here
from .packed_gemm import vector_lanes

DIRECTIONS, LAYERS = "directions", "layers"


@dataclass(frozen=True)
class NumbaPlan:
    """One call's decisions (module doc)."""

    threads: int                          # the call's threads; > 1: BLAS at one thread, products split
    schedule: str | None                  # DIRECTIONS, LAYERS (the wavefront) or None: layer by layer
    row_threads: int                      # threads a time loop's rows split over
    column_parts: int                     # threads a forward's hidden units split over (1: no column split)
    active_projection: bool = False       # the input projection on each step's active rows only
    packed_projection: tuple[bool, ...] = ()   # per layer: the input projection on the packed kernel
    variants: tuple[str, ...] = ()        # the cell variants' masks the call applies (CellMasks fields)
    blas_one_thread: bool = False         # a one-thread call that holds BLAS to one thread too (small)

    @property
    def direction_threads(self) -> int:
        """Threads one direction's work may split over: 1 under a schedule (each task on its thread)."""
        return 1 if self.schedule else self.threads


def forward_plan(spec: RNNSpec, x: np.ndarray, batch_sizes: np.ndarray, masks: CellMasks | None = None,
                 threads: int | None = None) -> NumbaPlan:
    """The plan of a forward over ``x (T, B, I)`` (rows sorted by length) with the cell variants ``masks``
    on ``threads`` threads (``None``: the engine's, or one for a small call: :func:`available_to`)."""
    T, B = x.shape[:2]
    threads = available_to(spec, T, B) if threads is None else threads
    variants = masks.applied() if masks is not None else ()
    return _forward_plan(spec, T, B, x.dtype, variants, threads, active_projection(x, batch_sizes),
                         _read_thresholds(th), wavefront_schedule)


def one_step_on_one_thread(spec: RNNSpec, rows: int) -> bool:
    """Whether a plain forward's plan over ONE time step of ``rows`` full rows runs all of it on one thread:
    no schedule, no rows or column split, every input projection on the packed kernel (a plan may still
    give the call more threads, which would only hold BLAS to one: ``call_threads``)."""
    plan = _forward_plan(spec, 1, rows, np.dtype(spec.dtype), (), available_to(spec, 1, rows), False,
                         _read_thresholds(th), wavefront_schedule)
    return (plan.schedule is None and plan.row_threads == 1 and plan.column_parts == 1
            and all(plan.packed_projection))


def available_to(spec: RNNSpec, steps: int, rows: int) -> int:
    """The threads a call over ``steps`` time steps of ``rows`` rows may use: the engine's
    (:func:`.loop_threads.available_threads`), or one below :data:`~.thresholds.MIN_SPLIT_CALL_FMAS`
    multiply-adds (:func:`call_fmas`), where handing parts to another core costs more than it saves
    (unless the caller is inside :func:`.loop_threads.small_calls_split`)."""
    threads = available_threads()
    if threads == 1 or small_calls_split_here():
        return threads
    return 1 if call_fmas(spec, steps, rows) < th.MIN_SPLIT_CALL_FMAS else threads


def call_fmas(spec: RNNSpec, steps: int, rows: int) -> int:
    """The multiply-adds of a forward's products over ``steps`` steps of ``rows`` rows: each layer-direction's
    ``x @ W_ih.T`` and ``h @ W_hh.T``, ``steps * rows * gate_size * (layer input + output size)``."""
    return steps * rows * _fmas_per_step_row(spec)


@functools.lru_cache(maxsize=256)
def _fmas_per_step_row(spec: RNNSpec) -> int:
    """:func:`call_fmas` of one step of one row (asked at every call)."""
    widths = sum(spec.layer_input_size(layer) + spec.output_size for layer in range(spec.num_layers))
    return spec.gate_size * spec.num_directions * widths


# the thresholds a plan reads (tests/test_loop_threads.py checks the list against this module's code)
_read_thresholds = operator.attrgetter(
    "MIN_ROWS_PER_THREAD", "COLUMN_SPLIT_MIN_ROWS", "COLUMN_SPLIT_MAX_ROWS", "COLUMN_SPLIT_MIN_STEP_FMAS",
    "COLUMN_SPLIT_WIDE_STEP_FMAS", "WAVEFRONT_MIN_ROWS", "PIPELINE_LAYERS", "PACKED_PROJECTION_MAX")


@functools.lru_cache(maxsize=256)
def _forward_plan(spec: RNNSpec, T: int, B: int, dtype: Any, variants: tuple[str, ...], threads: int,
                  active: bool, thresholds: tuple, schedule_rule: Any) -> NumbaPlan:
    """:func:`forward_plan` from what it depends on, made once per shape (a small call's Python counts).
    ``thresholds`` (their values now) and ``schedule_rule`` (:func:`wavefront_schedule` as the module has
    it now) key it too: a test or bench that sets a threshold or replaces the rule gets a new plan."""
    schedule = schedule_rule(spec, B, threads, column_loop(spec, variants))
    loops = loop_plan(spec, B, dtype, variants, 1 if schedule else threads)
    packed = tuple(packed_projection(T, B, spec.layer_input_size(layer), spec.gate_size, dtype)
                   for layer in range(spec.num_layers))
    return NumbaPlan(call_threads(B, threads, schedule), schedule, loops.row_threads, loops.column_parts,
                     active, packed, variants)


def backward_plan(spec: RNNSpec, rows: int, threads: int | None = None,
                  steps: int | None = None) -> NumbaPlan:
    """The plan of a backward over ``rows`` batch rows (and ``steps`` time steps, if known)."""
    if threads is None:
        threads = available_threads() if steps is None else available_to(spec, steps, rows)
    schedule = wavefront_schedule(spec, rows, threads, columns=False, backward=True)
    row_threads = rows_split(rows, 1 if schedule else threads)
    call = call_threads(rows, threads, schedule)
    hold = call == 1 and steps is not None and backward_holds_blas(spec, steps * rows)
    return NumbaPlan(call, schedule, row_threads, column_parts=1, blas_one_thread=hold)


def backward_holds_blas(spec: RNNSpec, pairs: int) -> bool:
    """Whether a one-thread backward over ``pairs`` (step, row) pairs holds NumPy's BLAS to one thread: few
    pairs, and a widest product (``pairs x gate_size x`` the widest input or state) that OpenBLAS would thread
    but that is small (:data:`~arrayrnn.engines.thresholds.BLAS_ONE_THREAD_MAX`, the comment above it)."""
    widest = pairs * spec.gate_size * max(spec.input_size, spec.num_directions * spec.output_size,
                                          spec.output_size)
    few = pairs <= th.BLAS_ONE_THREAD_MAX_ROWS
    return few and th.OPENBLAS_THREADED_MIN < widest <= th.BLAS_ONE_THREAD_MAX


def loop_plan(spec: RNNSpec, rows: int, dtype: Any, variants: tuple[str, ...], threads: int) -> NumbaPlan:
    """The plan of time loops over ``rows`` rows on ``threads`` threads, no schedule (also a direction run
    alone: :class:`.engine.NumbaKernel` without a call's plan)."""
    columns = column_parts(spec, rows, dtype, threads, column_loop(spec, variants))
    return NumbaPlan(threads, None, rows_split(rows, threads), columns, variants=variants)


def column_loop(spec: RNNSpec, variants: tuple[str, ...]) -> bool:
    """Whether a column-split loop runs this forward: an LSTM (layer-normalised too) or a plain reset-after
    GRU (no projection, no peepholes; of the variants' masks, only DropConnect's, which scales ``W_hh``
    before the loop)."""
    cell = spec.mode == "lstm" or (spec.mode == "gru" and spec.reset_after and not spec.layer_norm)
    return cell and not spec.proj_size and not spec.peepholes and set(variants) <= {"weight"}


def rows_split(rows: int, threads: int) -> int:
    """Threads a time loop over ``rows`` rows splits them over."""
    return max(1, min(threads, rows // th.MIN_ROWS_PER_THREAD))


def column_parts(spec: RNNSpec, rows: int, dtype: Any, threads: int, columns: bool) -> int:
    """Threads a forward's hidden units split over: more than one only where a column-split loop runs
    (``columns``), from :data:`~.thresholds.COLUMN_SPLIT_MIN_ROWS` rows up to the rows split for steps of
    :data:`~.thresholds.COLUMN_SPLIT_MIN_STEP_FMAS` multiply-adds or more, and, for the LSTM, on to
    :data:`~.thresholds.COLUMN_SPLIT_MAX_ROWS` for steps of :data:`~.thresholds.COLUMN_SPLIT_WIDE_STEP_FMAS`
    or more; at most one per unit group of the packed ``W_hh``."""
    top = th.COLUMN_SPLIT_MAX_ROWS if spec.mode == "lstm" else 2 * th.MIN_ROWS_PER_THREAD
    if not columns or not th.COLUMN_SPLIT_MIN_ROWS <= rows < top:
        return 1
    wide = rows >= 2 * th.MIN_ROWS_PER_THREAD
    if rows * spec.gate_size * spec.output_size < (th.COLUMN_SPLIT_WIDE_STEP_FMAS if wide
                                                    else th.COLUMN_SPLIT_MIN_STEP_FMAS):
        return 1
    groups = -(-spec.hidden_size // vector_lanes(dtype))
    return max(1, min(threads, groups))


def wavefront_schedule(spec: RNNSpec, rows: int, threads: int, columns: bool,
                       backward: bool = False) -> str | None:
    """:data:`DIRECTIONS`, :data:`LAYERS` or ``None`` (layer by layer). From
    :data:`~.thresholds.WAVEFRONT_MIN_ROWS` rows: a bidirectional stack's directions side by side; a
    unidirectional one's layers pipelined below the rows split, unless ``columns`` (a column-split loop
    runs its forward) and its steps are large enough for the column split. The ``backward`` runs
    directions side by side only below the rows split: there both directions' residuals and ``dx`` would
    be live at once, a training step's peak memory (S4: +50 MiB) for a few percent; it never pipelines."""
    if threads < 2 or rows < th.WAVEFRONT_MIN_ROWS:
        return None
    below_rows_split = rows < 2 * th.MIN_ROWS_PER_THREAD
    if spec.num_directions == 2:
        return DIRECTIONS if below_rows_split or not backward else None
    if backward or not (th.PIPELINE_LAYERS and spec.num_layers > 1 and below_rows_split):
        return None
    large = rows * spec.gate_size * spec.output_size >= th.COLUMN_SPLIT_MIN_STEP_FMAS
    return None if columns and large else LAYERS


def call_threads(rows: int, threads: int, schedule: str | None) -> int:
    """The call's threads where a schedule, a rows split or a column split may run (from
    :data:`~.thresholds.COLUMN_SPLIT_MIN_ROWS` rows), else 1 (BLAS keeps its own threads)."""
    splits = (schedule is not None or rows_split(rows, threads) > 1
              or th.COLUMN_SPLIT_MIN_ROWS <= rows < th.COLUMN_SPLIT_MAX_ROWS)
    return threads if splits and threads > 1 else 1


def active_projection(x: np.ndarray, batch_sizes: np.ndarray) -> bool:
    """Whether the input projection of ``x (T, B, I)`` runs on each step's active rows: variable lengths
    with at most :data:`~.thresholds.ACTIVE_PROJECTION_MAX_FILL` of the entries active and
    :data:`~.thresholds.ACTIVE_PROJECTION_MIN_ROWS` active rows a step on average."""
    T, B = x.shape[:2]
    active = int(np.asarray(batch_sizes).sum())
    return (x.dtype in (np.float32, np.float64) and active <= th.ACTIVE_PROJECTION_MAX_FILL * T * B
            and active >= th.ACTIVE_PROJECTION_MIN_ROWS * T)


def packed_projection(T: int, B: int, I: int, N: int, dtype: Any) -> bool:
    """Whether a ``(T*B, I) @ (I, N)`` input projection runs on the packed kernel (small), not BLAS."""
    return T * B * I * N <= th.PACKED_PROJECTION_MAX and np.dtype(dtype) in (np.float32, np.float64)
