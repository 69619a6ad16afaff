"""``arrayrnn.torch``: the public path of :mod:`arrayrnn.adapters.torch` (the same module object)."""

import sys

from .adapters import torch

sys.modules[__name__] = torch
