"""``arrayrnn.nn``: the public path of :mod:`arrayrnn.training.nn` (the same module object)."""

import sys

from .training import nn

sys.modules[__name__] = nn
