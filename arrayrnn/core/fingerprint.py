"""A 64-bit fingerprint of a floating buffer's values, computed where the buffer lives, without a copy.

Roughly::

    fp = sum(splitmix64(canonical_bits(x[i]) ^ (i * GOLDEN)) for i in range(x.size))  mod 2**64

where ``canonical_bits`` is the element's bit pattern with every zero (``0.0``, ``-0.0``) mapped to 0 and
every NaN to all ones, so that a write leaving every value equal (NaN equal to NaN) leaves the fingerprint
unchanged, and any other write changes it except with probability about ``2**-64``. The position enters the
hash, so swapping two elements changes it too.

On CuPy arrays :func:`accumulate` is ONE kernel launch (a grid-stride loop, a warp sum, one 64-bit atomic
add per warp) that adds the fingerprint into a ``uint64`` slot on the device, nothing copied to the host.
:func:`fingerprint_host` is the same arithmetic in NumPy (the oracle of the kernel, and what an array module
without ``RawKernel`` runs, such as the tests' CPU stand-in for CuPy).
"""

from __future__ import annotations

from functools import lru_cache
from types import ModuleType
from typing import Any

import numpy as np

GOLDEN = 0x9E3779B97F4A7C15
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
# per width: (unsigned type, sign-cleared mask, exponent mask, mantissa mask)
_BITS = {2: (np.uint16, 0x7FFF, 0x7C00, 0x03FF),
         4: (np.uint32, 0x7FFFFFFF, 0x7F800000, 0x007FFFFF),
         8: (np.uint64, 0x7FFFFFFFFFFFFFFF, 0x7FF0000000000000, 0x000FFFFFFFFFFFFF)}
_C_TYPES = {2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}
_BLOCK = 256
_MAX_BLOCKS = 1024


def _check(data: Any) -> int:
    dtype = data.dtype
    if dtype.kind != "f" or dtype.itemsize not in _BITS or data.ndim != 1 or not data.flags.c_contiguous:
        raise ValueError(f"fingerprint of an array of dtype {data.dtype}, shape {tuple(data.shape)}; "
                         "expected a contiguous 1-D float16, float32 or float64 buffer")
    return dtype.itemsize


def fingerprint_host(data: Any, xp: ModuleType = np) -> Any:
    """The fingerprint as a 0-d ``uint64`` of ``xp`` (NumPy arithmetic on ``xp``'s arrays)."""
    unsigned, magnitude, exponent, mantissa = _BITS[_check(data)]
    bits = data.view(unsigned)
    nan = ((bits & unsigned(exponent)) == unsigned(exponent)) & ((bits & unsigned(mantissa)) != 0)
    canon = xp.where((bits & unsigned(magnitude)) == 0, unsigned(0), bits).astype(np.uint64)
    canon = xp.where(nan, np.uint64(2**64 - 1 if unsigned is np.uint64 else np.iinfo(unsigned).max), canon)
    z = canon ^ (xp.arange(data.size, dtype=np.uint64) * np.uint64(GOLDEN))
    z = z + np.uint64(GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
    z = z ^ (z >> np.uint64(31))
    return z.sum(dtype=np.uint64)


_SOURCE = r"""
typedef {bits} bits_t;
extern "C" __global__ void arrayrnn_fingerprint(const bits_t* x, unsigned long long n,
                                                unsigned long long* out, int slot) {{
    const bits_t magnitude = (bits_t){magnitude}ULL, exponent = (bits_t){exponent}ULL,
                 mantissa = (bits_t){mantissa}ULL;
    unsigned long long acc = 0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {{
        bits_t b = x[i];
        unsigned long long c = b;
        if ((b & magnitude) == 0) c = 0;
        else if ((b & exponent) == exponent && (b & mantissa) != 0)
            c = (unsigned long long)(bits_t)~(bits_t)0;
        unsigned long long z = (c ^ (i * {golden}ULL)) + {golden}ULL;
        z = (z ^ (z >> 30)) * {mix1}ULL;
        z = (z ^ (z >> 27)) * {mix2}ULL;
        acc += z ^ (z >> 31);
    }}
    for (int offset = 16; offset > 0; offset >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, offset);
    if ((threadIdx.x & 31) == 0) atomicAdd(out + slot, acc);
}}
"""


@lru_cache(maxsize=8)
def _kernel(cupy: ModuleType, itemsize: int) -> Any:
    _, magnitude, exponent, mantissa = _BITS[itemsize]
    code = _SOURCE.format(bits=_C_TYPES[itemsize], magnitude=magnitude, exponent=exponent, mantissa=mantissa,
                          golden=GOLDEN, mix1=_MIX1, mix2=_MIX2)
    return cupy.RawKernel(code, "arrayrnn_fingerprint")


def accumulate(data: Any, out: Any, slot: int, xp: ModuleType) -> None:
    """Add the fingerprint of ``data`` (a contiguous 1-D float buffer of ``xp``) into ``out[slot]``, ``out``
    a contiguous ``uint64`` array of ``xp`` (zero the slot first for the fingerprint itself); asynchronous
    on the device."""
    itemsize = _check(data)
    if not hasattr(xp, "RawKernel"):  # an array module without custom kernels: NumPy arithmetic on it
        out[slot:slot + 1] += fingerprint_host(data, xp)
        return
    blocks = max(1, min(_MAX_BLOCKS, -(-data.size // _BLOCK)))
    _kernel(xp, itemsize)((blocks,), (_BLOCK,), (data, np.uint64(data.size), out, np.int32(slot)))
