"""
Time-series forecasting with a GRU
==================================

Predict the next value of a noisy sine wave from the 24 values before it. A one-layer GRU reads each
window, a dense head maps its final state to the forecast, and ``ar.ops.mse`` is the loss. The figure
compares one-step-ahead forecasts on a stretch of the series the model never trained on with the truth.
"""

# %%
# The series and its windows
# --------------------------
# A sine of period 40 steps with a slower sine added and Gaussian noise; the first 80% trains, the rest
# is held out. Each sample is a window of ``WINDOW`` values (time-major, one feature) and the value after it.
import matplotlib.pyplot as plt
import numpy as np

import arrayrnn as ar
from arrayrnn import ops

WINDOW, HIDDEN = 24, 32
rng = np.random.default_rng(0)
t = np.arange(1200)
series = (np.sin(2 * np.pi * t / 40) + 0.5 * np.sin(2 * np.pi * t / 170)
          + 0.1 * rng.standard_normal(t.size)).astype(np.float32)
split = int(0.8 * series.size)


def windows(values, starts):
    x = np.stack([values[s:s + WINDOW] for s in starts], axis=1)[..., None]   # (WINDOW, B, 1)
    y = values[starts + WINDOW][:, None]                                       # (B, 1)
    return x, y


test_starts = np.arange(split, series.size - WINDOW)
x_test, y_test = windows(series, test_starts)

# %%
# The model
# ---------
gru = ar.nn.GRU(1, HIDDEN, seed=0)
head = ar.nn.Dense(HIDDEN, 1, seed=1)
params = [gru.params, head.params]


def forecast(params, x):
    gru_params, head_params = params
    _, h_n, _ = gru.apply(gru_params, x)                # c_n is None for a GRU
    return head.apply(head_params, h_n[-1])


def loss_fn(params, x, y):
    return ops.mse(forecast(params, x), y)


# %%
# Training
# --------
# 200 Adam steps on random batches of 32 windows from the training part.
opt = ar.optim.Adam(params, lr=1e-2)
loss_and_grads = ar.value_and_grad(loss_fn)
losses = []
print(f"{'step':>5} {'train mse':>10} {'test mse':>9}")
for step in range(1, 201):
    x, y = windows(series, rng.integers(0, split - WINDOW, size=32))
    loss, grads = loss_and_grads(params, x, y)
    opt.step(grads)
    losses.append(float(loss))
    if step % 40 == 0:
        test_mse = float(np.mean((np.asarray(forecast(params, x_test)) - y_test) ** 2))
        print(f"{step:5d} {np.mean(losses[-40:]):10.4f} {test_mse:9.4f}")

prediction = np.asarray(forecast(params, x_test))[:, 0]
naive = float(np.mean((x_test[-1, :, 0] - y_test[:, 0]) ** 2))   # "tomorrow equals today"
print(f"test mse {np.mean((prediction - y_test[:, 0]) ** 2):.4f} (repeating the last value: {naive:.4f}; "
      f"noise variance 0.0100)")
print(f"final loss {np.mean(losses[-10:]):.4f} (first {np.mean(losses[:10]):.4f})")

# %%
# Forecasts against the truth
# ---------------------------
fig, ax = plt.subplots(figsize=(7, 3.5))
shown = slice(0, 150)
ax.plot(test_starts[shown] + WINDOW, y_test[shown, 0], lw=1, label="truth (noisy)")
ax.plot(test_starts[shown] + WINDOW, prediction[shown], lw=1.5, label="GRU forecast")
ax.set_xlabel("time step")
ax.legend(loc="upper right")
fig.tight_layout()
plt.show()
