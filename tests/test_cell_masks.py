"""``ar.cell_masks``: the masks of the cell variants, checked against its docstring's formula written
independently here with Python integers."""

from __future__ import annotations

import numpy as np
import pytest

import arrayrnn as ar
from arrayrnn.frontend.dropout import dropout_masks

M64 = (1 << 64) - 1


def mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def documented(seed: int, stream: int, shape: tuple[int, ...]) -> np.ndarray:
    key = mix((mix(seed) + stream) & M64)
    count = int(np.prod(shape))
    return np.array([(mix((key + (i + 1) * 0x9E3779B97F4A7C15) & M64) >> 11) / 2**53
                     for i in range(count)]).reshape(shape)


SPEC = ar.RNNSpec("lstm", 3, 4, num_layers=2, bidirectional=True, proj_size=2, recurrent_dropout=0.3,
                  weight_dropout=0.4, zoneout=0.2, zoneout_cell=0.6, dtype="float64")


def test_training_masks_follow_the_documented_formula():
    seed, B, T = 17, 3, 5
    m = ar.cell_masks(SPEC, seed, B, T)
    kd = 4
    np.testing.assert_array_equal(m.recurrent, (documented(seed, 1, (kd, B, 2)) >= 0.3) / 0.7)
    np.testing.assert_array_equal(m.weight, (documented(seed, 2, (kd, 16, 2)) >= 0.4) / 0.6)
    np.testing.assert_array_equal(m.zoneout_h, documented(seed, 3, (kd, T, B, 2)) < 0.2)
    np.testing.assert_array_equal(m.zoneout_c, documented(seed, 4, (kd, T, B, 4)) < 0.6)
    assert all(a.dtype == np.float64 for a in m)


def test_inference_has_zoneout_expectations_and_no_dropout():
    m = ar.cell_masks(SPEC, 17, 3, 5, training=False)
    assert m.recurrent is None and m.weight is None
    assert np.all(m.zoneout_h == 0.2) and m.zoneout_h.shape == (4, 5, 3, 2)
    assert np.all(m.zoneout_c == 0.6) and m.zoneout_c.shape == (4, 5, 3, 4)
    assert ar.cell_masks(SPEC.replace(zoneout=0.0, zoneout_cell=0.0), 1, 3, 5, training=False) is None


def test_no_masks_without_variants_and_gru_has_no_cell_mask():
    assert ar.cell_masks(ar.RNNSpec("lstm", 3, 4), 0, 2, 2) is None
    m = ar.cell_masks(ar.RNNSpec("gru", 3, 4, zoneout=0.5), 0, 2, 2)
    assert m.zoneout_c is None and m.recurrent is None and m.zoneout_h.shape == (1, 2, 2, 4)


def test_seeds_and_streams_are_independent():
    a, b = ar.cell_masks(SPEC, 1, 8, 6), ar.cell_masks(SPEC, 2, 8, 6)
    assert not np.array_equal(a.zoneout_h, b.zoneout_h)
    np.testing.assert_array_equal(a.zoneout_h, ar.cell_masks(SPEC, 1, 8, 6).zoneout_h)
    # the streams differ from each other and from the inter-layer dropout's
    spec = SPEC.replace(dropout=0.5, recurrent_dropout=0.5, zoneout=0.5, zoneout_cell=0.5)
    m = ar.cell_masks(spec, 1, 8, 6)
    inter = dropout_masks(spec, 6, 8, 1)[0] > 0
    assert not np.array_equal(m.zoneout_h[0], m.zoneout_c[0, ..., :2])
    assert not np.array_equal(m.zoneout_h[:2].transpose(1, 2, 0, 3).reshape(6, 8, 4) > 0, inter)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_rates(p):
    spec = ar.RNNSpec("gru", 3, 64, recurrent_dropout=p, weight_dropout=p, zoneout=p)
    m = ar.cell_masks(spec, 3, 64, 50)
    assert abs((m.recurrent == 0).mean() - p) < 0.05 and abs((m.weight == 0).mean() - p) < 0.02
    assert abs(m.zoneout_h.mean() - p) < 0.01
    assert set(np.unique(m.recurrent)) <= {0.0, np.float32(1 / (1 - p))}


@pytest.mark.parametrize("key", [0, 1, 2**63 + 5, 2**64 - 1])
@pytest.mark.parametrize("start", [0, 7, 2**40])
def test_the_host_loop_draws_the_bits_of_the_array_formula(key, start):
    """The compiled host generator (NumPy) and the array-operation one (CuPy's path) give the same bits."""
    from arrayrnn.frontend import dropout

    np.testing.assert_array_equal(dropout.uniform(np, key, start, 1031),
                                  dropout.uniform_arrays(np, key, start, 1031))


@pytest.mark.parametrize(("batch", "seq_len", "exc", "message"), [
    (3, 2.5, TypeError, r"seq_len = 2\.5 has type float; expected a non-negative int"),
    (3.0, 5, TypeError, r"batch = 3\.0 has type float; expected a non-negative int"),
    (True, 5, TypeError, r"batch = True has type bool; expected a non-negative int"),
    ("3", 5, TypeError, r"batch = '3' has type str; expected a non-negative int"),
    (-1, 5, ValueError, r"batch = -1; expected a non-negative int"),
    (3, -2, ValueError, r"seq_len = -2; expected a non-negative int"),
])
def test_sizes_that_are_not_non_negative_ints_are_named(batch, seq_len, exc, message):
    with pytest.raises(exc, match=message):
        ar.cell_masks(SPEC, 1, batch, seq_len)


def test_numpy_integer_sizes_are_sizes():
    expected = ar.cell_masks(SPEC, 1, 3, 5)
    got = ar.cell_masks(SPEC, 1, np.int64(3), np.uint8(5))
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)
