"""The exceptions of cudnn_bindings (``check``, which raises them, lives in `raw`, beside the calls)."""

from __future__ import annotations

__all__ = ["CudnnError", "CudnnLibraryError", "status_name"]


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
