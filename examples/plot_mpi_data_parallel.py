"""
Data-parallel training with MPI
===============================

Each MPI rank computes the gradient of its own share of every batch; ``arrayrnn.distributed``'s
``allreduce_mean`` averages each flat gradient buffer across the ranks in place (one all-reduce per
buffer), so every rank takes the same optimizer step and the model stays identical on all of them.
Run it on one process (as the gallery does) or on several::

    mpiexec -n 2 python examples/plot_mpi_data_parallel.py

Because the shards are equal and the loss is a mean, the mean of the ranks' gradients is the gradient of
the whole batch: any number of ranks trains the same model (to float32 rounding). Rank 0 prints. Needs
the ``mpi`` extra (``pip install "arrayrnn[mpi]"``: mpi4py and MPICH, whose ``mpiexec`` lands in the
virtual environment's ``bin``).
"""

# %%
# The communicator and the model
# ------------------------------
# The model starts different on each rank (a seed per rank) on purpose: ``broadcast_from_root`` copies
# rank 0's parameters and optimizer state to every rank. ``abort_on_error`` ends the whole job if any
# rank raises (instead of leaving the others waiting), and ``join`` turns uneven numbers of collective
# calls into an error on every rank instead of a hang.
import matplotlib.pyplot as plt
import numpy as np

import arrayrnn as ar
from arrayrnn import ops
from arrayrnn.distributed import abort_on_error, allreduce_mean, broadcast_from_root, join

try:
    from mpi4py import MPI
except ImportError as err:            # the gallery page still builds without the mpi extra
    MPI = None
    print(f"skipped: mpi4py is not installed ({err}); pip install 'arrayrnn[mpi]'")

T, BATCH, FEATURES, HIDDEN, STEPS = 12, 24, 4, 32, 40


def train(comm):
    rank, size = comm.Get_rank(), comm.Get_size()
    if BATCH % size:
        raise ValueError(f"{size} ranks; the batch of {BATCH} rows must split into equal shards")
    lstm = ar.nn.LSTM(FEATURES, HIDDEN, seed=100 + rank)
    head = ar.nn.Dense(HIDDEN, 1, seed=200 + rank)
    params = [lstm.params, head.params]
    opt = ar.optim.Adam(params, lr=1e-2)

    def loss_fn(params, x, lengths, target):
        lstm_params, head_params = params
        _, h_n, _ = lstm.apply(lstm_params, x, lengths)
        return ops.mse(head.apply(head_params, h_n[-1]), target)

    # The training loop: every rank draws the same global batch (same seed) and keeps its slice of rows;
    # the target is the largest valid value of each row's first feature.
    rng = np.random.default_rng(0)
    mine = slice(rank * BATCH // size, (rank + 1) * BATCH // size)
    losses = []
    with abort_on_error(comm), join(comm):
        broadcast_from_root([params, opt], comm)
        for _ in range(STEPS):
            lengths = rng.integers(1, T + 1, size=BATCH)
            x = rng.standard_normal((T, BATCH, FEATURES)).astype(np.float32)
            valid = np.arange(T)[:, None] < lengths[None, :]
            x[~valid] = 0.0
            target = np.where(valid, x[..., 0], -np.inf).max(axis=0)[:, None]
            loss, grads = ar.value_and_grad(loss_fn)(params, x[:, mine], lengths[mine], target[mine])
            allreduce_mean(grads, comm)              # in place: the whole batch's gradient on every rank
            opt.step(grads)
            losses.append(comm.allreduce(float(loss)) / size)    # the whole batch's loss, for printing
    return losses, np.concatenate([lstm.params.data, head.params])


# %%
# Run it and compare the ranks
# ----------------------------
# At the end every rank sends its parameters (both flat buffers) to rank 0, which compares them.
if MPI is not None:
    comm = MPI.COMM_WORLD
    losses, flat = train(comm)
    every_rank = comm.gather(flat, root=0)
    if comm.Get_rank() == 0:
        print(f"{comm.Get_size()} rank(s), {BATCH // comm.Get_size()} rows of each batch per rank")
        print(f"{'step':>5} {'loss':>9}")
        for step in range(0, STEPS, 5):
            print(f"{step + 1:5d} {losses[step]:9.5f}")
        spread = max(float(np.abs(other - every_rank[0]).max()) for other in every_rank)
        print(f"{flat.size} parameters; max |difference| between ranks: {spread:.1e}")
        print(f"ranks agree: {spread == 0.0}")
        print(f"final loss {np.mean(losses[-5:]):.5f} (first {np.mean(losses[:5]):.5f})")
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(np.arange(1, STEPS + 1), losses, lw=1)
        ax.set_xlabel("step")
        ax.set_ylabel("mse of the whole batch")
        ax.set_title(f"data-parallel LSTM on {comm.Get_size()} rank(s)")
        fig.tight_layout()
        plt.show()
