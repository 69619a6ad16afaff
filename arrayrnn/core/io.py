"""`save` / `load`: the canonical buffer in an ``.npz`` with a JSON header. Never pickle.

The file holds two arrays: ``header`` (the UTF-8 bytes of a JSON object: format name and version, the
spec, dtype, buffer length and a SHA-256 of the buffer) and ``data`` (the canonical 1-D buffer). Reading
and the atomic write are :mod:`arrayrnn.core.npzfile`'s.

A custom cell's params save with its mode name (the spec's) and its definition's names (``"cell"``:
gates, states, split gates); the code of its functions is not saved. Loading needs the cell registered
under that name with the same names (import the module that registers it first), else a ``ValueError``
naming the cell.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import numpy as np

from . import npzfile
from .backend import to_host
from .cell_registry import BUILTIN_MODES, Cell, cell_of, registered_cells
from .layout import layout_of
from .params import PackedParams
from .spec import RNNSpec

KIND = "arrayrnn.PackedParams"
VERSIONS = range(1, 2)  # the file versions this code reads; it writes the last


def save(path: str | os.PathLike, params: PackedParams) -> None:
    """Write ``params`` (converted to the canonical format, moved to the host) to ``path`` atomically.

    The file is a ``.npz`` with a JSON header (spec, dtype, length, checksum); never a pickle.

    Parameters
    ----------
    path : str or os.PathLike
        Where to write.
    params : PackedParams
        Any format, any device.

    Raises
    ------
    TypeError
        ``params`` is not a `PackedParams`.

    See Also
    --------
    load

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> import arrayrnn as ar
    >>> params = ar.PackedParams.init(ar.RNNSpec(mode="lstm", input_size=3, hidden_size=4), seed=0)
    >>> path = os.path.join(tempfile.mkdtemp(), "lstm.npz")
    >>> ar.save(path, params)
    >>> back = ar.load(path)
    >>> back.spec == params.spec, bool(np.array_equal(back.data, params.data))
    (True, True)
    """
    if not isinstance(params, PackedParams):
        raise TypeError(f"params has type {type(params).__name__}; expected an arrayrnn.PackedParams")
    data = np.ascontiguousarray(to_host(params.to_format("canonical").data))
    header = {
        "spec": params.spec.to_dict(),
        "dtype": str(data.dtype),
        "length": int(data.size),
        "sha256": hashlib.sha256(data.tobytes()).hexdigest(),
    }
    if params.spec.custom_cell is not None:
        header["cell"] = _cell_names(params.spec.custom_cell)
    npzfile.write(path, KIND, VERSIONS[-1], header, {"data": data})


def load(path: str | os.PathLike) -> PackedParams:
    """Read a file written by :func:`save`; every field is validated.

    The spec in the header fixes the buffer's dtype and length, which are checked against the member's
    declaration before its data is read (a forged shape never reaches an allocation).

    Parameters
    ----------
    path : str or os.PathLike
        A file written by :func:`save`.

    Returns
    -------
    PackedParams
        Canonical, on the host (``.to(cupy)`` moves it to a GPU).

    Raises
    ------
    ValueError
        A damaged or foreign file (format version, spec, size, dtype or checksum wrong), or a file of a
        custom cell that is not registered (or registered with other gates, states or split gates); the
        message says which.

    Examples
    --------
    >>> import os, tempfile
    >>> import arrayrnn as ar
    >>> path = os.path.join(tempfile.mkdtemp(), "gru.npz")
    >>> ar.save(path, ar.PackedParams.init(ar.RNNSpec(mode="gru", input_size=3, hidden_size=2)))
    >>> ar.load(path).spec.mode
    'gru'
    """
    header, members = npzfile.read(path, KIND, VERSIONS, expect=lambda h: _expected_members(path, h))
    spec = _validate_header(path, header)
    _validate_data(path, header, spec, members["data"])
    return PackedParams(spec, members["data"])


def _expected_members(path: Any, header: dict[str, Any]) -> dict[str, tuple[str, tuple[int, ...]]]:
    spec = _validate_header(path, header)
    return {"data": (spec.dtype, (layout_of(spec).size,))}


def _validate_header(path: Any, header: dict[str, Any]) -> RNNSpec:
    _check_cell_registered(path, header.get("spec"))
    try:
        spec = RNNSpec.from_dict(header.get("spec"))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: invalid spec in header: {e}") from e
    _check_same_cell(path, spec, header.get("cell"))
    return spec


def _cell_names(cell: Cell) -> dict[str, list[str]]:
    """What a file records of a custom cell besides its name: the names that fix its weights and states."""
    return {"gates": list(cell.gates), "states": list(cell.states), "split": list(cell.split)}


def _check_cell_registered(path: Any, fields: Any) -> None:
    mode = fields.get("mode") if isinstance(fields, dict) else None
    if isinstance(mode, str) and mode not in BUILTIN_MODES and cell_of(mode) is None:
        raise ValueError(f"{path}: the file holds a stack of the cell mode = {mode!r}, which is not "
                         f"registered (registered: {registered_cells()}); register it before loading: import "
                         f"the module that defines it (its arrayrnn.register_cell call runs on import), then "
                         "ar.load")


def _check_same_cell(path: Any, spec: RNNSpec, saved: Any) -> None:
    cell = spec.custom_cell
    if cell is None:
        if saved is not None:
            raise ValueError(f"{path}: header has a cell {saved!r} for the built-in mode = {spec.mode!r}; "
                             "expected none (the file is damaged)")
        return
    if saved != _cell_names(cell):
        raise ValueError(f"{path}: the file was saved with the cell {spec.mode!r} of {saved!r}; the cell "
                         f"registered as {spec.mode!r} now has {_cell_names(cell)}; register the definition "
                         "the file was saved with (another cell's weights would mean something else)")


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
