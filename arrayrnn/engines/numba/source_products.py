"""Both products of an inference step from the caller's weights as they lie, with the biases, in ONE
compiled call.

An inference step of a plain built-in cell over few rows (:meth:`.step.NumbaStep.steps_from_source`)
multiplies the caller's buffer itself. Done as NumPy calls (two products, the summed biases made and added,
the GRU's ``b_hn`` copied) that costs ~7 us of Python at ``H = 64``, several times the arithmetic;
:func:`source_products` does it in one call, roughly::

    xw[:] = x @ W_ih.T + (b_ih + b_hh)       # b_hh without its split part (the GRU's b_hn)
    product[:] (+)= h @ W_hh.T                # added into xw itself for the LSTM and the RNN
    b_hn[:] = b_hh[split_lo:split_hi]         # the split part stays inside the step

Each product is :mod:`.row_dot`'s (each weight row read once); the bias sums and their order are
:func:`~arrayrnn.engines.cells.split_biases`'s. Weights and biases come as addresses: one signature per
dtype, whether the buffer is writeable or not.
"""

from __future__ import annotations

from numba import carray, types
from numba.extending import intrinsic, register_jitable

from .row_dot import rows_times_at
from .simd_ir import simd_jit


@intrinsic
def _pointer(typingctx, address, like):
    """``address`` (an integer) as a pointer to ``like``'s type."""
    if not isinstance(like, types.Float):
        return None
    pointer = types.CPointer(like)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(pointer))
    return pointer(types.intp, like), codegen


@register_jitable(inline="always")
def _add(row, b, lo, hi):
    for j in range(lo, hi):
        row[j] += b[j]


@register_jitable(inline="always")
def _add_sum(row, b1, b2, lo, hi):
    for j in range(lo, hi):
        row[j] += b1[j] + b2[j]


@simd_jit(cache=True, nogil=True, error_model="numpy")
def source_products(x, h, weights, xw, product, product_adds, b_hn):
    """The module's step products: ``x (B, I)``, ``h (B, H)`` C-contiguous and writeable; ``weights``
    the addresses of ``W_ih (G, I)``, ``W_hh (G, H)`` (C-contiguous), ``b_ih``, ``b_hh`` (``(G,)``; 0 where
    absent), then ``split_lo, split_hi``: the ``b_hh`` columns kept apart, into ``b_hn`` (none: ``G, G``)."""
    w_ih, w_hh, ih, hh, split_lo, split_hi = weights
    G = xw.shape[1]
    like = x.dtype.type(0)
    b_ih = carray(_pointer(ih, like), (G if ih else 0,))
    b_hh = carray(_pointer(hh, like), (G if hh else 0,))
    rows_times_at(x, w_ih, xw, False)
    for i in range(xw.shape[0]):
        row = xw[i]
        if ih and hh:
            _add_sum(row, b_ih, b_hh, 0, split_lo)
            _add(row, b_ih, split_lo, split_hi)
            _add_sum(row, b_ih, b_hh, split_hi, G)
        elif ih:
            _add(row, b_ih, 0, G)
        elif hh:
            _add(row, b_hh, 0, split_lo)
            _add(row, b_hh, split_hi, G)
    rows_times_at(h, w_hh, product, product_adds)
    for j in range(b_hn.shape[0]):
        b_hn[j] = b_hh[split_lo + j] if hh else 0
