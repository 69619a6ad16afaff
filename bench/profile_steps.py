"""Where the time of one numba-engine call goes: recurrent GEMM, gate math, hoisted GEMMs, the rest; and
each time loop's roofline per step: its recurrent product's FLOP rate in the loop and alone against the FMA
peak, the gate math's time and the barrier's.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/profile_steps.py --write

For one-layer shapes of ``bench/SHAPES.md`` (S1, S3 by default; S2's layer, ``S2-layer`` (B = 16: the
LSTM forward splits its hidden units); S5 with its variable lengths; a layer-direction of a stack,
``S4-layer1``), LSTM and GRU, float32, each part is timed on its own with the buffers and shapes the engine
uses, median of ``--repeats`` back-to-back calls after one untimed call (steady state; ``--gap`` adds a
pause before each, as ``bench_rnn.py`` does between peers, which this profile of one engine does not need).

The per-call table (ms):

- ``total``: ``ar.rnn_forward`` (inference) or ``rnn_forward(training=True)`` + ``rnn_backward``;
- ``input GEMM``: the hoisted ``x @ W_ih.T + b`` over all steps (the engine's ``project_input``; with
  variable lengths, on each step's active rows where the engine does so);
- ``time loop``: the compiled direction kernel alone (``NumbaKernel.forward`` / ``.backward``, on one
  input buffer reused between repeats: the loops overwrite it with bounded activations);
- ``recurrent GEMM``: the same per-step products as the kernel (same shapes, same packed weights and
  entry point, :func:`arrayrnn.engines.numba.packed_gemm.gemm`; gate-grouped packing in the forward; ``T``
  calls in one compiled loop; split over the threads as the loop splits: its rows, or, for a column-split
  forward, its unit groups (:func:`arrayrnn.engines.numba.loop_parts.unit_groups`), without the barrier),
  without any gate math;
- ``gate math`` = ``time loop`` - ``recurrent GEMM`` (everything the kernel does between its GEMMs; a
  column-split loop's barrier included);
- ``hoisted backward GEMMs``: ``dx``, ``dW_ih``, ``dW_hh`` and the bias sums, after the backward loop
  (variable lengths: on the active rows where the engine gathers them; copied here, compacted in place
  there, so the stacks can be reused between repeats);
- ``rest`` = ``total`` - the parts above: the frontend (checks, the private copies of ``x`` and of the
  weights, zero initial states), the driver's ``previous_states`` and concatenations, Python overhead.

The roofline table, per time loop (the inference forward's and the backward's), in us per step (the loop's
time / ``T``) and GFLOP/s:

- ``FLOPs``: the loop's per-step products, ``2 * G*H * H * rows`` per step (``G`` = 4 LSTM, 3 GRU;
  forward ``h @ W_hh.T``, backward ``dgates @ W_hh``: the one product each backward loop runs per step,
  ``dx`` and the weight gradients being hoisted), ``rows`` the step's active rows, summed over the steps;
- ``split``: the loop's threads as the engine plans them (:func:`arrayrnn.engines.numba.plan.loop_plan`):
  ``rows/2`` (rows split, no barrier), ``columns/2`` (unit split, one barrier per step) or ``1 thread``;
  every rate is given against the FMA peak for that many threads (``bench/cpu_peak.py``'s measurement, in
  this process, or ``--peak``);
- ``loop``, ``product alone``: as above, per step (a call's fixed cost, the kernel's buffers and its
  threads' start, spread over its steps);
- ``gate math alone``: the engine's own loop (``NumbaKernel``, same plan, buffers, entry point) run with
  a zero-size packed ``W_hh``: no unit group, so every per-step product is skipped and everything else
  runs. A column-split loop without units does nothing but its barrier, so its gate math is taken from
  the same loop split by rows over the same threads (the same elements per thread; marked ``*``);
- ``barrier`` (column split only): ``T`` steps that do nothing but meet at the engine's barrier, on the
  engine's workers (``run_columns``: ``new_sync``, :func:`arrayrnn.engines.numba.spin_barrier.barrier`),
  minus the same steps without it: a step's barrier when both parts arrive together; after the semicolon,
  the column split's products with a barrier per step minus the same without (per step: the barrier and
  the waits for the slower part). A rows split or one thread has no barrier (``none``);
- ``product in loop`` = ``loop`` - ``gate math alone`` - ``barrier``: the product's marginal cost in the
  loop (whatever it costs the rest, e.g. its weights evicting the gate math's data, is charged to it);
  ``n/a`` where the difference is not positive (noise on a small step);
- ``whole loop`` = FLOPs / ``loop``: the rate if the loop did nothing but its product (a lower bound of
  the in-loop rate); ``product alone``'s rate is the upper bound the loop's product could reach.

A stack (``--shapes S1,S4-layer1,S4``) is timed whole, against the sum of its layer-directions' one-layer
calls (which must be in ``--shapes``). Parts are measured apart, so they need not add up exactly; ``rest``
absorbs the difference. Each part runs with the threads the engine gives a call of its batch
(:func:`arrayrnn.engines.numba.loop_threads.engine_threads`: with 2 threads the time loops and per-step
products split the rows or the units, BLAS is held to one thread and the hoisted products split their rows
too).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import threadpoolctl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import cpu_peak  # noqa: E402
import results_md  # noqa: E402

import arrayrnn as ar  # noqa: E402
from arrayrnn.engines.numba import engine as numba_engine  # noqa: E402
from arrayrnn.engines.numba import loop_threads, packed_gemm  # noqa: E402
from arrayrnn.engines.numba.loop_parts import unit_groups, unit_range  # noqa: E402
from arrayrnn.engines.numba.plan import NumbaPlan, call_threads, forward_plan, loop_plan  # noqa: E402
from arrayrnn.engines.numba.simd_ir import simd_jit  # noqa: E402
from arrayrnn.engines.numba.spin_barrier import barrier  # noqa: E402
from arrayrnn.engines.stack import (  # noqa: E402
    ActiveRows,
    _input_grad,
    _weight_grads,
    direction_weights,
    input_projection,
)

RESULTS = ROOT / "bench" / "RESULTS.md"
START, END = "<!-- step-profile:start -->", "<!-- step-profile:end -->"
SHAPES = {  # name: (T, B, I, H, variable lengths); "S4-layer1": S4's second layer (input 2H), per direction
    "S1": (100, 64, 256, 256, False), "S2-layer": (50, 16, 128, 512, False), "S3": (200, 1, 64, 128, False),
    "S4-layer1": (100, 64, 512, 256, False), "S5": (100, 64, 256, 256, True)}
STACKS = {"S4": ((100, 64, 256, 256), 2, True)}  # name: ((T, B, I, H), layers, bidirectional)
STACK_PARTS = {"S4": ("S1", "S4-layer1")}  # the one-layer shapes of its layer-directions (2 each)
COLUMNS, ROWS, ONE = "columns", "rows", "1 thread"   # a time loop's split


@simd_jit(cache=True, nogil=True)
def _gemm_steps(a, packed, gates, c, accumulate, batch_sizes, first_row, scratch):
    """``c[t] (+)= a[t] @ b`` for every ``t``: the kernel's per-step products without gate math, on the rows
    of ``[first_row, first_row + a.shape[1])`` active at ``t`` (``batch_sizes[t]``, as the kernels do)."""
    for t in range(c.shape[0]):
        n = min(max(batch_sizes[t] - first_row, 0), a.shape[1])
        if n > 0:
            packed_gemm.gemm(a[t, :n], packed, gates, c[t, :n], accumulate, scratch)


@simd_jit(cache=True, nogil=True)
def _column_steps(part, parts, sync, a, packed, gates, c, accumulate, batch_sizes, with_barrier, scratch):
    """The column-split forward's per-step products without gate math: part ``part`` of ``parts`` computes
    every active row's gates of its unit groups (as :func:`.lstm_loops.lstm_forward_columns` does), and,
    ``with_barrier``, meets the other parts at the engine's barrier after each step."""
    u0, u1, _, _ = unit_range(part, parts, packed.shape[0] // gates, packed.shape[2], c.shape[2] // gates)
    for t in range(c.shape[0]):
        n = min(batch_sizes[t], a.shape[1])
        unit_groups(a[t], 0, n, packed, gates, u0, u1, c[t], accumulate, scratch)
        if with_barrier and not barrier(sync, parts):
            return


@contextmanager
def without_product():
    """The engine's time loops with a zero-size packed ``W_hh`` (no unit group, no column block): they skip
    every per-step recurrent product and run everything else (the gate math, the copies; the GRU's forward
    reads its unwritten product buffer, which the branch-free gate math takes the same time over)."""
    packed_cell = numba_engine._cell

    def cell_without_product(spec, w, dtype, backward=False):
        cell = packed_cell(spec, w, dtype, backward)
        return cell._replace(W_hh_p=cell.W_hh_p[:0])
    numba_engine._cell = cell_without_product
    try:
        yield
    finally:
        numba_engine._cell = packed_cell


def _call_time(fn, gap: float) -> float:
    """One call of ``fn`` right after an untimed one (steady state), in s."""
    time.sleep(gap)
    fn()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _median_time(fn, repeats: int, gap: float) -> float:
    return float(np.median([_call_time(fn, gap) for _ in range(repeats)]))


def _median_difference(fn, base, repeats: int, gap: float) -> float:
    """The median over ``repeats`` of ``fn``'s time minus ``base``'s, timed back to back, in s."""
    return float(np.median([_call_time(fn, gap) - _call_time(base, gap) for _ in range(repeats)]))


class Parts:
    """Timed closures for one shape and mode, on the engine's own buffers."""

    def __init__(self, mode: str, T: int, B: int, I: int, H: int, variable_lengths: bool = False):
        rng = np.random.default_rng(0)
        self.spec = ar.RNNSpec(mode=mode, input_size=I, hidden_size=H, dtype="float32")
        self.params = ar.PackedParams.init(self.spec, seed=0)
        self.x = rng.standard_normal((T, B, I)).astype(np.float32)
        self.dy = np.ones((T, B, H), np.float32)
        self.w = direction_weights(self.params, 0, 0)
        # S5: lengths uniform in 1..T, unsorted (the engine sorts rows by length: batch_sizes[t] rows run)
        self.lengths = rng.integers(1, T + 1, B) if variable_lengths else None
        self.bs = (np.full(T, B, np.int64) if self.lengths is None
                   else (self.lengths[None, :] > np.arange(T)[:, None]).sum(axis=1).astype(np.int64))
        if self.lengths is not None:
            self.dy *= (np.arange(T)[:, None] < self.lengths[None, :])[..., None]
        self.h0 = np.zeros((B, H), np.float32)
        self.c0 = np.zeros((B, H), np.float32) if mode == "lstm" else None
        self.kernel = numba_engine.NumbaKernel()
        self.xw = input_projection(self.x, self.w)
        self.xw_timed = self.xw.copy()  # the timed loops' input, overwritten in place (activations, bounded)
        G = self.spec.gate_size
        gates = {"lstm": 4, "gru": 3}.get(mode, 1)   # the engine's gate-grouped packing (reset-after GRU)
        self.plan = loop_plan(self.spec, B, np.float32, (), loop_threads.available_threads())
        # the per-step products of the kernels: forward h @ W_hh.T -> (B, G) (the LSTM adds it to xw[t]);
        # backward dgates @ W_hh -> (B, H) (the GRU adds it to dh)
        pack = packed_gemm.pack_b
        self.fwd_gemm = (np.zeros((T, B, H), np.float32), pack(self.w.W_hh.T, gates), gates,
                         np.zeros((T, B, G), np.float32), mode == "lstm")
        self.bwd_gemm = (rng.standard_normal((T, B, G)).astype(np.float32), pack(self.w.W_hh), 1,
                         np.zeros((T, B, H), np.float32), mode == "gru")

    def split(self, loop: str) -> tuple[str, int]:
        """How the engine splits the ``loop`` (``"forward"``, ``"backward"``) over threads, and how many."""
        if loop == "forward" and self.plan.column_parts > 1:
            return COLUMNS, self.plan.column_parts
        return (ROWS, self.plan.row_threads) if self.plan.row_threads > 1 else (ONE, 1)

    def recurrent_flops(self) -> float:
        """FLOPs of one loop's per-step products (forward and backward alike): ``2 * G*H * H`` per row."""
        return 2.0 * self.spec.gate_size * self.spec.output_size * float(self.bs.sum())

    def forward_total(self):
        return ar.rnn_forward(self.params, self.x, self.lengths, engine="numba")

    def train_total(self):
        res = ar.rnn_forward(self.params, self.x, self.lengths, training=True, engine="numba")
        return ar.rnn_backward(res, self.dy)

    def input_gemm(self):
        run = SimpleNamespace(x=self.x, batch_sizes=self.bs, plan=forward_plan(self.spec, self.x, self.bs))
        out = np.empty((*self.x.shape[:2], self.spec.gate_size), self.x.dtype)
        return numba_engine.ENGINE.projector(run, 0, self.w)(self.x, out)

    def forward_loop(self, keep: bool, kernel: numba_engine.NumbaKernel | None = None, xw=None):
        kernel = kernel or self.kernel
        xw = self.xw_timed if xw is None else xw
        return kernel.forward(self.spec, self.w, xw, self.bs, self.h0, self.c0, False, keep)

    def rows_split_kernel(self) -> numba_engine.NumbaKernel:
        """The kernel with its rows split over the column split's threads (the same elements per thread)."""
        return numba_engine.NumbaKernel(NumbaPlan(self.plan.threads, None, self.plan.column_parts, 1))

    def _split_steps(self, a, packed, gates, c, accumulate):
        """:func:`_gemm_steps` over the engine's row ranges, one per thread, as the time loops split."""
        ranges = loop_threads.row_ranges(self.bs, a.shape[1], self.plan.row_threads)
        loop_threads.in_parallel(lambda r0, r1: _gemm_steps(a[:, r0:r1], packed, gates, c[:, r0:r1],
                                                           accumulate, self.bs, r0,
                                                           packed_gemm.new_scratch(np.float32)),
                                ranges)

    def column_steps(self, with_barrier: bool, products: bool = True):
        """:func:`_column_steps` on the engine's workers and barrier (``run_columns``); without ``products``
        on a zero-size packed ``W_hh`` (no unit group: the steps do nothing but meet)."""
        a, packed, gates, c, accumulate = self.fwd_gemm
        packed = packed if products else packed[:0]
        loop_threads.run_columns(_column_steps, self.plan.column_parts, np.float32, a, packed, gates, c,
                                 accumulate, self.bs, with_barrier)

    def forward_gemms(self):
        if self.split("forward")[0] == COLUMNS:
            self.column_steps(with_barrier=False)
        else:
            self._split_steps(*self.fwd_gemm)

    def backward_gemms(self):
        self._split_steps(*self.bwd_gemm)

    def backward_pieces(self):
        """The backward loop's inputs, as the driver builds them (not timed)."""
        from arrayrnn.engines.stack import previous_states
        fwd = self.forward_loop(True, xw=self.xw.copy())
        h_prev = previous_states(np, fwd.y, self.h0, self.bs, False)
        c_prev = previous_states(np, fwd.cache.c, self.c0, self.bs, False) if self.c0 is not None else None
        return fwd, h_prev, c_prev

    def backward_loop_fn(self):
        fwd, h_prev, c_prev = self.backward_pieces()
        dc = np.zeros_like(self.c0) if self.c0 is not None else None
        dh = np.zeros_like(self.h0)
        return lambda: self.kernel.backward(self.spec, self.w, fwd, h_prev, c_prev, self.dy, dh, dc, self.bs,
                                            False)

    def hoisted_backward_fn(self):
        fwd, h_prev, _ = self.backward_pieces()
        g = self.backward_loop_fn()()
        grads = ar.PackedParams.zeros(self.spec)

        def run():
            matmul, rows = numba_engine.ENGINE.matmul, ActiveRows(np, self.bs, self.x.shape[1])
            _weight_grads(matmul, self.spec, grads, 0, 0, self.w, g, fwd, self.x, h_prev, rows=rows)
            return _input_grad(matmul, rows, g.dpre_in, self.w.W_ih, self.x.shape)
        return run


def _engine_threads(rows: int):
    """The engine's thread scope of a layer-by-layer call over ``rows`` rows."""
    return loop_threads.engine_threads(call_threads(rows, loop_threads.available_threads(), None))


class Timer:
    """``t(fn)``: ``fn``'s median time in ms; ``t.difference(fn, base)``: the median of their differences,
    ms; each with the threads the engine gives ``p``'s batch."""

    def __init__(self, p: Parts, repeats: int, gap: float):
        self.rows, self.repeats, self.gap = p.x.shape[1], repeats, gap

    def __call__(self, fn) -> float:
        with _engine_threads(self.rows):
            return _median_time(fn, self.repeats, self.gap) * 1e3

    def difference(self, fn, base) -> float:
        with _engine_threads(self.rows):
            return _median_difference(fn, base, self.repeats, self.gap) * 1e3


def profile(mode: str, shape: str, repeats: int, gap: float) -> tuple[dict, dict]:
    """The per-call parts (``{"forward": .., "train": ..}``, ms) and each time loop's
    (:func:`loop_steps`)."""
    p = Parts(mode, *SHAPES[shape])
    t = Timer(p, repeats, gap)
    fwd = {"total": t(p.forward_total), "input GEMM": t(p.input_gemm), "recurrent GEMM": t(p.forward_gemms)}
    loop = t(lambda: p.forward_loop(False))
    fwd["gate math"] = loop - fwd["recurrent GEMM"]
    fwd["rest"] = fwd["total"] - fwd["input GEMM"] - loop

    train = {"total": t(p.train_total), "input GEMM": fwd["input GEMM"]}
    loop_f = t(lambda: p.forward_loop(True))
    backward_loop = p.backward_loop_fn()
    loop_b = t(backward_loop)
    gemm_b = t(p.backward_gemms)
    train["recurrent GEMM"] = fwd["recurrent GEMM"] + gemm_b
    train["gate math"] = (loop_f - fwd["recurrent GEMM"]) + (loop_b - gemm_b)
    train["hoisted backward GEMMs"] = t(p.hoisted_backward_fn())
    train["rest"] = train["total"] - train["input GEMM"] - loop_f - loop_b - train["hoisted backward GEMMs"]
    loops = {"forward": loop_steps(p, t, "forward", loop, fwd["recurrent GEMM"]),
             "backward": loop_steps(p, t, "backward", loop_b, gemm_b, backward_loop)}
    return {"forward": fwd, "train": train}, loops


def loop_steps(p: Parts, t: Timer, loop: str, loop_ms: float, product_ms: float, backward_loop=None) -> dict:
    """One time loop's roofline parts (module doc), per step: ``us`` times and the loop's FLOPs, split and
    threads. ``backward_loop``: the backward's timed closure (its inputs built once)."""
    split, threads = p.split(loop)
    ms = {"loop": loop_ms, "product alone": product_ms}
    with without_product():
        if loop == "backward":
            ms["gate math alone"] = t(backward_loop)
        else:  # a column split without units would run nothing but its barrier: the rows split's loop
            kernel = p.rows_split_kernel() if split == COLUMNS else None
            ms["gate math alone"] = t(lambda: p.forward_loop(False, kernel))
    if split == COLUMNS:
        for key, products in (("barrier", False), ("barrier beside products", True)):
            with_barrier, without = (partial(p.column_steps, meet, products) for meet in (True, False))
            ms[key] = t.difference(with_barrier, without)
    steps = p.x.shape[0]
    return {"split": split, "threads": threads, "flops": p.recurrent_flops() / steps,
            "gate math proxy": split == COLUMNS, **{k: v * 1e3 / steps for k, v in ms.items()}}


def in_loop_rates(steps: dict) -> dict[str, float | None]:
    """The product's time in the loop (us per step) and its GFLOP/s in the loop, alone and over the whole
    loop (module doc); a rate is ``None`` where its time is not positive."""
    in_loop = steps["loop"] - steps["gate math alone"] - (steps.get("barrier") or 0.0)

    def rate(us: float) -> float | None:
        return steps["flops"] / us / 1e3 if us > 0 else None   # FLOP per us -> GFLOP/s
    return {"product in loop": in_loop, "in loop": rate(in_loop), "alone": rate(steps["product alone"]),
            "whole loop": rate(steps["loop"])}


def fma_peaks(threads: int, given: str | None) -> dict[int, float]:
    """The FMA peak (GFLOP/s, float32) for 1 .. ``threads`` threads: ``--peak``'s values in that order, else
    measured here by ``bench/cpu_peak.py``."""
    if given:
        return dict(enumerate((float(v) for v in given.split(",")), start=1))
    return {n: cpu_peak.measure(n) for n in range(1, threads + 1)}


def stack_totals(mode: str, name: str, repeats: int, gap: float) -> dict[str, float]:
    """A whole stack call (``STACKS[name]``): forward and training step, ms, median."""
    (T, B, I, H), layers, bidirectional = STACKS[name]
    spec = ar.RNNSpec(mode=mode, input_size=I, hidden_size=H, num_layers=layers, bidirectional=bidirectional,
                      dtype="float32")
    params = ar.PackedParams.init(spec, seed=0)
    x = np.random.default_rng(0).standard_normal((T, B, I)).astype(np.float32)
    dy = np.ones((T, B, spec.num_directions * H), np.float32)

    def train():
        return ar.rnn_backward(ar.rnn_forward(params, x, training=True, engine="numba"), dy)
    def forward():
        return ar.rnn_forward(params, x, engine="numba")
    with _engine_threads(B):
        return {phase: _median_time(fn, repeats, gap) * 1e3 for phase, fn in (("forward", forward),
                                                                              ("train", train))}


def render_stacks(stacks, results) -> str:
    """Each stack's whole call against its layer-directions' one-layer calls, each timed alone."""
    out = ["S4 = 2 layers x 2 directions: its layer 0 directions have S1's shape, its layer 1 directions "
           "S4-layer1's. Whole call against the sum of those four one-layer calls (ms):", "",
           "| stack | mode | phase | whole call | 2 x S1 + 2 x S4-layer1 | whole / sum |",
           "|---|---|---|---|---|---|"]
    for (name, mode), totals in stacks.items():
        for phase, whole in totals.items():
            parts = sum(2 * results[(layer, mode)][phase]["total"] for layer in STACK_PARTS[name])
            out.append(f"| {name} | {mode} | {phase} | {whole:.2f} | {parts:.2f} | {whole / parts:.2f} |")
    return "\n".join(out) + "\n"


PARTS = ("total", "input GEMM", "recurrent GEMM", "gate math", "hoisted backward GEMMs", "rest")


def render(results, command: str, label: str) -> str:
    out = [f"#### Per-call profile of the numba engine: {label}", "",
           f"Command: `{command}`; float32, 1 layer, the engine's threads; ms, median; share of total in "
           "brackets. "
           "`gate math` = compiled time loop - its per-step GEMMs measured alone; `rest` = total - parts "
           "(frontend copies, driver, Python).", "",
           "| shape | mode | phase | " + " | ".join(PARTS) + " |", "|" + "---|" * (3 + len(PARTS))]
    for (shape, mode), phases in results.items():
        for phase, parts in phases.items():
            cells = []
            for col in PARTS:
                if col not in parts:
                    cells.append("")
                elif col == "total":
                    cells.append(f"{parts[col]:.2f}")
                else:
                    cells.append(f"{parts[col]:.2f} ({parts[col] / parts['total']:.0%})")
            out.append(f"| {shape} | {mode} | {phase} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


ROOFLINE = ("split (peak)", "MFLOP/step", "loop", "product alone", "product in loop", "gate math alone",
            "barrier", "product in loop GFLOP/s", "product alone GFLOP/s", "whole loop GFLOP/s")


def _rate_cell(rate: float | None, peak: float) -> str:
    return "n/a" if rate is None else f"{rate:.3g} ({rate / peak:.0%})"


def _barrier_cell(steps: dict) -> str:
    if steps["split"] != COLUMNS:
        return f"none ({steps['split']})"
    return f"{steps['barrier']:.2f}; {steps['barrier beside products']:.2f}"


def roofline_row(shape: str, mode: str, loop: str, steps: dict, peaks: dict[int, float]) -> str:
    peak, r = peaks[steps["threads"]], in_loop_rates(steps)
    split = steps["split"] if steps["split"] == ONE else f"{steps['split']}/{steps['threads']}"
    gate = f"{steps['gate math alone']:.2f}" + ("*" if steps["gate math proxy"] else "")
    cells = [f"{split} ({peak:.0f})", f"{steps['flops'] / 1e6:.2f}", f"{steps['loop']:.2f}",
             f"{steps['product alone']:.2f}", f"{r['product in loop']:.2f}", gate, _barrier_cell(steps),
             *(_rate_cell(r[k], peak) for k in ("in loop", "alone", "whole loop"))]
    return f"| {shape} | {mode} | {loop} loop | " + " | ".join(cells) + " |"


def busy_note(peaks: dict[int, float]) -> str:
    """A warning where an ``n``-thread peak is below 3/4 of ``n`` times the 1-thread one (other work held
    cores while it was measured), else ``""``."""
    short = [str(n) for n, v in peaks.items() if n > 1 and v < 0.75 * n * peaks[1]]
    if not short:
        return ""
    return (f" **The {', '.join(short)}-thread peak is below 3/4 of that many times the 1-thread one: other "
            "work held cores while it was measured; shares of it overstate the loops' and their times "
            "include waits for a core.**")


def render_roofline(loops, peaks: dict[int, float], peak_source: str) -> str:
    """The roofline table: one row per shape, mode and time loop (module doc)."""
    peak_text = ", ".join(f"{n} thread{'s' if n > 1 else ''} {v:.1f}" for n, v in peaks.items())
    out = ["Roofline per step of each time loop (the inference forward's, the backward's): us per step "
           f"(loop time / T); GFLOP/s of the recurrent product and its share of the FMA peak for the loop's "
           f"threads ({peak_source}: {peak_text} GFLOP/s float32). `product in loop` = loop - `gate math "
           "alone` (the engine's loop with a zero-size packed W_hh) - `barrier`; `*`: the same loop split "
           "by rows over the same threads (a column split without units runs only its barrier); `barrier`: "
           "steps that only meet at the engine's barrier minus the same steps without it; after `;` the "
           "column split's products with a barrier per step minus without; `whole loop` = FLOPs / loop "
           "time (lower bound)." + busy_note(peaks), "",
           "| shape | mode | loop | " + " | ".join(ROOFLINE) + " |", "|" + "---|" * (3 + len(ROOFLINE))]
    out += [roofline_row(shape, mode, loop, steps, peaks)
            for (shape, mode), by_loop in loops.items() for loop, steps in by_loop.items()]
    return "\n".join(out) + "\n"


def write_results(section: str, label: str) -> None:
    start, end = START.replace(":start", f":{label}:start"), END.replace(":end", f":{label}:end")
    results_md.write_block(RESULTS, start, end, section)


def _check_stacks(parser: argparse.ArgumentParser, shapes: list[str]) -> None:
    """A stack is timed against its layer-directions' one-layer shapes: refuse it without them, before any
    timing (the table would have nothing to compare with)."""
    for name in shapes:
        missing = [layer for layer in STACK_PARTS.get(name, ()) if layer not in shapes]
        if missing:
            wanted = [s for s in shapes if s != name] + missing + [name]
            parser.error(f"--shapes {name} is compared with its layers {', '.join(STACK_PARTS[name])}, and "
                         f"{', '.join(missing)} is not among --shapes {','.join(shapes)}; pass --shapes "
                         f"{','.join(wanted)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="S1,S3")
    parser.add_argument("--modes", default="lstm,gru")
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--gap", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--peak", help="the FMA peak, GFLOP/s float32, for 1, 2, .. threads "
                                       "(comma-separated); default: measured here (bench/cpu_peak.py)")
    parser.add_argument("--label", default="after", help="names the RESULTS.md block (before / after)")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    _check_stacks(parser, args.shapes.split(","))
    threadpoolctl.threadpool_limits(args.threads)
    peaks = fma_peaks(args.threads, args.peak)
    print("FMA peak GFLOP/s by threads:", {n: round(v, 1) for n, v in peaks.items()}, flush=True)
    results, loops, stacks = {}, {}, {}
    for shape in args.shapes.split(","):
        for mode in args.modes.split(","):
            if shape in STACKS:
                stacks[(shape, mode)] = stack_totals(mode, shape, args.repeats, args.gap)
                print(shape, mode, {k: round(v, 2) for k, v in stacks[(shape, mode)].items()}, flush=True)
                continue
            results[(shape, mode)], loops[(shape, mode)] = profile(mode, shape, args.repeats, args.gap)
            rounded = {ph: {k: round(v, 2) for k, v in d.items()} for ph, d in results[(shape, mode)].items()}
            print(shape, mode, rounded, flush=True)
    args_used = argv if argv is not None else sys.argv[1:]
    command = "python " + " ".join(shlex.quote(a) for a in ["bench/profile_steps.py", *args_used])
    section = render(results, command, args.label)
    if loops:
        source = "--peak" if args.peak else "bench/cpu_peak.py, this run"
        section += "\n" + render_roofline(loops, peaks, source)
    if stacks:
        section += "\n" + render_stacks(stacks, results)
    print(section)
    if args.write:
        write_results(section, args.label)


if __name__ == "__main__":
    main()
