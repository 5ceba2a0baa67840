"""Penalties that depend only on the parameters, with their exact gradient injected into ``.grad``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch
from lightning.pytorch import LightningModule
from torch import Tensor
from typing_extensions import override

from lightning_fed.checks import check_instance, check_int
from lightning_fed.context import ClientContext
from lightning_fed.hooks import FedCallback, GroupStep

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView


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

    The one per-step hook, :meth:`on_client_before_optimizer_step`, sees the stepping clients stacked (a client
    training alone is a group of one): it calls :meth:`gradient` and :meth:`penalty` on each client's slice of the
    stacked parameters, so clients trained side by side (``client_parallelism``) get the gradient and logged value
    they get alone. A subclass may add the vectorised forms :meth:`group_gradient` and :meth:`group_penalty`, used
    when several clients step together.

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

    def group_gradient(self, params: dict[str, Tensor], step: GroupStep) -> dict[str, Tensor] | None:
        """The penalty's gradient for every stepping client at once (stacked like ``params``), or ``None`` to take
        each client's :meth:`gradient` in turn. Only called when several clients step and the penalty is active for
        every one of them."""
        return None

    def group_penalty(self, params: dict[str, Tensor], step: GroupStep) -> Tensor | None:
        """Every stepping client's penalty value ``[clients]``, or ``None`` to take each client's :meth:`penalty`.
        Only called when several clients step and the penalty is active for every one of them."""
        return None

    @override
    def on_client_before_optimizer_step(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, step: GroupStep
    ) -> None:
        contexts = step.contexts
        active = [self.is_active(ctx) for ctx in contexts]
        if not any(active):
            return
        params = {name: p.detach() for name, p in step.params.items()}
        # A client alone takes the per-client forms, so its gradient and logged value are bit for bit what they
        # always were; the vectorised forms pay off only for several clients.
        vectorised = len(contexts) > 1 and all(active)
        stacked = self.group_gradient(params, step) if vectorised else None
        if stacked is not None:
            for name, grad in stacked.items():
                target = step.grads[name]
                target.add_(grad.to(target.dtype))
        else:
            for position, ctx in enumerate(contexts):
                if active[position]:
                    own = {name: p[position] for name, p in params.items()}
                    for name, grad in self.gradient(own, ctx).items():
                        target = step.grads[name]
                        target[position].add_(grad.to(target.dtype))
        # Every stepping client has taken the same number of steps, so they log together or not at all.
        if contexts[0].num_steps % self.log_every_n_steps != 0:
            return
        with torch.no_grad():
            values = self.group_penalty(params, step) if vectorised else None
            for position, ctx in enumerate(contexts):
                if active[position]:
                    value = values[position] if values is not None else self._own_penalty(params, position, ctx)
                    step.log(position, self.log_name, value)

    def _own_penalty(self, params: dict[str, Tensor], position: int, client_ctx: ClientContext) -> Tensor:
        return self.penalty({name: p[position] for name, p in params.items()}, client_ctx)
