"""The packed GEMM's K blocking, per CPU: a documented default from the L1 size, a short measured tuning pass.

A gate-grouped product (:func:`.packed_gemm.gate_groups`: every gate of a few hidden units, the time loops'
recurrent product) streams a ``G``-vector block of the packed weights, ``K x G x W`` elements, over every
row tile of the batch. When that block outgrows L1 each row tile reads it from L2 again; cut into K blocks
that fit, it is read from L2 once and from L1 by the other tiles (bench/RESULTS.md, "Packed GEMM tuned per
CPU": one thread's share of S2's LSTM step 123-126 -> 137-138 GFLOP/s, of S1's 133-165 -> 148-167, in two
runs). The blocking is a byte budget for one K block of one gate group, so one number serves float32 and
float64 and every ``G``::

    k_block = max(8, budget // (G * W * itemsize))     # budget 0: no blocking (the whole K at once)

How the budget is chosen, roughly::

    budget = tuned[this_cpu] if a tuning pass ran on this CPU else DEFAULT_SHARE * L1d   # 2/3 of L1

:func:`.gemm_tuning.tune` (run by :func:`arrayrnn.warmup` and the background compile, once per CPU) times
S1- and S2-shaped gate-grouped products at a few budgets and keeps the fastest in a JSON record beside
numba's on-disk cache (:func:`arrayrnn.engines.numba_cache.location`), keyed by the CPU (SIMD variant, LLVM's
CPU name, L1d size). The bits of a product never depend on the budget (each K block's FMA chain goes on from
the last one's sums, :func:`.simd_ir.tile`), so a budget tuned while a process runs changes its speed, never
its results.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from llvmlite import binding as llvm

from ..numba_cache import location
from .simd_ir import VARIANT

_log = logging.getLogger("arrayrnn.numba")

RECORD_NAME = "arrayrnn-gemm-blocking.json"
RECORD_VERSION = 1
DEFAULT_SHARE = 2 / 3            # of L1d: the block plus the rows of A and the tile's stores fit beside it
FALLBACK_L1D = 32 * 1024         # where the OS does not say (the smallest L1d of the x86 CPUs in use)

_SYSFS_L1D = Path("/sys/devices/system/cpu/cpu0/cache/index0/size")
_budget: int | None = None       # this process's budget (bytes), read once; use() and forced() replace it


def l1d_bytes() -> int:
    """The L1 data cache of one core, from the OS (glibc's sysconf, else Linux's sysfs), else 32 KiB."""
    with contextlib.suppress(ValueError, OSError, AttributeError):
        size = os.sysconf("SC_LEVEL1_DCACHE_SIZE")
        if size > 0:
            return int(size)
    with contextlib.suppress(OSError, ValueError):
        text = _SYSFS_L1D.read_text().strip().upper()
        scale = {"K": 1024, "M": 1024 * 1024}.get(text[-1:], 1)
        return int(text.rstrip("KM")) * scale
    return FALLBACK_L1D


def default_budget() -> int:
    """The budget when no tuning pass has run on this CPU: :data:`DEFAULT_SHARE` of :func:`l1d_bytes`."""
    return int(DEFAULT_SHARE * l1d_bytes())


def cpu_key() -> str:
    """What a tuned budget is valid for: the SIMD variant, LLVM's name for the CPU and its L1d size."""
    return f"{VARIANT}/{llvm.get_host_cpu_name()}/l1d={l1d_bytes()}"


def record_path() -> Path | None:
    """The tuning record beside numba's cache, or ``None`` where numba has no writable cache."""
    where = location()
    return None if where is None else Path(where) / RECORD_NAME


def read_records() -> dict:
    """Every CPU's record in the file (one cache may serve several machines); ``{}`` if absent or bad."""
    path = record_path()
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        _log.warning("arrayrnn: the GEMM tuning record %s is unreadable (%s); the default blocking is used "
                     "until a tuning pass writes it again", path, err)
        return {}
    if not isinstance(data, dict) or data.get("version") != RECORD_VERSION:
        return {}
    cpus = data.get("cpus")
    return cpus if isinstance(cpus, dict) else {}


def tuned_record() -> dict | None:
    """The record a tuning pass left for this CPU, if it holds a valid budget (an int >= 0); else ``None``."""
    record = read_records().get(cpu_key())
    budget = record.get("budget") if isinstance(record, dict) else None
    valid = isinstance(budget, int) and not isinstance(budget, bool) and budget >= 0
    return record if valid else None


def tuned_budget() -> int | None:
    """The budget a tuning pass recorded for this CPU, or ``None``."""
    record = tuned_record()
    return None if record is None else record["budget"]


def budget() -> int:
    """This process's K-block budget in bytes (tuned for this CPU, else :func:`default_budget`)."""
    global _budget
    # no lock: two threads at once both read the same record, where a lock held at a fork would hang the child
    if _budget is None:
        tuned = tuned_budget()
        _budget = default_budget() if tuned is None else tuned
    return _budget


@contextlib.contextmanager
def forced(bytes_: int) -> Iterator[None]:
    """Scratch tiles made inside get the budget ``bytes_`` (0: no blocking); for benches and tests."""
    global _budget
    if not isinstance(bytes_, int) or bytes_ < 0:
        raise ValueError(f"forced: bytes_ = {bytes_!r}; expected an int >= 0 (0: no K blocking)")
    before = budget()
    _budget = bytes_
    try:
        yield
    finally:
        _budget = before


def use(bytes_: int) -> None:
    """Make ``bytes_`` this process's budget (the tuning pass, :mod:`.gemm_tuning`, with what it measured)."""
    global _budget
    _budget = bytes_


def reload() -> None:
    """Read the record again at the next :func:`budget` (a background compile's child may have tuned)."""
    global _budget
    _budget = None


def write_record(key: str, record: dict) -> None:
    """Add ``record`` for ``key`` to the file, whole or not at all (a temporary file, then a rename)."""
    path = record_path()
    if path is None:
        return
    cpus = {**read_records(), key: record}
    text = json.dumps({"version": RECORD_VERSION, "cpus": cpus}, indent=1, sort_keys=True)
    try:
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=".blocking-", delete=False) as f:
            f.write(text)
        os.replace(f.name, path)
    except OSError as err:
        with contextlib.suppress(OSError, NameError):
            os.unlink(f.name)
        _log.warning("arrayrnn: could not write the GEMM tuning record %s (%s); this process uses the tuned "
                     "blocking, later ones the default until a tuning pass writes it", path, err)
