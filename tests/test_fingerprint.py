"""arrayrnn.core.fingerprint: equal values give equal fingerprints (zeros of either sign, NaN of any payload),
any other write changes it; the CUDA kernel equals the NumPy arithmetic on a GPU."""

from __future__ import annotations

import numpy as np
import pytest
from support.engine_cases import gpu_cases

from arrayrnn.core import fingerprint as fp

DTYPES = ["float16", "float32", "float64"]


def _data(dtype, n=1000, seed=0):
    return np.random.default_rng(seed).standard_normal(n).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_equal_values_give_equal_fingerprints(dtype):
    a = _data(dtype)
    a[3], a[7] = 0.0, np.nan
    b = a.copy()
    b[3] = -0.0
    bits = b.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[b.itemsize])
    bits[7] |= 1  # another NaN payload
    assert np.isnan(b[7])
    assert fp.fingerprint_host(a) == fp.fingerprint_host(b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_any_changed_value_or_swap_changes_the_fingerprint(dtype):
    a = _data(dtype)
    base = fp.fingerprint_host(a)
    for change in (lambda v: v.__setitem__(999, v[999] * 2), lambda v: v.__setitem__(0, np.nan),
                   lambda v: v.__setitem__([1, 2], v[[2, 1]]), lambda v: v.__setitem__(5, np.inf)):
        b = a.copy()
        change(b)
        assert not np.array_equal(a, b, equal_nan=True)
        assert fp.fingerprint_host(b) != base


def test_accumulate_adds_into_a_slot_and_refuses_what_it_cannot_hash():
    a = _data("float32")
    slots = np.zeros(2, np.uint64)
    fp.accumulate(a, slots, 0, np)
    fp.accumulate(a, slots, 1, np)
    assert slots[0] == slots[1] == fp.fingerprint_host(a)
    for bad in (np.zeros((2, 2), np.float32), np.zeros(4, np.int32), np.zeros(8, np.float32)[::2]):
        with pytest.raises(ValueError, match="expected a contiguous 1-D float16, float32 or float64 buffer"):
            fp.accumulate(bad, slots, 0, np)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_cuda_kernel_equals_the_numpy_arithmetic(dtype):
    if not gpu_cases():
        pytest.skip("no CUDA GPU with CuPy here")
    import cupy

    for n in (1, 31, 1000, 3_000_001):
        a = _data(dtype, n, seed=n)
        a[0] = -0.0
        out = cupy.zeros(2, np.uint64)
        fp.accumulate(cupy.asarray(a), out, 1, cupy)
        assert out.get().tolist() == [0, int(fp.fingerprint_host(a))], n
