"""The sLSTM (``mode="slstm"``) as a PyTorch loop over time steps: plain tensor ops, autograd for the
gradients. Two users: the tests (a second float64 oracle, its autograd gradients against ``rnn_backward``)
and a benchmark of arrayrnn's sLSTM against a PyTorch loop of the same cell (:func:`slstm_loop`: any dtype
and device, one layer, one direction, full-length rows).

The equations (Beck et al. 2024, xLSTM, section 2.2, eqs. 8-17; gates ``i, f, z, o`` as FlashRNN's)::

    xw = x @ W_ih.T + b_ih                        (hoisted: one product for all steps)
    (i~, f~, z~, o~) = xw_t + h @ W_hh.T + b_hh
    a = logsigmoid(f~) + m;  m' = max(a, i~)  (i~ where n = 0, the empty initial memory)
    i' = exp(i~ - m');  f' = exp(a - m')  (0 where n = 0)
    c' = f' c + i' tanh(z~);  n' = f' n + i';  h' = sigmoid(o~) c' / n'

Autograd differentiates every path, the stabiliser ``m`` through ``max`` included.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

import arrayrnn as ar

State = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def slstm_step(pre: torch.Tensor, c: torch.Tensor, n: torch.Tensor, m: torch.Tensor) -> State:
    """One step on ``(B, 4H)`` pre-activations: the new ``h, c, n, m``."""
    i_raw, f_raw, z_raw, o_raw = pre.chunk(4, dim=-1)
    a = F.logsigmoid(f_raw) + m
    empty = n == 0
    m_new = torch.where(empty, i_raw, torch.maximum(a, i_raw))
    i_gate = torch.exp(i_raw - m_new)
    f_gate = torch.exp(torch.where(empty, -torch.inf, a - m_new))  # exp(-inf) = 0: no 0 * inf in autograd
    c_new = f_gate * c + i_gate * torch.tanh(z_raw)
    n_new = f_gate * n + i_gate
    return torch.sigmoid(o_raw) * c_new / n_new, c_new, n_new, m_new


def slstm_loop(x: torch.Tensor, W_ih: torch.Tensor, W_hh: torch.Tensor, b_ih: torch.Tensor | None = None,
               b_hh: torch.Tensor | None = None, state: State | None = None) -> tuple[torch.Tensor, State]:
    """``y (T, B, H)`` and the final ``(h, c, n, m)`` of one layer over ``x (T, B, I)``; ``state`` the
    initial ``(h, c, n, m)``, each ``(B, H)`` (zeros when None)."""
    T, B, _ = x.shape
    H = W_hh.shape[1]
    if state is None:
        state = tuple(x.new_zeros(B, H) for _ in range(4))
    xw = x @ W_ih.T
    if b_ih is not None:
        xw = xw + b_ih
    h, c, n, m = state
    ys = []
    for t in range(T):
        pre = xw[t] + h @ W_hh.T
        h, c, n, m = slstm_step(pre if b_hh is None else pre + b_hh, c, n, m)
        ys.append(h)
    return torch.stack(ys), (h, c, n, m)


def _leaf(a: np.ndarray) -> torch.Tensor:
    return torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=True)


def outputs_and_grads(params: ar.PackedParams, x: np.ndarray, h0: np.ndarray, c0: np.ndarray, dy: np.ndarray,
                      dh_n: np.ndarray, dc_n: np.ndarray) -> dict[str, np.ndarray]:
    """float64 ``y, h_n, c_n`` of a one-layer, one-direction ``params`` (arrayrnn's shapes: ``h0 (1, B, H)``,
    ``c0 (1, B, 3H)``), and the autograd gradients of ``<y, dy> + <h_n, dh_n> + <c_n, dc_n>``: ``dx``,
    ``dh0``, ``dc0`` and ``d<block>`` for ``W_ih, W_hh, b_ih, b_hh``."""
    names = ("W_ih", "W_hh", "b_ih", "b_hh")
    w = {name: _leaf(params.view(0, 0, name)) for name in names}
    leaves = {"x": _leaf(x), "h0": _leaf(h0), "c0": _leaf(c0)}
    state = (leaves["h0"][0], *leaves["c0"][0].chunk(3, dim=-1))
    y, (h, c, n, m) = slstm_loop(leaves["x"], *(w[name] for name in names), state=state)
    c_n = torch.cat([c, n, m], dim=-1)[None]
    loss = sum(torch.sum(out * torch.tensor(cot)) for out, cot in ((y, dy), (h[None], dh_n), (c_n, dc_n)))
    loss.backward()
    out = {"y": y, "h_n": h[None], "c_n": c_n}
    out.update({f"d{name}": leaf.grad for name, leaf in {**leaves, **w}.items()})
    return {name: value.detach().numpy() for name, value in out.items()}
