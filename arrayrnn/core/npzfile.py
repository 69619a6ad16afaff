"""One reader/writer for arrayrnn's files: an ``.npz`` holding a JSON header plus named arrays; never pickle.

``write(path, header, arrays)`` writes a temporary file beside ``path``, flushes and fsyncs it, gives it the
mode of the file it replaces (or the umask default for a new file) and renames it over ``path``: a crash or
a failing write leaves the old file intact. ``read(path, kind, versions)`` returns ``(header, arrays)`` and
turns every way a file can be damaged or foreign (truncation, flipped bytes, a bad zip, bad JSON, JSON
nested too deep, a header that is not an object, another kind of file, a version this code cannot read)
into a ``ValueError`` naming the file and what is wrong.

Every header names the file's kind and version: ``{"format": kind, "version": n, ...}`` (the key is
``"format"`` for the files written before this module had a name for it; it is the kind of FILE, not a
weight format).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HEADER = "header"
_KIND = "format"  # the header key naming the kind of file (see the module docstring)
_MAX_HEADER_BYTES = 1 << 24
# Everything zipfile/zlib/numpy raise on a damaged archive (byte flips reach NotImplementedError for an
# unknown compression method and RuntimeError for a "encrypted" flag).
_READ_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, KeyError,
                NotImplementedError, RuntimeError, UnicodeDecodeError, OverflowError, IndexError)


def write(path: str | os.PathLike, kind: str, version: int, header: dict[str, Any],
          arrays: dict[str, np.ndarray]) -> None:
    """Write a file of ``kind`` and ``version`` with ``header`` (more JSON fields) and ``arrays`` to ``path``
    atomically (see the module docstring)."""
    if HEADER in arrays:
        raise ValueError(f"arrays has a member named {HEADER!r}; that name is reserved for the header")
    header = {_KIND: kind, "version": version, **header}
    header_bytes = np.frombuffer(json.dumps(header, sort_keys=True).encode("utf-8"), dtype=np.uint8)
    members = {HEADER: header_bytes, **{k: np.ascontiguousarray(v) for k, v in arrays.items()}}
    atomic_write(Path(path), lambda f: np.savez(f, **members))


def atomic_write(path: Path, write_to: Callable[[Any], None]) -> None:
    """Call ``write_to(binary file)`` on a temporary file beside ``path``, then rename it over ``path``."""
    folder = path.parent if str(path.parent) else Path(".")
    mode = _mode_for(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            write_to(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_folder(folder)


def _mode_for(path: Path) -> int:
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return 0o666 & ~_current_umask()


def _current_umask() -> int:
    mask = os.umask(0o022)  # the only portable way to read it is to set it and put it back
    os.umask(mask)
    return mask


def _fsync_folder(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform/filesystem lets a folder be opened
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def read(path: str | os.PathLike, kind: str, versions: range
         ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read a file of ``kind`` written by :func:`write` with a version in ``versions``: ``(header dict,
    {name: array})``. A damaged or foreign file, another kind or another version is a ``ValueError``."""
    header, members = _read_any(path, f"{kind} file")
    _check_kind(path, header, kind, versions)
    return header, members


def _check_kind(path: Any, header: dict[str, Any], kind: str, versions: range) -> None:
    if header.get(_KIND) != kind:
        raise ValueError(f"{path}: file kind = {header.get(_KIND)!r}; expected {kind!r}")
    version = header.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version not in versions:
        raise ValueError(f"{path}: {kind} file version = {version!r}; this arrayrnn reads versions "
                         f"{versions.start}..{versions.stop - 1} (written by a newer arrayrnn? upgrade)")


def _read_any(path: str | os.PathLike, what: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    try:
        loaded = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise
    except _READ_ERRORS as e:
        raise ValueError(f"{path}: not a readable {what} (truncated, damaged or foreign): "
                         f"{type(e).__name__}: {e}") from e
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise ValueError(f"{path}: holds a bare {type(loaded).__name__}; expected an .npz {what}")
    with loaded as npz:
        if HEADER not in npz.files:
            raise ValueError(f"{path}: has members {sorted(npz.files)} but no {HEADER!r}; expected a {what}")
        try:
            members = {name: npz[name] for name in npz.files}
        except _READ_ERRORS as e:
            raise ValueError(f"{path}: a member is unreadable (truncated or damaged): "
                             f"{type(e).__name__}: {e}") from e
    odd = sorted(name for name, a in members.items() if not isinstance(a, np.ndarray))
    if odd:
        raise ValueError(f"{path}: members {odd} are not .npy arrays; expected a {what}")
    header = _decode_header(path, members.pop(HEADER), what)
    return header, members


def _decode_header(path: Any, raw: np.ndarray, what: str) -> dict[str, Any]:
    if raw.dtype == np.uint8 and raw.ndim == 1 and raw.size <= _MAX_HEADER_BYTES:
        text_or_bytes: Any = raw.tobytes()
    elif raw.dtype.kind == "U" and raw.ndim == 0:  # files written before the header became bytes
        text_or_bytes = str(raw)
    else:
        raise ValueError(f"{path}: header has dtype {raw.dtype} and shape {raw.shape}; expected 1-D uint8 "
                         f"JSON bytes of a {what}")
    try:
        header = json.loads(text_or_bytes)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ValueError(f"{path}: header is not valid JSON ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: header is a JSON {type(header).__name__}; expected a JSON object")
    return header
