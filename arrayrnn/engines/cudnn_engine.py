"""The cuDNN engine: the whole stack in one cudnnRNNForward / BackwardData / BackwardWeights call.

Every cuDNN call goes through ``cudnn_bindings``; memory (weight, work and reserve space) comes from
CuPy's pool and every call runs on CuPy's current stream. Reads the ``"cudnn"`` weight format: a buffer of
``cudnnGetRNNWeightSpaceSize`` bytes, converted from canonical by one scatter through an index map built
from ``cudnnGetRNNWeightParams`` (see ``cudnn_format``). Semantics, roughly::

    y, h_n, c_n = reference_engine(params.to_format("canonical"), x, lengths, h0, c0)

Rows of length 0 run as length 1 (cuDNN fails on 0) and the contract is restored afterwards. With
inter-layer dropout active the stack runs layer by layer, multiplying by the shared masks in between.
NOT RUN ON A GPU YET: written against the documented cuDNN v9 / CuPy APIs; tests/test_cudnn_engine.py
holds the GPU checks.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

import cudnn_bindings as cb

from ..core.layout import layout_of
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


@lru_cache(maxsize=256)
def _descriptor(spec: RNNSpec, dtype: str) -> cb.RNNDescriptor:
    """The RNN descriptor per (spec, dtype); host-side, so shared by every device and thread."""
    return cb.RNNDescriptor(cf.rnn_config(spec, dtype))


@lru_cache(maxsize=256)
def _index(spec: RNNSpec, dtype: str, device: int, version: int) -> tuple[Any, int]:
    """(device index map, native element count) per (spec, dtype, cuDNN version)."""
    h, desc = handle(device), _descriptor(spec, dtype)
    nbytes = cb.weight_space_size(h, desc)
    itemsize = np.dtype(dtype).itemsize
    probe = cupy.empty(max(nbytes // itemsize, 1), dtype)

    def query(pseudo: int, lin: int) -> cb.WeightParams:
        return cb.weight_params(h, desc, pseudo, lin, weight_space=probe.data.ptr, weight_space_size=nbytes)

    return cupy.asarray(cf.index_map(spec, itemsize, nbytes, query)), nbytes // itemsize


def _device_of(a: Any) -> int:
    return int(a.device.id)


@dataclass(frozen=True, eq=False)
class _Data:
    """Per-call metadata: lengths (host and device), x / y / h / c descriptors, spaces."""

    dev_lengths: Any
    x_desc: cb.RNNDataDescriptor
    y_desc: cb.RNNDataDescriptor
    h_desc: cb.TensorDescriptor
    c_desc: cb.TensorDescriptor


def _data(spec: RNNSpec, dtype: str, lengths: np.ndarray, t: int, in_size: int, out_size: int,
          batch_first: bool, layers: int) -> _Data:
    dt = cf._DATA[dtype]
    layout = cb.RNNDataLayout.BATCH_MAJOR_UNPACKED if batch_first else cb.RNNDataLayout.SEQ_MAJOR_UNPACKED
    host = cf.stand_in_lengths(lengths)
    b = len(host)

    def seq(v: int) -> cb.RNNDataDescriptor:
        return cb.RNNDataDescriptor(cb.SeqDataConfig(data_type=dt, layout=layout, max_seq_length=t,
                                                     batch_size=b, vector_size=v, seq_lengths=host,
                                                     padding_fill=0.0))

    d = layers * spec.num_directions
    return _Data(cupy.asarray(host), seq(in_size), seq(out_size),
                 cb.TensorDescriptor((d, b, spec.output_size), dt),
                 cb.TensorDescriptor((d, b, spec.hidden_size), dt))


@dataclass(eq=False)
class _Cache:
    params: PackedParams
    x: Any
    lengths: np.ndarray
    h0: Any
    c0: Any
    masks: Any
    batch_first: bool
    runs: list | None  # per segment: (desc, data, w, x, y, hx, cx, reserve); None after training=False


class CudnnEngine(Engine):
    name = "cudnn"
    native_format = "cudnn"

    def check(self, call: Call) -> str | None:
        return cf.check(call)

    def to_native(self, params: PackedParams) -> PackedParams:
        data = self._gpu(params.data, "to_format('cudnn')")
        idx, size = _index(params.spec, str(data.dtype), _device_of(data), cb.version())
        return PackedParams._wrap(params.spec, cf.to_cudnn(cupy, data, idx, size), "cudnn")

    def to_canonical(self, params: PackedParams) -> PackedParams:
        data = params.data
        idx, _ = _index(params.spec, str(data.dtype), _device_of(data), cb.version())
        return PackedParams._wrap(params.spec, cf.to_canonical(data, idx), "canonical")

    @staticmethod
    def _gpu(data: Any, what: str) -> Any:
        if not isinstance(data, cupy.ndarray):
            raise TypeError(f"{what} needs the buffer on a CUDA device (CuPy); got "
                            f"{type(data).__module__}.{type(data).__name__}; use params.to(cupy) first")
        return data

    def forward(self, params, x, lengths, h0, c0, masks, *, batch_first, keep_cache) -> StackForward:
        y, h_n, c_n, runs = self._run(params, x, lengths, h0, c0, masks, batch_first, keep_cache)
        zero = lengths == 0
        if zero.any():
            cf.restore_forward(cupy, cupy.asarray(zero), y, h_n, c_n, h0, c0, batch_first)
        cache = _Cache(params, x, lengths, h0, c0, masks, batch_first, runs) if keep_cache else None
        return StackForward(y, h_n, c_n, cache)

    def _segments(self, spec: RNNSpec, masks: Any) -> list[tuple[int, int]]:
        """(first layer, layer count): the whole stack, or one layer at a time under dropout."""
        if masks is None:
            return [(0, spec.num_layers)]
        return [(layer, 1) for layer in range(spec.num_layers)]

    def _run(self, params, x, lengths, h0, c0, masks, batch_first, training):
        spec, dtype = params.spec, str(x.dtype)
        h = handle(_device_of(x))
        t = x.shape[1] if batch_first else x.shape[0]
        d, lstm = spec.num_directions, spec.mode == "lstm"
        h_n, c_n = cupy.empty_like(h0), (cupy.empty_like(c0) if lstm else None)
        runs, inp = [], x
        for first, count in self._segments(spec, masks):
            if first > 0:
                mask = masks[first - 1]
                inp = cupy.ascontiguousarray(inp * (mask.transpose(1, 0, 2) if batch_first else mask))
            w, desc = self._weights(params, first, count, dtype, h)
            in_size = spec.layer_input_size(first)
            meta = _data(spec, dtype, lengths, t, in_size, d * spec.output_size, batch_first, count)
            y = cupy.zeros(inp.shape[:2] + (d * spec.output_size,), dtype)
            sl = slice(first * d, (first + count) * d)
            hx, cx = cupy.ascontiguousarray(h0[sl]), (cupy.ascontiguousarray(c0[sl]) if lstm else None)
            hy, cy = cupy.empty_like(hx), (cupy.empty_like(cx) if lstm else None)
            mode = cb.ForwardMode.TRAINING if training else cb.ForwardMode.INFERENCE
            work_size, reserve_size = cb.temp_space_sizes(h, desc, meta.x_desc, mode)
            work, reserve = cupy.empty(work_size, np.uint8), cupy.empty(reserve_size, np.uint8)
            cb.forward(h, desc, fwd_mode=mode, dev_seq_lengths=meta.dev_lengths.data.ptr,
                       x_desc=meta.x_desc, x=inp.data.ptr, y_desc=meta.y_desc, y=y.data.ptr,
                       h_desc=meta.h_desc, hx=hx.data.ptr, hy=hy.data.ptr,
                       c_desc=meta.c_desc if lstm else None, cx=cx.data.ptr if lstm else 0,
                       cy=cy.data.ptr if lstm else 0, weight_space=w.data.ptr,
                       weight_space_size=w.nbytes, work_space=work.data.ptr, work_space_size=work_size,
                       reserve_space=reserve.data.ptr, reserve_space_size=reserve_size)
            h_n[sl] = hy
            if lstm:
                c_n[sl] = cy
            runs.append((desc, meta, w, inp, y, hx, cx, reserve))
            inp = y
        return inp, h_n, c_n, runs if training else None

    def _weights(self, params: PackedParams, first: int, count: int, dtype: str, h: cb.Handle):
        """The weight space (and descriptor) of layers ``first .. first+count``."""
        spec = params.spec
        if count == spec.num_layers:
            return params.data, _descriptor(spec, dtype)
        sub = _layer_spec(spec, first)
        canonical = params.to_format("canonical")
        lo = layout_of(spec)
        start = lo.layer_direction_span(first, 0)[0]
        stop = lo.layer_direction_span(first, spec.num_directions - 1)[1]
        native = self.to_native(PackedParams._wrap(sub, canonical.data[start:stop], "canonical"))
        return native.data, _descriptor(sub, dtype)

    def backward(self, cache: _Cache, dy, dh_n, dc_n) -> StackGrads:
        params, bf, spec = cache.params, cache.batch_first, cache.params.spec
        runs = cache.runs or self._run(params, cache.x, cache.lengths, cache.h0, cache.c0, cache.masks,
                                       bf, True)[3]
        zero = cache.lengths == 0
        zero_dev = cupy.asarray(zero)
        if zero.any():
            dy, dh_n, dc_n = cf.mask_cotangents(cupy, zero_dev, dy, dh_n, dc_n, bf)
        h, d, lstm = handle(_device_of(dy)), spec.num_directions, spec.mode == "lstm"
        dh0, dc0 = cupy.empty_like(dh_n), (cupy.empty_like(dc_n) if lstm else None)
        grads, g = [], cupy.ascontiguousarray(dy)
        for i in reversed(range(len(runs))):
            desc, meta, w, inp, y, hx, cx, reserve = runs[i]
            first = i if len(runs) > 1 else 0
            count = 1 if len(runs) > 1 else spec.num_layers
            sl = slice(first * d, (first + count) * d)
            dx = cupy.empty_like(inp)
            dhx, dcx = cupy.empty_like(hx), (cupy.empty_like(cx) if lstm else None)
            work_size, _ = cb.temp_space_sizes(h, desc, meta.x_desc, cb.ForwardMode.TRAINING)
            work = cupy.empty(work_size, np.uint8)
            dhy = cupy.ascontiguousarray(dh_n[sl])  # named: alive until the calls below are enqueued
            dcy = cupy.ascontiguousarray(dc_n[sl]) if lstm else None
            cb.backward_data(h, desc, dev_seq_lengths=meta.dev_lengths.data.ptr, y_desc=meta.y_desc,
                             y=y.data.ptr, dy=g.data.ptr, x_desc=meta.x_desc, dx=dx.data.ptr,
                             h_desc=meta.h_desc, hx=hx.data.ptr,
                             dhy=dhy.data.ptr, dhx=dhx.data.ptr,
                             c_desc=meta.c_desc if lstm else None, cx=cx.data.ptr if lstm else 0,
                             dcy=dcy.data.ptr if lstm else 0,
                             dcx=dcx.data.ptr if lstm else 0, weight_space=w.data.ptr,
                             weight_space_size=w.nbytes, work_space=work.data.ptr, work_space_size=work_size,
                             reserve_space=reserve.data.ptr, reserve_space_size=reserve.nbytes)
            dw = cupy.zeros_like(w)
            cb.backward_weights(h, desc, add_grad=cb.WgradMode.ADD, dev_seq_lengths=meta.dev_lengths.data.ptr,
                                x_desc=meta.x_desc, x=inp.data.ptr, h_desc=meta.h_desc, hx=hx.data.ptr,
                                y_desc=meta.y_desc, y=y.data.ptr, dweight_space=dw.data.ptr,
                                weight_space_size=w.nbytes, work_space=work.data.ptr,
                                work_space_size=work_size, reserve_space=reserve.data.ptr,
                                reserve_space_size=reserve.nbytes)
            dh0[sl] = dhx
            if lstm:
                dc0[sl] = dcx
            grads.append(dw)
            if first > 0:
                mask = cache.masks[first - 1]
                dx = cupy.ascontiguousarray(dx * (mask.transpose(1, 0, 2) if bf else mask))
            g = dx
        dparams = self._dparams(params, grads[::-1], len(runs) > 1)
        if zero.any():
            cf.restore_backward(cupy, zero_dev, g, dh0, dc0, dh_n, dc_n, bf)
        return StackGrads(g, dh0, dc0, dparams)

    def _dparams(self, params: PackedParams, dws: list, per_layer: bool) -> PackedParams:
        if not per_layer:
            return PackedParams._wrap(params.spec, dws[0], "cudnn")
        spec = params.spec
        parts = [self.to_canonical(PackedParams._wrap(_layer_spec(spec, layer), dw, "cudnn")).data
                 for layer, dw in enumerate(dws)]
        return self.to_native(PackedParams._wrap(spec, cupy.concatenate(parts), "canonical"))


def _layer_spec(spec: RNNSpec, layer: int) -> RNNSpec:
    """The one-layer spec of ``spec``'s layer ``layer`` (its input is the previous layer's output)."""
    return spec.replace(num_layers=1, input_size=spec.layer_input_size(layer), dropout=0.0)


ENGINE = CudnnEngine()
