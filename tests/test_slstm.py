"""The sLSTM cell (``mode="slstm"``, arrayrnn/cells/slstm.py) against independent oracles: the float64 NumPy
loop of the paper's equations (support/slstm_oracle.py), float64 central differences of the whole
``rnn_forward`` (support/finite_differences.py), a PyTorch autograd loop (support/slstm_torch.py) and
FlashRNN's pure-PyTorch backend where the ``flashrnn`` package is installed."""

from __future__ import annotations

import numpy as np
import pytest
from support import slstm_oracle, slstm_torch
from support.engine_cases import EngineOnDevice, _gpu_module, as_params
from support.finite_differences import numeric_gradient
from support.rnn_cases import Case, forward, forward_backward, host, make_lengths

import arrayrnn as ar
from arrayrnn.cells import slstm
from arrayrnn.core.cell_registry import unregister_cell

TIGHT = dict(rtol=1e-11, atol=1e-13)
STATE_RANGES = {"n": (0.5, 3.0), "m": (-3.0, 3.0), "c": (-2.0, 2.0)}


def make_case(T: int = 5, B: int = 4, I: int = 3, H: int = 3, layers: int = 1, bidirectional: bool = False,
              lengths: str = "full", with_state: bool = True, dtype: str = "float64", seed: int = 0,
              gain: float = 3.0) -> Case:
    """A random case: weights ``gain`` times ``PackedParams.init``'s (so the stabiliser's max takes both
    branches), initial states with ``n0 > 0`` (or none: the zero state), cotangents on ``y``, ``h_n`` and
    every column of ``c_n`` (``c``, ``n`` and ``m``)."""
    spec = ar.RNNSpec("slstm", I, H, num_layers=layers, bidirectional=bidirectional, dtype=dtype)
    rng = np.random.default_rng(seed)
    params = ar.PackedParams.init(spec, seed=seed + 1)
    params.data[...] *= gain
    L = layers * spec.num_directions

    def normal(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(dtype)

    c0 = None
    if with_state:
        c0 = np.concatenate([normal(L, B, H), rng.uniform(0.5, 2.0, (L, B, H)).astype(dtype),
                             normal(L, B, H)], axis=-1)
    h0 = normal(L, B, H) if with_state else None
    return Case(params, normal(T, B, I), make_lengths(lengths, T, B, rng), h0, c0,
                normal(T, B, spec.num_directions * H), normal(L, B, H), normal(L, B, 3 * H))


def cast(case: Case, dtype: str) -> Case:
    """The case with its numbers (weights, inputs, states, cotangents) converted to ``dtype``."""
    arrays = ("x", "h0", "c0", "dy", "dh_n", "dc_n")
    return case.with_(params=ar.PackedParams(case.spec.replace(dtype=dtype), case.params.data.astype(dtype)),
                      **{name: getattr(case, name).astype(dtype) for name in arrays})


def oracle(case: Case) -> dict[str, np.ndarray]:
    return slstm_oracle.run(case.params, case.x, case.lengths, case.h0, case.c0)


# -- the cell alone ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("gates", [{}, {"i": (-4.0, 4.0), "f": (-4.0, 4.0)}], ids=["default", "wide"])
def test_check_cell_agrees_with_central_differences(gates):
    errors = ar.check_cell("slstm", ranges={**STATE_RANGES, **gates}, samples=2000)
    assert set(errors) == set(slstm.SLSTM.argument_names) == {"i", "f", "z", "o", "h", "c", "n", "m"}


def stopped_backward(res, d_new):
    """FlashRNN's kernels' backward: ``m`` a constant (no cotangent into or out of it). It is the exact one
    fed a consistent ``dm = dc c' + dn n'`` (which leaves nothing to flow through ``m'``), ``dm_prev = 0``."""
    dh, dc, dn, _ = d_new
    c_new, n_new = res[6], res[7]
    *grads, _ = slstm.backward(res, (dh, dc, dn, dc * c_new + dn * n_new))
    return (*grads, 0.0)


@pytest.fixture
def stopped_cell():
    cell = ar.Cell("slstm_stopped_m", gates=slstm.SLSTM.gates, states=slstm.SLSTM.states,
                   forward=slstm.forward, backward=stopped_backward)
    ar.register_cell(cell, replace=True)
    yield cell
    unregister_cell(cell.name)


def test_check_cell_rejects_the_stopped_gradient(stopped_cell):
    with pytest.raises(ar.CellCheckError, match="slstm_stopped_m"):
        ar.check_cell(stopped_cell, ranges=STATE_RANGES)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_h_only_gradient_equals_the_stopped_gradient(stopped_cell, bidirectional):
    """h is invariant to m jointly with c and n, so with cotangents on y and h_n only, the exact gradient is
    FlashRNN's (m stopped) but for ``m0``'s, which is ``dc0 c0 + dn0 n0`` (zero along ``(-c0, -n0, 1)``, the
    invariance); with a cotangent on c_n (c, n or m) they differ, and the exact one is what the central
    differences of test_gradients_match_central_differences see."""
    case = make_case(layers=2, bidirectional=bidirectional, lengths="zeros")
    stopped_spec = case.spec.replace(mode=stopped_cell.name)
    twin = case.with_(params=ar.PackedParams(stopped_spec, case.params.data.copy()))
    grads = {}
    for name, which in (("exact", case), ("stopped", twin)):
        res, _ = forward_backward(which, "reference")
        grads[name] = ar.rnn_backward(res, which.dy, which.dh_n, None)
        grads[name + "_c"] = ar.rnn_backward(res, which.dy, which.dh_n, which.dc_n)
    exact, stopped, H = grads["exact"], grads["stopped"], case.spec.hidden_size
    for name, got, want in (("dx", stopped.dx, exact.dx), ("dh0", stopped.dh0, exact.dh0),
                            ("dc0 (c, n)", stopped.dc0[..., :2 * H], exact.dc0[..., :2 * H]),
                            ("dparams", stopped.dparams.data, exact.dparams.data)):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11, err_msg=name)
    c0, n0 = case.c0[..., :H], case.c0[..., H:2 * H]
    dc0, dn0, dm0 = np.split(exact.dc0, 3, axis=-1)
    np.testing.assert_allclose(dm0, dc0 * c0 + dn0 * n0, rtol=1e-9, atol=1e-11)
    assert np.abs(dm0).max() > 1e-3 and not stopped.dc0[..., 2 * H:].any()
    with_c = (grads["stopped_c"].dparams.data, grads["exact_c"].dparams.data)
    assert not np.allclose(*with_c, rtol=1e-4, atol=1e-6)


# -- the stack on the reference engine against the NumPy oracle ---------------------------------------------
@pytest.mark.parametrize("layers, bidirectional, lengths, with_state", [
    (1, False, "full", False), (1, False, "full", True), (2, True, "edges", True), (2, True, "zeros", False),
    (3, False, "unsorted", True)])
def test_forward_matches_the_numpy_oracle(layers, bidirectional, lengths, with_state):
    case = make_case(T=6, B=5, layers=layers, bidirectional=bidirectional, lengths=lengths,
                     with_state=with_state)
    res, want = forward(case, "reference"), oracle(case)
    for name in ("y", "h_n", "c_n"):
        np.testing.assert_allclose(getattr(res, name), want[name], **TIGHT, err_msg=name)


def test_batch_first_and_bias_free_match_the_oracle():
    case = make_case(layers=2, bidirectional=True, lengths="unsorted")
    params = ar.PackedParams.init(case.spec.replace(bias=False), seed=3)
    res = ar.rnn_forward(params, case.x.transpose(1, 0, 2).copy(), case.lengths, case.h0, case.c0,
                         batch_first=True, engine="reference")
    want = slstm_oracle.run(params, case.x, case.lengths, case.h0, case.c0)
    np.testing.assert_allclose(res.y.transpose(1, 0, 2), want["y"], **TIGHT)
    np.testing.assert_allclose(res.c_n, want["c_n"], **TIGHT)


def test_c_n_holds_c_n_m_and_h_is_invariant_to_m():
    """``c_n``'s 3H columns are ``c, n, m``: from the zero state ``n >= 1`` (the empty memory's first step
    writes ``n = 1``), and shifting ``m0`` by ``delta`` while scaling ``c0, n0`` by ``exp(-delta)`` (the same
    unstabilised state) leaves ``y`` and ``h_n`` unchanged."""
    case = make_case(T=6, with_state=False)
    res = forward(case, "reference")
    H = case.spec.hidden_size
    assert res.c_n.shape == (1, 4, 3 * H)
    assert (res.c_n[..., H:2 * H] >= 1.0).all()
    delta = 1.7
    moved = res.c_n * np.repeat([np.exp(-delta), np.exp(-delta), 1.0], H)
    moved[..., 2 * H:] += delta
    again = ar.rnn_forward(case.params, case.x, h0=res.h_n, c0=res.c_n, engine="reference")
    shifted = ar.rnn_forward(case.params, case.x, h0=res.h_n, c0=moved, engine="reference")
    np.testing.assert_allclose(shifted.y, again.y, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(shifted.h_n, again.h_n, rtol=1e-12, atol=1e-14)


def test_all_states_hold_every_steps_c_n_m():
    case = make_case(T=4, layers=2, bidirectional=True)
    res = ar.rnn_forward(case.params, case.x, h0=case.h0, c0=case.c0, engine="reference",
                         return_all_states=True)
    assert res.c_all.shape == (4, 4, 4, 9)
    for t in range(4):
        prefix = slstm_oracle.run(case.params, case.x[:t + 1], None, case.h0, case.c0)
        np.testing.assert_allclose(res.c_all[0, t], prefix["c_n"][0], **TIGHT)  # layer 0 forward
    np.testing.assert_allclose(res.c_all[2, -1], res.c_n[2], **TIGHT)


# -- gradients -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("with_state", [True, False], ids=["state", "zero-state"])
def test_gradients_match_central_differences(with_state):
    """The whole stack's gradients (every weight, x, h0, c0 with n0 > 0; the zero state's empty-memory step
    too) against float64 central differences of ``rnn_forward``, with cotangents on y, h_n, c, n and m."""
    case = make_case(T=4, B=3, I=2, H=2, layers=2, bidirectional=True, lengths="zeros", with_state=with_state)
    _, grads = forward_backward(case, "reference")
    analytic = {"params": grads.dparams.data, "x": grads.dx, "h0": grads.dh0, "c0": grads.dc0}
    for name in ("params", "x", "h0", "c0") if with_state else ("params", "x"):
        np.testing.assert_allclose(analytic[name], numeric_gradient(case, "reference", name), rtol=1e-6,
                                   atol=1e-8, err_msg=name)


@pytest.mark.parametrize("with_state", [True, False], ids=["state", "zero-state"])
def test_matches_the_pytorch_autograd_loop(with_state):
    case = make_case(T=7, B=4, with_state=with_state)
    res, grads = forward_backward(case, "reference")
    states = {"h0": case.h0, "c0": case.c0} if with_state else {
        "h0": np.zeros_like(case.dh_n), "c0": np.zeros_like(case.dc_n)}
    want = slstm_torch.outputs_and_grads(case.params, case.x, states["h0"], states["c0"], case.dy, case.dh_n,
                                         case.dc_n)
    got = {"y": res.y, "h_n": res.h_n, "c_n": res.c_n, "dx": grads.dx, "dh0": grads.dh0, "dc0": grads.dc0}
    got.update({f"d{name}": grads.dparams.view(0, 0, name) for name in ("W_ih", "W_hh", "b_ih", "b_hh")})
    for name, value in got.items():
        np.testing.assert_allclose(value, want[name], rtol=1e-10, atol=1e-12, err_msg=name)


# -- float32, save/load ------------------------------------------------------------------------------------
def test_float32_stays_float32_and_matches_float64():
    case32 = cast(make_case(T=6, layers=2, bidirectional=True, lengths="unsorted"), "float32")
    res32, grads32 = forward_backward(case32, "reference")
    assert {res32.y.dtype, res32.c_n.dtype, grads32.dx.dtype, grads32.dc0.dtype,
            grads32.dparams.data.dtype} == {np.dtype(np.float32)}
    want = oracle(case32)  # float64 math on the float32 numbers
    for name in ("y", "h_n", "c_n"):
        np.testing.assert_allclose(getattr(res32, name), want[name], rtol=1e-5, atol=1e-5, err_msg=name)
    _, grads64 = forward_backward(cast(case32, "float64"), "reference")
    np.testing.assert_allclose(grads32.dparams.data, grads64.dparams.data, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(grads32.dx, grads64.dx, rtol=1e-3, atol=1e-4)


def test_save_load_round_trip(tmp_path):
    case = make_case(layers=2, bidirectional=True)
    path = tmp_path / "slstm.npz"
    ar.save(path, case.params)
    back = ar.load(path)
    assert back.spec == case.spec and back.spec.mode == "slstm"
    np.testing.assert_array_equal(back.data, case.params.data)
    again = forward(case.with_(params=back), "reference")
    np.testing.assert_array_equal(again.y, forward(case, "reference").y)
    unregister_cell("slstm")
    try:
        with pytest.raises(ValueError, match="slstm"):
            ar.load(path)
    finally:
        ar.register_cell(slstm.SLSTM)


# -- the compiled engines, where they run custom cells -------------------------------------------------------
def _compiled_engines() -> list:
    gpu = _gpu_module()
    return as_params([EngineOnDevice("numba", np), EngineOnDevice("cupy", gpu if gpu is not None else np)])


@pytest.mark.parametrize("engine", _compiled_engines())
@pytest.mark.parametrize("dtype, tol", [("float64", dict(rtol=1e-9, atol=1e-11)),
                                        ("float32", dict(rtol=2e-4, atol=2e-5))])
def test_compiled_engine_matches_the_reference(engine, dtype, tol):
    """Runs where the engine accepts ``mode="slstm"``; skips with the engine's own reason where it does not
    (checked at run time on this very call)."""
    case = make_case(T=6, B=5, layers=2, bidirectional=True, lengths="edges", dtype=dtype)
    try:
        got = forward_backward(case, engine)
    except ar.EngineUnavailableError as err:
        pytest.skip(f"engine {engine!r} does not run this call: {err}")
    want = forward_backward(case, "reference")
    for part, (g, w) in enumerate(zip(got, want, strict=True)):
        fields = ("y", "h_n", "c_n") if part == 0 else ("dx", "dh0", "dc0")
        for name in fields:
            np.testing.assert_allclose(host(getattr(g, name)), getattr(w, name), **tol, err_msg=name)
    np.testing.assert_allclose(host(got[1].dparams.data), want[1].dparams.data, **tol, err_msg="dparams")


# -- FlashRNN's pure-PyTorch sLSTM ("vanilla" backend), weight for weight -----------------------------------
@pytest.mark.parametrize("heads", [1, 2])
def test_matches_flashrnn_vanilla(heads):
    """FlashRNN (NX-AI; ``flashrnn.flashrnn(Wx, R, b, function="slstm", backend="vanilla")``, zero initial
    states) takes the input product ``Wx (B, T, 4, NH, D)`` (ours: ``x @ W_ih.T + b_ih``), ``R (4, NH, D, D)``
    (gate, head, output unit, input unit) and ``b (4, NH, D)`` (ours ``b_hh``): the gates in our order ``i, f,
    z, o``, head ``k``'s units ``k*D .. (k+1)*D`` of each block, so NH heads are our ``W_hh`` with zero blocks
    off the diagonal. Outputs and final ``c, n, m`` agree, and the autograd gradients (cotangents on every
    state, ``m`` included) of the inputs, ``W_ih``, ``b_ih``, ``b_hh`` and ``W_hh``'s diagonal blocks."""
    flashrnn = pytest.importorskip("flashrnn")
    import torch

    case = make_case(T=6, B=3, I=4, H=4, with_state=False, seed=heads)
    T, B, H, D = 6, 3, 4, 4 // heads
    on_diagonal = np.kron(np.eye(heads), np.ones((D, D))).astype(bool)
    blocks = np.tile(on_diagonal, (4, 1))
    case.params.view(0, 0, "W_hh")[...] *= blocks
    res, grads = forward_backward(case, "reference")

    w = {name: torch.tensor(case.params.view(0, 0, name), requires_grad=True)
         for name in ("W_ih", "W_hh", "b_ih", "b_hh")}
    x = torch.tensor(case.x, requires_grad=True)
    Wx = (x @ w["W_ih"].T + w["b_ih"]).transpose(0, 1).reshape(B, T, 4, heads, D)
    R = torch.stack([w["W_hh"].reshape(4, heads, D, heads, D)[:, k, :, k] for k in range(heads)], dim=1)
    b = w["b_hh"].reshape(4, heads, D)
    states, last = flashrnn.flashrnn(Wx, R, b, function="slstm", backend="vanilla", dtype="float64")
    y = states[0].reshape(B, T, H).transpose(0, 1)  # states: (h, c, n, m) x (B, T, NH, D)
    c_n = last[1:, :, 0].reshape(3, B, H).permute(1, 0, 2).reshape(1, B, 3 * H)
    np.testing.assert_allclose(res.y, y.detach().numpy(), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(res.c_n, c_n.detach().numpy(), rtol=1e-12, atol=1e-13)

    loss = torch.sum(y * torch.tensor(case.dy)) + torch.sum(y[-1] * torch.tensor(case.dh_n[0])) + torch.sum(
        c_n * torch.tensor(case.dc_n))
    loss.backward()
    np.testing.assert_allclose(grads.dx, x.grad.numpy(), rtol=1e-10, atol=1e-12)
    for name in ("W_ih", "b_ih", "b_hh", "W_hh"):
        got, want = grads.dparams.view(0, 0, name), w[name].grad.numpy()
        if name == "W_hh":
            got, want = got[blocks], want[blocks]
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=name)
