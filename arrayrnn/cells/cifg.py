"""CIFG-LSTM (coupled input and forget gates): an LSTM whose input gate is ``1 - f``.

Greff et al., "LSTM: A Search Space Odyssey" (2017), variant CIFG; three gate blocks ``f, g, o``::

    f, g, o = sigmoid(pre_f), tanh(pre_g), sigmoid(pre_o)
    c' = f * c + (1 - f) * g
    h' = o * tanh(c')

Registered as ``RNNSpec(mode="cifg")``: weights ``W_ih (3H, I)``, ``W_hh (3H, H)``, states ``h`` and ``c``.
"""

from .. import cellmath as cm
from ..core.cell_registry import Cell, register_cell


def forward(f, g, o, h, c):
    f, g, o = cm.sigmoid(f), cm.tanh(g), cm.sigmoid(o)
    c_new = g + f * (c - g)  # f*c + (1-f)*g, with no float literal (float32 stays float32 under numba)
    tanh_c = cm.tanh(c_new)
    return (o * tanh_c, c_new), (f, g, o, c, tanh_c)


def backward(res, d_new):
    f, g, o, c, tanh_c = res
    dh, dc = d_new
    dc = dc + dh * o * cm.dtanh(tanh_c)
    df = dc * (c - g) * cm.dsigmoid(f)
    dg = (dc - dc * f) * cm.dtanh(g)
    do = dh * tanh_c * cm.dsigmoid(o)
    return df, dg, do, 0.0, dc * f


CIFG = register_cell(Cell("cifg", gates=("f", "g", "o"), states=("h", "c"), forward=forward,
                          backward=backward))
