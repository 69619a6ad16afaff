"""
Sequence classification with variable lengths
=============================================

Classify sequences of different lengths with an LSTM on NumPy arrays: the sign of the sum of each
sequence's values. The batch is padded to one length ``T`` and ``lengths`` says where each row ends, so
the LSTM's final state ``h_n`` is each row's *last valid* state (PyTorch's ``pack_padded_sequence``
semantics); a dense head turns it into two logits. The whole model is trained with
``ar.value_and_grad`` and ``ar.optim.Adam``.
"""

# %%
# The data
# --------
# Each row has between 1 and ``T`` valid steps of one feature; the padding past a row's end is filled
# with large values that would flip many labels if the LSTM read them. The label is 1 when the sum of the
# valid values is positive.
import matplotlib.pyplot as plt
import numpy as np

import arrayrnn as ar
from arrayrnn import ops

T, FEATURES, HIDDEN = 16, 1, 24
rng = np.random.default_rng(0)


def make_batch(batch, rng):
    lengths = rng.integers(1, T + 1, size=batch)
    x = rng.standard_normal((T, batch, FEATURES)).astype(np.float32)
    valid = np.arange(T)[:, None] < lengths[None, :]          # (T, B): True on each row's valid steps
    x[~valid] = 5.0                                            # padding the model must ignore
    labels = ((x[..., 0] * valid).sum(axis=0) > 0).astype(np.int64)
    return x, lengths, labels


x_test, len_test, y_test = make_batch(512, np.random.default_rng(1))
print(f"test set: {len(y_test)} rows, lengths {len_test.min()}..{len_test.max()}, "
      f"{y_test.mean():.0%} positive")

# %%
# The model
# ---------
# ``ar.nn.LSTM`` holds every weight of the stack in one flat buffer (``lstm.params``, a PackedParams);
# ``ar.nn.Dense`` holds ``W`` and ``b`` in another. ``apply`` is the pure function we differentiate.
lstm = ar.nn.LSTM(FEATURES, HIDDEN, seed=0)
head = ar.nn.Dense(HIDDEN, 2, seed=1)
params = [lstm.params, head.params]


def logits(params, x, lengths):
    lstm_params, head_params = params
    y, h_n, c_n = lstm.apply(lstm_params, x, lengths)   # h_n[-1]: the last layer at each row's last step
    return head.apply(head_params, h_n[-1])


def loss_fn(params, x, lengths, labels):
    return ops.softmax_cross_entropy(logits(params, x, lengths), labels)


def accuracy(params, x, lengths, labels):
    return float((np.asarray(logits(params, x, lengths)).argmax(axis=1) == labels).mean())


# %%
# Training
# --------
# One fresh batch of 64 rows per step; Adam updates each flat buffer in one vectorised pass.
opt = ar.optim.Adam(params, lr=2e-2)
loss_and_grads = ar.value_and_grad(loss_fn)
acc_before = accuracy(params, x_test, len_test, y_test)
losses = []
print(f"{'step':>5} {'loss':>8} {'test accuracy':>14}")
for step in range(1, 151):
    x, lengths, labels = make_batch(64, rng)
    loss, grads = loss_and_grads(params, x, lengths, labels)
    ar.optim.clip_grad_norm(grads, 1.0)
    opt.step(grads)
    losses.append(float(loss))
    if step % 25 == 0:
        print(f"{step:5d} {np.mean(losses[-25:]):8.4f} {accuracy(params, x_test, len_test, y_test):14.3f}")

acc_after = accuracy(params, x_test, len_test, y_test)
first, final = np.mean(losses[:10]), np.mean(losses[-10:])
print(f"test accuracy {acc_after:.3f} (before training {acc_before:.3f})")
print(f"final loss {final:.4f} (first {first:.4f})")

# %%
# The loss curve
# --------------
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(np.arange(1, len(losses) + 1), losses, lw=1)
ax.set_xlabel("step")
ax.set_ylabel("cross-entropy")
ax.set_title(f"sign of the sum, variable lengths: test accuracy {acc_after:.1%}")
fig.tight_layout()
plt.show()
