"""A test cell that calls every function of :mod:`arrayrnn.cellmath` and has what the built-in cells lack:
three states (``h, c, m``), a split gate that is not the last one, a ``where`` / ``maximum`` with a float
literal (which must not widen float32 math on the GPU). Registered as ``"every_form"``::

    s, r, q, u, v = sigmoid(a), exp(logsigmoid(b_x)), sqrt(r), tanh(g), relu(b_h)
    c' = s*c + q*u + v*h + log(q);   m' = maximum(m, c');   h' = tanh(c') * minimum(r, s)

Its backward is checked against central differences by ``ar.check_cell`` in the tests that use it.
"""

from __future__ import annotations

import arrayrnn as ar
from arrayrnn import cellmath as cm


def forward(a, b_x, b_h, g, h, c, m):
    s = cm.sigmoid(a)
    r = cm.exp(cm.logsigmoid(b_x))
    q = cm.sqrt(r)
    u = cm.tanh(g)
    v = cm.relu(b_h)
    c_new = s * c + q * u + v * h + cm.log(q)
    th = cm.tanh(c_new)
    return (th * cm.minimum(r, s), c_new, cm.maximum(m, c_new)), (s, r, q, u, v, h, c, m, c_new, th)


def backward(res, d_new):
    s, r, q, u, v, h, c, m, c_new, th = res
    dh, dc, dm = d_new
    kept = cm.step(m - c_new)  # 1 where maximum kept m
    dc_new = dc + dh * cm.minimum(r, s) * cm.dtanh(th) + (dm - dm * kept)
    dw = dh * th
    dr_w = cm.where(r < s, dw, 0.0)
    dq = dc_new * u + dc_new / q
    dr = dq / (q + q) + dr_w
    ds = dc_new * c + (dw - dr_w)
    return (ds * cm.dsigmoid(s), dr * cm.dsigmoid(r), dc_new * h * cm.drelu(v), dc_new * q * cm.dtanh(u),
            dc_new * v, dc_new * s, cm.maximum(dm * kept, 0.0) + cm.minimum(dm * kept, 0.0))


CELL = ar.Cell("every_form", gates=("a", "b", "g"), split=("b",), states=("h", "c", "m"), forward=forward,
               backward=backward)
EVERY_FORM = ar.register_cell(CELL, replace=True)
