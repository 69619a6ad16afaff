"""``arrayrnn.cellmath``: the public path of :mod:`arrayrnn.engines.cellmath` (the same module object), the
math a custom cell's scalar functions call."""

import sys

from .engines import cellmath

sys.modules[__name__] = cellmath
