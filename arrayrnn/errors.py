"""Exceptions of arrayrnn that are not plain ValueError / TypeError."""


class EngineUnavailableError(RuntimeError):
    """A known engine cannot run here (numba or cupy not installed, no GPU, cuDNN missing)."""
