"""One federated round, composed of its two halves, which meet through one message each way.

:class:`~lightning_fed.engine.server_half.ServerHalf` opens the round (samples the clients, runs ``on_round_start``,
resets the aggregator) and hands this process's share of the clients out as a
:class:`~lightning_fed.messages.ClientTask`; the client side answers with :class:`~lightning_fed.messages.ClientReply`
s (:class:`~lightning_fed.engine.client_half.ClientHalf` here, trained in this process, or a deployment's sites);
the server half folds them in and closes the round (reduces, computes the aggregate, runs ``on_aggregate``,
evaluates). The in-process path, several processes (each rank a client site with a share of the clients), batched
groups and a deployment all compose the same two halves around the same two messages.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from lightning.pytorch import LightningModule

from lightning_fed.context import ClientContext, FederationState, RoundResult
from lightning_fed.engine.batched.training import ClientGroups
from lightning_fed.engine.client_half import Boundary, ClientHalf
from lightning_fed.engine.dispatch import HookDispatcher
from lightning_fed.engine.evaluator import ClientEvaluation, RoundEvaluator
from lightning_fed.engine.local_training import LocalTrainer
from lightning_fed.engine.server_half import ServerHalf
from lightning_fed.engine.step_counter import StepCounter
from lightning_fed.functional.federated_state import federated_state
from lightning_fed.functional.state_dict import StateDict, clone_state, copy_state_
from lightning_fed.messages import ClientReply, ClientTask
from lightning_fed.parallel import distributed
from lightning_fed.utilities.seeding import derive_seed, seed_torch

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView


class ClientSide(Protocol):
    """Where a round's clients train: this process's :class:`~lightning_fed.engine.client_half.ClientHalf`
    (:class:`LocalClients`), or client sites elsewhere (:class:`lightning_fed.deploy.RemoteClients`), whose replies
    carry their round state for the server half to fold in."""

    def answer(self, task: ClientTask) -> list[ClientReply]:
        """The replies to ``task``, in round order (one per client half that trained part of it)."""
        ...


class LocalClients:
    """The client side of a round whose clients train in this process: its client half runs the task.

    Args:
        client: This process's client half.
    """

    def __init__(self, client: ClientHalf) -> None:
        self.client = client

    def answer(self, task: ClientTask) -> list[ClientReply]:
        return [self.client.run_task(task)]


#: Builds the client side of a fit's rounds from the trainer, its module, the step counter and the hook dispatcher.
ClientSideFactory = Callable[["FederatedTrainerView", LightningModule, StepCounter, HookDispatcher], ClientSide]


class RoundRunner:
    """Runs the rounds of a fit on the trainer's module, with the trainer's settings and state.

    The module holds the global model between rounds; during a round it is loaded with each client's start point
    in turn, trained in place, and finally loaded with the aggregate. Everything random is drawn from seeds derived
    from ``(run seed, purpose, round, client)``, so a round does not depend on the rounds before it or on where it
    runs, and a resumed run is bit-identical.

    Args:
        trainer: The federated trainer (settings, sampler, aggregator, callbacks, federation state).
        module: The user's LightningModule.
        steps: Counts the clients' optimizer steps (``global_step``).
        boundary: Asked at every client boundary whether to stop the round (see
            :class:`~lightning_fed.engine.client_half.ClientHalf`); ``None`` never stops.
        client_side: Builds where the round's clients train instead of this process's client half (a deployment's
            client sites); ``None`` trains them here.
    """

    def __init__(
        self,
        trainer: FederatedTrainerView,
        module: LightningModule,
        steps: StepCounter,
        boundary: Boundary | None = None,
        client_side: ClientSideFactory | None = None,
    ) -> None:
        self.trainer = trainer
        self.module = module
        # The federated part only: every copy the round makes of the model (the global snapshot, each client's
        # update, the aggregator's sums, the store's personal models, the wire) is of what the clients change. The
        # frozen base stays in the module, once.
        self.live: StateDict = federated_state(module, trainer.federated_keys)
        self.hooks = HookDispatcher(trainer, module)
        self.client = ClientHalf(trainer, module, self.live, steps, self.hooks, boundary)
        evaluator = RoundEvaluator(trainer, module, self.live, self.client.local.buffer, self.hooks.call)
        self.server = ServerHalf(trainer, module, self.live, steps, self.hooks, evaluator)
        # A client half apart from a server (a deployment's site) opens its rounds and evaluates as this one would.
        self.client.open_round, self.client.evaluator = self.server.start_round, evaluator
        self.clients: ClientSide = (
            LocalClients(self.client) if client_side is None else client_side(trainer, module, steps, self.hooks)
        )
        if isinstance(self.clients, ClientEvaluation):
            # Clients trained elsewhere are evaluated there too: their test splits stay with them.
            evaluator.remote = self.clients
        self._plain = LocalTrainer(trainer, module, mode="plain")
        if distributed.is_distributed():
            distributed.destroy_process_group_at_exit()

    @property
    def state(self) -> FederationState:
        """The run's federated state (seed, counters, history, client store)."""
        return self.trainer.federation_state

    @property
    def batched(self) -> ClientGroups:
        """How this process groups its clients (``client_parallelism``; ``batched.size`` once decided)."""
        return self.client.batched

    def dispatch(self, hook: str, *args: Any) -> None:
        """Calls federated hook ``hook`` on every callback that defines it."""
        self.hooks.call(hook, *args)

    def run(self, round_idx: int) -> RoundResult:
        """Trains, aggregates and evaluates round ``round_idx``; returns its result (validation not included).

        With several processes every rank runs both halves with the same sampled clients and trains its share of
        them in the client half; the server half combines the shares, so every rank leaves the round in the same
        state. A stop agreed at a client boundary abandons the round (Lightning's ``SIGTERMException``; see
        :meth:`ClientHalf.run_task <lightning_fed.engine.client_half.ClientHalf.run_task>`).
        """
        started = time.perf_counter()
        round_ctx = self.server.open_round(round_idx)
        shares = distributed.shard_clients(round_ctx.client_ids, round_ctx.num_samples, distributed.world_size())
        replies = self.clients.answer(self.server.task(round_ctx, shares[distributed.rank()]))
        self.server.fold(round_ctx, replies)
        return self.server.close_round(round_ctx, started)

    def train_locally(
        self,
        client_id: int,
        round_idx: int,
        start_params: StateDict,
        epochs: int | None = None,
        steps: int | None = None,
        purpose: str = "finetune",
    ) -> StateDict:
        """Plain local training of a client from ``start_params``; see
        :meth:`~lightning_fed.FederatedTrainer.train_locally`. The module is left holding what it held."""
        saved = clone_state(self.live)
        was_training = self.module.training
        copy_state_(self.live, start_params)
        seed = self.state.seed
        data_seed = derive_seed(seed, purpose, "data", round_idx, client_id)
        seed_torch(derive_seed(seed, purpose, "torch", round_idx, client_id))
        datamodule = self.trainer.datamodule
        loader = datamodule.client_dataloader(client_id, seed=data_seed)
        optimizer = self.trainer.optimizers[0]
        optimizer.state.clear()
        ctx = ClientContext(
            client_id, round_idx, saved, start_params, datamodule.client_num_samples(client_id), self.state.store
        )
        epochs = epochs if epochs is not None or steps is not None else 1
        try:
            self._plain.fit(loader, optimizer, epochs, steps, ctx=ctx)
            return clone_state(self.live)
        finally:
            optimizer.state.clear()
            copy_state_(self.live, saved)
            self.module.train(was_training)


__all__ = ["ClientSide", "ClientSideFactory", "LocalClients", "RoundRunner"]
