r"""``torch.optim``'s SGD and Adam updates on stacked per-client tensors, for clients trained side by side.

Each tensor holds one parameter of every client of a group along dimension 0, so a single elementwise update steps
all clients at once. The arithmetic is ``torch.optim``'s own, operation for operation (the single-tensor path of
``torch.optim.SGD`` and ``torch.optim.Adam`` in PyTorch 2.x), so a client's trajectory equals the one its own
optimizer would take up to the rounding of the batched matrix products that computed its gradient.

SGD (Sutskever et al. 2013 for momentum; PyTorch's convention, which differs from the paper's by where the learning
rate enters), with gradient :math:`g`, weight decay :math:`\lambda`, momentum :math:`\mu`, dampening :math:`\tau`:

.. math::
    d = g + \lambda w, \qquad b \leftarrow \begin{cases} d & \text{first step} \\ \mu b + (1-\tau) d \end{cases},
    \qquad d \leftarrow d + \mu b \;\text{(Nesterov)}\;\text{ or }\; b, \qquad w \leftarrow w - \eta d

Adam (Kingma & Ba 2015, arXiv:1412.6980) and AdamW (Loshchilov & Hutter 2019, arXiv:1711.05101), at step :math:`t`:

.. math::
    w \leftarrow w (1 - \eta\lambda) \;\text{(AdamW)}\quad\text{or}\quad g \leftarrow g + \lambda w \;\text{(Adam)}, \\
    m \leftarrow m + (1-\beta_1)(g - m), \qquad v \leftarrow \beta_2 v + (1-\beta_2) g^2, \\
    w \leftarrow w - \frac{\eta}{1-\beta_1^t} \cdot \frac{m}{\sqrt{v}/\sqrt{1-\beta_2^t} + \epsilon}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer


@dataclass(frozen=True)
class StackedHyperparameters:
    """One parameter group's settings, read from a ``torch.optim`` optimizer (``kind`` is ``"sgd"`` or ``"adam"``)."""

    kind: str
    lr: float
    weight_decay: float
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    decoupled_weight_decay: bool = False


def unsupported_optimizer(optimizer: Optimizer) -> str | None:
    """Why ``optimizer``'s update cannot be reproduced on stacked tensors, or ``None`` when it can."""
    name = type(optimizer).__name__
    if type(optimizer) not in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW):
        return f"the optimizer is {name}; batched clients reproduce SGD, Adam and AdamW only"
    for group in optimizer.param_groups:
        if isinstance(group["lr"], Tensor):
            return f"{name} has a tensor learning rate"
        for flag in ("maximize", "amsgrad", "fused", "differentiable", "capturable"):
            if group.get(flag):
                return f"{name} is set with {flag}=True"
    return None


def hyperparameters(group: dict[str, Any], optimizer: Optimizer) -> StackedHyperparameters:
    """The settings of one of ``optimizer``'s parameter groups (``unsupported_optimizer`` must have passed)."""
    if isinstance(optimizer, torch.optim.SGD):
        return StackedHyperparameters(
            "sgd", float(group["lr"]), float(group["weight_decay"]), float(group["momentum"]),
            float(group["dampening"]), bool(group["nesterov"]),
        )  # fmt: skip
    beta1, beta2 = group["betas"]
    decoupled = isinstance(optimizer, torch.optim.AdamW) or bool(group.get("decoupled_weight_decay", False))
    return StackedHyperparameters(
        "adam", float(group["lr"]), float(group["weight_decay"]), beta1=float(beta1), beta2=float(beta2),
        eps=float(group["eps"]), decoupled_weight_decay=decoupled,
    )  # fmt: skip


def stacked_step_(
    params: list[Tensor], grads: list[Tensor], state: list[dict[str, Tensor]], step: int, hp: StackedHyperparameters
) -> None:
    """Steps ``params`` in place with their ``grads``; ``state`` (one dict per parameter) is updated in place.

    Args:
        params: Stacked parameters ``[clients, *shape]``.
        grads: Their gradients, same shapes (left unchanged).
        state: Per parameter, the optimizer's stacked buffers (``momentum_buffer``; ``exp_avg``, ``exp_avg_sq``),
            created here on the first step.
        step: How many steps these clients took before this one (the same for every client of the call).
        hp: The parameter group's settings.
    """
    if hp.kind == "sgd":
        _sgd_step_(params, grads, state, step, hp)
    else:
        _adam_step_(params, grads, state, step, hp)


def _sgd_step_(
    params: list[Tensor], grads: list[Tensor], state: list[dict[str, Tensor]], step: int, hp: StackedHyperparameters
) -> None:
    for param, grad, slot in zip(params, grads, state):
        if hp.weight_decay != 0:
            grad = grad.add(param, alpha=hp.weight_decay)
        if hp.momentum != 0:
            if step == 0 or "momentum_buffer" not in slot:
                buf = slot["momentum_buffer"] = torch.clone(grad).detach()
            else:
                buf = slot["momentum_buffer"]
                buf.mul_(hp.momentum).add_(grad, alpha=1 - hp.dampening)
            grad = grad.add(buf, alpha=hp.momentum) if hp.nesterov else buf
        param.add_(grad, alpha=-hp.lr)


def _adam_step_(
    params: list[Tensor], grads: list[Tensor], state: list[dict[str, Tensor]], step: int, hp: StackedHyperparameters
) -> None:
    # torch.optim counts steps in a float tensor and reads it back as a Python number: the same value here.
    t = float(step + 1)
    bias_correction1 = 1 - hp.beta1**t
    bias_correction2 = 1 - hp.beta2**t
    step_size = hp.lr / bias_correction1
    bias_correction2_sqrt = bias_correction2**0.5
    for param, grad, slot in zip(params, grads, state):
        if step == 0 or "exp_avg" not in slot:
            slot["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            slot["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        exp_avg, exp_avg_sq = slot["exp_avg"], slot["exp_avg_sq"]
        if hp.weight_decay != 0:
            if hp.decoupled_weight_decay:
                param.mul_(1 - hp.lr * hp.weight_decay)
            else:
                grad = grad.add(param, alpha=hp.weight_decay)
        exp_avg.lerp_(grad, 1 - hp.beta1)
        exp_avg_sq.mul_(hp.beta2).addcmul_(grad, grad, value=1 - hp.beta2)
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(hp.eps)
        param.addcdiv_(exp_avg, denom, value=-step_size)


__all__ = ["StackedHyperparameters", "hyperparameters", "stacked_step_", "unsupported_optimizer"]
