"""numba's on-disk cache for arrayrnn's compiled functions, made safe to fail.

``numba.njit(cache=True)`` raises when its cache cannot be used: at decoration (so at ``import arrayrnn``)
when no cache directory is writable, and at every call whose index or data file is corrupt (a truncated
file: ``UnpicklingError``). :func:`njit` is ``numba.njit`` with a cache that never raises:

- no writable location (``NUMBA_CACHE_DIR``, the package's ``__pycache__``, the user-wide directory):
  no cache, one warning naming ``NUMBA_CACHE_DIR``; the functions compile in this process when called;
- a corrupt index or data file is a miss (one warning); the compile that follows writes the entry anew.
  Each file ends in a SHA-256 digest of its payload, so a file cut short or changed in place is caught
  before it is unpickled, not only where pickle happens to fail (an entry written without the digest,
  by plain numba, counts as corrupt once).
"""

from __future__ import annotations

import functools
import hashlib
import io
import logging
import os
import pickle
import sys
import warnings
from typing import Any


def _drop_refused_thread_count() -> None:
    """``NUMBA_NUM_THREADS`` of 0 or less makes ``import numba`` raise (numba/np/ufunc/parallel.py,
    ``get_thread_count``), which would break ``import arrayrnn``; like a bad ``OMP_NUM_THREADS``
    (:mod:`.thread_count`), it is ignored with a warning (numba then takes its default). Text numba
    cannot parse as an int it already ignores with its own warning (numba/core/config.py, ``_readenv``)."""
    text = os.environ.get("NUMBA_NUM_THREADS", "")
    try:
        refused = "numba" not in sys.modules and int(text) <= 0
    except ValueError:
        return
    if refused:
        warnings.warn(f"NUMBA_NUM_THREADS = {text!r} is not a thread count (expected an int >= 1, or unset); "
                      "numba refuses it at import, so arrayrnn removes it from os.environ", RuntimeWarning,
                      stacklevel=2)
        del os.environ["NUMBA_NUM_THREADS"]


_drop_refused_thread_count()

import numba  # noqa: E402 - after the environment is checked
from numba.core import caching  # noqa: E402
from numba.core.caching import NullCache  # noqa: E402

_log = logging.getLogger("arrayrnn.numba")
_DIGEST = hashlib.sha256().digest_size
_warned: set[str] = set()

NO_LOCATION = ("arrayrnn: numba has no writable cache directory (NUMBA_CACHE_DIR, the package's __pycache__ "
               "and the user cache directory all failed): compiled code is not kept between processes, and "
               "engine='auto' runs the reference engine. Set NUMBA_CACHE_DIR to a writable directory to keep "
               "it (and `python -m arrayrnn warmup` to fill it ahead).")


def _warn_once(kind: str, message: str, *args: Any) -> None:
    if kind not in _warned:
        _warned.add(kind)
        _log.warning(message, *args)


class CorruptEntry(Exception):
    """A cache file whose digest does not match its payload."""


def _with_digest(payload: bytes) -> bytes:
    return payload + hashlib.sha256(payload).digest()


def _verified(raw: bytes) -> bytes:
    payload, digest = raw[:-_DIGEST], raw[-_DIGEST:]
    if len(raw) < _DIGEST or hashlib.sha256(payload).digest() != digest:
        raise CorruptEntry("its digest does not match")
    return payload


class _CacheFile(caching.IndexDataCacheFile):
    """numba's index and data files, each with a digest; anything unreadable is a miss."""

    def _dump(self, obj: Any) -> bytes:
        return _with_digest(super()._dump(obj))

    def load(self, key: Any) -> Any:
        try:
            return super().load(key)
        except Exception as err:  # noqa: BLE001 - a corrupt entry: compiled again, then overwritten
            _corrupt(self._cache_path, err)
            return None

    def _load_index(self) -> dict:
        try:
            with open(self._index_path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return {}
        try:
            stream = io.BytesIO(raw)
            if pickle.load(stream) != self._version:
                return {}
            stamp, overloads = pickle.loads(_verified(stream.read()))
        except Exception as err:  # noqa: BLE001 - save() writes a fresh index over it
            _corrupt(self._index_path, err)
            return {}
        return overloads if stamp == self._source_stamp else {}

    def _load_data(self, name: str) -> Any:
        with open(self._data_path(name), "rb") as f:
            return pickle.loads(_verified(f.read()))


def _corrupt(path: str, err: BaseException) -> None:
    _warn_once("corrupt", "arrayrnn: a corrupt entry in numba's cache (%s: %s: %s) is compiled again and "
               "overwritten", path, type(err).__name__, err)


class SafeFunctionCache(caching.FunctionCache):
    """:class:`numba.core.caching.FunctionCache` on :class:`_CacheFile`; loads and saves never raise."""

    def __init__(self, py_func: Any):
        super().__init__(py_func)
        self._cache_file = _CacheFile(self._cache_path, self._impl.filename_base,
                                      self._impl.locator.get_source_stamp())

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        try:
            return super().load_overload(sig, target_context)
        except Exception as err:  # noqa: BLE001 - e.g. an entry that unpickles but does not rebuild
            _corrupt(self._cache_path, err)
            return None

    def save_overload(self, sig: Any, data: Any) -> None:
        try:
            super().save_overload(sig, data)
        except Exception as err:  # noqa: BLE001 - the compiled code still runs; only the cache misses it
            _warn_once("save", "arrayrnn: numba could not write its cache in %s (%s); compiled code is not "
                       "kept for the next process", self._cache_path, err)


def new_cache(py_func: Any) -> Any:
    """A :class:`SafeFunctionCache` for ``py_func``, or numba's ``NullCache`` where no location is
    writable (one warning)."""
    try:
        return SafeFunctionCache(py_func)
    except (RuntimeError, OSError):   # numba: "cannot cache function ...: no locator available"
        _warn_once("location", NO_LOCATION)
        return NullCache()


def njit(**options: Any) -> Any:
    """``numba.njit(**options)``; ``cache=True`` gives :func:`new_cache`'s cache."""
    cache = options.pop("cache", False)

    def decorate(fn: Any) -> Any:
        dispatcher = numba.njit(**options)(fn)
        if cache:
            dispatcher._cache = new_cache(fn)   # what Dispatcher.enable_caching does, with our cache
        return dispatcher
    return decorate


def _probe() -> None:
    """A function beside the engines' compiled code: where its cache can go, theirs can."""


@functools.cache
def location() -> str | None:
    """The directory numba caches the engine's compiled loops in; ``None`` where none is writable."""
    cache = new_cache(_probe)
    return cache.cache_path if isinstance(cache, SafeFunctionCache) else None


def background_enabled() -> bool:
    """``ARRAYRNN_BACKGROUND_COMPILE``: unset or ``1`` (the default) compiles in the background; ``0`` off.

    Read by the numba engine's background compile (:mod:`.numba.warmup`) and by the frontend's dropout
    masks (which draw on NumPy rather than wait for a compile), so it lives below both.
    """
    value = os.environ.get("ARRAYRNN_BACKGROUND_COMPILE", "1").strip()
    if value not in ("0", "1"):
        raise ValueError(f"ARRAYRNN_BACKGROUND_COMPILE={value!r}; expected '1' (compile in the background, "
                         "the default) or '0' (calls of engine='auto' wait for numba's compile)")
    return value == "1"
