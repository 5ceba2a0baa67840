"""The client half of a round: a :class:`~lightning_fed.messages.ClientTask` in, a
:class:`~lightning_fed.messages.ClientReply` out.

A client half receives the round (its index, the sampled clients, the global model) and, when it runs apart from
the server half, the algorithms' broadcast state; it trains each of its task's clients from its start point, checks
the update, runs the per-client hooks and folds each accepted update into the algorithms' declared round state.
Its reply is the contribution the server half folds in: the clients' metrics, rejections, steps and bytes, and
(apart from the server half) the declared round state of the aggregator and the callbacks (sums, merges, the last
client's integer buffers).

In one process the round state and the store entries stay in the shared objects; with several processes every rank
runs this half on its share of the clients, and the server half combines the replies with collectives; at a
deployment's site the round state travels in the reply and the store entries stay at the site.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from lightning.pytorch import LightningModule
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.model_helpers import is_overridden

from lightning_fed.aggregation import Aggregator
from lightning_fed.context import ClientContext, ClientUpdate, RoundContext
from lightning_fed.engine.algorithm_state import load_broadcast, round_state
from lightning_fed.engine.batched.training import ClientGroups
from lightning_fed.engine.client_optimizer import client_optimizer
from lightning_fed.engine.dispatch import HookDispatcher
from lightning_fed.engine.failures import failure_note, raise_if_batch_of_one
from lightning_fed.engine.local_training import LocalTrainer, RoundSchedulers
from lightning_fed.engine.rejection import finite_tree, reject_client
from lightning_fed.engine.schedulers import restore_schedulers
from lightning_fed.engine.step_counter import StepCounter
from lightning_fed.functional.state_dict import StateDict, all_finite, clone_state, copy_state_, state_nbytes
from lightning_fed.messages import ClientReply, ClientTask
from lightning_fed.utilities.seeding import derive_seed, seed_torch

if TYPE_CHECKING:
    from lightning_fed.engine.evaluator import RoundEvaluator
    from lightning_fed.hooks import FederatedTrainerView

#: Opens a round on this process's algorithm objects (``on_round_start``, the aggregator's reset) with clients
#: already sampled: the server half's :meth:`~lightning_fed.engine.server_half.ServerHalf.start_round`.
RoundOpener = Callable[[int, list[int], dict[int, int]], RoundContext]

#: Asked at every client boundary with whether this share has clients left; answers whether to stop the round and
#: whether any share has clients left (with several processes every rank asks the same number of times).
Boundary = Callable[[bool], tuple[bool, bool]]


class ClientHalf:
    """Trains a share of a round's clients and folds their updates into the aggregator.

    Everything random is drawn from seeds derived from ``(run seed, purpose, round, client)``, so a client's training
    does not depend on where it runs or on the clients before it.

    Args:
        trainer: The federated trainer (settings, datamodule, aggregator, client store).
        module: The user's LightningModule; during the half it holds each client's model in turn.
        live: The live tensors of the module's federated part (``functional.federated_state``).
        steps: Counts the clients' optimizer steps.
        hooks: Calls the callbacks' federated hooks.
        boundary: Asked before each client (or batched group), and once more after the last, whether to stop the
            round (SIGTERM); ``None`` never stops.
        open_round: Opens a round whose task carries the broadcast state (the client half runs apart from the
            server half); the round runner gives its server half's.
        evaluator: Evaluates an evaluation task's clients; the round runner gives its own.
    """

    def __init__(
        self,
        trainer: FederatedTrainerView,
        module: LightningModule,
        live: StateDict,
        steps: StepCounter,
        hooks: HookDispatcher,
        boundary: Boundary | None = None,
        open_round: RoundOpener | None = None,
        evaluator: RoundEvaluator | None = None,
    ) -> None:
        self.trainer = trainer
        self.module = module
        self.live = live
        self.steps = steps
        self.hooks = hooks
        self.boundary: Boundary = boundary if boundary is not None else _never_stop
        self.datamodule = trainer.datamodule
        self.schedulers = RoundSchedulers(trainer, module)
        self.local = LocalTrainer(trainer, module, mode="client", steps=steps, schedulers=self.schedulers)
        self.batched = ClientGroups(trainer, module, steps, hooks)
        # A probe costs a pass over the client's data: only aggregators that define one get a loader.
        self._aggregator_probes = is_overridden("probe_client", trainer.aggregator, Aggregator)
        self._reads_start_point = self._aggregator_probes or bool(hooks.overriding("on_client_train_start"))
        self.open_round = open_round
        self.evaluator = evaluator

    def run_task(self, task: ClientTask) -> ClientReply:
        """Trains (or evaluates) the task's clients and returns the reply.

        A task with broadcast state (the client half runs apart from the server half, at a deployment's site) first
        puts this side where the server was when it opened the round: the run seed, the algorithms' broadcast
        state, the LR schedulers, the global model; then opens the round (``on_round_start``, the aggregator's
        reset) with the server's sampled clients; its reply carries the algorithms' round state. A task without
        runs on the round the server half opened on the same objects, whose round state the reply leaves in place.
        """
        if task.opens_round:
            self._take_server_state(task)
        if task.evaluate:
            return self._evaluate(task)
        if task.opens_round:
            assert self.open_round is not None, "a client half apart from the server half needs `open_round`"
            round_ctx = self.open_round(task.round_idx, list(task.round_clients), dict(task.num_samples))
        else:
            # The server half's own round context stays the server half's: this half counts its clients' bytes and
            # rejections in a context of its own and reports them in the reply.
            round_ctx = RoundContext(
                round_idx=task.round_idx,
                client_ids=list(task.round_clients),
                global_params=task.global_params,
                num_samples=task.num_samples,
                store=self.trainer.federation_state.store,
            )
        reply = self._train(round_ctx, list(task.client_ids))
        if task.opens_round:
            reply.round_state = round_state(self.trainer)
        return reply

    def _take_server_state(self, task: ClientTask) -> None:
        assert task.broadcast is not None
        trainer = self.trainer
        trainer.federation_state.seed = task.seed
        load_broadcast(trainer, task.broadcast)
        if task.schedulers:
            restore_schedulers(trainer, task.schedulers)
        copy_state_(self.live, task.global_params)

    def _evaluate(self, task: ClientTask) -> ClientReply:
        assert self.evaluator is not None, "an evaluation task needs the round runner's evaluator"
        results, personalised = self.evaluator.evaluate_share(task.round_idx, list(task.client_ids))
        return ClientReply(
            round_idx=task.round_idx,
            client_ids=list(task.client_ids),
            round_state={},
            eval_metrics=results,
            personalised=personalised,
        )

    def _train(self, round_ctx: RoundContext, client_ids: list[int]) -> ClientReply:
        """Trains ``client_ids`` (a share of ``round_ctx.client_ids``, in round order) and returns the reply (its
        round state in place).

        Each accepted update reaches ``aggregator.update`` as soon as its client is done (memory stays O(model);
        a batched group's reach ``aggregator.update_group`` together, in order, once the group is done), unless an
        ``on_client_end`` hook holds it back; held updates go through ``on_clients_end`` first.

        Raises:
            SIGTERMException: A stop was agreed at a client boundary (Lightning's exception for SIGTERM). The round
                is abandoned: the clients after the boundary do not train, the module holds the round's global
                model again, and nothing of the round is aggregated or counted. Client-store writes of the clients
                that finished stay in memory; the process is meant to exit and resume from the last checkpoint.
        """
        bytes_before = (round_ctx.bytes_up, round_ctx.bytes_down)
        rejected_before = len(round_ctx.rejected)
        self.steps.start_round()
        share = ClientReply(round_idx=round_ctx.round_idx, client_ids=client_ids)
        held: list[ClientUpdate] = []
        self.schedulers.open_round(round_ctx.round_idx)
        completed = False
        try:
            for group in self._groups_until_stopped(round_ctx, client_ids):
                try:
                    updates = (
                        self._train_group(round_ctx, group)
                        if len(group) > 1
                        else [self._train_client(round_ctx, group[0])]
                    )
                except Exception as error:
                    raise_if_batch_of_one(error, self.datamodule, round_ctx.round_idx, group)
                    error.add_note(failure_note(self.trainer, round_ctx.round_idx, group))
                    raise
                for update in updates:
                    if update is not None:
                        share.train_metrics[update.client_id] = update.metrics
                        if update.held:
                            held.append(update)
            completed = True
        finally:
            # Every rank advances the schedules alike, whichever clients it trained (RoundSchedulers).
            self.schedulers.close_round(completed)
        self._release_held(round_ctx, held, share.train_metrics)
        share.rejected = dict.fromkeys(round_ctx.rejected[rejected_before:], "it holds NaN or Inf")
        share.steps = self.steps.round_steps
        share.bytes_up = round_ctx.bytes_up - bytes_before[0]
        share.bytes_down = round_ctx.bytes_down - bytes_before[1]
        return share

    def _groups_until_stopped(self, round_ctx: RoundContext, client_ids: list[int]) -> Iterator[list[int]]:
        """This share's clients (or batched groups), each after a client boundary at which nobody asked to stop.

        A share that is done keeps passing boundaries (with several processes: answering the collective) until no
        share has clients left, so every rank stops at the same boundary. Once every client of the round has
        trained, the round finishes even if a stop was asked for: the next round's first boundary stops.
        """
        groups = iter(self.batched.groups(client_ids))
        while True:
            group = next(groups, None)
            stop, more = self.boundary(group is not None)
            if not more:
                return
            if stop:
                copy_state_(self.live, round_ctx.global_params)
                raise SIGTERMException
            if group is not None:
                yield group

    def _train_client(self, round_ctx: RoundContext, client_id: int) -> ClientUpdate | None:
        store = round_ctx.store
        # Whatever the client's hooks write to the store before its update is known to be finite is undone if it
        # is not: a diverged update leaves no state behind that would poison the client's next participation.
        store.begin()
        try:
            ctx, probe = self._start_client(round_ctx, client_id)
            seed_torch(derive_seed(self.trainer.federation_state.seed, "torch", round_ctx.round_idx, client_id))
            loader = self.datamodule.client_dataloader(client_id, seed=self._data_seed(round_ctx, client_id))
            optimizer = client_optimizer(self.trainer, self.schedulers, client_id)
            trainer = self.trainer
            metrics = self.local.fit(loader, optimizer, trainer.local_epochs, trainer.local_steps, ctx=ctx)
            params = clone_state(self.live)
            update = ClientUpdate(
                client_id, ctx.num_samples, ctx.num_steps, params, metrics, probe, lr_sums=ctx.lr_sums
            )
            optimizer_state = optimizer.state_dict()["state"] if trainer.keep_optimizer_state else None
        except BaseException:
            store.rollback()
            raise
        return self._finish_client(round_ctx, ctx, update, optimizer_state)

    def _train_group(self, round_ctx: RoundContext, client_ids: list[int]) -> list[ClientUpdate | None]:
        """Trains ``client_ids`` together in one vectorised pass (``client_parallelism``); each client's hooks run
        in round order before and after it, and each client's store transaction is decided on its own update."""
        store, started, transactions = round_ctx.store, [], []
        try:
            for client_id in client_ids:
                store.begin()
                started.append(self._start_client(round_ctx, client_id, live=False))
                transactions.append(store.suspend())
            contexts = [ctx for ctx, _ in started]
            seeds = [self._data_seed(round_ctx, cid) for cid in client_ids]
            loaders = [self.datamodule.client_dataloader(cid, seed=seed) for cid, seed in zip(client_ids, seeds)]
            run_seed = self.trainer.federation_state.seed
            seed_torch(derive_seed(run_seed, "torch", round_ctx.round_idx, "group", *client_ids))
            results = self.batched.fit_group(contexts, loaders)
        except BaseException:
            store.rollback()
            for transaction in reversed(transactions):
                store.resume(transaction)
                store.rollback()
            raise
        updates: list[ClientUpdate | None] = []
        for (ctx, probe), transaction, (params, metrics, finite) in zip(started, transactions, results):
            update = ClientUpdate(
                ctx.client_id, ctx.num_samples, ctx.num_steps, params, metrics, probe, lr_sums=ctx.lr_sums
            )
            if self.batched.needs_live_model:
                # on_client_end's contract: the module holds the client's local model.
                copy_state_(self.live, params)
            store.resume(transaction)
            updates.append(self._finish_client(round_ctx, ctx, update, None, finite, aggregate=False))
        self.trainer.aggregator.update_group([u for u in updates if u is not None and not u.held])
        return updates

    def _start_client(
        self, round_ctx: RoundContext, client_id: int, live: bool = True
    ) -> tuple[ClientContext, dict[str, Any]]:
        """Runs a client's start hooks (the module then holds its start point; with ``live=False`` only when a hook
        or the probe reads it) and the aggregator's probe."""
        ctx = ClientContext(
            client_id=client_id,
            round_idx=round_ctx.round_idx,
            global_params=round_ctx.global_params,
            initial_params=round_ctx.global_params,
            num_samples=round_ctx.num_samples[client_id],
            store=round_ctx.store,
        )
        self.hooks.call("on_client_start", ctx)
        # A group trains from `ctx.initial_params`: the module holds them only for the hooks and probe that read it.
        if live or self._reads_start_point:
            copy_state_(self.live, ctx.initial_params)
        data_seed = self._data_seed(round_ctx, client_id)
        # Hooks get a loader of their own, and the RNG is seeded after them: whatever they iterate or draw cannot
        # shift the client's data order or dropout masks.
        if self.hooks.overriding("on_client_train_start"):
            self.hooks.call("on_client_train_start", ctx, self.datamodule.client_dataloader(client_id, seed=data_seed))
        return ctx, self._probe_client(ctx, data_seed)

    def _data_seed(self, round_ctx: RoundContext, client_id: int) -> int:
        return derive_seed(self.trainer.federation_state.seed, "data", round_ctx.round_idx, client_id)

    def _finish_client(
        self,
        round_ctx: RoundContext,
        ctx: ClientContext,
        update: ClientUpdate,
        optimizer_state: dict[Any, Any] | None,
        finite: bool | None = None,
        aggregate: bool = True,
    ) -> ClientUpdate | None:
        """Rejects a non-finite update (undoing the client's store writes) or commits it, runs ``on_client_end``
        and hands it to the aggregator; the client's store transaction must be open. ``finite``: whether the update
        is finite, when already known (a group checks all its clients at once). ``aggregate=False``: the caller
        hands the update to the aggregator (a group's go together, ``aggregator.update_group``)."""
        store = round_ctx.store
        round_ctx.bytes_down += state_nbytes(ctx.initial_params)
        round_ctx.bytes_up += state_nbytes(update.params)
        if finite is None:
            finite = all_finite(update.params)
        if not (finite and finite_tree(optimizer_state)):
            store.rollback()
            reject_client(self.trainer, round_ctx, ctx.client_id)
            return None
        store.commit()
        if optimizer_state is not None:
            store.put("optimizer", ctx.client_id, optimizer_state)
        self.hooks.call("on_client_end", ctx, update)
        if aggregate and not update.held:
            self.trainer.aggregator.update(update)
        return update

    def _release_held(
        self, round_ctx: RoundContext, held: list[ClientUpdate], train_metrics: dict[int, dict[str, float]]
    ) -> None:
        """Runs ``on_clients_end`` on the updates ``on_client_end`` hooks held back, then aggregates them.

        Every rank runs the hook, with or without held updates, so that a hook may exchange them across ranks. A
        held update that is no longer finite is rejected like a diverged client: whatever a hook wrote into it
        never reaches the global model. Its client-store writes stand: they came from training that was finite.
        """
        self.hooks.call("on_clients_end", round_ctx, held)
        for update in held:
            if all_finite(update.params):
                self.trainer.aggregator.update(update)
            else:
                train_metrics.pop(update.client_id, None)
                reject_client(self.trainer, round_ctx, update.client_id)

    def _probe_client(self, ctx: ClientContext, data_seed: int) -> dict[str, Any]:
        """The aggregator's client-side measurement (q-FedAvg's loss at the global model), for ``update.extras``."""
        if not self._aggregator_probes:
            return {}
        loader = self.datamodule.client_dataloader(ctx.client_id, seed=data_seed)
        return dict(self.trainer.aggregator.probe_client(self.trainer, self.module, ctx, loader))


def _never_stop(more: bool) -> tuple[bool, bool]:
    return False, more


__all__ = ["Boundary", "ClientHalf"]
