"""``arrayrnn.activations``: the public path of :mod:`arrayrnn.autodiff.activations`
(the same module object)."""

import sys

from .autodiff import activations

sys.modules[__name__] = activations
