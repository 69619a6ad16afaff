"""The cuDNN engine end to end without a GPU, against the reference engine (tests/support/cudnn_dry_run.py).

Every call goes through the public ``rnn_forward`` / ``rnn_backward`` with ``engine="cudnn"`` on stand-in
CuPy arrays; cuDNN validates each call the engine makes (fake handle, forked child) and the float64
emulation computes it through the buffers' addresses. The oracle is the reference engine on NumPy (float16:
on the stand-in). Inputs are hostile where the contract says they are never read: NaN in the padding of
``x``, inf/NaN in every padding position of ``dy``, inf/NaN in ``h0``/``c0`` of zero-length rows; and
the cotangents ``dh_n``/``dc_n`` are never zero.

Grid: 4 modes x 4 bias modes x uni/bidirectional x 1-2 layers x projection (LSTM) x time-/batch-major,
with unsorted lengths and zero-length rows; batch-major without padding; float32 / float16; dropout
stacks; canonical params; backward after an inference forward; an all-empty batch; T >= 16 through
``engine="auto"``. H = 5, P = 3.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from support.cudnn import requires_cudnn
from support.cudnn_cases import GRID, check

import arrayrnn as ar
from arrayrnn.core.errors import FormatConversionWarning
from arrayrnn.engines import thresholds

pytestmark = requires_cudnn

@pytest.fixture(scope="module")
def cp():
    """The stand-in CuPy, with ``engine="cudnn"`` the dry run, for this module's tests."""
    from support import cudnn_dry_run

    with cudnn_dry_run.installed() as module:
        yield module


# -- the grid -------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch_first", [False, True], ids=["time-major", "batch-major"])
@pytest.mark.parametrize("spec", GRID, ids=lambda s: f"{s.mode}-{s.bias}-L{s.num_layers}"
                         f"{'-bi' if s.bidirectional else ''}{'-proj' if s.proj_size else ''}")
def test_grid_with_empty_rows_and_hostile_padding(cp, spec, batch_first):
    check(cp, spec, batch_first=batch_first)


@pytest.mark.parametrize("spec", [s for s in GRID if s.bias == "double"],
                         ids=lambda s: f"{s.mode}-L{s.num_layers}{'-bi' if s.bidirectional else ''}"
                         f"{'-proj' if s.proj_size else ''}")
def test_batch_major_without_padding(cp, spec):
    """Every row full length: cuDNN gets batch-major input with no padding (validated through its twin)."""
    from support import cudnn_dry_run

    cudnn_dry_run.VALIDATED.clear()  # validate afresh, not from a cache filled by another test
    twins = cudnn_dry_run.STATS["twin"]
    check(cp, spec, lengths=[5, 5, 5], batch_first=True)
    assert cudnn_dry_run.STATS["twin"] == twins + 3  # forward, backward data, backward weights


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("batch_first", [False, True], ids=["time-major", "batch-major"])
@pytest.mark.parametrize("mode, proj", [("lstm", 3), ("gru", 0), ("rnn_relu", 0)])
def test_reduced_precision(cp, mode, proj, batch_first, dtype):
    spec = ar.RNNSpec(mode=mode, input_size=3, hidden_size=6, num_layers=2, bidirectional=True,
                      proj_size=proj)
    check(cp, spec, batch_first=batch_first, dtype=dtype)


@pytest.mark.parametrize("batch_first", [False, True], ids=["time-major", "batch-major"])
@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_dropout_stack_runs_layer_by_layer_with_the_shared_masks(cp, mode, batch_first):
    spec = ar.RNNSpec(mode=mode, input_size=3, hidden_size=5, num_layers=3, bidirectional=True, dropout=0.4,
                      proj_size=3 if mode == "lstm" else 0, dtype="float64")
    check(cp, spec, batch_first=batch_first, seed=11)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_canonical_params_are_converted_for_the_call(cp, mode):
    spec = ar.RNNSpec(mode=mode, input_size=3, hidden_size=5, num_layers=2, bidirectional=True,
                      dtype="float64")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FormatConversionWarning)
        check(cp, spec, params_format="canonical")


@pytest.mark.parametrize("mode", ["lstm", "rnn_tanh"])
def test_backward_after_an_inference_forward(cp, mode):
    spec = ar.RNNSpec(mode=mode, input_size=3, hidden_size=5, num_layers=2, bidirectional=True,
                      dtype="float64")
    check(cp, spec, inference_first=True)


def test_all_rows_empty(cp):
    spec = ar.RNNSpec(mode="lstm", input_size=3, hidden_size=5, num_layers=2, bidirectional=True,
                      dtype="float64")
    got = check(cp, spec, lengths=[0, 0, 0])
    assert not got["y"].any() and not got["dparams"].any() and not got["dx"].any()


@pytest.mark.parametrize("batch_first", [False, True], ids=["time-major", "batch-major"])
def test_long_sequences_through_auto_pick_cudnn(cp, batch_first):
    spec = ar.RNNSpec(mode="lstm", input_size=3, hidden_size=6, proj_size=4, num_layers=2, bidirectional=True,
                      dtype="float64")
    T = thresholds.AUTO_MIN_SEQ_LEN + 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FormatConversionWarning)
        got = check(cp, spec, lengths=[T, 0, 4, T - 3], batch_first=batch_first, engine="auto",
                     params_format="canonical")
    assert got["engine"] == "cudnn"


def test_every_call_was_validated_by_cudnn_and_emulated(cp):
    """The dry run is not a no-op: a forward and backward made every cuDNN call, each checked by cuDNN."""
    from support import cudnn_dry_run

    cudnn_dry_run._engine_module().ENGINE.plans.clear()  # the size queries run when a plan is made
    before = dict(cudnn_dry_run.STATS)
    check(cp, GRID[-1])
    for name in ("cudnnRNNForward", "cudnnRNNBackwardData_v8", "cudnnRNNBackwardWeights_v8"):
        assert cudnn_dry_run.STATS[name] == before.get(name, 0) + 1, name
        assert cudnn_dry_run.STATS[f"emulated {name}"] == before.get(f"emulated {name}", 0) + 1, name
    assert cudnn_dry_run.STATS["cudnnGetRNNTempSpaceSizes"] > before.get("cudnnGetRNNTempSpaceSizes", 0)


def test_the_engine_runs_on_cupys_current_stream(cp):
    """Each compute call checks that the handle is bound to CuPy's current stream (cudnn_dry_run)."""
    spec = ar.RNNSpec(mode="gru", input_size=3, hidden_size=5, dtype="float64")
    with cp.cuda.Stream() as stream:
        assert stream.ptr != 0
        check(cp, spec)


def test_a_cudnn_buffer_of_the_wrong_size_is_a_value_error_naming_both_sizes(cp):
    spec = ar.RNNSpec(mode="gru", input_size=3, hidden_size=5, dtype="float64")
    good = ar.PackedParams.init(spec, seed=0, xp=cp).to_format("cudnn")
    size = good.data.size
    for wrong in (cp.zeros(size + 1), cp.zeros(size - 1)):
        bad = ar.PackedParams._wrap(spec, wrong, "cudnn")
        message = (rf"params.data has shape \({wrong.size},\); the 'cudnn' format of RNNSpec\(.*\) in "
                   rf"float64 is a 1-D weight space of {size} elements")
        with pytest.raises(ValueError, match=message):
            ar.rnn_forward(bad, cp.zeros((4, 2, 3)), engine="cudnn")
        with pytest.raises(ValueError, match=message):
            bad.to_format("canonical")


def test_auto_does_not_pick_cudnn_where_libcudnn_cannot_load(cp, monkeypatch):
    import cudnn_bindings as cb
    from arrayrnn.engines import forget_choices, probe_call, select_engine

    def missing() -> int:
        raise cb.CudnnLibraryError("no libcudnn.so.9 here")

    spec = ar.RNNSpec(mode="lstm", input_size=3, hidden_size=5, dtype="float64")
    call = probe_call(spec, cp, device=0, seq_len=64)
    assert select_engine("auto", call).name == "cudnn"
    monkeypatch.setattr(cb, "version", missing)
    forget_choices()  # select_engine remembers its answers for an installation; this test changes it
    assert select_engine("auto", call).name == "cupy"
    with pytest.raises(ar.EngineUnavailableError, match=r"engine = 'cudnn' cannot run this call: libcudnn "
                                                        r"cannot be loaded \(no libcudnn.so.9 here\)"):
        select_engine("cudnn", call)


def test_layer_to_format_converts_the_layer_in_place(cp):
    layer = ar.nn.LSTM(3, 4, num_layers=2, bidirectional=True, xp=cp, dtype="float64")
    canonical = layer.params
    assert layer.to_format("canonical") is layer and layer.params is canonical
    x = cp.asarray(np.random.default_rng(0).standard_normal((6, 2, 3)))
    want = ar.rnn_forward(canonical, x, engine="reference").y
    assert layer.to_format("cudnn") is layer
    assert layer.params.format == "cudnn"  # cuDNN's order: every layer's matrices first, then the biases
    assert not np.array_equal(layer.params.data.get()[:canonical.size], canonical.data.get())
    np.testing.assert_array_equal(layer.params.to_format("canonical").data.get(), canonical.data.get())
    np.testing.assert_allclose(layer(x)[0].get(), want.get(), rtol=1e-12, atol=1e-14)
