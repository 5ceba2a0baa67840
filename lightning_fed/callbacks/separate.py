"""Separate: every client trains alone; the baseline a personalised method must beat."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning.pytorch import LightningModule
from typing_extensions import override

from lightning_fed.callbacks.personalized import PersonalizedCallback
from lightning_fed.context import ClientContext, ClientUpdate, RoundContext
from lightning_fed.functional.state_dict import StateDict

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView


class Separate(PersonalizedCallback):
    r"""Local training only: each client continues its own model and nothing is aggregated.

    The "Separate" baseline of Huang et al., "Personalized Cross-Silo Federated Learning on Non-IID Data", AAAI 2021,
    arXiv:2007.03797 (Section 7): client :math:`i` minimises its own loss :math:`F_i(w_i)` with no collaboration,

    .. math::
        w_i^{(r+1)} = \mathrm{LocalTrain}_i\bigl(w_i^{(r)}\bigr), \qquad w_i^{(0)} = w_0

    where :math:`w_0` is the initial global model (the same start point for every client, as in the federated runs
    it is compared with).

    How it plugs in:
        * ``on_client_start`` starts the client from its stored model (``w_0`` on its first round);
          ``on_client_end`` stores the trained model (CPU, checkpointed, namespace ``"separate"``).
        * ``on_aggregate`` replaces the aggregate with the round's global model, so the global model stays
          :math:`w_0` for the whole run (its ``global/*`` metrics are those of the initial model) and every client's
          start point on its first round is :math:`w_0`. The aggregator still folds the updates in (the loop
          always runs it); its result is discarded.
        * Nothing is communicated: the round's ``comm/bytes_up`` and ``comm/bytes_down`` are set to 0.
        * Evaluation uses each client's own model (``personal/*`` metrics); a client that has not trained yet is
          evaluated with :math:`w_0`.
        * The optimizer restarts from fresh state every round unless the trainer's ``keep_optimizer_state`` is
          set; with it, and ``local_epochs`` E over R rounds, a client's training is the same as E·R epochs of
          centralised training on its own data.
    """

    client_state_namespaces = ("separate",)  # each client's own model

    def __init__(self) -> None:
        super().__init__("separate")

    @override
    def on_client_start(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, client_ctx: ClientContext
    ) -> None:
        own = self.personal_params(client_ctx.store, client_ctx.client_id)
        if own is not None:
            client_ctx.initial_params = own

    @override
    def on_client_end(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, client_ctx: ClientContext, update: ClientUpdate
    ) -> None:
        self.save_personal(client_ctx.store, client_ctx.client_id, update.params)

    @override
    def on_aggregate(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, round_ctx: RoundContext, new_params: StateDict
    ) -> None:
        new_params.update(round_ctx.global_params)
        round_ctx.bytes_up = 0
        round_ctx.bytes_down = 0


__all__ = ["Separate"]
