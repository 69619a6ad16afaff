"""Checked arguments: the one place where a Python value becomes a C argument of cudnn_bindings.

ctypes converts silently: ``c_int(2**40)`` is ``0`` (``CUDNN_STATUS_SUCCESS``), a negative ``size_t`` wraps,
and a small integer in a pointer slot is dereferenced by cuDNN. So every thin wrapper of `raw` declares its
parameters with the C types below and is wrapped by `checked`, which refuses, before any C call:

* a non-integer (or a ``bool``) in an integer slot (``TypeError``), an integer beyond the C type's range
  (``ValueError``);
* in an address slot (a handle, a descriptor, host or device memory): anything but ``None`` or an ``int``;
  a negative address, one beyond 64 bits, or one in ``1..4095`` (the never-mapped first page: what a size or
  an enum passed in the wrong place looks like). ``0``/``None`` is NULL, which cuDNN itself rejects where it
  needs an object;
* a real number beyond a ``float``'s range (it would become inf), or a non-number.

The typed layers (`descriptors`, `rnn`) pass owning objects through `owned`, which also checks the kind
(a TensorDescriptor where an RNN descriptor is expected) and that the object is open.

What cannot be checked: an integer address that lies in the valid range but no longer names a live cuDNN
object (``int(desc)`` kept after ``desc.close()`` is the freed address). Pass the owning objects
themselves to the typed functions: a closed one is refused.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import operator
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

__all__ = ["CInt", "CInt32", "CUInt32", "SizeT", "ULongLong", "Enum", "CFloat", "CDouble", "Address",
           "Stream", "IntIn", "IntArray", "checked", "owned", "address", "stream", "integer", "MIN_ADDRESS"]

MIN_ADDRESS = 4096  # addresses below this (the first page) are never mapped
_MAX_ADDRESS = 2**64 - 1
_FLOAT_MAX = 3.4028234663852886e38
_SPECIAL_STREAMS = (1, 2)  # cudaStreamLegacy, cudaStreamPerThread


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} ({type(value).__name__})"


def integer(name: str, value: Any, lo: int, hi: int, what: str = "") -> int:
    """``value`` as a Python int in ``lo..hi``; ``TypeError`` for non-integers and bools. ``what`` says
    where the range comes from (e.g. "C int")."""
    if type(value) is int and lo <= value <= hi:  # the common case, first and cheap
        return value
    note = f" ({what})" if what else ""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an integer{note}; got {_describe(value)}")
    v = operator.index(value)
    if not lo <= v <= hi:
        raise ValueError(f"{name} = {v}; expected an integer in {lo}..{hi}{note}")
    return v


def address(name: str, value: Any, *, nullable: bool = True) -> int | None:
    """An address: ``None``/``0`` (NULL, where ``nullable``) or an int in ``4096..2**64 - 1``."""
    if type(value) is int and MIN_ADDRESS <= value <= _MAX_ADDRESS:  # the common case, first and cheap
        return value
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        null = "None or " if nullable else ""
        hint = "; pass its .ptr, or pass the object to the typed functions" if hasattr(value, "ptr") else ""
        raise TypeError(f"{name} must be {null}an int address; got {_describe(value)}{hint}")
    v = operator.index(value)
    if v == 0 and nullable:
        return None
    if not MIN_ADDRESS <= v <= _MAX_ADDRESS:
        lo = "0 (NULL) or " if nullable else ""
        raise ValueError(f"{name} = {v:#x}; expected {lo}an address in {MIN_ADDRESS:#x}..2**64 - 1 (a small "
                         f"or negative number is a size or an enum in the wrong place, never an address)")
    return v


def stream(name: str, value: Any) -> int | None:
    """A ``cudaStream_t``: an `address`, or one of CUDA's special handles ``cudaStreamLegacy`` (1) and
    ``cudaStreamPerThread`` (2)."""
    is_int = not isinstance(value, bool) and hasattr(value, "__index__")
    if is_int and operator.index(value) in _SPECIAL_STREAMS:
        return operator.index(value)
    return address(name, value)


@dataclass(frozen=True)
class IntIn:
    """An integer slot holding ``lo..hi``; ``what`` names the C type or the reason for the range."""

    lo: int
    hi: int
    what: str

    def __call__(self, name: str, value: Any) -> int:
        return integer(name, value, self.lo, self.hi, self.what)


@dataclass(frozen=True)
class _Real:
    ctype: str
    limit: float

    def __call__(self, name: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be a real number ({self.ctype}); got {_describe(value)}")
        v = float(value)
        if math.isfinite(v) and abs(v) > self.limit:
            raise ValueError(f"{name} = {v}; beyond the range of {self.ctype} (|x| <= {self.limit:g})")
        return v


@dataclass(frozen=True)
class IntArray:
    """A host array of C ints passed by the wrapper itself: a sequence of ``min_len..max_len`` integers."""

    min_len: int
    max_len: int

    def __call__(self, name: str, value: Any) -> tuple[int, ...]:
        array_like = isinstance(value, Sequence) or hasattr(value, "tolist")
        if isinstance(value, (str, bytes)) or not array_like:
            raise TypeError(f"{name} must be a sequence of integers; got {_describe(value)}")
        items = value.tolist() if hasattr(value, "tolist") else list(value)
        if not self.min_len <= len(items) <= self.max_len:
            raise ValueError(f"{name} has {len(items)} entries; expected {self.min_len}..{self.max_len}")
        return tuple(integer(f"{name}[{i}]", v, -2**31, 2**31 - 1, "C int") for i, v in enumerate(items))


CInt = Annotated[int, IntIn(-2**31, 2**31 - 1, "C int")]
CInt32 = Annotated[int, IntIn(-2**31, 2**31 - 1, "C int32_t")]
CUInt32 = Annotated[int, IntIn(0, 2**32 - 1, "C uint32_t")]
SizeT = Annotated[int, IntIn(0, 2**64 - 1, "C size_t")]
ULongLong = Annotated[int, IntIn(0, 2**64 - 1, "C unsigned long long")]
Enum = Annotated[int, IntIn(-2**31, 2**31 - 1, "a C enum: int")]
CFloat = Annotated[float, _Real("float", _FLOAT_MAX)]
CDouble = Annotated[float, _Real("double", math.inf)]
Address = Annotated[int | None, address]  # a handle, descriptor or memory address; None/0 is NULL
Stream = Annotated[int | None, stream]


def _checkers(fn: Callable) -> dict[str, Callable[[str, Any], Any]]:
    hints = typing.get_type_hints(fn, include_extras=True)
    found = {}
    for name, hint in hints.items():
        for meta in getattr(hint, "__metadata__", ()):
            if callable(meta):
                found[name] = meta
    return found


def _unchecked(name: str, value: Any) -> Any:
    return value


def checked(fn: Callable) -> Callable:
    """Check (and convert) every argument annotated with one of this module's C types before calling ``fn``.
    Errors name the parameter and the C function's Python wrapper."""
    sig = inspect.signature(fn)
    checks = _checkers(fn)
    plan = [(name, checks.get(name, _unchecked)) for name in sig.parameters]

    def convert(pairs: Any) -> list[Any]:
        try:
            return [check(name, value) for (name, check), value in pairs]
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{fn.__name__}: {exc}") from None

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not kwargs and len(args) == len(plan):
            return fn(*convert(zip(plan, args, strict=True)))
        bound = sig.bind(*args, **kwargs)
        names = list(bound.arguments)
        values = convert(((name, checks.get(name, _unchecked)), bound.arguments[name]) for name in names)
        bound.arguments.update(zip(names, values, strict=True))
        return fn(*bound.args, **bound.kwargs)

    return wrapper


def owned(name: str, value: Any, kind: type, *, optional: bool = False) -> int | None:
    """The address of an open owning object of class ``kind`` (or an int address, checked by `address`);
    ``None`` only where ``optional``."""
    what = f"a cudnn_bindings.{kind.__name__}"
    if value is None:
        if optional:
            return None
        raise TypeError(f"{name} is None; expected {what} (or its int address)")
    if isinstance(value, kind):
        if value.closed:
            raise ValueError(f"{name}: this {kind.__name__} is closed (its cuDNN object was destroyed); "
                             f"create a new one")
        return value.ptr
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        alternatives = ", its int address or None" if optional else " or its int address"
        raise TypeError(f"{name} must be {what}{alternatives}; got {_describe(value)}")
    return address(name, value, nullable=False)
