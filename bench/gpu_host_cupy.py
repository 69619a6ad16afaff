"""Host time of the cupy engine on a CPU: before (numba-cuda's dispatcher, one launch per kernel per step) and
after (arguments packed once; each time loop step by step, or replayed as one CUDA graph).

No GPU is needed or used: CuPy is the project's NumPy-backed stand-in (tests/support/fake_cupy.py) and only
the final call to the GPU is stubbed on each path:

- ``cupy@<rev>``, with ``--before REV``: the engine as it was at that git revision, on this tree's other
  modules (a revision from after the GPU wings' move, 41186e2; issue 33's own "before", 9068b53, launched
  through numba-cuda's real dispatcher and no longer runs here: its table is in bench/RESULTS.md);
  numba-cuda's context, device and module load answered by stubs, ``cuda.core.launch`` a no-op;
- ``cupy (step by step)``: this tree with ``cuda_graphs.use_graphs = False`` (what a shape's first call, or
  every call of ever-changing lengths, costs); ``cuLaunchKernel`` a no-op;
- ``cupy (graph)``: this tree from a shape's third call on (its loops replayed as graphs); the graph launch
  a no-op.

Sizes are tiny (B = 2, I = H = 8) so that the stand-in's NumPy work, which plays the GPU, is negligible;
host work does not depend on them. The stand-in's operations cost ~1-3 us of host time each where CuPy's
cost ~5-30 us (a matmul the most), so every row also gives ``cupy_ops``: the CuPy operations a call issues
(copies, GEMMs, elementwise kernels, graph launches) and ``kernel_launches``: our kernels launched from the
host; real host time ~ ``us_per_call`` + ``cupy_ops`` x (CuPy's cost per operation - the stand-in's).
``loop_us_per_call`` is the part spent in the direction kernels' time loops (what issue 33 targets), the rest
is the frontend and the stack driver. Times are the calling thread's CPU time (``time.thread_time``, as
bench_gpu_host.py's), so other processes on a shared machine do not count; medians of ``--rounds`` calls
(at least 7).

    python bench/gpu_host_cupy.py [--quick] [--rounds 9] [--before REV]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import numpy as np  # noqa: E402
from support import fake_cupy  # noqa: E402

import arrayrnn as ar  # noqa: E402
from arrayrnn.engines import register_engine, unregister_engine  # noqa: E402
from arrayrnn.engines.cupy import graphs as cuda_graphs  # noqa: E402
from arrayrnn.engines.cupy import launch as cuda_launch  # noqa: E402
from arrayrnn.engines.cupy.engine import ENGINE  # noqa: E402

SHAPES = {"S1": 100, "S3": 200}  # bench_gpu.py's S1 and S3 lengths; 1 layer, unidirectional
B, I, H = 2, 8, 8


# -- the paths ----------------------------------------------------------------------------------------
class _NoDriver(cuda_launch.Driver):
    """cuda_launch's driver calls without a GPU: modules are tokens, launches counted, not made."""

    def __init__(self) -> None:
        self.launches = 0

    def load_module(self, image: bytes) -> object:
        return object()

    def get_function(self, module: object, name: str) -> str:
        return name

    def unload_module(self, module: object) -> None:
        return None

    def launch(self, function: Any, blocks: int, threads: int, stream: int, params: int) -> None:
        self.launches += 1


@contextlib.contextmanager
def _after(graphs: bool) -> Iterator[tuple[str, Any, Callable[[], int]]]:
    """This tree's engine, its driver calls and graph launches stubbed: (engine name, kernel, launches)."""
    driver = _NoDriver()
    saved = cuda_launch.use_driver(driver), cuda_graphs.use_graphs, fake_cupy.REPLAY_GRAPHS
    cuda_graphs.use_graphs, fake_cupy.REPLAY_GRAPHS = graphs, False
    # the guard's weight fingerprint: one stub launch, as on a GPU (the stand-in has no RawKernel and would
    # run its NumPy fallback, a dozen array operations over the whole buffer)
    fake_cupy.MODULE.RawKernel = lambda code, name: (lambda grid, block, args: None)
    ENGINE.kernel.graphs.clear()
    try:
        yield "cupy", ENGINE.kernel, lambda: driver.launches
    finally:
        ENGINE.kernel.graphs.clear()
        del fake_cupy.MODULE.RawKernel
        cuda_launch.use_driver(saved[0])
        cuda_graphs.use_graphs, fake_cupy.REPLAY_GRAPHS = saved[1:]


def _engine_at(rev: str) -> types.ModuleType:
    """arrayrnn/engines/cupy/engine.py as it was at ``rev``, on this tree's other engine modules (``rev`` from
    after the GPU wings' move: before it the file was arrayrnn/engines/cupy_engine.py, beside siblings of
    other names)."""
    shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:arrayrnn/engines/cupy/engine.py"],
                           capture_output=True, text=True)
    if shown.returncode:
        raise ValueError(f"--before {rev}: git has no arrayrnn/engines/cupy/engine.py at that revision "
                         f"({shown.stderr.strip()}); give one from after the GPU wings' move (41186e2)")
    source = shown.stdout
    module = types.ModuleType("arrayrnn.engines.cupy._engine_before")
    module.__package__ = "arrayrnn.engines.cupy"
    exec(compile(source, f"cupy/engine.py@{rev}", "exec"), module.__dict__)
    return module


class _StubModule:
    initialized = True

    def get_function(self, name: str) -> Any:
        return types.SimpleNamespace(kernel=object(), name=name, module=self)


class _StubContext:
    """numba-cuda's CUDA context where no driver is: streams and module loads answered, nothing run."""

    device = types.SimpleNamespace(id=0, compute_capability=(9, 0))

    def create_external_stream(self, ptr: int) -> Any:
        from numba.cuda.cudadrv import driver

        return driver.Stream(driver.binding.CUstream(ptr), external=True)

    def create_module_image(self, image: Any, setup: Any = None, teardown: Any = None) -> _StubModule:
        return _StubModule()


@contextlib.contextmanager
def _numba_without_a_gpu() -> Iterator[Callable[[], int]]:
    """numba-cuda 0.30's launch path with only what needs a driver stubbed (the context, the device, the
    module load and ``cuda.core.launch``); yields the count of launches."""
    from numba.cuda import api, dispatcher
    from numba.cuda.cudadrv import devices

    context, launches = _StubContext(), []
    patches = [(api, "current_context", lambda: context),
               (devices, "get_context", lambda devnum=None: context),
               (devices._runtime, "ensure_context", contextlib.nullcontext),
               (dispatcher, "get_current_device", lambda: context.device),
               (dispatcher, "launch", lambda stream, config, kernel, *args: launches.append(len(args)))]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    for obj, name, value in patches:
        setattr(obj, name, value)
    try:
        yield lambda: len(launches)
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)


@contextlib.contextmanager
def _before(rev: str) -> Iterator[tuple[str, Any, Callable[[], int]]]:
    engine = _engine_at(rev).CupyEngine()
    with _numba_without_a_gpu() as launches:
        register_engine("cupy_before", engine, devices=("gpu",))
        try:
            yield "cupy_before", engine.kernel, launches
        finally:
            unregister_engine("cupy_before")


# -- timing ---------------------------------------------------------------------------------------
class _LoopClock:
    """Time spent inside a direction kernel's ``forward`` / ``backward`` (the time loops)."""

    def __init__(self, kernel: Any):
        self.kernel, self.seconds = kernel, 0.0

    def __enter__(self) -> _LoopClock:
        for name in ("forward", "backward"):
            setattr(self.kernel, name, self._timed(getattr(self.kernel, name)))
        return self

    def __exit__(self, *exc: object) -> None:
        for name in ("forward", "backward"):
            delattr(self.kernel, name)

    def _timed(self, method: Callable) -> Callable:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds += time.thread_time() - start

        return timed


def _call(cupy: Any, engine: str, mode: str, T: int, what: str) -> Callable[[], None]:
    spec = ar.RNNSpec(mode=mode, input_size=I, hidden_size=H, dtype="float32")
    params = ar.PackedParams.init(spec, seed=0, xp=cupy)
    rng = np.random.default_rng(0)
    x = cupy.asarray(rng.standard_normal((T, B, I)).astype(np.float32))
    dy = cupy.asarray(rng.standard_normal((T, B, H)).astype(np.float32))
    if what == "forward":
        return lambda: ar.rnn_forward(params, x, engine=engine)
    return lambda: ar.rnn_backward(ar.rnn_forward(params, x, training=True, engine=engine), dy=dy)


def _measure(call: Callable[[], None], kernel: Any, launches: Callable[[], int], rounds: int) -> dict:
    for _ in range(3):  # step by step, captured, replayed (and numba's compiles)
        call()
    times, loops = [], []
    for _ in range(rounds):
        with _LoopClock(kernel) as clock:
            start = time.thread_time()
            call()
            times.append(time.thread_time() - start)
        loops.append(clock.seconds)
    before = launches()
    with fake_cupy.issued() as log:
        call()
    return {"us_per_call": 1e6 * statistics.median(times), "loop_us_per_call": 1e6 * statistics.median(loops),
            "cupy_ops": len(log), "kernel_launches": launches() - before}


def rows(quick: bool, rounds: int = 7, before: str | None = None) -> list[dict]:
    """Host time per call and per step of the cupy engine's paths (see the module docstring); the engine at
    git revision ``before`` too, if given."""
    rounds = max(rounds, 7)
    paths = {"cupy (step by step)": lambda: _after(graphs=False), "cupy (graph)": lambda: _after(graphs=True)}
    if before is not None:
        paths = {f"cupy@{before}": lambda: _before(before), **paths}
    modes = ("lstm",) if quick else ("lstm", "gru")
    out = []
    with fake_cupy.installed() as cupy, cupy.cuda.Stream(), np.errstate(all="ignore"):
        for label, path in paths.items():
            with path() as (engine, kernel, launches):
                for mode in modes:
                    for shape, T in SHAPES.items():
                        for what in ("forward", "train_step"):
                            r = _measure(_call(cupy, engine, mode, T, what), kernel, launches, rounds)
                            out.append({"engine": label, "mode": mode, "shape": shape, "what": what,
                                        "steps": T, **r, "us_per_step": r["us_per_call"] / T,
                                        "loop_us_per_step": r["loop_us_per_call"] / T})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="LSTM only")
    parser.add_argument("--rounds", type=int, default=7, help="timed calls per row (at least 7)")
    parser.add_argument("--before", default=None,
                        help="also the engine at this git revision (from after the GPU wings' move, 41186e2)")
    args = parser.parse_args(argv)
    rounds = max(args.rounds, 7)
    print(f"host time per call, CPU, CuPy stand-in, B={B} I={I} H={H}, float32, median of {rounds}")
    print(f"{'engine':34s} {'mode':4s} {'shape':5s} {'what':10s} {'us/call':>9s} {'us/step':>8s} "
          f"{'loop us/call':>12s} {'loop us/step':>12s} {'cupy ops':>8s} {'launches':>8s}")
    for r in rows(args.quick, args.rounds, args.before):
        print(f"{r['engine']:34s} {r['mode']:4s} {r['shape']:5s} {r['what']:10s} {r['us_per_call']:9.0f} "
              f"{r['us_per_step']:8.1f} {r['loop_us_per_call']:12.0f} {r['loop_us_per_step']:12.1f} "
              f"{r['cupy_ops']:8d} {r['kernel_launches']:8d}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
