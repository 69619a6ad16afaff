"""The numba engine's cell variants beyond tests/test_cell_variants.py (whose engine fixture runs numba on
every case there): projection with DropConnect, relu with recurrent dropout, the reset-before GRU with both
biases, against the scan oracle (tests/support/variant_checks.py) and float64 central differences; and cell
clipping together with the variants, against central differences only (the scan oracle has no clipping)."""

from __future__ import annotations

import numpy as np
import pytest
from support.engine_cases import EngineOnDevice
from support.variant_checks import check_against_the_scan_oracle, check_central_differences

NUMBA = EngineOnDevice("numba", np)

# id, spec fields, T, B, lengths
CASES = [
    ("lstm-proj-drops", dict(mode="lstm", proj_size=2, recurrent_dropout=0.5, weight_dropout=0.2), 4, 3,
     "zeros"),
    ("rnn_relu-drops", dict(mode="rnn_relu", recurrent_dropout=0.5, weight_dropout=0.3, zoneout=0.3), 4, 2,
     "unsorted"),
    ("gru-reset-before-zone-bi", dict(mode="gru", reset_after=False, bidirectional=True,
                                      recurrent_dropout=0.4, zoneout=0.4), 4, 3, "unsorted"),
]
CLIPPED = [
    ("lstm-proj-clip-drop", dict(mode="lstm", proj_size=2, recurrent_dropout=0.5, cell_clip=(-0.8, 0.8)),
     4, 3, "zeros"),
    ("lstm-clip-zone-peep", dict(mode="lstm", zoneout=0.4, zoneout_cell=0.5, peepholes=True,
                                 cell_clip=(-0.5, 0.5)), 4, 3, "zeros"),
]


def _ids(cases):
    return [c[0] for c in cases]


@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
@pytest.mark.parametrize("case_id, fields, T, B, lengths", CASES, ids=_ids(CASES))
def test_values_and_every_gradient_equal_the_scan_oracle(case_id, fields, T, B, lengths, training):
    check_against_the_scan_oracle(case_id, fields, T, B, lengths, training, NUMBA)


@pytest.mark.parametrize("case_id, fields, T, B, lengths", CASES + CLIPPED, ids=_ids(CASES + CLIPPED))
def test_every_gradient_entry_equals_central_differences(case_id, fields, T, B, lengths):
    check_central_differences(case_id, fields, T, B, lengths, NUMBA)
