"""The prototype table against the shipped C headers and the loaded library."""

from __future__ import annotations

import ctypes

import pytest
from support.cudnn import expected_ctype, parse_headers, requires_cudnn, requires_headers

from cudnn_bindings import _lib
from cudnn_bindings.prototypes import OPTIONAL, PROTOTYPES

pytestmark = [requires_cudnn, requires_headers()]

NAMES = sorted(PROTOTYPES)


def _type_name(t) -> str:
    return "void" if t is None else getattr(t, "__name__", repr(t))


@pytest.mark.parametrize("name", NAMES)
def test_declared_in_headers(name: str) -> None:
    assert name in parse_headers().functions, f"{name} is not declared in the cuDNN headers"


@pytest.mark.parametrize("name", NAMES)
def test_parameter_count_matches_header(name: str) -> None:
    _, params = parse_headers().functions[name]
    _, argtypes = PROTOTYPES[name]
    assert len(argtypes) == len(params), (
        f"{name}: table has {len(argtypes)} argtypes, header declares {len(params)}: "
        f"{[p.name for p in params]}")


@pytest.mark.parametrize("name", NAMES)
def test_each_parameter_type_matches_header(name: str) -> None:
    h = parse_headers()
    ret, params = h.functions[name]
    restype, argtypes = PROTOTYPES[name]
    assert restype is expected_ctype(ret, h), f"{name}: restype {_type_name(restype)} vs header {ret}"
    for i, (p, got) in enumerate(zip(params, argtypes, strict=True)):
        want = expected_ctype(p, h)
        assert got is want, f"{name} parameter {i} ({p.name}: {p.base}{'*' * p.depth}{'[]' * p.array}): " \
                            f"table has {_type_name(got)}, header maps to {_type_name(want)}"
        assert ctypes.sizeof(got) == ctypes.sizeof(want)


@pytest.mark.parametrize("name", NAMES)
def test_exported_and_prototyped_by_loaded_library(name: str) -> None:
    lib = _lib.library()
    if not hasattr(lib, name):
        assert name in OPTIONAL, f"{name} is missing from {_lib.library_path()} and has no fallback"
        pytest.skip(f"{name} not exported by this cuDNN (a fallback is used)")
    fn = _lib.function(name)
    restype, argtypes = PROTOTYPES[name]
    assert fn.restype is restype
    assert tuple(fn.argtypes) == argtypes


def test_v9_clip_functions_present() -> None:
    assert _lib.has_function("cudnnRNNSetClip_v9") and _lib.has_function("cudnnRNNGetClip_v9")


def test_header_parser_sees_the_rnn_api() -> None:
    h = parse_headers()
    assert "cudnnRNNDescriptor_t" in h.opaque and "cudnnHandle_t" in h.opaque
    assert "cudnnRNNMode_t" in h.enums and "cudnnStatus_t" in h.enums
    assert len(h.functions) > 100


def test_function_outside_the_table_is_refused() -> None:
    with pytest.raises(KeyError, match="not in cudnn_bindings.prototypes.PROTOTYPES"):
        _lib.function("cudnnConvolutionForward")
