"""RNN benchmark: every CPU engine against PyTorch CPU and ONNX Runtime, shapes of bench/SHAPES.md.

    python bench/bench_rnn.py --write          # full run, writes bench/RESULTS.md and bench/rnn_ratios.png
    python bench/bench_rnn.py --quick          # smoke run: tiny shapes, 3 pairs, prints only
    python bench/bench_rnn.py --quick --chart /tmp/r.png   # ... and the ratio chart

Method (bench/SHAPES.md): float32, time-major, same process, ``torch.set_num_threads`` and ORT's
``intra_op_num_threads`` equal to our BLAS thread count (``--threads``, set through threadpoolctl). For
each configuration the sides run in rounds (forward: ours, PyTorch, ONNX Runtime; training step: ours,
PyTorch, as ORT has no training), the order rotated every round so that each side goes first in turn,
and each reported ratio is the median of the per-round ratios: ours/PyTorch, ours/ORT and ours/faster
peer (ours over the smaller of the peers' times in the same round). Before every timed call the
process sleeps ``--gap`` seconds and then makes untimed calls of the same side for at least ``WARM_S``
(0.1 s; one at least): OpenBLAS's idle
workers spin for about 0.1 s after a call and OpenMP's for a while too, and without the pause each
side's spinning threads slow the other side's next call (measured: PyTorch's S1 LSTM forward 16 ms
alone, 32 ms right after one of ours); the untimed calls then wake the side's own threads and this VM's
idle vCPUs (one untimed call was too few for calls of 10-20 ms: see ``rotated_times``), so the timed call
is a warm, steady-state call. All sides use the same weights (``ar.from_torch``; ORT through
``bench/onnx_peer.py``, exact gate reordering) and the outputs are compared once per configuration
(``max|dy|``). ORT runs on pre-bound inputs and outputs (IOBinding). Without onnxruntime (the ``bench``
extra) the ORT columns say n/a and the faster peer is PyTorch.

A training step is forward + backward with ``dy = 1`` (the gradient of ``y.sum()``), input gradient
included on both sides. S5's lengths are uniform in 1..T, unsorted; PyTorch runs them through
``pack_padded_sequence(enforce_sorted=False)`` inside the timed call (our sort is inside too).

Memory: each training step also runs in a fresh subprocess per side, warmed up on a tiny case of the
same kind: for both sides the growth of the process's peak RSS (VmHWM, reset first) over its RSS right
before the first step at the real shape, and our tracemalloc peak (NumPy allocations) of a second step.
Roofline: FLOPs / the best sgemm rate measured on a 2048^3 GEMM here, before and after the timings (forward
FLOPs per layer-direction ``2 G H (I_l + H_out) N`` with ``N`` the active (t, b) pairs; a training
step counted as 3x that). This script never asserts timings.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shlex
import subprocess
import sys
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import threadpoolctl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import cpu_peak  # noqa: E402
import onnx_peer  # noqa: E402
import results_md  # noqa: E402

import arrayrnn as ar  # noqa: E402
from arrayrnn.engines import engine_unavailable_reason, engines_for, probe_call  # noqa: E402
from arrayrnn.engines.numba import simd_ir  # noqa: E402

RESULTS = ROOT / "bench" / "RESULTS.md"
CHART = ROOT / "bench" / "rnn_ratios.png"
START, END = "<!-- rnn-bench:start -->", "<!-- rnn-bench:end -->"


@dataclass(frozen=True)
class Shape:
    name: str
    T: int
    B: int
    I: int
    H: int
    layers: int = 1
    bidirectional: bool = False
    variable_lengths: bool = False


SHAPES = (
    Shape("S1", 100, 64, 256, 256),
    Shape("S2", 50, 16, 128, 512, layers=2),
    Shape("S3", 200, 1, 64, 128),
    Shape("S4", 100, 64, 256, 256, layers=2, bidirectional=True),
    Shape("S5", 100, 64, 256, 256, variable_lengths=True),
)
QUICK_SHAPES = (
    Shape("Q1", 8, 4, 8, 16),
    Shape("Q2", 6, 5, 4, 8, layers=2, bidirectional=True, variable_lengths=True),
)
MODES = ("lstm", "gru")
PHASES = ("forward", "train")

# issue 15's targets (numba engine): forward, ours / faster of PyTorch and ORT; training, ours / PyTorch
_TARGET_SHAPES = ("S1", "S2", "S3", "S4", "S5")
TARGETS = {(mode, phase): dict.fromkeys(_TARGET_SHAPES, limit)
           for mode in MODES for phase, limit in (("forward", 0.9), ("train", 0.8))}


# -- the two sides ---------------------------------------------------------------------------------
class Case:
    """One shape and mode: the torch module, our params with the same weights, inputs and cotangents."""

    def __init__(self, shape: Shape, mode: str, seed: int = 0):
        import torch

        self.shape, self.mode = shape, mode
        torch.manual_seed(seed)
        cls = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[mode]
        self.module = cls(shape.I, shape.H, shape.layers, bidirectional=shape.bidirectional)
        self.params = ar.from_torch(self.module)
        rng = np.random.default_rng(seed)
        self.x = rng.standard_normal((shape.T, shape.B, shape.I)).astype(np.float32)
        self.lengths = rng.integers(1, shape.T + 1, shape.B) if shape.variable_lengths else None
        D = 2 if shape.bidirectional else 1
        self.dy = np.ones((shape.T, shape.B, D * shape.H), np.float32)
        if self.lengths is not None:
            self.dy *= (np.arange(shape.T)[:, None] < self.lengths[None, :])[..., None]
        self.x_torch = torch.from_numpy(self.x)
        self.lengths_torch = torch.from_numpy(self.lengths) if self.lengths is not None else None
        self._ort: onnx_peer.OnnxPeer | None = None

    def active_pairs(self) -> int:
        return int(self.lengths.sum()) if self.lengths is not None else self.shape.T * self.shape.B

    def flops(self, phase: str) -> float:
        s, G = self.shape, {"lstm": 4, "gru": 3}[self.mode]
        D = 2 if s.bidirectional else 1
        total = sum(2 * G * s.H * ((s.I if layer == 0 else D * s.H) + s.H) * D for layer in range(s.layers))
        return total * self.active_pairs() * (3 if phase == "train" else 1)

    # ours
    def ours(self, engine: str, phase: str):
        p, x, lengths, dy = self.params, self.x, self.lengths, self.dy
        if phase == "forward":
            return lambda: ar.rnn_forward(p, x, lengths=lengths, engine=engine)

        def step():
            res = ar.rnn_forward(p, x, lengths=lengths, training=True, engine=engine)
            return ar.rnn_backward(res, dy)
        return step

    # PyTorch
    def torch_call(self, phase: str):
        import torch

        m, lengths = self.module, self.lengths_torch

        def run(x):
            if lengths is None:
                return m(x)[0]
            packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
            return torch.nn.utils.rnn.pad_packed_sequence(m(packed)[0], total_length=x.shape[0])[0]

        if phase == "forward":
            def forward():
                with torch.inference_mode():
                    return run(self.x_torch)
            return forward
        dy = torch.from_numpy(self.dy)

        def step():
            m.zero_grad(set_to_none=True)
            x = self.x_torch.detach().requires_grad_()
            run(x).backward(dy)
            return x.grad
        return step

    # ONNX Runtime (forward only)
    def ort_peer(self, threads: int) -> onnx_peer.OnnxPeer:
        if self._ort is None or self._ort.threads != threads:
            self._ort = onnx_peer.OnnxPeer(self.params, threads=threads)
        return self._ort

    def ort_call(self, threads: int):
        """The ORT forward on pre-bound input and output buffers (a zero-arg callable)."""
        return self.ort_peer(threads).bound(self.x, self.lengths)

    def max_abs_diff(self, engine: str, ort_threads: int | None = None) -> tuple[float, float | None]:
        """Largest |y_ours - y_peer| against PyTorch and (when ``ort_threads``) ORT; None: no ORT."""
        ours = ar.rnn_forward(self.params, self.x, lengths=self.lengths, engine=engine).y
        torch_y = self.torch_call("forward")().numpy()
        ort_diff = None
        if ort_threads is not None:
            ort_diff = float(np.abs(ours - self.ort_peer(ort_threads)(self.x, self.lengths)).max())
        return float(np.abs(ours - torch_y).max()), ort_diff


WARM_S = 0.1  # untimed calls of a side for at least this long after each pause, before its timed call


def rotated_times(sides: list, rounds: int, gap: float, warmup: int = 2) -> list[list[float]]:
    """Per side, ``rounds`` timings; round ``i`` runs the sides starting at side ``i mod n`` (rotated, so
    each goes first in turn; two sides alternate). Each timed call follows a pause and untimed calls of
    the same side for at least :data:`WARM_S` (one at least).

    The pause lets the other sides' idle threads fall asleep; the untimed calls wake this side's own
    threads and caches, and this VM's idle vCPUs: after a 0.2 s pause the next ~50 ms of calls run slow
    (measured on our side: an S5 GRU forward 27.7 ms after one untimed call, 18.7 after 60 ms of them, 17.5
    after 150 ms; B = 16, H = 512 GRU 16.4 / 10.2 / 10.0), so one untimed call did not make a short call's
    timing a warm steady-state one, as in a training loop.
    """
    for _ in range(warmup):
        for fn in sides:
            fn()
    times: list[list[float]] = [[] for _ in sides]
    for i in range(rounds):
        for k in range(len(sides)):
            j = (i + k) % len(sides)
            time.sleep(gap)
            warm_from = time.perf_counter()
            sides[j]()
            while time.perf_counter() - warm_from < WARM_S:
                sides[j]()
            t0 = time.perf_counter()
            sides[j]()
            times[j].append(time.perf_counter() - t0)
    return times


@dataclass
class Row:
    """One timed configuration; times in seconds (medians), ratios medians of per-round ratios."""

    shape: str
    mode: str
    phase: str
    engine: str
    ours: float
    torch: float
    ort: float | None           # None: ORT not run (training, or onnxruntime absent)
    vs_torch: float
    vs_ort: float | None
    vs_faster: float            # forward: ours / faster peer per round; train: = vs_torch
    target: float | None
    flops: float                # for the roofline fractions, computed at render time
    diff_torch: float
    diff_ort: float | None

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self.vs_faster <= self.target


def time_row(case: Case, engine: str, phase: str, threads: int, use_ort: bool, pairs: int, gap: float,
             diffs: tuple[float, float | None]) -> Row:
    """Time ours against the peers of ``phase`` (ORT only for the forward, when ``use_ort``)."""
    sides = [case.ours(engine, phase), case.torch_call(phase)]
    with_ort = use_ort and phase == "forward"
    if with_ort:
        sides.append(case.ort_call(threads))
    times = [np.array(t) for t in rotated_times(sides, pairs, gap)]
    ours, torch_t = times[0], times[1]
    ort_t = times[2] if with_ort else None
    faster = np.minimum(torch_t, ort_t) if with_ort else torch_t
    s = case.shape
    target = TARGETS.get((case.mode, phase), {}).get(s.name) if engine == "numba" else None
    return Row(s.name, case.mode, phase, engine, _median(ours), _median(torch_t), _median(ort_t),
               _median(ours / torch_t), _median(ours / ort_t) if with_ort else None, _median(ours / faster),
               target, case.flops(phase), diffs[0], diffs[1] if with_ort else None)


def _median(a: np.ndarray | None) -> float | None:
    return None if a is None else float(np.median(a))


def gemm_roofline(threads: int, n: int = 2048, repeats: int = 5) -> float:
    """Best measured float32 GEMM rate (FLOP/s) on an n^3 product with NumPy's BLAS."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    out = np.empty((n, n), np.float32)
    np.matmul(a, b, out=out)
    best = min(_timed(lambda: np.matmul(a, b, out=out)) for _ in range(repeats))
    return 2.0 * n ** 3 / best


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# -- memory: one training step per fresh subprocess ------------------------------------------------
def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak_rss() -> None:
    """Reset the kernel's peak-RSS mark (VmHWM) to the current RSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def memory_child(side: str, shape_name: str, mode: str, engine: str, threads: int) -> dict:
    """In a subprocess: a warm-up step, then one step's peak-RSS growth (and our tracemalloc peak)."""
    import torch

    shape = {s.name: s for s in SHAPES + QUICK_SHAPES}[shape_name]
    threadpoolctl.threadpool_limits(threads)
    torch.set_num_threads(threads)

    def training_step(case: Case):
        return case.ours(engine, "train") if side == "ours" else case.torch_call("train")

    # warm up on a tiny case of the same kind (compiles kernels, loads libraries): a warm-up at the real
    # shape would leave freed-but-resident heap pages behind and hide the real step's growth
    training_step(Case(dataclasses.replace(shape, T=2, B=2), mode))()
    step = training_step(Case(shape, mode))
    _reset_peak_rss()
    before = _status_kib("VmRSS")
    step()
    out = {"rss_peak_over_start": (_status_kib("VmHWM") - before) * 1024}
    if side == "ours":
        tracemalloc.start()
        step()
        out["tracemalloc_peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return out


def measure_memory(side: str, shape: Shape, mode: str, engine: str, threads: int) -> dict:
    cmd = [sys.executable, __file__, "--memory-child", json.dumps([side, shape.name, mode, engine, threads])]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, env=os.environ.copy())
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- compile cost ----------------------------------------------------------------------------------
def compile_cost(threads: int) -> dict:
    """First-call time of a small float32 LSTM forward+backward with a cold, then a warm numba cache."""
    import tempfile

    code = ("import time; t=time.perf_counter(); import numpy as np, arrayrnn as ar; "
            "s=ar.RNNSpec(mode='lstm', input_size=3, hidden_size=4); p=ar.PackedParams.init(s); "
            "t1=time.perf_counter(); r=ar.rnn_forward(p, np.zeros((5,2,3),np.float32), training=True, "
            "engine='numba'); ar.rnn_backward(r); print(t1-t, time.perf_counter()-t1)")
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONPATH=str(ROOT))
        for label in ("cold", "warm"):
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                  env=env)
            imp, first = (float(v) for v in done.stdout.split())
            out[label] = first
            out["import"] = imp
    return out


# -- report ----------------------------------------------------------------------------------------
def environment(threads: int, roofline: float, peak: float, ort_missing: str | None) -> list[str]:
    import numba
    import torch

    if ort_missing is None:
        import onnx
        import onnxruntime

        ort_line = f"onnxruntime {onnxruntime.__version__} (CPU EP), onnx {onnx.__version__}"
    else:
        ort_line = f"onnxruntime n/a: {ort_missing}"

    blas = [f"{d.get('internal_api')} {d.get('version')} ({d.get('architecture', '?')}, "
            f"{d.get('num_threads')} threads, {os.path.basename(d['filepath'])})"
            for d in threadpoolctl.threadpool_info() if d.get("user_api") == "blas"]
    env = {k: v for k, v in os.environ.items() if k.startswith(("OPENBLAS", "OMP_", "MKL_", "NUMBA_"))}
    return [
        f"- machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; {_cpu_model()}",
        f"- threads: {threads} (our BLAS via threadpoolctl; `torch.set_num_threads({threads})`; ORT "
        f"`intra_op_num_threads={threads}`, `inter_op_num_threads=1`, sequential, ORT_ENABLE_ALL)",
        f"- versions: python {platform.python_version()}, numpy {np.__version__}, numba {numba.__version__}, "
        f"torch {torch.__version__}, {ort_line}, arrayrnn {ar.__version__}",
        f"- BLAS loaded (threadpoolctl): {'; '.join(blas)}",
        f"- environment: {env or 'no OPENBLAS_/OMP_/MKL_/NUMBA_ variables'}",
        f"- GEMM roofline: {roofline / 1e9:.0f} GFLOP/s (best float32 square sgemm, NumPy's BLAS)",
        f"- numba engine SIMD variant: {simd_ir.VARIANT} (`ARRAYRNN_SIMD` overrides)",
        f"- FMA peak: {peak / 1e9:.0f} GFLOP/s with {threads} threads (bench/cpu_peak.py: independent "
        "register FMA chains, best of 5)",
    ]


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.platform()


def write_results(section: str) -> None:
    results_md.write_block(RESULTS, START, END, section)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny shapes, 3 pairs, no file")
    parser.add_argument("--write", action="store_true", help="write the table into bench/RESULTS.md")
    parser.add_argument("--pairs", type=int, default=None, help="alternated pairs per configuration (>= 7)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gap", type=float, default=None, help="seconds of sleep before every timed call")
    parser.add_argument("--shapes", default=None, help="comma-separated subset, e.g. S1,S3")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--engines", default=None, help="comma-separated subset of the available engines")
    parser.add_argument("--no-memory", action="store_true", help="skip the per-side memory subprocesses")
    parser.add_argument("--no-compile", action="store_true", help="skip the cold/warm numba compile timing")
    parser.add_argument("--chart", default=None, help="write the ratio chart (PNG) here; default "
                        "bench/rnn_ratios.png with --write")
    parser.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_child:
        print(json.dumps(memory_child(*json.loads(args.memory_child))))
        return

    import torch

    threads = args.threads
    threadpoolctl.threadpool_limits(threads)
    torch.set_num_threads(threads)
    pairs = args.pairs or (3 if args.quick else 7)
    gap = args.gap if args.gap is not None else (0.0 if args.quick else 0.2)
    shapes = QUICK_SHAPES if args.quick else SHAPES
    if args.shapes:
        shapes = tuple(s for s in SHAPES + QUICK_SHAPES if s.name in args.shapes.split(","))
    probe = ar.RNNSpec(mode="lstm", input_size=2, hidden_size=2)
    engines = [e for e in engines_for("cpu") if engine_unavailable_reason(e, probe_call(probe)) is None]
    engines = sorted(engines, key=lambda e: e != "numba")
    if args.engines:
        engines = [e for e in engines if e in args.engines.split(",")]
    gemm_n = 512 if args.quick else 2048
    roofline = gemm_roofline(threads, n=gemm_n)
    command = "python " + " ".join(shlex.quote(a) for a in ["bench/bench_rnn.py", *(argv or sys.argv[1:])])

    ort_missing = onnx_peer.onnxruntime_unavailable_reason()
    if ort_missing:
        print(f"ONNX Runtime columns n/a: {ort_missing}", flush=True)

    rows, mem_rows = [], []
    for mode in args.modes.split(","):
        for shape in shapes:
            case = Case(shape, mode)
            for engine in engines:
                diffs = case.max_abs_diff(engine, None if ort_missing else threads)
                for phase in PHASES:
                    row = time_row(case, engine, phase, threads, not ort_missing, pairs, gap, diffs)
                    rows.append(row)
                    print(progress_line(row), flush=True)
            if not args.no_memory:
                torch_mem = measure_memory("torch", shape, mode, "numba", threads)
                for engine in engines:
                    ours_mem = measure_memory("ours", shape, mode, engine, threads)
                    mem_rows.append((shape.name, mode, engine, ours_mem["tracemalloc_peak"],
                                     ours_mem["rss_peak_over_start"], torch_mem["rss_peak_over_start"]))
                    print(f"{shape.name} {mode} memory {engine}: tracemalloc "
                          f"{ours_mem['tracemalloc_peak'] / 2**20:.1f} MiB, RSS growth "
                          f"{ours_mem['rss_peak_over_start'] / 2**20:.1f} MiB; torch RSS growth "
                          f"{torch_mem['rss_peak_over_start'] / 2**20:.1f} MiB", flush=True)
    # the better of a measurement before and after the timings: on a shared machine one can land in a
    # slow moment (and give roofline fractions above 100%)
    roofline = max(roofline, gemm_roofline(threads, n=gemm_n))
    peak = 1e9 * cpu_peak.measure(threads, iters=200_000 if args.quick else 20_000_000)  # FLOP/s
    compile_info = compile_cost(threads) if "numba" in engines and not args.no_compile else None
    env_lines = environment(threads, roofline, peak, ort_missing)
    section = render(rows, mem_rows, compile_info, env_lines, command, pairs, gap, roofline, peak)
    print(section)
    if args.write and not args.quick:
        write_results(section)
        print(f"wrote {RESULTS.relative_to(ROOT)}")
    chart = args.chart or (str(CHART) if args.write and not args.quick else None)
    if chart:
        write_chart(rows, Path(chart))
        print(f"wrote {chart}")


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def progress_line(row: Row) -> str:
    note = f" (target <= {row.target})" if row.target else ""
    ort = "     n/a   " if row.ort is None else f"{row.ort * 1e3:8.2f} ms"
    return (f"{row.shape} {row.mode:4s} {row.phase:7s} {row.engine:9s} ours {row.ours * 1e3:8.2f} ms  torch "
            f"{row.torch * 1e3:8.2f} ms  ORT {ort}  "
            f"ours/torch {row.vs_torch:5.2f}  ours/ORT {_fmt(row.vs_ort, '5.2f')}  ours/faster "
            f"{row.vs_faster:5.2f}{note}")


def render(rows: list[Row], mem_rows, compile_info, env_lines, command, pairs, gap, roofline: float,
           peak: float) -> str:
    out = ["## RNN engines vs PyTorch CPU and ONNX Runtime (bench/SHAPES.md)", ""]
    out.append(f"Command: `{command}` (environment variables below)")
    out.append("")
    out.append(f"float32, time-major; {pairs} rounds per row, the sides' order rotated every round; "
               f"before each timed call a {gap} s pause and untimed calls of the same side for at least "
               f"{WARM_S} s; "
               "ms = medians, ratios = medians of per-round ratios (< 1: we are faster); vs faster = ours / "
               "the faster peer of the same round (forward: PyTorch or ONNX Runtime; train: PyTorch, ORT "
               "has no training), the ratio the target applies to (issue 15: forward <= 0.9, train <= 0.8, "
               "numba engine, S1-S5); roofline = FLOPs / best 2048^3 sgemm rate; peak = FLOPs / the FMA "
               "peak (bench/cpu_peak.py); `max|dy|` = largest "
               "difference of the forward outputs (same weights). train = forward + backward incl. dx. "
               "n/a: not run.")
    out.append("")
    out += env_lines
    out.append("")
    out.append("| shape | mode | phase | engine | ours ms | PyTorch ms | ORT ms | vs PyTorch | vs ORT "
               "| vs faster | target | met | ours roofline / peak | PyTorch roofline / peak "
               "| max\\|dy\\| PyTorch | max\\|dy\\| ORT |")
    out.append("|---" * 16 + "|")
    for r in rows:
        met = "" if r.met is None else ("yes" if r.met else "**no**")
        target = f"<= {r.target}" if r.target else ""
        out.append(f"| {r.shape} | {r.mode} | {r.phase} | {r.engine} | {r.ours * 1e3:.2f} | "
                   f"{r.torch * 1e3:.2f} | {_fmt(None if r.ort is None else r.ort * 1e3, '.2f')} | "
                   f"{r.vs_torch:.2f} | {_fmt(r.vs_ort, '.2f')} | {r.vs_faster:.2f} | {target} | {met} | "
                   f"{r.flops / r.ours / roofline:.0%} / {r.flops / r.ours / peak:.0%} | "
                   f"{r.flops / r.torch / roofline:.0%} / {r.flops / r.torch / peak:.0%} | "
                   f"{r.diff_torch:.1e} | {_fmt(r.diff_ort, '.1e')} |")
    if mem_rows:
        out += ["", "Peak memory of one training step, MiB (fresh subprocess per side, warmed up on a tiny "
                "case; RSS = growth of the peak RSS over the RSS before the step):", "",
                "| shape | mode | engine | ours tracemalloc | ours RSS | PyTorch RSS |",
                "|---|---|---|---|---|---|"]
        mib = 2.0 ** 20
        for s, mode, engine, tm, ro, rt in mem_rows:
            out.append(f"| {s} | {mode} | {engine} | {tm / mib:.1f} | {ro / mib:.1f} | {rt / mib:.1f} |")
    if compile_info:
        out += ["", "numba compile cost (float32 LSTM forward + backward, first call in a fresh process): "
                f"{compile_info['cold']:.1f} s with an empty cache, {compile_info['warm']:.2f} s with the "
                f"on-disk cache; `import arrayrnn` {compile_info['import']:.2f} s."]
    return "\n".join(out) + "\n"


def write_chart(rows: list[Row], path: Path) -> None:
    """Grouped bars of the target ratios (forward vs the faster peer, training vs PyTorch) per shape and
    mode, one panel per phase, a dashed line at each bar's target; numba rows (else the first engine)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    engine = "numba" if any(r.engine == "numba" for r in rows) else rows[0].engine
    rows = [r for r in rows if r.engine == engine]
    shapes = list(dict.fromkeys(r.shape for r in rows))
    modes = list(dict.fromkeys(r.mode for r in rows))
    titles = {"forward": "forward: ours / faster of PyTorch, ONNX Runtime",
              "train": "training step: ours / PyTorch"}
    fig, axes = plt.subplots(1, len(PHASES), figsize=(6 * len(PHASES), 4.2), squeeze=False)
    width = 0.8 / max(len(modes), 1)
    for ax, phase in zip(axes[0], PHASES, strict=True):
        for k, mode in enumerate(modes):
            cells = {r.shape: r for r in rows if r.phase == phase and r.mode == mode}
            xs = [i + (k - (len(modes) - 1) / 2) * width for i, s in enumerate(shapes) if s in cells]
            picked = [cells[s] for s in shapes if s in cells]
            bars = ax.bar(xs, [r.vs_faster for r in picked], width, label=mode.upper())
            ax.bar_label(bars, fmt="%.2f", fontsize=7)
            for x, r in zip(xs, picked, strict=True):
                if r.target is not None:
                    ax.hlines(r.target, x - width / 2, x + width / 2, colors="black", linestyles="dashed")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xticks(range(len(shapes)), shapes)
        ax.set_title(titles[phase], fontsize=10)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("time ratio (< 1: arrayrnn faster)")
    fig.suptitle(f"arrayrnn ({engine} engine) vs peers, float32 CPU; dashed: target, grey: parity",
                 fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
