"""
The same model on CuPy
======================

arrayrnn runs the same code on NumPy and CuPy arrays: the array module of the inputs decides where a
call runs (``ar.get_xp``), and ``engine="auto"`` picks a GPU engine for CuPy arrays (cuDNN where it
supports the call, else arrayrnn's own CuPy engine). Here the sequence classifier of
:ref:`sphx_glr_auto_examples_plot_sequence_classification.py` is trained on NumPy, and, where CuPy and a
CUDA GPU are usable, the same model from the same initial weights is trained on the GPU on the same batches
and the two are compared. Elsewhere the GPU half prints ``skipped:`` with the reason and the script ends
normally. GPU installs: ``pip install "arrayrnn[gpu]"``.
"""

# %%
# The model, for any array module
# -------------------------------
# ``xp`` is ``numpy`` or ``cupy``: the layers take it, and ``PackedParams.to`` moves a stack's one flat
# buffer to another device (one copy).
import numpy as np

import arrayrnn as ar
from arrayrnn import ops

T, FEATURES, HIDDEN, STEPS, BATCH = 16, 1, 24, 30, 64


def make_batches(n):
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(n):
        lengths = rng.integers(1, T + 1, size=BATCH)
        x = rng.standard_normal((T, BATCH, FEATURES)).astype(np.float32)
        valid = np.arange(T)[:, None] < lengths[None, :]
        labels = ((x[..., 0] * valid).sum(axis=0) > 0).astype(np.int64)
        batches.append((x, lengths, labels))
    return batches


def train(xp, batches, engine="auto"):
    """Train the classifier on the array module ``xp``; returns the losses, the final weights (canonical
    layout, on the host) and the engine that ran the LSTM."""
    lstm = ar.nn.LSTM(FEATURES, HIDDEN, seed=0, engine=engine)   # initialised on the host, then moved
    head = ar.nn.Dense(HIDDEN, 2, seed=1)
    lstm.params = lstm.params.to(xp)
    head.params = xp.asarray(head.params)
    if engine == "cudnn":
        lstm.to_format("cudnn")      # cuDNN's own weight layout: convert once, not on every call
    params = [lstm.params, head.params]
    opt = ar.optim.Adam(params, lr=2e-2)

    def loss_fn(params, x, lengths, labels):
        _, h_n, _ = lstm.apply(params[0], x, lengths)
        return ops.softmax_cross_entropy(head.apply(params[1], h_n[-1]), labels)

    loss_and_grads = ar.value_and_grad(loss_fn)
    losses = []
    for x, lengths, labels in batches:
        loss, grads = loss_and_grads(params, xp.asarray(x), xp.asarray(lengths), xp.asarray(labels))
        opt.step(grads)              # the gradients come back in the params' format
        losses.append(float(loss))
    ran = ar.rnn_forward(lstm.params, xp.asarray(batches[0][0]), xp.asarray(batches[0][1]),
                         engine=engine).engine
    canonical = lstm.params if lstm.params.format == "canonical" else lstm.params.to_format("canonical")
    to_host = getattr(xp, "asnumpy", np.asarray)
    return losses, [to_host(canonical.data), to_host(head.params)], ran


# %%
# On NumPy
# --------
batches = make_batches(STEPS)
cpu_losses, cpu_weights, cpu_engine = train(np, batches)
print(f"NumPy ({cpu_engine} engine): loss {cpu_losses[0]:.4f} -> {cpu_losses[-1]:.4f} in {STEPS} steps")
print(f"final loss {np.mean(cpu_losses[-5:]):.4f} (first {np.mean(cpu_losses[:5]):.4f})")


# %%
# On CuPy, where a GPU is usable
# ------------------------------
# ``engine="auto"`` on CuPy arrays takes cuDNN where it runs the call, else arrayrnn's CuPy engine; this
# example asks for cuDNN by name (and converts the weights to its layout once) and falls back to the CuPy
# engine where cuDNN is not usable (libcudnn not installed, for one).
def usable_cupy():
    """``(cupy, None)`` when CuPy imports and a CUDA GPU answers, else ``(None, reason)``."""
    try:
        import cupy
    except Exception as err:                     # ImportError, or a CUDA library CuPy cannot load
        return None, f"CuPy is not installed ({type(err).__name__}: {err})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
        if count < 1:
            return None, "no CUDA GPU is visible"
        float((cupy.arange(3, dtype=cupy.float32) + 1).sum())   # a kernel runs and its result comes back
    except Exception as err:                     # no driver, no device, a broken CUDA install
        return None, f"no usable CUDA GPU ({type(err).__name__}: {err})"
    return cupy, None


cupy, reason = usable_cupy()
if cupy is None:
    print(f"skipped: {reason}")
else:
    try:
        gpu_losses, gpu_weights, gpu_engine = train(cupy, batches, engine="cudnn")
    except RuntimeError as err:      # ar.EngineUnavailableError, or libcudnn missing (cudnn_bindings' errors)
        print(f"cuDNN is not usable here ({type(err).__name__}: {err}); the CuPy engine trains instead")
        gpu_losses, gpu_weights, gpu_engine = train(cupy, batches, engine="cupy")
    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    print(f"CuPy on {name} ({gpu_engine} engine): loss {gpu_losses[0]:.4f} -> {gpu_losses[-1]:.4f}")
    print(f"{'step':>5} {'NumPy loss':>11} {'CuPy loss':>10}")
    for step in range(0, STEPS, 5):
        print(f"{step + 1:5d} {cpu_losses[step]:11.6f} {gpu_losses[step]:10.6f}")
    loss_gap = max(abs(a - b) for a, b in zip(cpu_losses, gpu_losses, strict=True))
    weight_gap = max(float(np.abs(g - c).max()) for g, c in zip(gpu_weights, cpu_weights, strict=True))
    print(f"max |difference| NumPy vs CuPy: losses {loss_gap:.2e}, weights after {STEPS} steps "
          f"{weight_gap:.2e}")
