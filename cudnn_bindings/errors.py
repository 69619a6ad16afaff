"""Exceptions and the one ``check()`` every cuDNN status goes through."""

from __future__ import annotations

__all__ = ["CudnnError", "CudnnLibraryError", "check", "status_name"]


class CudnnLibraryError(RuntimeError):
    """libcudnn v9 could not be found, loaded or used (too old, missing symbol).

    The message lists every place that was searched and why each one failed.
    """


class CudnnError(RuntimeError):
    """A cuDNN call returned a status other than ``CUDNN_STATUS_SUCCESS``.

    Attributes: ``status`` (int), ``name`` (e.g. ``"CUDNN_STATUS_BAD_PARAM"``), ``function`` (the C function
    called) and ``detail`` (cuDNN's last error text, possibly empty).
    """

    def __init__(self, status: int, function: str, detail: str = "", hint: str = "") -> None:
        self.status = int(status)
        self.name = status_name(self.status)
        self.function = function
        self.detail = detail
        self.hint = hint
        text = f"{function} failed with {self.name} ({self.status})"
        text += f": {detail}" if detail else " (cuDNN gave no further detail)"
        if hint:
            text += f". {hint}"
        super().__init__(text)

    def __reduce__(self):  # keep the attributes through pickling (multiprocessing, pytest-xdist)
        return (type(self), (self.status, self.function, self.detail, self.hint))


def status_name(status: int) -> str:
    """The C name of a ``cudnnStatus_t`` value, e.g. ``2000 -> "CUDNN_STATUS_BAD_PARAM"``."""
    from .enums import Status

    try:
        return "CUDNN_STATUS_" + Status(status).name
    except ValueError:
        return f"CUDNN_STATUS_UNKNOWN({int(status)})"


def check(status: int, function: str, hint: str = "") -> None:
    """Raise `CudnnError` unless ``status`` is ``CUDNN_STATUS_SUCCESS``; reads cuDNN's last error text."""
    if status == 0:
        return
    from . import raw

    try:
        detail = raw.get_last_error_string()
    except Exception:  # the error is what matters; never mask it while describing it
        detail = ""
    raise CudnnError(status, function, detail, hint)
