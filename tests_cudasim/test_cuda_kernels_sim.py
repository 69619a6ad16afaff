"""The cupy engine's driver + CUDA kernels under numba's CUDA simulator, against the reference engine.

Both engines run the shared stack driver (:class:`~arrayrnn.engines.stack.StackEngine`) on the same
length-sorted float64 NumPy inputs; only the direction kernel differs (the reference engine's xp loop
vs :class:`~arrayrnn.engines.cupy.engine.GpuKernel`, whose fused kernels the simulator executes).
Forward outputs and every gradient must agree to 1e-12. Shapes are tiny: the simulator runs each CUDA
thread as a Python thread.
"""

from __future__ import annotations

import numpy as np
import pytest

from arrayrnn import PackedParams, RNNSpec
from arrayrnn.engines.cupy.engine import GpuKernel
from arrayrnn.engines.reference import ENGINE as REFERENCE
from arrayrnn.engines.stack import StackEngine
from arrayrnn.frontend.dropout import dropout_masks

SIM = StackEngine("cupy-sim", GpuKernel())
TOL = dict(rtol=1e-12, atol=1e-12)


def _inputs(spec: RNNSpec, T: int, lengths: list[int], seed: int):
    """Inputs as the frontend hands them to an engine: caller's row order (unsorted), zero at padding."""
    rng = np.random.default_rng(seed)
    lens = np.asarray(lengths, dtype=np.int64)
    B = len(lens)
    L, D, H, P = spec.num_layers, spec.num_directions, spec.hidden_size, spec.output_size
    x = rng.standard_normal((T, B, spec.input_size))
    x[np.arange(T)[:, None] >= lens[None, :]] = 0.0
    h0 = rng.standard_normal((L * D, B, P))
    c0 = rng.standard_normal((L * D, B, H)) if spec.mode == "lstm" else None
    masks = dropout_masks(spec, T, B, seed) if spec.dropout else None
    cot = (rng.standard_normal((T, B, D * P)), rng.standard_normal((L * D, B, P)),
           rng.standard_normal((L * D, B, H)) if spec.mode == "lstm" else None)
    return x, lens, h0, c0, masks, cot


def _run(engine: StackEngine, params: PackedParams, inputs):
    x, lens, h0, c0, masks, (dy, dh_n, dc_n) = inputs
    out = engine.forward(params, engine.take_input(x, lens, False), lens, h0.copy(),
                         None if c0 is None else c0.copy(), masks, batch_first=False, keep_cache=True)
    return out, engine.backward(out.cache, dy, dh_n, dc_n)


def check_against_reference(spec: RNNSpec, T: int, lengths: list[int], seed: int = 0) -> None:
    params = PackedParams.init(spec, seed=seed, xp=np)
    inputs = _inputs(spec, T, lengths, seed)
    (ref, ref_g), (sim, sim_g) = _run(REFERENCE, params, inputs), _run(SIM, params, inputs)
    for name in ("y", "h_n", "c_n"):
        a, b = getattr(sim, name), getattr(ref, name)
        assert (a is None) == (b is None), name
        if a is not None:
            np.testing.assert_allclose(a, b, **TOL, err_msg=name)
    for name in ("dx", "dh0", "dc0"):
        a, b = getattr(sim_g, name), getattr(ref_g, name)
        assert (a is None) == (b is None), name
        if a is not None:
            np.testing.assert_allclose(a, b, **TOL, err_msg=name)
    for key, ref_view in ref_g.dparams.named_views().items():
        np.testing.assert_allclose(sim_g.dparams.named_views()[key], ref_view, **TOL, err_msg=key)
    np.testing.assert_allclose(sim_g.dparams.data, ref_g.dparams.data, **TOL)
    if max(lengths) > 0:
        assert np.abs(ref_g.dparams.data).max() > 0  # the comparison is not between zeros


def spec_of(mode: str, **kw) -> RNNSpec:
    base = dict(mode=mode, input_size=3, hidden_size=4, dtype="float64")
    base.update(kw)
    return RNNSpec(**base)


UNSORTED = [2, 4, 0, 3]  # unsorted, with a zero-length row; T = 4


@pytest.mark.parametrize("mode", ["rnn_tanh", "rnn_relu", "lstm", "gru"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_modes_both_directions_unsorted_lengths(mode: str, bidirectional: bool) -> None:
    check_against_reference(spec_of(mode, bidirectional=bidirectional), T=4, lengths=UNSORTED)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_reset_before_gru(bidirectional: bool) -> None:
    spec = spec_of("gru", reset_after=False, bidirectional=bidirectional)
    check_against_reference(spec, T=4, lengths=UNSORTED)


@pytest.mark.parametrize("bias", ["double", "single_inp", "single_rec", "none"])
@pytest.mark.parametrize("mode, reset_after", [("rnn_tanh", True), ("lstm", True), ("gru", True),
                                               ("gru", False)])
def test_every_bias_mode(mode: str, reset_after: bool, bias: str) -> None:
    check_against_reference(spec_of(mode, bias=bias, reset_after=reset_after), T=3, lengths=[3, 1])


def test_lstm_projection_bidirectional() -> None:
    spec = spec_of("lstm", proj_size=2, bidirectional=True)
    check_against_reference(spec, T=4, lengths=UNSORTED)


def test_lstm_cell_clip_is_active() -> None:
    spec = spec_of("lstm", cell_clip=0.1, bidirectional=True)
    params = PackedParams.init(spec, seed=0, xp=np)
    inputs = _inputs(spec, 4, UNSORTED, 0)
    out, _ = _run(SIM, params, inputs)
    assert np.isclose(np.abs(out.cache.layers[0][0].cache.c), 0.1).any()  # some cell was clipped
    check_against_reference(spec, T=4, lengths=UNSORTED)


def test_lstm_clip_and_projection() -> None:
    check_against_reference(spec_of("lstm", proj_size=3, cell_clip=(-0.2, 0.3)), T=3, lengths=[1, 3])


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_two_layers_with_dropout_masks(mode: str) -> None:
    spec = spec_of(mode, num_layers=2, bidirectional=True, dropout=0.5)
    check_against_reference(spec, T=3, lengths=[3, 0, 2])


@pytest.mark.parametrize("mode, reset_after", [("rnn_relu", True), ("lstm", True), ("gru", True),
                                               ("gru", False)])
def test_single_step_single_row(mode: str, reset_after: bool) -> None:
    check_against_reference(spec_of(mode, reset_after=reset_after), T=1, lengths=[1])


def test_all_rows_empty() -> None:
    spec = spec_of("lstm", bidirectional=True)
    check_against_reference(spec, T=2, lengths=[0, 0])
    params = PackedParams.init(spec, seed=0, xp=np)
    inputs = _inputs(spec, 2, [0, 0], 0)
    out, g = _run(SIM, params, inputs)
    _, _, h0, c0, _, (_, dh_n, dc_n) = inputs
    np.testing.assert_array_equal(out.h_n, h0)
    np.testing.assert_array_equal(out.c_n, c0)
    np.testing.assert_array_equal(g.dh0, dh_n)
    np.testing.assert_array_equal(g.dc0, dc_n)
    assert not out.y.any() and not g.dparams.data.any()


@pytest.mark.parametrize("config", [dict(mode="lstm", num_layers=2, bidirectional=True, cell_clip=0.5),
                                    dict(mode="lstm", proj_size=3), dict(mode="gru", bidirectional=True)],
                         ids=["lstm", "lstm-proj", "gru"])
def test_float16_storage_float32_math_within_the_gpu_tests_tolerance(config: dict) -> None:
    """The tolerance tests/test_cupy_engine.py states for float16 on the GPU (2e-2), checked here."""
    spec32 = RNNSpec(input_size=5, hidden_size=6, dtype="float32", **config)
    spec16 = RNNSpec(input_size=5, hidden_size=6, dtype="float16", **config)
    params32 = PackedParams.init(spec32, seed=4, xp=np)
    params16 = PackedParams(spec16, params32.data.astype(np.float16))
    x, lens, h0, c0, masks, cot = _inputs(spec32, 7, [7, 0, 3, 5, 1], 4)

    def cast(a, dtype):
        return None if a is None else a.astype(dtype)

    def run(engine, params, dtype):
        return _run(engine, params, (cast(x, dtype), lens, cast(h0, dtype), cast(c0, dtype), None,
                                     tuple(cast(a, dtype) for a in cot)))

    (sim, sim_g), (ref, ref_g) = run(SIM, params16, np.float16), run(REFERENCE, params32, np.float32)
    assert sim.y.dtype == np.float16 and sim_g.dparams.data.dtype == np.float16
    for what, a, b in (("y", sim.y, ref.y), ("h_n", sim.h_n, ref.h_n), ("dx", sim_g.dx, ref_g.dx),
                       ("dh0", sim_g.dh0, ref_g.dh0), ("dparams", sim_g.dparams.data, ref_g.dparams.data)):
        np.testing.assert_allclose(a.astype(np.float32), b, rtol=2e-2, atol=2e-2, err_msg=what)


def test_through_rnn_forward_batch_first_registered_engine() -> None:
    """The kernels behind the public frontend (registered like a built-in engine): batch-first, unsorted."""
    import arrayrnn as ar
    from arrayrnn.engines import register_engine, unregister_engine

    spec = spec_of("lstm", bidirectional=True, num_layers=2, dropout=0.3)
    params = PackedParams.init(spec, seed=2, xp=np)
    rng = np.random.default_rng(2)
    x, lengths = rng.standard_normal((4, 5, 3)), np.array([2, 5, 0, 4])
    dy = rng.standard_normal((4, 5, 8))
    register_engine("cupy_sim", SIM)
    try:
        results = [ar.rnn_forward(params, x, lengths, batch_first=True, training=True, seed=7, engine=name)
                   for name in ("cupy_sim", "reference")]
    finally:
        unregister_engine("cupy_sim")
    (sim, ref), grads = results, [ar.rnn_backward(r, dy=dy) for r in results]
    for a, b in ((sim.y, ref.y), (sim.h_n, ref.h_n), (sim.c_n, ref.c_n), (grads[0].dx, grads[1].dx),
                 (grads[0].dparams.data, grads[1].dparams.data)):
        np.testing.assert_allclose(a, b, **TOL)


def test_reset_after_gru_backward_keeps_only_the_n_part_of_the_recurrent_gradient() -> None:
    """Memory: the reset-after GRU's recurrent gradient differs from dpre_in in its n part only, so the
    kernel returns that part, (T, B, H), and no second (T, B, 3H) stack (the numba engine does the same)."""
    from arrayrnn.engines.stack import direction_weights, previous_states

    spec = spec_of("gru")
    params = PackedParams.init(spec, seed=0, xp=np)
    w, kernel, T, B, H = direction_weights(params, 0, 0), GpuKernel(), 4, 3, spec.hidden_size
    bs = np.array([3, 3, 2, 1])
    xw = np.random.default_rng(0).standard_normal((T, B, 3 * H))
    fwd = kernel.forward(spec, w, xw, bs, np.zeros((B, H)), None, False, True)
    h_prev = previous_states(np, fwd.y, np.zeros((B, H)), bs, False)
    g = kernel.backward(spec, w, fwd, h_prev, None, np.ones((T, B, H)), np.zeros((B, H)), None, bs, False)
    assert g.dpre_rec is g.dpre_in and g.dn_rec.shape == (T, B, H)
    inactive = np.arange(B)[None, :] >= bs[:, None]
    assert g.dn_rec[~inactive].any() and not g.dn_rec[inactive].any()


@pytest.mark.parametrize("k, width", [(1, 33), (31, 5), (32, 70), (130, 40)])
@pytest.mark.parametrize("per_step", [False, True])
def test_step_product_splits_k_and_writes_only_active_rows(k: int, width: int, per_step: bool) -> None:
    """``product_step`` launched as the CuPy engine launches it on a GPU (a thread per output for K < 32,
    else a block per row and 32 columns whose warps split K: 2 and 8 of them here) equals ``a[:n] @ w`` and
    leaves rows ``n..`` and the other steps alone; float32 math in float32."""
    from arrayrnn.engines.cupy import kernels as ck

    rng = np.random.default_rng(k)
    T, B, n, t = 3, 4, 3, 1
    a = rng.standard_normal((T if per_step else 1, B, k)).astype(np.float32)
    w = rng.standard_normal((k, width)).astype(np.float32)
    out = np.full((T if per_step else 1, B, width), np.nan, np.float32)
    slices = ck.split_slices(k)
    if slices > 1:
        blocks, threads = n * -(-width // ck.PRODUCT_COLUMNS), ck.PRODUCT_COLUMNS * slices
    else:
        blocks, threads = ck.launch_shape(n * width)
    ck.product_step[blocks, threads](t, n, np.float32(1), a, per_step, w, out, per_step, slices)
    s = t if per_step else 0
    want = a[s, :n].astype(np.float64) @ w.astype(np.float64)
    np.testing.assert_allclose(out[s, :n], want, rtol=2e-5, atol=2e-5 * np.sqrt(k))
    assert out.dtype == np.float32 and np.isnan(out[s, n:]).all()
    assert np.isnan(np.delete(out, s, axis=0)).all()
    assert slices == {1: 1, 31: 1, 32: 2, 130: 8}[k]


def test_the_engine_runs_the_split_product_as_on_a_gpu(monkeypatch) -> None:
    """The engine with the GPU's choice of warps (the simulator's default is a thread per output): H = 40, so
    the forward's products have K = 40 (2 warps a block, 5 blocks a row), the backward's K = 160 (8 warps,
    2 blocks a row)."""
    from arrayrnn.engines.cupy import kernels as ck

    assert ck.product_slices(160) == 1 and ck.split_slices(160) == 8  # the simulator's choice, the GPU's
    monkeypatch.setattr(ck, "product_slices", ck.split_slices)
    split = StackEngine("cupy-sim-split", GpuKernel())  # its own programs: none built with one warp
    spec = spec_of("lstm", hidden_size=40)
    params = PackedParams.init(spec, seed=0, xp=np)
    inputs = _inputs(spec, 2, [2, 1], 0)
    (ref, ref_g), (sim, sim_g) = _run(REFERENCE, params, inputs), _run(split, params, inputs)
    np.testing.assert_allclose(sim.y, ref.y, **TOL)
    np.testing.assert_allclose(sim_g.dx, ref_g.dx, **TOL)
    np.testing.assert_allclose(sim_g.dparams.data, ref_g.dparams.data, **TOL)
