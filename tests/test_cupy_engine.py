"""The cupy engine: what runs on CPU here (availability, refusal of NumPy arrays, launch shapes) and the
GPU tests (marker ``gpu``): the shared cases of ``support.rnn_cases`` on CuPy arrays with this engine and with
the reference engine (the GPU oracle), both against the reference engine on NumPy; float16; dropout masks;
the time loops as CUDA graphs (replays equal the reference, launch nothing from the host, take nothing from
CuPy's memory pool while captured, run on the caller's stream).

The kernels' numerics are also executed on CPU under numba's CUDA simulator (``tests_cudasim/``), where the
shared suites also run the engine's CuPy branch end to end on a NumPy-backed CuPy stand-in
(``tests_cudasim/test_shared_suites.py``, every loop captured and replayed there), and compiled for sm_90
(``test_cuda_kernels_ptx.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
from support.rnn_cases import assert_close, forward_backward, make_case, tolerances

from arrayrnn import EngineUnavailableError, RNNSpec
from arrayrnn.core.backend import cupy_module
from arrayrnn.engines import probe_call, select_engine
from arrayrnn.engines.cupy import graphs as cuda_graphs
from arrayrnn.engines.cupy import kernels as ck
from arrayrnn.engines.cupy import launch as cuda_launch
from arrayrnn.engines.cupy.engine import ENGINE, Device

SPEC = RNNSpec(mode="lstm", input_size=3, hidden_size=4, dtype="float64")


def _gpu_reason() -> str | None:
    cp = cupy_module()
    if cp is None:
        return "CuPy is not installed"
    try:
        count = cp.cuda.runtime.getDeviceCount()
    except Exception as err:  # no driver, no device: CuPy raises its own runtime errors
        return f"no CUDA device ({err})"
    return None if count > 0 else "no CUDA device"


GPU_REASON = _gpu_reason()
needs_gpu = pytest.mark.skipif(GPU_REASON is not None, reason=f"needs a GPU: {GPU_REASON}")


# -- CPU -------------------------------------------------------------------------------------------
def test_engine_refuses_numpy_arrays_with_the_reason():
    reason = ENGINE.check(probe_call(SPEC, np))
    assert reason is not None and "CuPy" in reason
    with pytest.raises(EngineUnavailableError, match=r"engine = 'cupy' cannot run this call: .*CuPy"):
        select_engine("cupy", probe_call(SPEC, np))


def test_kernels_refuse_numpy_arrays_outside_the_simulator():
    with pytest.raises(TypeError, match=r"NumPy arrays; they run on CuPy arrays .*NUMBA_ENABLE_CUDASIM=1"):
        Device(np)


@pytest.mark.parametrize("elements, expected", [(0, (1, 1)), (1, (1, 1)), (12, (1, 12)), (128, (1, 128)),
                                                (129, (2, 128)), (1000, (8, 128))])
def test_launch_shape_covers_every_element(elements, expected):
    blocks, threads = ck.launch_shape(elements)
    assert (blocks, threads) == expected
    assert blocks * threads >= elements


@pytest.mark.parametrize("elements, expected", [(0, (1, 128)), (128, (1, 128)), (384, (3, 128)),
                                                (5 * 8, (5, 8))])
def test_a_fixed_block_width_gives_one_block_per_row(elements, expected):
    """The layer-norm kernels' launches: ``rows * width`` threads in blocks of ``width``, one block a row."""
    assert ck.launch_shape(elements, block=expected[1]) == expected


class _SynchronisingLoop:
    """A program whose loop waits for its stream, which a capture cannot hold."""

    nbytes = 0  # holds no buffer

    def __init__(self, cupy):
        self.cupy = cupy

    def issue(self) -> None:
        self.cupy.cuda.get_current_stream().synchronize()


def test_a_failed_capture_names_its_cause_not_the_invalidated_capture():
    """CUDA invalidates a capture after a refused call (``cudaStreamSynchronize`` here), so ending it fails
    too (``cudaErrorStreamCaptureInvalidated``); the error says what the loop did, and the stream can capture
    again."""
    from support import fake_cupy

    cache = cuda_graphs.GraphCache()
    with fake_cupy.installed() as cupy, cupy.cuda.Stream(non_blocking=True):
        for _ in range(cuda_graphs.CAPTURE_AFTER):
            cache.run(cupy, "key", lambda: _SynchronisingLoop(cupy), lambda p: None)
        with pytest.raises(cuda_graphs.GraphCaptureError, match=r"CUDARuntimeError: "
                           r"cudaErrorStreamCaptureUnsupported: .*use_graphs = False"):
            cache.run(cupy, "key", lambda: _SynchronisingLoop(cupy), lambda p: None)
        assert not any(s.is_capturing() for s in cache._state().capture_streams.values())


# -- GPU -------------------------------------------------------------------------------------------
def _on_gpu(case):
    cp = cupy_module()

    def move(a):
        return None if a is None else cp.asarray(a)

    return case.with_(params=case.params.to(cp), x=move(case.x), h0=move(case.h0), c0=move(case.c0),
                      dy=move(case.dy), dh_n=move(case.dh_n), dc_n=move(case.dc_n))


def _results(pair, other):
    """``(name, a, b)`` for each output and gradient of two ``(result, grads)`` pairs (both present or
    both None)."""
    (res, g), (ref, ref_g) = pair, other
    for what, a, b in (("y", res.y, ref.y), ("h_n", res.h_n, ref.h_n), ("c_n", res.c_n, ref.c_n),
                       ("dx", g.dx, ref_g.dx), ("dh0", g.dh0, ref_g.dh0), ("dc0", g.dc0, ref_g.dc0),
                       ("dparams", g.dparams.data, ref_g.dparams.data)):
        assert (a is None) == (b is None), what
        if a is not None:
            yield what, a, b


def _compare(gpu_pair, cpu_pair, tol):
    cp = cupy_module()
    for what, a, b in _results(gpu_pair, cpu_pair):
        assert isinstance(a, cp.ndarray), what
        assert_close(cp.asnumpy(a).astype(np.float64), b, what, **tol)


CONFIGS = [
    dict(mode="rnn_tanh", bidirectional=True),
    dict(mode="rnn_relu", bias="single_inp"),
    dict(mode="lstm", num_layers=2, bidirectional=True, cell_clip=0.5),
    dict(mode="lstm", proj_size=3, bias="single_rec"),
    dict(mode="gru", bidirectional=True),
    dict(mode="gru", reset_after=False, bidirectional=True, bias="none"),
    dict(mode="gru", num_layers=2, bias="single_rec"),
]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("engine", ["cupy", "reference"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("lengths", ["full", "zeros"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_gpu_engines_match_the_cpu_reference(engine, dtype, config, lengths, batch_first):
    spec = RNNSpec(input_size=5, hidden_size=6, dtype=dtype, **config)
    case = make_case(spec, T=7, B=5, seed=3, lengths=lengths, batch_first=batch_first)
    _compare(forward_backward(_on_gpu(case), engine), forward_backward(case, "reference"), tolerances(dtype))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("config", CONFIGS[2:5], ids=["lstm", "lstm-proj", "gru"])
def test_float16_storage_with_float32_math(config):
    """float16 in and out, float32 inside: within 2e-2 (a few float16 ulps on O(1) values) of float32."""
    spec32 = RNNSpec(input_size=5, hidden_size=6, dtype="float32", **config)
    case32 = make_case(spec32, T=7, B=5, seed=4, lengths="zeros")
    case16 = _on_gpu(case32.with_(params=case32.params.astype("float16"), x=case32.x.astype(np.float16),
                                  h0=case32.h0.astype(np.float16),
                                  c0=None if case32.c0 is None else case32.c0.astype(np.float16),
                                  dy=case32.dy.astype(np.float16), dh_n=case32.dh_n.astype(np.float16),
                                  dc_n=None if case32.dc_n is None else case32.dc_n.astype(np.float16)))
    res, g = forward_backward(case16, "cupy")
    assert res.y.dtype == np.float16 and g.dparams.data.dtype == np.float16
    _compare((res, g), forward_backward(case32, "reference"), dict(rtol=2e-2, atol=2e-2))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_same_dropout_masks_as_the_cpu_engines(mode):
    spec = RNNSpec(mode=mode, input_size=5, hidden_size=6, num_layers=3, bidirectional=True, dropout=0.5,
                   dtype="float64")
    case = make_case(spec, T=6, B=4, seed=5, lengths="zeros")
    gpu_pair = forward_backward(_on_gpu(case), "cupy", seed=11)
    _compare(gpu_pair, forward_backward(case, "reference", seed=11), tolerances("float64"))
    other_seed = forward_backward(case, "reference", seed=12)[0]
    assert not np.allclose(cupy_module().asnumpy(gpu_pair[0].y), other_seed.y)  # the masks matter


# -- GPU: the time loops as CUDA graphs ----------------------------------------------------------------
class CountingDriver(cuda_launch.Driver):
    """The real driver, its kernel launches counted."""

    def __init__(self, inner: cuda_launch.Driver):
        self.inner, self.launches = inner, 0

    def load_module(self, image):
        return self.inner.load_module(image)

    def get_function(self, module, name):
        return self.inner.get_function(module, name)

    def unload_module(self, module):
        self.inner.unload_module(module)

    def launch(self, function, blocks, threads, stream, params):
        self.launches += 1
        self.inner.launch(function, blocks, threads, stream, params)


GRAPH_CONFIGS = [
    dict(mode="lstm", num_layers=2, bidirectional=True),
    dict(mode="gru", reset_after=False, recurrent_dropout=0.3, zoneout=0.2),
    dict(mode="lstm", proj_size=3, peepholes=True, cell_clip=0.5, zoneout=0.1, zoneout_cell=0.2,
         recurrent_dropout=0.2, weight_dropout=0.3),
    dict(mode="gru", bidirectional=True, zoneout=0.3),
    dict(mode="rnn_relu", bias="single_rec"),
]


@pytest.fixture
def counted_launches():
    ENGINE.kernel.graphs.clear()
    counting = CountingDriver(cuda_launch.driver())
    before = cuda_launch.use_driver(counting)
    yield counting
    cuda_launch.use_driver(before)
    ENGINE.kernel.graphs.clear()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("config", GRAPH_CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_gpu_graph_replays_equal_the_cpu_reference_and_launch_nothing_from_the_host(config, dtype,
                                                                                    counted_launches):
    """Three calls of one shape with new inputs each (step by step, captured, replayed), on a non-default
    stream, each equal to the reference engine on NumPy; the replayed call launches no kernel itself."""
    spec = RNNSpec(input_size=5, hidden_size=6, dtype=dtype, **config)
    lengths = np.array([7, 0, 3, 7, 5])  # part of a graph's key: the same for the three calls
    launches = []
    with cupy_module().cuda.Stream():
        for seed in range(3):
            case = make_case(spec, T=7, B=5, seed=seed).with_(lengths=lengths)
            gpu = forward_backward(_on_gpu(case), "cupy", seed=seed)
            _compare(gpu, forward_backward(case, "reference", seed=seed), tolerances(dtype))
            launches.append(counted_launches.launches)
    assert launches[0] > 0 and launches[2] == launches[1]
    # one graph per phase and direction: layers of one shape share a key (the time loop reads no input
    # size), each layer loading its own inputs into the program before the replay
    assert len(ENGINE.kernel.graphs.graphs()) == 2 * spec.num_directions


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("config", GRAPH_CONFIGS[:3], ids=["lstm", "gru-reset-before", "lstm-every-variant"])
def test_gpu_capture_takes_nothing_from_cupys_memory_pool(config, monkeypatch):
    """Nothing inside a captured loop allocates from CuPy's pool (a replay would write memory the pool may
    have handed to someone else): cuBLAS and CuPy's elementwise kernels under capture included."""
    cp = cupy_module()

    class MallocCount(cp.cuda.MemoryHook):
        name = "arrayrnn-capture-mallocs"

        def __init__(self):
            super().__init__()
            self.mallocs = []

        def malloc_preprocess(self, **kwargs):
            self.mallocs.append(kwargs.get("size"))

    hook, capture = MallocCount(), cuda_graphs.GraphCache._capture

    def watched(xp, state, program):
        with hook:
            return capture(xp, state, program)

    monkeypatch.setattr(cuda_graphs.GraphCache, "_capture", staticmethod(watched))
    ENGINE.kernel.graphs.clear()
    spec = RNNSpec(input_size=5, hidden_size=6, dtype="float32", **config)
    case = _on_gpu(make_case(spec, T=6, B=4, seed=0, lengths="zeros"))
    for _ in range(2):
        forward_backward(case, "cupy", seed=1)
    assert ENGINE.kernel.graphs.graphs() and hook.mallocs == []
    ENGINE.kernel.graphs.clear()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
def test_twins_give_the_builtin_kernels_bits_on_a_gpu(mode, dtype):
    """The built-in cells written through the cell API (tests/support/twin_cells.py) on the cupy engine: the
    built-in kernels' bits, forward and backward (the CUDA forms of ``cellmath`` are the built-in kernels'
    formulas, ``gate_math`` has the twins' association). Unchecked until a GPU runs it: under the simulator
    the twins run ``cellmath``'s NumPy forms (tests_cudasim/test_custom_cells_sim.py: to 1e-10)."""
    from support.twin_cells import twin_params

    spec = RNNSpec(mode=mode, input_size=3, hidden_size=5, num_layers=2, bidirectional=True, dtype=dtype)
    case = make_case(spec, 6, 4, seed=2, lengths="zeros")
    builtin = forward_backward(_on_gpu(case), "cupy")
    twin = forward_backward(_on_gpu(case.with_(params=twin_params(case.params))), "cupy")
    cp = cupy_module()
    for what, a, b in _results(builtin, twin):
        np.testing.assert_array_equal(cp.asnumpy(a), cp.asnumpy(b), err_msg=what)
