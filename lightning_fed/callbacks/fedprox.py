"""FedProx: a proximal term that keeps each client's model near the round's global model."""

from __future__ import annotations

from torch import Tensor
from typing_extensions import override

from lightning_fed.callbacks.penalty import ParameterPenalty
from lightning_fed.checks import check_real
from lightning_fed.context import ClientContext
from lightning_fed.hooks import GroupStep


class FedProx(ParameterPenalty):
    r"""FedProx's proximal term, added to every client's local objective.

    Paper: T. Li, A. K. Sahu, M. Zaheer, M. Sanjabi, A. Talwalkar, V. Smith, "Federated Optimization in
    Heterogeneous Networks", MLSys 2020, arXiv:1812.06127.

    Local objective of client k in round r (Eq. 2 of the paper):

    .. math::
        h_k(w; w^r) = F_k(w) + \frac{μ}{2} \lVert w - w^r \rVert_2^2,
        \qquad \nabla_w \frac{μ}{2} \lVert w - w^r \rVert^2 = μ (w - w^r)

    Conventions:

    - The norm is **squared** and carries the **½** (Flower's docstring example and two public repositories
      drop the square; the rFedAvg code writes λ‖·‖² with no ½, i.e. its λ is μ/2 here).
    - **Sum** over every entry of every trainable parameter (``requires_grad``), not a mean; buffers
      (BatchNorm statistics) are not penalised.
    - :math:`w^r` is ``client_ctx.global_params``, the round's global model, held constant (detached); with a
      personalisation callback that swaps ``initial_params`` the centre stays the global model.
    - The exact gradient :math:`μ(w - w^r)` is added to ``.grad`` (see
      :class:`~lightning_fed.callbacks.ParameterPenalty`), so it passes through gradient clipping and the
      optimizer (momentum, weight decay) like the task-loss gradient. At the first local step :math:`w = w^r`
      and the term is exactly 0; with ``mu=0`` training is exactly FedAvg.
    - The task loss keeps being logged by the module (``train/loss`` for
      :class:`~lightning_fed.models.ClassifierModule`); the proximal term's value is logged separately as
      ``train/fedprox_proximal`` (round mean over local steps and clients).
    - The paper's "γ-inexact" local solvers (a variable amount of local work per device) are not modelled:
      every client runs the trainer's ``local_epochs`` / ``local_steps``.

    Paper defaults: μ is tuned per dataset over {0.001, 0.01, 0.1, 1}. The default here is 0.01, the value the
    FedGG paper (arXiv:2204.03920, §4.2) runs FedProx with as its best setting.

    Args:
        mu: The proximal coefficient μ ≥ 0 (0 is plain FedAvg).
        log_every_n_steps: Log the proximal value every n local steps (each log costs one pass over the
            parameters).
    """

    def __init__(self, mu: float = 0.01, log_every_n_steps: int = 1) -> None:
        self.mu = check_real("mu", mu, minimum=0.0)
        super().__init__("fedprox_proximal", log_every_n_steps)

    @override
    def penalty(self, params: dict[str, Tensor], client_ctx: ClientContext) -> Tensor:
        """(μ/2) Σ ‖w − w^r‖² over the trainable parameters."""
        anchor = client_ctx.global_params
        total = sum(((p - anchor[name].detach()) ** 2).sum() for name, p in params.items())
        return 0.5 * self.mu * total

    @override
    def penalty_gradient(self, params: dict[str, Tensor], client_ctx: ClientContext) -> dict[str, Tensor]:
        """μ (w − w^r) per trainable parameter."""
        anchor = client_ctx.global_params
        return {name: self.mu * (p.detach() - anchor[name]) for name, p in params.items()}

    @override
    def group_gradient(self, params: dict[str, Tensor], step: GroupStep) -> dict[str, Tensor] | None:
        """μ (w − w^r) for every stepping client, when they share the round's global model as centre."""
        anchor = _shared_anchor(step)
        if anchor is None:
            return None
        return {name: self.mu * (p - anchor[name]) for name, p in params.items()}

    @override
    def group_penalty(self, params: dict[str, Tensor], step: GroupStep) -> Tensor | None:
        anchor = _shared_anchor(step)
        if anchor is None:
            return None
        total = sum(((p - anchor[name]) ** 2).flatten(1).sum(1) for name, p in params.items())
        return 0.5 * self.mu * total


def _shared_anchor(step: GroupStep) -> dict[str, Tensor] | None:
    """The stepping clients' common centre, or ``None`` when a callback gave some of them another."""
    anchor = step.contexts[0].global_params
    return anchor if all(ctx.global_params is anchor for ctx in step.contexts) else None
