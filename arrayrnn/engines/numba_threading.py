"""The numba engine's threading setup, chosen by the library rather than left to the environment.

- numba's threading layer: ``workqueue`` unless the user chose one (``NUMBA_THREADING_LAYER`` or
  ``numba.config.THREADING_LAYER`` set before). Its idle workers sleep; an OpenMP pool spin-waits, and
  next to OpenBLAS's own spinning pool on a small or loaded machine it was measured 17-18x slower.
- The engine splits a batch into row chunks, one per numba thread, and every chunk calls BLAS from
  its own thread; BLAS is limited to one thread for the duration (:func:`single_threaded_blas`) so the
  two pools never compete for the same cores. Hoisted whole-sequence GEMMs outside those regions keep
  BLAS's own threads.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import numba

from .numba_blas import BlasBinding

_PREFERRED_LAYER = "workqueue"


def configure_threading_layer() -> None:
    """Pick ``workqueue`` unless the user already chose a layer (call before the first parallel launch)."""
    if "NUMBA_THREADING_LAYER" in os.environ:
        return
    if numba.config.THREADING_LAYER == "default":
        numba.config.THREADING_LAYER = _PREFERRED_LAYER


def num_threads() -> int:
    """Threads the engine uses: numba's current setting (``numba.set_num_threads``), at least 1."""
    return max(1, int(numba.get_num_threads()))


@contextlib.contextmanager
def single_threaded_blas(blas: BlasBinding) -> Iterator[bool]:
    """Limit the BLAS library to one thread inside the block; yields whether the limit holds.

    threadpoolctl lets only one Python thread control OpenBLAS; when another thread holds that control,
    the limit may not apply and the caller should not run BLAS from several threads at once.
    """
    controller = blas.controller
    if controller is None:
        yield False
        return
    before = controller.get_num_threads()
    if before == 1:
        yield True
        return
    controller.set_num_threads(1)
    try:
        yield controller.get_num_threads() == 1
    finally:
        controller.set_num_threads(before)
