"""Adding a computed gradient to a parameter's ``.grad``."""

from __future__ import annotations

import torch
from torch import Tensor


@torch.no_grad()
def add_to_grad_(param: Tensor, grad: Tensor) -> None:
    """Adds ``grad`` to ``param.grad`` in place, creating it when backward left none.

    ``grad`` is cast to the gradient's dtype (the parameter's when there is no gradient yet), so an injected term
    computed in float32 or float64 lands in a bf16 or float32 model unchanged in meaning.
    """
    if param.grad is None:
        param.grad = grad.to(param.dtype).clone()
    else:
        param.grad.add_(grad.to(param.grad.dtype))


__all__ = ["add_to_grad_"]
