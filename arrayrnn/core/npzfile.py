"""One reader/writer for arrayrnn's files: an ``.npz`` holding a JSON header plus named arrays; never pickle.

``write(path, header, arrays)`` writes a temporary file beside ``path``, flushes and fsyncs it, gives it the
mode of the file it replaces (or the umask default for a new file) and renames it over ``path``: a crash or
a failing write leaves the old file intact. A ``path`` that cannot name a file (empty, a directory, ending
with a separator, in a missing folder) is refused before anything is written. A symbolic link is written
through, as ``np.savez`` and ``torch.save`` do: the file it names gets the new contents, the link stays.
A ``path`` that exists and is not a regular file (a FIFO, a device such as ``/dev/null``, a socket; also
at the end of a link) is refused with a ``ValueError``: the rename would replace it with a regular file.
The temporary (``.arrayrnn-<8 random characters>.tmp``: short, so any file name up to the system's limit
can be saved) is locked (``flock``) while its save runs; each save first removes the temporaries in its
folder that no save holds, those a killed process (``kill -9``) left.

``read(path, kind, versions)`` returns ``(header, arrays)`` and turns every way a file can be damaged or
foreign (truncation, flipped bytes, a bad zip, bad JSON, JSON nested too deep, a header that is not an
object, another kind of file, a version this code cannot read, not a regular file: a device such as
``/dev/zero`` was read until memory ran out, a FIFO waited for a writer) into a ``ValueError`` naming the
file and what is wrong. Every member's declared dtype, shape and size is
checked before its data is read, and no member inflates past its declared size (see `read`).

Every header names the file's kind and version: ``{"format": kind, "version": n, ...}`` (the key is
``"format"`` for the files written before this module had a name for it; it is the kind of FILE, not a
weight format).
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import stat
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

try:
    import fcntl
except ImportError:  # Windows: no flock; temporaries of killed saves stay
    fcntl = None

import numpy as np

HEADER = "header"
_KIND = "format"  # the header key naming the kind of file (see the module docstring)
_MAX_HEADER_BYTES = 1 << 24
_MAX_NPY_HEADER = 1 << 16  # an .npy header (dict text) longer than this is not one numpy wrote for us
_MAX_DEFLATE_RATIO, _DEFLATE_SLACK = 1032, 1 << 10  # deflate cannot expand more than 1032:1
_CHUNK = 1 << 22  # bytes inflated per read
_NPY_MAGIC = b"\x93NUMPY"
_DTYPE_KINDS = "biufcUS"
_NPY_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
# (dtype, shape) of every member but the header, by name: what a caller expects, given the header
Expect = Callable[[dict[str, Any]], Mapping[str, tuple[Any, tuple[int, ...]]]]
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
    atomic_write(path, lambda f: np.savez(f, **members))


_TMP_PREFIX, _TMP_SUFFIX = ".arrayrnn-", ".tmp"
_TMP_NAME = re.compile(r"\.arrayrnn-[a-z0-9_]{8}\.tmp")  # what mkstemp makes of them (8 random characters)


def _is_temporary_of(name: str, path: Path) -> bool:
    """Whether ``name`` is a temporary a save of ``path`` may have left: ours, or the longer form older
    versions used (``.<name>.arrayrnn-<random>.tmp``, too long for names near NAME_MAX)."""
    legacy = name.startswith(f".{path.name}{_TMP_PREFIX}") and name.endswith(_TMP_SUFFIX)
    return legacy or _TMP_NAME.fullmatch(name) is not None


def atomic_write(path: str | os.PathLike, write_to: Callable[[Any], None]) -> None:
    """Call ``write_to(binary file)`` on a temporary file beside ``path``, then rename it over ``path``.
    ``path`` must name a file in an existing folder (see `file_target`); a symbolic link is written
    through (the module docstring)."""
    given = path = file_target(path)
    if path.is_symlink():
        path = file_target(os.path.realpath(path))
    _check_replaceable(given, path)
    folder = path.parent
    mode = _mode_for(path)
    remove_abandoned_temporaries(path)
    f, tmp = _held_temporary(path)
    try:
        with f:
            write_to(f)
            f.flush()
            os.fsync(f.fileno())
            os.chmod(tmp, mode)
            if fcntl is not None:   # renamed while still held, so no other save takes it for abandoned
                os.replace(tmp, path)
        if fcntl is None:           # (Windows cannot rename an open file)
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_folder(folder)


def _check_replaceable(given: Path, path: Path) -> None:
    """Refuse an existing ``path`` (``given``, resolved) that is not a regular file. Writing through to a
    FIFO or a device, as ``np.save`` does, is not atomic and not what a checkpoint means; replacing one
    (the rename) would put a file where ``/dev/null`` was. A clear error is the safe answer."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    kind = _kind_of(mode)
    if kind is not None:
        where = "" if given == path else f" (the link {str(given)!r} points there)"
        raise ValueError(f"path = {str(path)!r}{where} is {kind}, not a regular file; saving replaces its "
                         f"target with a new file, so it only writes regular files: expected a file name "
                         f"that is new or names a regular file")


def _held_temporary(path: Path) -> tuple[BinaryIO, str]:
    """A new temporary for ``path`` (a unique name), open and locked; made again if another save removed
    it between its creation and the lock (it took it for abandoned)."""
    while True:
        fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, suffix=_TMP_SUFFIX, dir=path.parent)
        f = os.fdopen(fd, "wb")
        if fcntl is None:
            return f, tmp
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.fstat(fd).st_nlink:
            return f, tmp
        f.close()


def remove_abandoned_temporaries(path: Path) -> None:
    """Remove the temporaries beside ``path`` (regular files named like ours) that no save holds locked:
    those of saves killed before they could remove them."""
    if fcntl is None:
        return
    with contextlib.suppress(OSError), os.scandir(path.parent) as entries:
        for entry in entries:
            if _is_temporary_of(entry.name, path):
                _remove_if_abandoned(Path(entry.path))


def _remove_if_abandoned(tmp: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(tmp, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # BlockingIOError: a save holds it
                os.unlink(tmp)
        finally:
            os.close(fd)


def file_target(path: str | os.PathLike) -> Path:
    """``path`` as a file to write, or a clear error naming it: not a path (``TypeError``), empty
    (``ValueError``), a directory or ending with a separator (``IsADirectoryError``), in a folder that does
    not exist (``FileNotFoundError``) or under a file (``NotADirectoryError``)."""
    text = _path_text(path)
    target = Path(text)  # note: Path drops a trailing separator and "." ("newdir/" -> "newdir")
    if os.path.basename(text) in ("", ".", "..") or target.is_dir():
        raise IsADirectoryError(f"path = {text!r} names a directory; expected a file name such as "
                                f"{str(target / 'model.npz')!r}")
    folder = target.parent
    if not folder.exists():
        raise FileNotFoundError(f"path = {text!r}: its folder {str(folder)!r} does not exist; create it "
                                f"first")
    if not folder.is_dir():
        raise NotADirectoryError(f"path = {text!r}: {str(folder)!r} is a file, not a folder")
    return target


def _path_text(path: Any) -> str:
    """``path`` as a non-empty ``str`` (an int would open a file descriptor; bytes are refused too)."""
    if not isinstance(path, (str, os.PathLike)) or not isinstance(os.fspath(path), str):
        raise TypeError(f"path has type {type(path).__name__}; expected a str or os.PathLike file name")
    text = os.fspath(path)
    if text == "":
        raise ValueError("path is empty; expected a file name such as 'model.npz'")
    return text


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


def read(path: str | os.PathLike, kind: str, versions: range, *, expect: Expect | None = None
         ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read a file of ``kind`` written by :func:`write` with a version in ``versions``: ``(header dict,
    {name: array})``. A damaged or foreign file, another kind or another version is a ``ValueError``.

    Nothing is read before it is validated: the archive's directory (names, compression, sizes), then the
    header member, then every member's ``.npy`` header (dtype without Python objects, shape, declared size
    equal to the size the archive records) and, when ``expect`` is given, ``expect(header)`` -- the
    ``{name: (dtype, shape)}`` of every other member -- before any member's data is inflated; no inflate
    produces more than the member's declared size."""
    what = f"{kind} file"
    with _open_archive(path, what) as archive:
        infos = _directory(path, archive, what)
        header_layout = _layout(path, archive, HEADER, infos[HEADER])
        _check_header_layout(path, header_layout, what)
        header = _decode_header(path, _read_data(path, archive, HEADER, infos[HEADER], header_layout))
        _check_kind(path, header, kind, versions)
        layouts = {name: _layout(path, archive, name, info) for name, info in infos.items() if name != HEADER}
        if expect is not None:
            _check_expected(path, layouts, expect(header))
        arrays = {name: _read_data(path, archive, name, infos[name], lay) for name, lay in layouts.items()}
    return header, arrays


def _check_kind(path: Any, header: dict[str, Any], kind: str, versions: range) -> None:
    if header.get(_KIND) != kind:
        raise ValueError(f"{path}: file kind = {header.get(_KIND)!r}; expected {kind!r}")
    version = header.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version not in versions:
        raise ValueError(f"{path}: {kind} file version = {version!r}; this arrayrnn reads versions "
                         f"{versions.start}..{versions.stop - 1} (written by a newer arrayrnn? upgrade)")


@contextlib.contextmanager
def _open_archive(path: str | os.PathLike, what: str) -> Iterator[zipfile.ZipFile]:
    with _open_regular_file(path, what) as f:
        if f.read(len(_NPY_MAGIC)) == _NPY_MAGIC:
            raise ValueError(f"{path}: holds a bare .npy array; expected an .npz {what}")
        f.seek(0)
        try:
            archive = zipfile.ZipFile(f)
        except _READ_ERRORS as e:
            raise ValueError(f"{path}: not a readable {what} (truncated, damaged or foreign): "
                             f"{type(e).__name__}: {e}") from e
        with archive:
            yield archive


_NOT_REGULAR = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


def _kind_of(mode: int) -> str | None:
    """What a non-regular, non-directory file of ``mode`` is ("a FIFO"), or None."""
    return next((kind for is_kind, kind in _NOT_REGULAR if is_kind(mode)), None)


def _open_regular_file(path: str | os.PathLike, what: str) -> BinaryIO:
    """``path`` open for reading, refused before a byte is read unless it is a regular file. Missing, no
    permission: the OSError as it is; a directory: ``IsADirectoryError``."""
    text = _path_text(path)
    try:
        fd = os.open(text, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO: no wait
    except OSError as e:  # a socket cannot be opened (ENXIO), nor a device without its driver
        _refuse_non_regular(path, _mode_or_zero(text), what, cause=e)
        raise
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        _refuse_non_regular(path, mode, what)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _refuse_non_regular(path: Any, mode: int, what: str, cause: OSError | None = None) -> None:
    kind = _kind_of(mode)
    if kind is not None:
        raise ValueError(f"{path}: is not a regular file ({kind}); expected an .npz {what}") from cause


def _mode_or_zero(path: str) -> int:
    try:
        return os.stat(path).st_mode
    except OSError:
        return 0


def _directory(path: Any, archive: zipfile.ZipFile, what: str) -> dict[str, zipfile.ZipInfo]:
    """``{member name: ZipInfo}`` after checking the archive's directory: only ``.npy`` members, each once,
    stored or deflated, with sizes the file can hold."""
    archive_bytes = os.fstat(archive.fp.fileno()).st_size if archive.fp is not None else 0
    infos: dict[str, zipfile.ZipInfo] = {}
    for info in archive.infolist():
        name = info.filename.removesuffix(".npy")
        if name == info.filename:
            raise ValueError(f"{path}: member {info.filename!r} is not an .npy array; expected a {what}")
        if name in infos:
            raise ValueError(f"{path}: member {info.filename!r} appears twice; expected a {what}")
        _check_sizes(path, info, archive_bytes)
        infos[name] = info
    if HEADER not in infos:
        raise ValueError(f"{path}: has members {sorted(infos)} but no {HEADER!r}; expected a {what}")
    return infos


def _check_sizes(path: Any, info: zipfile.ZipInfo, archive_bytes: int) -> None:
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise ValueError(f"{path}: member {info.filename!r} uses compression method {info.compress_type}; "
                         f"expected stored (0) or deflated (8)")
    most = info.compress_size if info.compress_type == zipfile.ZIP_STORED else (
        _MAX_DEFLATE_RATIO * info.compress_size + _DEFLATE_SLACK)
    if info.compress_size > archive_bytes or info.file_size > most:
        raise ValueError(f"{path}: member {info.filename!r} declares {info.file_size} bytes from "
                         f"{info.compress_size} compressed bytes in a {archive_bytes}-byte file; the "
                         f"archive is damaged or forged")


@dataclass(frozen=True)
class _Layout:
    """What a member's ``.npy`` header declares: the data starts ``offset`` bytes into the member."""

    dtype: np.dtype
    shape: tuple[int, ...]
    fortran: bool
    offset: int
    nbytes: int


def _layout(path: Any, archive: zipfile.ZipFile, name: str, info: zipfile.ZipInfo) -> _Layout:
    """Parse and check one member's ``.npy`` header (reads nothing past it)."""
    try:
        with archive.open(info) as f:
            version = np.lib.format.read_magic(f)
            if version not in _NPY_READERS:
                raise ValueError(f".npy format version {version}; expected 1.0 or 2.0")
            shape, fortran, dtype = _NPY_READERS[version](f, max_header_size=_MAX_NPY_HEADER)
            offset = f.tell()
    except _READ_ERRORS as e:
        raise ValueError(f"{path}: member {name!r} is not a readable .npy array (truncated, damaged or "
                         f"foreign): {type(e).__name__}: {e}") from e
    if dtype.hasobject or dtype.kind not in _DTYPE_KINDS or dtype.itemsize == 0:
        raise ValueError(f"{path}: member {name!r} has dtype {dtype}; expected numbers or text (Python "
                         f"objects would need pickle, which arrayrnn never loads)")
    nbytes = math.prod(shape) * dtype.itemsize
    if offset + nbytes != info.file_size:
        raise ValueError(f"{path}: member {name!r} declares shape {shape} of {dtype} ({nbytes} bytes) but "
                         f"the archive records {info.file_size - offset} bytes of data; the file is damaged")
    return _Layout(dtype, tuple(shape), bool(fortran), offset, nbytes)


def _check_header_layout(path: Any, lay: _Layout, what: str) -> None:
    utf8 = lay.dtype == np.uint8 and len(lay.shape) == 1
    legacy = lay.dtype.kind == "U" and lay.shape == ()  # files written before the header became bytes
    if not (utf8 or legacy) or lay.nbytes > _MAX_HEADER_BYTES:
        raise ValueError(f"{path}: header has dtype {lay.dtype} and shape {lay.shape} ({lay.nbytes} bytes); "
                         f"expected at most {_MAX_HEADER_BYTES} bytes of 1-D uint8 JSON of a {what}")


def _check_expected(path: Any, layouts: dict[str, _Layout], expected: Mapping[str, tuple[Any, Any]]) -> None:
    if set(layouts) != set(expected):
        missing, extra = sorted(set(expected) - set(layouts)), sorted(set(layouts) - set(expected))
        raise ValueError(f"{path}: holds members {sorted(layouts)} besides {HEADER!r}; expected "
                         f"{sorted(expected)} (missing: {missing}, unexpected: {extra})")
    for name, (dtype, shape) in expected.items():
        lay = layouts[name]
        if lay.dtype != np.dtype(dtype) or lay.shape != tuple(shape):
            raise ValueError(f"{path}: member {name!r} declares shape {lay.shape} and dtype {lay.dtype}; "
                             f"expected shape {tuple(shape)} and dtype {np.dtype(dtype)}")


def _read_data(path: Any, archive: zipfile.ZipFile, name: str, info: zipfile.ZipInfo,
               lay: _Layout) -> np.ndarray:
    """The member's array, inflating exactly its declared size (the CRC is checked at its end)."""
    buf = np.empty(lay.nbytes, np.uint8)
    view = memoryview(buf)
    try:
        with archive.open(info) as f:
            f.read(lay.offset)
            done = 0
            while done < lay.nbytes:
                chunk = f.read(min(_CHUNK, lay.nbytes - done))
                if not chunk:
                    raise EOFError(f"{lay.nbytes - done} of {lay.nbytes} bytes missing")
                view[done:done + len(chunk)] = chunk
                done += len(chunk)
            f.read(1)  # reach the member's end: zipfile checks the CRC there
    except _READ_ERRORS as e:
        raise ValueError(f"{path}: member {name!r} is unreadable (truncated or damaged): "
                         f"{type(e).__name__}: {e}") from e
    return buf.view(lay.dtype).reshape(lay.shape, order="F" if lay.fortran else "C")


def _decode_header(path: Any, raw: np.ndarray) -> dict[str, Any]:
    text_or_bytes: Any = raw.tobytes() if raw.dtype == np.uint8 else str(raw)
    try:
        header = json.loads(text_or_bytes)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ValueError(f"{path}: header is not valid JSON ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: header is a JSON {type(header).__name__}; expected a JSON object")
    return header
