"""Module weights kept as consecutive views of ONE buffer: the drop-in sequence modules and cells share it.

A module lists its weights' attribute names in ``_flat_weights_names`` (``nn.RNNBase`` has the list; a
cell module defines it). :meth:`OneBuffer.flatten_parameters` puts plain ``nn.Parameter``\\ s into one
buffer in that order (their ``.data`` become views of it), :attr:`OneBuffer.flat` is that buffer and
:attr:`OneBuffer.flat_grad` the one gradient buffer a backward writes (every ``weight.grad`` a view).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from . import torch_call
from .torch_errors import InputError


class OneBuffer:
    """The one-buffer weights of a ``torch.nn.Module`` subclass (a mixin before the torch class)."""

    _flat_weights_names: list[str]

    def flatten_parameters(self) -> None:
        """Put the weights into one buffer (their views) if they are not there; a no-op when they are.

        Called by the constructor and after ``module.to()`` / ``.double()`` / ``.cuda()``. Weights that
        are not plain ``nn.Parameter``\\ s (``weight_norm``, pruning, ``parametrize``) stay as they are;
        the forward concatenates them for each call.
        """
        weights = [getattr(self, name, None) for name in self._flat_weights_names]
        if not all(isinstance(w, torch.nn.Parameter) for w in weights):
            return
        if len({(w.dtype, w.device) for w in weights}) != 1 or self._in_one_buffer(weights):
            return
        flat = torch.empty(sum(w.numel() for w in weights), dtype=weights[0].dtype, device=weights[0].device)
        offset = 0
        with torch.no_grad():
            for w in weights:
                view = flat[offset:offset + w.numel()].view(w.shape)
                view.copy_(w)
                w.data = view
                offset += w.numel()

    @property
    def flat(self) -> torch.Tensor:
        """The one weight buffer, canonical layout (a view sharing memory with the weights; no autograd)."""
        weights = self._weights()
        if not self._in_one_buffer(weights):
            self.flatten_parameters()
            weights = self._weights()
        if not self._in_one_buffer(weights):
            raise InputError("the weights are not views of one buffer (re-parametrised weights: weight_norm, "
                             "pruning or parametrize); remove the re-parametrisation first")
        return self._flat_from(weights[0].detach())

    @property
    def flat_grad(self) -> torch.Tensor | None:
        """The one gradient buffer after a backward (every ``weight.grad`` is a view into it), or None
        before one; a concatenated copy if the gradients were replaced by tensors of their own."""
        grads = [getattr(w, "grad", None) for w in self._weights()]
        if any(g is None for g in grads):
            return None
        if self._in_one_buffer(grads):
            return self._flat_from(grads[0])
        return torch.cat([g.reshape(-1) for g in grads])

    def _weights(self) -> list[torch.Tensor]:
        return [getattr(self, name) for name in self._flat_weights_names]

    def _in_one_buffer(self, tensors: Sequence[Any]) -> bool:
        """True when ``tensors`` are consecutive contiguous views of one storage, in weight order."""
        first = tensors[0]
        if not all(isinstance(t, torch.Tensor) and not torch_call.is_transformed(t) for t in tensors):
            return False
        if first.device.type == "meta":
            return False
        ptr, offset = first.untyped_storage().data_ptr(), first.storage_offset()
        for t in tensors:
            if (t.dtype != first.dtype or not t.is_contiguous() or t.untyped_storage().data_ptr() != ptr
                    or t.storage_offset() != offset):
                return False
            offset += t.numel()
        return True

    def _flat_from(self, first: torch.Tensor) -> torch.Tensor:
        total = sum(w.numel() for w in self._weights())
        return first.as_strided((total,), (1,), first.storage_offset())
