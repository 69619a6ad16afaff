"""The cuDNN engine run end to end without a GPU: cuDNN validates every call, an emulator computes it.

Inside :func:`installed`, ``import cupy`` gives the NumPy-backed stand-in (:mod:`support.fake_cupy`) and
``arrayrnn.engines.cudnn.engine`` is a private copy of the engine module whose ``cudnn_bindings`` is
:class:`DryRunBindings`:

- ``cb.Handle(device)`` is :class:`FakeHandle`: the address of a zero-filled host buffer standing in for a
  ``cudnnHandle_t`` (``cudnnCreate`` and ``cudnnSetStream`` cannot be faked; the stream the engine binds
  is recorded and checked against CuPy's current stream at every compute call).
- Every call that takes the handle runs the REAL cuDNN function with the fake handle in a forked child
  (cuDNN's host code with a fake handle is undocumented territory; a crash must not take pytest down).
  cuDNN 9.24 checks all arguments on the host first and only then fails at its first CUDA runtime call
  with 5003 (``EXECUTION_FAILED_CUDART``), so 5003 means "every argument accepted", and 2000 (``BAD_PARAM``)
  fails the test with cuDNN's reason (:class:`CudnnRejected`). ``cudnnGetRNNTempSpaceSizes`` writes both
  sizes before its 5003; ``cudnnGetRNNWeightSpaceSize`` / ``cudnnGetRNNWeightParams`` succeed.
- After its validation a compute call (``cudnnRNNForward``, ``cudnnRNNBackwardData_v8``,
  ``cudnnRNNBackwardWeights_v8``) is computed by :class:`support.cudnn_emulator.Emulator` through the
  buffers' addresses, each checked to lie inside one live stand-in array.

Known gap of the fake handle: cuDNN 9.24's host code dies with SIGFPE on batch-major input without padding
(every length equal to maxSeqLength) in all three compute calls. Such a call is validated through its twin
with ``maxSeqLength + 1`` (the same call with one step of padding per row; the host checks never read the
buffers), and :data:`STATS` counts it under ``"twin"``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import importlib.util
import os
import pickle
import select
import signal
import sys
import time
import types
from collections import Counter
from collections.abc import Callable, Iterator
from ctypes import byref, c_size_t
from functools import lru_cache
from typing import Any

import numpy as np

import cudnn_bindings as cb
from cudnn_bindings import _cuda, _lib

from . import fake_cupy
from .cudnn_emulator import (
    GATES,
    PROJECTION_ID,
    EmulationError,
    Emulator,
    Memory,
    rnn_config,
    seq_config,
    tensor_config,
)

ENGINE_MODULE = "arrayrnn.engines.cudnn.engine"
ACCEPTED = int(cb.Status.EXECUTION_FAILED_CUDART)  # 5003: the first CUDA runtime call, after every check
_FAKE_HANDLE = np.zeros(1 << 20, np.uint8)
STATS: Counter[str] = Counter()  # validations and emulations done, per cuDNN function (and "twin")


class CudnnRejected(AssertionError):
    """cuDNN refused a call the engine made (the test fails with cuDNN's reason)."""


class FakeHandle(int):
    """What ``cb.Handle(device)`` gives in the dry run: the fake handle's address, an ``int`` (the bindings
    take int addresses), recording the stream bound to it."""

    def __new__(cls, device: int = 0, stream: Any = None) -> FakeHandle:
        self = super().__new__(cls, _FAKE_HANDLE.__array_interface__["data"][0])
        self.device, self.bound_stream = device, None
        if stream is not None:
            self.set_stream(stream)
        return self

    @property
    def ptr(self) -> int:
        return self  # an int, still carrying the bound stream to the compute calls' check

    def set_stream(self, stream: Any) -> None:
        self.bound_stream = _cuda.stream_address(stream)

    def close(self) -> None:
        return None


# -- running cuDNN in a forked child --------------------------------------------------------------------
CHILD_TIMEOUT_S = 60.0  # a child answers in milliseconds; a hang (a lock held at fork time) must not hang CI


def _read_until(fd: int, pid: int, timeout: float) -> bytes | None:
    """Everything the child writes to ``fd`` until it closes it, or ``None`` (child killed) on timeout."""
    chunks, deadline = [], time.monotonic() + timeout
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        while True:
            ready, _, _ = select.select([pipe], [], [], max(deadline - time.monotonic(), 0.0))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                return None
            chunk = pipe.read(1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


def in_child(fn: Callable[[], Any]) -> tuple:
    """``fn()`` in a forked child: ``("ok", value)``, ``("cudnn", status, detail)``, ``("error", text)`` or
    ``("signal", number)``."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(read)
        faulthandler.disable()  # a crash of cuDNN's host code is an answer here, not a report
        try:
            cb.raw.get_last_error_string()  # start with cuDNN's error text cleared
            outcome: tuple = ("ok", fn())
        except cb.CudnnError as err:
            outcome = ("cudnn", int(err.status), err.detail)
        except BaseException as err:  # noqa: BLE001 - everything goes back to the parent
            outcome = ("error", f"{type(err).__name__}: {err}")
        with os.fdopen(write, "wb") as pipe:
            pipe.write(pickle.dumps(outcome))
        os._exit(0)
    os.close(write)
    data = _read_until(read, pid, CHILD_TIMEOUT_S)
    _, status = os.waitpid(pid, 0)
    if data is None:
        return ("error", f"the child did not answer within {CHILD_TIMEOUT_S} s and was killed (a fork of "
                         "a multithreaded process may deadlock); rerun the test alone")
    if os.WIFSIGNALED(status):
        return ("signal", os.WTERMSIG(status))
    return pickle.loads(data) if data else ("error", f"the child exited with status {status} and no result")


def _describe(kwargs: dict) -> str:
    parts = []
    for key, value in kwargs.items():
        if hasattr(value, "ptr") and not isinstance(value, int):
            try:
                value = (rnn_config if "rnn" in key else seq_config if "x_desc" in key or "y_desc" in key
                         else cb.TensorDescriptor.get)(value)
            except Exception:  # noqa: BLE001 - a description, best effort
                pass
        parts.append(f"{key}={value!r}")
    return ", ".join(parts)


def signature(name: str, rnn_desc: Any, kwargs: dict) -> tuple:
    """What cuDNN's host checks can see of a call: the descriptors' contents, sizes and modes, and of each
    address whether it is NULL and its 16-byte alignment. Calls of one signature are validated once."""
    parts: list[Any] = [name, rnn_config(rnn_desc)]
    for key, value in sorted(kwargs.items()):
        if key in ("x_desc", "y_desc"):
            parts.append((key, seq_config(value)))
        elif key in ("h_desc", "c_desc"):
            parts.append((key, None if value is None else tensor_config(value)))
        elif key.endswith("_size") or key in ("fwd_mode", "add_grad"):
            parts.append((key, int(value)))
        else:
            parts.append((key, int(value) == 0, int(value) % 16))
    return tuple(parts)


VALIDATED: set[tuple] = set()  # signatures cuDNN accepted


def validate(name: str, fn: Callable, handle: Any, rnn_desc: Any, **kwargs: Any) -> None:
    """Have cuDNN check every argument of ``fn(handle, rnn_desc, **kwargs)`` (the compute calls)."""
    key = signature(name, rnn_desc, kwargs)
    if key in VALIDATED:
        STATS[name] += 1
        return
    outcome = in_child(lambda: fn(handle, rnn_desc, **kwargs))
    if outcome[0] == "signal" and outcome[1] == signal.SIGFPE and _batch_major_unpadded(kwargs):
        STATS["twin"] += 1
        outcome = in_child(lambda: fn(handle, rnn_desc, **_twin(rnn_desc, kwargs)))
    if outcome[:2] == ("cudnn", ACCEPTED):
        STATS[name] += 1
        VALIDATED.add(key)
        return
    if outcome[0] == "cudnn":
        status = cb.Status(outcome[1]).name
        raise CudnnRejected(f"cuDNN rejected {name} with {status} ({outcome[1]}): "
                            f"{outcome[2] or 'no detail given'}; the call: {_describe(kwargs)}")
    raise CudnnRejected(f"validating {name} with the fake handle gave {outcome!r}; the call: "
                        f"{_describe(kwargs)}")


def _batch_major_unpadded(kwargs: dict) -> bool:
    cfg = seq_config(kwargs["x_desc"])
    return (cfg.layout == cb.RNNDataLayout.BATCH_MAJOR_UNPACKED
            and bool((cfg.seq_lengths == cfg.max_seq_length).all()))


def _twin(rnn_desc: Any, kwargs: dict) -> dict:
    """The same call with ``maxSeqLength + 1`` in the x and y descriptors (made in the child). The work
    and reserve sizes given are moved by what the extra step changes in cuDNN's own requirement, so a size
    the engine got wrong stays wrong."""
    twin = dict(kwargs)
    for key in ("x_desc", "y_desc"):
        cfg = seq_config(kwargs[key])
        twin[key] = cb.RNNDataDescriptor(dataclasses.replace(cfg, max_seq_length=cfg.max_seq_length + 1))
    mode = kwargs.get("fwd_mode", cb.ForwardMode.TRAINING)
    need = _temp_sizes(rnn_desc, kwargs["x_desc"], mode)
    twin_need = _temp_sizes(rnn_desc, twin["x_desc"], mode)
    for key, before, after in zip(("work_space_size", "reserve_space_size"), need, twin_need, strict=True):
        if key in twin:
            twin[key] += after - before
    return twin


def _temp_sizes(rnn_desc: Any, x_desc: Any, fwd_mode: Any) -> tuple[int, int]:
    """``(work, reserve)`` bytes from cudnnGetRNNTempSpaceSizes with the fake handle (which writes both before
    failing at its first CUDA call); call in a child."""
    work, reserve = c_size_t(), c_size_t()
    status = _lib.function("cudnnGetRNNTempSpaceSizes")(int(FakeHandle()), _ptr(rnn_desc), int(fwd_mode),
                                                         _ptr(x_desc), byref(work), byref(reserve))
    if 3000 <= status < 4000:  # NOT_SUPPORTED*: cuDNN's answer for this configuration (e.g. an algorithm)
        raise cb.CudnnError(status, "cudnnGetRNNTempSpaceSizes", cb.raw.get_last_error_string())
    if status not in (0, ACCEPTED):
        raise CudnnRejected(f"cuDNN rejected cudnnGetRNNTempSpaceSizes with {cb.Status(status).name} "
                            f"({status}): "
                            f"{_describe(dict(rnn_desc=rnn_desc, x_desc=x_desc, fwd_mode=fwd_mode))}")
    return work.value, reserve.value


def _ptr(obj: Any) -> int:
    return int(obj.ptr) if hasattr(obj, "ptr") else int(obj)


def _checked(name: str, outcome: tuple) -> Any:
    if outcome[0] == "error" and outcome[1].startswith("CudnnRejected"):
        raise CudnnRejected(outcome[1])
    if outcome[0] == "cudnn" and 3000 <= outcome[1] < 4000:
        raise cb.CudnnError(outcome[1], name, outcome[2])
    if outcome[0] != "ok":
        raise CudnnRejected(f"{name} with the fake handle gave {outcome!r}")
    return outcome[1]


# -- the bindings the engine sees ---------------------------------------------------------------------
@lru_cache(maxsize=512)
def _regions(config: cb.RNNConfig, weight_space_size: int) -> dict[tuple[int, int], cb.WeightParams]:
    """Every (pseudo-layer, linLayerID) region of a configuration, from the real cudnnGetRNNWeightParams."""
    def query() -> dict:
        space = np.zeros(max(weight_space_size, 1), np.uint8)
        ids = list(range(2 * GATES[config.cell_mode]))
        if config.cell_mode == cb.RNNMode.LSTM and config.proj_size < config.hidden_size:
            ids.append(PROJECTION_ID)
        with cb.RNNDescriptor(config) as desc:
            return {(pseudo, lin): cb.weight_params(int(FakeHandle()), desc, pseudo, lin,
                                                    weight_space=space.__array_interface__["data"][0],
                                                    weight_space_size=weight_space_size)
                    for pseudo in range(config.num_layers * config.num_directions) for lin in ids}

    STATS["cudnnGetRNNWeightParams"] += 1
    return _checked("cudnnGetRNNWeightParams", in_child(query))


@lru_cache(maxsize=512)
def _weight_space_size(config: cb.RNNConfig) -> int:
    def query() -> int:
        with cb.RNNDescriptor(config) as desc:
            return cb.weight_space_size(int(FakeHandle()), desc)

    return _checked("cudnnGetRNNWeightSpaceSize", in_child(query))


@lru_cache(maxsize=4096)
def _temp_space_sizes(config: cb.RNNConfig, x_config: cb.SeqDataConfig, fwd_mode: int) -> tuple[int, int]:
    def query() -> tuple[int, int]:
        with cb.RNNDescriptor(config) as desc, cb.RNNDataDescriptor(x_config) as x_desc:
            return _temp_sizes(desc, x_desc, fwd_mode)

    return _checked("cudnnGetRNNTempSpaceSizes", in_child(query))


def _region_lookup(rnn_desc: Any, weight_space_size: int) -> Callable[[int, int], cb.WeightParams]:
    table = _regions(rnn_config(rnn_desc), weight_space_size)
    return lambda pseudo, lin: table[(pseudo, lin)]


class DeviceMemory(Memory):
    """Addresses must lie inside one live stand-in CuPy array (the dry run's memory checker)."""

    def check(self, ptr: int, nbytes: int, what: str) -> None:
        super().check(ptr, nbytes, what)
        if not fake_cupy.device_memory_covers(ptr, nbytes):
            raise EmulationError(f"{what}: bytes [{ptr:#x}, {ptr:#x} + {nbytes}) do not lie inside one live "
                                 "CuPy array (freed, too small, or host memory)")


class DryRunBindings(types.ModuleType):
    """``cudnn_bindings`` as the dry-run engine sees it: the real module, except the calls that need a
    handle (validated in a child, computed by the emulator)."""

    Handle = FakeHandle

    def __init__(self) -> None:
        super().__init__("cudnn_bindings", "cudnn_bindings with a fake handle (support/cudnn_dry_run.py)")
        self.emulator = Emulator(DeviceMemory(), _region_lookup)

    def __getattr__(self, name: str) -> Any:
        return getattr(cb, name)

    @staticmethod
    def weight_space_size(handle: Any, rnn_desc: Any) -> int:
        STATS["cudnnGetRNNWeightSpaceSize"] += 1
        return _weight_space_size(rnn_config(rnn_desc))

    @staticmethod
    def weight_params(handle: Any, rnn_desc: Any, pseudo_layer: int, lin_layer_id: int, *, weight_space: int,
                      weight_space_size: int) -> cb.WeightParams:
        DeviceMemory().check(weight_space, 1, "weightSpace of cudnnGetRNNWeightParams")
        return _regions(rnn_config(rnn_desc), weight_space_size)[(pseudo_layer, lin_layer_id)]

    @staticmethod
    def temp_space_sizes(handle: Any, rnn_desc: Any, x_desc: Any, fwd_mode: Any = cb.ForwardMode.TRAINING):
        STATS["cudnnGetRNNTempSpaceSizes"] += 1
        return _temp_space_sizes(rnn_config(rnn_desc), seq_config(x_desc), int(fwd_mode))

    def forward(self, handle: Any, rnn_desc: Any, **kwargs: Any) -> None:
        self._compute("cudnnRNNForward", cb.forward, self.emulator.forward, handle, rnn_desc, kwargs)

    def prepare_forward(self, rnn_desc: Any, **fixed: Any) -> DryRunCall:
        return DryRunCall(cb.prepare_forward(rnn_desc, **fixed), self.forward)

    def prepare_backward_data(self, rnn_desc: Any, **fixed: Any) -> DryRunCall:
        return DryRunCall(cb.prepare_backward_data(rnn_desc, **fixed), self.backward_data)

    def prepare_backward_weights(self, rnn_desc: Any, **fixed: Any) -> DryRunCall:
        return DryRunCall(cb.prepare_backward_weights(rnn_desc, **fixed), self.backward_weights)

    def backward_data(self, handle: Any, rnn_desc: Any, **kwargs: Any) -> None:
        self._compute("cudnnRNNBackwardData_v8", cb.backward_data, self.emulator.backward_data, handle,
                      rnn_desc, kwargs)

    def backward_weights(self, handle: Any, rnn_desc: Any, **kwargs: Any) -> None:
        self._compute("cudnnRNNBackwardWeights_v8", cb.backward_weights, self.emulator.backward_weights,
                      handle, rnn_desc, kwargs)

    @staticmethod
    def build_rnn_dynamic(*args: Any, **kwargs: Any) -> None:
        raise EmulationError("cudnnBuildRNNDynamic is not part of the dry run")

    @staticmethod
    def _compute(name: str, real: Callable, emulate: Callable, handle: Any, rnn_desc: Any,
                 kwargs: dict) -> None:
        stream = fake_cupy.get_current_stream().ptr
        if getattr(handle, "bound_stream", stream) != stream:
            raise EmulationError(f"{name} would run on stream {handle.bound_stream:#x}, not CuPy's current "
                                 f"stream {stream:#x}")
        validate(name, real, handle, rnn_desc, **kwargs)
        emulate(handle, rnn_desc, **kwargs)
        STATS[f"emulated {name}"] += 1


class DryRunCall:
    """A prepared compute call of the dry run: the real preparation checked the fixed arguments; a call
    merges them with the per-call addresses and goes the way of the typed call (validated, emulated)."""

    def __init__(self, prepared: cb.PreparedCall, typed: Callable[..., None]):
        self.prepared, self._typed = prepared, typed

    def __call__(self, **addresses: Any) -> None:
        if set(addresses) != set(self.prepared.per_call):
            raise TypeError(f"{self.prepared.function} (prepared) takes {self.prepared.per_call}; got "
                            f"{sorted(addresses)}")
        fixed = dict(self.prepared.fixed)
        handle, rnn_desc = addresses.pop("handle"), fixed.pop("rnn_desc")
        self._typed(handle, rnn_desc, **fixed, **addresses)


BINDINGS = DryRunBindings()


def _engine_module(bindings: types.ModuleType | None = None) -> types.ModuleType:
    """A private copy of the cudnn engine module, imported against the stand-in CuPy, on ``bindings``
    (default :data:`BINDINGS`: validated and emulated compute calls); one per bindings object."""
    return _engine_module_on(BINDINGS if bindings is None else bindings)


@lru_cache(maxsize=4)
def _engine_module_on(bindings: types.ModuleType) -> types.ModuleType:
    spec = importlib.util.find_spec(ENGINE_MODULE)
    module = importlib.util.module_from_spec(spec)
    saved = sys.modules.get(ENGINE_MODULE)
    sys.modules[ENGINE_MODULE] = module
    try:
        with fake_cupy.installed():
            spec.loader.exec_module(module)
    finally:
        if saved is None:
            sys.modules.pop(ENGINE_MODULE, None)
        else:
            sys.modules[ENGINE_MODULE] = saved
    module.cb = bindings
    return module


@contextlib.contextmanager
def installed(bindings: types.ModuleType | None = None) -> Iterator[types.ModuleType]:
    """Inside the block ``engine="cudnn"`` is the dry run, on stand-in CuPy arrays (yields that ``cupy``);
    ``bindings`` replaces the dry run's (bench/bench_gpu_host.py stubs the compute calls instead)."""
    module = _engine_module(bindings)
    saved = sys.modules.get(ENGINE_MODULE)
    with fake_cupy.installed() as cupy:
        sys.modules[ENGINE_MODULE] = module
        try:
            yield cupy
        finally:
            if saved is None:
                sys.modules.pop(ENGINE_MODULE, None)
            else:
                sys.modules[ENGINE_MODULE] = saved
