"""Embedding in other frameworks: :mod:`.torch` (``torch.nn.Module``s) and :mod:`.jax` (``jax.custom_vjp``).

Each imports its framework, so neither is imported here. Public paths: ``arrayrnn.torch``, ``arrayrnn.jax``.
"""
