"""Hand-made .npz archives for the readers' refusal tests, and a count of what a read inflates.

An archive written member by member (:func:`write_zip`) of .npy bytes whose header may declare a shape the
data does not have (:func:`npy_bytes`): what ``np.savez`` never writes but a damaged or hostile file can hold.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest


def npy_bytes(array: np.ndarray, shape: tuple[int, ...] | None = None) -> bytes:
    """An .npy file of ``array`` whose header declares ``shape`` (default: the array's own)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": np.lib.format.dtype_to_descr(array.dtype),
                                               "fortran_order": False,
                                               "shape": array.shape if shape is None else shape})
    return buf.getvalue() + array.tobytes()


def write_zip(path: str | Path, members: Iterable[tuple[str, bytes]],
              method: int = zipfile.ZIP_STORED) -> None:
    """A zip archive at ``path`` of ``(name, data)`` members, in order (a repeated name is written twice)."""
    with zipfile.ZipFile(path, "w", compression=method) as z:
        for name, data in members:
            z.writestr(name, data)


def count_inflated(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on, ``[total]``: the bytes zipfile inflates (or copies) out of members."""
    total = [0]
    real = zipfile.ZipExtFile.read

    def counting(self, n=-1):
        data = real(self, n)
        total[0] += len(data)
        return data

    monkeypatch.setattr(zipfile.ZipExtFile, "read", counting)
    return total
