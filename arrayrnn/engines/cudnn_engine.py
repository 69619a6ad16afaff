"""The cuDNN engine: the whole stack in one cudnnRNNForward / BackwardData / BackwardWeights call.

Every cuDNN call goes through ``cudnn_bindings``; memory (weight, work and reserve space) comes from
CuPy's pool and every call runs on CuPy's current stream. Reads the ``"cudnn"`` weight format: a buffer of
``cudnnGetRNNWeightSpaceSize`` bytes, converted from canonical by one scatter through an int32 index map
built from ``cudnnGetRNNWeightParams`` (see ``cudnn_format``). Semantics, roughly::

    y, h_n, c_n = reference_engine(params.to_format("canonical"), x, lengths, h0, c0)

Rows of length 0 run as length 1 (cuDNN has no empty sequences) from a zero state, and padding and empty
rows are kept out of every result with ``where`` (``cudnn_format.Rows``). With inter-layer dropout active the
stack runs layer by layer, multiplying by the shared masks in between; each layer's weight space is a slice
of one buffer gathered from the whole stack's in one go (``cudnn_format.LayerMaps``).

CI runs this module end to end without a GPU (tests/test_cudnn_dry_run.py: CuPy stood in for by NumPy,
cuDNN validating every call with a fake handle, the compute calls emulated); tests/test_cudnn_engine.py
holds the GPU checks.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

import cudnn_bindings as cb

from ..core.backend import device_id
from ..core.params import PackedParams
from ..core.spec import RNNSpec
from . import cudnn_format as cf
from .base import Call, Engine, StackForward, StackGrads

try:
    import cupy
except ImportError as _err:  # load_engine turns this into EngineUnavailableError
    raise ImportError(f"the cudnn engine needs CuPy ({_err})") from _err

_local = threading.local()


def handle(device: int) -> cb.Handle:
    """This thread's cuDNN handle on ``device``, bound to CuPy's current stream."""
    handles = _local.__dict__.setdefault("handles", {})
    if device not in handles:
        handles[device] = cb.Handle(device)
    h = handles[device]
    h.set_stream(cupy.cuda.get_current_stream().ptr)
    return h


@lru_cache(maxsize=64)
def _descriptor(spec: RNNSpec, dtype: str, tf32: bool) -> cb.RNNDescriptor:
    """The RNN descriptor per (spec, dtype, TF32); host-side, so shared by every device and thread."""
    return cb.RNNDescriptor(cf.rnn_config(spec, dtype, tf32))


@lru_cache(maxsize=32)
def _host_index(spec: RNNSpec, dtype: str, device: int, version: int) -> tuple[np.ndarray, int]:
    """(host int32 index map, native element count) per (spec, dtype, cuDNN version)."""
    h, desc = handle(device), _descriptor(spec, dtype, False)  # the layout does not depend on the math
    nbytes = cb.weight_space_size(h, desc)
    itemsize = np.dtype(dtype).itemsize
    probe = cupy.empty(max(nbytes // itemsize, 1), dtype)

    def query(pseudo: int, lin: int) -> cb.WeightParams:
        return cb.weight_params(h, desc, pseudo, lin, weight_space=probe.data.ptr, weight_space_size=nbytes)

    return cf.index_map(spec, itemsize, nbytes, query), nbytes // itemsize


@lru_cache(maxsize=32)
def _index(spec: RNNSpec, dtype: str, device: int, version: int) -> tuple[Any, int]:
    """(device int32 index map, native element count)."""
    idx, size = _host_index(spec, dtype, device, version)
    with cupy.cuda.Device(device):
        return cupy.asarray(idx), size


@lru_cache(maxsize=16)
def _layer_maps(spec: RNNSpec, dtype: str, device: int, version: int) -> cf.LayerMaps:
    """The whole stack's weight space <-> every layer's own, on ``device`` (dropout: layer by layer)."""
    whole_idx, whole_size = _host_index(spec, dtype, device, version)
    layers = [_host_index(cf.layer_spec(spec, layer), dtype, device, version)
              for layer in range(spec.num_layers)]
    maps = cf.layer_maps(spec, whole_idx, whole_size, [idx for idx, _ in layers], [n for _, n in layers],
                         np.dtype(dtype).itemsize)
    with cupy.cuda.Device(device):
        return maps.to(cupy)


@dataclass(frozen=True, eq=False)
class _Data:
    """Per-call metadata: lengths on the device, x / y / h / c descriptors."""

    dev_lengths: Any
    x_desc: cb.RNNDataDescriptor
    y_desc: cb.RNNDataDescriptor
    h_desc: cb.TensorDescriptor
    c_desc: cb.TensorDescriptor


def _data(spec: RNNSpec, dtype: str, lengths: np.ndarray, t: int, in_size: int, batch_first: bool,
          layers: int) -> _Data:
    dt = cf.DATA_TYPES[dtype]
    layout = cb.RNNDataLayout.BATCH_MAJOR_UNPACKED if batch_first else cb.RNNDataLayout.SEQ_MAJOR_UNPACKED
    host = cf.stand_in_lengths(lengths)
    b, d = len(host), spec.num_directions

    def seq(v: int) -> cb.RNNDataDescriptor:
        return cb.RNNDataDescriptor(cb.SeqDataConfig(data_type=dt, layout=layout, max_seq_length=t,
                                                     batch_size=b, vector_size=v, seq_lengths=host,
                                                     padding_fill=0.0))

    return _Data(cupy.asarray(host), seq(in_size), seq(d * spec.output_size),
                 cb.TensorDescriptor((layers * d, b, spec.output_size), dt),
                 cb.TensorDescriptor((layers * d, b, spec.hidden_size), dt))


@dataclass(frozen=True, eq=False)
class _Segment:
    """Layers ``first .. first + count`` run by one cuDNN call: their descriptor and weight space."""

    first: int
    count: int
    desc: cb.RNNDescriptor
    weights: Any


@dataclass(frozen=True, eq=False)
class _Run:
    """What one segment's forward leaves for its backward."""

    segment: _Segment
    meta: _Data
    x: Any
    y: Any
    hx: Any
    cx: Any
    reserve: Any


@dataclass(eq=False)
class _Cache:
    params: PackedParams
    x: Any
    lengths: np.ndarray
    h0: Any
    c0: Any
    masks: Any
    batch_first: bool
    rows: cf.Rows
    runs: list[_Run] | None  # None after training=False, and once a backward has used them

    def take_runs(self) -> list[_Run] | None:
        """The forward's runs, handed to one backward only: cudnnRNNBackwardData_v8 writes into the reserve
        space (an Input/Output of the call), so a second backward on the same result must recompute the
        forward (a GPU run found the second backward's weight gradient near zero)."""
        runs, self.runs = self.runs, None
        return runs


class CudnnEngine(Engine):
    name = "cudnn"
    native_format = "cudnn"

    def check(self, call: Call) -> str | None:
        return cf.check(call)

    def to_native(self, params: PackedParams) -> PackedParams:
        data = self._gpu(params.data, "to_format('cudnn')")
        idx, size = _index(params.spec, str(data.dtype), device_id(data), cb.version())
        return PackedParams._wrap(params.spec, cf.to_cudnn(cupy, data, idx, size), "cudnn")

    def to_canonical(self, params: PackedParams) -> PackedParams:
        data = self._checked_native(params)
        idx, _ = _index(params.spec, str(data.dtype), device_id(data), cb.version())
        return PackedParams._wrap(params.spec, cf.to_canonical(data, idx), "canonical")

    @staticmethod
    def _gpu(data: Any, what: str) -> Any:
        if not isinstance(data, cupy.ndarray):
            raise TypeError(f"{what} needs the buffer on a CUDA device (CuPy); got "
                            f"{type(data).__module__}.{type(data).__name__}; use params.to(cupy) first")
        return data

    def _checked_native(self, params: PackedParams) -> Any:
        """``params.data`` after checking it is this spec's weight space on this cuDNN."""
        data = self._gpu(params.data, "the 'cudnn' format")
        _, size = _index(params.spec, str(data.dtype), device_id(data), cb.version())
        if data.ndim != 1 or data.size != size:
            raise ValueError(f"params.data has shape {tuple(data.shape)}; the 'cudnn' format of "
                             f"{params.spec} in {data.dtype} is a 1-D weight space of {size} elements "
                             f"(cudnnGetRNNWeightSpaceSize of cuDNN {cb.version()}); convert canonical "
                             "params with params.to_format('cudnn')")
        return data

    # -- forward ------------------------------------------------------------------------------------
    def forward(self, params, x, lengths, h0, c0, masks, *, batch_first, keep_cache) -> StackForward:
        t = x.shape[1] if batch_first else x.shape[0]
        rows = cf.Rows.of(cupy, lengths, t, batch_first)
        y, h_n, c_n, runs = self._run(params, x, lengths, rows, h0, c0, masks, batch_first, keep_cache)
        y, h_n, c_n = rows.forward_out(cupy, y, h_n, c_n, h0, c0)
        cache = _Cache(params, x, lengths, h0, c0, masks, batch_first, rows, runs) if keep_cache else None
        return StackForward(y, h_n, c_n, cache)

    def _segments(self, params: PackedParams, dtype: str, dropout: bool) -> list[_Segment]:
        """The whole stack in one call, or (under dropout) one call per layer, each on its weight space."""
        spec, data, tf32 = params.spec, self._checked_native(params), cf.allow_tf32
        if not dropout:
            return [_Segment(0, spec.num_layers, _descriptor(spec, dtype, tf32), data)]
        maps = _layer_maps(spec, dtype, device_id(data), cb.version())
        stacked = data[maps.gather]
        if maps.holes.size:
            stacked[maps.holes] = 0
        return [_Segment(layer, 1, _descriptor(cf.layer_spec(spec, layer), dtype, tf32),
                         stacked[offset:offset + size])
                for layer, (offset, size) in enumerate(zip(maps.offsets, maps.sizes, strict=True))]

    def _run(self, params, x, lengths, rows, h0, c0, masks, batch_first, training):
        spec, dtype = params.spec, str(x.dtype)
        h = handle(device_id(x))
        t = x.shape[1] if batch_first else x.shape[0]
        d, lstm = spec.num_directions, spec.mode == "lstm"
        h0, c0 = rows.states_in(cupy, h0, c0)
        h_n, c_n = cupy.empty_like(h0), (cupy.empty_like(c0) if lstm else None)
        mode = cb.ForwardMode.TRAINING if training else cb.ForwardMode.INFERENCE
        runs, inp = [], x
        for seg in self._segments(params, dtype, masks is not None):
            if seg.first > 0:
                mask = masks[seg.first - 1]
                inp = cupy.ascontiguousarray(inp * (mask.transpose(1, 0, 2) if batch_first else mask))
            meta = _data(spec, dtype, lengths, t, spec.layer_input_size(seg.first), batch_first, seg.count)
            y = cupy.empty(inp.shape[:2] + (d * spec.output_size,), dtype)  # cuDNN fills the padding
            sl = slice(seg.first * d, (seg.first + seg.count) * d)
            hx, cx = cupy.ascontiguousarray(h0[sl]), (cupy.ascontiguousarray(c0[sl]) if lstm else None)
            hy, cy = cupy.empty_like(hx), (cupy.empty_like(cx) if lstm else None)
            work_size, reserve_size = cb.temp_space_sizes(h, seg.desc, meta.x_desc, mode)
            work, reserve = cupy.empty(work_size, np.uint8), cupy.empty(reserve_size, np.uint8)
            cb.forward(h, seg.desc, fwd_mode=mode, dev_seq_lengths=meta.dev_lengths.data.ptr,
                       x_desc=meta.x_desc, x=inp.data.ptr, y_desc=meta.y_desc, y=y.data.ptr,
                       h_desc=meta.h_desc, hx=hx.data.ptr, hy=hy.data.ptr,
                       c_desc=meta.c_desc if lstm else None, cx=cx.data.ptr if lstm else 0,
                       cy=cy.data.ptr if lstm else 0, weight_space=seg.weights.data.ptr,
                       weight_space_size=seg.weights.nbytes, work_space=work.data.ptr,
                       work_space_size=work_size, reserve_space=reserve.data.ptr,
                       reserve_space_size=reserve_size)
            h_n[sl] = hy
            if lstm:
                c_n[sl] = cy
            runs.append(_Run(seg, meta, inp, y, hx, cx, reserve))
            inp = y
        return inp, h_n, c_n, runs if training else None

    # -- backward -----------------------------------------------------------------------------------
    def backward(self, cache: _Cache, dy, dh_n, dc_n) -> StackGrads:
        params, bf, spec, rows = cache.params, cache.batch_first, cache.params.spec, cache.rows
        runs = cache.take_runs() or self._run(params, cache.x, cache.lengths, rows, cache.h0, cache.c0,
                                              cache.masks, bf, True)[3]
        h, d, lstm = handle(device_id(dy)), spec.num_directions, spec.mode == "lstm"
        g, dhy_all, dcy_all = rows.cotangents_in(cupy, dy, dh_n, dc_n)
        dh0, dc0 = cupy.empty_like(dh_n), (cupy.empty_like(dc_n) if lstm else None)
        grad_space, dweights = self._weight_grads(params, runs)
        g = cupy.ascontiguousarray(g)
        for run, dw in zip(reversed(runs), reversed(dweights), strict=True):
            seg, meta = run.segment, run.meta
            sl = slice(seg.first * d, (seg.first + seg.count) * d)
            dx = cupy.zeros_like(run.x)  # BackwardData is not documented to write dx's padding
            dhx, dcx = cupy.empty_like(run.hx), (cupy.empty_like(run.cx) if lstm else None)
            work_size, _ = cb.temp_space_sizes(h, seg.desc, meta.x_desc, cb.ForwardMode.TRAINING)
            work = cupy.empty(work_size, np.uint8)
            dhy = cupy.ascontiguousarray(dhy_all[sl])  # named: alive until the calls below are enqueued
            dcy = cupy.ascontiguousarray(dcy_all[sl]) if lstm else None
            cb.backward_data(h, seg.desc, dev_seq_lengths=meta.dev_lengths.data.ptr, y_desc=meta.y_desc,
                             y=run.y.data.ptr, dy=g.data.ptr, x_desc=meta.x_desc, dx=dx.data.ptr,
                             h_desc=meta.h_desc, hx=run.hx.data.ptr, dhy=dhy.data.ptr, dhx=dhx.data.ptr,
                             c_desc=meta.c_desc if lstm else None, cx=run.cx.data.ptr if lstm else 0,
                             dcy=dcy.data.ptr if lstm else 0, dcx=dcx.data.ptr if lstm else 0,
                             weight_space=seg.weights.data.ptr, weight_space_size=seg.weights.nbytes,
                             work_space=work.data.ptr, work_space_size=work_size,
                             reserve_space=run.reserve.data.ptr, reserve_space_size=run.reserve.nbytes)
            cb.backward_weights(h, seg.desc, add_grad=cb.WgradMode.ADD,
                                dev_seq_lengths=meta.dev_lengths.data.ptr, x_desc=meta.x_desc,
                                x=run.x.data.ptr, h_desc=meta.h_desc, hx=run.hx.data.ptr,
                                y_desc=meta.y_desc, y=run.y.data.ptr, dweight_space=dw.data.ptr,
                                weight_space_size=seg.weights.nbytes, work_space=work.data.ptr,
                                work_space_size=work_size, reserve_space=run.reserve.data.ptr,
                                reserve_space_size=run.reserve.nbytes)
            dh0[sl] = dhx
            if lstm:
                dc0[sl] = dcx
            if seg.first > 0:
                mask = cache.masks[seg.first - 1]
                dx = cupy.ascontiguousarray(dx * (mask.transpose(1, 0, 2) if bf else mask))
            g = dx
        dx, dh0, dc0 = rows.backward_out(cupy, g, dh0, dc0, dh_n, dc_n)
        return StackGrads(dx, dh0, dc0, self._dparams(params, runs, grad_space))

    def _weight_grads(self, params: PackedParams, runs: list[_Run]) -> tuple[Any, list[Any]]:
        """A zeroed gradient buffer for BackwardWeights to ADD into, and each segment's part of it: the
        whole stack's weight space, or every layer's (plus a last zero element that the whole stack's holes
        read)."""
        if len(runs) == 1:
            whole = cupy.zeros_like(runs[0].segment.weights)
            return whole, [whole]
        maps = _layer_maps(params.spec, str(params.data.dtype), device_id(params.data), cb.version())
        stacked = cupy.zeros(maps.size + 1, params.data.dtype)
        return stacked, [stacked[off:off + size] for off, size in zip(maps.offsets, maps.sizes, strict=True)]

    def _dparams(self, params: PackedParams, runs: list[_Run], grad_space: Any) -> PackedParams:
        """The gradient in the whole stack's weight space (under dropout: ONE gather from the layers')."""
        if len(runs) > 1:
            maps = _layer_maps(params.spec, str(params.data.dtype), device_id(params.data), cb.version())
            grad_space = grad_space[maps.back]
        return PackedParams._wrap(params.spec, grad_space, "cudnn")


ENGINE = CudnnEngine()
