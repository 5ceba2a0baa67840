"""The evaluation phase of a round: the global model on the global test set, each client's model on its own test
split, and the headline figures shown while a run trains."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from lightning.pytorch import LightningModule

from lightning_fed.context import ClientContext
from lightning_fed.engine.evaluation import accuracy_key, client_statistics, evaluate
from lightning_fed.engine.log_buffer import LogBuffer
from lightning_fed.engine.rank_shares import gather_client_results, sync_store
from lightning_fed.functional.state_dict import StateDict, clone_state, copy_state_
from lightning_fed.parallel import distributed
from lightning_fed.utilities.schedule import is_due

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView

# Per-client results of the global model and of personalised models are logged under different names, so that
# nobody reads one for the other.
CLIENT_PREFIX = "client/"
PERSONAL_PREFIX = "personal/"

Dispatch = Callable[..., Any]


@runtime_checkable
class ClientEvaluation(Protocol):
    """Evaluates clients somewhere else (a deployment's sites, which hold their test splits)."""

    def evaluate(self, round_idx: int, client_ids: list[int]) -> tuple[dict[int, dict[str, float]], bool]:
        """Each client's results (clients without a test split left out) and whether any model was personalised."""
        ...


class RoundEvaluator:
    """Evaluates the model after a round's aggregation, as the trainer's ``*eval*`` settings ask.

    Args:
        trainer: The federated trainer (its evaluation settings, datamodule and client store).
        module: The user's module, holding the new global model.
        live: The live tensors of the module's federated part (``functional.federated_state``), loaded with
            personalised models in turn.
        buffer: Where ``self.log`` values go during evaluation passes.
        dispatch: Calls a federated hook on every callback (``on_client_evaluate_start``).
    """

    def __init__(
        self,
        trainer: FederatedTrainerView,
        module: LightningModule,
        live: StateDict,
        buffer: LogBuffer,
        dispatch: Dispatch,
    ) -> None:
        self.trainer = trainer
        self.module = module
        self.live = live
        self.buffer = buffer
        self.dispatch = dispatch
        self._test_loader: Any = None
        # Where the clients are evaluated when not here (a deployment's sites); set by the round runner.
        self.remote: ClientEvaluation | None = None

    def run(self, round_idx: int, sampled: list[int]) -> tuple[dict[str, float], dict[int, dict[str, float]], str]:
        """Evaluates what is due after round ``round_idx``.

        Returns:
            The round's evaluation metrics (``global/*`` and ``client/*`` or ``personal/*`` summaries), each
            evaluated client's own results, and the prefix those results are logged under.
        """
        trainer = self.trainer
        round_number = round_idx + 1
        metrics: dict[str, float] = {}
        if is_due(round_number, trainer.eval_every_n_rounds, trainer.num_rounds):
            if self._test_loader is None:
                self._test_loader = trainer.datamodule.test_dataloader()
            result = evaluate(trainer, self.module, self._test_loader, self.buffer)
            metrics.update({f"global/{key}": value for key, value in result.items()})
        per_client: dict[int, dict[str, float]] = {}
        prefix = CLIENT_PREFIX
        if trainer.client_eval != "none" and is_due(
            round_number, trainer.client_eval_every_n_rounds, trainer.num_rounds
        ):
            client_ids = list(range(trainer.datamodule.num_clients)) if trainer.client_eval == "all" else sampled
            per_client, personalised = self.evaluate_clients(round_idx, client_ids)
            prefix = PERSONAL_PREFIX if personalised else CLIENT_PREFIX
            metrics.update(client_statistics(per_client, prefix=prefix))
        return metrics, per_client, prefix

    def evaluate_clients(self, round_idx: int, client_ids: list[int]) -> tuple[dict[int, dict[str, float]], bool]:
        """Evaluates each client on its own test split; returns the results and whether any model was personalised.

        With several processes each rank evaluates every ``world_size``-th client and the results are gathered, so
        every rank returns all of them, in ``client_ids`` order.
        """
        if self.remote is not None:
            return self.remote.evaluate(round_idx, client_ids)
        own = client_ids[distributed.rank() :: distributed.world_size()]
        results, any_personalised = self.evaluate_share(round_idx, own)
        gathered = gather_client_results(results, any_personalised, client_ids)
        # Personalisation hooks may have written the store (e.g. a fine-tuned model): every rank needs it.
        sync_store(self.trainer.federation_state.store)
        return gathered

    def evaluate_share(self, round_idx: int, client_ids: list[int]) -> tuple[dict[int, dict[str, float]], bool]:
        """Evaluates ``client_ids`` in this process (a client site evaluates its own client this way)."""
        datamodule = self.trainer.datamodule
        store = self.trainer.federation_state.store
        global_params: StateDict | None = None
        any_personalised = False
        results: dict[int, dict[str, float]] = {}
        for client_id in client_ids:
            # Built on demand (tens of µs): caching a loader per client would grow with the federation.
            loader = datamodule.client_test_dataloader(client_id)
            if loader is None:
                continue
            if global_params is None:
                global_params = clone_state(self.live)
            ctx = ClientContext(
                client_id, round_idx, global_params, global_params, datamodule.client_num_samples(client_id), store
            )
            self.dispatch("on_client_evaluate_start", ctx)
            personalised = ctx.initial_params is not global_params
            any_personalised |= personalised
            if personalised:
                copy_state_(self.live, ctx.initial_params)
            results[client_id] = evaluate(self.trainer, self.module, loader, self.buffer)
            if personalised:
                copy_state_(self.live, global_params)
        return results, any_personalised


def headline(metrics: dict[str, float]) -> dict[str, float]:
    """The global and mean per-client accuracy, for progress display and the final printout."""
    shown: dict[str, float] = {}
    global_key = accuracy_key({k: v for k, v in metrics.items() if k.startswith("global/")})
    if global_key:
        shown[global_key] = metrics[global_key]
    for prefix in (CLIENT_PREFIX, PERSONAL_PREFIX):
        client_key = accuracy_key({k: v for k, v in metrics.items() if k.startswith(prefix) and k.endswith("_mean")})
        if client_key:
            shown[client_key] = metrics[client_key]
    return shown


__all__ = ["CLIENT_PREFIX", "PERSONAL_PREFIX", "ClientEvaluation", "RoundEvaluator", "headline"]
