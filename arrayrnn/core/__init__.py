"""The data model: what a recurrent stack is and how its weights are stored and exchanged.

:mod:`.spec` (``RNNSpec``), :mod:`.layout` (the canonical block layout), :mod:`.params` (``PackedParams``:
one flat buffer with named views), :mod:`.backend` (``get_xp``: NumPy or CuPy), :mod:`.io` and
:mod:`.npzfile` (files), :mod:`.interop` (PyTorch's weight names) and :mod:`.errors`. Nothing here imports
another part of arrayrnn.
"""
