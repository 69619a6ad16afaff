"""The cuDNN engine's checks against the reference engine, shared by the dry run (stand-in CuPy,
tests/test_cudnn_dry_run.py) and the GPU tests (real CuPy, tests/test_cudnn_engine.py).

:func:`check` runs ``rnn_forward`` / ``rnn_backward`` through the public API on ``xp``'s arrays (results stay
on the device; only the comparison copies them to the host) and compares every output and gradient with
the reference engine on NumPy (float16: on ``xp``, the only place it runs). :func:`hostile_inputs` puts
NaN in the padding of ``x``, inf/NaN in every padding position of ``dy`` and inf/NaN in ``h0``/``c0`` of
empty rows, where the contract says nothing is read, and never-zero ``dh_n``/``dc_n``.
"""

from __future__ import annotations

import itertools

import numpy as np

import arrayrnn as ar

MODES = ("rnn_tanh", "rnn_relu", "lstm", "gru")
BIASES = ("double", "single_inp", "single_rec", "none")
TOLERANCE = {"float64": 1e-10, "float32": 2e-4, "float16": 3e-2}  # max |error| / (1 + max |reference|)
LENGTHS = [5, 0, 2, 5, 0, 3]  # unsorted, two empty rows, T = 5


def grid():
    for mode, bias, bidir, layers, proj in itertools.product(MODES, BIASES, (False, True), (1, 2), (0, 3)):
        if proj and mode != "lstm":
            continue
        yield ar.RNNSpec(mode=mode, input_size=3, hidden_size=5, num_layers=layers, bidirectional=bidir,
                         bias=bias, proj_size=proj, dtype="float64")


GRID = list(grid())


def hostile_inputs(spec: ar.RNNSpec, lengths, batch_first: bool, seed: int = 0) -> dict:
    """Host inputs, hostile where the contract says nothing is read."""
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths)
    T, B = max(int(lengths.max()), 5), len(lengths)
    S, D = spec.num_layers * spec.num_directions, spec.num_directions
    layout = (B, T) if batch_first else (T, B)
    padding = np.arange(T)[:, None] >= lengths[None, :]                      # (T, B)
    padding = padding.T if batch_first else padding
    x = rng.standard_normal((*layout, spec.input_size))
    x[padding] = np.nan
    dy = rng.standard_normal((*layout, D * spec.output_size))
    dy[padding] = np.where(np.arange(padding.sum()) % 2, np.inf, np.nan)[:, None]
    zero = lengths == 0
    h0 = rng.standard_normal((S, B, spec.output_size))
    h0[:, zero] = np.inf
    c0 = dc_n = None
    if spec.mode == "lstm":
        c0 = rng.standard_normal((S, B, spec.hidden_size))
        c0[:, zero] = np.nan
        dc_n = rng.standard_normal((S, B, spec.hidden_size))
    return dict(params=ar.PackedParams.init(spec, seed=seed + 1), x=x, lengths=lengths, h0=h0, c0=c0, dy=dy,
                dh_n=rng.standard_normal((S, B, spec.output_size)), dc_n=dc_n, batch_first=batch_first)


def cast(inputs: dict, dtype: str) -> dict:
    out = dict(inputs, params=inputs["params"].astype(dtype))
    for key in ("x", "h0", "c0", "dy", "dh_n", "dc_n"):
        if out[key] is not None:
            out[key] = out[key].astype(dtype)
    return out


def run(xp, inputs: dict, engine: str, params_format: str = "canonical", inference_first: bool = False,
         **kw) -> dict:
    """Forward and backward on ``xp``'s arrays; every result as a float64 host array (dparams canonical)."""
    def move(a):
        return a if a is None or xp is np else xp.asarray(a)

    params = inputs["params"].to(xp).to_format(params_format)
    x, h0, c0, dy, dh_n, dc_n = (move(inputs[k]) for k in ("x", "h0", "c0", "dy", "dh_n", "dc_n"))
    res = ar.rnn_forward(params, x, inputs["lengths"], h0, c0, batch_first=inputs["batch_first"],
                         training=not inference_first, engine=engine, **kw)
    g = ar.rnn_backward(res, dy, dh_n, dc_n)
    assert g.dparams.format == params.format
    host = {"y": res.y, "h_n": res.h_n, "c_n": res.c_n, "dx": g.dx, "dh0": g.dh0, "dc0": g.dc0,
            "dparams": g.dparams.to_format("canonical").data, "engine": res.engine}
    for key, value in host.items():
        if key != "engine" and value is not None:
            assert isinstance(value, np.ndarray if xp is np else xp.ndarray), key  # stays on its device
            host[key] = (value if xp is np else value.get()).astype(np.float64)
    return host


def compare(got: dict, want: dict, dtype: str, what: str) -> None:
    tol = TOLERANCE[dtype]
    for key in ("y", "h_n", "c_n", "dx", "dh0", "dc0", "dparams"):
        a, b = got[key], want[key]
        assert (a is None) == (b is None), f"{what}: {key}"
        if a is None:
            continue
        assert np.array_equal(np.isfinite(a), np.isfinite(b)), f"{what}: {key} non-finite at " \
            f"{np.argwhere(np.isfinite(a) != np.isfinite(b))[:5].tolist()}"
        finite = np.isfinite(b)
        np.testing.assert_array_equal(a[~finite], b[~finite], err_msg=f"{what}: {key} (inf/NaN passed on)")
        err = np.max(np.abs(a[finite] - b[finite]), initial=0.0)
        assert err <= tol * (1 + np.max(np.abs(b[finite]), initial=0.0)), f"{what}: {key} differs by {err}"


def check(xp, spec: ar.RNNSpec, lengths=LENGTHS, batch_first=False, dtype="float64", engine="cudnn",
          params_format="cudnn", **kw) -> dict:
    """``engine`` on ``xp``'s arrays against the reference engine, with :func:`hostile_inputs`; returns
    ``engine``'s results (host copies)."""
    inputs = cast(hostile_inputs(spec, lengths, batch_first), dtype)
    seed = {k: v for k, v in kw.items() if k == "seed"}
    want = run(xp if dtype == "float16" else np, inputs, "reference", **seed)  # float16: GPU arrays only
    got = run(xp, inputs, engine, params_format, **kw)
    compare(got, want, dtype, f"{spec}, lengths {list(lengths)}, batch_first={batch_first}, {dtype}")
    return got
