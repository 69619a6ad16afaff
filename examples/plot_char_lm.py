"""
A character language model
==========================

The demo (``python -m arrayrnn.demo``) at a small size: an ``Embedding -> LSTM -> Dense`` model of
CPython's own help text (``pydoc_data.topics``, shipped with every Python), trained with
``ar.value_and_grad`` and Adam on random windows of the text. The demo's ``run`` prints the text's unigram
entropy (what a model that knows only character frequencies scores), the validation bits per character
before and after training, and a generated sample; it returns the training loss of every step, plotted
below. The full-size demo (800 steps, 256 hidden units) reaches about 2.16 bits per character; this one
trains for a few seconds.
"""

# %%
# Train the demo's model, small
# -----------------------------
# ``Config`` holds the demo's command-line options. ``engine="reference"`` runs the array-generic NumPy
# engine from the first step, so the example never waits for numba's first compile (the demo's own
# ``"auto"`` waits for it, then trains faster).
import math

import matplotlib.pyplot as plt
import numpy as np

from arrayrnn import demo

cfg = demo.Config(steps=120, hidden=64, embed=16, batch=16, seq_len=32, lr=1e-2, engine="reference",
                  seed=0, eval_chars=4096, sample_chars=160)
result = demo.run(cfg, progress=False)

# %%
# The loss curve
# --------------
# The training loss of each step in bits per character, every 20 steps (averaged over those steps).
bits = np.array(result["losses"]) / math.log(2)
print(f"{'steps':>9} {'bits/char':>10}")
for start in range(0, len(bits), 20):
    print(f"{start + 1:4d}-{start + 20:<4d} {bits[start:start + 20].mean():10.3f}")
print(f"validation bits/char {result['bpc_after']:.3f} (before {result['bpc_before']:.3f}, unigram entropy "
      f"{result['unigram_entropy']:.3f})")
print(f"final loss {bits[-10:].mean():.4f} (first {bits[:10].mean():.4f})")

fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(np.arange(1, len(bits) + 1), bits, lw=1, label="training batch")
ax.axhline(result["unigram_entropy"], color="gray", ls="--", label="unigram entropy")
ax.set_xlabel("step")
ax.set_ylabel("bits per character")
ax.legend()
fig.tight_layout()
plt.show()
