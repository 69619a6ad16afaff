"""`save` / `load`: the canonical buffer in an ``.npz`` with a JSON header. Never pickle.

The file holds two arrays: ``header`` (the UTF-8 bytes of a JSON object: format name and version, the
spec, dtype, buffer length and a SHA-256 of the buffer) and ``data`` (the canonical 1-D buffer). The
write goes to a temporary file in the target's folder, is flushed to disk and then renamed over the
target, so a crash leaves either the old file or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from .backend import to_host
from .layout import layout_of
from .params import PackedParams
from .spec import RNNSpec

FORMAT_NAME = "arrayrnn.PackedParams"
FORMAT_VERSION = 1
_MEMBERS = {"header", "data"}


def save(path: str | os.PathLike, params: PackedParams) -> None:
    """Write ``params`` (converted to the canonical format, moved to the host) to ``path`` atomically."""
    if not isinstance(params, PackedParams):
        raise TypeError(f"params has type {type(params).__name__}; expected an arrayrnn.PackedParams")
    data = np.ascontiguousarray(to_host(params.to_format("canonical").data))
    header = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "spec": params.spec.to_dict(),
        "dtype": str(data.dtype),
        "length": int(data.size),
        "sha256": hashlib.sha256(data.tobytes()).hexdigest(),
    }
    header_bytes = np.frombuffer(json.dumps(header, sort_keys=True).encode("utf-8"), dtype=np.uint8)
    _atomic_write(Path(path), lambda f: np.savez(f, header=header_bytes, data=data))


def _atomic_write(path: Path, write: Any) -> None:
    folder = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def load(path: str | os.PathLike) -> PackedParams:
    """Read a file written by :func:`save`; every field is validated (``ValueError`` if damaged/foreign)."""
    header, data = _read_members(Path(path))
    spec = _validate_header(path, header)
    _validate_data(path, header, spec, data)
    return PackedParams(spec, data)


def _read_members(path: Path) -> tuple[dict[str, Any], np.ndarray]:
    try:
        loaded = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable arrayrnn file (truncated, damaged or foreign): {e}") from e
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise ValueError(f"{path}: holds a bare {type(loaded).__name__}; expected an arrayrnn .npz file "
                         f"with members {sorted(_MEMBERS)}")
    with loaded as npz:
        if set(npz.files) != _MEMBERS:
            raise ValueError(f"{path}: holds members {sorted(npz.files)}; expected {sorted(_MEMBERS)}")
        try:
            header_bytes, data = npz["header"], npz["data"]
        except (zipfile.BadZipFile, EOFError, OSError, ValueError) as e:
            raise ValueError(f"{path}: a member is unreadable (truncated or damaged): {e}") from e
    if header_bytes.dtype != np.uint8 or header_bytes.ndim != 1:
        raise ValueError(f"{path}: header has dtype {header_bytes.dtype} and shape {header_bytes.shape}; "
                         "expected 1-D uint8 JSON bytes")
    try:
        header = json.loads(header_bytes.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: header is not valid JSON: {e}") from e
    if not isinstance(header, dict):
        raise ValueError(f"{path}: header is {type(header).__name__}; expected a JSON object")
    return header, data


def _validate_header(path: Any, header: dict[str, Any]) -> RNNSpec:
    if header.get("format") != FORMAT_NAME:
        raise ValueError(f"{path}: format = {header.get('format')!r}; expected {FORMAT_NAME!r}")
    version = header.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= FORMAT_VERSION:
        raise ValueError(f"{path}: format version = {version!r}; this arrayrnn reads versions "
                         f"1..{FORMAT_VERSION} (a newer arrayrnn wrote it? upgrade to read it)")
    try:
        return RNNSpec.from_dict(header.get("spec"))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: invalid spec in header: {e}") from e


def _validate_data(path: Any, header: dict[str, Any], spec: RNNSpec, data: np.ndarray) -> None:
    expected = layout_of(spec).size
    if header.get("dtype") != spec.dtype or str(data.dtype) != spec.dtype:
        raise ValueError(f"{path}: header dtype = {header.get('dtype')!r} and data dtype = {data.dtype}; "
                         f"expected both to equal spec.dtype = {spec.dtype!r}")
    if header.get("length") != expected or data.shape != (expected,):
        raise ValueError(f"{path}: header length = {header.get('length')!r} and data shape = {data.shape}; "
                         f"expected {expected} elements for {spec}")
    digest = hashlib.sha256(np.ascontiguousarray(data).tobytes()).hexdigest()
    if header.get("sha256") != digest:
        raise ValueError(f"{path}: the buffer's SHA-256 does not match the header's; the file is damaged")
