"""One federated round: sample, train each client, aggregate, evaluate."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from lightning.pytorch import LightningModule
from torch.optim import Optimizer

from lightning_fed import distributed
from lightning_fed.client import ClientContext, ClientUpdate, RoundContext, StateDict
from lightning_fed.evaluation import accuracy_key, client_statistics, evaluate
from lightning_fed.functional.state_dict import all_finite, clone_state, copy_state_, state_nbytes
from lightning_fed.local_training import LocalTrainer
from lightning_fed.seeding import derive_seed, seed_torch

if TYPE_CHECKING:
    from lightning_fed.trainer import FederatedTrainer

# Per-client results of the global model and of personalised models are logged under different names, so that
# nobody reads one for the other.
CLIENT_PREFIX = "client/"
PERSONAL_PREFIX = "personal/"


def fed_participants(trainer: FederatedTrainer) -> list[Any]:
    """Everything that receives federated hooks: the callbacks, then the aggregator."""
    return [*trainer.callbacks, trainer.aggregator]


class ClientDivergedError(FloatingPointError):
    """Raised when a client's update is not finite and ``on_client_divergence="raise"``."""


class RoundRunner:
    """Runs the rounds of a fit on the trainer's module, with the trainer's settings and state.

    The module holds the global model between rounds; during a round it is loaded with each client's start point
    in turn, trained in place, and finally loaded with the aggregate. Everything random is drawn from seeds derived
    from ``(run seed, purpose, round, client)``, so a round does not depend on the rounds before it or on where it
    runs, and a resumed run is bit-identical.
    """

    def __init__(self, trainer: FederatedTrainer, module: LightningModule, count_step: Any) -> None:
        self.trainer = trainer
        self.module = module
        self.datamodule = trainer.datamodule
        self.local = LocalTrainer(trainer, module, count_step)
        self.live: StateDict = module.state_dict(keep_vars=True)
        self._test_loader = None
        self._steps_taken = 0
        self.last_client_metrics: dict[int, dict[str, float]] = {}
        self.last_client_prefix = CLIENT_PREFIX
        self.last_round_ctx: RoundContext | None = None

    @property
    def state(self) -> Any:
        return self.trainer.federation_state

    def dispatch(self, hook: str, *args: Any) -> None:
        for callback in fed_participants(self.trainer):
            method = getattr(callback, hook, None)
            if callable(method):
                method(self.trainer, self.module, *args)

    def run(self, round_idx: int) -> dict[str, float]:
        """Trains, aggregates and evaluates round ``round_idx``; returns its metrics (validation not included).

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
        )
        self.dispatch("on_round_start", round_ctx)
        # Every rank ran on_round_start alike: what it stored needs no exchange.
        self.state.store.take_changes()
        trainer.aggregator.reset(global_params, round_ctx)
        bytes_before = (round_ctx.bytes_up, round_ctx.bytes_down)
        shares = distributed.shard_clients(client_ids, round_ctx.num_samples, distributed.world_size())
        train_metrics: dict[int, dict[str, float]] = {}
        self._steps_taken = 0
        for client_id in shares[distributed.rank()]:
            update = self._train_client(round_ctx, client_id)
            if update is not None:
                train_metrics[client_id] = update.metrics
        ordered_metrics = self._combine_shares(round_ctx, bytes_before, train_metrics)
        self._sync_store()
        new_params = trainer.aggregator.compute(global_params)
        self.dispatch("on_aggregate", round_ctx, new_params)
        # on_aggregate runs alike on every rank too: its store writes need no exchange either.
        self.state.store.take_changes()
        copy_state_(self.live, new_params)
        metrics = self._round_metrics(round_ctx, ordered_metrics)
        metrics.update(trainer.aggregator.round_metrics())  # TEMPORARY (issue 12, wt-server)
        metrics.update(self._evaluate(round_idx, client_ids))
        metrics["time/round_s"] = time.perf_counter() - start
        self.last_round_ctx = round_ctx
        return metrics

    def _combine_shares(
        self, round_ctx: RoundContext, bytes_before: tuple[int, int], train_metrics: dict[int, dict[str, float]]
    ) -> list[dict[str, float]]:
        """Merges the ranks' client metrics, rejections, bytes and optimizer steps; returns the metrics in round order.

        Bytes counted before training (by ``on_round_start``, alike on every rank) are counted once; the per-client
        bytes of every rank are added to them.
        """
        share = {
            "metrics": train_metrics,
            "rejected": list(round_ctx.rejected),
            "bytes": (round_ctx.bytes_up - bytes_before[0], round_ctx.bytes_down - bytes_before[1]),
            "steps": self._steps_taken,
        }
        shares = distributed.all_gather_object(share)
        if len(shares) == 1:
            return list(train_metrics.values())
        position = {cid: i for i, cid in enumerate(round_ctx.client_ids)}
        merged = {cid: m for other in shares for cid, m in other["metrics"].items()}
        rejected = {cid for other in shares for cid in other["rejected"]}
        round_ctx.rejected[:] = sorted(rejected, key=position.__getitem__)
        round_ctx.bytes_up = bytes_before[0] + sum(other["bytes"][0] for other in shares)
        round_ctx.bytes_down = bytes_before[1] + sum(other["bytes"][1] for other in shares)
        # global_step counts every optimizer step of the round, as in one process, on every rank.
        self.local.count_step(sum(other["steps"] for other in shares) - self._steps_taken)
        return [merged[cid] for cid in sorted(merged, key=position.__getitem__)]

    def _sync_store(self) -> None:
        """Gives every rank the client-store entries that the others wrote since the last exchange."""
        changes = self.state.store.take_changes()
        if not distributed.is_distributed():
            return
        own = distributed.rank()
        for other_rank, other in enumerate(distributed.all_gather_object(changes)):
            if other_rank != own:
                self.state.store.apply_changes(other)

    def _train_client(self, round_ctx: RoundContext, client_id: int) -> ClientUpdate | None:
        trainer, seed = self.trainer, self.state.seed
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
        data_seed = derive_seed(seed, "data", round_ctx.round_idx, client_id)
        # Hooks get a loader of their own, and the RNG is seeded after them: whatever they iterate or draw cannot
        # shift the client's data order or dropout masks.
        self.dispatch("on_client_train_start", ctx, self.datamodule.client_dataloader(client_id, seed=data_seed))
        # TEMPORARY (issue 12, wt-server): the lead redoes this call when round.py is split.
        probe = trainer.aggregator.probe_client(
            trainer, self.module, ctx, self.datamodule.client_dataloader(client_id, seed=data_seed)
        )
        seed_torch(derive_seed(seed, "torch", round_ctx.round_idx, client_id))
        loader = self.datamodule.client_dataloader(client_id, seed=data_seed)
        optimizer = self._client_optimizer(client_id)
        metrics = self.local.fit_client(ctx, loader, optimizer, trainer.local_epochs, trainer.local_steps)
        self._steps_taken += ctx.num_steps
        update = ClientUpdate(client_id, ctx.num_samples, ctx.num_steps, clone_state(self.live), metrics)
        update.extras.update(probe)
        round_ctx.bytes_down += state_nbytes(ctx.initial_params)
        round_ctx.bytes_up += state_nbytes(update.params)
        if trainer.keep_optimizer_state:
            self.state.store.put("optimizer", client_id, optimizer.state_dict()["state"])
        if not all_finite(update.params):
            return self._reject(round_ctx, client_id)
        self.dispatch("on_client_end", ctx, update)
        trainer.aggregator.update(update)
        return update

    def _reject(self, round_ctx: RoundContext, client_id: int) -> None:
        round_ctx.rejected.append(client_id)
        message = (
            f"Client {client_id} diverged in round {round_ctx.round_idx}: its update holds NaN or Inf."
        )
        if self.trainer.on_client_divergence == "raise":
            raise ClientDivergedError(
                f"{message} Lower the learning rate, clip gradients (`gradient_clip_val`), or set"
                " `on_client_divergence='skip'` to drop such clients from the aggregate."
            )
        self.trainer.print(f"[lightning_fed] {message} It was left out of the aggregate.")
        return None

    def _client_optimizer(self, client_id: int) -> Optimizer:
        """The trainer's optimizer, with fresh state (or the client's own state when it is kept)."""
        optimizer = self.trainer.optimizers[0]
        optimizer.state.clear()
        stored = self.state.store.get("optimizer", client_id) if self.trainer.keep_optimizer_state else None
        if stored is not None:
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

    def _evaluate(self, round_idx: int, sampled: list[int]) -> dict[str, float]:
        trainer, dm = self.trainer, self.datamodule
        is_last = round_idx + 1 == trainer.num_rounds
        metrics: dict[str, float] = {}
        if trainer.eval_every_n_rounds and ((round_idx + 1) % trainer.eval_every_n_rounds == 0 or is_last):
            if self._test_loader is None:
                self._test_loader = dm.test_dataloader()
            result = evaluate(trainer, self.module, self._test_loader, self.local.buffer)
            metrics.update({f"global/{key}": value for key, value in result.items()})
        every = trainer.client_eval_every_n_rounds
        if trainer.client_eval != "none" and every and ((round_idx + 1) % every == 0 or is_last):
            client_ids = list(range(dm.num_clients)) if trainer.client_eval == "all" else sampled
            self.last_client_metrics, personalised = self._evaluate_clients(round_idx, client_ids)
            self.last_client_prefix = PERSONAL_PREFIX if personalised else CLIENT_PREFIX
            metrics.update(client_statistics(self.last_client_metrics, prefix=self.last_client_prefix))
        return metrics

    def _evaluate_clients(self, round_idx: int, client_ids: list[int]) -> tuple[dict[int, dict[str, float]], bool]:
        """Evaluates each client on its own test split; returns the results and whether any model was personalised.

        With several processes each rank evaluates every ``world_size``-th client and the results are gathered, so
        every rank returns all of them, in ``client_ids`` order.
        """
        world = distributed.world_size()
        results, any_personalised = self._evaluate_share(round_idx, client_ids[distributed.rank() :: world])
        if world == 1:
            return results, any_personalised
        shares = distributed.all_gather_object((results, any_personalised))
        self._sync_store()
        merged = {cid: metrics for share, _ in shares for cid, metrics in share.items()}
        return {cid: merged[cid] for cid in client_ids if cid in merged}, any(flag for _, flag in shares)

    def _evaluate_share(self, round_idx: int, client_ids: list[int]) -> tuple[dict[int, dict[str, float]], bool]:
        global_params = None
        any_personalised = False
        results: dict[int, dict[str, float]] = {}
        for client_id in client_ids:
            # Built on demand (tens of µs): caching a loader per client would grow with the federation.
            loader = self.datamodule.client_test_dataloader(client_id)
            if loader is None:
                continue
            if global_params is None:
                global_params = clone_state(self.live)
            ctx = ClientContext(client_id, round_idx, global_params, global_params, self.datamodule.client_num_samples(client_id), self.state.store)
            self.dispatch("on_client_evaluate_start", ctx)
            personalised = ctx.initial_params is not global_params
            any_personalised |= personalised
            if personalised:
                copy_state_(self.live, ctx.initial_params)
            results[client_id] = evaluate(self.trainer, self.module, loader, self.local.buffer)
            if personalised:
                copy_state_(self.live, global_params)
        return results, any_personalised

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
        ctx = ClientContext(client_id, round_idx, saved, start_params, self.datamodule.client_num_samples(client_id), self.state.store)
        epochs = epochs if epochs is not None or steps is not None else 1
        try:
            self.local.fit_client(ctx, loader, optimizer, epochs, steps, federated=False)
            return clone_state(self.live)
        finally:
            optimizer.state.clear()
            copy_state_(self.live, saved)
            self.module.train(was_training)

    @staticmethod
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
