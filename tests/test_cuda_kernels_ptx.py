"""The cupy engine's CUDA kernels compile to PTX for sm_90 (Hopper) without a GPU, in float32 and float64,
through the engine's own path (:mod:`arrayrnn.engines.cupy.launch`: ``numba.cuda.compile_ptx`` with the
parameter kinds a launch site packs, then cuda.core's Linker to a cubin).

``numba.cuda.compile_ptx`` needs numba-cuda with its NVVM (the ``numba-cuda[cu13]`` test extra), not a
device. Their numerics are executed under the CUDA simulator in ``tests_cudasim/``; this checks that the
very same code also passes numba's CUDA type inference and NVVM for a real GPU, that float32 kernels do
float32 math (no float64 instruction sneaks in through a Python float literal), that the parameter block a
launch site packs is the kernel's ``.param`` list (numba's ABI, which numba-cuda calls unstable: a change
fails here, not on a GPU), and that the PTX links to an sm_90 cubin.
"""

from __future__ import annotations

import re
import warnings

import numba
import numpy as np
import pytest

from arrayrnn.engines.cupy import kernels as ck
from arrayrnn.engines.cupy import launch as cl

if numba.config.ENABLE_CUDASIM:  # pragma: no cover - this module belongs to the main (non-simulator) run
    pytest.skip("compile_ptx is not available under the CUDA simulator", allow_module_level=True)


def _example_args(name: str, dtype: type) -> tuple:
    """Arguments shaped like the engine's (their numba types are what matters)."""
    a1, a2, a3, a4 = (np.zeros((1,) * k, dtype) for k in (1, 2, 3, 4))
    slot = np.int64(0)
    one, t, n, flag = dtype(1), np.int64(0), np.int64(1), True
    return {
        "product_step": (t, n, one, a3, flag, a2, a3, flag, n),
        "rnn_forward_step": (t, n, one, flag, a3, a2, a2, a3),
        "rnn_backward_step": (t, n, one, flag, a3, a3, a2, a3),
        "lstm_forward_step": (t, n, one, a3, a2, a2, a2, a3, a2, flag, flag, a3, a3, one, one),
        "add_carry_step": (t, n, a3, a2, a3),
        "lstm_backward_step": (t, n, one, a3, a3, a3, a3, a3, a2, a2, flag, a2, a3, flag, one, one),
        "gru_forward_step": (t, n, one, a3, a2, a1, a2, a3, flag, a3),
        "gru_rz_step": (t, n, one, a3, a2, a2, a2),
        "gru_n_step": (t, n, a3, a2, a2, a3),
        "gru_backward_step": (t, n, one, flag, a3, a3, a3, a3, a2, a2, a3, a3, a2, a2, a2),
        "gru_r_backward_step": (t, n, one, a3, a3, a2, a3, a2, a2),
        "lstm_peephole_forward_step": (t, n, one, a3, a2, a2, a2, a2, a3, a2, flag, flag, a3, a3, one, one),
        "lstm_peephole_backward_step": (t, n, one, a3, a3, a3, a3, a2, a3, a2, a2, flag, a2, a3, flag, one,
                                        one),
        "zoneout_step": (t, n, a3, a2, a3, a3, a2),
        "zoneout_cell_step": (t, n, a3, a2, a2, flag, a3),
        "zoneout_split_step": (t, n, one, a3, a3, a2, a3, a2),
        "cell_carry_step": (t, n, one, flag, a3, flag, a3, a2, a2),
        "norm_step": (t, n, one, one, a2, a1, flag, a4, slot),
        "norm_backward_step": (t, n, one, one, a3, flag, a1, a3, a4, slot, a3),
        "lstm_norm_forward_step": (t, n, one, one, a3, a2, a1, a2, flag, a1, a1, a2, a2, a3, a2,
                                   flag, flag, a3, a3, a4, one, one),
        "lstm_norm_backward_step": (t, n, one, one, one, a3, a3, a3, a3, a3, a4, a1, a1, a2, flag, a3, a2, a2,
                                    flag, a2, a3, a3, a3, flag, one, one),
    }[name]


KERNELS = ("product_step", "rnn_forward_step", "rnn_backward_step", "lstm_forward_step", "add_carry_step",
           "lstm_backward_step", "gru_forward_step", "gru_rz_step", "gru_n_step", "gru_backward_step",
           "gru_r_backward_step", "lstm_peephole_forward_step", "lstm_peephole_backward_step", "zoneout_step",
           "zoneout_cell_step", "zoneout_split_step", "cell_carry_step", "norm_step", "norm_backward_step",
           "lstm_norm_forward_step", "lstm_norm_backward_step")


# the layer-norm forwards reduce a row's mean and variance in float64, as the numba loops and the reference
# engine do (a float32 row near 1e20 squares past float32's range); nothing else of theirs is float64
FLOAT64_STATISTICS = ("norm_step", "lstm_norm_forward_step")


def test_every_kernel_is_listed() -> None:
    kernels = {name for name, obj in vars(ck).items() if hasattr(obj, "py_func") and name.endswith("_step")}
    assert kernels == set(KERNELS)


# numba's kernel ABI, as numba-cuda's launcher prepares it: an array is meminfo, parent, nitems, itemsize,
# data, then shape and strides, every one a 64-bit integer; scalars have their own width (a bool one byte)
ABI = {"int64": ["u64"], "float32": ["f32"], "float64": ["f64"], "bool": ["u8"]}


def _abi(arg) -> list[str]:
    if isinstance(arg, np.ndarray):
        return ["u64"] * (5 + 2 * arg.ndim)
    return ABI[np.dtype(type(arg)).name]


def _ptx_params(ptx: str) -> list[str]:
    """The ``.param`` types of the PTX's one ``.entry``, in order."""
    (params,) = re.findall(r"\.entry\s+\S+\s*\((.*?)\)", ptx, re.S)
    return re.findall(r"\.param\s+\.(\w+)\s+\S+_param_\d+", params)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", KERNELS)
def test_kernel_compiles_to_ptx_for_sm90(name: str, dtype: type) -> None:
    kernel, args = getattr(ck, name), _example_args(name, dtype)
    specs = tuple(cl.describe(a, i, name) for i, a in enumerate(args))
    ptx = cl.compile_ptx(kernel, specs, (9, 0))
    assert ".target sm_90" in ptx
    assert re.search(r"\.entry\s", ptx)
    if dtype is np.float32 and name in FLOAT64_STATISTICS:
        assert re.search(r"\.f64\b", ptx), "the row statistics are reduced in float64"
    elif dtype is np.float32:
        assert not re.search(r"\.f64\b", ptx), "float32 kernel does float64 math"
    else:
        assert re.search(r"\.f64\b", ptx)
    params = _ptx_params(ptx)
    assert params == [t for a in args for t in _abi(a)]
    assert len(cl.PackedArgs(specs, args).slots) == len(params)  # one slot per parameter
    assert cl.entry_name(ptx) in ptx and name in cl.entry_name(ptx)
    assert cl.link_cubin(ptx, (9, 0))[:4] == b"\x7fELF"


def _two_products(a, b, c, d, out):  # a kernel body: out[0] = a*b + c*d, which NVVM's -fma=1 would fuse
    out[0] = a[0] * b[0] + c[0] * d[0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_kernels_round_each_product_and_sum_as_written(dtype: type) -> None:
    """The engine compiles with contraction off (:func:`~arrayrnn.engines.cupy.launch.compile_ptx`): ``a * b +
    c * d`` stays two products and a sum. With NVVM's default the built-in LSTM kernel fused ``i * g`` and its
    custom-cell twin ``f * c`` (an H200, 2026-11-30: 1-ulp differences); the one fused sum the engine wants,
    the step GEMM's, asks for it (``cuda.fma``) and keeps it."""
    from numba import cuda

    x = np.zeros(1, dtype)
    kind = "f32" if dtype is np.float32 else "f64"
    specs = tuple(cl.describe(x, i, "two products") for i in range(5))
    ptx = cl.compile_ptx(cuda.jit(_two_products), specs, (9, 0))
    assert not re.search(r"\bfma\.", ptx) and len(re.findall(rf"\bmul\.(rn\.)?{kind}\b", ptx)) == 2
    assert re.search(rf"\badd\.(rn\.)?{kind}\b", ptx)
    args = _example_args("product_step", dtype)
    specs = tuple(cl.describe(a, i, "product_step") for i, a in enumerate(args))
    product = cl.compile_ptx(ck.product_step, specs, (9, 0))
    assert re.search(rf"\bfma\.rn\.{kind}\b", product)


def test_without_numba_cudas_internal_path_the_kernels_compile_with_a_warning(monkeypatch) -> None:
    """A numba-cuda without the internal compile step :func:`~arrayrnn.engines.cupy.launch.compile_ptx`
    uses to switch contraction off still compiles every kernel, through its public ``compile_ptx`` (NVVM's
    default contraction), and says once what that costs."""
    from numba import cuda
    from numba.cuda import compiler

    class WithoutOptions:  # a compiled library of a numba-cuda that keeps its NVVM options elsewhere
        def __init__(self, library):
            self._library = library

        def __getattr__(self, name):
            if name == "_nvvm_options":
                raise AttributeError(f"no attribute {name!r}", name=name, obj=self)
            return getattr(self._library, name)

    internal = compiler._compile_pyfunc_with_fixup
    monkeypatch.setattr(compiler, "_compile_pyfunc_with_fixup",
                        lambda *a, **k: (WithoutOptions(internal(*a, **k)[0]), None))
    monkeypatch.setattr(cl, "_WARNED", set())
    x = np.zeros(1, np.float32)
    specs = tuple(cl.describe(x, i, "two products") for i in range(5))
    with pytest.warns(RuntimeWarning, match="'_nvvm_options'.*-fma=1"):
        ptx = cl.compile_ptx(cuda.jit(_two_products), specs, (9, 0))
    assert re.search(r"\bfma\.rn\.f32\b", ptx)  # contraction on: one product fused
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cl.compile_ptx(cuda.jit(_two_products), specs, (9, 0))  # said once
