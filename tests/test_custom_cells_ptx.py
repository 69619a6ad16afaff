"""Custom cells on the cupy engine without a GPU: ``arrayrnn.cellmath``'s CUDA forms and a cell's generated
kernels compiled to PTX for sm_90 through the engine's own programs (:mod:`arrayrnn.engines.cupy.
custom_programs`, each kernel's launch site compiled as on a GPU, :func:`~arrayrnn.engines.cupy.launch.
compile_ptx`), as ``tests/test_cuda_kernels_ptx.py`` does for the built-in kernels.

Checked: every ``cellmath`` function has a CUDA form and the form computes what the function does (the
forms are plain Python, called here on floats against ``cellmath`` itself); each cell's forward and
backward kernels pass numba-cuda's typing and NVVM, a float32 cell does no float64 math (the forms' constants
in the argument's dtype, a ``where`` / ``maximum`` with a literal ``0.0`` not widening), the launch site's
packed parameters are the PTX's ``.param`` list, and the PTX links to a cubin; a cell numba-cuda cannot
compile fails with an error naming the cell and the function. Their numerics run under the CUDA simulator
(``tests_cudasim/test_custom_cells_sim.py``).
"""

from __future__ import annotations

import re

import numba
import numpy as np
import pytest
from support.every_form_cell import EVERY_FORM
from support.twin_cells import TWINS
from test_cuda_kernels_ptx import _abi, _ptx_params

import arrayrnn as ar
from arrayrnn import cellmath as cm
from arrayrnn.cells.cifg import CIFG
from arrayrnn.engines.base import VariantFlags

if numba.config.ENABLE_CUDASIM:  # pragma: no cover - this module belongs to the main (non-simulator) run
    pytest.skip("compile_ptx is not available under the CUDA simulator", allow_module_level=True)

from arrayrnn.engines.cupy import cell_math  # noqa: E402 - after the simulator check
from arrayrnn.engines.cupy import launch as cl  # noqa: E402
from arrayrnn.engines.cupy.custom_kernels import CellCompileError, kernels_for  # noqa: E402
from arrayrnn.engines.cupy.custom_programs import CustomBackward, CustomForward  # noqa: E402
from arrayrnn.engines.cupy.programs import Shape  # noqa: E402

SM90 = (9, 0)
CELLS = {**{cell.name: cell for cell in TWINS.values()}, "cifg": CIFG, "every_form": EVERY_FORM}


# -- the forms --------------------------------------------------------------------------------------------
def test_every_cellmath_function_has_a_cuda_form() -> None:
    assert set(cell_math.FORMS) == set(cm.__all__)
    for name, form in cell_math.FORMS.items():
        assert form.function is getattr(cm, name)


_POINTS = np.array([-7.5, -2.0, -0.3, -0.0, 0.0, 0.2, 1.0, 3.5, 9.0])


def _samples(name: str, dtype: type) -> list[tuple]:
    x = _POINTS.astype(dtype)
    positive = (np.abs(_POINTS) + 0.125).astype(dtype)
    if name in ("log", "sqrt"):
        return [(v,) for v in positive]
    if name in ("dsigmoid", "dtanh"):
        return [(v,) for v in np.tanh(x)]
    if name in ("maximum", "minimum"):
        return [(a, b) for a in x[::2] for b in x[1::2]] + [(a, 0.0) for a in x]
    if name == "where":
        return [(bool(a > 0), a, b) for a, b in zip(x, x[::-1], strict=True)]
    return [(v,) for v in x]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", sorted(cell_math.FORMS))
def test_each_form_computes_its_cellmath_function(name: str, dtype: type) -> None:
    """The form, run as plain Python on floats of ``dtype``, against ``cellmath``'s own (NumPy) function."""
    impl = cell_math.implementation(name, np.dtype(dtype))
    tol = dict(rtol=1e-6, atol=1e-7) if dtype is np.float32 else dict(rtol=1e-14, atol=1e-15)
    for args in _samples(name, dtype):
        got, want = impl(*args), getattr(cm, name)(*args)
        np.testing.assert_allclose(float(got), float(want), **tol, err_msg=f"{name}{args}")


@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_maximum_and_minimum_propagate_nan(name: str) -> None:
    impl = cell_math.implementation(name, np.dtype(np.float64))
    assert np.isnan(impl(np.nan, 1.0)) and np.isnan(impl(1.0, np.nan))


# -- the kernels ------------------------------------------------------------------------------------------
class PtxDevice:
    """A :class:`~arrayrnn.engines.cupy.engine.Device` whose launch sites compile their kernel's PTX for
    sm_90 (``ptx``: kernel name -> PTX, ``args``: its packed arguments) and launch nothing."""

    xp = np

    def __init__(self) -> None:
        self.ptx: dict[str, str] = {}
        self.args: dict[str, tuple] = {}

    def site(self, kernel, args, block=None):
        name = cl.kernel_name(kernel)
        specs = tuple(cl.describe(a, i, name) for i, a in enumerate(args))
        self.ptx[name], self.args[name] = cl.compile_ptx(kernel, specs, SM90), tuple(args)
        return lambda elements, t, n: None


def _shape(dtype: str, **options: bool) -> Shape:
    lengths = np.array([2, 1], np.int64).tobytes()
    return Shape(2, 2, lengths, False, VariantFlags(True, False, False), np.dtype(dtype), **options)


def _compiled(cell: ar.Cell, dtype: str) -> PtxDevice:
    """Both programs of ``cell`` built on a :class:`PtxDevice`, with every option a kernel takes on."""
    spec = ar.RNNSpec(mode=cell.name, input_size=2, hidden_size=3, dtype=dtype, recurrent_dropout=0.5)
    dev = PtxDevice()
    CustomForward(dev, spec, _shape(dtype, keep=True))
    CustomBackward(dev, spec, _shape(dtype, dc_seq=True))
    return dev


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(CELLS))
def test_a_custom_cells_kernels_compile_to_ptx_for_sm90(name: str, dtype: str) -> None:
    dev = _compiled(CELLS[name], dtype)
    assert {"custom_forward_step", "custom_backward_step"} <= set(dev.ptx)
    for kernel in ("custom_forward_step", "custom_backward_step"):
        ptx, args = dev.ptx[kernel], dev.args[kernel]
        assert ".target sm_90" in ptx
        if dtype == "float32":
            assert not re.search(r"\.f64\b", ptx), f"{name} {kernel}: float32 kernel does float64 math"
        else:
            assert re.search(r"\.f64\b", ptx)
        assert _ptx_params(ptx) == [t for a in args for t in _abi(a)]
        assert cl.link_cubin(ptx, SM90)[:4] == b"\x7fELF"


def test_kernels_are_generated_per_cell_object_not_per_name() -> None:
    """A cell registered again under a name gets kernels of its own; the same object reuses its kernels."""
    first = ar.Cell("ptx_renamed", gates=("h",), forward=TWINS["rnn_tanh"].forward,
                    backward=TWINS["rnn_tanh"].backward)
    second = ar.Cell("ptx_renamed", gates=("h",), forward=TWINS["rnn_relu"].forward,
                     backward=TWINS["rnn_relu"].backward)
    assert kernels_for(first) is kernels_for(first)
    assert kernels_for(first).forward is not kernels_for(second).forward


# -- a cell numba-cuda cannot compile ---------------------------------------------------------------------
def _python_helper(x):
    return x + x


def _uncompilable_forward(pre, h):
    y = cm.tanh(_python_helper(pre))  # a plain Python function: numba cannot call it
    return (y,), (y,)


def _uncompilable_backward(res, d_new):
    return d_new[0] * cm.dtanh(_python_helper(res[0]) - res[0]), 0.0


@pytest.mark.parametrize("broken", ["forward", "backward"])
def test_a_cell_numba_cuda_cannot_compile_fails_naming_the_cell_and_function(broken: str) -> None:
    functions = {"forward": TWINS["rnn_tanh"].forward, "backward": TWINS["rnn_tanh"].backward}
    functions[broken] = {"forward": _uncompilable_forward, "backward": _uncompilable_backward}[broken]
    cell = ar.register_cell(ar.Cell("ptx_uncompilable", gates=("h",), **functions), replace=True)
    try:
        with pytest.raises(CellCompileError, match=rf"cell 'ptx_uncompilable': numba-cuda cannot compile its "
                                                   rf"{broken} function") as info:
            _compiled(cell, "float32")
    finally:
        ar.unregister_cell("ptx_uncompilable")
    assert "_python_helper" in str(info.value)  # numba's reason, with the name it could not type
    assert isinstance(info.value, ValueError)  # a CellDefinitionError
