"""Custom cells on the cupy engine under numba's CUDA simulator (the CuPy stand-in, every time loop captured
into a graph and replayed: this directory's ``engine`` fixture), against the built-in cells and the reference
engine.

The oracles: the built-in cupy kernels (themselves checked against PyTorch and central differences) for the
twins of ``tests/support/twin_cells.py``, and the reference engine, which runs a cell's functions on whole
NumPy arrays. Every case has two layers, both directions, unsorted lengths with empty rows, recurrent
dropout and DropConnect in training, all states and their cotangents (``dc_all`` reaches the kernels as
``dc_seq``), random initial states; shapes are tiny (the simulator runs each CUDA thread as a Python thread).

Bits: under the simulator a cell's ``cellmath`` calls run the plain Python functions (the reference
engine's NumPy forms: ``sigmoid`` through ``exp(-|x|)``, NumPy's float32 ``tanh``), while the built-in
kernels run ``1 / (1 + math.exp(-x))`` and ``math.tanh`` (float64 libm, rounded to the dtype), and the step
products are the kernel's sums where the reference engine calls BLAS: so results agree to a tight tolerance
(:func:`support.rnn_cases.tolerances`), not in bits. The ReLU RNN's twin does the built-in's very operations
(``max(x, 0)``, ``dh * step(y)``, the same products, ``dh + 0``): there the twin gives the built-in's bits.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support.every_form_cell import EVERY_FORM
from support.rnn_cases import Case, forward_backward, host, make_case, on_device, tolerances
from support.twin_cells import TWINS, twin_params

import arrayrnn as ar
from arrayrnn import RNNSpec, rnn_backward, rnn_forward
from arrayrnn import cellmath as cm
from arrayrnn.cells.cifg import CIFG
from arrayrnn.cells.slstm import SLSTM

T, B = 3, 4
STACK = dict(input_size=2, hidden_size=2, num_layers=2, bidirectional=True, recurrent_dropout=0.4,
             weight_dropout=0.3)


def _case(spec: RNNSpec, seed: int = 0, **kw: Any) -> Case:
    """``make_case`` (lengths with rows of 0, 1 and T) with ``c0`` and ``dc_n`` of the cell's width
    (``spec.cell_width``: ``(S-1)*H`` for a custom cell of S states)."""
    case = make_case(spec, T, B, seed, lengths="edges", **kw)
    rng = np.random.default_rng(seed + 5)
    L = spec.num_layers * spec.num_directions
    if spec.has_cell:
        width = spec.cell_width
        case = case.with_(c0=rng.standard_normal((L, B, width)).astype(spec.dtype),
                          dc_n=rng.standard_normal((L, B, width)).astype(spec.dtype))
    return case


def _all_state_cotangents(case: Case) -> dict[str, np.ndarray | None]:
    spec, rng = case.spec, np.random.default_rng(99)
    shape = (spec.num_layers * spec.num_directions, T, B)
    dh_all = rng.standard_normal((*shape, spec.output_size)).astype(spec.dtype)
    dc_all = rng.standard_normal((*shape, spec.cell_width)).astype(spec.dtype) if spec.has_cell else None
    return {"dh_all": dh_all, "dc_all": dc_all}


def _results(case: Case, engine: Any) -> dict[str, Any]:
    """Outputs, all states and every gradient of ``case`` on ``engine`` (training, masks from seed 7)."""
    dev = on_device(case, engine)
    res = rnn_forward(dev.params, dev.x, dev.lengths, dev.h0, dev.c0, batch_first=dev.batch_first,
                      engine=engine, training=True, seed=7, return_all_states=True)
    xp = getattr(engine, "xp", np)
    extra = {k: (xp.asarray(v) if v is not None else None) for k, v in _all_state_cotangents(case).items()}
    g = rnn_backward(res, dev.dy, dev.dh_n, dev.dc_n, **extra)
    assert res.engine == str(engine)
    return {"y": res.y, "h_n": res.h_n, "c_n": res.c_n, "h_all": res.h_all, "c_all": res.c_all, "dx": g.dx,
            "dh0": g.dh0, "dc0": g.dc0, "dparams": g.dparams.data}


def _assert_same(got: dict[str, Any], want: dict[str, Any], exact: bool = False, **tol: float) -> None:
    assert got.keys() == want.keys()
    for name, expected in want.items():
        assert (got[name] is None) == (expected is None), name
        if expected is None:
            continue
        if exact:
            np.testing.assert_array_equal(host(got[name]), host(expected), err_msg=name)
        else:
            np.testing.assert_allclose(host(got[name]), host(expected), **tol, err_msg=name)
    assert np.abs(host(want["dparams"])).max() > 0 and np.abs(host(want["dx"])).max() > 0  # not zeros


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("mode", sorted(TWINS))
def test_each_twin_on_cupy_equals_the_builtin_and_the_reference(engine, mode: str, dtype: str) -> None:
    builtin = _case(RNNSpec(mode=mode, dtype=dtype, **STACK))
    twin = builtin.with_(params=twin_params(builtin.params))
    got = _results(twin, engine)
    _assert_same(got, _results(twin, "reference"), **tolerances(dtype))
    _assert_same(got, _results(builtin, engine), exact=mode == "rnn_relu", **tolerances(dtype))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("cell", [CIFG, SLSTM, EVERY_FORM], ids=lambda cell: cell.name)
def test_a_registered_cell_on_cupy_equals_the_reference(engine, cell: ar.Cell, dtype: str) -> None:
    """CIFG, sLSTM, and a cell of three states with a split gate and every ``cellmath`` function (its
    backward first checked against central differences)."""
    if cell is EVERY_FORM:
        ar.check_cell(cell)
    case = _case(RNNSpec(mode=cell.name, dtype=dtype, **STACK), batch_first=True)
    _assert_same(_results(case, engine), _results(case, "reference"), **tolerances(dtype))


def test_inference_without_a_cache_equals_training_without_masks(engine) -> None:
    """``training=False`` (no cache kept: the kernels' ``keep`` off) gives the outputs of the reference."""
    case = on_device(_case(RNNSpec(mode="cifg", input_size=2, hidden_size=3, dtype="float64")), engine)
    got = rnn_forward(case.params, case.x, case.lengths, case.h0, case.c0, engine=engine)
    want = rnn_forward(case.params.to(np), host(case.x), case.lengths, host(case.h0), host(case.c0),
                       engine="reference")
    for name in ("y", "h_n", "c_n"):
        np.testing.assert_allclose(host(getattr(got, name)), getattr(want, name), **tolerances("float64"))


def _tanh_forward(pre, h):
    y = cm.tanh(pre)
    return (y,), (y,)


def _tanh_backward(res, d_new):
    return d_new[0] * cm.dtanh(res[0]), 0.0


def _sigmoid_forward(pre, h):
    y = cm.sigmoid(pre)
    return (y,), (y,)


def _sigmoid_backward(res, d_new):
    return d_new[0] * cm.dsigmoid(res[0]), 0.0


def test_a_cell_registered_again_under_its_name_runs_the_new_definition(engine) -> None:
    """The engine's programs (and their graphs) are keyed on the cell object, not on its name."""
    spec = RNNSpec(mode=ar.register_cell(ar.Cell("sim_swapped", gates=("h",), forward=_tanh_forward,
                                                 backward=_tanh_backward), replace=True).name,
                   input_size=2, hidden_size=3, dtype="float64")
    try:
        case = on_device(make_case(spec, T, B, lengths="zeros"), engine)
        first = host(rnn_forward(case.params, case.x, case.lengths, engine=engine).y)
        ar.register_cell(ar.Cell("sim_swapped", gates=("h",), forward=_sigmoid_forward,
                                 backward=_sigmoid_backward), replace=True)
        second = host(rnn_forward(case.params, case.x, case.lengths, engine=engine).y)
        want = rnn_forward(case.params.to(np), host(case.x), case.lengths, engine="reference").y
    finally:
        ar.unregister_cell("sim_swapped")
    np.testing.assert_allclose(second, want, **tolerances("float64"))
    assert np.abs(second - first).max() > 0.1


def test_a_zero_length_batch_passes_the_states_through(engine) -> None:
    spec = RNNSpec(mode="cifg", input_size=2, hidden_size=3, dtype="float64", bidirectional=True)
    case = _case(spec).with_(lengths=np.zeros(B, np.int64))
    res, g = forward_backward(case, engine)
    np.testing.assert_array_equal(host(res.h_n), case.h0)
    np.testing.assert_array_equal(host(res.c_n), case.c0)
    np.testing.assert_array_equal(host(g.dh0), case.dh_n)
    np.testing.assert_array_equal(host(g.dc0), case.dc_n)
    assert not host(res.y).any() and not host(g.dx).any()


def test_float16_runs_with_float32_math_within_the_gpu_tests_tolerance(engine) -> None:
    """float16 storage, float32 math (the driver upcasts): within the tolerance tests/test_cupy_engine.py
    states for float16 on the GPU (2e-2) of the float32 reference."""
    case32 = _case(RNNSpec(mode="cifg", dtype="float32", **STACK))
    params16 = ar.PackedParams(case32.spec.replace(dtype="float16"), case32.params.data.astype(np.float16))
    names = ("x", "h0", "c0", "dy", "dh_n", "dc_n")
    half = {name: getattr(case32, name).astype(np.float16) for name in names}
    got = _results(case32.with_(params=params16, **half), engine)
    assert host(got["y"]).dtype == np.float16 and host(got["dparams"]).dtype == np.float16
    want = _results(case32.with_(**{k: v.astype(np.float32) for k, v in half.items()}), "reference")
    _assert_same({k: None if v is None else host(v).astype(np.float32) for k, v in got.items()}, want,
                 rtol=2e-2, atol=2e-2)
