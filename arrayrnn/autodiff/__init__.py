"""A minimal reverse-mode autodiff core: a tape of primitives with hand-written VJP rules.

``value_and_grad`` / ``grad`` / ``vjp`` differentiate Python functions of arrays and PackedParams;
``ops`` holds the differentiable operations (the fused RNN and bias+activation ops are single nodes);
``primitive`` / ``defvjp`` add new ones; ``check_grads`` compares a function's gradients with central
differences.
"""

from . import ops
from .api import TracedParams, grad, value_and_grad, vjp
from .gradcheck import check_grads
from .tape import Meta, Primitive, Residuals, Traced, is_traced, primitive, unbroadcast, value_of

__all__ = [
    "Meta", "Primitive", "Residuals", "Traced", "TracedParams", "check_grads", "grad", "is_traced", "ops",
    "primitive", "unbroadcast", "value_and_grad", "value_of", "vjp",
]
