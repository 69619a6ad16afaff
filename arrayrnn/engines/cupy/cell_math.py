""":mod:`arrayrnn.cellmath` on the CUDA target: what a custom cell's calls to ``cm.sigmoid``, ``cm.tanh``, ...
compile to inside the cupy engine's kernels (:mod:`.custom_kernels`).

Each function of ``cellmath`` has a :class:`Form` here: a plain Python implementation made per compute dtype
(its constants in that dtype, so float32 math stays float32), written as the built-in kernels of
:mod:`.kernels` write the same math (``sigmoid(x) = 1 / (1 + exp(-x))``, ``relu(x) = x if x > 0 else 0``), and
CUDA's math library underneath (``math.exp`` of a float32 is ``expf``). :func:`install` teaches numba-cuda
each of them: a typing template (``type_callable``: the result is the argument's float type) and a lowering
that compiles the form inline into the calling kernel (``lower_builtin`` + ``compile_internal``).

Why not ``@overload(..., target="cuda")``: numba-cuda (0.30.4) types an overload's implementation by
compiling it as a device function for the *current device* (``get_current_device()``), so every kernel that
calls one needs a GPU and its driver just to be typed; the engine compiles its kernels with
``numba.cuda.compile_ptx`` for a given compute capability (and CI checks that PTX with no GPU at all). A
typing template and an inline lowering compile for the kernel's own target, GPU or not.

Types, per call (``Number``: a numba float, integer or bool)::

    unary f(x):           x's float type (an integer or bool argument: float64)
    maximum, minimum(a, b), where(cond, a, b):   the narrowest float type among a and b
                          (in a float32 cell every float64 value is a Python literal such as 0.0: the
                          constants never widen the cell's math; no float among them: float64)

Under numba's CUDA simulator nothing is installed: the kernels call the plain ``cellmath`` functions.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import cellmath as cm

Impl = Callable[..., Any]


@dataclass(frozen=True)
class Form:
    """A ``cellmath`` function's CUDA form: ``make(dtype)`` is its implementation in that compute dtype."""

    function: Callable[..., Any]
    arity: int
    make: Callable[[np.dtype], Impl]
    result: str = "unary"  # how the result type is chosen: "unary" or "narrowest" (see the module docstring)


def _constants(dtype: np.dtype) -> tuple[Any, Any]:
    return dtype.type(0), dtype.type(1)


def _sigmoid(dtype: np.dtype) -> Impl:
    _, one = _constants(dtype)

    def sigmoid(x):
        return one / (one + math.exp(-x))
    return sigmoid


def _tanh(dtype: np.dtype) -> Impl:
    def tanh(x):
        return math.tanh(x)
    return tanh


def _relu(dtype: np.dtype) -> Impl:
    zero, _ = _constants(dtype)

    def relu(x):
        return x if x > zero else zero
    return relu


def _dsigmoid(dtype: np.dtype) -> Impl:
    _, one = _constants(dtype)

    def dsigmoid(y):
        return y * (one - y)
    return dsigmoid


def _dtanh(dtype: np.dtype) -> Impl:
    _, one = _constants(dtype)

    def dtanh(y):
        return one - y * y
    return dtanh


def _step(dtype: np.dtype) -> Impl:
    zero, one = _constants(dtype)

    def step(x):
        return one if x > zero else zero
    return step


def _exp(dtype: np.dtype) -> Impl:
    def exp(x):
        return math.exp(x)
    return exp


def _log(dtype: np.dtype) -> Impl:
    def log(x):
        return math.log(x)
    return log


def _sqrt(dtype: np.dtype) -> Impl:
    def sqrt(x):
        return math.sqrt(x)
    return sqrt


def _logsigmoid(dtype: np.dtype) -> Impl:
    zero, _ = _constants(dtype)

    def logsigmoid(x):
        return (x if x < zero else zero) - math.log1p(math.exp(-abs(x)))
    return logsigmoid


def _maximum(dtype: np.dtype) -> Impl:
    def maximum(a, b):
        return a if (a > b or a != a) else b  # NaN in a: a; NaN in b: b
    return maximum


def _minimum(dtype: np.dtype) -> Impl:
    def minimum(a, b):
        return a if (a < b or a != a) else b
    return minimum


def _where(dtype: np.dtype) -> Impl:
    def where(cond, a, b):
        return a if cond else b
    return where


FORMS: dict[str, Form] = {
    "sigmoid": Form(cm.sigmoid, 1, _sigmoid),
    "tanh": Form(cm.tanh, 1, _tanh),
    "relu": Form(cm.relu, 1, _relu),
    "dsigmoid": Form(cm.dsigmoid, 1, _dsigmoid),
    "dtanh": Form(cm.dtanh, 1, _dtanh),
    "drelu": Form(cm.drelu, 1, _step),
    "step": Form(cm.step, 1, _step),
    "exp": Form(cm.exp, 1, _exp),
    "log": Form(cm.log, 1, _log),
    "sqrt": Form(cm.sqrt, 1, _sqrt),
    "logsigmoid": Form(cm.logsigmoid, 1, _logsigmoid),
    "maximum": Form(cm.maximum, 2, _maximum, "narrowest"),
    "minimum": Form(cm.minimum, 2, _minimum, "narrowest"),
    "where": Form(cm.where, 3, _where, "narrowest"),
}
"""Every ``cellmath`` function (by its name in ``cellmath.__all__``) and its CUDA form."""


@functools.cache
def implementation(name: str, dtype: np.dtype) -> Impl:
    """The form ``name`` in ``dtype`` (one function object per pair: numba caches its compilation by it)."""
    return FORMS[name].make(np.dtype(dtype))


# -- numba-cuda's typing and lowering ---------------------------------------------------------------------
def result_type(form: Form, args: tuple[Any, ...]) -> Any:
    """The numba type a call of ``form`` on numba types ``args`` returns, or ``None`` (not a number: numba
    then reports the call it could not type)."""
    from numba.cuda import types

    numbers = args[1:] if form.result == "narrowest" and form.arity == 3 else args  # where: cond is free
    if not all(isinstance(a, (types.Number, types.Boolean)) for a in args):
        return None
    floats = [a for a in numbers if isinstance(a, types.Float)]
    if not floats:
        return types.float64
    return min(floats, key=lambda f: f.bitwidth) if form.result == "narrowest" else floats[0]


_TYPERS: dict[int, Callable[[Form], Callable[..., Any]]] = {  # numba folds a call by its typer's parameters
    1: lambda form: lambda x: result_type(form, (x,)),
    2: lambda form: lambda a, b: result_type(form, (a, b)),
    3: lambda form: lambda cond, a, b: result_type(form, (cond, a, b)),
}


def _register(name: str, form: Form) -> None:
    from numba.cuda import types
    from numba.cuda.extending import lower_builtin, type_callable
    from numba.cuda.np.numpy_support import as_dtype

    @type_callable(form.function)
    def type_form(context):
        return _TYPERS[form.arity](form)

    @lower_builtin(form.function, *(types.Any,) * form.arity)
    def lower_form(context, builder, sig, args):
        return context.compile_internal(builder, implementation(name, as_dtype(sig.return_type)), sig, args)


_installed = False
_lock = threading.Lock()


def install() -> None:
    """Teach numba-cuda every :data:`FORMS` entry (once per process; not under the CUDA simulator)."""
    global _installed
    with _lock:
        if not _installed:
            for name, form in FORMS.items():
                _register(name, form)
            _installed = True
