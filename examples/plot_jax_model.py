"""
A JAX model with arrayrnn.jax.rnn
=================================

``arrayrnn.jax.rnn(spec, flat_params, x, lengths)`` is a ``jax.custom_vjp``: its forward and hand-written
backward run arrayrnn's engines on the CPU, and it composes with ``jax.jit`` and ``jax.grad`` like any
JAX function. Here a GRU and a linear readout, all parameters in a plain dict of ``jax.numpy`` arrays,
learn to output the mean of each sequence's valid values, trained by plain gradient descent written in
``jax.numpy`` (no optimizer library).
"""

# %%
# Parameters and data
# -------------------
# The GRU's weights are one flat buffer in arrayrnn's canonical layout (PyTorch's order), initialised by
# ``ar.PackedParams.init`` and handed to JAX as an array.
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import arrayrnn as ar
from arrayrnn.jax import rnn

T, B, FEATURES, HIDDEN = 15, 32, 2, 16
spec = ar.RNNSpec(mode="gru", input_size=FEATURES, hidden_size=HIDDEN)
params = {
    "gru": jnp.asarray(ar.PackedParams.init(spec, seed=0).data),
    "W": jnp.asarray(np.random.default_rng(1).uniform(-0.25, 0.25, (1, HIDDEN)), jnp.float32),
    "b": jnp.zeros((1,), jnp.float32),
}
print({name: value.shape for name, value in params.items()})


def make_batch(rng):
    lengths = rng.integers(1, T + 1, size=B)
    valid = np.arange(T)[:, None] < lengths[None, :]
    x = rng.standard_normal((T, B, FEATURES)).astype(np.float32) * valid[..., None]
    target = x.sum(axis=(0, 2)) / (FEATURES * lengths)
    return jnp.asarray(x), jnp.asarray(lengths), jnp.asarray(target, jnp.float32)


# %%
# The model and one jitted SGD step
# ---------------------------------
def predict(params, x, lengths):
    y, h_n, _ = rnn(spec, params["gru"], x, lengths)      # c_n is None for a GRU
    return (h_n[-1] @ params["W"].T + params["b"])[:, 0]


def loss_fn(params, x, lengths, target):
    return jnp.mean((predict(params, x, lengths) - target) ** 2)


@jax.jit
def sgd_step(params, x, lengths, target, lr):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, lengths, target)
    return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads), loss


# %%
# Training
# --------
rng = np.random.default_rng(2)
losses = []
print(f"{'step':>5} {'loss':>9}")
for step in range(1, 151):
    params, loss = sgd_step(params, *make_batch(rng), 0.5)
    losses.append(float(loss))
    if step % 25 == 0:
        print(f"{step:5d} {np.mean(losses[-25:]):9.5f}")
print(f"final loss {np.mean(losses[-10:]):.5f} (first {np.mean(losses[:10]):.5f})")

# %%
# The gradient against finite differences
# ---------------------------------------
# ``jax.grad`` of the GRU's weights goes through arrayrnn's hand-written backward. One directional
# derivative, compared with a central difference of the loss (float32, so they agree to a few digits).
x, lengths, target = make_batch(rng)
direction = jnp.asarray(np.random.default_rng(3).standard_normal(params["gru"].shape), jnp.float32)
grad = jax.grad(loss_fn)(params, x, lengths, target)["gru"]
eps = 1e-2


def shifted(sign):
    return loss_fn({**params, "gru": params["gru"] + sign * eps * direction}, x, lengths, target)


numeric = float(shifted(1) - shifted(-1)) / (2 * eps)
print(f"directional derivative: jax.grad {float(grad @ direction):.5f}, central difference {numeric:.5f}")

fig, ax = plt.subplots(figsize=(6, 3.5))
ax.semilogy(np.arange(1, len(losses) + 1), losses, lw=1)
ax.set_xlabel("step")
ax.set_ylabel("mse")
ax.set_title("GRU in JAX: mean of the valid values")
fig.tight_layout()
plt.show()
