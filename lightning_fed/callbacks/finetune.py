"""Local fine-tuning of the global model: FedAvg-FT and FedProx-FT."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning.pytorch import LightningModule
from typing_extensions import override

from lightning_fed.callbacks.personalized import PersonalizedCallback
from lightning_fed.checks import InvalidArgumentError, check_int
from lightning_fed.context import ClientContext
from lightning_fed.functional.state_dict import StateDict
from lightning_fed.utilities.schedule import is_due

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView


class FineTune(PersonalizedCallback):
    r"""Evaluates every client with the global model fine-tuned on that client's own training data.

    Local fine-tuning as in K. Wang, R. Mathews, C. Kiddon, H. Eichner, F. Beaufays, D. Ramage, "Federated Evaluation
    of On-device Personalization", arXiv:1910.10252, 2019, and the FedAvg-FT / FedProx-FT baselines of Huang et al.,
    "Personalized Cross-Silo Federated Learning on Non-IID Data", AAAI 2021, arXiv:2007.03797:

    .. math::
        w_i^{\mathrm{FT}} = \mathrm{SGD}_{E}\bigl(F_i;\ \text{start } w^{(r)}\bigr)

    :math:`E` epochs (``epochs``) of plain local training of the client's task loss :math:`F_i`, from the global
    model :math:`w^{(r)}` after round :math:`r`'s aggregation. FedAvg-FT is FedAvg with this callback, FedProx-FT is
    :class:`~lightning_fed.callbacks.FedProx` with it.

    How it plugs in:
        * When a round's clients are evaluated and the round is the last one, or a multiple of ``every_n_rounds``,
          each evaluated client is fine-tuned in ``on_client_evaluate_start`` (through
          ``trainer.train_locally``) and evaluated with the result (``personal/*`` metrics). Other
          rounds evaluate the global model (``client/*`` metrics), so ``personal/bmta`` is the best over the
          fine-tuning rounds.
        * Fine-tuning is plain local training: the trainer's optimizer from fresh state, **no** algorithm's
          ``client_loss`` or gradient hook (FedProx's proximal term does not apply), and a data order and RNG
          derived from ``(seed, "finetune", round, client)``, so it is reproducible and shifts no other draw of
          the run. The global model and the federated training are untouched: a run with this callback trains
          exactly the global models of the run without it.
        * One fine-tuned model exists at a time (it is evaluated and dropped), so memory does not grow with the
          number of clients, and nothing is added to the checkpoint.

    Args:
        epochs: Fine-tuning epochs per client (:math:`E`).
        every_n_rounds: Also fine-tune every n rounds; ``None`` fine-tunes after the last round only.
    """

    def __init__(self, epochs: int = 1, every_n_rounds: int | None = None) -> None:
        super().__init__("finetune")
        self.epochs = check_int("epochs", epochs, minimum=1)
        self.every_n_rounds = check_int("every_n_rounds", every_n_rounds, minimum=1, allow_none=True)

    @override
    def check_setup(self, trainer: FederatedTrainerView, datamodule: Any) -> None:
        if trainer.client_eval == "none":
            raise InvalidArgumentError(
                "trainer.client_eval", "none", "'all' or 'sampled' with FineTune, which evaluates on the clients' tests"
            )

    @override
    def on_fit_start(self, trainer: Any, pl_module: LightningModule) -> None:
        if trainer.client_eval == "none":
            raise ValueError(
                "FineTune evaluates fine-tuned models on the clients' test splits, but the trainer's `client_eval` is "
                "'none': set `client_eval` to 'all' (or 'sampled')."
            )

    def is_finetune_round(self, trainer: FederatedTrainerView, round_idx: int) -> bool:
        """Whether the clients evaluated after round ``round_idx`` (0-based) are fine-tuned first."""
        # Without a period, the run's length is the period: only the last round is due.
        return is_due(round_idx + 1, self.every_n_rounds or trainer.num_rounds, trainer.num_rounds)

    @override
    def evaluation_params(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, client_ctx: ClientContext
    ) -> StateDict | None:
        """The global model fine-tuned on the client's data, on fine-tuning rounds; else ``None`` (global model)."""
        if not self.is_finetune_round(trainer, client_ctx.round_idx):
            return None
        return trainer.train_locally(
            client_ctx.client_id, client_ctx.round_idx, client_ctx.global_params, epochs=self.epochs, purpose="finetune"
        )


__all__ = ["FineTune"]
