"""What an engine derives from weights that cannot change, made once per frozen buffer and key.

The frontend runs the NumPy engines on a private copy of ``params.data`` (:mod:`arrayrnn.frontend.guard`),
which nothing writes and which later calls reuse while ``params.data`` holds the same bits; it declares
that copy with :func:`freeze`. :func:`cached` then gives the form derived from a view of a frozen buffer
(the numba engine's packed weights) once per key, for as long as the buffer lives; for any other array
(the caller's own buffer, a cast or a DropConnect-masked copy) it derives the form anew at every call.
Roughly::

    def cached(view, key, make):
        return forms[view.base][view.offset, key] if view.base is frozen else make()
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import numpy as np

Form = TypeVar("Form")
_FORMS: dict[int, dict[Hashable, Any]] = {}  # id(frozen buffer) -> its derived forms by key


def freeze(buffer: np.ndarray, keeper: Any = None) -> None:
    """Declare ``buffer`` (an owning NumPy array) unchanging from now until it is freed; its derived
    forms are dropped with ``keeper`` (an object that holds ``buffer``; default the buffer itself). A form
    may then view the buffer (the driver's per-direction views): the forms keep the buffer alive, and the
    keeper's end lets it go."""
    if buffer.base is not None:
        raise ValueError("freeze takes an array that owns its memory (base is None); got a view")
    if id(buffer) not in _FORMS:
        _FORMS[id(buffer)] = {}
        weakref.finalize(buffer if keeper is None else keeper, _FORMS.pop, id(buffer), None)


def _forms_of(a: Any) -> dict[Hashable, Any] | None:
    """The derived forms of the frozen buffer ``a`` is or views, else None."""
    owner = a.base if isinstance(a, np.ndarray) and a.base is not None else a
    return _FORMS.get(id(owner)) if isinstance(owner, np.ndarray) else None


def is_frozen(a: Any) -> bool:
    """Whether ``a`` is a frozen buffer or a view into one."""
    return _forms_of(a) is not None


def cached(view: Any, key: Hashable, make: Callable[[], Form]) -> Form:
    """``make()``, kept under ``key`` and ``view``'s place in its buffer when ``view`` lies in a frozen
    buffer (and made once there); made anew otherwise."""
    forms = _forms_of(view)
    if forms is None:
        return make()
    place = (view.__array_interface__["data"][0], view.shape, view.strides, key)
    found = forms.get(place)
    if found is None:
        found = forms[place] = make()
    return found
