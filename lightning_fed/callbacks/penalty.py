"""Penalties that depend only on the parameters, with their exact gradient injected into ``.grad``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch
from lightning.pytorch import LightningModule
from torch import Tensor
from torch.optim import Optimizer
from typing_extensions import override

from lightning_fed.checks import check_instance, check_int
from lightning_fed.context import ClientContext
from lightning_fed.functional.gradients import add_to_grad_
from lightning_fed.hooks import FedCallback, GroupStep

if TYPE_CHECKING:
    from lightning_fed.trainer import FederatedTrainer


class ParameterPenalty(FedCallback, ABC):
    r"""Base for local objectives :math:`f(w) + R(w)` where :math:`R` depends only on the parameters.

    Instead of adding :math:`R` to the loss (which would cost a second graph through every parameter), the base adds
    :math:`\nabla R(w)` to ``param.grad`` after backward, after AMP unscaling and before gradient clipping, so
    clipping and the optimizer see the gradient of the full objective. The value of :math:`R` is logged as
    ``"<log_name>"`` (its round mean appears as ``train/<log_name>``).

    The class is abstract: a subclass must implement :meth:`penalty` (instantiating one that does not raises
    ``TypeError`` naming it) and, where a closed form exists, :meth:`penalty_gradient`; without it the
    gradient comes from autograd of :meth:`penalty`. The tensors in ``params`` are the module's live parameters
    (``requires_grad`` ones only), keyed by ``named_parameters`` names. Anything the penalty is measured against
    (the global model, a Fisher) must be detached: the penalty's gradient is taken with respect to ``params`` only.

    Clients trained side by side (``client_parallelism``) get the same gradient and logged value per client from
    :meth:`on_group_before_optimizer_step`, which calls :meth:`gradient` on each client's slice of the stacked
    parameters; a subclass may override :meth:`group_gradient` with a vectorised form.

    Args:
        log_name: Key the penalty value is logged under.
        log_every_n_steps: Log the value every n local steps (it costs one extra pass over the parameters).
    """

    supports_batched_clients = True

    def __init__(self, log_name: str, log_every_n_steps: int = 1) -> None:
        self.log_name = check_instance("log_name", log_name, str, "a string")
        self.log_every_n_steps = check_int("log_every_n_steps", log_every_n_steps, minimum=1)

    def is_active(self, client_ctx: ClientContext) -> bool:
        """Whether the penalty applies to this client now (e.g. not on a first participation)."""
        return True

    @abstractmethod
    def penalty(self, params: dict[str, Tensor], client_ctx: ClientContext) -> Tensor:
        """The scalar :math:`R(w)` as a differentiable function of ``params``."""

    def penalty_gradient(self, params: dict[str, Tensor], client_ctx: ClientContext) -> dict[str, Tensor] | None:
        """The closed-form :math:`\\nabla R(w)` per parameter name, or ``None`` to use autograd of :meth:`penalty`."""
        return None

    def gradient(self, params: dict[str, Tensor], client_ctx: ClientContext) -> dict[str, Tensor]:
        """The gradient that gets injected: the closed form when given, else autograd's."""
        closed_form = self.penalty_gradient(params, client_ctx)
        if closed_form is not None:
            return closed_form
        leaves = {name: p.detach().requires_grad_(True) for name, p in params.items()}
        with torch.enable_grad():
            grads = torch.autograd.grad(self.penalty(leaves, client_ctx), list(leaves.values()), allow_unused=True)
        return {name: (g if g is not None else torch.zeros_like(p)) for (name, p), g in zip(leaves.items(), grads)}

    @override
    def on_client_before_optimizer_step(
        self, trainer: FederatedTrainer, pl_module: LightningModule, client_ctx: ClientContext, optimizer: Optimizer
    ) -> None:
        if not self.is_active(client_ctx):
            return
        params: dict[str, Tensor] = {name: p for name, p in pl_module.named_parameters() if p.requires_grad}
        for name, grad in self.gradient(params, client_ctx).items():
            add_to_grad_(params[name], grad)
        with torch.no_grad():
            if client_ctx.num_steps % self.log_every_n_steps == 0:
                pl_module.log(self.log_name, self.penalty({n: p.detach() for n, p in params.items()}, client_ctx))

    def group_gradient(self, params: dict[str, Tensor], step: GroupStep) -> dict[str, Tensor] | None:
        """The penalty's gradient for every stepping client at once (stacked like ``params``), or ``None`` to take
        each client's :meth:`gradient` in turn. Only called when the penalty is active for every stepping client."""
        return None

    def group_penalty(self, params: dict[str, Tensor], step: GroupStep) -> Tensor | None:
        """Every stepping client's penalty value ``[clients]``, or ``None`` to take each client's :meth:`penalty`."""
        return None

    @override
    def on_group_before_optimizer_step(
        self, trainer: FederatedTrainer, pl_module: LightningModule, step: GroupStep
    ) -> None:
        contexts = step.contexts
        active = [self.is_active(ctx) for ctx in contexts]
        if not any(active):
            return
        params = {name: p.detach() for name, p in step.params.items()}
        stacked = self.group_gradient(params, step) if all(active) else None
        if stacked is not None:
            for name, grad in stacked.items():
                step.grads[name].add_(grad.to(step.grads[name].dtype))
        else:
            for position, ctx in enumerate(contexts):
                if active[position]:
                    own = {name: p[position] for name, p in params.items()}
                    for name, grad in self.gradient(own, ctx).items():
                        step.grads[name][position].add_(grad.to(step.grads[name].dtype))
        # Every stepping client has taken the same number of steps, so they log together or not at all.
        if contexts[0].num_steps % self.log_every_n_steps != 0:
            return
        with torch.no_grad():
            values = self.group_penalty(params, step) if all(active) else None
            for position, ctx in enumerate(contexts):
                if active[position]:
                    value = values[position] if values is not None else self._own_penalty(params, position, ctx)
                    step.log(position, self.log_name, value)

    def _own_penalty(self, params: dict[str, Tensor], position: int, client_ctx: ClientContext) -> Tensor:
        return self.penalty({name: p[position] for name, p in params.items()}, client_ctx)
