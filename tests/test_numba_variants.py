"""The cell variants the numba engine runs (recurrent dropout, DropConnect on W_hh, zoneout,
``return_all_states``) through the shared bodies of tests/test_cell_variants.py, against its scan oracle and
float64 central differences; that file's fixture takes an engine only once it runs every variant."""

from __future__ import annotations

import numpy as np
import pytest
import test_cell_variants as shared
from support.engine_cases import EngineOnDevice

from arrayrnn import RNNSpec
from arrayrnn.engines import engine_unavailable_reason, probe_call

NUMBA = EngineOnDevice("numba", np)

# id, spec fields, T, B, lengths (every mode, both GRU forms, projection, several layers and directions)
CASES = [
    ("lstm-drops-bi-2l", dict(mode="lstm", num_layers=2, bidirectional=True, recurrent_dropout=0.3,
                              weight_dropout=0.4, dropout=0.3), 4, 3, "unsorted"),
    ("lstm-proj-drop", dict(mode="lstm", proj_size=2, recurrent_dropout=0.5, weight_dropout=0.2), 4, 3,
     "zeros"),
    ("lstm-plain-all-states", dict(mode="lstm", bidirectional=True), 3, 3, "unsorted"),
    ("gru-drops-bi", dict(mode="gru", bidirectional=True, recurrent_dropout=0.4, weight_dropout=0.3), 4, 3,
     "unsorted"),
    ("gru-reset-before-2l", dict(mode="gru", reset_after=False, num_layers=2, recurrent_dropout=0.4,
                                 weight_dropout=0.3, bias="single_rec"), 4, 2, "zeros"),
    ("rnn_tanh-drops", dict(mode="rnn_tanh", num_layers=2, bidirectional=True, recurrent_dropout=0.4,
                            weight_dropout=0.3), 3, 3, "unsorted"),
    ("rnn_relu-drop", dict(mode="rnn_relu", recurrent_dropout=0.5, bias="single_inp"), 4, 2, "full"),
    ("lstm-zone-drops-bi-2l", dict(mode="lstm", num_layers=2, bidirectional=True, recurrent_dropout=0.3,
                                   weight_dropout=0.4, zoneout=0.3, zoneout_cell=0.5, dropout=0.3), 4, 3,
     "unsorted"),
    ("lstm-proj-zone", dict(mode="lstm", proj_size=2, zoneout=0.4, recurrent_dropout=0.5), 4, 3, "zeros"),
    ("lstm-zoneout-h-only", dict(mode="lstm", zoneout=0.5, zoneout_cell=0.0, bidirectional=True), 3, 3,
     "zeros"),
    ("gru-zone-bi", dict(mode="gru", bidirectional=True, recurrent_dropout=0.4, zoneout=0.4), 4, 3,
     "unsorted"),
    ("gru-reset-before-zone", dict(mode="gru", reset_after=False, num_layers=2, recurrent_dropout=0.4,
                                   weight_dropout=0.3, zoneout=0.4), 4, 2, "zeros"),
    ("rnn_tanh-zone", dict(mode="rnn_tanh", bidirectional=True, recurrent_dropout=0.4, zoneout=0.4), 3, 3,
     "unsorted"),
    ("rnn_relu-zoneout", dict(mode="rnn_relu", zoneout=0.5, bias="single_inp"), 4, 2, "full"),
]
IDS = [c[0] for c in CASES]
# the scan oracle has no cell clipping: clipped cells against central differences only
CLIPPED = [("lstm-proj-clip-drop", dict(mode="lstm", proj_size=2, recurrent_dropout=0.5,
                                        cell_clip=(-0.8, 0.8)), 4, 3, "zeros"),
           ("lstm-clip-zone", dict(mode="lstm", zoneout=0.4, zoneout_cell=0.5, cell_clip=(-0.5, 0.5)), 4, 3,
            "zeros")]


@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
@pytest.mark.parametrize("case_id, fields, T, B, lengths", CASES, ids=IDS)
def test_values_and_every_gradient_equal_the_scan_oracle(case_id, fields, T, B, lengths, training):
    shared.test_values_and_every_gradient_equal_the_scan_oracle(case_id, fields, T, B, lengths, training,
                                                                NUMBA)


@pytest.mark.parametrize("case_id, fields, T, B, lengths", CASES + CLIPPED, ids=IDS + [c[0] for c in CLIPPED])
def test_every_gradient_entry_equals_central_differences(case_id, fields, T, B, lengths):
    shared.test_every_gradient_entry_equals_central_differences(case_id, fields, T, B, lengths, NUMBA)


@pytest.mark.parametrize("field, value", [("recurrent_dropout", 0.5), ("weight_dropout", 0.5),
                                          ("zoneout", 0.5), ("zoneout_cell", 0.5)])
def test_each_variant_changes_the_result_and_dropouts_only_in_training(field, value):
    shared.test_each_variant_changes_the_result_and_dropouts_only_in_training(field, value, NUMBA)


def test_all_states_of_a_plain_stack_are_its_layers_outputs():
    shared.test_all_states_of_a_plain_stack_are_its_layers_outputs(NUMBA)


def test_the_numba_engine_accepts_its_variants_and_names_the_others_it_declines():
    spec = RNNSpec("lstm", 2, 3, recurrent_dropout=0.5, weight_dropout=0.5, dtype="float64")
    assert engine_unavailable_reason("numba", probe_call(spec, training=True, all_states=True)) is None
    reason = engine_unavailable_reason("numba", probe_call(spec.replace(zoneout=0.1, peepholes=True),
                                                           training=True, all_states=True))
    assert reason is not None and reason.startswith("peepholes=True: not yet on the numba engine")
