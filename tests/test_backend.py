import numpy as np
import pytest
import torch

from arrayrnn import as_array, get_xp
from arrayrnn.core import backend


def test_numpy_arrays_give_numpy_and_none_is_skipped():
    a = np.zeros(3, dtype=np.float32)
    assert get_xp(a, None, np.ones(2, dtype=np.int64)) is np
    assert get_xp() is np and get_xp(None) is np


def test_mixed_float_dtypes_are_a_type_error_naming_both():
    with pytest.raises(TypeError, match=r"x \(numpy.ndarray, dtype float32, on cpu\) and h0 "
                                        r"\(numpy.ndarray, dtype float64, on cpu\) have different dtypes"):
        get_xp(np.zeros(2, np.float32), np.zeros(2, np.float64), names=("x", "h0"))
    with pytest.raises(TypeError, match=r"arrays\[0\] .* and arrays\[1\]"):
        get_xp(np.zeros(2, np.float32), np.zeros(2, np.float16))


def test_integer_arrays_do_not_take_part_in_the_dtype_check():
    assert get_xp(np.zeros(2, np.float64), np.zeros(2, np.int32), names=("x", "lengths")) is np


class _DeviceArray(np.ndarray):
    """A stand-in for a device array: not a plain ``np.ndarray`` (get_xp's host fast path skips it)."""


def test_mixed_devices_are_a_type_error(monkeypatch):
    gpu_like = np.zeros(2, np.float32).view(_DeviceArray)
    real, real_place = backend.device_of, backend._place
    monkeypatch.setattr(backend, "device_of", lambda a: "cuda:0" if a is gpu_like else real(a))
    monkeypatch.setattr(backend, "_place", lambda a: 0 if a is gpu_like else real_place(a))
    with pytest.raises(TypeError, match=r"x .* on cpu\) and params .* on cuda:0\) are on different devices"):
        get_xp(np.zeros(2, np.float32), gpu_like, names=("x", "params"))


def test_as_array_accepts_dlpack_and_array_interface_without_copy():
    t = torch.arange(4, dtype=torch.float32)
    a = as_array(t)
    assert isinstance(a, np.ndarray)
    a[0] = 9
    assert t[0].item() == 9

    class Interface:
        def __init__(self, base):
            self.base = base
            self.__array_interface__ = base.__array_interface__

    base = np.zeros(3)
    view = as_array(Interface(base))
    view[1] = 2
    assert base[1] == 2


def test_as_array_rejects_non_arrays_naming_the_argument():
    with pytest.raises(TypeError, match=r"x has type str; expected an array"):
        as_array("abc", "x")


def test_gpu_targets_without_cupy_are_clear(monkeypatch):
    monkeypatch.setattr(backend, "cupy_module", lambda: None)
    with pytest.raises(TypeError, match="CuPy is not installed"):
        backend.module_for("cuda:0")

    class FakeCuda:
        __cuda_array_interface__ = {"shape": (1,), "typestr": "<f4", "data": (0, False), "version": 3}

    with pytest.raises(TypeError, match="w lives on a GPU but CuPy is not installed"):
        as_array(FakeCuda(), "w")


def test_module_for_names():
    assert backend.module_for(np) is np and backend.module_for("cpu") is np
    with pytest.raises(ValueError, match=r"target = 3"):
        backend.module_for(3)


@pytest.mark.parametrize("make, words", [
    (lambda torch: torch.zeros(3, dtype=torch.bfloat16), r"dtype torch\.bfloat16 on device cpu"),
    (lambda torch: torch.zeros(3, device="meta"), r"dtype torch\.float32 on device meta"),
    (lambda torch: torch.zeros(3, dtype=torch.complex64).conj(), r"dtype torch\.complex64"),
])
def test_what_dlpack_cannot_carry_is_a_type_error_naming_the_argument(make, words):
    """These escaped as DLPack's own RuntimeError / ValueError / BufferError, naming nothing."""
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=rf"^x \(Tensor of {words}.*\) cannot be shared through DLPack: .*"
                                        r"convert first"):
        as_array(make(torch), "x")
