"""``arrayrnn.optim``: the public path of :mod:`arrayrnn.training.optim` (the same module object)."""

import sys

from .training import optim

sys.modules[__name__] = optim
