"""Backend weight formats (such as cuDNN's): a registry of converters to and from the canonical layout.

An engine that has its own format registers ``to_backend(params) -> PackedParams`` and
``to_canonical(params) -> PackedParams`` here; ``PackedParams.to_format`` looks them up. The canonical
format is the portable one and the only one ever saved.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .errors import EngineUnavailableError

if TYPE_CHECKING:
    from .params import PackedParams

Converter = Callable[["PackedParams"], "PackedParams"]
_CONVERTERS: dict[str, tuple[Converter, Converter]] = {}


def register_format(name: str, to_backend: Converter, to_canonical: Converter) -> None:
    _CONVERTERS[name] = (to_backend, to_canonical)


def convert(params: PackedParams, format: str) -> PackedParams:
    if params.format != "canonical":
        params = _converters(params.format)[1](params)
    if format == "canonical":
        return params
    return _converters(format)[0](params)


def _converters(name: str) -> tuple[Converter, Converter]:
    if name not in _CONVERTERS:
        raise EngineUnavailableError(f"format {name!r} needs the {name} engine, which is not available here "
                                     "(it needs a CUDA GPU, CuPy and libcudnn v9)")
    return _CONVERTERS[name]
