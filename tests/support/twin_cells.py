"""The built-in cells written again through the public cell API (``arrayrnn.Cell``), registered as
``twin_lstm``, ``twin_gru`` (reset-after: its ``n`` gate split), ``twin_rnn_tanh`` and ``twin_rnn_relu``.

Each twin runs on the built-in's weights (same gate blocks, same order) and, engine by engine, must give the
built-in's bits: the API carries the real cells, not a toy. Written from the equations of
:mod:`arrayrnn.engines.cells` with :mod:`arrayrnn.cellmath` only (no float literal but ``0.0`` for a zero
cotangent, so float32 math stays float32 in the compiled engines).
"""

from __future__ import annotations

import numpy as np

import arrayrnn as ar
from arrayrnn import cellmath as cm


def lstm_forward(i, f, g, o, h, c):
    i, f, g, o = cm.sigmoid(i), cm.sigmoid(f), cm.tanh(g), cm.sigmoid(o)
    c_new = f * c + i * g
    tanh_c = cm.tanh(c_new)
    return (o * tanh_c, c_new), (i, f, g, o, c, tanh_c)


def lstm_backward(res, d_new):
    i, f, g, o, c, tanh_c = res
    dh, dc = d_new
    dc = dc + dh * o * cm.dtanh(tanh_c)
    return (dc * g * cm.dsigmoid(i), dc * c * cm.dsigmoid(f), dc * i * cm.dtanh(g),
            dh * tanh_c * cm.dsigmoid(o), 0.0, dc * f)


def gru_forward(r, z, n_x, n_h, h):
    r, z = cm.sigmoid(r), cm.sigmoid(z)
    n = cm.tanh(n_x + r * n_h)
    return (n + z * (h - n),), (r, z, n, n_h, h)


def gru_backward(res, d_new):
    r, z, n, n_h, h = res
    (dh,) = d_new
    dn = (dh - dh * z) * cm.dtanh(n)
    return dn * n_h * cm.dsigmoid(r), dh * (h - n) * cm.dsigmoid(z), dn, dn * r, dh * z


def rnn_tanh_forward(pre, h):
    y = cm.tanh(pre)
    return (y,), (y,)


def rnn_tanh_backward(res, d_new):
    return d_new[0] * cm.dtanh(res[0]), 0.0


def rnn_relu_forward(pre, h):
    y = cm.relu(pre)
    return (y,), (y,)


def rnn_relu_backward(res, d_new):
    return d_new[0] * cm.drelu(res[0]), 0.0


TWINS = {
    "lstm": ar.Cell("twin_lstm", gates=("i", "f", "g", "o"), states=("h", "c"), forward=lstm_forward,
                    backward=lstm_backward),
    "gru": ar.Cell("twin_gru", gates=("r", "z", "n"), split=("n",), forward=gru_forward,
                   backward=gru_backward),
    "rnn_tanh": ar.Cell("twin_rnn_tanh", gates=("h",), forward=rnn_tanh_forward, backward=rnn_tanh_backward),
    "rnn_relu": ar.Cell("twin_rnn_relu", gates=("h",), forward=rnn_relu_forward, backward=rnn_relu_backward),
}
"""Built-in mode -> its twin cell (registered on import)."""

for _cell in TWINS.values():
    ar.register_cell(_cell, replace=True)


def twin_params(params: ar.PackedParams) -> ar.PackedParams:
    """The twin of built-in ``params``: the same buffer (a copy) under the twin's mode."""
    spec = params.spec
    return ar.PackedParams(spec.replace(mode=TWINS[spec.mode].name), params.data.copy())


def outputs_and_grads(params: ar.PackedParams, x: np.ndarray, lengths: np.ndarray, training: bool,
                      engine: str, seed: int = 11, **options) -> tuple:
    """The forward's outputs and, in training, every gradient of random cotangents (those of ``h_all`` and
    ``c_all`` too, with ``return_all_states=True``): what the twin tests compare, a built-in against its
    twin or one engine against another."""
    r = ar.rnn_forward(params, x, lengths=lengths, training=training, seed=seed, engine=engine, **options)
    if not training:
        return r.y, r.h_n, r.c_n
    rng = np.random.default_rng(7)

    def like(a):
        return rng.standard_normal(a.shape).astype(r.y.dtype) if a is not None else None

    dy, dh_n, dc_n = like(r.y), like(r.h_n), like(r.c_n)
    extra = {name: like(a) for name, a in (("dh_all", r.h_all), ("dc_all", r.c_all)) if a is not None}
    g = ar.rnn_backward(r, dy=dy, dh_n=dh_n, dc_n=dc_n, **extra)
    return r.y, r.h_n, r.c_n, r.h_all, r.c_all, g.dx, g.dh0, g.dc0, g.dparams.data
