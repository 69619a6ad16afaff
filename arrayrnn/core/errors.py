"""Exceptions of arrayrnn that are not plain ValueError / TypeError."""


class EngineUnavailableError(RuntimeError):
    """A known engine cannot run here (numba or cupy not installed, no GPU, cuDNN missing)."""


class FormatConversionWarning(UserWarning):
    """Params were converted to an engine's own weight format for one call (once per format pair)."""
