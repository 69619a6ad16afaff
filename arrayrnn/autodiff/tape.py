"""The reverse-mode tape: traced values, primitives with VJP rules, and the backward pass.

A :class:`Primitive` wraps a forward function on raw arrays. Called with a :class:`Traced` argument it
records a :class:`Node` that keeps exactly what the primitive's VJP rule needs (``keep``) and returns
traced outputs. The rule sits next to its forward (autograd's ``defvjp`` style) and receives the
cotangent, the forward's output and the forward's arguments::

    @primitive(keep=("ans",))
    def tanh(x):
        return xp.tanh(x)

    @tanh.defvjp
    def _tanh_vjp(g, ans, x):
        return (g * (1 - ans * ans),)      # one entry per positional argument (None: no gradient)

Arguments a rule does not keep reach it as :class:`Meta` (shape and dtype only), so a node never holds
a buffer its rule will not read. A forward that needs values other than its output and arguments returns
``Residuals(out, name=value, ...)``; the rule then gets ``ans=None`` and the saved values as keywords.
A rule may declare the keyword-only parameters ``needs`` (a bool per positional argument: is its
gradient wanted) and ``owns_g`` (True when the tape hands over a cotangent buffer that nothing else
refers to, so the rule may overwrite it in place).

Each node's rule runs once: after it runs the node drops what it kept, and a second backward through
the same node is a ``RuntimeError`` (like PyTorch without ``retain_graph``), never a wrong gradient.
"""

from __future__ import annotations

import functools
import inspect
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..core.backend import as_array, get_xp, is_writeable


class Meta:
    """What a node keeps of an argument its rule does not need: the shape and the dtype."""

    __slots__ = ("shape", "dtype")

    def __init__(self, value: Any):
        self.shape = tuple(np.shape(value)) if value is not None else ()
        self.dtype = getattr(value, "dtype", None)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def __repr__(self) -> str:
        return f"Meta(shape={self.shape}, dtype={self.dtype})"


class Residuals:
    """Returned by a forward to choose what its rule receives: ``out`` is what the caller gets."""

    __slots__ = ("out", "saved")

    def __init__(self, out: Any, **saved: Any):
        self.out = out
        self.saved = saved


class Trace:
    """One differentiation: the nodes created while its function runs belong to it."""

    __slots__ = ("id",)
    _ids = itertools.count(1)

    def __init__(self) -> None:
        self.id = next(Trace._ids)


class Node:
    """One recorded primitive application (or a leaf: an argument being differentiated)."""

    __slots__ = ("primitive", "parents", "args", "kwargs", "ans", "saved", "out_meta", "trace", "released")

    def __init__(self, primitive: Primitive | None, parents: tuple, args: tuple, kwargs: dict, ans: Any,
                 saved: dict, out_meta: tuple[Meta | None, ...], trace: Trace):
        self.primitive = primitive
        self.parents = parents  # ((argument position, parent node, parent output index), ...)
        self.args, self.kwargs, self.ans, self.saved = args, kwargs, ans, saved
        self.out_meta = out_meta
        self.trace = trace
        self.released = False

    @property
    def name(self) -> str:
        return self.primitive.name if self.primitive is not None else "argument"

    def release(self) -> None:
        self.args = self.kwargs = self.ans = self.saved = None
        self.released = True


def leaf(value: Any, trace: Trace) -> Traced:
    """A traced argument: the start of the graph."""
    return Traced(value, Node(None, (), (), {}, None, {}, (Meta(value),), trace), 0)


_BINARY = {"add": "add", "subtract": "sub", "multiply": "mul", "true_divide": "truediv",
           "divide": "truediv", "matmul": "matmul", "power": "pow"}
_COMPARE = {"less", "less_equal", "greater", "greater_equal"}


def _ops_hint(name: str) -> str:
    known = name in _PRIMITIVE_NAMES  # arrayrnn.ops names its primitives after the NumPy functions
    return f"use arrayrnn.ops.{name}" if known else "use the arrayrnn.ops functions"


def _cut_message(what: str, becomes: str) -> str:
    return (f"{what} of a traced value inside a differentiated function would make it {becomes} and "
            "silently cut the gradient; use arrayrnn.ops (ar.ops.exp, ar.ops.tanh, ...) on traced values, "
            "or x.value for a constant copy")


class Traced:
    """A value recorded on a tape. Supports ``+ - * / @ **``, unary ``-``, indexing, ``.T``, ``.shape``.

    ``.value`` is the raw array. Converting a traced value to a NumPy array would silently cut the graph,
    so NumPy functions on it raise; use ``arrayrnn.ops`` instead.
    """

    __slots__ = ("value", "node", "index")

    def __init__(self, value: Any, node: Node, index: int):
        self.value, self.node, self.index = value, node, index

    shape = property(lambda self: self.value.shape)
    dtype = property(lambda self: self.value.dtype)
    ndim = property(lambda self: self.value.ndim)
    size = property(lambda self: self.value.size)

    def __len__(self) -> int:
        return len(self.value)

    def __float__(self) -> float:
        raise TypeError(_cut_message("float()", "a Python number"))

    def __int__(self) -> int:
        raise TypeError(_cut_message("int()", "a Python number"))

    def __complex__(self) -> complex:
        raise TypeError(_cut_message("complex()", "a Python number"))

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        """Operators with a NumPy array on the left come back to ours; other NumPy ufuncs would cut the
        graph (``np.tanh(traced)``), so they raise, naming the ``arrayrnn.ops`` function to use."""
        name = ufunc.__name__
        if method == "__call__" and not kwargs and len(inputs) == 2 and name in _BINARY:
            a, b = inputs
            dunder = _BINARY[name]
            if isinstance(a, Traced):
                return getattr(a, f"__{dunder}__")(b)
            return getattr(b, f"__r{dunder}__")(a)
        if method == "__call__" and not kwargs and name in _COMPARE:
            return ufunc(*(i.value if isinstance(i, Traced) else i for i in inputs))
        if method == "__call__" and len(inputs) == 1 and name == "negative":
            return -inputs[0]
        raise TypeError(_cut_message(f"np.{name}", f"a constant ({_ops_hint(name)})"))

    def __bool__(self) -> bool:
        return bool(self.value)

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a traced value cannot become a NumPy array inside a differentiated function (that "
                        "would cut the gradient); use arrayrnn.ops functions, or x.value for a constant copy")

    def __repr__(self) -> str:
        return f"Traced({self.value!r}, op={self.node.name})"

    __hash__ = object.__hash__  # operators below are installed by arrayrnn.autodiff.ops


def is_traced(x: Any) -> bool:
    return isinstance(x, Traced)


def value_of(x: Any) -> Any:
    """The raw array of a traced value; anything else unchanged."""
    return x.value if isinstance(x, Traced) else x


def _raw_argument(a: Any) -> Any:
    """Unwrap NumPy scalars to Python scalars (no silent promotion of float32 arrays) and take foreign
    arrays (DLPack, __array_interface__) as NumPy/CuPy without copying."""
    if isinstance(a, np.generic):  # before the Python types: np.float64 is a float
        return a.item()
    if a is None or isinstance(a, (bool, int, float, np.ndarray, tuple, list, slice)):
        return a
    if any(hasattr(a, p) for p in ("__dlpack__", "__cuda_array_interface__", "__array_interface__")):
        return as_array(a)
    return a


_PRIMITIVE_NAMES: set[str] = set()  # every primitive made so far, for error hints


class Primitive:
    """A differentiable operation: a forward on raw arrays plus a VJP rule registered with ``defvjp``."""

    def __init__(self, forward: Callable, keep: Sequence[str] | None = None, name: str | None = None):
        self.forward = forward
        self.name = name or forward.__name__.lstrip("_")
        _PRIMITIVE_NAMES.add(self.name)
        self.rule: Callable | None = None
        self._rule_extras: tuple[str, ...] = ()
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        params = inspect.signature(forward).parameters.values()
        self._positional = tuple(p.name for p in params if p.kind in kinds)
        self._variadic = next((p.name for p in params if p.kind is inspect.Parameter.VAR_POSITIONAL), None)
        known = {*self._positional, self._variadic, "ans"}
        if keep is not None and not set(keep) <= known:
            raise ValueError(f"keep = {tuple(keep)} names {sorted(set(keep) - known)}, which are not "
                             f"positional "
                             f"parameters of {self.name}{inspect.signature(forward)} (or 'ans')")
        self._keep_all = keep is None
        self._keep = frozenset(keep or ())
        functools.update_wrapper(self, forward)

    def defvjp(self, rule: Callable) -> Callable:
        """Register ``rule(g, ans, *args, **kwargs)`` -> one gradient (or None) per positional argument."""
        params = inspect.signature(rule).parameters
        self._rule_extras = tuple(k for k in ("needs", "owns_g") if k in params)
        self.rule = rule
        return rule

    def _kept(self, position: int, value: Any) -> Any:
        name = self._positional[position] if position < len(self._positional) else self._variadic
        if self._keep_all or name in self._keep or value is None:
            return value
        return Meta(value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        trace, parents, raw = None, [], []
        for position, a in enumerate(args):
            if isinstance(a, Traced):
                if trace is None:
                    trace = a.node.trace
                elif a.node.trace is not trace:
                    raise TypeError(f"{self.name}: its arguments come from two different value_and_grad "
                                    f"calls; "
                                    "nested differentiation is not supported")
                parents.append((position, a.node, a.index))
                raw.append(a.value)
            else:
                raw.append(_raw_argument(a))
        for key, v in kwargs.items():
            if isinstance(v, Traced):
                raise TypeError(f"{self.name}: keyword argument {key!r} is a traced value; pass "
                                f"differentiable "
                                "arrays positionally")
        result = self.forward(*raw, **kwargs)
        out, saved = (result.out, result.saved) if isinstance(result, Residuals) else (result, {})
        if trace is None:
            return out
        if self.rule is None:
            raise NotImplementedError(f"{self.name} has no VJP rule; register one with {self.name}.defvjp")
        outs = out if isinstance(out, tuple) else (out,)
        ans = None if isinstance(result, Residuals) or not (self._keep_all or "ans" in self._keep) else out
        kept = tuple(self._kept(i, a) for i, a in enumerate(raw))
        node = Node(self, tuple(parents), kept, kwargs, ans, saved,
                    tuple(None if o is None else Meta(o) for o in outs), trace)
        traced = tuple(None if o is None else Traced(o, node, i) for i, o in enumerate(outs))
        return traced if isinstance(out, tuple) else traced[0]

    def __repr__(self) -> str:
        return f"<primitive {self.name}>"


def primitive(forward: Callable | None = None, *, keep: Sequence[str] | None = None,
              name: str | None = None) -> Any:
    """Decorator: make ``forward`` a :class:`Primitive`. ``keep`` names the positional parameters (and
    ``"ans"``, the output) the rule reads; the default keeps everything."""
    if forward is None:
        return lambda f: Primitive(f, keep=keep, name=name)
    return Primitive(forward, keep=keep, name=name)


def unbroadcast(g: Any, shape: tuple[int, ...]) -> Any:
    """Sum ``g`` down to ``shape``: the adjoint of NumPy broadcasting ``shape`` up to ``g.shape``."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    if lead:
        g = g.sum(axis=tuple(range(lead)))
    ones = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    if ones:
        g = g.sum(axis=ones, keepdims=True)
    return g.reshape(shape)


# -- the backward pass ----------------------------------------------------------------------------------

def _topological_order(root: Node) -> list[Node]:
    """Nodes reachable from ``root``, every node after all of its parents."""
    order, seen, stack = [], set(), [(root, False)]
    while stack:
        node, parents_done = stack.pop()
        if parents_done:
            order.append(node)
            continue
        if node in seen:
            continue
        seen.add(node)
        stack.append((node, True))
        stack.extend((parent, False) for _, parent, _ in node.parents if parent not in seen)
    return order


def _root_of(a: Any) -> Any:
    base = getattr(a, "base", None)
    return a if base is None else base


class _Cotangents:
    """The cotangent of every output of every node, and whether the tape owns each buffer."""

    def __init__(self) -> None:
        self.values: dict[Node, list] = {}
        self.owned: dict[Node, list] = {}

    def add(self, node: Node, index: int, g: Any, owned: bool) -> None:
        meta = node.out_meta[index]
        xp = get_xp(g)
        if not isinstance(g, xp.ndarray):
            g, owned = xp.asarray(g), True
        if g.dtype != meta.dtype:
            g, owned = g.astype(meta.dtype), True
        if g.shape != meta.shape:
            raise RuntimeError(f"internal error: the gradient for output {index} of {node.name} has shape "
                               f"{g.shape}; expected {meta.shape}")
        values = self.values.setdefault(node, [None] * len(node.out_meta))
        owns = self.owned.setdefault(node, [False] * len(node.out_meta))
        old = values[index]
        if old is None:
            values[index], owns[index] = g, owned
        elif owns[index]:
            old += g
        else:
            values[index], owns[index] = old + g, True

    def pop(self, node: Node) -> tuple[list, list] | None:
        if node not in self.values:
            return None
        return self.values.pop(node), self.owned.pop(node)


def _gradient_ownership(grads: tuple, incoming: list, incoming_owned: list, node: Node) -> list[bool]:
    """Which returned gradients are buffers nothing else refers to (so later rules may overwrite them)."""
    roots = [None if gr is None else _root_of(gr) for gr in grads]
    counts: dict[int, int] = {}
    for r in roots:
        if r is not None:
            counts[id(r)] = counts.get(id(r), 0) + 1
    incoming_status = {id(g): own for g, own in zip(incoming, incoming_owned, strict=True) if g is not None}
    kept = {id(a) for a in (*node.args, node.ans, *node.saved.values()) if a is not None}
    owned = []
    for gr, r in zip(grads, roots, strict=True):
        ok = (gr is not None and counts[id(r)] == 1 and id(r) not in kept
              and incoming_status.get(id(r), True) and bool(gr.flags.c_contiguous)
              and is_writeable(gr))
        owned.append(ok)
    return owned


def _run_rule(node: Node, gs: list, owned: list) -> tuple:
    prim = node.primitive
    if node.released:
        raise RuntimeError(f"backward through {node.name} a second time: its saved values were released "
                           "after the first backward; evaluate the function again (e.g. call vjp again)")
    extras = {}
    if "needs" in prim._rule_extras:
        needed = {position for position, _, _ in node.parents}
        extras["needs"] = tuple(i in needed for i in range(len(node.args)))
    if "owns_g" in prim._rule_extras:
        extras["owns_g"] = owned[0] if len(gs) == 1 else tuple(owned)
    g = gs[0] if len(gs) == 1 else tuple(gs)
    grads = prim.rule(g, node.ans, *node.args, **node.kwargs, **node.saved, **extras)
    if not isinstance(grads, tuple) or len(grads) != len(node.args):
        raise RuntimeError(f"internal error: the VJP rule of {node.name} returned {type(grads).__name__} "
                           f"of length {len(grads) if isinstance(grads, tuple) else '-'}; expected a tuple "
                           f"with one entry per positional argument ({len(node.args)})")
    return grads


def backward(output: Traced, seed: Any) -> dict[Node, tuple[Any, bool]]:
    """Run every rule from ``output`` back to the leaves; returns ``{leaf: (cotangent, owned)}``."""
    cotangents = _Cotangents()
    cotangents.add(output.node, output.index, seed, owned=True)
    leaves: dict[Node, tuple[Any, bool]] = {}
    for node in reversed(_topological_order(output.node)):
        if node.trace is not output.node.trace:
            continue
        popped = cotangents.pop(node)
        if popped is None:
            continue
        gs, owned = popped
        if node.primitive is None:
            leaves[node] = (gs[0], owned[0])
            continue
        grads = _run_rule(node, gs, owned)
        ownership = _gradient_ownership(grads, gs, owned, node)
        node.release()
        del gs, popped
        for position, parent, index in node.parents:
            gr = grads[position]
            if gr is not None:
                cotangents.add(parent, index, gr, ownership[position])
    return leaves
