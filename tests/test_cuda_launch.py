"""arrayrnn.engines.cupy.launch on CPU: the parameter block a launch site packs, what it refuses, and the GPU
launcher's whole path up to the driver (compile, link, load, launch) with the CuPy stand-in and a driver
that records its calls.

The block's layout against numba's ABI is checked per kernel in ``test_cuda_kernels_ptx.py`` (against each
kernel's PTX); its execution in ``tests_cudasim/`` (the simulator decodes it and runs the kernels).
"""

from __future__ import annotations

import ctypes
import json

import numpy as np
import pytest
from support import fake_cupy, launch_record

from arrayrnn import RNNSpec
from arrayrnn.engines.base import VariantFlags
from arrayrnn.engines.cupy import kernels as ck
from arrayrnn.engines.cupy import launch as cl
from arrayrnn.engines.cupy.programs import RnnForward, Shape


def _slots_at(address: int, count: int) -> list[int]:
    """What ``count`` kernel-parameter pointers at ``address`` point to (each a 64-bit slot)."""
    pointers = (ctypes.c_uint64 * count).from_address(address)
    return [ctypes.c_uint64.from_address(p).value for p in pointers]


def test_an_array_is_numbas_five_fields_then_shape_and_byte_strides() -> None:
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)[:, ::2, 1:]  # a strided view
    packed = cl.PackedArgs([cl.describe(v, i, "k") for i, v in enumerate((7, 3, a))], (7, 3, a))
    ptr = a.__array_interface__["data"][0]
    assert packed.slots.tolist() == [7, 3, 0, 0, a.size, 4, ptr, 2, 2, 3, 48, 32, 4]
    assert _slots_at(packed.address, len(packed.slots)) == packed.slots.tolist()


def test_scalars_sit_in_the_low_bytes_of_their_slot() -> None:
    values = (0, 0, np.float32(1.5), np.float64(-2.25), True, False, np.int64(-3))
    packed = cl.PackedArgs([cl.describe(v, i, "k") for i, v in enumerate(values)], values)
    raw = packed.slots.view(np.uint8).reshape(-1, 8)
    assert raw[2, :4].view(np.float32)[0] == 1.5 and not raw[2, 4:].any()
    assert raw[3].view(np.float64)[0] == -2.25
    assert raw[4].tolist() == [1, 0, 0, 0, 0, 0, 0, 0] and not raw[5].any()
    assert raw[6].view(np.int64)[0] == -3


def test_unpacking_gives_the_same_memory_and_values_and_the_step_set_last() -> None:
    a, b = np.random.default_rng(0).standard_normal((3, 4)), np.zeros((0, 5), np.float32)
    values = (0, 0, a[:, 1:], b, np.float64(0.5), True)
    packed = cl.PackedArgs([cl.describe(v, i, "k") for i, v in enumerate(values)], values)
    packed.set_step(5, 2)
    t, n, view, empty, half, flag = packed.unpack()
    assert (t, n, half, flag) == (5, 2, 0.5, True)
    assert view.__array_interface__["data"][0] == a[:, 1:].__array_interface__["data"][0]
    np.testing.assert_array_equal(view, a[:, 1:])
    view[0, 0] = 42.0
    assert a[0, 1] == 42.0  # a view, not a copy
    assert empty.shape == (0, 5) and empty.dtype == np.float32


@pytest.mark.parametrize("value, expected", [(1.0, "float"), (np.float16(1), "float16"), ("a", "str"),
                                             (None, "NoneType")])
def test_an_argument_of_no_kernel_kind_is_refused_by_position_and_kernel(value, expected) -> None:
    with pytest.raises(TypeError, match=rf"argument 3 of kernel lstm_step is .*\({expected}\); expected an "
                                        r"array, a bool, an int or a NumPy float32/float64 scalar"):
        cl.describe(value, 3, "lstm_step")


def test_a_site_needs_the_step_and_the_row_count_first() -> None:
    launcher = cl.SimulatorLauncher()
    with pytest.raises(TypeError, match=r"kernel add_carry_step: the first two arguments must be the step t"):
        launcher.site(ck.add_carry_step, (np.zeros((1, 1, 1)), 0, 0))


def test_the_ptx_entry_is_found_by_name() -> None:
    assert cl.entry_name(".visible .entry _Z3fooPf(\n.param .u64 x\n)") == "_Z3fooPf"
    with pytest.raises(RuntimeError, match="expected one .entry in the kernel's PTX, found 0"):
        cl.entry_name(".func bar()")


class RecordingDriver(cl.Driver):
    """The four driver calls, recorded instead of made (no GPU here)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def load_module(self, image: bytes) -> str:
        self.calls.append(("load", image[:4]))
        return f"module{len(self.calls)}"

    def get_function(self, module: str, name: str) -> tuple:
        self.calls.append(("function", module, name))
        return (module, name)

    def unload_module(self, module: str) -> None:
        self.calls.append(("unload", module))

    def launch(self, function, blocks: int, threads: int, stream: int, params: int) -> None:
        self.calls.append(("launch", function, blocks, threads, stream, _slots_at(params, 2)))  # t, n


@pytest.fixture
def recording_driver(monkeypatch):
    stub = RecordingDriver()
    monkeypatch.setattr(cl, "KERNELS", cl.KernelCache())
    before = cl.use_driver(stub)
    yield stub
    cl.use_driver(before)


def test_the_gpu_launcher_compiles_links_loads_once_and_launches_on_cupys_current_stream(recording_driver):
    cupy = fake_cupy.MODULE
    with fake_cupy.installed():
        dy, d_h = cupy.zeros((4, 3, 5), np.float32), cupy.zeros((4, 3, 5), np.float32)
        dh = cupy.zeros((3, 5), np.float32)
        launcher = cl.DeviceLauncher(cupy)
        sites = [launcher.site(ck.add_carry_step, (0, 0, dy, dh, d_h)) for _ in range(2)]
        sites[0](15, 2, 3)
        with cupy.cuda.Stream() as stream:
            sites[1](300, 1, 3)
    calls = recording_driver.calls
    assert [c[0] for c in calls] == ["load", "function", "launch", "launch"]  # one module for both sites
    assert calls[0][1] == b"\x7fELF" and "add_carry_step" in calls[1][2]
    function = (calls[1][1], calls[1][2])
    assert calls[2] == ("launch", function, 1, 15, 0, [2, 3])
    assert calls[3] == ("launch", function, 3, 128, stream.ptr, [1, 3])


def test_a_site_of_a_fixed_block_width_launches_blocks_of_that_width(recording_driver):
    """The layer-norm kernels' sites (one block per row): ``block`` threads a block, whatever the count."""
    cupy = fake_cupy.MODULE
    with fake_cupy.installed():
        dy, d_h = cupy.zeros((4, 3, 5), np.float32), cupy.zeros((4, 3, 5), np.float32)
        dh = cupy.zeros((3, 5), np.float32)
        site = cl.DeviceLauncher(cupy).site(ck.add_carry_step, (0, 0, dy, dh, d_h), block=ck.ROW_THREADS)
        site(3 * ck.ROW_THREADS, 1, 3)
    assert recording_driver.calls[-1][2:4] == (3, ck.ROW_THREADS)


def test_a_kernel_module_unloads_once_and_closes_as_a_context_manager(recording_driver):
    with cl.KernelModule(b"\x7fELF", "k") as module:
        assert module.function == ("module1", "k")
    module.close()
    assert [c[0] for c in recording_driver.calls] == ["load", "function", "unload"]


def test_a_failed_driver_call_names_the_call_and_the_error() -> None:
    from cuda.bindings import driver

    with pytest.raises(cl.CudaDriverError, match=r"cuLaunchKernel failed: CUDA_ERROR_INVALID_VALUE") as err:
        cl.Driver()._check("cuLaunchKernel", (driver.CUresult.CUDA_ERROR_INVALID_VALUE,))
    assert err.value.name == "CUDA_ERROR_INVALID_VALUE"
    assert cl.Driver()._check("cuModuleLoadData", (driver.CUresult.CUDA_SUCCESS, "module")) == "module"


@pytest.mark.parametrize("blocks, threads", [(0, 128), (1, 0), (1, 1025), (2**31, 1)])
def test_the_simulators_launcher_refuses_the_launch_shapes_the_driver_refuses(blocks, threads) -> None:
    """CUDA Driver API reference, ``cuLaunchKernel``: ``CUDA_ERROR_INVALID_VALUE`` for a grid or block
    dimension of 0 or beyond ``MAX_GRID_DIM_X`` / ``MAX_THREADS_PER_BLOCK`` (1024); numba's simulator runs
    such a launch (an empty grid does nothing), so the launcher standing in for the driver refuses it."""
    dy, d_h, dh = np.zeros((4, 3, 5)), np.zeros((4, 3, 5)), np.zeros((3, 5))
    site = cl.SimulatorLauncher().site(ck.add_carry_step, (0, 0, dy, dh, d_h))
    with pytest.raises(cl.CudaDriverError, match=r"cuLaunchKernel failed: CUDA_ERROR_INVALID_VALUE "
                                                 rf"\(add_carry_step launched with {blocks} blocks"):
        site._submit(site.packed, blocks, threads)
    assert [cl.launch_shape(e, b) for e, b in ((0, None), (1, None), (10**6, None), (0, 8))] == [
        (1, 1), (1, 1), (7813, 128), (1, 8)]  # what the engine's sites ask: always inside the driver's range


# -- named arguments (issue 43) ------------------------------------------------------------------
def test_every_program_hands_each_kernel_parameter_what_it_handed_by_position():
    """Every program of every mode and cell variant gives every kernel parameter the buffer or scalar the
    positional calls gave it (their record, ``support/launch_order.json``, made at d045e82): a swap of two
    same-shaped arrays, which no type check sees, changes a digest. ``python tests/support/launch_record.py
    "<group>"`` here and at d045e82 shows what changed."""
    expected = json.loads(launch_record.GOLDEN.read_text())
    got = launch_record.digests()
    assert sorted(got) == sorted(expected)
    assert [name for name in sorted(got) if got[name] != expected[name]] == []


def test_named_values_are_laid_out_in_the_kernels_parameter_order_after_t_and_n() -> None:
    dy, dh, d_h = np.zeros((2, 1, 3)), np.ones((1, 3)), np.full((2, 1, 3), 2.0)
    assert cl.parameter_names(ck.add_carry_step) == ("t", "n", "dy", "dh", "d_h")
    bound = cl.bind(ck.add_carry_step, {"d_h": d_h, "dy": dy, "dh": dh})
    assert bound[:2] == (0, 0) and all(a is b for a, b in zip(bound[2:], (dy, dh, d_h), strict=True))


def test_a_missing_or_an_extra_name_is_refused_naming_the_kernel_and_the_names() -> None:
    a = np.zeros((2, 1, 3))
    with pytest.raises(TypeError, match=r"kernel add_carry_step: missing arguments \['dh'\], unexpected "
                                        r"arguments \['d_hh'\] \(its parameters after t, n: dy, dh, d_h\)"):
        cl.bind(ck.add_carry_step, {"dy": a, "d_hh": a, "d_h": a})
    with pytest.raises(TypeError, match=r"unexpected arguments \['t'\]"):  # t and n are the launch's
        cl.bind(ck.add_carry_step, {"t": 3, "dy": a, "dh": a[0], "d_h": a})


def test_a_kernel_whose_first_parameters_are_not_t_and_n_is_refused() -> None:
    def kernel(n, t, a):
        pass

    with pytest.raises(TypeError, match=r"kernel kernel: its first two parameters must be the step t and the "
                                        r"row count n, not \('n', 't'\)"):
        cl.bind(kernel, {"a": 1})


def test_a_program_names_a_wrong_argument_and_the_kernel_when_it_is_built() -> None:
    """The check happens where a program binds a site (once per program), not at a launch."""
    spec = RNNSpec(mode="rnn_tanh", input_size=3, hidden_size=4, dtype="float64")
    flags = VariantFlags(False, False, False)
    shape = Shape(2, 1, np.array([1, 1], np.int64).tobytes(), False, flags, np.dtype(np.float64))
    program = RnnForward(launch_record.RecordingDevice(), spec, shape)
    with pytest.raises(TypeError, match=r"kernel rnn_forward_step: missing arguments \['y'\], unexpected "
                                        r"arguments \['out'\]"):
        program.site(ck.rnn_forward_step, one=program.one, relu=False, xw=program.xw, hh=program.hh,
                     h=program.h, out=program.y)
