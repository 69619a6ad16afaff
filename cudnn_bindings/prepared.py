"""Prepared compute calls: every argument that stays the same from call to call is checked ONCE.

A caller that runs the same RNN shape many times (a training loop) passes the same descriptors, modes,
device lengths and sizes every time; only the device memory changes. ``prepare_forward`` and friends check
the fixed arguments the way the typed functions of `rnn` do and bind them; the returned
:class:`PreparedCall` then takes the handle and the device addresses (ints, ``0`` is NULL) and goes
straight to C::

    run = prepare_forward(rnn_desc, fwd_mode=ForwardMode.INFERENCE, dev_seq_lengths=lengths_ptr,
                          x_desc=x_desc, y_desc=y_desc, h_desc=h_desc, c_desc=None,
                          weight_space_size=w_bytes, work_space_size=work_bytes, reserve_space_size=0)
    run(handle=h.ptr, x=x_ptr, y=y_ptr, hx=0, hy=hy_ptr, cx=0, cy=0, weight_space=w_ptr,
        work_space=work_ptr, reserve_space=0)

Semantics equal the typed call with the same arguments (``rnn.forward(handle, rnn_desc, **fixed,
**addresses)``). The per-call values are not range-checked (ctypes refuses a non-integer): pass addresses
taken from live device arrays. The prepared call keeps the objects it was prepared with alive.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import cache
from typing import Any

from . import _lib, raw
from .args import address, owned
from .config import _as_enum, _as_int
from .descriptors import Handle, RNNDataDescriptor, RNNDescriptor, TensorDescriptor
from .enums import ForwardMode, WgradMode

__all__ = ["PreparedCall", "prepare_forward", "prepare_backward_data", "prepare_backward_weights"]


def _object(kind: type, optional: bool = False) -> Callable[[str, Any], int | None]:
    return lambda name, value: owned(name, value, kind, optional=optional)


def _size(name: str, value: Any) -> int:
    return _as_int(name, value, 0, 2**64 - 1)


# how each fixed argument is checked; the C name ``desc`` is the typed layer's ``rnn_desc``
_FIXED: dict[str, Callable[[str, Any], Any]] = {
    "rnn_desc": _object(RNNDescriptor),
    "fwd_mode": lambda name, value: _as_enum(name, value, ForwardMode),
    "add_grad": lambda name, value: _as_enum(name, value, WgradMode),
    "dev_seq_lengths": lambda name, value: address(name, value, nullable=False),
    "x_desc": _object(RNNDataDescriptor),
    "y_desc": _object(RNNDataDescriptor),
    "h_desc": _object(TensorDescriptor),
    "c_desc": _object(TensorDescriptor, optional=True),
    "weight_space_size": _size,
    "work_space_size": _size,
    "reserve_space_size": _size,
}


@cache
def _parameters(raw_wrapper: Callable) -> list[str]:
    """The raw wrapper's parameter names (the C order), ``desc`` named ``rnn_desc`` as in the typed layer;
    read once per wrapper (``inspect.signature`` costs tens of microseconds)."""
    return ["rnn_desc" if p == "desc" else p for p in inspect.signature(raw_wrapper).parameters]


class PreparedCall:
    """One cuDNN compute function with its fixed arguments bound; call it with ``handle=`` (a `Handle` or
    its ``.ptr``) and the per-call addresses named in :attr:`per_call`."""

    __slots__ = ("function", "fixed", "per_call", "_fn", "_template", "_slots")

    def __init__(self, function: str, raw_wrapper: Callable, fixed: dict[str, Any]) -> None:
        order = _parameters(raw_wrapper)
        unknown = set(fixed) - set(order)
        if unknown:
            raise TypeError(f"{function}: unknown fixed argument(s) {sorted(unknown)}; it takes {order}")
        checked = {name: _FIXED[name](name, value) for name, value in fixed.items()}
        self.function = function
        self.fixed = dict(fixed)  # the typed values, as given (they also keep the descriptors alive)
        self.per_call = tuple(name for name in order if name not in fixed)
        self._slots = tuple((i, name) for i, name in enumerate(order) if name not in fixed)
        self._template = [checked.get(name) for name in order]
        self._fn = _lib.function(function)

    def __call__(self, **addresses: Any) -> None:
        if len(addresses) != len(self._slots):
            missing = sorted(set(self.per_call) - set(addresses))
            extra = sorted(set(addresses) - set(self.per_call))
            raise TypeError(f"{self.function} (prepared) takes {list(self.per_call)}; missing {missing}, "
                            f"unexpected {extra}")
        args = self._template.copy()
        for i, name in self._slots:
            args[i] = addresses[name]
        if not isinstance(args[0], int):  # a Handle rather than its address
            args[0] = owned("handle", args[0], Handle)
        status = self._fn(*args)
        if status:
            raw.check(status, self.function)

    def __repr__(self) -> str:
        return f"<PreparedCall {self.function} per call: {', '.join(self.per_call)}>"


def prepare_forward(rnn_desc: RNNDescriptor, *, fwd_mode: ForwardMode, dev_seq_lengths: int,
                    x_desc: RNNDataDescriptor, y_desc: RNNDataDescriptor, h_desc: TensorDescriptor,
                    c_desc: TensorDescriptor | None = None, weight_space_size: int, work_space_size: int,
                    reserve_space_size: int = 0) -> PreparedCall:
    """`cudnnRNNForward` with everything but ``handle, x, y, hx, hy, cx, cy, weight_space, work_space,
    reserve_space`` bound. See `rnn.forward`."""
    return PreparedCall("cudnnRNNForward", raw.rnn_forward, dict(
        rnn_desc=rnn_desc, fwd_mode=fwd_mode, dev_seq_lengths=dev_seq_lengths, x_desc=x_desc, y_desc=y_desc,
        h_desc=h_desc, c_desc=c_desc, weight_space_size=weight_space_size, work_space_size=work_space_size,
        reserve_space_size=reserve_space_size))


def prepare_backward_data(rnn_desc: RNNDescriptor, *, dev_seq_lengths: int, y_desc: RNNDataDescriptor,
                          x_desc: RNNDataDescriptor, h_desc: TensorDescriptor,
                          c_desc: TensorDescriptor | None = None, weight_space_size: int,
                          work_space_size: int, reserve_space_size: int) -> PreparedCall:
    """`cudnnRNNBackwardData_v8` with everything but ``handle, y, dy, dx, hx, dhy, dhx, cx, dcy, dcx,
    weight_space, work_space, reserve_space`` bound. See `rnn.backward_data`."""
    return PreparedCall("cudnnRNNBackwardData_v8", raw.rnn_backward_data_v8, dict(
        rnn_desc=rnn_desc, dev_seq_lengths=dev_seq_lengths, y_desc=y_desc, x_desc=x_desc, h_desc=h_desc,
        c_desc=c_desc, weight_space_size=weight_space_size, work_space_size=work_space_size,
        reserve_space_size=reserve_space_size))


def prepare_backward_weights(rnn_desc: RNNDescriptor, *, add_grad: WgradMode = WgradMode.ADD,
                             dev_seq_lengths: int, x_desc: RNNDataDescriptor, h_desc: TensorDescriptor,
                             y_desc: RNNDataDescriptor, weight_space_size: int, work_space_size: int,
                             reserve_space_size: int) -> PreparedCall:
    """`cudnnRNNBackwardWeights_v8` with everything but ``handle, x, hx, y, dweight_space, work_space,
    reserve_space`` bound. See `rnn.backward_weights`."""
    return PreparedCall("cudnnRNNBackwardWeights_v8", raw.rnn_backward_weights_v8, dict(
        rnn_desc=rnn_desc, add_grad=add_grad, dev_seq_lengths=dev_seq_lengths, x_desc=x_desc, h_desc=h_desc,
        y_desc=y_desc, weight_space_size=weight_space_size, work_space_size=work_space_size,
        reserve_space_size=reserve_space_size))
