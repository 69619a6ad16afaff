"""The shared engine-parametrized suites of ``tests/`` on the cupy engine, end to end on CPU.

The same test bodies as ``tests/test_rnn_semantics.py``, ``test_rnn_gradcheck.py``,
``test_rnn_properties.py``, ``test_cell_variants.py``, the engine-parametrized test of
``test_engine_seam.py`` and those of ``test_cell_step.py`` (a cell step on the cupy engine's kernels),
collected here again with this directory's ``engine`` fixture: ``engine="cupy"`` through the public
``rnn_forward`` / ``rnn_backward`` (``cell_step`` / ``cell_step_backward``) on CuPy stand-in arrays
(tests/support/fake_cupy.py), so the engine's CuPy branch runs — ``CupyEngine.check``, the kernels'
arguments packed from ``__cuda_array_interface__``, every time loop captured into a graph at its first
call and replayed (the stand-in refuses allocation, host reads and synchronisation inside a capture), the
launches on CuPy's current stream, ``cupy.matmul(out=)`` — with its kernels in numba's simulator
(tests/support/cupy_sim.py).
"""

from __future__ import annotations

import numpy as np
from support import fake_cupy
from support.rnn_cases import forward_backward, host, make_case
from test_cell_step import (  # noqa: F401 - collected here with this directory's engine fixture
    test_a_backward_after_an_inference_step_recomputes_it,
    test_a_step_equals_a_one_step_sequence,
    test_every_step_gradient_entry_equals_central_differences,
)
from test_cell_variants import (  # noqa: F401 - collected here with this directory's engine fixture
    test_all_states_of_a_plain_stack_are_its_layers_outputs,
    test_each_variant_changes_the_result_and_dropouts_only_in_training,
    test_every_gradient_entry_equals_central_differences,
    test_values_and_every_gradient_equal_the_scan_oracle,
)
from test_engine_seam import (  # noqa: F401 - collected here with this directory's engine fixture
    permuted,
    test_dropout_masks_are_the_same_on_a_whole_stack_engine_and_the_driver,
)
from test_rnn_gradcheck import test_central_differences  # noqa: F401
from test_rnn_properties import (  # noqa: F401
    test_chunks_equal_whole_sequence,
    test_rows_are_independent,
    test_zero_length_rows_pass_state_through,
)
from test_rnn_semantics import *  # noqa: F403 - every test of the suite

from arrayrnn import RNNSpec


def test_the_cupy_branch_ran_on_cupys_current_stream(engine):
    """Inside a non-default CuPy stream every operation of a call goes to that stream (each time loop as
    one graph launch; its nodes were captured on the engine's own capture stream), and the results are
    CuPy arrays."""
    spec = RNNSpec(mode="gru", input_size=3, hidden_size=4, bidirectional=True, dtype="float64")
    case = make_case(spec, 4, 3, lengths="zeros")
    with engine.xp.cuda.Stream() as stream, fake_cupy.issued() as log:
        res, g = forward_backward(case, engine)
    ran = [op for op in log if not op[2]]
    captured = {op[1] for op in log if op[2]}
    assert {op[1] for op in ran} == {stream.ptr}
    assert [op.name for op in ran].count("graph_launch") == 4  # 2 directions x (forward, backward)
    assert "host_func" not in [op.name for op in ran]  # no kernel launched outside a graph
    assert len(captured) == 1 and stream.ptr not in captured
    assert isinstance(res.y, engine.xp.ndarray) and isinstance(g.dparams.data, engine.xp.ndarray)
    assert np.isfinite(host(g.dx)).all()
