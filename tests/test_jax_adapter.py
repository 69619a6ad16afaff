"""arrayrnn.jax.rnn under jax.jit / jax.grad against a pure-JAX lax.scan LSTM and GRU (float64)."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import arrayrnn as ar  # noqa: E402
from arrayrnn.jax import rnn  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def x64():
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", previous)


def blocks(spec, flat):
    """{(layer, direction, name): jax view of the flat buffer}, by the canonical layout."""
    return {(b.layer, b.direction, b.name): flat[b.offset:b.stop].reshape(b.shape)
            for b in ar.layout_of(spec).blocks}


def lstm_cell(w, x, h, c):
    gates = x @ w["W_ih"].T + w["b_ih"] + h @ w["W_hh"].T + w["b_hh"]
    i, f, g, o = jnp.split(gates, 4, axis=-1)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    return jax.nn.sigmoid(o) * jnp.tanh(c), c


def gru_cell(w, x, h, c):
    gi, gh = x @ w["W_ih"].T + w["b_ih"], h @ w["W_hh"].T + w["b_hh"]
    (ri, zi, ni), (rh, zh, nh) = jnp.split(gi, 3, axis=-1), jnp.split(gh, 3, axis=-1)
    r, z = jax.nn.sigmoid(ri + rh), jax.nn.sigmoid(zi + zh)
    n = jnp.tanh(ni + r * nh)
    return (1 - z) * n + z * h, c


def reverse_within_lengths(a, lengths):
    """Row b's first lengths[b] steps reversed; padding left where it is."""
    t = jnp.arange(a.shape[0])[:, None]
    index = jnp.where(t < lengths[None, :], lengths[None, :] - 1 - t, t)
    return jnp.take_along_axis(a, index[:, :, None], axis=0)


def scan_direction(cell, w, x, lengths, h, c):
    active = jnp.arange(x.shape[0])[:, None, None] < lengths[None, :, None]

    def step(carry, inputs):
        (h, c), (x_t, m) = carry, inputs
        h_new, c_new = cell(w, x_t, h, c)
        return (jnp.where(m, h_new, h), jnp.where(m, c_new, c)), jnp.where(m, h_new, 0.0)

    (h, c), y = jax.lax.scan(step, (h, c), (x, active))
    return y, h, c


def scan_stack(spec, flat, x, lengths, h0, c0):
    """The oracle: every layer and direction as a lax.scan over the cell."""
    cell = lstm_cell if spec.mode == "lstm" else gru_cell
    views, D = blocks(spec, flat), spec.num_directions
    hs, cs = [], []
    for layer in range(spec.num_layers):
        outs = []
        for d in range(D):
            w = {name: views[(layer, d, name)] for name in ("W_ih", "W_hh", "b_ih", "b_hh")}
            k = layer * D + d
            inp = reverse_within_lengths(x, lengths) if d else x
            y, h, c = scan_direction(cell, w, inp, lengths, h0[k], c0[k] if c0 is not None else h0[k])
            outs.append(reverse_within_lengths(y, lengths) if d else y)
            hs.append(h)
            cs.append(c)
        x = jnp.concatenate(outs, axis=-1)
    return x, jnp.stack(hs), (jnp.stack(cs) if spec.mode == "lstm" else None)


def loss_of(fn, spec):
    def loss(flat, x, h0, c0, lengths):
        y, h_n, c_n = fn(spec, flat, x, lengths, h0, c0)
        weights = jnp.linspace(-1.0, 1.0, y.size).reshape(y.shape)
        total = jnp.sum(y * weights) + jnp.sum(h_n * h_n)
        return total + (jnp.sum(jnp.sin(c_n)) if c_n is not None else 0.0)
    return loss


@pytest.mark.parametrize("mode,layers", [("lstm", 2), ("gru", 1)])
def test_grad_under_jit_equals_lax_scan(mode, layers):
    spec = ar.RNNSpec(mode=mode, input_size=3, hidden_size=4, num_layers=layers, bidirectional=True,
                      dtype="float64")
    rng = np.random.default_rng(0)
    flat = jnp.asarray(ar.PackedParams.init(spec, seed=1).data)
    T, B, S = 6, 3, layers * 2
    x = jnp.asarray(rng.standard_normal((T, B, 3)))
    h0 = jnp.asarray(rng.standard_normal((S, B, 4)))
    c0 = jnp.asarray(rng.standard_normal((S, B, 4))) if mode == "lstm" else None
    lengths = jnp.asarray([6, 2, 4])
    ours = jax.jit(jax.value_and_grad(loss_of(rnn, spec), argnums=(0, 1, 2, 3)))
    oracle = jax.jit(jax.value_and_grad(loss_of(scan_stack, spec), argnums=(0, 1, 2, 3)))
    (value, grads), (value_ref, grads_ref) = ours(flat, x, h0, c0, lengths), oracle(flat, x, h0, c0, lengths)
    np.testing.assert_allclose(value, value_ref, rtol=1e-12)
    for g, g_ref in zip(grads, grads_ref, strict=True):
        if g_ref is None:
            assert g is None
            continue
        np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), rtol=1e-10, atol=1e-12)


def test_outputs_equal_rnn_forward_and_c_n_is_none_without_a_cell():
    spec = ar.RNNSpec(mode="rnn_tanh", input_size=2, hidden_size=3, dtype="float64")
    params = ar.PackedParams.init(spec, seed=0)
    x = np.random.default_rng(1).standard_normal((4, 2, 2))
    y, h_n, c_n = jax.jit(lambda p, x: rnn(spec, p, x, lengths=jnp.asarray([4, 0])))(params.data, x)
    res = ar.rnn_forward(params, x, np.array([4, 0]))
    assert c_n is None
    np.testing.assert_array_equal(np.asarray(y), res.y)
    np.testing.assert_array_equal(np.asarray(h_n), res.h_n)


def test_residuals_are_arrays():
    from arrayrnn.jax import _rnn_fwd

    spec = ar.RNNSpec(mode="gru", input_size=2, hidden_size=3, dtype="float64")
    args = (jnp.asarray(ar.PackedParams.init(spec).data), jnp.ones((3, 2, 2)), jnp.asarray([3, 1]),
            jnp.zeros((1, 2, 3)), None)
    _, residuals = _rnn_fwd(spec, *args)
    assert all(isinstance(leaf, jax.Array) for leaf in jax.tree_util.tree_leaves(residuals))


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(x=np.ones((4, 2))), ValueError, r"x has shape \(4, 2\)"),
    (dict(x=np.ones((4, 2, 3))), ValueError, "input_size = 2"),
    (dict(x=np.ones((4, 2, 2), np.float32)), TypeError, "x has dtype float32"),
    (dict(params=np.ones(5)), ValueError, r"params has shape \(5,\)"),
    (dict(h0=np.ones((2, 2, 3))), ValueError, r"h0 has shape \(2, 2, 3\)"),
    (dict(c0=np.ones((1, 2, 3))), ValueError, "has no cell state"),
    (dict(lengths=np.array([1.0, 2.0])), ValueError, "lengths"),
    (dict(spec="gru"), TypeError, "spec has type str"),
])
def test_bad_input_is_a_clear_error(kwargs, error, match):
    spec = ar.RNNSpec(mode="gru", input_size=2, hidden_size=3, dtype="float64")
    call = dict(spec=spec, params=ar.PackedParams.init(spec).data, x=np.ones((4, 2, 2)))
    call.update(kwargs)
    with pytest.raises(error, match=match):
        rnn(**call)


def test_vmap_is_a_loop_of_calls():
    spec = ar.RNNSpec(mode="lstm", input_size=2, hidden_size=3, dtype="float64")
    params = ar.PackedParams.init(spec, seed=0)
    xs = np.random.default_rng(2).standard_normal((2, 4, 1, 2))   # two independent (T, B, I) inputs
    ys = jax.jit(jax.vmap(lambda x: rnn(spec, params.data, x)[0]))(xs)
    for x, y in zip(xs, ys, strict=True):
        np.testing.assert_array_equal(np.asarray(y), ar.rnn_forward(params, x).y)


def test_length_out_of_range_surfaces_the_librarys_message():
    spec = ar.RNNSpec(mode="gru", input_size=2, hidden_size=3, dtype="float64")
    with pytest.raises(Exception, match=r"lengths\[1\] = 9"):
        jax.block_until_ready(rnn(spec, ar.PackedParams.init(spec).data, np.ones((4, 2, 2)),
                                  lengths=np.array([4, 9])))


# ---------------------------------------------------------------- errors known at trace time
GRU64 = ar.RNNSpec(mode="gru", input_size=2, hidden_size=3, dtype="float64")


@pytest.mark.parametrize("shape", [(0, 2, 2), (4, 0, 2)])
@pytest.mark.parametrize("jit", [False, True])
def test_empty_time_or_batch_is_a_value_error_at_trace_time(shape, jit):
    """T = 0 used to fail inside the callback, as a JaxRuntimeError wrapping the library's message."""
    params = jnp.asarray(ar.PackedParams.init(GRU64).data)
    call = (lambda x: rnn(GRU64, params, x)) if not jit else jax.jit(lambda x: rnn(GRU64, params, x))
    with pytest.raises(ValueError, match=rf"x has shape \({shape[0]}, {shape[1]}, 2\) with T = {shape[0]}, "
                                         rf"B = {shape[1]}; expected at least one step and one row"):
        call(np.ones(shape))


def test_packed_params_as_params_says_what_to_pass():
    """It gave "float() argument must be a string or a real number, not 'PackedParams'"."""
    with pytest.raises(TypeError, match=r"params is an arrayrnn\.PackedParams; pass its flat canonical "
                                        r"buffer, params\.to_format\('canonical'\)\.data"):
        rnn(GRU64, ar.PackedParams.init(GRU64), np.ones((4, 2, 2)))
    with pytest.raises(TypeError, match=r"x is an arrayrnn\.PackedParams; expected an array"):
        rnn(GRU64, ar.PackedParams.init(GRU64).data, ar.PackedParams.init(GRU64))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_is_a_type_error_saying_what_to_convert(dtype):
    params = jnp.asarray(ar.PackedParams.init(GRU64).data, dtype)
    with pytest.raises(TypeError, match=rf"params has dtype {dtype}; expected float32 or float64 .*"
                                        r"params\.astype\(jnp\.float32\)"):
        rnn(GRU64, params, jnp.ones((4, 2, 2), dtype))


def test_inputs_jax_cannot_take_are_type_errors_naming_the_argument():
    torch = pytest.importorskip("torch")
    params = ar.PackedParams.init(GRU64).data
    with pytest.raises(TypeError, match=r"x \(Tensor\) cannot become a JAX array: .*meta"):
        rnn(GRU64, params, torch.ones((4, 2, 2), dtype=torch.float64, device="meta"))
    with pytest.raises(TypeError, match=r"h0 \(Tensor\) cannot become a JAX array"):
        rnn(GRU64, params, np.ones((4, 2, 2)), h0=torch.zeros((1, 2, 3), dtype=torch.bfloat16))
    with pytest.raises(TypeError, match=r"x \(list\) cannot become a JAX array"):
        rnn(GRU64, params, [[[1.0, 2.0]], [[1.0]]])
    with pytest.raises(TypeError, match=r"x is None; expected an array"):
        rnn(GRU64, params, None)


def test_concrete_lengths_are_checked_before_the_callback():
    params = ar.PackedParams.init(GRU64).data
    with pytest.raises(ValueError, match=r"^lengths\[0\] = -1; every length must be in 0\.\.T = 4$"):
        rnn(GRU64, params, np.ones((4, 2, 2)), lengths=np.array([-1, 2]))


def test_traced_lengths_are_checked_in_the_callback():
    """Under jit the values are unknown at trace time: the library's message, wrapped by JAX's runtime."""
    params = jnp.asarray(ar.PackedParams.init(GRU64).data)
    call = jax.jit(lambda lengths: rnn(GRU64, params, jnp.ones((4, 2, 2)), lengths=lengths)[0])
    with pytest.raises(Exception, match=r"lengths\[1\] = 9; every length must be in 0\.\.T = 4"):
        jax.block_until_ready(call(jnp.asarray([4, 9])))


@pytest.mark.parametrize("fields", [dict(dropout=0.5, num_layers=2), dict(zoneout=0.3, zoneout_cell=0.2),
                                    dict(recurrent_dropout=0.5, weight_dropout=0.5, peepholes=True)],
                         ids=["dropout", "zoneout", "dropouts-peepholes"])
def test_gradient_is_that_of_the_inference_forward_with_dropout_and_cell_variants(fields):
    """The forward is the inference computation, so its gradient must be too: no dropout mask drawn in the
    backward, zoneout's expectation (before: the backward ran a training forward with fresh masks)."""
    spec = ar.RNNSpec("lstm", 3, 4, dtype="float64", **fields)
    params = ar.PackedParams.init(spec, seed=1)
    r = np.random.default_rng(0)
    x = r.standard_normal((5, 2, 3))

    def loss(p, x):
        y, h_n, c_n = rnn(spec, p, x)
        return jnp.sum(y) + jnp.sum(h_n) + jnp.sum(c_n)

    g_params, g_x = jax.grad(loss, argnums=(0, 1))(jnp.asarray(params.data), jnp.asarray(x))
    res = ar.rnn_forward(params, x)  # inference
    want = ar.rnn_backward(res, np.ones_like(res.y), np.ones_like(res.h_n), np.ones_like(res.c_n))
    np.testing.assert_allclose(np.asarray(g_params), want.dparams.data, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.asarray(g_x), want.dx, rtol=1e-10, atol=1e-12)
