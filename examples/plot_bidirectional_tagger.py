"""
A bidirectional tagger with per-step states
===========================================

Tag every step of a sequence with a label that depends on both its past and its future: step ``t`` is
tagged 1 when the next value is larger than the previous one (``x[t+1] > x[t-1]``, with zeros outside the
row). A forward LSTM alone cannot know ``x[t+1]``; a bidirectional one reads it from its reverse direction.
The per-step output ``y`` of a bidirectional LSTM (both directions' states, concatenated) feeds a dense
head at every step; rows have different lengths and the padded steps are left out of the loss with
``ignore_index=-1``. At the end, ``ar.rnn_forward(..., return_all_states=True)`` shows every layer's
states at every step.
"""

# %%
# The data
# --------
import matplotlib.pyplot as plt
import numpy as np

import arrayrnn as ar
from arrayrnn import ops

T, HIDDEN = 20, 16
rng = np.random.default_rng(0)


def make_batch(batch, rng):
    lengths = rng.integers(2, T + 1, size=batch)
    valid = np.arange(T)[:, None] < lengths[None, :]                   # (T, B)
    x = rng.standard_normal((T, batch)).astype(np.float32) * valid     # zeros past each row's end
    padded = np.pad(x, ((1, 1), (0, 0)))                               # x[-1] = x[len] = 0
    tags = (padded[2:] > padded[:-2]).astype(np.int64)                 # x[t+1] > x[t-1]
    tags[~valid] = -1                                                  # ignored by the loss
    return x[..., None], lengths, tags


x_test, len_test, tags_test = make_batch(128, np.random.default_rng(1))

# %%
# The model: a 2-layer bidirectional LSTM and a per-step head
# -----------------------------------------------------------
lstm = ar.nn.LSTM(1, HIDDEN, num_layers=2, bidirectional=True, seed=0)
head = ar.nn.Dense(2 * HIDDEN, 2, seed=1)          # y has 2 * HIDDEN features: forward, then reverse
params = [lstm.params, head.params]


def tag_logits(params, x, lengths):
    lstm_params, head_params = params
    y, _, _ = lstm.apply(lstm_params, x, lengths)  # (T, B, 2 * HIDDEN), zeros past each row's end
    return head.apply(head_params, y)              # (T, B, 2): the head runs on every step


def loss_fn(params, x, lengths, tags):
    return ops.softmax_cross_entropy(tag_logits(params, x, lengths), tags, ignore_index=-1)


def accuracy(params, x, lengths, tags):
    predicted = np.asarray(tag_logits(params, x, lengths)).argmax(axis=-1)
    valid = tags >= 0
    return float((predicted[valid] == tags[valid]).mean())


# %%
# Training
# --------
opt = ar.optim.Adam(params, lr=1e-2)
loss_and_grads = ar.value_and_grad(loss_fn)
acc_before = accuracy(params, x_test, len_test, tags_test)
losses = []
print(f"{'step':>5} {'loss':>8} {'tag accuracy':>13}")
for step in range(1, 81):
    loss, grads = loss_and_grads(params, *make_batch(32, rng))
    ar.optim.clip_grad_norm(grads, 1.0)
    opt.step(grads)
    losses.append(float(loss))
    if step % 20 == 0:
        print(f"{step:5d} {np.mean(losses[-20:]):8.4f} {accuracy(params, x_test, len_test, tags_test):13.3f}")
acc_after = accuracy(params, x_test, len_test, tags_test)
print(f"tag accuracy {acc_after:.3f} (before training {acc_before:.3f})")
print(f"final loss {np.mean(losses[-10:]):.4f} (first {np.mean(losses[:10]):.4f})")

# %%
# One row, tagged
# ---------------
row = 0
n = int(len_test[row])
predicted = np.asarray(tag_logits(params, x_test, len_test)).argmax(axis=-1)[:n, row]
print(f"{'t':>3} {'x[t]':>7} {'tag':>4} {'predicted':>10}")
for step in range(n):
    print(f"{step:3d} {x_test[step, row, 0]:7.3f} {tags_test[step, row]:4d} {predicted[step]:10d}")

# %%
# Every layer's states at every step
# ----------------------------------
# ``return_all_states=True`` returns ``h_all`` (and, for an LSTM, ``c_all``) of shape
# ``(layers * directions, T, B, H)``: index ``layer * 2 + direction``. The last layer's two directions,
# concatenated, are exactly ``y``.
res = ar.rnn_forward(lstm.params, x_test, len_test, return_all_states=True)
print("y", res.y.shape, "h_all", res.h_all.shape, "c_all", res.c_all.shape)
last_layer = np.concatenate([res.h_all[2], res.h_all[3]], axis=-1)
print(f"max |y - concat(h_all[2], h_all[3])| = {np.abs(res.y - last_layer).max():.1e}")

fig, axes = plt.subplots(5, 1, figsize=(7, 7), sharex=True)
steps = np.arange(n)
axes[0].plot(steps, x_test[:n, row, 0], "k.-", lw=1, label="x[t]")
axes[0].scatter(steps, tags_test[:n, row] - 0.5, marker="s", s=60, label="tag - 0.5")
axes[0].scatter(steps, predicted - 0.5, marker="x", s=40, color="C3", label="predicted - 0.5")
low, high = axes[0].get_ylim()
axes[0].set_ylim(low, high + 0.6 * (high - low))     # room for the legend
axes[0].legend(loc="upper left", fontsize="small", ncol=3)
axes[0].set_title(f"row {row} ({n} steps): inputs and tags, then h_all of every layer and direction")
for k, ax in enumerate(axes[1:]):
    ax.imshow(res.h_all[k, :n, row].T, aspect="auto", cmap="RdBu", vmin=-1, vmax=1)
    ax.set_ylabel(f"layer {k // 2}\n{'fwd' if k % 2 == 0 else 'rev'}")
    ax.set_yticks([])
axes[-1].set_xlabel("step t")
fig.tight_layout()
plt.show()
