"""``arrayrnn.jax``: the public path of :mod:`arrayrnn.adapters.jax` (the same module object)."""

import sys

from .adapters import jax

sys.modules[__name__] = jax
