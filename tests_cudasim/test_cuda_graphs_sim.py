"""The cupy engine's time loops as CUDA graphs, on the CuPy stand-in under numba's CUDA simulator.

What a replayed call costs the host is counted, not timed: the stand-in logs every operation issued
(:func:`support.fake_cupy.issued`), so a time loop that went back to per-step Python shows as work that
grows with T. Every result is compared with the reference engine on NumPy, through calls that change every
input (data, states, params, cotangents, masks) while the shape stays, so a graph replaying on a stale
input buffer fails.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from support import cupy_sim, fake_cupy
from support.engine_cases import EngineOnDevice
from support.rnn_cases import assert_close, forward_backward, make_case, tolerances

from arrayrnn import RNNSpec
from arrayrnn.engines.cupy import graphs as cuda_graphs
from arrayrnn.engines.cupy import programs as cupy_steps
from arrayrnn.engines.cupy.engine import ENGINE

CUPY = EngineOnDevice("cupy", fake_cupy.MODULE)
CONFIGS = {
    "lstm": dict(mode="lstm", num_layers=2),
    "gru-before-variants": dict(mode="gru", reset_after=False, bidirectional=True, recurrent_dropout=0.3,
                                zoneout=0.2),
    "lstm-proj-peep-variants": dict(mode="lstm", proj_size=2, peepholes=True, cell_clip=0.5, zoneout=0.1,
                                    zoneout_cell=0.2, recurrent_dropout=0.2, weight_dropout=0.3),
    "rnn-bidirectional-dropconnect": dict(mode="rnn_relu", bidirectional=True, weight_dropout=0.3),
    "gru-after-zoneout": dict(mode="gru", zoneout=0.3, recurrent_dropout=0.1),
    # layer norm (issue 38): the block-per-row kernels and the backward's one GEMM of raw products
    "lstm-ln-proj-peep-variants": dict(mode="lstm", layer_norm=True, proj_size=2, peepholes=True,
                                       zoneout=0.1, recurrent_dropout=0.2, weight_dropout=0.3),
    "gru-before-ln-bidirectional": dict(mode="gru", reset_after=False, layer_norm=True, bidirectional=True,
                                        recurrent_dropout=0.3),
    "gru-after-ln": dict(mode="gru", layer_norm=True, num_layers=2),
    "rnn-ln": dict(mode="rnn_tanh", layer_norm=True),
}


def _spec(config: dict) -> RNNSpec:
    return RNNSpec(input_size=3, hidden_size=4, dtype="float64", **config)


@pytest.fixture(autouse=True)
def fresh_graphs():
    """Each test starts without graphs (they are per thread, and pytest runs tests on one thread)."""
    ENGINE.kernel.graphs.clear()
    yield
    ENGINE.kernel.graphs.clear()


def _check_against_reference(case, seed: int) -> None:
    with fake_cupy.issued() as log:
        got = forward_backward(case, CUPY, seed=seed)
    want = forward_backward(case, "reference", seed=seed)
    tol = tolerances("float64")
    for what in ("y", "h_n", "c_n"):
        a, b = getattr(got[0], what), getattr(want[0], what)
        if b is not None:
            assert_close(a, b, what, **tol)
    for what in ("dx", "dh0", "dc0"):
        a, b = getattr(got[1], what), getattr(want[1], what)
        if b is not None:
            assert_close(a, b, what, **tol)
    assert_close(got[1].dparams.data, want[1].dparams.data, "dparams", **tol)
    return log


def _names(log, captured: bool | None = None) -> Counter:
    return Counter(op.name for op in log if captured is None or op[2] == captured)


@pytest.mark.parametrize("name", CONFIGS)
def test_a_replayed_call_issues_the_same_work_whatever_its_length(name: str) -> None:
    """From a shape's third call on (step by step, captured, replayed), a forward + backward issues the same
    operations at T = 2 and T = 7: one graph launch per layer-direction and pass, no kernel launch and no
    GEMM of the time loop from the host; and each call equals the reference engine."""
    spec = _spec(CONFIGS[name])
    per_call = {}
    with cupy_sim.installed(capture_after=1):
        for T in (2, 7):
            for seed in range(3):
                log = _check_against_reference(make_case(spec, T, 3, seed=seed, lengths="full"), seed)
            per_call[T] = _names(log)
    assert per_call[2] == per_call[7]
    layer_directions = spec.num_layers * spec.num_directions
    assert per_call[2]["graph_launch"] == 2 * layer_directions and "host_func" not in per_call[2]


def _graph_nodes(kind: str) -> tuple[str, ...]:
    (graph,) = [graph for key, graph in ENGINE.kernel.graphs.graphs() if key[0] == kind]
    return graph.nodes


GEMM = KERNEL = "host_func"  # under the simulator a kernel launch, the step's GEMMs' too, is a host function


@pytest.mark.parametrize("config, forward_step, backward_step", [
    (dict(mode="lstm"), (GEMM, KERNEL), (KERNEL, GEMM)),
    (dict(mode="gru"), (GEMM, KERNEL), (KERNEL, GEMM)),
    (dict(mode="rnn_tanh"), (GEMM, KERNEL), (KERNEL, GEMM)),
    (dict(mode="gru", reset_after=False), (GEMM, KERNEL) * 2, (KERNEL, GEMM) * 2),
    (dict(mode="lstm", proj_size=2), (GEMM, KERNEL, GEMM, "setitem"), (KERNEL, GEMM, KERNEL, GEMM)),
    (dict(mode="lstm", recurrent_dropout=0.5), ("multiply", GEMM, KERNEL), (KERNEL, GEMM, "multiply")),
    (dict(mode="lstm", zoneout=0.5, zoneout_cell=0.5),
     ("setitem", "setitem", GEMM, KERNEL, KERNEL, KERNEL), (KERNEL, KERNEL, KERNEL, GEMM, "add", "add")),
], ids=["lstm", "gru", "rnn", "gru-reset-before", "lstm-proj", "lstm-recurrent-dropout", "lstm-zoneout"])
def test_each_captured_step_is_its_gemms_and_kernels(config: dict, forward_step: tuple, backward_step: tuple):
    """The graph of a T = 5 loop is exactly T times the step's GEMMs and kernels (``host_func`` under the
    simulator: the GEMMs are the engine's own kernel, as CuPy refuses cuBLAS in a capture) and the variants'
    few elementwise operations: nothing per step is left out or added (the GRU backward clears its carry
    once, before the loop)."""
    spec = _spec(config)
    case = make_case(spec, 5, 3, seed=1, lengths="full")
    with cupy_sim.installed(capture_after=0):
        _check_against_reference(case, seed=2)
    assert _graph_nodes("forward") == forward_step * 5
    backward = _graph_nodes("backward")
    if spec.mode == "gru":
        assert backward[0] == "setitem"
        backward = backward[1:]
    assert backward == backward_step * 5


def test_first_call_step_by_step_second_captured_later_replayed() -> None:
    """The default policy: a shape's first call issues its loop step by step (a warm-up, and a shape seen
    once never costs a capture), the second captures it and launches the graph, later ones only launch."""
    spec = _spec(dict(mode="lstm", bidirectional=True))
    T = 4
    lengths = np.array([4, 0, 2])  # the lengths are part of a graph's key
    with cupy_sim.installed(capture_after=cuda_graphs.CAPTURE_AFTER):
        logs = [_check_against_reference(make_case(spec, T, 3, seed=s).with_(lengths=lengths), s)
                for s in range(3)]
    first, second, third = (_names(log, captured=False) for log in logs)
    assert first["graph_launch"] == 0 and first["host_func"] >= 2 * 2 * 1  # every step of 4 loops
    assert second["graph_launch"] == third["graph_launch"] == 4
    assert _names(logs[1], captured=True)["host_func"] > 0 and _names(logs[2], captured=True) == Counter()
    assert second["host_func"] == third["host_func"] == 0


def test_graphs_are_kept_per_stream_and_launched_on_it() -> None:
    spec = _spec(dict(mode="gru"))
    case = make_case(spec, 3, 2, seed=0, lengths="full")
    with cupy_sim.installed(capture_after=0):
        for _ in range(2):
            streams = [fake_cupy.Stream(), fake_cupy.Stream()]
            for stream in streams:
                with stream, fake_cupy.issued() as log:
                    _check_against_reference(case, seed=0)
                launched = {op[1] for op in log if op.name == "graph_launch"}
                assert launched == {stream.ptr}
    assert len(ENGINE.kernel.graphs.graphs()) == 2 * 2 * 2  # 2 passes x (2 + 2) streams


def test_kept_programs_are_bounded_by_the_memory_they_hold(monkeypatch) -> None:
    """Programs (and their graphs) are kept by the bytes their buffers hold, least recently used out first;
    a budget below one program still keeps the program in use."""
    spec = _spec(dict(mode="lstm"))
    with cupy_sim.installed(capture_after=0):
        for seed, T in enumerate((3, 4)):
            _check_against_reference(make_case(spec, T, 2, seed=seed, lengths="full"), seed)
        sizes = {key: program.nbytes for key, program in ENGINE.kernel.graphs.programs()}
        assert len(sizes) == 4 and all(sizes.values()) and ENGINE.kernel.graphs.held() == sum(sizes.values())
        ENGINE.kernel.graphs.clear()
        monkeypatch.setattr(cuda_graphs, "max_bytes", max(sizes.values()))  # room for one program
        for seed, T in enumerate((3, 4, 3, 4)):
            _check_against_reference(make_case(spec, T, 2, seed=seed, lengths="full"), seed)
            kept = ENGINE.kernel.graphs.programs()
            assert len(kept) == 1 and kept[0][0][0] == "backward", "the program in use is the one kept"
            assert len(ENGINE.kernel.graphs.graphs()) == 1
        monkeypatch.setattr(cuda_graphs, "max_bytes", 1)  # below any program: the one in use stays
        _check_against_reference(make_case(spec, 3, 2, seed=9, lengths="full"), 9)
        assert len(ENGINE.kernel.graphs.programs()) == 1


@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "step-by-step"])
def test_a_known_key_builds_no_program_step_by_step_or_replayed(monkeypatch, graphs) -> None:
    """A call whose key was seen reuses its program, step by step as well as replayed: no program is built,
    so none of its buffers is allocated again (a program allocates only when built); only the results are
    new arrays."""
    monkeypatch.setattr(cuda_graphs, "use_graphs", graphs)
    built = []
    init = cupy_steps.StepProgram.__init__
    monkeypatch.setattr(cupy_steps.StepProgram, "__init__",
                        lambda self, *a, **k: (built.append(type(self).__name__), init(self, *a, **k))[1])
    spec = _spec(dict(mode="gru", bidirectional=True, recurrent_dropout=0.2))
    with cupy_sim.installed(capture_after=1):
        for seed in range(3):
            before, case = len(built), make_case(spec, 4, 3, seed=seed).with_(lengths=np.array([4, 0, 2]))
            _check_against_reference(case, seed)
            assert len(built) - before == (4 if seed == 0 else 0)
    held = ENGINE.kernel.graphs.held()
    assert held == sum(program.nbytes for _, program in ENGINE.kernel.graphs.programs()) > 0


def test_without_graphs_every_step_is_issued(monkeypatch) -> None:
    monkeypatch.setattr(cuda_graphs, "use_graphs", False)
    spec = _spec(dict(mode="rnn_tanh"))
    with cupy_sim.installed(capture_after=0):
        for seed in range(2):
            log = _check_against_reference(make_case(spec, 4, 2, seed=seed, lengths="full"), seed)
            names = _names(log)
            assert names["graph_launch"] == 0 and names["host_func"] == 2 * 2 * 4  # GEMM, kernel; both passes
    assert ENGINE.kernel.graphs.graphs() == []


def _capture_fails(monkeypatch, mode: str, product, expected: str) -> None:
    """A loop whose step product is ``product`` fails its capture with ``expected``; the next call (step by
    step) equals the reference engine, and no stream is left capturing."""
    case = make_case(_spec(dict(mode=mode)), 3, 2, seed=0, lengths="full")
    with cupy_sim.installed(capture_after=0):
        with monkeypatch.context() as patch:
            patch.setattr(cupy_steps.StepProgram, "product", product)
            with pytest.raises(cuda_graphs.GraphCaptureError, match=expected):
                forward_backward(case, CUPY)
        _check_against_reference(case, seed=0)
    assert np.all([not stream.is_capturing() for stream in fake_cupy._STREAMS])


def test_a_loop_that_allocates_fails_its_capture_and_says_how_to_run_without(monkeypatch) -> None:
    """The stand-in refuses an allocation inside a capture, as a replayed graph would use memory it no
    longer owns; the error names the way out, and the capture stream is usable again afterwards."""
    def allocating_product(self, a, w, out):
        return lambda t, n: out.__setitem__(Ellipsis, out * self.one)  # a temporary per step

    _capture_fails(monkeypatch, "rnn_tanh", allocating_product, r"multiply without out=.*use_graphs = False")


def test_a_loop_that_calls_cublas_fails_its_capture_as_cupy_refuses_it(monkeypatch) -> None:
    """The step's GEMM through ``cupy.matmul`` (the engine before issue 44) fails every capture, as CuPy
    refuses cuBLAS while a stream captures (cupy_backends/cuda/libs/cublas.pyx, ``setStream``); the engine's
    own GEMM kernel is what lets the loop be captured."""
    def cublas_product(self, a, w, out):
        def rows(x, t, n):
            return x[t, :n] if x.ndim == 3 else x[:n]

        return lambda t, n: self.xp.matmul(rows(a, t, n), w, out=rows(out, t, n))

    expected = f"NotImplementedError: {fake_cupy.CUBLAS_IN_CAPTURE}; set"
    _capture_fails(monkeypatch, "lstm", cublas_product, expected)
