"""Where the time of one numba-engine call goes: recurrent GEMM, gate math, hoisted GEMMs, the rest.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/profile_steps.py --write

For one-layer shapes of ``bench/SHAPES.md`` (S1, S3 by default; S5 with its variable lengths; a
layer-direction of a stack, ``S4-layer1``), LSTM and GRU, float32, each part
is timed on its own with the buffers and shapes the engine uses, median of ``--repeats`` back-to-back
calls after one untimed call (steady state; ``--gap`` adds a pause before each, as ``bench_rnn.py`` does
between peers, which this profile of one engine does not need):

- ``total``: ``ar.rnn_forward`` (inference) or ``rnn_forward(training=True)`` + ``rnn_backward``;
- ``input GEMM``: the hoisted ``x @ W_ih.T + b`` over all steps (the engine's ``project_input``; with
  variable lengths, on each step's active rows where the engine does so);
- ``time loop``: the compiled direction kernel alone (``NumbaKernel.forward`` / ``.backward``);
- ``recurrent GEMM``: the same per-step products as the kernel (same shapes, same packed weights and
  entry point, :func:`arrayrnn.engines.numba.packed_gemm.gemm`; gate-grouped packing in the forward; ``T``
  calls in one compiled loop), without any gate math;
- ``gate math`` = ``time loop`` - ``recurrent GEMM`` (everything the kernel does between its GEMMs);
- ``hoisted backward GEMMs``: ``dx``, ``dW_ih``, ``dW_hh`` and the bias sums, after the backward loop
  (variable lengths: on the active rows where the engine gathers them; copied here, compacted in place
  there, so the stacks can be reused between repeats);
- ``rest`` = ``total`` - the parts above: the frontend (checks, the private copies of ``x`` and of the
  weights, zero initial states), the driver's ``previous_states`` and concatenations, Python overhead.

A stack (``--shapes S1,S4-layer1,S4``) is timed whole, against the sum of its layer-directions' one-layer
calls (which must be in ``--shapes``). Parts are measured apart, so they need not add up exactly; ``rest``
absorbs the difference. Each part
runs with the threads the engine gives a call of its batch
(:func:`arrayrnn.engines.numba.loop_threads.engine_threads`: with 2 threads the time loops and per-step
products split the rows, BLAS is held to one thread and the hoisted products split their rows too).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import threadpoolctl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import results_md  # noqa: E402

import arrayrnn as ar  # noqa: E402
from arrayrnn.engines.numba import engine as numba_engine  # noqa: E402
from arrayrnn.engines.numba import loop_threads, packed_gemm  # noqa: E402
from arrayrnn.engines.numba.plan import call_threads, forward_plan, rows_split  # noqa: E402
from arrayrnn.engines.numba.simd_ir import simd_jit  # noqa: E402
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


@simd_jit(cache=True, nogil=True)
def _gemm_steps(a, packed, gates, c, accumulate, batch_sizes, first_row, scratch):
    """``c[t] (+)= a[t] @ b`` for every ``t``: the kernel's per-step products without gate math, on the rows
    of ``[first_row, first_row + a.shape[1])`` active at ``t`` (``batch_sizes[t]``, as the kernels do)."""
    for t in range(c.shape[0]):
        n = min(max(batch_sizes[t] - first_row, 0), a.shape[1])
        if n > 0:
            packed_gemm.gemm(a[t, :n], packed, gates, c[t, :n], accumulate, scratch)


def _median_time(fn, repeats: int, gap: float) -> float:
    times = []
    for _ in range(repeats):
        time.sleep(gap)
        fn()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


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
        G = self.spec.gate_size
        gates = {"lstm": 4, "gru": 3}.get(mode, 1)   # the engine's gate-grouped packing (reset-after GRU)
        self.scratch = packed_gemm.new_scratch(np.float32)
        # the per-step products of the kernels: forward h @ W_hh.T -> (B, G); backward dgates @ W_hh -> (B, H)
        pack = packed_gemm.pack_b
        self.fwd_gemm = (np.zeros((T, B, H), np.float32), pack(self.w.W_hh.T, gates), gates,
                         np.zeros((T, B, G), np.float32))
        self.bwd_gemm = (rng.standard_normal((T, B, G)).astype(np.float32), pack(self.w.W_hh), 1,
                         np.zeros((T, B, H), np.float32))

    def forward_total(self):
        return ar.rnn_forward(self.params, self.x, self.lengths, engine="numba")

    def train_total(self):
        res = ar.rnn_forward(self.params, self.x, self.lengths, training=True, engine="numba")
        return ar.rnn_backward(res, self.dy)

    def input_gemm(self):
        run = SimpleNamespace(x=self.x, batch_sizes=self.bs, plan=forward_plan(self.spec, self.x, self.bs))
        out = np.empty((*self.x.shape[:2], self.spec.gate_size), self.x.dtype)
        return numba_engine.ENGINE.projector(run, 0, self.w)(self.x, out)

    def forward_loop(self, keep: bool):
        return self.kernel.forward(self.spec, self.w, self.xw.copy(), self.bs, self.h0, self.c0, False, keep)

    def _split_steps(self, a, packed, gates, c, accumulate):
        """:func:`_gemm_steps` over the engine's row ranges, one per thread, as the time loops split."""
        ranges = loop_threads.row_ranges(self.bs, a.shape[1],
                                          rows_split(a.shape[1], loop_threads.available_threads()))
        loop_threads.in_parallel(lambda r0, r1: _gemm_steps(a[:, r0:r1], packed, gates, c[:, r0:r1],
                                                           accumulate, self.bs, r0,
                                                           packed_gemm.new_scratch(np.float32)),
                                ranges)

    def forward_gemms(self):
        self._split_steps(*self.fwd_gemm, True)

    def backward_gemms(self):
        self._split_steps(*self.bwd_gemm, False)

    def backward_pieces(self):
        """The backward loop's inputs, as the driver builds them (not timed)."""
        from arrayrnn.engines.stack import previous_states
        fwd = self.forward_loop(True)
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


def profile(mode: str, shape: str, repeats: int, gap: float) -> dict[str, dict[str, float]]:
    p = Parts(mode, *SHAPES[shape])

    def t(fn) -> float:
        with _engine_threads(p.x.shape[1]):  # each part with the threads the engine gives it
            return _median_time(fn, repeats, gap) * 1e3
    fwd = {"total": t(p.forward_total), "input GEMM": t(p.input_gemm), "recurrent GEMM": t(p.forward_gemms)}
    loop = t(lambda: p.forward_loop(False))
    fwd["gate math"] = loop - fwd["recurrent GEMM"]
    fwd["rest"] = fwd["total"] - fwd["input GEMM"] - loop

    train = {"total": t(p.train_total), "input GEMM": fwd["input GEMM"]}
    loop_f = t(lambda: p.forward_loop(True))
    loop_b = t(p.backward_loop_fn())
    gemm_b = t(p.backward_gemms)
    train["recurrent GEMM"] = fwd["recurrent GEMM"] + gemm_b
    train["gate math"] = (loop_f - fwd["recurrent GEMM"]) + (loop_b - gemm_b)
    train["hoisted backward GEMMs"] = t(p.hoisted_backward_fn())
    train["rest"] = train["total"] - train["input GEMM"] - loop_f - loop_b - train["hoisted backward GEMMs"]
    return {"forward": fwd, "train": train}


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
            parts = sum(2 * results[(layer, mode)][phase]["total"] for layer in ("S1", "S4-layer1"))
            out.append(f"| {name} | {mode} | {phase} | {whole:.2f} | {parts:.2f} | {whole / parts:.2f} |")
    return "\n".join(out) + "\n"


COLUMNS = ("total", "input GEMM", "recurrent GEMM", "gate math", "hoisted backward GEMMs", "rest")


def render(results, command: str, label: str) -> str:
    out = [f"#### Per-call profile of the numba engine: {label}", "",
           f"Command: `{command}`; float32, 1 layer, the engine's threads; ms, median; share of total in "
           "brackets. "
           "`gate math` = compiled time loop - its per-step GEMMs measured alone; `rest` = total - parts "
           "(frontend copies, driver, Python).", "",
           "| shape | mode | phase | " + " | ".join(COLUMNS) + " |", "|" + "---|" * (3 + len(COLUMNS))]
    for (shape, mode), phases in results.items():
        for phase, parts in phases.items():
            cells = []
            for col in COLUMNS:
                if col not in parts:
                    cells.append("")
                elif col == "total":
                    cells.append(f"{parts[col]:.2f}")
                else:
                    cells.append(f"{parts[col]:.2f} ({parts[col] / parts['total']:.0%})")
            out.append(f"| {shape} | {mode} | {phase} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def write_results(section: str, label: str) -> None:
    start, end = START.replace(":start", f":{label}:start"), END.replace(":end", f":{label}:end")
    results_md.write_block(RESULTS, start, end, section)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="S1,S3")
    parser.add_argument("--modes", default="lstm,gru")
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--gap", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--label", default="after", help="names the RESULTS.md block (before / after)")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    threadpoolctl.threadpool_limits(args.threads)
    results, stacks = {}, {}
    for shape in args.shapes.split(","):
        for mode in args.modes.split(","):
            if shape in STACKS:
                stacks[(shape, mode)] = stack_totals(mode, shape, args.repeats, args.gap)
                print(shape, mode, {k: round(v, 2) for k, v in stacks[(shape, mode)].items()}, flush=True)
                continue
            results[(shape, mode)] = profile(mode, shape, args.repeats, args.gap)
            rounded = {ph: {k: round(v, 2) for k, v in d.items()} for ph, d in results[(shape, mode)].items()}
            print(shape, mode, rounded, flush=True)
    args_used = argv if argv is not None else sys.argv[1:]
    command = "python " + " ".join(shlex.quote(a) for a in ["bench/profile_steps.py", *args_used])
    section = render(results, command, args.label)
    if stacks:
        section += "\n" + render_stacks(stacks, results)
    print(section)
    if args.write:
        write_results(section, args.label)


if __name__ == "__main__":
    main()
