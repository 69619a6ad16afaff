"""GPU probe (issue 44): every GPU path once, against the reference engine, in about a minute.

`.ci/gpu` runs it first, so that a device call that ends early still says which paths work. Each check runs
on its own (a failure is recorded and the next check runs) and its result is written to ``--out`` (JSON
lines) as soon as it ends:

- ``cudnn``: for LSTM and GRU, every algorithm of ``cudnn_config.ALGOS`` and ``"auto"``, an inference
  forward and a training step (forward + backward) against the reference engine on the host, with the
  algorithm that ran and why (a persistent algorithm cuDNN refuses runs STANDARD and says so);
- ``cupy``: LSTM and GRU (plain, and with recurrent dropout + zoneout) three calls of one shape with new
  inputs: step by step, captured, replayed, each against the reference, with the graphs kept;
- ``guard``: on both engines, a backward after an inference forward raises when ``params.data`` was written
  in between and does not when it was not.

Semantics of one check, roughly::

    got = engine(params.to(cupy), x.to(cupy)); want = reference(params, x)
    record(name, ok=allclose(got, want), detail)

    python bench/gpu_probe.py [--out probe.jsonl]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import arrayrnn as ar  # noqa: E402
from arrayrnn.frontend import guard  # noqa: E402

T, B, I, H = 6, 4, 8, 16  # small: a check costs its compile and launches, not arithmetic
RTOL, ATOL = 1e-4, 1e-5   # float32 (cuDNN's and the reference engine's sums in other orders)
CELLS = {"plain": {}, "rdrop+zoneout": {"recurrent_dropout": 0.25, "zoneout": 0.1}}


class Report:
    """Results as JSON lines, each written (and flushed) when its check ends."""

    def __init__(self, path: Path | None) -> None:
        self.rows: list[dict] = []
        self._file = path.open("w") if path else None

    def check(self, name: str, run: Callable[[], str]) -> None:
        start = time.perf_counter()
        try:
            row = dict(check=name, ok=True, detail=run())
        except Exception as err:  # recorded, the next check runs
            row = dict(check=name, ok=False, detail=f"{type(err).__name__}: {err}",
                       where=traceback.format_exc(limit=-3))
        row["seconds"] = round(time.perf_counter() - start, 2)
        self.rows.append(row)
        print(f"{'ok  ' if row['ok'] else 'FAIL'} {name:45s} {row['seconds']:6.2f} s  {row['detail']}",
              flush=True)
        if self._file:
            self._file.write(json.dumps(row) + "\n")
            self._file.flush()


def _case(cp: Any, mode: str, seed: int, **options: Any):
    rng = np.random.default_rng(seed)
    spec = ar.RNNSpec(mode=mode, input_size=I, hidden_size=H, **options)
    params = ar.PackedParams.init(spec, seed=seed)
    x = rng.standard_normal((T, B, I)).astype(np.float32)
    dy = rng.standard_normal((T, B, H)).astype(np.float32)
    return params, x, dy, (params.to(cp), cp.asarray(x), cp.asarray(dy))


def _compare(got: Any, want: Any, what: str) -> float:
    got = got.get() if hasattr(got, "get") else np.asarray(got)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=what)
    return float(np.max(np.abs(got - want))) if want.size else 0.0


def _step(params: Any, x: Any, dy: Any, engine: str, seed: int) -> tuple:
    res = ar.rnn_forward(params, x, training=True, engine=engine, seed=seed)
    return res, ar.rnn_backward(res, dy)


def _agrees(cp: Any, engine: str, mode: str, seed: int, params_of: Callable = lambda p: p,
            **options: Any) -> float:
    """Largest difference of a training step (y, h_n, dx, dparams) from the reference engine's."""
    params, x, dy, (dparams_gpu, x_gpu, dy_gpu) = _case(cp, mode, seed, **options)
    got_res, got = _step(params_of(dparams_gpu), x_gpu, dy_gpu, engine, seed)
    want_res, want = _step(params, x, dy, "reference", seed)
    dparams = got.dparams.to_format("canonical").data
    return max(_compare(got_res.y, want_res.y, "y"), _compare(got_res.h_n, want_res.h_n, "h_n"),
               _compare(got.dx, want.dx, "dx"), _compare(dparams, want.dparams.data, "dparams"))


# -- cudnn ------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _algo(name: str) -> Iterator[None]:
    from arrayrnn.engines.cudnn import config as cudnn_config

    saved = cudnn_config.algo
    cudnn_config.algo = name
    try:
        yield
    finally:
        cudnn_config.algo = saved


def cudnn_checks(report: Report, cp: Any) -> None:
    from arrayrnn.engines.cudnn import config as cudnn_config
    from arrayrnn.engines.cudnn.engine import ENGINE

    for mode in ("lstm", "gru"):
        for algo in ("auto", *cudnn_config.ALGOS):
            def run(mode: str = mode, algo: str = algo) -> str:
                with _algo(algo):
                    ENGINE.plans.clear()
                    params, x, _, (gpu_params, x_gpu, _) = _case(cp, mode, 1)
                    native = gpu_params.to_format("cudnn")
                    err = _compare(ar.rnn_forward(native, x_gpu, engine="cudnn").y,
                                   ar.rnn_forward(params, x, engine="reference").y, "inference y")
                    err = max(err, _agrees(cp, "cudnn", mode, 1, lambda p: p.to_format("cudnn")))
                    lengths = np.full(B, T)
                    ran = {what: ENGINE.plan_for(native, x_gpu, lengths, False, training).algo
                           for what, training in (("inference", False), ("training", True))}
                    notes = ENGINE.plan_for(native, x_gpu, lengths, False, True).segments[0].note
                return f"ran {ran}; max diff {err:.2e}; training plan: {notes}"

            report.check(f"cudnn {mode} algo={algo}", run)


# -- cupy -------------------------------------------------------------------------------------------
def cupy_checks(report: Report, cp: Any) -> None:
    from arrayrnn.engines.cupy.engine import ENGINE

    for mode in ("lstm", "gru"):
        for cell, options in CELLS.items():
            def run(mode: str = mode, options: dict = options) -> str:
                ENGINE.kernel.graphs.clear()
                errs = [_agrees(cp, "cupy", mode, seed, **options) for seed in range(3)]
                kept = len(ENGINE.kernel.graphs.graphs())
                if kept == 0:
                    raise AssertionError("no graph was captured by the third call")
                return (f"step by step / captured / replayed: max diff {max(errs):.2e}; {kept} graphs, "
                        f"{ENGINE.kernel.graphs.held() / 2**20:.1f} MiB held")

            report.check(f"cupy {mode} {cell}", run)


# -- the guard --------------------------------------------------------------------------------------
def guard_checks(report: Report, cp: Any, engines: tuple[str, ...] = ("cudnn", "cupy")) -> None:
    for engine in engines:
        def run(engine: str = engine) -> str:
            _, _, _, (params, x, dy) = _case(cp, "lstm", 2)
            params = params.to_format("cudnn") if engine == "cudnn" else params
            ar.rnn_backward(ar.rnn_forward(params, x, engine=engine), dy)  # nothing written: no error
            guard.synchronize()
            res = ar.rnn_forward(params, x, engine=engine)
            params.data[0] += 1
            try:
                ar.rnn_backward(res, dy)
                guard.synchronize()
            except ValueError as err:
                if "modified in place" not in str(err):
                    raise
                return "an untouched buffer passes; a write is reported"
            raise AssertionError("a write between forward and backward was not reported")

        report.check(f"guard {engine}", run)


def run_all(report: Report, cp: Any) -> None:
    for checks in (cudnn_checks, cupy_checks, guard_checks):
        checks(report, cp)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write the results here (JSON lines)")
    args = parser.parse_args(argv)
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
    except Exception as err:  # a CPU machine: nothing to probe
        print(f"gpu_probe: no CUDA device with CuPy here ({type(err).__name__}: {err})")
        return 0
    report = Report(args.out)
    run_all(report, cupy)
    failed = [row["check"] for row in report.rows if not row["ok"]]
    print(f"gpu_probe: {len(report.rows) - len(failed)} of {len(report.rows)} checks passed"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
