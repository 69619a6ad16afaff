"""Kernel-level tests of the numba engine: activations, allocation, signatures.

Oracles are plain NumPy in float64. The engine-level comparison with the reference engine lives in
test_numba_engine.py; the shared test bodies (tests/test_rnn_*.py) run on both engines through the
``engine`` fixture.
"""

from __future__ import annotations

import inspect

import numba
import numpy as np
import pytest
from numba.core.runtime import _nrt_python, rtsys
from support.fresh_process import run_fresh

import arrayrnn as ar
from arrayrnn.engines.numba import gru_loops, loop_parts, lstm_loops, rnn_loops

SIGMOID, TANH = 0, 1


def _activate(kind: int, x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    loop_parts.activate(kind, x, out)
    return out


def _grid(dtype) -> np.ndarray:
    dense = np.linspace(-30.0, 30.0, 200_001)
    near_zero = np.linspace(-0.6, 0.6, 50_001)
    edges = [0.0, 1e-30, -1e-8, 0.4, -0.4, 0.39999998, 86.9, -86.9, 87.5, -87.5]
    return np.concatenate([dense, near_zero, edges]).astype(dtype)


def test_float32_tanh_is_within_3_ulp_everywhere():
    x = _grid(np.float32)
    exact = np.tanh(x.astype(np.float64))
    got = _activate(TANH, x).astype(np.float64)
    ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got - exact) / ulp) <= 3.0


def test_float32_sigmoid_has_float_relative_accuracy_until_underflow():
    x = _grid(np.float32)
    exact = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    got = _activate(SIGMOID, x).astype(np.float64)
    normal = x > -80.0
    assert np.max(np.abs(got - exact)[normal] / exact[normal]) <= 3e-7
    assert np.max(np.abs(got - exact)[~normal]) <= 2e-38


def test_float64_activations_are_libm_accurate():
    x = _grid(np.float64)
    with np.errstate(over="ignore"):
        exact_sigmoid = 1.0 / (1.0 + np.exp(-x))
    np.testing.assert_allclose(_activate(SIGMOID, x), exact_sigmoid, rtol=2e-16 * 4, atol=0)
    np.testing.assert_allclose(_activate(TANH, x), np.tanh(x), rtol=2e-16 * 4, atol=1e-300)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_activations_saturate_and_propagate_nan(dtype):
    x = np.array([-np.inf, -1e4, 1e4, np.inf, np.nan], dtype)
    sig, th = _activate(SIGMOID, x), _activate(TANH, x)
    np.testing.assert_allclose(sig[:4], [0.0, 0.0, 1.0, 1.0], atol=1e-37)
    np.testing.assert_array_equal(th[:4], [-1.0, -1.0, 1.0, 1.0])
    assert np.isnan(sig[4]) and np.isnan(th[4])


# -- allocation and compilation -------------------------------------------------------------------
_CONFIGS = {
    "lstm": dict(mode="lstm", bidirectional=True),
    "lstm-proj-clip": dict(mode="lstm", proj_size=2, cell_clip=0.5),
    "gru": dict(mode="gru", bidirectional=True),
    "gru-reset-before": dict(mode="gru", reset_after=False, bias="single_rec"),
    "rnn_relu": dict(mode="rnn_relu"),
    "lstm-variants": dict(mode="lstm", proj_size=2, recurrent_dropout=0.3, zoneout=0.2, peepholes=True),
    "gru-reset-before-variants": dict(mode="gru", reset_after=False, recurrent_dropout=0.3, zoneout=0.2),
}


def _nrt_allocations(spec: ar.RNNSpec, T: int) -> int:
    """NRT (numba runtime) allocations of one training forward + backward on the numba engine."""
    params = ar.PackedParams.init(spec)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T, 6, spec.input_size)).astype(spec.dtype)
    lengths = rng.integers(0, T + 1, 6)
    ar.rnn_backward(ar.rnn_forward(params, x, lengths=lengths, training=True, engine="numba"))  # compile
    before = rtsys.get_allocation_stats()
    ar.rnn_backward(ar.rnn_forward(params, x, lengths=lengths, training=True, engine="numba"))
    after = rtsys.get_allocation_stats()
    assert after.alloc - before.alloc == after.free - before.free  # and nothing leaks
    return after.alloc - before.alloc


@pytest.mark.parametrize("config", sorted(_CONFIGS))
def test_compiled_loops_allocate_nothing_per_step(config):
    # numba's own allocations bypass tracemalloc; its runtime counts them. The count per call must not
    # grow with the number of steps (it is a few per call: the boxed arguments, the variants' masks)
    _nrt_python.memsys_enable_stats()
    spec = ar.RNNSpec(input_size=3, hidden_size=4, **_CONFIGS[config])
    assert _nrt_allocations(spec, T=3) == _nrt_allocations(spec, T=40)


def _in_a_fresh_cache(script: str, tmp_path) -> str:
    """``script``'s output in a user's new process (:func:`support.fresh_process.run_fresh`): every kernel it
    calls is compiled there (a caller loaded from the cache neither lists its callees' signatures nor shows
    its IR)."""
    out = run_fresh(script, tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


_SIGNATURES = """
import numpy as np
from arrayrnn.engines.numba import packed_gemm, simd_ir
rng = np.random.default_rng(2)
for width in (3, 13, 21):
    a, b = rng.standard_normal((7, 5)).astype("float32"), rng.standard_normal((5, width)).astype("float32")
    np.testing.assert_allclose(packed_gemm.matmul(a, packed_gemm.pack_b(b), width), a @ b, rtol=1e-5)
    b4 = rng.standard_normal((5, 4 * width)).astype("float32")   # gate groups: the kernel from two callers
    grouped = packed_gemm.matmul(a, packed_gemm.pack_b(b4, 4), 4 * width, 4)
    np.testing.assert_allclose(grouped, a @ b4, rtol=1e-5)
print(len(packed_gemm.block.signatures), len(simd_ir.tile.signatures))
"""


def test_the_micro_kernel_has_one_signature(tmp_path):
    # a product whose last block has a partial vector after full ones (13 columns with 8-lane float32
    # vectors, 21 with 16) splits the block in two; a literal vector count there compiled block and the
    # micro-kernel again (numba types a literal 1 apart: about 4 s of every first compile); the gate groups
    # call the kernel themselves and through block, with the same types
    assert _in_a_fresh_cache(_SIGNATURES, tmp_path) == "1 1"


_ACTIVATION_IR = r"""
import re
import numpy as np
from arrayrnn.engines.numba import loop_parts as loops
x = np.linspace(-3.0, 3.0, 64).astype("float32")
loops.activate(0, x, np.empty_like(x))
ir = loops.activate.inspect_llvm(loops.activate.signatures[0])
called = {name for name in re.findall(r'call [^\n]*@"?([\w.$]+)', ir) if "arrayrnn" in name}
print(sorted(name for name in called if "activate" not in name), bool(re.search(r"<\d+ x float>", ir)))
"""


def test_the_activations_are_compiled_apart_and_inlined_by_llvm(tmp_path):
    # numba's own inlining typed the polynomials again at every call site (about half of a first compile);
    # compiled apart, LLVM must still inline them: a call left in a loop would stop its vectorisation
    assert _in_a_fresh_cache(_ACTIVATION_IR, tmp_path) == "[] True"


_NORM_HELPERS = """
import numpy as np
import arrayrnn as ar
from arrayrnn.engines.numba import loop_parts, lstm_loops
for mode in ("lstm", "gru", "rnn_tanh"):
    spec = ar.RNNSpec(mode, 3, 4, dtype="float32")
    x = np.ones((3, 2, 3), "float32")
    ar.rnn_backward(ar.rnn_forward(ar.PackedParams.init(spec), x, training=True, engine="numba"))
helpers = [loop_parts.norm_rows, loop_parts.norm_input, loop_parts.norm_rows_grad, lstm_loops._lstm_norm_tile,
           lstm_loops._lstm_norm_grads, loop_parts.zero_idle_raw_grads, loop_parts.row_stats,
           loop_parts._rescaled_rstd]
print(sum(len(f.signatures) for f in helpers), len(lstm_loops.lstm_backward_loop.signatures))
"""


def test_calls_without_layer_norm_do_not_compile_its_helpers(tmp_path):
    # off, the norm's bundle is None and numba prunes its branches before typing: the demo LSTM's first
    # training compile went 41 -> 29 s (bench/RESULTS.md) when a run-time flag stopped keeping them reachable
    assert _in_a_fresh_cache(_NORM_HELPERS, tmp_path) == "0 1"


def test_one_compiled_signature_per_dtype_and_on_disk_cache():
    # every option (projection, clipping, cache kept or not, bias modes, direction) shares one signature
    rng = np.random.default_rng(1)
    for config in _CONFIGS.values():
        for dtype in ("float32", "float64"):
            spec = ar.RNNSpec(input_size=3, hidden_size=4, dtype=dtype, **config)
            x = rng.standard_normal((4, 2, 3)).astype(dtype)
            ar.rnn_forward(ar.PackedParams.init(spec), x, engine="numba")
            ar.rnn_backward(ar.rnn_forward(ar.PackedParams.init(spec), x, training=True, engine="numba"))
    loops = [lstm_loops.lstm_forward_loop, lstm_loops.lstm_backward_loop, gru_loops.gru_forward_loop,
             gru_loops.gru_backward_loop, rnn_loops.rnn_forward_loop, rnn_loops.rnn_backward_loop]
    for loop in loops:
        # one per dtype and per layer norm off (its bundle None: numba prunes its branches) or on
        norm_at = list(inspect.signature(loop.py_func).parameters).index("norm")
        without = [s for s in loop.signatures if isinstance(s[norm_at], numba.types.NoneType)]
        assert without and len(without) <= 2, (loop.__name__, loop.signatures)
        assert len(loop.signatures) - len(without) <= 2, (loop.__name__, loop.signatures)
        # cache=True: compiled code kept on disk (numba's FunctionCache, made safe to fail: .numba_cache)
        assert type(loop._cache).__name__ == "SafeFunctionCache"
