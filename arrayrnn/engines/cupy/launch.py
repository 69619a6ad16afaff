"""Launching the numba-CUDA step kernels with their arguments packed once, not through numba's dispatcher.

numba-cuda's dispatcher prepares every argument of every launch in Python (issue 33 measured 76-164 us per
launch, most of it in ``_prepare_args``). A :class:`LaunchSite` instead packs its arguments ONCE into a
parameter block laid out as numba's kernel ABI expects (one 64-bit slot per parameter): an array is
``5 + 2 * ndim`` parameters (meminfo, parent, nitems, itemsize, data, shape..., strides... in bytes), an
integer one ``.u64``, a float its own width, a bool one ``.u8``. A launch then writes only the step ``t``
and the active row count ``n`` (the first two arguments of every step kernel) and hands the block to the
GPU. ``tests/test_cuda_kernels_ptx.py`` checks this layout against the ``.param`` list of every kernel's
PTX, so a change of numba's ABI fails CI.

A program names a kernel's arguments (issue 43): :func:`bind` lays ``{name: value}`` out in the order of the
kernel's own parameters (read once per kernel from its Python signature) when the site is built, and refuses
a missing or an extra name there, so that two same-typed arrays cannot trade places unseen and a launch
costs what it did.

The kernels stay numba-cuda code: :func:`numba.cuda.compile_ptx` for the device's compute capability,
linked to a cubin with cuda.core's ``Linker`` (nvJitLink; numba-cuda's own path, so the PTX version never
has to be one the driver can JIT), loaded with ``cuModuleLoadData`` and launched with ``cuLaunchKernel``
(cuda-python). Under numba's CUDA simulator the same block is decoded back into arrays (their addresses
are host memory there) and the simulator runs the kernel; on a CuPy(-like) stream it runs as a host
function of that stream (``Stream.launch_host_func``), so stream capture records it where a kernel would be.
"""

from __future__ import annotations

import ctypes
import functools
import inspect
import re
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np

from .kernels import launch_shape

Array = Any
_BOOL, _INT64 = np.dtype(np.bool_), np.dtype(np.int64)
_SCALARS = (_BOOL, _INT64, np.dtype(np.float32), np.dtype(np.float64))


# -- what each argument is --------------------------------------------------------------------------
@dataclass(frozen=True)
class ArrayArg:
    """An array parameter: ``5 + 2 * ndim`` slots of numba's ABI."""

    dtype: np.dtype
    ndim: int
    contiguous: bool

    @property
    def width(self) -> int:
        return 5 + 2 * self.ndim

    def numba_type(self) -> Any:
        return numba.types.Array(numba.from_dtype(self.dtype), self.ndim, "C" if self.contiguous else "A")


@dataclass(frozen=True)
class ScalarArg:
    """A scalar parameter (int64, float32, float64 or bool): one slot."""

    dtype: np.dtype
    width = 1

    def numba_type(self) -> Any:
        return numba.types.boolean if self.dtype == _BOOL else numba.from_dtype(self.dtype)


ArgSpec = ArrayArg | ScalarArg


@dataclass(frozen=True)
class Memory:
    """Where an array argument lives: its address, shape, byte strides and dtype."""

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: np.dtype

    @classmethod
    def of(cls, a: Array) -> Memory:
        """From ``__cuda_array_interface__`` (CuPy) or ``__array_interface__`` (NumPy, the simulator)."""
        desc = getattr(a, "__cuda_array_interface__", None) or a.__array_interface__
        dtype, shape = np.dtype(desc["typestr"]), tuple(int(s) for s in desc["shape"])
        strides = desc.get("strides") or _c_strides(shape, dtype.itemsize)
        return cls(int(desc["data"][0]), shape, tuple(int(s) for s in strides), dtype)

    @property
    def contiguous(self) -> bool:
        return self.strides == _c_strides(self.shape, self.dtype.itemsize) or 0 in self.shape


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _is_array(value: Any) -> bool:
    return hasattr(value, "__cuda_array_interface__") or isinstance(value, np.ndarray)


def describe(value: Any, position: int, kernel: str) -> ArgSpec:
    """The parameter kind of ``value`` (argument ``position`` of ``kernel``)."""
    if _is_array(value):
        m = Memory.of(value)
        return ArrayArg(m.dtype, len(m.shape), m.contiguous)
    if isinstance(value, (bool, np.bool_)):
        return ScalarArg(_BOOL)
    if isinstance(value, (int, np.integer)):
        return ScalarArg(_INT64)
    if isinstance(value, np.floating) and np.dtype(type(value)) in _SCALARS:
        return ScalarArg(np.dtype(type(value)))
    raise TypeError(f"argument {position} of kernel {kernel} is {value!r} ({type(value).__name__}); expected "
                    "an array, a bool, an int or a NumPy float32/float64 scalar")


# -- the parameter block ------------------------------------------------------------------------------
class PackedArgs:
    """One launch site's parameters as numba's ABI lays them out, one 64-bit slot each, plus the array of
    their addresses that ``cuLaunchKernel`` takes as ``kernelParams``. The first two arguments (``t``,
    ``n``) are rewritten per launch; the driver copies the parameters at each launch."""

    def __init__(self, specs: Sequence[ArgSpec], values: Sequence[Any]):
        self.specs = tuple(specs)
        self.slots = np.zeros(sum(s.width for s in self.specs), np.uint64)
        self._bytes = self.slots.view(np.uint8).reshape(-1, 8)
        self.keep_alive = tuple(values)  # the arrays stay allocated while their addresses are packed
        at = 0
        for spec, value in zip(self.specs, values, strict=True):
            self._put(at, spec, value)
            at += spec.width
        base = self.slots.ctypes.data
        self.pointers = base + 8 * np.arange(len(self.slots), dtype=np.uint64)
        self.address = int(self.pointers.ctypes.data)  # void** kernelParams

    def _put(self, at: int, spec: ArgSpec, value: Any) -> None:
        if isinstance(spec, ArrayArg):
            m = Memory.of(value)
            size = int(np.prod(m.shape, dtype=np.int64))
            fields = (0, 0, size, m.dtype.itemsize, m.ptr, *m.shape, *m.strides)
            self.slots[at:at + spec.width] = np.array(fields, dtype=np.int64).view(np.uint64)
        else:
            raw = np.array(value, dtype=spec.dtype).tobytes()  # little-endian, in the slot's low bytes
            self._bytes[at, :len(raw)] = np.frombuffer(raw, np.uint8)

    def set_step(self, t: int, n: int) -> None:
        self.slots[0] = t
        self.slots[1] = n

    def unpack(self) -> list[Any]:
        """The arguments again, from the slots (the simulator's side): arrays as views of their memory."""
        values, at = [], 0
        for spec in self.specs:
            if isinstance(spec, ArrayArg):
                fields = self.slots[at:at + spec.width].view(np.int64)
                ndim = spec.ndim
                shape = tuple(int(s) for s in fields[5:5 + ndim])
                strides = tuple(int(s) for s in fields[5 + ndim:])
                values.append(host_array(Memory(int(fields[4]), shape, strides, spec.dtype)))
            else:
                raw = self._bytes[at, :spec.dtype.itemsize].tobytes()
                values.append(np.frombuffer(raw, spec.dtype)[0])
            at += spec.width
        values[0], values[1] = int(values[0]), int(values[1])
        return values


def host_array(m: Memory) -> np.ndarray:
    """The NumPy view of host memory ``m`` describes (the simulator's arrays live in host memory)."""
    if 0 in m.shape:
        return np.empty(m.shape, m.dtype)
    span = sum((n - 1) * s for n, s in zip(m.shape, m.strides, strict=True)) + m.dtype.itemsize
    buffer = (ctypes.c_char * span).from_address(m.ptr)
    return np.ndarray(m.shape, m.dtype, buffer=buffer, strides=m.strides)


# -- compiling a kernel for the device ------------------------------------------------------------
def numba_signature(specs: Sequence[ArgSpec]) -> tuple:
    return tuple(s.numba_type() for s in specs)


_ENTRY = re.compile(r"\.entry\s+([A-Za-z_$][\w$]*)\s*\(")


def entry_name(ptx: str) -> str:
    """The mangled name of the one kernel (``.entry``) in ``ptx``."""
    names = _ENTRY.findall(ptx)
    if len(names) != 1:
        raise RuntimeError(f"expected one .entry in the kernel's PTX, found {len(names)}")
    return names[0]


def compile_ptx(kernel: Any, specs: Sequence[ArgSpec], cc: tuple[int, int]) -> str:
    """The PTX numba-cuda makes of ``kernel`` (a ``@cuda.jit`` dispatcher) for these parameters, with NVVM's
    floating-point contraction off (``-fma=0``): every ``*`` and ``+`` rounds as written, as on the CPU.

    numba-cuda leaves NVVM's default on (``-fma=1``, ``numba_cuda/numba/cuda/cudadrv/nvvm.py``,
    ``compile_ir``: only ``fastmath`` sets it), and NVVM then fuses ``a * b + c * d`` into one FMA, choosing
    which product by how often each operand is used elsewhere in the kernel. So the same expression rounded
    differently in two kernels: the built-in LSTM kernel computed ``fma(i, g, f * c)`` and its custom-cell
    twin ``fma(f, c, i * g)`` (an H200 run, 2026-11-30: 20% of outputs 1 ulp apart). A kernel that wants a
    fused product asks for it (``cuda.fma``). numba-cuda's public ``compile_ptx`` takes no NVVM option: the
    library it compiles is asked for its PTX with the option added (``CUDACodeLibrary.get_asm_strs`` reads
    ``_nvvm_options``); ``tests/test_cuda_kernels_ptx.py`` checks that no product is fused."""
    from numba.core.compiler_lock import global_compiler_lock
    from numba.cuda import compiler

    signature = numba_signature(specs)
    with global_compiler_lock:
        try:
            library, _ = compiler._compile_pyfunc_with_fixup(kernel.py_func, signature, device=False, cc=cc,
                                                             abi="numba")
            options = library._nvvm_options
        except AttributeError as err:  # another numba-cuda: its public path, NVVM's default contraction
            _warn_contraction(err)
            ptx, _ = compiler.compile_ptx(kernel.py_func, signature, cc=cc)
            return ptx
        library._nvvm_options = {**options, "fma": False}
        (ptx,) = library.get_asm_strs(cc=cc)
    return ptx


_WARNED: set[str] = set()


def _warn_contraction(err: AttributeError) -> None:
    """Once per missing name: the kernels fall back to numba-cuda's public path (contraction on)."""
    name = err.name or str(err)
    if name in _WARNED:
        return
    _WARNED.add(name)
    warnings.warn(f"this numba-cuda has no {name!r}, through which arrayrnn compiles its CUDA kernels "
                  "without FMA contraction; they are compiled with NVVM's default (-fma=1) instead, so a "
                  "custom cell's results may differ from its built-in twin's by an ulp (numba-cuda 0.30 is "
                  "the version checked)", RuntimeWarning, stacklevel=3)


def link_cubin(ptx: str, cc: tuple[int, int]) -> bytes:
    """``ptx`` assembled for ``sm_<cc>`` by cuda.core's Linker (nvJitLink), as numba-cuda links kernels."""
    try:
        from cuda.core import Linker, LinkerOptions, ObjectCode
    except ImportError:  # cuda-core before 0.4 kept them in cuda.core.experimental
        from cuda.core.experimental import Linker, LinkerOptions, ObjectCode

    linker = Linker(ObjectCode.from_ptx(ptx.encode()), options=LinkerOptions(arch=f"sm_{cc[0]}{cc[1]}"))
    try:
        return bytes(linker.link("cubin").code)
    finally:
        linker.close()


class CudaDriverError(RuntimeError):
    """A CUDA driver call failed; ``.name`` is the driver's error name."""

    def __init__(self, call: str, name: str, detail: str = ""):
        super().__init__(f"{call} failed: {name}" + (f" ({detail})" if detail else ""))
        self.name = name


class Driver:
    """The four CUDA driver calls of this module, through cuda-python (the host-time benchmark swaps in a
    stub whose calls do nothing, to time everything but the driver)."""

    def __init__(self) -> None:
        from cuda.bindings import driver

        self._driver = driver

    def _check(self, call: str, result: tuple) -> Any:
        err, *values = result
        if err != self._driver.CUresult.CUDA_SUCCESS:
            raise CudaDriverError(call, getattr(err, "name", str(err)))
        return values[0] if values else None

    def load_module(self, image: bytes) -> Any:
        return self._check("cuModuleLoadData", self._driver.cuModuleLoadData(image))

    def get_function(self, module: Any, name: str) -> Any:
        return self._check("cuModuleGetFunction", self._driver.cuModuleGetFunction(module, name.encode()))

    def unload_module(self, module: Any) -> None:
        self._check("cuModuleUnload", self._driver.cuModuleUnload(module))

    def launch(self, function: Any, blocks: int, threads: int, stream: int, params: int) -> None:
        self._check("cuLaunchKernel", self._driver.cuLaunchKernel(function, blocks, 1, 1, threads, 1, 1, 0,
                                                                  stream, params, 0))


_DRIVER: Driver | None = None


def driver() -> Driver:
    global _DRIVER
    if _DRIVER is None:
        _DRIVER = Driver()
    return _DRIVER


def use_driver(stub: Driver | None) -> Driver | None:
    """Swap the driver (``None``: cuda-python's again); returns the one in use before."""
    global _DRIVER
    before, _DRIVER = _DRIVER, stub
    return before


class KernelModule:
    """One loaded cubin and its kernel function; owns the module (``close()`` unloads it, safe twice)."""

    def __init__(self, cubin: bytes, name: str):
        self._driver = driver()  # the one that loaded it unloads it
        self._module = self._driver.load_module(cubin)
        self.function = self._driver.get_function(self._module, name)
        self.name = name

    def close(self) -> None:
        module, self._module = self._module, None
        if module is not None:
            self._driver.unload_module(module)

    def __enter__(self) -> KernelModule:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class KernelCache:
    """Every (kernel, parameter kinds, device) compiled and loaded once per process."""

    def __init__(self) -> None:
        self._modules: dict[tuple, KernelModule] = {}
        self._lock = threading.Lock()

    def function(self, kernel: Any, specs: tuple[ArgSpec, ...], device: int, cc: tuple[int, int]) -> Any:
        key = (kernel.py_func, specs, device)
        with self._lock:
            module = self._modules.get(key)
            if module is None:
                ptx = compile_ptx(kernel, specs, cc)
                module = self._modules[key] = KernelModule(link_cubin(ptx, cc), entry_name(ptx))
            return module.function

    def close(self) -> None:
        with self._lock:
            modules, self._modules = list(self._modules.values()), {}
        for module in modules:
            module.close()


KERNELS = KernelCache()


# -- launching ------------------------------------------------------------------------------------
def kernel_name(kernel: Any) -> str:
    return getattr(getattr(kernel, "py_func", kernel), "__name__", repr(kernel))


# -- named arguments --------------------------------------------------------------------------------
STEP_PARAMETERS = ("t", "n")  # every step kernel's first two, written per launch (PackedArgs.set_step)


@functools.cache
def _python_parameters(function: Callable) -> tuple[str, ...]:
    return tuple(inspect.signature(function).parameters)


def parameter_names(kernel: Any) -> tuple[str, ...]:
    """``kernel``'s parameter names in order (its Python function's: ``py_func`` of a numba-cuda dispatcher
    or of the simulator's kernel), read once per kernel."""
    return _python_parameters(getattr(kernel, "py_func", kernel))


def bind(kernel: Any, values: Mapping[str, Any]) -> tuple:
    """``values``, named by ``kernel``'s parameters, as the positional arguments its launch site packs once:
    ``t`` and ``n`` first (zeros here; every launch writes them into those two slots), then every other
    parameter's value in the kernel's order. A missing or an extra name is a ``TypeError`` naming the kernel
    and the names (``t`` and ``n`` are the launch's, never given)."""
    names = parameter_names(kernel)
    if names[:2] != STEP_PARAMETERS:
        raise TypeError(f"kernel {kernel_name(kernel)}: its first two parameters must be the step t and the "
                        f"row count n, not {names[:2]}")
    wanted = names[2:]
    if len(values) != len(wanted) or not all(k in values for k in wanted):  # (equal counts: none extra)
        _refuse_names(kernel, wanted, values)
    return (0, 0, *(values[k] for k in wanted))


def _refuse_names(kernel: Any, wanted: tuple[str, ...], values: Mapping[str, Any]) -> None:
    missing, extra = [k for k in wanted if k not in values], [k for k in values if k not in wanted]
    raise TypeError(f"kernel {kernel_name(kernel)}: missing arguments {missing}, unexpected arguments "
                    f"{extra} (its parameters after t, n: {', '.join(wanted)})")


class LaunchSite:
    """One kernel with its arguments packed once; ``site(elements, t, n)`` launches it over ``elements``
    threads for step ``t`` with ``n`` active rows. ``submit(blocks, threads)`` is the launcher's."""

    def __init__(self, packed: PackedArgs, submit: Callable[[PackedArgs, int, int], None],
                 block: int | None = None):
        self.packed, self._submit, self.block = packed, submit, block

    def __call__(self, elements: int, t: int, n: int) -> None:
        blocks, threads = launch_shape(elements, self.block)
        self.packed.set_step(t, n)
        self._submit(self.packed, blocks, threads)


def _specs(kernel: Any, args: Sequence[Any]) -> tuple[ArgSpec, ...]:
    name = kernel_name(kernel)
    specs = tuple(describe(a, i, name) for i, a in enumerate(args))
    if specs[:2] != (ScalarArg(_INT64), ScalarArg(_INT64)):
        raise TypeError(f"kernel {name}: the first two arguments must be the step t and the row count n")
    return specs


class DeviceLauncher:
    """Launch sites on the GPU, on CuPy's current stream at each launch (``cupy``: the CuPy module)."""

    def __init__(self, cupy: Any):
        self._current_stream = cupy.cuda.get_current_stream
        device = cupy.cuda.Device()
        device.use()  # its primary context current on this thread, for the driver calls (CUDA >= 12)
        self._device, cc = int(device.id), str(device.compute_capability)
        self._cc = (int(cc[:-1]), int(cc[-1]))

    def site(self, kernel: Any, args: Sequence[Any], block: int | None = None) -> LaunchSite:
        specs = _specs(kernel, args)
        function = KERNELS.function(kernel, specs, self._device, self._cc)

        def submit(packed: PackedArgs, blocks: int, threads: int) -> None:
            driver().launch(function, blocks, threads, self._current_stream().ptr, packed.address)

        return LaunchSite(PackedArgs(specs, args), submit, block)


MAX_BLOCKS, MAX_THREADS = 2**31 - 1, 1024  # gridDim.x and threads per block, every GPU since sm_20


def _check_launch_shape(kernel: Any, blocks: int, threads: int) -> None:
    """What ``cuLaunchKernel`` refuses with ``CUDA_ERROR_INVALID_VALUE`` (CUDA Driver API reference,
    ``cuLaunchKernel``: a grid or block dimension of 0, or beyond the device's ``MAX_GRID_DIM_X`` /
    ``MAX_THREADS_PER_BLOCK``), refused by the simulator's launcher as the driver would; numba's simulator
    itself runs such a launch (an empty grid does nothing)."""
    if not (1 <= blocks <= MAX_BLOCKS and 1 <= threads <= MAX_THREADS):
        raise CudaDriverError("cuLaunchKernel", "CUDA_ERROR_INVALID_VALUE",
                              f"{kernel_name(kernel)} launched with {blocks} blocks of {threads} threads; "
                              f"the driver takes 1..{MAX_BLOCKS} blocks of 1..{MAX_THREADS} threads")


class SimulatorLauncher:
    """Launch sites under numba's CUDA simulator: the packed block decoded into arrays, the simulator's
    kernel run on them, at once (NumPy arrays) or as a host function of the current stream (a CuPy-like
    module, ``cupy``), so that a captured stream records it."""

    def __init__(self, cupy: Any | None = None):
        self._current_stream = cupy.cuda.get_current_stream if cupy is not None else None

    def site(self, kernel: Any, args: Sequence[Any], block: int | None = None) -> LaunchSite:
        specs = _specs(kernel, args)

        def submit(packed: PackedArgs, blocks: int, threads: int) -> None:
            _check_launch_shape(kernel, blocks, threads)
            values = packed.unpack()  # now: the step's t and n, as the driver copies them at a launch

            def run(_: object = None) -> None:
                kernel[blocks, threads](*values)

            if self._current_stream is None:
                run()
            else:
                self._current_stream().launch_host_func(run, None)

        return LaunchSite(PackedArgs(specs, args), submit, block)
