"""``arrayrnn.distributed``: the public path of :mod:`arrayrnn.training.distributed`
(the same module object)."""

import sys

from .training import distributed

sys.modules[__name__] = distributed
