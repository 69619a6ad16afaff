"""``arrayrnn.set_deterministic``: the same call gives the same bits, whatever else the process is doing.

By default a CPU call's last bits may depend on timing:

- ``engine="auto"`` runs the reference engine until numba's loops for the call's family have loaded in the
  background; the two agree within rounding, not bitwise, so a call's bits change once numba has loaded;
- the numba engine plans a call for :func:`~arrayrnn.get_num_threads` threads and splits its parts over
  the threads free when it runs: another thread count, or fewer threads free because other threads are
  calling, splits the hoisted products (and, for some plans, the time loops) into other row blocks, which
  round differently.

``set_deterministic(True)`` removes both: ``"auto"`` takes the numba engine at once and waits for its
compile (no reference engine meanwhile), the numba engine runs every call on the calling thread alone (one
split, whatever runs beside it), and NumPy's BLAS is held to one thread while the switch is on (a product
split over BLAS's threads rounds differently, and a call's hold of BLAS at one thread is shared with the
other threads' calls). Semantics roughly equal to::

    ARRAYRNN_BACKGROUND_COMPILE=0; arrayrnn.set_num_threads(1); threadpoolctl.threadpool_limits(1, "blas")

GPU engines are not affected (cuDNN picks its own algorithms).
"""

from __future__ import annotations

import threadpoolctl

from ..core.spec import check_flag

_deterministic = False
_blas_limit: threadpoolctl.threadpool_limits | None = None


def set_deterministic(flag: bool) -> None:
    """Same bits for the same call, run to run, whatever else the process is doing.

    ``True``: ``engine="auto"`` takes the numba engine at once and waits for its compile, the numba engine
    runs every call on the calling thread alone, and NumPy's BLAS is held to one thread while the switch is
    on. ``False`` (the default) restores the background compile's reference engine, the threads and BLAS's
    thread count. GPU engines are not affected.

    Parameters
    ----------
    flag : bool
        The switch.

    Raises
    ------
    TypeError
        ``flag`` is not a bool.

    See Also
    --------
    is_deterministic

    Examples
    --------
    >>> import arrayrnn as ar
    >>> ar.set_deterministic(True)
    >>> ar.is_deterministic()
    True
    >>> ar.set_deterministic(False)
    """
    global _deterministic, _blas_limit
    flag = check_flag("flag", flag, TypeError)
    if flag == _deterministic:
        return
    if flag:
        _blas_limit = threadpoolctl.threadpool_limits(1, user_api="blas")
    elif _blas_limit is not None:
        _blas_limit.restore_original_limits()
        _blas_limit = None
    _deterministic = flag
    from . import forget_choices  # the engines' package; its choices depend on this switch

    forget_choices()


def is_deterministic() -> bool:
    """Whether :func:`set_deterministic` is on."""
    return _deterministic


__all__ = ["is_deterministic", "set_deterministic"]
