r"""APFL's parameter-space mixture and its two local updates (Deng, Kamani, Mahdavi 2020, arXiv:2003.13461).

With the client's personal model :math:`v`, its copy of the global model :math:`w` and the mixing weight
:math:`α \in [0, 1]`, the personalised model is :math:`\bar v = α v + (1 - α) w`, and with
:math:`g = \nabla f(\bar v)` (the gradient of the client's loss at :math:`\bar v`), one local step is

.. math::
    v \leftarrow v - η\,α\,g, \qquad
    α \leftarrow \operatorname{clip}_{[0, 1]}\bigl(α - η \langle g, v - w \rangle\bigr)

since :math:`\nabla_v f(\bar v) = α g` and :math:`\partial_α f(\bar v) = \langle g, v - w \rangle` (chain rule).
Both use the values of :math:`v, w` from before the step.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor


def mix(
    personal: Mapping[str, Tensor], global_params: Mapping[str, Tensor], alpha: float | Tensor
) -> dict[str, Tensor]:
    """:math:`\\bar v = α v + (1 - α) w`, entry by entry over the keys of ``personal``."""
    return {name: alpha * v + (1 - alpha) * global_params[name] for name, v in personal.items()}


def alpha_gradient(
    grads: Mapping[str, Tensor], personal: Mapping[str, Tensor], global_params: Mapping[str, Tensor]
) -> Tensor:
    """:math:`\\partial_α f(\\bar v) = \\langle \\nabla f(\\bar v), v - w \\rangle`, summed over the keys of ``grads``.

    Accumulated in float64: the inner product of two nearly orthogonal million-entry vectors loses its sign in
    float32 rounding, and the sign is what moves α.
    """
    total = torch.zeros((), dtype=torch.float64, device=next(iter(grads.values())).device)
    for name, grad in grads.items():
        total += (grad.double() * (personal[name].double() - global_params[name].double())).sum()
    return total


def alpha_step(alpha: Tensor, gradient: Tensor, lr: float) -> Tensor:
    """One projected gradient step on α: :math:`\\operatorname{clip}_{[0, 1]}(α - η\\,\\partial_α f)`."""
    return (alpha - lr * gradient).clamp(0.0, 1.0)


@torch.no_grad()
def personal_step_(
    personal: Mapping[str, Tensor], grads: Mapping[str, Tensor], alpha: float | Tensor, lr: float
) -> None:
    """:math:`v \\leftarrow v - η\\,α\\,\\nabla f(\\bar v)` in place (the chain rule's α included)."""
    for name, grad in grads.items():
        personal[name].sub_(lr * alpha * grad)


__all__ = ["alpha_gradient", "alpha_step", "mix", "personal_step_"]
