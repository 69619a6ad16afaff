"""DistributedDataParallel around an arrayrnn.torch.ArrayRNN (gloo, 2 processes); see test_distributed_ddp.py.

    python tests/support/dist_workers/ddp.py OUT_DIR     # writes OUT_DIR/rank{r}.npy; train() is the oracle
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from arrayrnn.torch import ArrayRNN  # noqa: E402

T, B, I, H, V, STEPS = 7, 6, 5, 8, 11, 3


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.rnn = ArrayRNN.from_torch(torch.nn.LSTM(I, H, 2, dtype=torch.float64))
        self.head = torch.nn.Linear(H, V, dtype=torch.float64)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


def train(rank: int = 0, size: int = 1, wrap=lambda m: m) -> np.ndarray:
    model = Model()
    net = wrap(model)
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(T, B, I, dtype=torch.float64, generator=g)
    y = torch.randint(0, V, (T, B), generator=g)
    rows = slice(rank * B // size, (rank + 1) * B // size)
    for _ in range(STEPS):
        opt.zero_grad()
        logits = net(x[:, rows])
        torch.nn.functional.cross_entropy(logits.reshape(-1, V), y[:, rows].reshape(-1)).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()


def _rank(rank: int, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{Path(out) / 'rendezvous'}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    try:
        final = train(rank, 2, lambda m: torch.nn.parallel.DistributedDataParallel(m))
        np.save(Path(out) / f"rank{rank}.npy", final)
        dist.barrier()  # neither rank tears gloo down while the other still uses it (SIGABRT, ~1 run in 6)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    torch.multiprocessing.spawn(_rank, args=(sys.argv[1],), nprocs=2, join=True)
