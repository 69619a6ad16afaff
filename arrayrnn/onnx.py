"""``arrayrnn.onnx``: the public path of :mod:`arrayrnn.adapters.onnx` (the same module object)."""

import sys

from .adapters import onnx

sys.modules[__name__] = onnx
