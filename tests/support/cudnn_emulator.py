"""A float64 emulation of cuDNN's RNN compute calls, reading and writing buffers through their addresses.

``Emulator.forward`` / ``backward_data`` / ``backward_weights`` take exactly the arguments of
``cudnn_bindings.forward`` / ``backward_data`` / ``backward_weights`` (descriptors and raw addresses) and do
what the cuDNN 9 API reference and ``cudnn_adv.h`` say those calls do, on host memory. It is written from
that documentation, NOT from arrayrnn's engines, so that it can disagree with them:

- **What to compute** is read back from the descriptors (``cudnnGetRNNDescriptor_v8``,
  ``cudnnGetRNNDataDescriptor``, ``cudnnGetTensorNdDescriptor``), never passed in.
- **Cells** (``cudnnRNNMode_t``): RNN ``h = act(W x + R h' + bW + bR)``; LSTM ``i, f, o = sigmoid(..)``,
  ``c~ = tanh(..)``, ``c = f*c' + i*c~``, ``h = o*tanh(c)``, with a projection ``h = W_proj (o*tanh(c))``
  when ``projSize < hiddenSize``; GRU ``r, u = sigmoid(..)``, ``h~ = tanh(W_h x + bW_h + r*(R_h h' + bR_h))``,
  ``h = (1-u)*h~ + u*h'``. Each "linear layer" is a matrix and a bias (``cudnnGetRNNWeightParams``):
  ``linLayerID`` 0..G-1 multiply the layer input, G..2G-1 the previous hidden state, in the gate order
  i, f, c~, o (LSTM) / r, u, h~ (GRU); 8 is the LSTM projection (no bias). A bias the bias mode leaves out
  is reported as NULL and counts as zero.
- **Weights** are found through the real ``cudnnGetRNNWeightParams`` (``weight_regions``: offset, dims and
  strides per pseudo-layer and linLayerID); pseudo-layer ``layer * D + direction``.
- **Data** (``cudnnRNNDataLayout_t``): ``SEQ_MAJOR_UNPACKED`` is ``(T, B, V)``, ``BATCH_MAJOR_UNPACKED``
  ``(B, T, V)``; a bidirectional layer's output vector is the forward half then the backward half. Only
  positions ``t < seqLength[b]`` are read; with ``CUDNN_RNN_PADDED_IO_ENABLED`` the padding of the OUTPUT
  ``y`` is set to ``paddingFill`` (``cudnnSetRNNDataDescriptor``: the fill is "only effective when the
  descriptor is describing the RNN output"), so the padding of ``dx`` is never written. The reverse
  direction of a sequence starts at its own last step. A sequence of length 0 is refused (undocumented).
- **States**: ``hx``/``cx``/``dhy``/``dcy`` NULL mean zeros; ``hy``/``cy``/``dhx``/``dcx`` NULL are not
  written; ``devSeqLengths`` must hold the descriptor's lengths.
- **Order**: ``cudnnRNNBackwardData_v8`` needs the reserve space of a TRAINING forward, once (it writes
  into the reserve space: a second BackwardData on it is refused);
  ``cudnnRNNBackwardWeights_v8`` needs it after BackwardData and only ADDs (``CUDNN_WGRAD_MODE_ADD``, the one
  mode the v8 call supports). The emulator keeps the forward's activations on the host, keyed by a token it
  writes into the first bytes of the reserve space, so a reserve space that was reallocated, overwritten or
  swapped is noticed.

Not emulated (an ``EmulationError`` says so): cell clipping (the docs do not say where the clip applies; a
GPU run measured it, tests/test_cudnn_engine.py::test_gpu_cell_clip_is_cudnns_own, and the engine refuses it),
``CUDNN_SKIP_INPUT``, cuDNN's own dropout, the packed layout.
"""

from __future__ import annotations

import ctypes
import itertools
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

import cudnn_bindings as cb

NUMPY_TYPES = {cb.DataType.HALF: np.float16, cb.DataType.FLOAT: np.float32, cb.DataType.DOUBLE: np.float64}
GATES = {cb.RNNMode.RNN_RELU: 1, cb.RNNMode.RNN_TANH: 1, cb.RNNMode.LSTM: 4, cb.RNNMode.GRU: 3}
PROJECTION_ID = 8


class EmulationError(AssertionError):
    """The call breaks a rule of the cuDNN documentation (or asks for something not emulated)."""


class Memory:
    """Host memory seen through addresses; a subclass may check that an address range is "device" memory."""

    def check(self, ptr: int, nbytes: int, what: str) -> None:
        if nbytes and not ptr:
            raise EmulationError(f"{what} is NULL but {nbytes} bytes are read or written there")

    def view(self, ptr: int, count: int, dtype: Any, what: str) -> np.ndarray:
        """A writable 1-D array of ``count`` elements of ``dtype`` at address ``ptr``."""
        nbytes = count * np.dtype(dtype).itemsize
        self.check(ptr, nbytes, what)
        if nbytes == 0:
            return np.zeros(0, dtype)
        return np.frombuffer((ctypes.c_char * nbytes).from_address(ptr), dtype=dtype, count=count)


# -- descriptors, read back from cuDNN ---------------------------------------------------------------
def _ptr(obj: Any) -> int:
    return int(obj.ptr) if hasattr(obj, "ptr") else int(obj)


def rnn_config(desc: Any) -> cb.RNNConfig:
    return cb.RNNDescriptor.get(SimpleNamespace(ptr=_ptr(desc)))


def seq_config(desc: Any) -> cb.SeqDataConfig:
    return cb.RNNDataDescriptor.get(SimpleNamespace(ptr=_ptr(desc)))


def tensor_config(desc: Any) -> cb.TensorConfig:
    return cb.TensorDescriptor.get(SimpleNamespace(ptr=_ptr(desc)))


@dataclass(frozen=True)
class Net:
    """The network an RNN descriptor describes."""

    config: cb.RNNConfig
    gates: int
    directions: int
    hidden: int
    out: int            # projSize (= hidden without projection)

    @classmethod
    def of(cls, config: cb.RNNConfig) -> Net:
        if config.clip_mode != cb.RNNClipMode.NONE:
            raise EmulationError("cell clipping is not emulated (the engine refuses it: cuDNN also clips cx "
                                 "on entry and returns the pre-clip cy)")
        if config.input_mode != cb.RNNInputMode.LINEAR_INPUT:
            raise EmulationError("CUDNN_SKIP_INPUT is not emulated")
        return cls(config, GATES[config.cell_mode], config.num_directions, config.hidden_size,
                   config.proj_size)

    @property
    def layers(self) -> int:
        return self.config.num_layers

    @property
    def dtype(self) -> Any:
        return NUMPY_TYPES[self.config.data_type]

    def layer_input(self, layer: int) -> int:
        return self.config.input_size if layer == 0 else self.directions * self.out

    def pseudo_layers(self, layer: int) -> list[tuple[int, int]]:
        return [(layer * self.directions + d, d) for d in range(self.directions)]


@dataclass(frozen=True)
class Seq:
    """An RNN data descriptor's layout: where element ``(t, b, v)`` lives and which positions are valid."""

    config: cb.SeqDataConfig

    @property
    def shape(self) -> tuple[int, int, int]:
        c = self.config
        return c.max_seq_length, c.batch_size, c.vector_size

    @property
    def lengths(self) -> np.ndarray:
        return np.asarray(self.config.seq_lengths, np.int64)

    @property
    def dtype(self) -> Any:
        return NUMPY_TYPES[self.config.data_type]

    def valid(self) -> np.ndarray:
        """``(T, B)``: ``t < seqLength[b]``."""
        T = self.shape[0]
        return np.arange(T)[:, None] < self.lengths[None, :]

    def array(self, memory: Memory, ptr: int, what: str) -> np.ndarray:
        """The buffer as a writable time-major ``(T, B, V)`` view."""
        c, (T, B, V) = self.config, self.shape
        if c.layout == cb.RNNDataLayout.SEQ_MAJOR_UNPACKED:
            return memory.view(ptr, T * B * V, self.dtype, what).reshape(T, B, V)
        if c.layout == cb.RNNDataLayout.BATCH_MAJOR_UNPACKED:
            return memory.view(ptr, T * B * V, self.dtype, what).reshape(B, T, V).transpose(1, 0, 2)
        raise EmulationError(f"layout {c.layout.name} is not emulated")

    def read(self, memory: Memory, ptr: int, what: str) -> np.ndarray:
        """float64 ``(T, B, V)``; only valid positions are read (the rest is zero here)."""
        out = np.zeros(self.shape)
        valid = self.valid()
        out[valid] = self.array(memory, ptr, what)[valid]
        return out

    def write(self, memory: Memory, ptr: int, values: np.ndarray, what: str, fill: float | None) -> None:
        """Valid positions from ``values``; the padding set to ``fill`` (left alone when ``None``)."""
        target, valid = self.array(memory, ptr, what), self.valid()
        target[valid] = values[valid]
        if fill is not None:
            target[~valid] = fill


# -- weights ------------------------------------------------------------------------------------------
WeightRegions = Callable[[int, int], cb.WeightParams]  # (pseudo_layer, linLayerID) -> regions


def _region(space: np.ndarray, region: cb.WeightRegion) -> np.ndarray:
    """The region's tensor ``(1, rows, cols)`` in the typed weight space ``space``, as a writable 2-D view
    ``(rows, cols)`` (never a copy)."""
    itemsize = space.itemsize
    if region.offset % itemsize:
        raise EmulationError(f"cudnnGetRNNWeightParams places a region at byte {region.offset}, not on an "
                             f"element of {itemsize} bytes")
    span = 1 + sum((d - 1) * s for d, s in zip(region.dims, region.strides, strict=True))
    start = region.offset // itemsize
    if start + span > space.size:
        raise EmulationError(f"cudnnGetRNNWeightParams places {region} past the weight space's end")
    full = np.lib.stride_tricks.as_strided(space[start:], region.dims, [s * itemsize for s in region.strides])
    return full[(0,) * (full.ndim - 2)]


@dataclass
class Linear:
    """One linear layer: ``matrix @ v + bias`` (views into a weight space; bias ``None`` if absent)."""

    matrix: np.ndarray
    bias: np.ndarray | None


@dataclass
class PseudoLayer:
    """The linear layers of one pseudo-layer: input side ``w[g]``, recurrent side ``r[g]``, projection."""

    w: list[Linear]
    r: list[Linear]
    proj: np.ndarray | None


def weights(net: Net, regions: WeightRegions, memory: Memory, base: int, nbytes: int,
            what: str) -> list[PseudoLayer]:
    """Views of every linear layer of the weight space at ``base`` (``nbytes`` long)."""
    itemsize = np.dtype(net.dtype).itemsize
    space = memory.view(base, nbytes // itemsize, net.dtype, what)
    out = []
    for pseudo in range(net.layers * net.directions):
        def linear(lin: int, pseudo: int = pseudo) -> Linear:
            params, where = regions(pseudo, lin), f"{what} (pseudo-layer {pseudo}, linLayerID {lin})"
            if params.matrix is None:
                raise EmulationError(f"cudnnGetRNNWeightParams reports no matrix for {where}")
            bias = None if params.bias is None else _region(space, params.bias)[:, 0]
            return Linear(_region(space, params.matrix), bias)

        g = net.gates
        proj = None
        if net.config.cell_mode == cb.RNNMode.LSTM and net.out < net.hidden:
            proj = linear(PROJECTION_ID).matrix
        out.append(PseudoLayer([linear(k) for k in range(g)], [linear(g + k) for k in range(g)], proj))
    return out


# -- the cells (float64) --------------------------------------------------------------------------------
def _sigmoid(a: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-a))


def _affine(lin: Linear, v: np.ndarray) -> np.ndarray:
    out = v @ lin.matrix.astype(np.float64).T
    return out if lin.bias is None else out + lin.bias.astype(np.float64)


@dataclass
class Step:
    """What one step of one pseudo-layer computed for its active rows (kept for the backward)."""

    t: int
    rows: np.ndarray
    x: np.ndarray
    h_prev: np.ndarray
    c_prev: np.ndarray | None
    gates: list[np.ndarray]
    rec: list[np.ndarray]               # the recurrent linear layers' outputs (GRU needs R_h h' + bR_h)
    c: np.ndarray | None = None
    m: np.ndarray | None = None         # LSTM o * tanh(c), before the projection
    h: np.ndarray | None = None         # the new hidden state (the output)


def cell_forward(net: Net, p: PseudoLayer, t: int, rows: np.ndarray, x: np.ndarray, h: np.ndarray,
                 c: np.ndarray | None) -> Step:
    ins = [_affine(lin, x) for lin in p.w]
    rec = [_affine(lin, h) for lin in p.r]
    mode = net.config.cell_mode
    step = Step(t, rows, x, h, c, [], rec)
    if mode in (cb.RNNMode.RNN_TANH, cb.RNNMode.RNN_RELU):
        a = ins[0] + rec[0]
        step.h = np.tanh(a) if mode == cb.RNNMode.RNN_TANH else np.maximum(a, 0.0)
    elif mode == cb.RNNMode.LSTM:
        i, f, o = (_sigmoid(ins[k] + rec[k]) for k in (0, 1, 3))
        cand = np.tanh(ins[2] + rec[2])
        step.gates, step.c = [i, f, cand, o], f * c + i * cand
        step.m = o * np.tanh(step.c)
        step.h = step.m if p.proj is None else step.m @ p.proj.astype(np.float64).T
    else:  # GRU
        r, u = _sigmoid(ins[0] + rec[0]), _sigmoid(ins[1] + rec[1])
        cand = np.tanh(ins[2] + r * rec[2])
        step.gates, step.h = [r, u, cand], (1.0 - u) * cand + u * h
    return step


def cell_backward(net: Net, p: PseudoLayer, s: Step, dh: np.ndarray, dc: np.ndarray | None):
    """``(d_in, d_rec, dh_prev, dc_prev)``: the gradients of each linear layer's output (input and
    recurrent side) and of the previous states, for the step's rows."""
    mode = net.config.cell_mode
    if mode in (cb.RNNMode.RNN_TANH, cb.RNNMode.RNN_RELU):
        da = dh * (1.0 - s.h * s.h) if mode == cb.RNNMode.RNN_TANH else dh * (s.h > 0)
        d_in = d_rec = [da]
        dc_prev = None
    elif mode == cb.RNNMode.LSTM:
        i, f, cand, o = s.gates
        dm = dh if p.proj is None else dh @ p.proj.astype(np.float64)
        tc = np.tanh(s.c)
        dc_total = dc + dm * o * (1.0 - tc * tc)
        d_in = d_rec = [dc_total * cand * i * (1 - i), dc_total * s.c_prev * f * (1 - f),
                        dc_total * i * (1 - cand * cand), dm * tc * o * (1 - o)]
        dc_prev = dc_total * f
    else:
        r, u, cand = s.gates
        d_cand = dh * (1.0 - u) * (1.0 - cand * cand)
        dr = d_cand * s.rec[2] * r * (1 - r)
        du = dh * (s.h_prev - cand) * u * (1 - u)
        d_in, d_rec = [dr, du, d_cand], [dr, du, d_cand * r]
        dc_prev = None
    dh_prev = sum(g @ lin.matrix.astype(np.float64) for g, lin in zip(d_rec, p.r, strict=True))
    if mode == cb.RNNMode.GRU:
        dh_prev = dh_prev + dh * s.gates[1]
    return d_in, d_rec, dh_prev, dc_prev


def steps(T: int, lengths: np.ndarray, reverse: bool):
    """``(t, rows)`` in the order one direction visits them: the active rows of each step."""
    order = range(T - 1, -1, -1) if reverse else range(T)
    for t in order:
        rows = np.flatnonzero(lengths > t)
        if rows.size:
            yield t, rows


# -- the calls ------------------------------------------------------------------------------------------
@dataclass
class _Training:
    """What a TRAINING forward leaves for the backward calls (the emulated reserve space)."""

    net: Net
    x_config: cb.SeqDataConfig
    layer_inputs: list[np.ndarray]               # float64 (T, B, V) per layer (layer 0: x)
    history: dict[int, list[Step]]               # per pseudo-layer, in visiting order
    grads: dict[int, list[tuple]] | None = None  # after BackwardData: per pseudo-layer (d_in, d_rec, dh)
    used: bool = False  # a BackwardData ran on it (cuDNN wrote into the reserve space)


class Emulator:
    """cudnnRNNForward / BackwardData_v8 / BackwardWeights_v8 on host memory (see the module docstring)."""

    def __init__(self, memory: Memory, weight_regions: Callable[[Any, int], WeightRegions],
                 keep: int = 64):
        self.memory = memory
        self.weight_regions = weight_regions  # (rnn_desc, weight_space_size) -> regions(pseudo, lin)
        self._reserves: OrderedDict[int, _Training] = OrderedDict()
        self._tokens = itertools.count(0x5EED0001)
        self._keep = keep

    # -- helpers ----------------------------------------------------------------------------------
    def _net(self, rnn_desc: Any) -> Net:
        if cb.RNNDescriptor.dropout_address(SimpleNamespace(ptr=_ptr(rnn_desc))):
            raise EmulationError("the RNN descriptor holds a dropout descriptor: cuDNN's own dropout (its "
                                 "RNG) is not emulated")
        return Net.of(rnn_config(rnn_desc))

    def _lengths(self, seq: Seq, dev_seq_lengths: int) -> np.ndarray:
        B = seq.shape[1]
        device = self.memory.view(dev_seq_lengths, B, np.int32, "devSeqLengths").astype(np.int64)
        if not np.array_equal(device, seq.lengths):
            raise EmulationError(f"devSeqLengths = {device.tolist()} differ from the data descriptor's "
                                 f"seqLengthArray = {seq.lengths.tolist()}")
        if (seq.lengths == 0).any():
            raise EmulationError(f"seqLengthArray = {seq.lengths.tolist()} holds 0: what cuDNN does with an "
                                 "empty sequence is not documented")
        return seq.lengths

    def _states(self, net: Net, desc: Any, ptr: int, width: int, batch: int, what: str,
                read: bool) -> np.ndarray | None:
        """float64 ``(L*D, B, width)`` (zeros for NULL) to read, or the view to write (``None`` for NULL)."""
        shape = (net.layers * net.directions, batch, width)
        if desc is None:
            if ptr:
                raise EmulationError(f"{what} is given without its tensor descriptor")
            return np.zeros(shape) if read else None
        cfg = tensor_config(desc)
        if cfg.dims != shape or cfg.strides != (batch * width, width, 1):
            raise EmulationError(f"the descriptor of {what} says dims {cfg.dims}, strides {cfg.strides}; the "
                                 f"docs want fully packed {shape}")
        if not ptr:
            return np.zeros(shape) if read else None
        view = self.memory.view(ptr, int(np.prod(shape)), NUMPY_TYPES[cfg.data_type], what).reshape(shape)
        return view.astype(np.float64) if read else view

    def _weights(self, net: Net, rnn_desc: Any, ptr: int, nbytes: int, what: str) -> list[PseudoLayer]:
        return weights(net, self.weight_regions(rnn_desc, nbytes), self.memory, ptr, nbytes, what)

    def _token(self, reserve: int, size: int, write: bool) -> int:
        if size < 8:
            raise EmulationError(f"reserveSpaceSize = {size}: a training call needs the reserve space")
        slot = self.memory.view(reserve, 1, np.uint64, "reserveSpace")
        if write:
            slot[0] = next(self._tokens)
        return int(slot[0])

    def _training(self, reserve: int, size: int, call: str) -> _Training:
        state = self._reserves.get(self._token(reserve, size, write=False))
        if state is None:
            raise EmulationError(f"{call}: the reserve space does not hold a TRAINING forward's results (not "
                                 "the forward's reserve space, or overwritten since)")
        return state

    # -- cudnnRNNForward ---------------------------------------------------------------------------
    def forward(self, handle: Any, rnn_desc: Any, *, fwd_mode: Any, dev_seq_lengths: int, x_desc: Any,
                x: int, y_desc: Any, y: int, h_desc: Any, hx: int = 0, hy: int = 0, c_desc: Any = None,
                cx: int = 0, cy: int = 0, weight_space: int, weight_space_size: int, work_space: int,
                work_space_size: int, reserve_space: int = 0, reserve_space_size: int = 0) -> None:
        net, xs, ys = self._net(rnn_desc), Seq(seq_config(x_desc)), Seq(seq_config(y_desc))
        lengths = self._lengths(xs, dev_seq_lengths)
        T, B, _ = xs.shape
        self.memory.check(work_space, work_space_size, "workSpace")
        w = self._weights(net, rnn_desc, weight_space, weight_space_size, "weightSpace")
        lstm = net.config.cell_mode == cb.RNNMode.LSTM
        h0 = self._states(net, h_desc, hx, net.out, B, "hx", read=True)
        c0 = self._states(net, c_desc, cx, net.hidden, B, "cx", read=True) if lstm else None
        h_n, c_n = np.array(h0), (np.array(c0) if lstm else None)
        layer_in, inputs, history = xs.read(self.memory, x, "x"), [], {}
        for layer in range(net.layers):
            inputs.append(layer_in)
            out = np.zeros((T, B, net.directions * net.out))
            for pseudo, d in net.pseudo_layers(layer):
                h, c = h_n[pseudo], (c_n[pseudo] if lstm else None)
                history[pseudo] = []
                for t, rows in steps(T, lengths, reverse=d == 1):
                    s = cell_forward(net, w[pseudo], t, rows, layer_in[t, rows], h[rows],
                                     c[rows] if lstm else None)
                    h[rows] = s.h
                    if lstm:
                        c[rows] = s.c
                    out[t, rows, d * net.out:(d + 1) * net.out] = s.h
                    history[pseudo].append(s)
            layer_in = out
        fill = ys.config.padding_fill if net.config.padded_io else None
        ys.write(self.memory, y, layer_in, "y", fill)
        self._write_states(net, h_desc, hy, h_n, B, "hy", net.out)
        if lstm:
            self._write_states(net, c_desc, cy, c_n, B, "cy", net.hidden)
        if int(fwd_mode) == int(cb.ForwardMode.TRAINING):
            token = self._token(reserve_space, reserve_space_size, write=True)
            self._remember(token, _Training(net, xs.config, inputs, history))

    def _write_states(self, net: Net, desc: Any, ptr: int, values: np.ndarray, batch: int, what: str,
                      width: int) -> None:
        view = self._states(net, desc, ptr, width, batch, what, read=False)
        if view is not None:
            view[...] = values

    def _remember(self, token: int, state: _Training) -> None:
        self._reserves[token] = state
        while len(self._reserves) > self._keep:
            self._reserves.popitem(last=False)

    # -- cudnnRNNBackwardData_v8 --------------------------------------------------------------------
    def backward_data(self, handle: Any, rnn_desc: Any, *, dev_seq_lengths: int, y_desc: Any, y: int,
                      dy: int, x_desc: Any, dx: int, h_desc: Any, hx: int = 0, dhy: int = 0, dhx: int = 0,
                      c_desc: Any = None, cx: int = 0, dcy: int = 0, dcx: int = 0, weight_space: int,
                      weight_space_size: int, work_space: int, work_space_size: int, reserve_space: int,
                      reserve_space_size: int) -> None:
        state = self._training(reserve_space, reserve_space_size, "cudnnRNNBackwardData_v8")
        if state.used:
            raise EmulationError("cudnnRNNBackwardData_v8 on a reserve space that an earlier BackwardData "
                                 "used: the call writes into it (reserveSpace is Input/Output; on a GPU "
                                 "the second backward's weight gradient came out near zero), so a second "
                                 "backward needs a new TRAINING forward")
        net, xs, ys = self._net(rnn_desc), Seq(seq_config(x_desc)), Seq(seq_config(y_desc))
        self._same_call(state, net, xs)
        self._lengths(xs, dev_seq_lengths)
        T, B, _ = xs.shape
        self.memory.check(work_space, work_space_size, "workSpace")
        ys.array(self.memory, y, "y")  # an input of the call: it must be there
        w = self._weights(net, rnn_desc, weight_space, weight_space_size, "weightSpace")
        lstm = net.config.cell_mode == cb.RNNMode.LSTM
        self._states(net, h_desc, hx, net.out, B, "hx", read=True)
        if lstm:
            self._states(net, c_desc, cx, net.hidden, B, "cx", read=True)
        dh_n = self._states(net, h_desc, dhy, net.out, B, "dhy", read=True)
        dc_n = self._states(net, c_desc, dcy, net.hidden, B, "dcy", read=True) if lstm else None
        d_out, state.grads = ys.read(self.memory, dy, "dy"), {}
        state.used = True
        dh0, dc0 = np.zeros_like(dh_n), (np.zeros_like(dc_n) if lstm else None)
        for layer in reversed(range(net.layers)):
            d_in_total = np.zeros((T, B, net.layer_input(layer)))
            for pseudo, d in net.pseudo_layers(layer):
                dh, dc = np.array(dh_n[pseudo]), (np.array(dc_n[pseudo]) if lstm else None)
                grads = []
                for s in reversed(state.history[pseudo]):
                    t = s.t
                    g_h = d_out[t, s.rows, d * net.out:(d + 1) * net.out] + dh[s.rows]
                    d_in, d_rec, dh_prev, dc_prev = cell_backward(net, w[pseudo], s, g_h,
                                                                  dc[s.rows] if lstm else None)
                    dh[s.rows] = dh_prev
                    if lstm:
                        dc[s.rows] = dc_prev
                    d_in_total[t, s.rows] += sum(g @ lin.matrix.astype(np.float64)
                                                 for g, lin in zip(d_in, w[pseudo].w, strict=True))
                    grads.append((t, d_in, d_rec, g_h))
                state.grads[pseudo] = grads
                dh0[pseudo] = dh
                if lstm:
                    dc0[pseudo] = dc
            d_out = d_in_total
        xs.write(self.memory, dx, d_out, "dx", fill=None)
        self._write_states(net, h_desc, dhx, dh0, B, "dhx", net.out)
        if lstm:
            self._write_states(net, c_desc, dcx, dc0, B, "dcx", net.hidden)

    @staticmethod
    def _same_call(state: _Training, net: Net, xs: Seq) -> None:
        if net.config != state.net.config or xs.config != state.x_config:
            raise EmulationError("the backward call's RNN or x descriptor differs from the TRAINING forward's"
                                 " "
                                 f"({net.config} / {xs.config} vs {state.net.config} / {state.x_config})")

    # -- cudnnRNNBackwardWeights_v8 -----------------------------------------------------------------
    def backward_weights(self, handle: Any, rnn_desc: Any, *, add_grad: Any, dev_seq_lengths: int,
                         x_desc: Any, x: int, h_desc: Any, hx: int = 0, y_desc: Any, y: int,
                         dweight_space: int, weight_space_size: int, work_space: int, work_space_size: int,
                         reserve_space: int, reserve_space_size: int) -> None:
        if int(add_grad) != int(cb.WgradMode.ADD):
            raise EmulationError(f"addGrad = {add_grad!r}: cudnnRNNBackwardWeights_v8 supports only "
                                 "CUDNN_WGRAD_MODE_ADD")
        state = self._training(reserve_space, reserve_space_size, "cudnnRNNBackwardWeights_v8")
        if state.grads is None:
            raise EmulationError("cudnnRNNBackwardWeights_v8 before cudnnRNNBackwardData_v8 on this reserve "
                                 "space")
        net, xs, ys = self._net(rnn_desc), Seq(seq_config(x_desc)), Seq(seq_config(y_desc))
        self._same_call(state, net, xs)
        lengths = self._lengths(xs, dev_seq_lengths)
        T, B, _ = xs.shape
        self.memory.check(work_space, work_space_size, "workSpace")
        dw = self._weights(net, rnn_desc, dweight_space, weight_space_size, "dweightSpace")
        h0 = self._states(net, h_desc, hx, net.out, B, "hx", read=True)
        y_top = ys.read(self.memory, y, "y")
        for layer in range(net.layers):
            # the layer's input and hidden-state sequences: from the call's x and y where the docs make
            # them inputs of this call, from the forward (the reserve space) in between
            inp = xs.read(self.memory, x, "x") if layer == 0 else state.layer_inputs[layer]
            outs = y_top if layer == net.layers - 1 else state.layer_inputs[layer + 1]
            for pseudo, d in net.pseudo_layers(layer):
                h_seq = outs[..., d * net.out:(d + 1) * net.out]
                for (t, d_in, d_rec, g_h), s in zip(state.grads[pseudo], reversed(state.history[pseudo]),
                                                    strict=True):
                    h_prev = _previous(h_seq, h0[pseudo], t, s.rows, lengths, d == 1)
                    _accumulate(dw[pseudo], inp[t, s.rows], h_prev, d_in, d_rec,
                                g_h if dw[pseudo].proj is not None else None, s.m)
        state.grads = None  # one BackwardWeights per BackwardData


def _previous(h_seq: np.ndarray, h0: np.ndarray, t: int, rows: np.ndarray, lengths: np.ndarray,
              reverse: bool) -> np.ndarray:
    """The hidden state entering step ``t`` of ``rows``: ``h0`` at a row's first step, else the output of
    the step before (``t-1``, or ``t+1`` in the reverse direction)."""
    first = (lengths[rows] - 1 == t) if reverse else np.full(rows.size, t == 0)
    before = h_seq[t + 1, rows] if reverse and t + 1 < h_seq.shape[0] else h_seq[max(t - 1, 0), rows]
    return np.where(first[:, None], h0[rows], before)


def _accumulate(p: PseudoLayer, x: np.ndarray, h_prev: np.ndarray, d_in: list, d_rec: list,
                g_h: np.ndarray | None, m: np.ndarray | None) -> None:
    """ADD one step's weight gradients into the views ``p`` of the gradient space."""
    for lin, g, v in itertools.chain(zip(p.w, d_in, itertools.repeat(x)),
                                     zip(p.r, d_rec, itertools.repeat(h_prev))):
        lin.matrix[...] = (lin.matrix.astype(np.float64) + g.T @ v).astype(lin.matrix.dtype)
        if lin.bias is not None:
            lin.bias[...] = (lin.bias.astype(np.float64) + g.sum(axis=0)).astype(lin.bias.dtype)
    if p.proj is not None:
        p.proj[...] = (p.proj.astype(np.float64) + g_h.T @ m).astype(p.proj.dtype)
