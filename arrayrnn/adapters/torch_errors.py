"""The exception types of :mod:`arrayrnn.torch`: PyTorch's ``RuntimeError`` and arrayrnn's ``ValueError`` /
``TypeError`` at once, so callers catching either see what the modules refuse."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class InputError(RuntimeError, ValueError):
    """A bad input shape or value: a ``RuntimeError`` (as ``nn.LSTM`` raises) and a ``ValueError`` (as
    arrayrnn raises), so callers catching either see it."""


class InputTypeError(RuntimeError, TypeError):
    """A bad input type, dtype or device: a ``RuntimeError`` (as ``nn.LSTM`` raises) and a ``TypeError``
    (as arrayrnn raises)."""


@contextlib.contextmanager
def as_torch_errors() -> Iterator[None]:
    """arrayrnn's ValueError / TypeError as the hybrid types above (same message)."""
    try:
        yield
    except (InputError, InputTypeError):
        raise
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    except TypeError as exc:
        raise InputTypeError(str(exc)) from exc
