"""The cuDNN engine: the whole stack in one cudnnRNNForward / BackwardData / BackwardWeights call.

Every cuDNN call goes through ``cudnn_bindings``; memory (weight, work and reserve space) comes from
CuPy's pool and every call runs on CuPy's current stream. Reads the ``"cudnn"`` weight format: a buffer of
``cudnnGetRNNWeightSpaceSize`` bytes, converted from canonical by one scatter through an int32 index map
built from ``cudnnGetRNNWeightParams`` (see :mod:`.weight_map`). Semantics, roughly::

    y, h_n, c_n = reference_engine(params.to_format("canonical"), x, lengths, h0, c0)

Rows of length 0 run as length 1 (cuDNN has no empty sequences) from a zero state, and padding and empty
rows are kept out of every result with ``where`` (``padding.Rows``). With inter-layer dropout active the
stack runs layer by layer, multiplying by the shared masks in between; each layer's weight space is a slice
of one buffer gathered from the whole stack's in one go (``weight_map.LayerMaps``).

CI runs this module end to end without a GPU (tests/test_cudnn_dry_run.py: CuPy stood in for by NumPy,
cuDNN validating every call with a fake handle, the compute calls emulated); tests/test_cudnn_engine.py
holds the GPU checks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

import cudnn_bindings as cb

from ...core.backend import device_id
from ...core.params import PackedParams
from ...core.spec import RNNSpec
from ..base import Call, Engine, StackForward, StackGrads
from . import config as cf
from . import padding, shape_plans, weight_map

try:
    import cupy
except ImportError as _err:  # load_engine turns this into EngineUnavailableError
    raise ImportError(f"the cudnn engine needs CuPy ({_err})") from _err

_local = threading.local()


def handle(device: int) -> cb.Handle:
    """This thread's cuDNN handle on ``device``, bound to CuPy's current stream (``cudnnSetStream`` only
    when that stream changed since the handle's last call)."""
    handles = _local.__dict__.setdefault("handles", {})
    entry = handles.get(device)
    if entry is None:
        entry = handles[device] = [cb.Handle(device), None]
    stream = cupy.cuda.get_current_stream().ptr
    if entry[1] != stream:
        entry[0].set_stream(stream)
        entry[1] = stream
    return entry[0]


@lru_cache(maxsize=128)
def _descriptor(spec: RNNSpec, dtype: str, tf32: bool, algo: cb.RNNAlgo = cb.RNNAlgo.STANDARD
                ) -> cb.RNNDescriptor:
    """The RNN descriptor per (spec, dtype, TF32, algorithm); host-side, so shared by every device and
    thread."""
    return cb.RNNDescriptor(cf.rnn_config(spec, dtype, tf32, algo))


@lru_cache(maxsize=1)
def _version() -> int:
    return cb.version()


@lru_cache(maxsize=8)
def _compute_major(device: int) -> int:
    return int(cupy.cuda.Device(device).compute_capability) // 10


@lru_cache(maxsize=32)
def _host_index(spec: RNNSpec, dtype: str, device: int, version: int) -> tuple[np.ndarray, int]:
    """(host int32 index map, native element count) per (spec, dtype, cuDNN version)."""
    h, desc = handle(device), _descriptor(spec, dtype, False)  # the layout does not depend on the math
    nbytes = cb.weight_space_size(h, desc)
    itemsize = np.dtype(dtype).itemsize
    probe = cupy.empty(max(nbytes // itemsize, 1), dtype)

    def query(pseudo: int, lin: int) -> cb.WeightParams:
        return cb.weight_params(h, desc, pseudo, lin, weight_space=probe.data.ptr, weight_space_size=nbytes)

    return weight_map.index_map(spec, itemsize, nbytes, query), nbytes // itemsize


@lru_cache(maxsize=32)
def _index(spec: RNNSpec, dtype: str, device: int, version: int) -> tuple[Any, int]:
    """(device int32 index map, native element count)."""
    idx, size = _host_index(spec, dtype, device, version)
    with cupy.cuda.Device(device):
        return cupy.asarray(idx), size


@lru_cache(maxsize=16)
def _layer_maps(spec: RNNSpec, dtype: str, device: int, version: int) -> weight_map.LayerMaps:
    """The whole stack's weight space <-> every layer's own, on ``device`` (dropout: layer by layer)."""
    whole_idx, whole_size = _host_index(spec, dtype, device, version)
    layers = [_host_index(cf.layer_spec(spec, layer), dtype, device, version)
              for layer in range(spec.num_layers)]
    maps = weight_map.layer_maps(spec, whole_idx, whole_size, [idx for idx, _ in layers],
                                 [n for _, n in layers], np.dtype(dtype).itemsize)
    with cupy.cuda.Device(device):
        return maps.to(cupy)


def _ptr(a: Any) -> int:
    """A device array's address; 0 (NULL) for None."""
    return 0 if a is None else a.data.ptr


def _part(seg: shape_plans.Segment, directions: int, whole: bool) -> Callable[[Any], Any]:
    """The segment's layers of a ``(L*D, B, .)`` state array (None stays None; the whole stack: itself)."""
    if whole:
        return lambda a: a
    rows = slice(seg.first * directions, (seg.first + seg.count) * directions)
    return lambda a: None if a is None else a[rows]


@dataclass(frozen=True, eq=False)
class _Run:
    """What one segment's forward leaves for its backward."""

    segment: shape_plans.Segment
    weights: Any
    x: Any
    y: Any
    hx: Any    # None: zeros (NULL to cuDNN)
    cx: Any
    reserve: Any
    work: Any  # the forward's work space, reused by its backward (a training plan's sizes are the same)


@dataclass(eq=False)
class _Cache:
    params: PackedParams
    plan: shape_plans.Plan     # a training plan
    rows: padding.Rows
    x: Any
    h0: Any
    c0: Any
    masks: Any
    runs: list[_Run] | None   # None once a backward has used them

    def take_runs(self) -> list[_Run] | None:
        """The forward's runs, handed to one backward only: cudnnRNNBackwardData_v8 writes into the reserve
        space (an Input/Output of the call), so a second backward on the same result must recompute the
        forward (a GPU run found the second backward's weight gradient near zero)."""
        runs, self.runs = self.runs, None
        return runs


class CudnnEngine(Engine):
    name = "cudnn"
    native_format = "cudnn"
    zero_states_as_none = True  # h0/c0 and dh_n/dc_n of None go to cuDNN as NULL

    def __init__(self) -> None:
        self.plans = shape_plans.PlanCache()

    def check(self, call: Call) -> str | None:
        return cf.check(call)

    def to_native(self, params: PackedParams) -> PackedParams:
        data = self._gpu(params.data, "to_format('cudnn')")
        idx, size = _index(params.spec, params.spec.dtype, device_id(data), _version())
        return PackedParams._wrap(params.spec, weight_map.to_cudnn(cupy, data, idx, size), "cudnn")

    def to_canonical(self, params: PackedParams) -> PackedParams:
        data = self._checked_native(params)
        idx, _ = _index(params.spec, params.spec.dtype, device_id(data), _version())
        return PackedParams._wrap(params.spec, weight_map.to_canonical(data, idx), "canonical")

    @staticmethod
    def _gpu(data: Any, what: str) -> Any:
        if not isinstance(data, cupy.ndarray):
            raise TypeError(f"{what} needs the buffer on a CUDA device (CuPy); got "
                            f"{type(data).__module__}.{type(data).__name__}; use params.to(cupy) first")
        return data

    def _checked_native(self, params: PackedParams) -> Any:
        """``params.data`` after checking it is this spec's weight space on this cuDNN."""
        data = self._gpu(params.data, "the 'cudnn' format")
        _, size = _index(params.spec, params.spec.dtype, device_id(data), _version())
        if data.ndim != 1 or data.size != size:
            raise ValueError(f"params.data has shape {tuple(data.shape)}; the 'cudnn' format of "
                             f"{params.spec} in {data.dtype} is a 1-D weight space of {size} elements "
                             f"(cudnnGetRNNWeightSpaceSize of cuDNN {cb.version()}); convert canonical "
                             "params with params.to_format('cudnn')")
        return data

    def take_input(self, x: Any, lengths: np.ndarray, batch_first: bool) -> Any:
        """A contiguous copy of ``x`` in the caller's layout, zero at padding: ONE kernel, with the padding
        mask made once per lengths (no host-to-device copy on a repeated call)."""
        rows = self._rows(x, lengths, batch_first)
        if rows.valid is None:
            return cupy.array(x, order="C", copy=True)
        return cupy.ascontiguousarray(cupy.where(rows.valid, x, 0).astype(x.dtype, copy=False))

    # -- plans ----------------------------------------------------------------------------------------
    def plan_for(self, params: PackedParams, x: Any, lengths: np.ndarray, batch_first: bool, training: bool,
                 layered: bool = False, rows: padding.Rows | None = None) -> shape_plans.Plan:
        """The plan of a call (made on first use, then reused); ``.algo`` and each segment's ``.note`` say
        which cuDNN algorithm runs and why. ``rows``: the call's, if the caller has them."""
        device = device_id(x)
        key = shape_plans.plan_key(params.spec, params.spec.dtype, device, lengths,
                                  x.shape[1] if batch_first else x.shape[0], batch_first, training, layered)
        plan = self.plans.get(key, None)  # a hit makes no closure and looks no rows up
        return plan or self.plans.get(key, self._maker(rows or self._rows(x, lengths, batch_first)))

    @staticmethod
    def _rows(x: Any, lengths: np.ndarray, batch_first: bool) -> padding.Rows:
        return shape_plans.rows_for(cupy, lengths, x.shape[1] if batch_first else x.shape[0], batch_first,
                                   device_id(x))

    @staticmethod
    def _maker(rows: padding.Rows) -> Callable[[shape_plans.PlanKey, str | None], shape_plans.Plan]:
        def make(key: shape_plans.PlanKey, refused: str | None) -> shape_plans.Plan:
            device = key.device
            return shape_plans.build(cb, key, rows, handle(device), _descriptor, _compute_major(device),
                                    refused)
        return make

    def _attempt(self, plan: shape_plans.Plan, rows: padding.Rows, run: Callable[[shape_plans.Plan], Any]
                 ) -> tuple[shape_plans.Plan, Any]:
        """``(plan, run(plan))``; where cuDNN refuses a persistent algorithm at a compute call (a refusal its
        size query did not give), ``run`` again once on the STANDARD plan that replaces it for good."""
        try:
            return plan, run(plan)
        except cb.CudnnError as err:
            if not cf.is_refusal(err) or plan.algo == "STANDARD":
                raise
            plan = self.plans.demote(plan, err, self._maker(rows))
            return plan, run(plan)

    # -- forward ------------------------------------------------------------------------------------
    def forward(self, params, x, lengths, h0, c0, masks, *, batch_first, keep_cache) -> StackForward:
        rows = self._rows(x, lengths, batch_first)
        plan = self.plan_for(params, x, lengths, batch_first, keep_cache, masks is not None, rows)
        plan, (y, h_n, c_n, runs) = self._attempt(
            plan, rows, lambda p: self._run(p, rows, params, x, h0, c0, masks))
        y, h_n, c_n = rows.forward_out(cupy, y, h_n, c_n, h0, c0)
        cache = _Cache(params, plan, rows, x, h0, c0, masks, runs) if keep_cache else None
        return StackForward(y, h_n, c_n, cache)

    def _segment_weights(self, params: PackedParams, plan: shape_plans.Plan) -> list[Any]:
        """Each segment's weight space: the params' buffer, or (under dropout) one layer's slice of ONE
        gather of the whole stack's."""
        data = params.data
        if len(plan.segments) == 1:
            seg = plan.segments[0]
            if not (isinstance(data, cupy.ndarray) and data.ndim == 1 and data.nbytes == seg.weight_bytes):
                self._checked_native(params)  # raises, naming what is wrong
            return [data]
        data = self._checked_native(params)
        maps = _layer_maps(params.spec, params.spec.dtype, device_id(data), _version())
        stacked = data[maps.gather]
        if maps.holes.size:
            stacked[maps.holes] = 0
        return [stacked[offset:offset + size] for offset, size in zip(maps.offsets, maps.sizes, strict=True)]

    def _run(self, plan: shape_plans.Plan, rows: padding.Rows, params: PackedParams, x: Any, h0: Any, c0: Any,
             masks: Any):
        h = handle(plan.key.device)
        h0, c0 = rows.states_in(cupy, h0, c0)
        h_n = cupy.empty(plan.h_shape, x.dtype)
        c_n = cupy.empty(plan.c_shape, x.dtype) if params.spec.mode == "lstm" else None
        weights = self._segment_weights(params, plan)
        with plan.bound(rows, h):
            runs = self._run_segments(plan, weights, h.ptr, x, h0, c0, h_n, c_n, masks)
        return runs[-1].y, h_n, c_n, runs if plan.key.training else None

    @staticmethod
    def _run_segments(plan: shape_plans.Plan, spaces: list[Any], h: int, x: Any, h0: Any, c0: Any, h_n: Any,
                      c_n: Any, masks: Any) -> list[_Run]:
        """Each segment's cudnnRNNForward, layer by layer under dropout (its masks applied in between)."""
        spec, key = plan.key.spec, plan.key
        d, training = spec.num_directions, key.training
        runs, inp, whole = [], x, len(plan.segments) == 1
        for seg, space in zip(plan.segments, spaces, strict=True):
            if seg.first > 0:
                mask = masks[seg.first - 1]
                inp = cupy.ascontiguousarray(inp * (mask.transpose(1, 0, 2) if key.batch_first else mask))
            y = cupy.empty(inp.shape[:2] + (d * spec.output_size,), x.dtype)  # cuDNN fills the padding
            part = _part(seg, d, whole)
            hx, cx, hy, cy = (part(a) for a in (h0, c0, h_n, c_n))
            calls = seg.calls
            work = cupy.empty(calls.work_size, np.uint8)
            reserve = cupy.empty(calls.reserve_size, np.uint8) if training else None
            calls.forward(handle=h, x=inp.data.ptr, y=y.data.ptr, hx=_ptr(hx), hy=hy.data.ptr, cx=_ptr(cx),
                          cy=_ptr(cy), weight_space=space.data.ptr, work_space=work.data.ptr,
                          reserve_space=_ptr(reserve))
            runs.append(_Run(seg, space, inp, y, hx, cx, reserve, work))
            inp = y
        return runs

    # -- backward -----------------------------------------------------------------------------------
    def backward(self, cache: _Cache, dy, dh_n, dc_n) -> StackGrads:
        runs = cache.take_runs()

        def attempt(plan: shape_plans.Plan) -> StackGrads:
            nonlocal runs
            if runs is None or runs[0].segment is not plan.segments[0]:  # used, or the plan was replaced
                runs = self._run(plan, cache.rows, cache.params, cache.x, cache.h0, cache.c0, cache.masks)[3]
            return self._backward(plan, cache, runs, dy, dh_n, dc_n)

        cache.plan, grads = self._attempt(cache.plan, cache.rows, attempt)
        return grads

    def _backward(self, plan: shape_plans.Plan, cache: _Cache, runs: list[_Run], dy, dh_n,
                  dc_n) -> StackGrads:
        params, spec, rows = cache.params, cache.params.spec, cache.rows
        h, lstm = handle(plan.key.device), spec.mode == "lstm"
        g, dhy_all, dcy_all = rows.cotangents_in(cupy, dy, dh_n, dc_n)
        dh0 = cupy.empty(plan.h_shape, dy.dtype)
        dc0 = cupy.empty(plan.c_shape, dy.dtype) if lstm else None
        grad_space, dweights = self._weight_grads(params, runs)
        with plan.bound(rows, h):
            for run, dw in zip(reversed(runs), reversed(dweights), strict=True):
                g = self._backward_segment(plan, cache, run, dw, h.ptr, g, dhy_all, dcy_all, dh0, dc0,
                                           len(runs) == 1)
        dx, dh0, dc0 = rows.backward_out(cupy, g, dh0, dc0, dh_n, dc_n)
        return StackGrads(dx, dh0, dc0, self._dparams(params, runs, grad_space))

    @staticmethod
    def _backward_segment(plan: shape_plans.Plan, cache: _Cache, run: _Run, dw: Any, h: int, g: Any,
                          dhy_all: Any, dcy_all: Any, dh0: Any, dc0: Any, whole: bool) -> Any:
        """One segment's BackwardData and BackwardWeights; returns the gradient of its input."""
        seg, key = run.segment, plan.key
        part = _part(seg, key.spec.num_directions, whole)
        # BackwardData is not documented to write dx's padding
        dx = cupy.empty_like(run.x) if plan.full else cupy.zeros_like(run.x)
        dhy, dcy = (None if a is None else cupy.ascontiguousarray(part(a)) for a in (dhy_all, dcy_all))
        dhx, dcx, work, calls = part(dh0), part(dc0), run.work, seg.calls
        calls.backward_data(handle=h, y=run.y.data.ptr, dy=g.data.ptr, dx=dx.data.ptr, hx=_ptr(run.hx),
                            dhy=_ptr(dhy), dhx=dhx.data.ptr, cx=_ptr(run.cx), dcy=_ptr(dcy), dcx=_ptr(dcx),
                            weight_space=run.weights.data.ptr, work_space=work.data.ptr,
                            reserve_space=run.reserve.data.ptr)
        calls.backward_weights(handle=h, x=run.x.data.ptr, hx=_ptr(run.hx), y=run.y.data.ptr,
                               dweight_space=dw.data.ptr, work_space=work.data.ptr,
                               reserve_space=run.reserve.data.ptr)
        if seg.first > 0:
            mask = cache.masks[seg.first - 1]
            dx = cupy.ascontiguousarray(dx * (mask.transpose(1, 0, 2) if key.batch_first else mask))
        return dx

    def _weight_grads(self, params: PackedParams, runs: list[_Run]) -> tuple[Any, list[Any]]:
        """A zeroed gradient buffer for BackwardWeights to ADD into, and each segment's part of it: the
        whole stack's weight space, or every layer's (plus a last zero element that the whole stack's holes
        read)."""
        if len(runs) == 1:
            whole = cupy.zeros_like(runs[0].weights)
            return whole, [whole]
        maps = _layer_maps(params.spec, params.spec.dtype, device_id(params.data), _version())
        stacked = cupy.zeros(maps.size + 1, params.data.dtype)
        return stacked, [stacked[off:off + size] for off, size in zip(maps.offsets, maps.sizes, strict=True)]

    def _dparams(self, params: PackedParams, runs: list[_Run], grad_space: Any) -> PackedParams:
        """The gradient in the whole stack's weight space (under dropout: ONE gather from the layers')."""
        if len(runs) > 1:
            maps = _layer_maps(params.spec, params.spec.dtype, device_id(params.data), _version())
            grad_space = grad_space[maps.back]
        return PackedParams._wrap(params.spec, grad_space, "cudnn")


ENGINE = CudnnEngine()
