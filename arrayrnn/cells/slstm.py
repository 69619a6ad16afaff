"""sLSTM (scalar LSTM of xLSTM): exponential input gate, normaliser ``n`` and stabiliser ``m``.

Beck et al., "xLSTM: Extended Long Short-Term Memory" (NeurIPS 2024, arXiv:2405.04517), section 2.2,
eqs. (8)-(17), one head, with FlashRNN's defaults (its ``slstm`` function): gate blocks in the order
``i, f, z, o``, a sigmoid forget gate (``log f = logsigmoid(f~)``), all initial states zero::

    a    = logsigmoid(f~) + m                       log f_t + m_{t-1}
    m'   = max(a, i~)                               (15)
    i'   = exp(i~ - m'),  f' = exp(a - m')          (16), (17)
    c'   = f' c + i' tanh(z~)                       (8), (9)
    n'   = f' n + i'                                (10)
    h'   = sigmoid(o~) c' / n'                      (11), (14)

A zero ``n`` is an empty memory (the zero initial state), as in FlashRNN's kernels: there ``m' = i~`` and
``f' = 0``, so the first step writes ``c' = tanh(z~)``, ``n' = 1`` (the same ``h'`` as the equations, and
``n >= 1`` from then on, so no step divides by a vanishing ``n``; an ``exp`` of a large ``a - i~`` never
multiplies the zero state).

The backward is the exact VJP of these equations, ``m`` included (through the max, to ``i~`` on a tie). ``h``
does not depend on ``m`` (``c`` and ``n`` carry the same factor ``exp(-m)``), so ``m``'s cotangent after
``i'`` and ``f'`` is ``dm - dc c' - dn n'`` with the incoming cotangents: zero when only ``h`` is in the
loss, and then the gradient is the one of FlashRNN's kernels, which stop the gradient through ``m``.

Registered as ``RNNSpec(mode="slstm")``: ``W_ih (4H, I)``, ``W_hh (4H, H)``, states ``h, c, n, m`` (``c0``,
``c_n``: ``3H`` columns, ``c``, ``n``, ``m``).
"""

from .. import cellmath as cm
from ..core.cell_registry import Cell, register_cell


def forward(i, f, z, o, h, c, n, m):
    a = cm.logsigmoid(f) + m
    top = cm.maximum(a, i)
    empty = n == 0.0
    m_new = cm.where(empty, i, top)
    i_s = cm.exp(i - m_new)
    f_s = cm.where(empty, 0.0, cm.exp(a - top))
    z, o = cm.tanh(z), cm.sigmoid(o)
    c_new = f_s * c + i_s * z
    n_new = f_s * n + i_s
    return (o * c_new / n_new, c_new, n_new, m_new), (i_s, f_s, z, o, c, n, c_new, n_new, cm.sigmoid(f))


def backward(res, d_new):
    i_s, f_s, z, o, c, n, c_new, n_new, sig_f = res
    dh, dc, dn, dm = d_new
    dm = dm - dc * c_new - dn * n_new  # m' after i' and f' (h's own parts cancel: h is invariant to m)
    dh_n = dh * o / n_new
    dc = dc + dh_n
    dn = dn - dh_n * c_new / n_new
    to_i = cm.where(i_s >= f_s, dm, 0.0)  # the max chose i~ (i' = 1), or the memory was empty (f' = 0)
    di = i_s * (dc * z + dn) + to_i
    da = f_s * (dc * c + dn * n) + (dm - to_i)
    dz = dc * i_s * cm.dtanh(z)
    do = dh * (c_new / n_new) * cm.dsigmoid(o)
    return di, da - da * sig_f, dz, do, 0.0, dc * f_s, dn * f_s, da


SLSTM = register_cell(Cell("slstm", gates=("i", "f", "z", "o"), states=("h", "c", "n", "m"), forward=forward,
                           backward=backward))
