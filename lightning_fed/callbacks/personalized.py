"""The base of personalised algorithms: each client keeps a model of its own, and is evaluated with it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning.pytorch import LightningModule
from typing_extensions import override

from lightning_fed.checks import check_instance
from lightning_fed.client_store import ClientStateStore
from lightning_fed.context import ClientContext
from lightning_fed.functional.state_dict import StateDict
from lightning_fed.hooks import FedCallback

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView


class PersonalizedCallback(FedCallback):
    """Keeps one personalised model per client in the :class:`~lightning_fed.client_store.ClientStateStore` and
    evaluates every client with its own model.

    Subclasses decide what the personalised model is (FedAMP's :math:`w_i`, APFL's :math:`\\bar v_i`, Separate's
    local model) by calling :meth:`save_personal` and, when evaluation needs more than the stored state, by
    overriding :meth:`evaluation_params`. Evaluation then reports ``personal/*`` metrics (and ``personal/bmta``)
    instead of ``client/*``, so that a personalised accuracy is never read as the global model's. A client that has
    no personalised model yet is evaluated with the global model, which is where every client starts.

    Args:
        namespace: The client-store namespace that holds the personalised models.
    """

    def __init__(self, namespace: str) -> None:
        self.namespace = check_instance("namespace", namespace, str, "a string")

    def save_personal(self, store: ClientStateStore, client_id: int, params: StateDict) -> None:
        """Stores ``params`` (copied to the CPU) as the client's personalised model."""
        store.put(self.namespace, client_id, {"params": params})

    def personal_params(self, store: ClientStateStore, client_id: int) -> StateDict | None:
        """The client's stored personalised model, or ``None`` when it has none yet."""
        entry = store.get(self.namespace, client_id)
        return None if entry is None else entry["params"]

    def evaluation_params(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, client_ctx: ClientContext
    ) -> StateDict | None:
        """The model to evaluate ``client_ctx.client_id`` with; ``None`` keeps the global model."""
        return self.personal_params(client_ctx.store, client_ctx.client_id)

    @override
    def on_client_evaluate_start(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, client_ctx: ClientContext
    ) -> None:
        params = self.evaluation_params(trainer, pl_module, client_ctx)
        if params is not None:
            client_ctx.initial_params = params


__all__ = ["PersonalizedCallback"]
