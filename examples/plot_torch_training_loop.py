"""
arrayrnn.torch inside a PyTorch training loop
=============================================

``arrayrnn.torch.LSTM`` is a drop-in ``torch.nn.LSTM``: a subclass with the same constructor, parameters,
``state_dict`` and return values, whose forward and backward run arrayrnn's fused engines. Here an
ordinary PyTorch program (a model class, ``torch.optim.Adam``, ``loss.backward()``) trains it, and the
same program with ``torch.nn.LSTM`` trains a twin from the same weights on the same batches; the two
stay equal to float32 rounding.
"""

# %%
# The model: change one import
# ----------------------------
import matplotlib.pyplot as plt
import numpy as np
import torch

import arrayrnn.torch as art

torch.manual_seed(0)


class Regressor(torch.nn.Module):
    """Predict the mean of each sequence's valid values from the LSTM's last state."""

    def __init__(self, lstm_class):
        super().__init__()
        self.lstm = lstm_class(3, 32, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(32, 1)

    def forward(self, x):
        y, (h_n, c_n) = self.lstm(x)
        return self.head(h_n[-1])[:, 0]


ours = Regressor(art.LSTM)                          # was: Regressor(torch.nn.LSTM)
theirs = Regressor(torch.nn.LSTM)
theirs.load_state_dict(ours.state_dict())           # the same weights, nn.LSTM's parameter names
print("isinstance(ours.lstm, torch.nn.LSTM):", isinstance(ours.lstm, torch.nn.LSTM))
print("parameters:", [name for name, _ in ours.lstm.named_parameters()][:4], "...")

# %%
# The training loop, twice
# ------------------------
generator = torch.Generator().manual_seed(1)
batches = [torch.randn(16, 12, 3, generator=generator) for _ in range(40)]
optimizers = {model: torch.optim.Adam(model.parameters(), lr=5e-3) for model in (ours, theirs)}
history = {model: [] for model in (ours, theirs)}
for x in batches:
    target = x.mean(dim=(1, 2))
    for model, opt in optimizers.items():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        history[model].append(loss.item())

print(f"{'step':>5} {'arrayrnn.torch':>15} {'torch.nn.LSTM':>14}")
for step in range(0, len(batches), 10):
    print(f"{step + 1:5d} {history[ours][step]:15.6f} {history[theirs][step]:14.6f}")
print(f"final loss {np.mean(history[ours][-10:]):.4f} (first {np.mean(history[ours][:10]):.4f})")

# %%
# The two models after training
# -----------------------------
# The largest difference of any weight, and of the outputs on new data.
weights = max((a - b).abs().max().item() for a, b in zip(ours.parameters(), theirs.parameters(), strict=True))
with torch.no_grad():
    x = torch.randn(8, 12, 3, generator=generator)
    outputs = (ours(x) - theirs(x)).abs().max().item()
    y_ours, _ = ours.lstm(x)
    y_theirs, _ = theirs.lstm(x)
    states = (y_ours - y_theirs).abs().max().item()
print(f"max |difference| of the weights after {len(batches)} steps: {weights:.2e}")
print(f"max |difference| of the LSTM outputs: {states:.2e}; of the predictions: {outputs:.2e}")
print(f"max |difference| against nn.LSTM: {max(weights, states, outputs):.2e}")

fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(history[theirs], lw=3, alpha=0.4, label="torch.nn.LSTM")
ax.plot(history[ours], lw=1, label="arrayrnn.torch.LSTM")
ax.set_xlabel("step")
ax.set_ylabel("mse")
ax.legend()
fig.tight_layout()
plt.show()
