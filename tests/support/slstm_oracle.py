"""An independent float64 NumPy loop of the sLSTM (``mode="slstm"``), written from the paper, not from
``arrayrnn/cells/slstm.py``: Beck et al., "xLSTM: Extended Long Short-Term Memory" (NeurIPS 2024,
arXiv:2405.04517), section 2.2, with FlashRNN's choices (gates ``i, f, z, o``; sigmoid forget gate)::

    (i~, f~, z~, o~) = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh     four blocks of H rows
    log f_t = log sigmoid(f~) = -log(1 + exp(-f~))
    m_t  = max(log f_t + m_{t-1}, i~)                          (15)   (i~ alone when n_{t-1} = 0)
    i'_t = exp(i~ - m_t),  f'_t = exp(log f_t + m_{t-1} - m_t)  (16), (17)   (f'_t = 0 when n_{t-1} = 0)
    c_t  = f'_t c_{t-1} + i'_t tanh(z~)                         (8), (9)
    n_t  = f'_t n_{t-1} + i'_t                                  (10)
    h_t  = sigmoid(o~) c_t / n_t                                (11), (14)

over ``(T, B, I)`` inputs, one row and one step at a time, with arrayrnn's stack semantics: per-row lengths (a
row moves only while ``t < len_b``; the reverse direction starts at ``len_b - 1``; outputs past the end are
zero), both directions, layers fed the directions' outputs side by side, initial states ``h0 (L*D, B, H)`` and
``c0 (L*D, B, 3H)`` (columns ``c``, ``n``, ``m``), zeros when absent.
"""

from __future__ import annotations

import numpy as np

import arrayrnn as ar


def _sigmoid(v: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * v))


def _step(pre: np.ndarray, c: np.ndarray, n: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, ...]:
    """One step of one row: ``pre`` the 4H pre-activations; returns ``h, c, n, m``."""
    i_raw, f_raw, z_raw, o_raw = np.split(pre, 4)
    log_f = -np.logaddexp(0.0, -f_raw)
    empty = n == 0.0
    m_new = np.where(empty, i_raw, np.maximum(log_f + m, i_raw))
    i_gate = np.exp(i_raw - m_new)
    f_gate = np.exp(np.where(empty, -np.inf, log_f + m - m_new))
    c_new = f_gate * c + i_gate * np.tanh(z_raw)
    n_new = f_gate * n + i_gate
    return _sigmoid(o_raw) * c_new / n_new, c_new, n_new, m_new


def _direction(params: ar.PackedParams, layer: int, direction: int, xs: np.ndarray, lengths: np.ndarray,
               h0: np.ndarray, c0: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``y (T, B, H)``, ``h_n (B, H)``, ``c_n (B, 3H)`` of one layer-direction."""
    spec, H = params.spec, params.spec.hidden_size
    w = {name: np.asarray(params.view(layer, direction, name), dtype=np.float64)
         for name in ("W_ih", "W_hh", "b_ih", "b_hh") if _has(spec, name)}
    bias = w.get("b_ih", 0.0) + w.get("b_hh", 0.0)
    y = np.zeros((xs.shape[0], xs.shape[1], H))
    h_n, c_n = h0.copy(), c0.copy()
    for b in range(xs.shape[1]):
        h, c, n, m = h0[b], c0[b, :H], c0[b, H:2 * H], c0[b, 2 * H:]
        steps = range(lengths[b] - 1, -1, -1) if direction else range(lengths[b])
        for t in steps:
            h, c, n, m = _step(w["W_ih"] @ xs[t, b] + w["W_hh"] @ h + bias, c, n, m)
            y[t, b] = h
        h_n[b], c_n[b] = h, np.concatenate([c, n, m])
    return y, h_n, c_n


def _has(spec: ar.RNNSpec, name: str) -> bool:
    return {"b_ih": spec.has_b_ih, "b_hh": spec.has_b_hh}.get(name, True)


def run(params: ar.PackedParams, x: np.ndarray, lengths: np.ndarray | None = None,
        h0: np.ndarray | None = None, c0: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """``{"y": (T, B, D*H), "h_n": (L*D, B, H), "c_n": (L*D, B, 3H)}`` of the stack, in float64."""
    spec = params.spec
    T, B, _ = x.shape
    L, D, H = spec.num_layers, spec.num_directions, spec.hidden_size
    lengths = np.full(B, T) if lengths is None else np.asarray(lengths)
    h0 = np.zeros((L * D, B, H)) if h0 is None else np.asarray(h0, dtype=np.float64)
    c0 = np.zeros((L * D, B, 3 * H)) if c0 is None else np.asarray(c0, dtype=np.float64)
    xs, h_n, c_n = np.asarray(x, dtype=np.float64), np.zeros_like(h0), np.zeros_like(c0)
    for layer in range(L):
        outputs = []
        for d in range(D):
            k = layer * D + d
            y, h_n[k], c_n[k] = _direction(params, layer, d, xs, lengths, h0[k], c0[k])
            outputs.append(y)
        xs = np.concatenate(outputs, axis=-1)
    return {"y": xs, "h_n": h_n, "c_n": c_n}
