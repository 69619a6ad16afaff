"""Central-difference gradient checks (float64) for what PyTorch lacks: reset-before GRU, single-bias modes,
cell clipping, zero-length rows, dropout with a fixed seed, the example custom cells (CIFG, sLSTM). Every
entry of every gradient is checked.

On GPU array modules (a GPU, or its CPU stand-ins: the cuDNN dry run, the cupy engine in the CUDA
simulator), where one forward costs milliseconds instead of microseconds, every gradient is checked along
``DIRECTIONS`` random directions instead of entry by entry: ``<analytic, v>`` against the central
difference along ``v`` (every entry enters each of them, so a wrong entry fails the test)."""

from __future__ import annotations

import pytest
from support.gradcheck_cases import CASES, CUSTOM_CELL_CASES, check_central_differences

ALL_CASES = CASES + CUSTOM_CELL_CASES


@pytest.mark.parametrize("case_id, fields, T, B, lengths, kw", ALL_CASES, ids=[c[0] for c in ALL_CASES])
def test_central_differences(case_id, fields, T, B, lengths, kw, engine):
    check_central_differences(case_id, fields, T, B, lengths, kw, engine)
