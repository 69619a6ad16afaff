"""Every mirrored enum value and #define against the shipped headers, and naming rules."""

from __future__ import annotations

import pytest
from support.cudnn import parse_headers, requires_cudnn, requires_headers, shared_prefix

import cudnn_bindings as cb
from cudnn_bindings import enums, raw

ENUMS = list(enums.C_NAMES.items())


def _header_members(c_name: str) -> dict[str, int]:
    members = parse_headers().enums[c_name]
    stripped = {k.removeprefix("CUDNN_"): v for k, v in members.items()}
    prefix = shared_prefix(list(stripped))
    return {k.removeprefix(prefix): v for k, v in stripped.items()}


@requires_cudnn
@requires_headers()
@pytest.mark.parametrize(("cls", "c_name"), ENUMS, ids=[c.__name__ for c, _ in ENUMS])
def test_enum_matches_header(cls, c_name: str) -> None:
    want = _header_members(c_name)
    got = {name: int(member) for name, member in cls.__members__.items()}
    assert got == want


@requires_cudnn
@requires_headers()
@pytest.mark.parametrize("define", sorted(enums.C_DEFINES))
def test_define_matches_header(define: str) -> None:
    text = parse_headers().defines[define].replace("U", "")
    assert eval(text, {"__builtins__": {}}) == enums.C_DEFINES[define]  # noqa: S307 - "(1 << 0)" style


@requires_cudnn
@pytest.mark.parametrize("status", [s for s in cb.Status if s.name == cb.Status(int(s)).name])
def test_status_names_match_cudnn_error_strings(status: cb.Status) -> None:
    text = raw.get_error_string(status)
    assert text == f"CUDNN_STATUS_{status.name}"


def test_names_from_the_design() -> None:
    assert cb.RNNMode.LSTM == 2 and cb.RNNMode.RNN_RELU == 0 and cb.RNNMode.GRU == 3
    assert cb.DirectionMode.BIDIRECTIONAL == 1
    assert cb.DataType.FLOAT == 0 and cb.DataType.DOUBLE == 1 and cb.DataType.HALF == 2
    assert cb.RNNDataLayout.SEQ_MAJOR_UNPACKED == 0
    assert cb.RNNBiasMode.DOUBLE_BIAS == 2 and cb.RNNBiasMode.SINGLE_REC_BIAS == 3
    assert cb.RNNInputMode.LINEAR_INPUT == 0 and cb.RNNAlgo.STANDARD == 0
    assert cb.MathType.DEFAULT_MATH == 0 and cb.ForwardMode.TRAINING == 1 and cb.WgradMode.ADD == 0
    assert cb.Status.BAD_PARAM == 2000
    assert enums.RNN_PADDED_IO_ENABLED == 1 and enums.RNN_PADDED_IO_DISABLED == 0


def test_deprecated_aliases_resolve_to_current_names() -> None:
    assert cb.Status.ALLOC_FAILED is cb.Status.INTERNAL_ERROR_HOST_ALLOCATION_FAILED
    assert cb.Status(3007).name == "NOT_SUPPORTED_ARCH_MISMATCH"


@pytest.mark.parametrize(("names", "prefix"), [
    (["RNN_RELU", "RNN_TANH", "LSTM", "GRU"], ""),
    (["RNN_NO_BIAS", "RNN_DOUBLE_BIAS"], "RNN_"),
    (["RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED", "RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED"], "RNN_DATA_LAYOUT_"),
    (["STATUS_SUCCESS", "STATUS_BAD_PARAM", "STATUS_BAD_PARAM_NULL_POINTER"], "STATUS_"),
    (["RNN_CLIP_NONE", "RNN_CLIP_MINMAX"], "RNN_CLIP_"),
])
def test_shared_prefix_rule(names: list[str], prefix: str) -> None:
    assert shared_prefix(names) == prefix
