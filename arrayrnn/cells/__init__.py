"""Cells written through the public cell API (:class:`arrayrnn.Cell`), registered when arrayrnn imports:
``mode="cifg"`` (:mod:`.cifg`) and ``mode="slstm"`` (:mod:`.slstm`). Each is one short file; a new cell of
your own is written the same way, outside this package."""

from . import cifg, slstm

__all__ = ["cifg", "slstm"]
