"""DistributedDataParallel around arrayrnn.torch.ArrayRNN: 2 gloo processes on half batches equal one
process on the whole batch (float64, 3 SGD steps)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from support.dist_jobs import ROOT, run_job

pytest.importorskip("torch.distributed")
WORKER = ROOT / "tests" / "support" / "dist_workers" / "ddp.py"
_spec = importlib.util.spec_from_file_location("dist_ddp_worker", WORKER)
ddp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ddp)


def test_ddp_array_rnn_two_processes_equal_one_process(tmp_path: Path):
    res = run_job([sys.executable, str(WORKER), str(tmp_path)])
    assert res.returncode == 0, res.stderr[-3000:]
    reference = ddp.train()
    assert np.abs(ddp.train(0, 2) - reference).max() > 1e-3    # the split alone would differ
    for rank in (0, 1):
        np.testing.assert_allclose(np.load(tmp_path / f"rank{rank}.npy"), reference, rtol=1e-10, atol=1e-12)
