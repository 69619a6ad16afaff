"""Data-parallel training: 2 ranks on half batches equal 1 process on the whole batch (float64).

Multi-process jobs run tests/support/dist_workers/train.py in their own process group with a timeout; on
timeout the whole group is killed and the test fails.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.dist_jobs import ROOT, TIMEOUT, mpiexec, run_job

import arrayrnn as ar
from arrayrnn.distributed import abort_on_error, allreduce_mean, broadcast_from_root

WORKER = ROOT / "tests" / "support" / "dist_workers" / "train.py"

_spec = importlib.util.spec_from_file_location("dist_train_worker", WORKER)
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)


def _check_equal_to_single_process(out: Path, optimizer: str, steps: int) -> None:
    reference = worker.train(optimizer, steps)
    half_batch = worker.train(optimizer, steps, rank=0, size=2)
    assert np.abs(half_batch - reference).max() > 1e-3      # the split alone would differ
    for rank in (0, 1):
        got = np.load(out / f"rank{rank}.npy")
        np.testing.assert_allclose(got, reference, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_mpi_two_ranks_equal_one_process(tmp_path, optimizer):
    res = run_job([mpiexec(), "-n", "2", sys.executable, str(WORKER), "mpi", "--optimizer", optimizer,
                   "--steps", "3", "--out", str(tmp_path)])
    assert res.returncode == 0, res.stderr
    _check_equal_to_single_process(tmp_path, optimizer, 3)


def test_mpi_failing_rank_ends_the_job(tmp_path):
    res = run_job([mpiexec(), "-n", "2", sys.executable, str(WORKER), "mpi", "--out", str(tmp_path),
                   "--fail-rank", "1"])
    assert res.returncode != 0
    assert "rank 1 fails on purpose" in res.stderr
    assert not (tmp_path / "rank0.npy").exists()


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_torch_gloo_two_processes_equal_one_process(tmp_path, optimizer):
    pytest.importorskip("torch.distributed")
    res = run_job([sys.executable, str(WORKER), "torch", "--optimizer", optimizer, "--steps", "3",
                   "--out", str(tmp_path)])
    assert res.returncode == 0, res.stderr
    _check_equal_to_single_process(tmp_path, optimizer, 3)


def test_torch_failing_rank_ends_the_job(tmp_path):
    pytest.importorskip("torch.distributed")
    res = run_job([sys.executable, str(WORKER), "torch", "--out", str(tmp_path), "--fail-rank", "1"])
    assert res.returncode != 0                  # spawn reports whichever rank it saw fail first
    # the failing rank's own error, or the other rank's: gloo words a lost peer as "closed" or "reset"
    reasons = ("fails on purpose", "closed by peer", "reset by peer")
    assert any(reason in res.stderr for reason in reasons), res.stderr[-2000:]


@pytest.mark.parametrize("bad", [None, 3, "world", object()])
def test_bad_comm_is_a_type_error(bad):
    with pytest.raises(TypeError, match="mpi4py.MPI.Comm"):
        allreduce_mean(np.zeros(3), bad)
    with pytest.raises(TypeError, match="mpi4py.MPI.Comm"):
        broadcast_from_root(np.zeros(3), bad)
    with pytest.raises(TypeError, match="mpi4py.MPI.Comm"):
        with abort_on_error(bad):
            pass


def test_library_imports_without_mpi4py_torch_cupy():
    code = ("import sys; import arrayrnn; "
            "assert not {'mpi4py', 'torch', 'cupy'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=TIMEOUT)


@pytest.mark.gpu
def test_nccl_single_rank_mean_and_broadcast():
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
    if cupy.cuda.runtime.getDeviceCount() < 1:
        pytest.skip("no CUDA device")
    from cupy.cuda import nccl

    comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
    params = ar.PackedParams.init(ar.RNNSpec("lstm", 3, 4), xp=cupy)
    expected = params.data.copy()
    allreduce_mean(params, comm)             # one rank: the mean is the buffer itself
    broadcast_from_root([params], comm)
    cupy.cuda.get_current_stream().synchronize()
    cupy.testing.assert_array_equal(params.data, expected)
    with pytest.raises(TypeError, match="CuPy buffers"):
        allreduce_mean(np.zeros(3), comm)


def test_demo_distributed_runs_and_only_rank0_prints():
    res = run_job([mpiexec(), "-n", "2", sys.executable, "-m", "arrayrnn.demo", "--distributed", "--steps",
                   "2", "--hidden", "8", "--engine", "reference"])
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("validation bits/char after 2 steps") == 1


# -- arguments refused on one rank, before any collective (MPI.COMM_SELF, in this process) ---------------
def _comm_self():
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (pip install 'arrayrnn[mpi]')")
    from mpi4py import MPI
    return MPI.COMM_SELF


@pytest.mark.parametrize(("grads", "error", "message"), [
    (np.float64(1.0), TypeError, r"grads is a NumPy scalar \(float64\), which cannot be updated in place"),
    ([np.ones(2), np.float32(1.0)], TypeError, r"grads\[1\] is a NumPy scalar \(float32\)"),
    (np.ones(3, ">f8"), TypeError, r"grads has dtype >f8 \(non-native byte order\); expected a native-order "
                                   r"dtype \(convert with .astype\('<f8'\)\)"),
    (np.ones(3, np.int64), TypeError, r"grads has dtype int64; expected a floating dtype"),
    (np.ones((3, 4))[:, ::2], ValueError, r"grads with shape \(3, 2\) is not C-contiguous"),
    ({"w": np.ones(3)}, TypeError, r"grads is a dict; expected an array, a PackedParams, or a list/tuple of "
                                   r"them \(pass list\(grads.values\(\)\)\)"),
])
def test_allreduce_mean_refuses_bad_buffers(grads, error, message):
    with pytest.raises(error, match=message):
        allreduce_mean(grads, _comm_self())


def test_broadcast_names_a_single_tree_and_checks_root():
    comm = _comm_self()
    with pytest.raises(TypeError, match=r"^tree is a NumPy scalar"):
        broadcast_from_root(np.int64(3), comm)
    for root in (-1, 1, 0.0, True, "0"):
        with pytest.raises(ValueError, match=rf"root = {root!r}; expected a rank in 0..0"):
            broadcast_from_root(np.ones(3), comm, root=root)
    buf = np.arange(3.0)
    broadcast_from_root(buf, comm, root=np.int64(0))
    np.testing.assert_array_equal(buf, np.arange(3.0))


@pytest.mark.parametrize("errorcode", ["1", 0, 256, -1, True, 1.0])
def test_abort_on_error_refuses_an_errorcode_mpiexec_cannot_report(errorcode):
    """A bad errorcode used to surface only inside the except clause, as a TypeError that skipped the
    abort (the other ranks then waited forever)."""
    with pytest.raises(ValueError, match=rf"errorcode = {errorcode!r}; expected an int in 1..255"):
        with abort_on_error(_comm_self(), errorcode=errorcode):
            pass


def test_backend_dtype_lists_name_what_each_communicator_reduces():
    from arrayrnn.training import distributed

    torch_row, nccl_row = distributed._BACKENDS[2], distributed._BACKENDS[1]
    with pytest.raises(TypeError, match=r"grads has dtype uint16; a torch.distributed communicator reduces "
                                        r"float16, float32, float64"):
        distributed._check_reducible("grads", np.ones(2, np.uint16), torch_row)
    assert "bool" not in nccl_row.dtypes and "int64" in nccl_row.dtypes


def test_nccl_row_accepts_cupy_buffers_whose_flags_have_no_writeable():
    """CuPy's ``flags`` has no ``writeable`` (a GPU run found the NCCL buffer check asking for it): the
    check runs on the CuPy stand-in, whose flags are CuPy's, and still refuses a host buffer."""
    from support import fake_cupy

    from arrayrnn.training import distributed

    nccl_row = distributed._BACKENDS[1]
    with fake_cupy.installed() as cp:
        buf = cp.zeros(4, dtype=np.float32)
        assert distributed._flat_buffers([buf], "grads", nccl_row) == [("grads[0]", buf)]
        with pytest.raises(TypeError, match=r"grads is a numpy.ndarray; a nccl communicator takes CuPy"):
            distributed._flat_buffers(np.zeros(4, np.float32), "grads", nccl_row)
