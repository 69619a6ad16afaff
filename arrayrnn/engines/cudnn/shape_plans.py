"""Per-shape plans of the cudnn engine: everything a repeated call needs, made once and reused.

A :class:`Plan` is made per :class:`PlanKey` (spec, dtype, device, ``T``, ``B``, layout, whether rows are
padded, training or inference, whole stack or layer by layer, TF32, the algorithm asked for) and holds, per
:class:`Segment` (the whole stack, or one layer under inter-layer dropout): the RNN descriptor of the
algorithm that runs, the x/y RNN data and h/c tensor descriptors, the weight space size and, in
:class:`Calls`, the work and reserve sizes and the prepared ``cudnnRNNForward`` / ``BackwardData_v8`` /
``BackwardWeights_v8`` calls whose fixed arguments ``cudnn_bindings`` checked once. A repeated call then
creates no descriptor, queries no size and copies nothing to the device: one C call per segment with its
addresses.

Lengths are not part of the key: a call whose lengths differ from the ones a padded plan's descriptors
hold sets them in place (``cudnnSetRNNDataDescriptor`` on the same descriptors), asks cuDNN for the sizes
again and prepares the calls with that lengths' device copy (:meth:`Plan.bound`, under the plan's lock, so
threads sharing a plan never see each other's lengths). An equal-lengths plan never changes.

The bindings and the array module are arguments, not imports, so the dry run's copy of the engine (CuPy and
cuDNN's compute calls stood in for) builds its plans through its own.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from ...core.spec import RNNSpec
from . import config as cf
from . import padding

Array = Any
log = logging.getLogger("arrayrnn.cudnn")
DescriptorFactory = Callable[[RNNSpec, str, bool, Any], Any]  # (spec, dtype, tf32, algo) -> RNNDescriptor


class PlanKey(NamedTuple):
    """What a plan depends on (the lengths themselves do not: see the module docstring)."""

    spec: RNNSpec
    dtype: str
    device: int
    seq_len: int
    batch: int
    batch_first: bool
    padded: bool    # some row is shorter than seq_len (an equal-lengths plan never changes its lengths)
    training: bool
    layered: bool   # inter-layer dropout: one cuDNN call per layer
    tf32: bool
    algo: str       # "auto" or a name of config.ALGOS


def plan_key(spec: RNNSpec, dtype: str, device: int, lengths: np.ndarray, seq_len: int, batch_first: bool,
             training: bool, layered: bool) -> PlanKey:
    return PlanKey(spec, dtype, device, seq_len, len(lengths), batch_first, int(lengths.min()) < seq_len,
                   training, layered, bool(cf.allow_tf32), cf.requested_algo())


@dataclass(frozen=True, eq=False)
class Calls:
    """A segment's sizes and prepared compute calls for the lengths its data descriptors hold."""

    work_size: int
    reserve_size: int
    forward: Any            # cb.PreparedCall
    backward_data: Any      # cb.PreparedCall, training plans only
    backward_weights: Any   # cb.PreparedCall, training plans only
    seq_lengths: Array      # the device lengths the calls read (kept alive with them)


@dataclass(eq=False)
class Segment:
    """Layers ``first .. first + count`` as one cuDNN call."""

    first: int
    count: int
    desc: Any               # cb.RNNDescriptor of the algorithm that runs
    algo: Any               # cb.RNNAlgo
    note: str               # why this algorithm (and why the one asked for was refused, if it was)
    weight_bytes: int
    descriptors: tuple      # x, y, h, c descriptors (kept alive; the prepared calls hold them too)
    calls: Calls            # replaced when a padded plan's lengths change (under the plan's lock)


@dataclass(eq=False)
class Plan:
    key: PlanKey
    segments: tuple[Segment, ...]
    full: bool              # no padding and no empty rows: every element of y and dx is written by cuDNN
    h_shape: tuple[int, ...]    # (L*D, B, H_out)
    c_shape: tuple[int, ...]    # (L*D, B, H)
    lengths: bytes          # the stand-in lengths the segments' descriptors and calls hold
    bindings: ModuleType
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def algo(self) -> str:
        """The algorithm(s) that run, e.g. ``"PERSIST_STATIC_SMALL_H"``."""
        return "/".join(dict.fromkeys(seg.algo.name for seg in self.segments))

    @contextlib.contextmanager
    def bound(self, rows: padding.Rows, handle: Any) -> Iterator[None]:
        """The segments' calls set to ``rows``' lengths for the block: no lock for an equal-lengths plan;
        for a padded one, the plan's lock held while its descriptors are set (if the lengths changed) and
        the calls run."""
        if self.full:
            yield
            return
        with self.lock:
            lengths = rows.host_lengths.tobytes()
            if lengths != self.lengths:
                for seg in self.segments:
                    _set_lengths(seg, rows.host_lengths)
                    seg.calls = _calls(self.bindings, self.key, handle, seg, rows.seq_lengths)
                self.lengths = lengths
            yield


class PlanCache:
    """The plans of one engine, keyed by :class:`PlanKey`; the oldest goes past ``capacity`` (its cuDNN
    objects are freed once no result still uses it). Safe to share between threads: two threads that miss
    at once both build, and one plan is kept. A key whose persistent algorithm cuDNN refused at a compute
    call is remembered (:meth:`demote`): its plans are STANDARD from then on."""

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self._plans: dict[PlanKey, Plan] = {}
        self._refused: dict[PlanKey, str] = {}  # key -> why it runs STANDARD
        self._lock = threading.Lock()

    def get(self, key: PlanKey, make: Callable[[PlanKey, str | None], Plan] | None) -> Plan | None:
        """The plan of ``key``, made by ``make`` if there is none (``make=None``: ``None`` then)."""
        plan = self._plans.get(key)
        if plan is None and make is not None:
            plan = self._store(key, make(key, self._refused.get(key)))
        return plan

    def demote(self, plan: Plan, err: Exception, make: Callable[[PlanKey, str | None], Plan]) -> Plan:
        """The STANDARD plan replacing ``plan``, whose persistent algorithm cuDNN refused at a compute call
        with ``err``; the key keeps it (a warning is logged once)."""
        why = (f"cuDNN refused {plan.algo} at {getattr(err, 'function', 'a compute call')} "
               f"({getattr(err, 'name', type(err).__name__)}); STANDARD from then on")
        if plan.key not in self._refused:
            log.warning("cudnn plan: %s %s T=%d B=%d: %s", plan.key.spec.mode, plan.key.dtype,
                        plan.key.seq_len, plan.key.batch, why)
        self._refused[plan.key] = why
        with self._lock:
            if self._plans.get(plan.key) is plan:
                del self._plans[plan.key]
        return self.get(plan.key, make)

    def _store(self, key: PlanKey, plan: Plan) -> Plan:
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
            self._refused.clear()


def rows_for(xp: ModuleType, lengths: np.ndarray, seq_len: int, batch_first: bool,
             device: int) -> padding.Rows:
    """The padding / empty-row masks and device lengths of a call, made once per (lengths, T, layout,
    device)."""
    return _rows(xp, lengths.tobytes(), lengths.dtype.str, seq_len, batch_first, device)


@lru_cache(maxsize=64)
def _rows(xp: ModuleType, lengths: bytes, dtype: str, seq_len: int, batch_first: bool,
          device: int) -> padding.Rows:
    with xp.cuda.Device(device):
        return padding.Rows.of(xp, np.frombuffer(lengths, dtype), seq_len, batch_first)


def build(cb: ModuleType, key: PlanKey, rows: padding.Rows, handle: Any, descriptor: DescriptorFactory,
          compute_major: int, refused: str | None = None) -> Plan:
    """Make the plan of ``key`` for a call with ``rows``' lengths; ``refused``: why it must run STANDARD
    (cuDNN refused its persistent algorithm at a compute call)."""
    spans = ([(layer, 1) for layer in range(key.spec.num_layers)] if key.layered
             else [(0, key.spec.num_layers)])
    segments = tuple(_segment(cb, key, handle, descriptor, compute_major, first, count, rows, refused)
                     for first, count in spans)
    plan = Plan(key, segments, full=not key.padded, h_shape=key.spec.state_shape(key.batch),
                c_shape=key.spec.state_shape(key.batch, cell=True), lengths=rows.host_lengths.tobytes(),
                bindings=cb)
    log.info("cudnn plan: %s %s T=%d B=%d %s: %s", key.spec.mode, key.dtype, key.seq_len, key.batch,
             "training" if key.training else "inference", "; ".join(f"{s.algo.name} ({s.note})"
                                                                   for s in segments))
    return plan


def _segment(cb: ModuleType, key: PlanKey, handle: Any, descriptor: DescriptorFactory, compute_major: int,
             first: int, count: int, rows: padding.Rows, refused: str | None) -> Segment:
    spec = cf.layer_spec(key.spec, first) if key.layered else key.spec
    descriptors = _data_descriptors(cb, key, spec, rows.host_lengths)
    mode = _mode(cb, key)
    if refused is None:
        wanted, why = cf.choose_algo(spec, key.dtype, not key.padded, key.training, compute_major, key.algo)
    else:
        wanted, why = cb.RNNAlgo.STANDARD, refused
    desc, algo, note = _algorithm(cb, key, spec, handle, descriptor, descriptors[0], mode, wanted, why)
    seg = Segment(first, count, desc, algo, note, cb.weight_space_size(handle, desc), descriptors, None)
    seg.calls = _calls(cb, key, handle, seg, rows.seq_lengths)
    return seg


def _mode(cb: ModuleType, key: PlanKey) -> Any:
    return cb.ForwardMode.TRAINING if key.training else cb.ForwardMode.INFERENCE


def _calls(cb: ModuleType, key: PlanKey, handle: Any, seg: Segment, seq_lengths: Array) -> Calls:
    """The segment's sizes (asked of cuDNN for the lengths its descriptors hold) and prepared calls."""
    x_desc, y_desc, h_desc, c_desc = seg.descriptors
    work, reserve = cb.temp_space_sizes(handle, seg.desc, x_desc, _mode(cb, key))
    common = dict(dev_seq_lengths=seq_lengths.data.ptr, x_desc=x_desc, h_desc=h_desc,
                  weight_space_size=seg.weight_bytes, work_space_size=work, reserve_space_size=reserve)
    c_desc_or_none = c_desc if key.spec.mode == "lstm" else None
    forward = cb.prepare_forward(seg.desc, fwd_mode=_mode(cb, key), y_desc=y_desc, c_desc=c_desc_or_none,
                                 **common)
    backward_data = backward_weights = None
    if key.training:
        backward_data = cb.prepare_backward_data(seg.desc, y_desc=y_desc, c_desc=c_desc_or_none, **common)
        backward_weights = cb.prepare_backward_weights(seg.desc, add_grad=cb.WgradMode.ADD, y_desc=y_desc,
                                                       **common)
    return Calls(work, reserve, forward, backward_data, backward_weights, seq_lengths)


def _seq_config(cb: ModuleType, key: PlanKey, vector_size: int, host_lengths: np.ndarray) -> Any:
    layout = cb.RNNDataLayout.BATCH_MAJOR_UNPACKED if key.batch_first else cb.RNNDataLayout.SEQ_MAJOR_UNPACKED
    return cb.SeqDataConfig(data_type=cf.DATA_TYPES[key.dtype], layout=layout, max_seq_length=key.seq_len,
                            batch_size=key.batch, vector_size=vector_size, seq_lengths=host_lengths,
                            padding_fill=0.0)


def _data_descriptors(cb: ModuleType, key: PlanKey, spec: RNNSpec, host_lengths: np.ndarray) -> tuple:
    """The x / y RNN data descriptors and the h / c tensor descriptors of one segment."""
    dt, d = cf.DATA_TYPES[key.dtype], spec.num_directions
    states = spec.num_layers * d
    return (cb.RNNDataDescriptor(_seq_config(cb, key, spec.input_size, host_lengths)),
            cb.RNNDataDescriptor(_seq_config(cb, key, d * spec.output_size, host_lengths)),
            cb.TensorDescriptor((states, key.batch, spec.output_size), dt),
            cb.TensorDescriptor((states, key.batch, spec.hidden_size), dt))


def _set_lengths(seg: Segment, host_lengths: np.ndarray) -> None:
    """The segment's x / y descriptors set in place to new lengths (same shape, layout and sizes)."""
    for desc in seg.descriptors[:2]:
        desc.set_lengths(host_lengths)


def _algorithm(cb: ModuleType, key: PlanKey, spec: RNNSpec, handle: Any, descriptor: DescriptorFactory,
               x_desc: Any, mode: Any, wanted: Any, why: str) -> tuple[Any, Any, str]:
    """``(descriptor, algorithm, note)``: ``wanted`` where cuDNN accepts it for this call (its sizes asked
    once), else STANDARD with cuDNN's refusal in the note."""
    standard = descriptor(spec, key.dtype, key.tf32, cb.RNNAlgo.STANDARD)
    if wanted == cb.RNNAlgo.STANDARD:
        return standard, wanted, why
    try:
        desc = (cb.RNNDescriptor(cf.rnn_config(spec, key.dtype, key.tf32, wanted))
                if wanted == cb.RNNAlgo.PERSIST_DYNAMIC else descriptor(spec, key.dtype, key.tf32, wanted))
        if cb.weight_space_size(handle, desc) != cb.weight_space_size(handle, standard):
            return standard, cb.RNNAlgo.STANDARD, f"{wanted.name} has another weight space size; {why}"
        cb.temp_space_sizes(handle, desc, x_desc, mode)
        if wanted == cb.RNNAlgo.PERSIST_DYNAMIC:  # compiled for this descriptor and batch size (NVRTC)
            cb.build_rnn_dynamic(handle, desc, key.batch)
        return desc, wanted, why
    except cb.CudnnError as err:
        if not cf.is_refusal(err):
            raise
        detail = f": {err.detail}" if err.detail else ""
        note = f"cuDNN refused {wanted.name} ({err.name}{detail}), asked for because {why}"
        return standard, cb.RNNAlgo.STANDARD, note
