"""Properties (hypothesis): rows are independent, zero-length rows pass their state through, and a sequence
run in chunks (truncated BPTT) equals one call, forward and backward."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from support.rnn_properties import (
    SETTINGS,
    check_chunks_equal_whole_sequence,
    check_rows_are_independent,
    check_zero_length_rows_pass_state_through,
    specs,
)


@SETTINGS
@given(data=st.data(), spec=specs(), T=st.integers(1, 5), B=st.integers(1, 4), seed=st.integers(0, 1000))
def test_rows_are_independent(engine, data, spec, T, B, seed):
    check_rows_are_independent(engine, data, spec, T, B, seed)


@SETTINGS
@given(data=st.data(), spec=specs(), T=st.integers(1, 5), B=st.integers(1, 4), seed=st.integers(0, 1000))
def test_zero_length_rows_pass_state_through(engine, data, spec, T, B, seed):
    check_zero_length_rows_pass_state_through(engine, data, spec, T, B, seed)


@SETTINGS
@given(data=st.data(), spec=specs(bidirectional=False), T=st.integers(2, 7), B=st.integers(1, 3),
       seed=st.integers(0, 1000))
def test_chunks_equal_whole_sequence(engine, data, spec, T, B, seed):
    check_chunks_equal_whole_sequence(engine, data, spec, T, B, seed)
