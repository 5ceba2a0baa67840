"""One federated round: sample, train each client, aggregate.

Evaluation is delegated to :class:`~lightning_fed.engine.evaluator.RoundEvaluator` and cross-process merging to
:mod:`lightning_fed.engine.rank_shares`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch
from lightning.fabric.utilities.apply_func import apply_to_collection
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import Tensor
from torch.optim import Optimizer

from lightning_fed.aggregation import Aggregator
from lightning_fed.context import ClientContext, ClientUpdate, FederationState, RoundContext, RoundResult
from lightning_fed.engine.batched.training import ClientGroups
from lightning_fed.engine.evaluator import RoundEvaluator
from lightning_fed.engine.local_training import LocalTrainer
from lightning_fed.engine.rank_shares import combine_shares, sync_store
from lightning_fed.engine.rejection import finite_tree, reject_client
from lightning_fed.engine.seeding import derive_seed, seed_torch
from lightning_fed.functional.state_dict import StateDict, all_finite, clone_state, copy_state_, state_nbytes
from lightning_fed.parallel import distributed

if TYPE_CHECKING:
    from lightning_fed.trainer import FederatedTrainer


def fed_participants(trainer: FederatedTrainer) -> list[Any]:
    """Everything that receives federated hooks: the callbacks.

    The aggregator receives none: what it needs from a client it asks for in ``Aggregator.probe_client``, and what
    it reports for the round it returns from ``Aggregator.round_metrics``.
    """
    return list(trainer.callbacks)


def trainable_parameter_names(module: LightningModule) -> frozenset[str]:
    """The state-dict keys of ``module``'s trainable parameters, tied ones under every name they have."""
    return frozenset(name for name, p in module.named_parameters(remove_duplicate=False) if p.requires_grad)


class RoundRunner:
    """Runs the rounds of a fit on the trainer's module, with the trainer's settings and state.

    The module holds the global model between rounds; during a round it is loaded with each client's start point
    in turn, trained in place, and finally loaded with the aggregate. Everything random is drawn from seeds derived
    from ``(run seed, purpose, round, client)``, so a round does not depend on the rounds before it or on where it
    runs, and a resumed run is bit-identical.

    Args:
        trainer: The federated trainer (settings, sampler, aggregator, callbacks, federation state).
        module: The user's LightningModule.
        count_step: Advances ``trainer.global_step`` by one optimizer step (``count_step(n)``: by ``n``).
    """

    def __init__(self, trainer: FederatedTrainer, module: LightningModule, count_step: Any) -> None:
        self.trainer = trainer
        self.module = module
        self.datamodule = trainer.datamodule
        self.local = LocalTrainer(trainer, module, count_step)
        self.batched = ClientGroups(trainer, module, count_step)
        self.live: StateDict = module.state_dict(keep_vars=True)
        self.evaluator = RoundEvaluator(trainer, module, self.live, self.local.buffer, self.dispatch)
        self._steps_taken = 0
        # A probe costs a pass over the client's data: only aggregators that define one get a loader.
        self._aggregator_probes = is_overridden("probe_client", trainer.aggregator, Aggregator)
        if distributed.is_distributed():
            distributed.destroy_process_group_at_exit()

    @property
    def state(self) -> FederationState:
        """The run's federated state (seed, counters, history, client store)."""
        return self.trainer.federation_state

    def dispatch(self, hook: str, *args: Any) -> None:
        """Calls federated hook ``hook`` on every callback that defines it."""
        for callback in fed_participants(self.trainer):
            method = getattr(callback, hook, None)
            if callable(method):
                method(self.trainer, self.module, *args)

    def run(self, round_idx: int) -> RoundResult:
        """Trains, aggregates and evaluates round ``round_idx``; returns its result (validation not included).

        With several processes every rank runs this with the same sampled clients and trains its share of them;
        what the shares produce (client store entries, metrics, bytes, steps, the aggregate) is combined across
        ranks before the aggregator computes, so every rank leaves the round in the same state.
        """
        start = time.perf_counter()
        trainer, dm = self.trainer, self.datamodule
        client_ids = trainer.sampler.sample(round_idx, dm.num_clients)
        global_params = clone_state(self.live)
        round_ctx = RoundContext(
            round_idx=round_idx,
            client_ids=client_ids,
            global_params=global_params,
            num_samples={cid: dm.client_num_samples(cid) for cid in client_ids},
            store=self.state.store,
            parameter_names=trainable_parameter_names(self.module),
        )
        self.dispatch("on_round_start", round_ctx)
        # Every rank ran on_round_start alike: what it stored needs no exchange.
        self.state.store.take_changes()
        trainer.aggregator.reset(global_params, round_ctx)
        bytes_before = (round_ctx.bytes_up, round_ctx.bytes_down)
        shares = distributed.shard_clients(client_ids, round_ctx.num_samples, distributed.world_size())
        train_metrics: dict[int, dict[str, float]] = {}
        held: list[ClientUpdate] = []
        self._steps_taken = 0
        for group in self.batched.groups(shares[distributed.rank()]):
            updates = (
                self._train_group(round_ctx, group) if len(group) > 1 else [self._train_client(round_ctx, group[0])]
            )
            for update in updates:
                if update is not None:
                    train_metrics[update.client_id] = update.metrics
                    if update.held:
                        held.append(update)
        self._release_held(round_ctx, held, train_metrics)
        ordered_metrics, other_steps = combine_shares(round_ctx, bytes_before, train_metrics, self._steps_taken)
        if other_steps and self.local.count_step is not None:
            # global_step counts every optimizer step of the round, as in one process, on every rank.
            self.local.count_step(other_steps)
        sync_store(self.state.store)
        new_params = trainer.aggregator.compute(global_params)
        self.dispatch("on_aggregate", round_ctx, new_params)
        # on_aggregate runs alike on every rank too: its store writes need no exchange either.
        self.state.store.take_changes()
        copy_state_(self.live, new_params)
        metrics = self._round_metrics(round_ctx, ordered_metrics)
        # The aggregator's own measurements of the round (q-FedAvg's mean loss at the global model).
        metrics.update(trainer.aggregator.round_metrics())
        eval_metrics, client_results, client_prefix = self.evaluator.run(round_idx, client_ids)
        metrics.update(eval_metrics)
        metrics["time/round_s"] = time.perf_counter() - start
        return RoundResult(round_ctx, metrics, client_results, client_prefix)

    def _train_client(self, round_ctx: RoundContext, client_id: int) -> ClientUpdate | None:
        store = round_ctx.store
        # Whatever the client's hooks write to the store before its update is known to be finite is undone if it
        # is not: a diverged update leaves no state behind that would poison the client's next participation.
        store.begin()
        try:
            ctx, probe = self._start_client(round_ctx, client_id)
            seed_torch(derive_seed(self.state.seed, "torch", round_ctx.round_idx, client_id))
            loader = self.datamodule.client_dataloader(client_id, seed=self._data_seed(round_ctx, client_id))
            optimizer = self._client_optimizer(client_id)
            trainer = self.trainer
            metrics = self.local.fit_client(ctx, loader, optimizer, trainer.local_epochs, trainer.local_steps)
            self._steps_taken += ctx.num_steps
            update = ClientUpdate(client_id, ctx.num_samples, ctx.num_steps, clone_state(self.live), metrics, probe)
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
                started.append(self._start_client(round_ctx, client_id))
                transactions.append(store.suspend())
            contexts = [ctx for ctx, _ in started]
            seeds = [self._data_seed(round_ctx, cid) for cid in client_ids]
            loaders = [self.datamodule.client_dataloader(cid, seed=seed) for cid, seed in zip(client_ids, seeds)]
            seed_torch(derive_seed(self.state.seed, "torch", round_ctx.round_idx, "group", *client_ids))
            results = self.batched.fit_group(contexts, loaders)
        except BaseException:
            store.rollback()
            for transaction in reversed(transactions):
                store.resume(transaction)
                store.rollback()
            raise
        updates: list[ClientUpdate | None] = []
        for (ctx, probe), transaction, (params, metrics, finite) in zip(started, transactions, results):
            self._steps_taken += ctx.num_steps
            update = ClientUpdate(ctx.client_id, ctx.num_samples, ctx.num_steps, params, metrics, probe)
            if self.batched.needs_live_model:
                # on_client_end's contract: the module holds the client's local model.
                copy_state_(self.live, params)
            store.resume(transaction)
            updates.append(self._finish_client(round_ctx, ctx, update, None, finite))
        return updates

    def _start_client(self, round_ctx: RoundContext, client_id: int) -> tuple[ClientContext, dict[str, Any]]:
        """Runs a client's start hooks (the module then holds its start point) and the aggregator's probe."""
        ctx = ClientContext(
            client_id=client_id,
            round_idx=round_ctx.round_idx,
            global_params=round_ctx.global_params,
            initial_params=round_ctx.global_params,
            num_samples=round_ctx.num_samples[client_id],
            store=round_ctx.store,
        )
        self.dispatch("on_client_start", ctx)
        copy_state_(self.live, ctx.initial_params)
        data_seed = self._data_seed(round_ctx, client_id)
        # Hooks get a loader of their own, and the RNG is seeded after them: whatever they iterate or draw cannot
        # shift the client's data order or dropout masks.
        self.dispatch("on_client_train_start", ctx, self.datamodule.client_dataloader(client_id, seed=data_seed))
        return ctx, self._probe_client(ctx, data_seed)

    def _data_seed(self, round_ctx: RoundContext, client_id: int) -> int:
        return derive_seed(self.state.seed, "data", round_ctx.round_idx, client_id)

    def _finish_client(
        self,
        round_ctx: RoundContext,
        ctx: ClientContext,
        update: ClientUpdate,
        optimizer_state: dict[Any, Any] | None,
        finite: bool | None = None,
    ) -> ClientUpdate | None:
        """Rejects a non-finite update (undoing the client's store writes) or commits it, runs ``on_client_end``
        and hands it to the aggregator; the client's store transaction must be open. ``finite``: whether the update
        is finite, when already known (a group checks all its clients at once)."""
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
        self.dispatch("on_client_end", ctx, update)
        if not update.held:
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
        self.dispatch("on_clients_end", round_ctx, held)
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

    def _client_optimizer(self, client_id: int) -> Optimizer:
        """The trainer's optimizer, with fresh state (or the client's own state when it is kept)."""
        optimizer = self.trainer.optimizers[0]
        optimizer.state.clear()
        stored = self.state.store.get("optimizer", client_id) if self.trainer.keep_optimizer_state else None
        if stored is not None:
            # load_state_dict keeps CPU tensors as they are: without a copy the optimizer would step the stored
            # momentum in place, and a diverging step would poison the kept state even if the update is rejected.
            stored = apply_to_collection(stored, Tensor, torch.clone)
            optimizer.load_state_dict({"state": stored, "param_groups": optimizer.state_dict()["param_groups"]})
        return optimizer

    def _round_metrics(self, round_ctx: RoundContext, train_metrics: list[dict[str, float]]) -> dict[str, float]:
        """The round's metrics; ``train_metrics`` holds every accepted client's, in round order."""
        state = self.state
        state.bytes_up += round_ctx.bytes_up
        state.bytes_down += round_ctx.bytes_down
        state.rejected_total += len(round_ctx.rejected)
        metrics: dict[str, float] = {
            "round": float(round_ctx.round_idx + 1),
            "comm/bytes_up": float(state.bytes_up),
            "comm/bytes_down": float(state.bytes_down),
            "clients/sampled": float(len(round_ctx.client_ids)),
            "clients/rejected": float(len(round_ctx.rejected)),
        }
        for key in sorted({k for m in train_metrics for k in m}):
            values = [m[key] for m in train_metrics if key in m]
            name = key.removeprefix("train_").removeprefix("train/")
            metrics[f"train/{name}"] = sum(values) / len(values)
        return metrics

    def train_locally(
        self,
        client_id: int,
        round_idx: int,
        start_params: StateDict,
        epochs: int | None = None,
        steps: int | None = None,
        purpose: str = "finetune",
    ) -> StateDict:
        """Trains ``start_params`` on a client's training data and returns the result; the global model is untouched.

        This is plain local training, for fine-tuning and for personalised models that train outside the round
        (FedAvg-FT, FedProx-FT): the optimizer starts from fresh state, no algorithm's ``client_loss`` or gradient
        hook runs, and the data order and RNG derive from ``(seed, purpose, round, client)``, so the result is
        reproducible and does not shift any other draw of the run.

        Args:
            client_id: Whose training data to use.
            round_idx: The round it belongs to (part of the seed).
            start_params: Where training starts (every key of the model's state).
            epochs: Local passes (default 1 when ``steps`` is not set).
            steps: Optimizer steps instead of epochs.
            purpose: Seed namespace, so that two uses in one round draw different data orders.

        Returns:
            The trained state (detached copies).
        """
        saved = clone_state(self.live)
        was_training = self.module.training
        copy_state_(self.live, start_params)
        seed = self.state.seed
        data_seed = derive_seed(seed, purpose, "data", round_idx, client_id)
        seed_torch(derive_seed(seed, purpose, "torch", round_idx, client_id))
        loader = self.datamodule.client_dataloader(client_id, seed=data_seed)
        optimizer = self.trainer.optimizers[0]
        optimizer.state.clear()
        ctx = ClientContext(
            client_id, round_idx, saved, start_params, self.datamodule.client_num_samples(client_id), self.state.store
        )
        epochs = epochs if epochs is not None or steps is not None else 1
        try:
            self.local.fit_client(ctx, loader, optimizer, epochs, steps, federated=False)
            return clone_state(self.live)
        finally:
            optimizer.state.clear()
            copy_state_(self.live, saved)
            self.module.train(was_training)
