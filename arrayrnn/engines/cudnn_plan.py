"""Per-shape plans of the cudnn engine: everything a repeated call needs, made once and reused.

A :class:`Plan` is made per :class:`PlanKey` (spec, dtype, device, ``T``, ``B``, layout, lengths, training or
inference, whole stack or layer by layer, TF32, the algorithm asked for) and holds, per :class:`Segment` (the
whole stack, or one layer under inter-layer dropout): the RNN descriptor of the algorithm that runs, the x/y
RNN data and h/c tensor descriptors, the work and reserve sizes, and the prepared ``cudnnRNNForward`` /
``BackwardData_v8`` / ``BackwardWeights_v8`` calls whose fixed arguments ``cudnn_bindings`` checked once;
plus the stand-in lengths on the device and the padding / empty-row masks. A repeated call then creates no
descriptor, queries no size and copies nothing to the device: one C call per segment with its addresses.

The bindings and the array module are arguments, not imports, so the dry run's copy of the engine (CuPy and
cuDNN's compute calls stood in for) builds its plans through its own.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from ..core.spec import RNNSpec
from . import cudnn_format as cf

Array = Any
log = logging.getLogger("arrayrnn.cudnn")
DescriptorFactory = Callable[[RNNSpec, str, bool, Any], Any]  # (spec, dtype, tf32, algo) -> RNNDescriptor


class PlanKey(NamedTuple):
    """What a plan depends on; ``lengths`` is ``None`` when every row has ``T`` steps (a tuple: made and
    hashed on every call)."""

    spec: RNNSpec
    dtype: str
    device: int
    seq_len: int
    batch: int
    batch_first: bool
    lengths: bytes | None
    training: bool
    layered: bool   # inter-layer dropout: one cuDNN call per layer
    tf32: bool
    algo: str       # "auto" or a name of cudnn_format.ALGOS



def plan_key(spec: RNNSpec, dtype: str, device: int, lengths: np.ndarray, seq_len: int, batch_first: bool,
             training: bool, layered: bool) -> PlanKey:
    full = int(lengths.min()) == seq_len
    return PlanKey(spec, dtype, device, seq_len, len(lengths), batch_first,
                   None if full else lengths.tobytes(), training, layered, bool(cf.allow_tf32),
                   cf.requested_algo())


@dataclass(frozen=True, eq=False)
class Segment:
    """Layers ``first .. first + count`` as one cuDNN call."""

    first: int
    count: int
    desc: Any               # cb.RNNDescriptor of the algorithm that runs
    algo: Any               # cb.RNNAlgo
    note: str               # why this algorithm (and why the one asked for was refused, if it was)
    weight_bytes: int
    work_size: int
    reserve_size: int
    forward: Any            # cb.PreparedCall
    backward_data: Any      # cb.PreparedCall, training plans only
    backward_weights: Any   # cb.PreparedCall, training plans only
    descriptors: tuple      # x, y, h, c descriptors (kept alive; the prepared calls hold them too)


@dataclass(frozen=True, eq=False)
class Plan:
    key: PlanKey
    segments: tuple[Segment, ...]
    dev_lengths: Array      # int32 (B,) on the device: the stand-in lengths (cf.stand_in_lengths)
    rows: cf.Rows           # padding / empty-row masks on the device
    full: bool              # no padding and no empty rows: every element of y and dx is written by cuDNN
    h_shape: tuple[int, ...]    # (L*D, B, H_out)
    c_shape: tuple[int, ...]    # (L*D, B, H)

    @property
    def algo(self) -> str:
        """The algorithm(s) that run, e.g. ``"PERSIST_STATIC_SMALL_H"``."""
        return "/".join(dict.fromkeys(seg.algo.name for seg in self.segments))


class PlanCache:
    """The plans of one engine, keyed by :class:`PlanKey`; the oldest goes past ``capacity`` (its cuDNN
    objects are freed once no result still uses it). Safe to share between threads: two threads that miss
    at once both build, and one plan is kept."""

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self._plans: dict[PlanKey, Plan] = {}
        self._lock = threading.Lock()

    def get(self, key: PlanKey, make: Callable[[PlanKey], Plan]) -> Plan:
        plan = self._plans.get(key)
        if plan is None:
            plan = make(key)
            with self._lock:
                plan = self._plans.setdefault(key, plan)
                while len(self._plans) > self.capacity:
                    del self._plans[next(iter(self._plans))]
        return plan

    def __len__(self) -> int:
        return len(self._plans)

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()


def rows_for(xp: ModuleType, lengths: np.ndarray, seq_len: int, batch_first: bool, device: int) -> cf.Rows:
    """The padding / empty-row masks of a call, on the device, made once per (lengths, T, layout, device)."""
    return _rows(xp, lengths.tobytes(), lengths.dtype.str, seq_len, batch_first, device)


@lru_cache(maxsize=64)
def _rows(xp: ModuleType, lengths: bytes, dtype: str, seq_len: int, batch_first: bool,
          device: int) -> cf.Rows:
    with xp.cuda.Device(device):
        return cf.Rows.of(xp, np.frombuffer(lengths, dtype), seq_len, batch_first)


def build(cb: ModuleType, xp: ModuleType, key: PlanKey, lengths: np.ndarray, handle: Any,
          descriptor: DescriptorFactory, compute_major: int) -> Plan:
    """Make the plan of ``key`` (``lengths``: the call's host lengths, caller's row order)."""
    host = cf.stand_in_lengths(lengths)
    dev_lengths = xp.asarray(host)
    spans = ([(layer, 1) for layer in range(key.spec.num_layers)] if key.layered
             else [(0, key.spec.num_layers)])
    segments = tuple(_segment(cb, key, handle, descriptor, compute_major, first, count, host, dev_lengths)
                     for first, count in spans)
    plan = Plan(key, segments, dev_lengths, rows_for(xp, lengths, key.seq_len, key.batch_first, key.device),
                full=key.lengths is None, h_shape=key.spec.state_shape(key.batch),
                c_shape=key.spec.state_shape(key.batch, cell=True))
    log.info("cudnn plan: %s %s T=%d B=%d %s: %s", key.spec.mode, key.dtype, key.seq_len, key.batch,
             "training" if key.training else "inference", "; ".join(f"{s.algo.name} ({s.note})"
                                                                   for s in segments))
    return plan


def _segment(cb: ModuleType, key: PlanKey, handle: Any, descriptor: DescriptorFactory, compute_major: int,
             first: int, count: int, host_lengths: np.ndarray, dev_lengths: Array) -> Segment:
    spec = cf.layer_spec(key.spec, first) if key.layered else key.spec
    x_desc, y_desc, h_desc, c_desc = _data_descriptors(cb, key, spec, host_lengths)
    mode = cb.ForwardMode.TRAINING if key.training else cb.ForwardMode.INFERENCE
    wanted, why = cf.choose_algo(spec, key.dtype, key.lengths is None, key.training, compute_major, key.algo)
    desc, algo, note, (work, reserve) = _algorithm(cb, key, spec, handle, descriptor, x_desc, mode, wanted,
                                                   why)
    weight_bytes = cb.weight_space_size(handle, desc)
    common = dict(dev_seq_lengths=dev_lengths.data.ptr, x_desc=x_desc, h_desc=h_desc,
                  weight_space_size=weight_bytes, work_space_size=work, reserve_space_size=reserve)
    c_desc_or_none = c_desc if spec.mode == "lstm" else None
    forward = cb.prepare_forward(desc, fwd_mode=mode, y_desc=y_desc, c_desc=c_desc_or_none, **common)
    backward_data = backward_weights = None
    if key.training:
        backward_data = cb.prepare_backward_data(desc, y_desc=y_desc, c_desc=c_desc_or_none, **common)
        backward_weights = cb.prepare_backward_weights(desc, add_grad=cb.WgradMode.ADD, y_desc=y_desc,
                                                       **common)
    return Segment(first, count, desc, algo, note, weight_bytes, work, reserve, forward, backward_data,
                   backward_weights, (x_desc, y_desc, h_desc, c_desc))


def _data_descriptors(cb: ModuleType, key: PlanKey, spec: RNNSpec, host_lengths: np.ndarray) -> tuple:
    """The x / y RNN data descriptors and the h / c tensor descriptors of one segment."""
    dt = cf.DATA_TYPES[key.dtype]
    layout = cb.RNNDataLayout.BATCH_MAJOR_UNPACKED if key.batch_first else cb.RNNDataLayout.SEQ_MAJOR_UNPACKED
    b, d = key.batch, spec.num_directions

    def seq(vector_size: int) -> Any:
        return cb.RNNDataDescriptor(cb.SeqDataConfig(
            data_type=dt, layout=layout, max_seq_length=key.seq_len, batch_size=b, vector_size=vector_size,
            seq_lengths=host_lengths, padding_fill=0.0))

    states = spec.num_layers * d
    return (seq(spec.input_size), seq(d * spec.output_size),
            cb.TensorDescriptor((states, b, spec.output_size), dt),
            cb.TensorDescriptor((states, b, spec.hidden_size), dt))


def _algorithm(cb: ModuleType, key: PlanKey, spec: RNNSpec, handle: Any, descriptor: DescriptorFactory,
               x_desc: Any, mode: Any, wanted: Any, why: str) -> tuple[Any, Any, str, tuple[int, int]]:
    """``(descriptor, algorithm, note, (work, reserve) bytes)``: ``wanted`` where cuDNN accepts it for this
    call, else STANDARD with cuDNN's refusal in the note."""
    standard = descriptor(spec, key.dtype, key.tf32, cb.RNNAlgo.STANDARD)
    if wanted == cb.RNNAlgo.STANDARD:
        return standard, wanted, why, cb.temp_space_sizes(handle, standard, x_desc, mode)
    try:
        desc = (cb.RNNDescriptor(cf.rnn_config(spec, key.dtype, key.tf32, wanted))
                if wanted == cb.RNNAlgo.PERSIST_DYNAMIC else descriptor(spec, key.dtype, key.tf32, wanted))
        if cb.weight_space_size(handle, desc) != cb.weight_space_size(handle, standard):
            return (standard, cb.RNNAlgo.STANDARD, f"{wanted.name} has another weight space size; {why}",
                    cb.temp_space_sizes(handle, standard, x_desc, mode))
        sizes = cb.temp_space_sizes(handle, desc, x_desc, mode)
        if wanted == cb.RNNAlgo.PERSIST_DYNAMIC:  # compiled for this descriptor and batch size (NVRTC)
            cb.build_rnn_dynamic(handle, desc, key.batch)
        return desc, wanted, why, sizes
    except cb.CudnnError as err:
        if not 2000 <= err.status < 4000:  # BAD_PARAM* / NOT_SUPPORTED*: cuDNN's "not for this call"
            raise
        detail = f": {err.detail}" if err.detail else ""
        note = f"cuDNN refused {wanted.name} ({err.name}{detail}), asked for because {why}"
        return standard, cb.RNNAlgo.STANDARD, note, cb.temp_space_sizes(handle, standard, x_desc, mode)
