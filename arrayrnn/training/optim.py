"""Optimizers over flat buffers: ``SGD``, ``Adam``, ``AdamW``; ``clip_grad_norm``.

``params`` is a PackedParams, an array, or a list of them; each is updated in place, one vectorised pass
per array operation over its whole flat buffer (no loop over named weights). ``step(grads)`` takes
gradients mirroring ``params`` (what ``value_and_grad`` returns). The arithmetic is that of
``torch.optim`` (single-tensor implementation), so the same problem gives the same numbers.

Optimizer state saves and loads without pickle: ``state_dict()`` / ``load_state_dict()`` (plain arrays,
numbers and strings) and ``save(path)`` / ``load(path)`` (an ``.npz`` with a JSON header).
"""

from __future__ import annotations

import hashlib
import math
import numbers
import os
from typing import Any

import numpy as np

from ..core import npzfile
from ..core.backend import get_xp, is_writeable, to_host
from ..core.params import PackedParams
from ..core.spec import shown

KIND = "arrayrnn-optimizer"
"""The ``kind`` written in the header of an optimizer state file (``Optimizer.save``)."""
VERSIONS = range(1, 2)  # the file versions this code reads; it writes the last
"""The optimizer state file versions this code reads; it writes the last one."""


def _buffers(tree: Any, what: str) -> tuple[bool, list[Any]]:
    """``(single, flat buffers)`` of a PackedParams / array or a list/tuple of them."""
    single = not isinstance(tree, (list, tuple))
    items = [tree] if single else list(tree)
    if not items:
        raise ValueError(f"{what} is empty; expected a PackedParams, an array, or a non-empty list of them")
    out = []
    for i, item in enumerate(items):
        name = what if single else f"{what}[{i}]"
        buf = item.data if isinstance(item, PackedParams) else item
        if not hasattr(buf, "dtype") or not hasattr(buf, "shape"):
            raise TypeError(f"{name} has type {type(item).__name__}; expected a PackedParams or an array")
        if np.dtype(buf.dtype).kind != "f":
            raise TypeError(f"{name} has dtype {buf.dtype}; expected a floating array")
        out.append(buf)
    return single, out


def _check_updatable(single: bool, buffers: list[Any]) -> None:
    """Parameters are updated in place: no NumPy scalars (a copy would be updated), no buffer twice."""
    seen: dict[tuple[int, tuple[int, ...]], int] = {}
    for i, buf in enumerate(buffers):
        name = "params" if single else f"params[{i}]"
        if isinstance(buf, np.generic):
            raise TypeError(f"{name} is a NumPy scalar ({type(buf).__name__}), which cannot be updated in "
                            "place; expected an array")
        key = (_address(buf), tuple(buf.shape))
        if key in seen:
            raise ValueError(f"{name} is the same buffer as params[{seen[key]}]; expected each parameter "
                             "once (it would be updated twice per step; PyTorch warns that this will become "
                             "an error)")
        seen[key] = i


def _address(buf: Any) -> int:
    """The first byte of ``buf`` (NumPy or CuPy), or its id when it exposes no address."""
    interface = getattr(buf, "__array_interface__", None) or getattr(buf, "__cuda_array_interface__", None)
    return interface["data"][0] if interface else id(buf)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _check_number(name: str, value: Any, lo: float = 0.0, hi: float = math.inf,
                  hi_open: bool = False) -> float:
    number = _finite(value)
    if number is None or number < lo or number > hi or (hi_open and number == hi):
        bound = f"[{lo}, {hi})" if hi_open else f"[{lo}, {hi}]"
        raise ValueError(f"{name} = {shown(value)}; expected a number in {bound}")
    return number


def _finite(value: Any) -> float | None:
    """``value`` as a finite float, or None (not a real number, NaN, inf, an int past float's range)."""
    if not _is_real(value):
        return None
    try:
        number = float(value)
    except OverflowError:  # 10**400
        return None
    return number if math.isfinite(number) else None


class Optimizer:
    """The base of the optimizers: buffers, the step counter, gradient checks, state save and load.

    Every update is one vectorised pass per flat buffer, with the arithmetic of ``torch.optim``.

    Parameters
    ----------
    params : PackedParams, array, or list of them
        Updated in place by `step`; arrays must be writeable.
    lr : float
        The learning rate (the `lr` property; may change between steps).

    Raises
    ------
    TypeError
        ``params`` of another kind.
    ValueError
        A negative or non-finite hyperparameter.
    """

    state_names: tuple[str, ...] = ()

    def __init__(self, params: Any, lr: float):
        self.params = params
        self._single, self._params = _buffers(params, "params")
        _check_updatable(self._single, self._params)
        self.lr = lr
        self.step_count = 0
        self.state = [{name: get_xp(p).zeros_like(p) for name in self.state_names} for p in self._params]
        self._scratch: list[tuple[Any, Any] | None] = [None] * len(self._params)

    @property
    def lr(self) -> float:
        """The learning rate; may be changed between steps (a schedule), checked on assignment."""
        return self._lr

    @lr.setter
    def lr(self, value: float) -> None:
        self._lr = _check_number("lr", value)

    def _hyperparameters(self) -> dict[str, Any]:
        return {"lr": self.lr}

    def _scratch_for(self, i: int) -> tuple[Any, Any]:
        if self._scratch[i] is None:
            p = self._params[i]
            xp = get_xp(p)
            self._scratch[i] = (xp.empty_like(p), xp.empty_like(p))
        return self._scratch[i]

    def step(self, grads: Any) -> None:
        """Update every buffer in place from ``grads``.

        Parameters
        ----------
        grads : PackedParams, array, or list of them
            Mirrors ``params`` (what `arrayrnn.value_and_grad` returns for them): same structure, shapes,
            dtypes and devices.

        Raises
        ------
        ValueError
            A structure or shape other than ``params``'s.
        TypeError
            Another dtype or device than ``params``'s.
        """
        single, gs = _buffers(grads, "grads")
        if single != self._single or len(gs) != len(self._params):
            raise ValueError(f"grads has {len(gs)} entr{'y' if len(gs) == 1 else 'ies'}"
                             f"{' (not a list)' if single else ''}; expected the structure of params "
                             f"({len(self._params)} entr{'y' if len(self._params) == 1 else 'ies'})")
        for i, (p, g) in enumerate(zip(self._params, gs, strict=True)):
            label = "grads" if single else f"grads[{i}]"
            if tuple(g.shape) != tuple(p.shape):
                raise ValueError(f"{label} has shape {tuple(g.shape)}; expected the shape of its parameter "
                                 f"{tuple(p.shape)}")
            get_xp(p, g, names=("parameter", label))
            if np.dtype(g.dtype) != np.dtype(p.dtype):
                raise TypeError(f"{label} has dtype {g.dtype}; expected its parameter's dtype {p.dtype}")
            if not is_writeable(p):
                where = "params" if single else f"params[{i}]"
                raise ValueError(f"{where} is a read-only buffer; the optimizer updates it in place and "
                                 "needs a writeable one")
        self.step_count += 1
        for i, (p, g) in enumerate(zip(self._params, gs, strict=True)):
            self._update(i, p, g, self.state[i])

    def _update(self, i: int, p: Any, g: Any, state: dict[str, Any]) -> None:
        raise NotImplementedError

    # -- state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Host copies of the state plus the hyperparameters and step count (JSON-able but the arrays)."""
        return {
            "type": type(self).__name__,
            "hyperparameters": self._hyperparameters(),
            "step": self.step_count,
            "state": [{name: np.array(to_host(a)) for name, a in st.items()} for st in self.state],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (validated against this optimizer's buffers)."""
        if not isinstance(state_dict, dict):
            raise ValueError(f"state_dict is a {type(state_dict).__name__}; expected a dict")
        expected_keys = {"type", "hyperparameters", "step", "state"}
        if set(state_dict) != expected_keys:
            raise ValueError(f"state_dict has entries {sorted(map(str, state_dict))}; expected "
                             f"{sorted(expected_keys)}, as Optimizer.state_dict() returns")
        kind = state_dict.get("type")
        if kind != type(self).__name__:
            raise ValueError(f"state_dict is for optimizer {kind!r}; this one is {type(self).__name__!r}")
        states = state_dict.get("state")
        if not isinstance(states, list) or len(states) != len(self._params):
            raise ValueError(f"state_dict has state for {len(states) if isinstance(states, list) else 'no'} "
                             f"buffers; this optimizer has {len(self._params)}")
        step = state_dict.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2**63:
            raise ValueError(f"state_dict['step'] = {step!r}; expected an integer in [0, 2**63) (a file "
                             "stores it as int64)")
        fresh = self._fresh_from(state_dict.get("hyperparameters"))
        for i, (saved, mine) in enumerate(zip(states, fresh.state, strict=True)):
            if not isinstance(saved, dict) or set(saved) != set(mine):
                raise ValueError(f"state_dict['state'][{i}] has entries {sorted(saved)}; "
                                 f"expected {sorted(mine)}")
            for name, a in saved.items():
                dtype = getattr(a, "dtype", None)
                if tuple(np.shape(a)) != tuple(mine[name].shape) or str(dtype) != str(mine[name].dtype):
                    raise ValueError(f"state_dict['state'][{i}][{name!r}] has shape {tuple(np.shape(a))} "
                                     f"and dtype {dtype}; expected {tuple(mine[name].shape)} "
                                     f"{mine[name].dtype}")
                mine[name][...] = get_xp(mine[name]).asarray(a)
        fresh.step_count = step
        self.__dict__.update(fresh.__dict__)

    def _hyperparameter_vector(self) -> np.ndarray:
        """The type and the hyperparameters as float64 (a 52-bit code of the type, then every value in the
        order of their sorted names, pairs flattened): what ``broadcast_from_root`` sends."""
        values = [float(_type_code(type(self)))]
        for _, value in sorted(self._hyperparameters().items()):
            values += [float(v) for v in value] if isinstance(value, list) else [float(value)]
        return np.array(values, dtype=np.float64)

    def _load_hyperparameter_vector(self, vector: np.ndarray, source: str) -> None:
        """Take the hyperparameters of :meth:`_hyperparameter_vector` (from ``source``, for errors),
        checked as the constructor checks them."""
        values = [float(v) for v in vector]
        if values[0] != _type_code(type(self)):
            raise ValueError(f"{source} holds the hyperparameters of another optimizer type; this one is "
                             f"{type(self).__name__}: every rank must build the same optimizer")
        received, at = {}, 1
        for name, value in sorted(self._hyperparameters().items()):
            size = len(value) if isinstance(value, list) else 1
            got = values[at:at + size]
            received[name] = got if isinstance(value, list) else type(value)(got[0])
            at += size
        try:
            checked = type(self)(np.zeros(1), **received)   # the constructor's checks, on one element
        except (TypeError, ValueError) as e:
            raise ValueError(f"{source}: hyperparameters {received}: {e}") from None
        for name in received:
            setattr(self, name, getattr(checked, name))

    def _fresh_from(self, hyperparameters: Any) -> Optimizer:
        """A new optimizer of this type over the same params, or ``ValueError`` for unusable values."""
        if not isinstance(hyperparameters, dict):
            raise ValueError(f"state_dict['hyperparameters'] = {hyperparameters!r}; expected a dict like "
                             f"{self._hyperparameters()}")
        unknown = sorted(set(hyperparameters) - set(self._hyperparameters()))
        if unknown:
            raise ValueError(f"state_dict['hyperparameters'] has unknown entries {unknown}; "
                             f"{type(self).__name__} takes {sorted(self._hyperparameters())}")
        try:
            return type(self)(self.params, **hyperparameters)
        except TypeError as e:
            raise ValueError(f"state_dict['hyperparameters'] = {hyperparameters!r}: {e}") from None

    def save(self, path: str | os.PathLike) -> None:
        """Write the state to an ``.npz`` (a JSON header plus arrays; no pickle), atomically."""
        sd = self.state_dict()
        header = {"type": sd["type"], "step": sd["step"],
                  "hyperparameters": sd["hyperparameters"], "names": [sorted(st) for st in sd["state"]]}
        arrays = {f"state/{i}/{name}": a for i, st in enumerate(sd["state"]) for name, a in st.items()}
        npzfile.write(path, KIND, VERSIONS[-1], header, arrays)

    def load(self, path: str | os.PathLike) -> None:
        """Restore the state written by :meth:`save` (a damaged or foreign file, or one saved for other
        buffers, is a ``ValueError`` naming the file; the optimizer is unchanged then). Each state array's
        declared shape and dtype are checked against its parameter before the array is read."""
        header, arrays = npzfile.read(path, KIND, VERSIONS, expect=lambda h: self._expected_arrays(path, h))
        names = header["names"]
        state = [{k: arrays[f"state/{i}/{k}"] for k in n} for i, n in enumerate(names)]
        try:
            self.load_state_dict({"type": header.get("type"), "step": header.get("step"), "state": state,
                                  "hyperparameters": header.get("hyperparameters")})
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None

    def _expected_arrays(self, path: Any, header: dict[str, Any]) -> dict[str, tuple[Any, tuple[int, ...]]]:
        """``{member: (dtype, shape)}`` a file's header announces, each state array like its parameter."""
        names = header.get("names")
        if not isinstance(names, list) or not all(
                isinstance(n, list) and all(isinstance(k, str) for k in n) for n in names):
            raise ValueError(f"{path}: header 'names' = {names!r}; expected a list of lists of state names")
        if len(names) != len(self._params):
            raise ValueError(f"{path}: holds state for {len(names)} buffers; this optimizer has "
                             f"{len(self._params)}")
        return {f"state/{i}/{k}": (np.dtype(p.dtype), tuple(p.shape))
                for i, (n, p) in enumerate(zip(names, self._params, strict=True)) for k in n}


def _type_code(cls: type) -> int:
    """A 52-bit code of an optimizer class (exact as a float64)."""
    return int.from_bytes(hashlib.blake2b(cls.__qualname__.encode(), digest_size=8).digest(), "little") >> 12


class SGD(Optimizer):
    """Stochastic gradient descent with ``torch.optim.SGD``'s arithmetic.

    Parameters
    ----------
    params : PackedParams, array, or list of them
        Updated in place by `Optimizer.step`.
    lr : float, optional
        The learning rate.
    momentum : float, optional
        Momentum factor (0: none).
    dampening : float, optional
        Dampening of the momentum.
    weight_decay : float, optional
        L2 penalty added to the gradient.
    nesterov : bool, optional
        Nesterov momentum (needs ``momentum > 0`` and ``dampening = 0``).

    Raises
    ------
    ValueError
        A negative hyperparameter, or ``nesterov`` without momentum or with dampening.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayrnn as ar
    >>> w = np.ones(3)
    >>> opt = ar.optim.SGD(w, lr=0.1)
    >>> opt.step(np.full(3, 2.0))
    >>> w
    array([0.8, 0.8, 0.8])
    """

    state_names = ("momentum_buffer",)

    def __init__(self, params: Any, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False):
        self.momentum = _check_number("momentum", momentum)
        self.dampening = _check_number("dampening", dampening)
        self.weight_decay = _check_number("weight_decay", weight_decay)
        if nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ValueError(f"nesterov=True with momentum = {momentum}, dampening = {dampening}; Nesterov "
                             "momentum needs momentum > 0 and dampening = 0")
        self.nesterov = bool(nesterov)
        super().__init__(params, lr)
        if not self.momentum:
            self.state = [{} for _ in self._params]

    def _hyperparameters(self) -> dict[str, Any]:
        return {"lr": self.lr, "momentum": self.momentum, "dampening": self.dampening,
                "weight_decay": self.weight_decay, "nesterov": self.nesterov}

    def _update(self, i: int, p: Any, g: Any, state: dict[str, Any]) -> None:
        xp = get_xp(p)
        d, spare = self._scratch_for(i)
        if self.weight_decay:
            xp.multiply(p, self.weight_decay, out=d)
            d += g
        else:
            d[...] = g
        if self.momentum:
            buf = state["momentum_buffer"]
            if self.step_count == 1:
                buf[...] = d
            else:
                buf *= self.momentum
                xp.multiply(d, 1 - self.dampening, out=spare)
                buf += spare
            if self.nesterov:
                xp.multiply(buf, self.momentum, out=spare)
                d += spare
            else:
                d[...] = buf
        d *= -self.lr
        p += d


class Adam(Optimizer):
    """Adam with ``torch.optim.Adam``'s arithmetic (L2 ``weight_decay`` added to the gradient).

    Parameters
    ----------
    params : PackedParams, array, or list of them
        Updated in place by `Optimizer.step`.
    lr : float, optional
        The learning rate.
    betas : (float, float), optional
        Decay rates of the first and second moment estimates.
    eps : float, optional
        Added to the denominator.
    weight_decay : float, optional
        L2 penalty added to the gradient.

    Raises
    ------
    ValueError
        A hyperparameter out of range.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayrnn as ar
    >>> lstm = ar.nn.LSTM(3, 4)
    >>> opt = ar.optim.Adam(lstm.params, lr=1e-2)
    >>> def loss(params, x):
    ...     y, _, _ = lstm.apply(params, x)
    ...     return ar.ops.mean(y * y)
    >>> x = np.ones((5, 2, 3), dtype=np.float32)
    >>> value, grads = ar.value_and_grad(loss)(lstm.params, x)
    >>> opt.step(grads)
    >>> opt.step_count
    1
    """

    state_names = ("exp_avg", "exp_avg_sq")
    _decoupled = False

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0):
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"betas = {betas!r}; expected a pair (beta1, beta2)")
        self.betas = (_check_number("betas[0]", betas[0], 0.0, 1.0, hi_open=True),
                      _check_number("betas[1]", betas[1], 0.0, 1.0, hi_open=True))
        self.eps = _check_number("eps", eps)
        self.weight_decay = _check_number("weight_decay", weight_decay)
        super().__init__(params, lr)

    def _hyperparameters(self) -> dict[str, Any]:
        return {"lr": self.lr, "betas": list(self.betas), "eps": self.eps, "weight_decay": self.weight_decay}

    def _update(self, i: int, p: Any, g: Any, state: dict[str, Any]) -> None:
        xp = get_xp(p)
        beta1, beta2 = self.betas
        a, b = self._scratch_for(i)
        if self.weight_decay and self._decoupled:
            p *= 1 - self.lr * self.weight_decay
        elif self.weight_decay:
            xp.multiply(p, self.weight_decay, out=b)
            b += g
            g = b
        m, v = state["exp_avg"], state["exp_avg_sq"]
        xp.subtract(g, m, out=a)                 # m = lerp(m, g, 1 - beta1)
        a *= 1 - beta1
        m += a
        xp.multiply(g, g, out=a)                 # v = beta2 v + (1 - beta2) g^2
        a *= 1 - beta2
        v *= beta2
        v += a
        t = self.step_count
        step_size = self.lr / (1 - beta1 ** t)
        xp.sqrt(v, out=a)                        # denom = sqrt(v) / sqrt(1 - beta2^t) + eps
        a /= math.sqrt(1 - beta2 ** t)
        a += self.eps
        xp.divide(m, a, out=a)
        a *= -step_size
        p += a


class AdamW(Adam):
    """AdamW with ``torch.optim.AdamW``'s arithmetic: decoupled weight decay (``p *= 1 - lr * weight_decay``
    before the Adam step).

    Parameters
    ----------
    params : PackedParams, array, or list of them
        Updated in place by `Optimizer.step`.
    lr : float, optional
        The learning rate.
    betas : (float, float), optional
        Decay rates of the first and second moment estimates.
    eps : float, optional
        Added to the denominator.
    weight_decay : float, optional
        The decoupled decay rate.

    Raises
    ------
    ValueError
        A hyperparameter out of range.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayrnn as ar
    >>> w = np.ones(3)
    >>> ar.optim.AdamW(w, lr=0.1, weight_decay=0.5).step(np.zeros(3))
    >>> w
    array([0.95, 0.95, 0.95])
    """

    _decoupled = True

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2):
        super().__init__(params, lr, betas, eps, weight_decay)


def clip_grad_norm(grads: Any, max_norm: float, norm_type: float = 2.0) -> float:
    """Scale ``grads`` in place so their joint norm is at most ``max_norm`` (``clip_grad_norm_`` of torch).

    ``coef = min(1, max_norm / (norm + 1e-6))`` multiplies every buffer.

    Parameters
    ----------
    grads : PackedParams, array, or list of them
        The gradients (writeable).
    max_norm : float
        The largest joint norm kept.
    norm_type : float, optional
        A positive number or ``math.inf``.

    Returns
    -------
    float
        The joint norm before clipping.

    Raises
    ------
    ValueError
        ``max_norm`` or ``norm_type`` out of range.

    Examples
    --------
    >>> import numpy as np
    >>> import arrayrnn as ar
    >>> g = np.array([3.0, 4.0])
    >>> ar.optim.clip_grad_norm(g, max_norm=1.0)
    5.0
    >>> np.round(g, 4)
    array([0.6, 0.8])
    """
    _, gs = _buffers(grads, "grads")
    max_norm = _check_number("max_norm", max_norm)
    if not (norm_type == math.inf or (_is_real(norm_type) and norm_type > 0)):
        raise ValueError(f"norm_type = {norm_type!r}; expected a positive number or math.inf")
    if norm_type == math.inf:
        total = max(float(get_xp(g).abs(g).max()) if g.size else 0.0 for g in gs)
    elif norm_type == 2:
        total = math.sqrt(sum(float(get_xp(g).vdot(g.reshape(-1), g.reshape(-1))) for g in gs))
    else:
        per_buffer = [float((get_xp(g).abs(g) ** norm_type).sum()) ** (1.0 / norm_type) for g in gs]
        total = float(np.linalg.norm(np.asarray(per_buffer), ord=norm_type))
    coef = min(1.0, max_norm / (total + 1e-6))
    if coef < 1.0:
        for g in gs:
            g *= g.dtype.type(coef)
    return total
