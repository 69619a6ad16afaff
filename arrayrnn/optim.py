"""Optimizers over flat buffers: ``SGD``, ``Adam``, ``AdamW``; ``clip_grad_norm``.

``params`` is a PackedParams, an array, or a list of them; each is updated in place, one vectorised pass
per array operation over its whole flat buffer (no loop over named weights). ``step(grads)`` takes
gradients mirroring ``params`` (what ``value_and_grad`` returns). The arithmetic is that of
``torch.optim`` (single-tensor implementation), so the same problem gives the same numbers.

Optimizer state saves and loads without pickle: ``state_dict()`` / ``load_state_dict()`` (plain arrays,
numbers and strings) and ``save(path)`` / ``load(path)`` (an ``.npz`` with a JSON header).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import zipfile
from typing import Any

import numpy as np

from .backend import get_xp, to_host
from .params import PackedParams

FORMAT = "arrayrnn-optimizer"
FORMAT_VERSION = 1


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


def _check_number(name: str, value: Any, lo: float = 0.0, hi: float = math.inf,
                  hi_open: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < lo or value > hi or (hi_open and value == hi):
        bound = f"[{lo}, {hi})" if hi_open else f"[{lo}, {hi}]"
        raise ValueError(f"{name} = {value!r}; expected a number in {bound}")
    return float(value)


class Optimizer:
    """Shared machinery: buffers, the step counter, gradient checks, state save and load."""

    state_names: tuple[str, ...] = ()

    def __init__(self, params: Any, lr: float):
        self.params = params
        self._single, self._params = _buffers(params, "params")
        self.lr = _check_number("lr", lr)
        self.step_count = 0
        self.state = [{name: get_xp(p).zeros_like(p) for name in self.state_names} for p in self._params]
        self._scratch: list[tuple[Any, Any] | None] = [None] * len(self._params)

    def _hyperparameters(self) -> dict[str, Any]:
        return {"lr": self.lr}

    def _scratch_for(self, i: int) -> tuple[Any, Any]:
        if self._scratch[i] is None:
            p = self._params[i]
            xp = get_xp(p)
            self._scratch[i] = (xp.empty_like(p), xp.empty_like(p))
        return self._scratch[i]

    def step(self, grads: Any) -> None:
        """Update every buffer in place from ``grads`` (mirroring ``params``)."""
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
        kind = state_dict.get("type")
        if kind != type(self).__name__:
            raise ValueError(f"state_dict is for optimizer {kind!r}; this one is {type(self).__name__!r}")
        states = state_dict.get("state")
        if not isinstance(states, list) or len(states) != len(self._params):
            raise ValueError(f"state_dict has state for {len(states) if isinstance(states, list) else 'no'} "
                             f"buffers; this optimizer has {len(self._params)}")
        step = state_dict.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"state_dict['step'] = {step!r}; expected an integer >= 0")
        fresh = type(self)(self.params, **state_dict["hyperparameters"])
        for i, (saved, mine) in enumerate(zip(states, fresh.state, strict=True)):
            if set(saved) != set(mine):
                raise ValueError(f"state_dict['state'][{i}] has entries {sorted(saved)}; "
                                 f"expected {sorted(mine)}")
            for name, a in saved.items():
                if tuple(np.shape(a)) != tuple(mine[name].shape) or str(a.dtype) != str(mine[name].dtype):
                    raise ValueError(f"state_dict['state'][{i}][{name!r}] has shape {tuple(np.shape(a))} "
                                     f"and dtype {a.dtype}; expected {tuple(mine[name].shape)} "
                                     f"{mine[name].dtype}")
                mine[name][...] = get_xp(mine[name]).asarray(a)
        fresh.step_count = step
        self.__dict__.update(fresh.__dict__)

    def save(self, path: str | os.PathLike) -> None:
        """Write the state to an ``.npz`` (a JSON header plus arrays; no pickle), atomically."""
        sd = self.state_dict()
        header = {"format": FORMAT, "version": FORMAT_VERSION, "type": sd["type"], "step": sd["step"],
                  "hyperparameters": sd["hyperparameters"], "names": [sorted(st) for st in sd["state"]]}
        arrays = {f"state/{i}/{name}": a for i, st in enumerate(sd["state"]) for name, a in st.items()}
        directory = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".npz.tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, header=np.array(json.dumps(header)), **arrays)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise

    def load(self, path: str | os.PathLike) -> None:
        """Restore the state written by :meth:`save` (a damaged or foreign file is a ``ValueError``)."""
        try:
            with np.load(path, allow_pickle=False) as f:
                header = json.loads(str(f["header"]))
                if header.get("format") != FORMAT or header.get("version") != FORMAT_VERSION:
                    raise ValueError(f"{path} is not an arrayrnn optimizer file of version {FORMAT_VERSION}")
                state = [{name: f[f"state/{i}/{name}"] for name in names}
                         for i, names in enumerate(header["names"])]
        except (OSError, KeyError, json.JSONDecodeError, EOFError, zipfile.BadZipFile) as e:
            raise ValueError(f"{path}: not a readable arrayrnn optimizer file ({type(e).__name__}: "
                             f"{e})") from None
        except ValueError as e:
            raise ValueError(f"{path}: not a readable arrayrnn optimizer file ({e})") from None
        self.load_state_dict({"type": header["type"], "hyperparameters": header["hyperparameters"],
                              "step": header["step"], "state": state})


class SGD(Optimizer):
    """``torch.optim.SGD``: ``momentum``, ``dampening``, ``weight_decay`` (L2 added to the gradient),
    ``nesterov``."""

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
    """``torch.optim.Adam`` (L2 ``weight_decay`` added to the gradient)."""

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
    """``torch.optim.AdamW``: decoupled weight decay (``p *= 1 - lr * weight_decay`` before the step)."""

    _decoupled = True

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2):
        super().__init__(params, lr, betas, eps, weight_decay)


def clip_grad_norm(grads: Any, max_norm: float, norm_type: float = 2.0) -> float:
    """Scale ``grads`` in place so their joint norm is at most ``max_norm``; returns the norm before.

    ``torch.nn.utils.clip_grad_norm_``: ``coef = min(1, max_norm / (norm + 1e-6))``. ``norm_type`` is a
    positive number or ``math.inf``.
    """
    _, gs = _buffers(grads, "grads")
    max_norm = _check_number("max_norm", max_norm)
    if not (norm_type == math.inf or (isinstance(norm_type, (int, float)) and norm_type > 0)):
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
