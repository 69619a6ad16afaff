"""Host microseconds per call of the GPU engines, measured on a CPU, beside the Python part of
``torch.nn.LSTM/GRU.forward`` in the same run.

A GPU call's cost on a small shape is host work: Python, argument checks, descriptor work, launches. This
measures it without a GPU, for the cudnn engine (and the cupy engine's rows from ``bench/gpu_host_cupy.py``
where that file exists):

- ours: ``rnn_forward`` (``training=False``) and a training step (``rnn_forward(training=True)`` +
  ``rnn_backward``) with ``engine="cudnn"`` on the tests' NumPy-backed CuPy stand-in
  (``tests/support/fake_cupy.py``). cuDNN's real host code makes the plan (descriptors and size queries, with
  a fake handle, once per shape, untimed); the three compute calls are a C function ``int f() { return 0; }``
  compiled here (gcc) and called through cudnn_bindings' ctypes prototypes, as the real ones would be. The
  stand-in's array arithmetic runs on the host; its time is measured and SUBTRACTED (on a GPU an array
  operation costs its launch, not its arithmetic), its Python dispatch is kept as the stand-in for CuPy's;
  a custom kernel (the weight fingerprint) is one stub launch. The wrapper that times each operation costs
  about a microsecond outside the interval it records; it is measured at the start (printed) and taken
  off per operation too.
- peer: ``torch.nn.LSTM/GRU.forward`` on CPU tensors of the same shapes with ``torch._VF.lstm/gru``
  replaced by a function returning preallocated outputs: the module's Python part (argument checks,
  ``hx`` zeros, the call), under ``torch.no_grad()`` for the forward rows and with grad enabled for the
  training rows (PyTorch's backward is C++; the issue's target compares our step with this forward).

Times are the calling thread's CPU time (``time.thread_time``), so other processes on a shared machine
do not count; each row is the median over ``--rounds`` rounds of the mean of ``--calls`` calls, ours and
the peer alternated per round. A slow or busy VM inflates both sides; the ratio is what to compare.

    python bench/bench_gpu_host.py [--rounds 9] [--calls 200] [--out results.json]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib.util
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import numpy as np  # noqa: E402

import arrayrnn as ar  # noqa: E402
import cudnn_bindings as cb  # noqa: E402
from cudnn_bindings import _lib  # noqa: E402

SHAPES = {"S1": (100, 64, 256, 256), "S3": (200, 1, 64, 128)}  # T, B, I, H (bench/SHAPES.md)
MODES = ("lstm", "gru")
STUBBED = ("cudnnRNNForward", "cudnnRNNBackwardData_v8", "cudnnRNNBackwardWeights_v8", "cudnnSetStream")


# -- cuDNN's compute calls as C stubs --------------------------------------------------------------------
def _stub_library() -> ctypes.CDLL:
    """A shared library whose functions named in STUBBED return 0 (compiled with gcc into a temp dir)."""
    folder = Path(tempfile.mkdtemp(prefix="arrayrnn-stub-"))
    source = folder / "stub.c"
    source.write_text("".join(f"int {name}() {{ return 0; }}\n" for name in STUBBED))
    library = folder / "libstub.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return ctypes.CDLL(str(library))


@contextlib.contextmanager
def stubbed_compute() -> Iterator[None]:
    """cudnn_bindings finds the C stubs (with cuDNN's prototypes) for the compute calls and cudnnSetStream."""
    stub, real = _stub_library(), _lib.function

    def function(name: str):
        if name not in STUBBED:
            return real(name)
        fn = getattr(stub, name)
        fn.restype, fn.argtypes = cb.prototypes.PROTOTYPES[name][0], list(cb.prototypes.PROTOTYPES[name][1])
        return fn

    _lib.function = function
    try:
        yield
    finally:
        _lib.function = real


# -- the stand-in's arithmetic, timed so that it can be subtracted -------------------------------------------
class Arithmetic:
    """Seconds the stand-in CuPy spent in NumPy arithmetic (and the count of its operations), and what the
    timing wrapper itself costs per operation outside the interval it records (``overhead``, measured by
    :meth:`calibrate`): the bench's instrument, not ours, so :func:`_mean_us` takes it off too."""

    def __init__(self) -> None:
        self.seconds, self.ops, self.overhead = 0.0, 0, 0.0

    def timing(self, fn: Callable) -> Callable:
        """``fn`` with its time added to ``seconds`` and counted in ``ops``."""
        def run(*args, **kwargs):
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.thread_time() - start
                self.ops += 1
        return run

    def calibrate(self, calls: int = 20000, rounds: int = 5) -> float:
        """Seconds per call that :meth:`timing`'s wrapper adds beyond the interval it records: the median
        over ``rounds`` of (a wrapped no-op's time - the recorded time - a bare no-op's time)."""
        def noop(*args, **kwargs):
            return None

        wrapped, samples = self.timing(noop), []
        seconds, ops = self.seconds, self.ops
        for _ in range(rounds):
            before, start = self.seconds, time.thread_time()
            for _ in range(calls):
                wrapped(1, x=2)
            outside = time.thread_time() - start - (self.seconds - before)
            start = time.thread_time()
            for _ in range(calls):
                noop(1, x=2)
            samples.append((outside - (time.thread_time() - start)) / calls)
        self.seconds, self.ops = seconds, ops
        self.overhead = max(0.0, statistics.median(samples))
        return self.overhead

    @contextlib.contextmanager
    def timed(self, fake: types.ModuleType) -> Iterator[None]:
        saved = {name: getattr(fake, name) for name in ("_call", "_poisoned")}
        saved_items = (fake.ndarray.__getitem__, fake.ndarray.__setitem__)
        saved_module = {name: getattr(fake.MODULE, name) for name in ("asarray", "array")}
        timing = self.timing

        def call(func, args, kwargs):  # fake_cupy._call with only the NumPy function timed
            outs = kwargs.get("out")
            result = timing(func)(*fake._unwrap(args), **{k: fake._unwrap(v) for k, v in kwargs.items()})
            if isinstance(outs, fake.ndarray):
                return outs
            if isinstance(outs, tuple) and all(isinstance(o, fake.ndarray) for o in outs):
                return outs if len(outs) > 1 else outs[0]
            return fake._wrap(result)

        fake._call, fake._poisoned = call, timing(saved["_poisoned"])
        fake.ndarray.__getitem__, fake.ndarray.__setitem__ = map(timing, saved_items)
        for name, fn in saved_module.items():
            setattr(fake.MODULE, name, timing(fn))
        fake.MODULE.RawKernel = lambda code, name: (lambda grid, block, args: None)  # one stub launch
        try:
            yield
        finally:
            fake._call, fake._poisoned = saved["_call"], saved["_poisoned"]
            fake.ndarray.__getitem__, fake.ndarray.__setitem__ = saved_items
            for name, fn in saved_module.items():
                setattr(fake.MODULE, name, fn)
            del fake.MODULE.RawKernel


@contextlib.contextmanager
def pooled(fake: types.ModuleType) -> Iterator[None]:
    """The stand-in's fresh arrays come from a pool, like CuPy's: a wrapper that dies holding the only
    reference to its buffer returns the buffer (freeing tens of megabytes to the OS per call is a cost of
    the stand-in, not of a GPU, whose pool keeps them). The arrays' contents are never read here."""
    free: dict[tuple, list[np.ndarray]] = {}
    made = fake._poisoned

    def key(shape: Any, dtype: Any, order: str) -> tuple:
        dims = tuple(shape) if isinstance(shape, tuple | list) else (int(shape),)
        return dims, np.dtype(dtype).str, order

    def poisoned(shape: Any, dtype: Any, order: str = "C") -> np.ndarray:
        stack = free.get(key(shape, dtype, order))
        return stack.pop() if stack else made(shape, dtype, order)

    def release(self) -> None:
        a = self._a
        if a.base is None and sys.getrefcount(a) <= 3:  # self._a, a, the call's argument
            stack = free.setdefault(key(a.shape, a.dtype, "C" if a.flags.c_contiguous else "F"), [])
            if len(stack) < 8:
                stack.append(a)

    copy = fake.MODULE.array

    def array(obj: Any, dtype: Any = None, copy_: bool = True, order: str = "K", ndmin: int = 0, **kw: Any):
        if isinstance(obj, fake.ndarray) and dtype is None and ndmin == 0 and kw.get("copy", copy_):
            out = poisoned(obj.shape, obj.dtype, "C")
            np.copyto(out, obj._a)
            return fake.ndarray._of(out)
        return copy(obj, dtype, kw.get("copy", copy_), order, ndmin)

    fake._poisoned, fake.ndarray.__del__, fake.MODULE.array = poisoned, release, array
    try:
        yield
    finally:
        fake._poisoned, fake.MODULE.array = made, copy
        del fake.ndarray.__del__


def _bench_bindings() -> types.ModuleType:
    """The dry run's bindings (fake handle; plans' size queries validated by real cuDNN in a child), but
    with real prepared compute calls, which reach the C stubs."""
    from support import cudnn_dry_run

    class StubbedCompute(cudnn_dry_run.DryRunBindings):
        prepare_forward = staticmethod(cb.prepare_forward)
        prepare_backward_data = staticmethod(cb.prepare_backward_data)
        prepare_backward_weights = staticmethod(cb.prepare_backward_weights)
        # the typed calls too (the engine before its plans made them on every call)
        forward = staticmethod(cb.forward)
        backward_data = staticmethod(cb.backward_data)
        backward_weights = staticmethod(cb.backward_weights)

        def temp_space_sizes(self, handle, rnn_desc, x_desc, fwd_mode=cb.ForwardMode.TRAINING):
            """cuDNN's answer (the dry run asks real cuDNN in a child once per configuration), then a dict
            lookup standing in for the host call (the dry run's own lookup reads both descriptors back)."""
            key = (int(getattr(rnn_desc, "ptr", rnn_desc)), x_desc.ptr, x_desc.config.seq_lengths.tobytes(),
                   int(fwd_mode))
            if key not in sizes:
                sizes[key] = super().temp_space_sizes(handle, rnn_desc, x_desc, fwd_mode)
            return sizes[key]

    sizes: dict[tuple, tuple[int, int]] = {}
    return StubbedCompute()


# -- one row ---------------------------------------------------------------------------------------------
def _ours(cp, mode: str, shape: tuple, training: bool, lengths: list[np.ndarray] | None = None
          ) -> Callable[[], None]:
    """A call of ours; ``lengths``: each call takes the next of these (cycling), else every row is full."""
    t, b, i, h = shape
    spec = ar.RNNSpec(mode=mode, input_size=i, hidden_size=h)
    params = ar.PackedParams.init(spec, seed=0, xp=cp).to_format("cudnn")
    x = cp.asarray(np.random.default_rng(0).standard_normal((t, b, i)).astype(np.float32))
    dy = cp.ones((t, b, h), np.float32)
    cycle = itertools.cycle(lengths or [None])

    def forward() -> None:
        ar.rnn_forward(params, x, next(cycle), engine="cudnn")

    def step() -> None:
        ar.rnn_backward(ar.rnn_forward(params, x, next(cycle), training=True, engine="cudnn"), dy)

    return step if training else forward


def _padded_lengths(count: int, shape: tuple, seed: int = 1) -> list[np.ndarray]:
    """``count`` distinct lengths of ``shape``'s batch, each with rows shorter than T."""
    t, b = shape[:2]
    rng = np.random.default_rng(seed)
    return [np.concatenate([[t], rng.integers(t // 2, t, b - 1)]) for _ in range(count)]


@contextlib.contextmanager
def torch_without_vf() -> Iterator[None]:
    """``torch.nn.modules.rnn._VF`` answering every call with preallocated outputs of the right shapes."""
    import torch
    from torch.nn.modules import rnn as torch_rnn

    outputs: dict[tuple, torch.Tensor] = {}

    def answer(x, hx, *rest):
        h = hx[0] if isinstance(hx, tuple) else hx
        key = (tuple(x.shape), h.shape[-1])
        if key not in outputs:
            outputs[key] = torch.empty(x.shape[:-1] + (h.shape[-1],))
        return (outputs[key], *hx) if isinstance(hx, tuple) else (outputs[key], hx)

    saved = torch_rnn._VF
    torch_rnn._VF = types.SimpleNamespace(lstm=answer, gru=answer)
    try:
        yield
    finally:
        torch_rnn._VF = saved


def _theirs(mode: str, shape: tuple, training: bool) -> Callable[[], None]:
    import torch

    t, b, i, h = shape
    module = (torch.nn.LSTM if mode == "lstm" else torch.nn.GRU)(i, h)
    x = torch.randn(t, b, i)
    if training:
        return lambda: module(x)

    def forward() -> None:
        with torch.no_grad():
            module(x)

    return forward


def _mean_us(fn: Callable[[], None], calls: int, arithmetic: Arithmetic | None = None) -> float:
    """Mean thread microseconds of ``fn()``, less the stand-in's arithmetic and the timing wrapper's own cost
    per operation (``arithmetic.overhead``)."""
    before, ops = (arithmetic.seconds, arithmetic.ops) if arithmetic else (0.0, 0)
    start = time.thread_time()
    for _ in range(calls):
        fn()
    spent = time.thread_time() - start
    if arithmetic:
        spent -= arithmetic.seconds - before + (arithmetic.ops - ops) * arithmetic.overhead
    return spent / calls * 1e6


def _row(cp, fake: types.ModuleType, arithmetic: Arithmetic, mode: str, name: str, what: str, rounds: int,
         calls: int) -> dict:
    training = what == "train_step"
    ours, theirs = _ours(cp, mode, SHAPES[name], training), _theirs(mode, SHAPES[name], training)
    ours(), theirs()  # the plan, the index map, torch's first call
    ours_us, theirs_us, ops = [], [], []
    with pooled(fake), arithmetic.timed(fake):
        for _ in range(rounds):
            ops_before = arithmetic.ops
            ours_us.append(_mean_us(ours, calls, arithmetic))
            ops.append((arithmetic.ops - ops_before) / calls)
            theirs_us.append(_mean_us(theirs, calls))
    row = dict(engine="cudnn", mode=mode, shape=name, what=what, ours_us=statistics.median(ours_us),
               torch_us=statistics.median(theirs_us), array_ops=statistics.median(ops))
    row["ratio"] = row["ours_us"] / row["torch_us"]
    return row


def _lengths_row(cp, fake: types.ModuleType, arithmetic: Arithmetic, mode: str, name: str, what: str,
                 rounds: int, calls: int) -> dict:
    """Padded calls whose lengths change under one shape (two alternating, and new ones every call: more
    than the 64 the engine keeps device copies of), against the same padded lengths every call."""
    training, shape = what == "train_step", SHAPES[name]
    fresh = _padded_lengths(max(calls, 65), shape)
    paths = {"same": _ours(cp, mode, shape, training, fresh[:1]),
             "two alternating": _ours(cp, mode, shape, training, fresh[:2]),
             "new every call": _ours(cp, mode, shape, training, fresh)}
    for path in paths.values():  # the plan, then every lengths' first call (the dry run's size queries)
        for _ in range(len(fresh)):
            path()
    times: dict[str, list[float]] = {key: [] for key in paths}
    with pooled(fake), arithmetic.timed(fake):
        for _ in range(rounds):
            for key, path in paths.items():
                times[key].append(_mean_us(path, calls, arithmetic))
    row = dict(engine="cudnn", mode=mode, shape=name, what=f"{what}, lengths changing",
               **{f"{key} us": statistics.median(t) for key, t in times.items()})
    row["ratio"] = max(row["two alternating us"], row["new every call us"]) / row["same us"]
    return row


def _calibrated() -> Arithmetic:
    arithmetic = Arithmetic()
    overhead_us = arithmetic.calibrate() * 1e6
    print(f"the timing wrapper's own cost, taken off ours per array operation: {overhead_us:.2f} us")
    return arithmetic


def measure_lengths(rounds: int, calls: int) -> list[dict]:
    from support import cudnn_dry_run, fake_cupy

    rows, arithmetic = [], _calibrated()
    with stubbed_compute(), cudnn_dry_run.installed(_bench_bindings()) as cp:
        for mode in MODES:
            for what in ("forward", "train_step"):
                row = _lengths_row(cp, fake_cupy, arithmetic, mode, "S1", what, rounds, calls)
                rows.append(row)
                print(f"cudnn {mode:4s} S1 {what:10s} padded: same lengths {row['same us']:7.1f} us, two "
                      f"alternating {row['two alternating us']:7.1f}, new every call "
                      f"{row['new every call us']:7.1f} (ratio {row['ratio']:.2f})", flush=True)
    return rows


def measure(rounds: int, calls: int) -> list[dict]:
    from support import cudnn_dry_run, fake_cupy

    rows, arithmetic = [], _calibrated()
    with stubbed_compute(), cudnn_dry_run.installed(_bench_bindings()) as cp, torch_without_vf():
        for name in SHAPES:
            for mode in MODES:
                for what in ("forward", "train_step"):
                    row = _row(cp, fake_cupy, arithmetic, mode, name, what, rounds, calls)
                    rows.append(row)
                    print(f"cudnn {mode:4s} {name} {what:10s} ours {row['ours_us']:7.1f} us  torch's Python "
                          f"{row['torch_us']:6.1f} us  ratio {row['ratio']:.2f}  ({row['array_ops']:.0f} "
                          "array ops per call)", flush=True)
    return rows


def _cupy_rows(quick: bool) -> list[dict]:
    """The cupy engine's rows (bench/gpu_host_cupy.py), where that file exists."""
    path = Path(__file__).with_name("gpu_host_cupy.py")
    if not path.exists():
        return []
    spec = importlib.util.spec_from_file_location("gpu_host_cupy", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.rows(quick)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="3 rounds of 20 calls (a smoke run)")
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    rounds, calls = (3, 20) if args.quick else (args.rounds, args.calls)
    rows = measure(rounds, calls) + measure_lengths(rounds, calls)
    for row in _cupy_rows(args.quick):
        rows.append(row)
        print(f"{row['engine']:34s} {row['mode']:4s} {row['shape']} {row['what']:10s} ours "
              f"{row['us_per_call']:7.1f} us ({row['us_per_step']:.1f} per step, {row['cupy_ops']} CuPy ops)",
              flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
