"""The server half of a round: open it (sample, hooks, aggregator reset) and close it (combine what the client
half produced, reduce the declared round state, aggregate, evaluate, report the round's metrics).

Every step here runs alike on every rank (with several processes each rank holds the server's state), so what the
server half computes and stores needs no exchange; only the client shares are combined, by
:func:`~lightning_fed.engine.rank_shares.combine_shares` and :func:`~lightning_fed.engine.rank_shares.sync_store`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from lightning.pytorch import LightningModule

from lightning_fed.context import ClientShare, RoundContext, RoundResult
from lightning_fed.engine.dispatch import HookDispatcher
from lightning_fed.engine.evaluator import RoundEvaluator
from lightning_fed.engine.rank_shares import combine_shares, sync_store
from lightning_fed.engine.step_counter import StepCounter
from lightning_fed.functional.state_dict import StateDict, clone_state, copy_state_
from lightning_fed.parallel.reduction import CrossProcessState

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView


def trainable_parameter_names(module: LightningModule) -> frozenset[str]:
    """The state-dict keys of ``module``'s trainable parameters, tied ones under every name they have."""
    return frozenset(name for name, p in module.named_parameters(remove_duplicate=False) if p.requires_grad)


class ServerHalf:
    """Opens and closes the rounds of a fit on the trainer's module, which holds the global model between rounds.

    Args:
        trainer: The federated trainer (sampler, aggregator, callbacks, federation state).
        module: The user's LightningModule.
        live: The module's live state (``state_dict(keep_vars=True)``), loaded with the aggregate at the end.
        steps: The fit's step counter (advanced by the other ranks' steps once shares are combined).
        hooks: Calls the callbacks' federated hooks.
        evaluator: The round's evaluation phase.
    """

    def __init__(
        self,
        trainer: FederatedTrainerView,
        module: LightningModule,
        live: StateDict,
        steps: StepCounter,
        hooks: HookDispatcher,
        evaluator: RoundEvaluator,
    ) -> None:
        self.trainer = trainer
        self.module = module
        self.live = live
        self.steps = steps
        self.hooks = hooks
        self.evaluator = evaluator
        self._bytes_before_clients = (0, 0)

    def open_round(self, round_idx: int) -> RoundContext:
        """Samples the round's clients, runs ``on_round_start`` and resets the aggregator.

        The returned context holds a snapshot of the global model: every client of the round starts from it.
        """
        trainer, dm = self.trainer, self.trainer.datamodule
        client_ids = trainer.sampler.sample(round_idx, dm.num_clients)
        return self.start_round(round_idx, client_ids, {cid: dm.client_num_samples(cid) for cid in client_ids})

    def start_round(self, round_idx: int, client_ids: list[int], num_samples: dict[int, int]) -> RoundContext:
        """Opens round ``round_idx`` with clients already sampled: runs ``on_round_start`` and resets the aggregator.

        A client site of a deployment (:mod:`lightning_fed.deploy`) opens the round the server sampled this way, so
        that its algorithms hold what the server's hold when the clients train (the broadcast state is loaded
        first).

        Args:
            round_idx: The round.
            client_ids: The round's clients, in round order.
            num_samples: Each client's training-set size.
        """
        trainer = self.trainer
        state = trainer.federation_state
        global_params = clone_state(self.live)
        round_ctx = RoundContext(
            round_idx=round_idx,
            client_ids=list(client_ids),
            global_params=global_params,
            num_samples=dict(num_samples),
            store=state.store,
            parameter_names=trainable_parameter_names(self.module),
        )
        self.hooks.call("on_round_start", round_ctx)
        # Every rank ran on_round_start alike: what it stored needs no exchange.
        state.store.take_changes()
        trainer.aggregator.reset(global_params, round_ctx)
        # Bytes counted so far (by on_round_start, alike on every rank) are counted once when shares are combined.
        self._bytes_before_clients = (round_ctx.bytes_up, round_ctx.bytes_down)
        return round_ctx

    def close_round(self, round_ctx: RoundContext, share: ClientShare, started: float) -> RoundResult:
        """Combines the client shares, aggregates, runs ``on_aggregate``, loads the new global model, evaluates it.

        Args:
            round_ctx: The round :meth:`open_round` opened.
            share: What this process's client half produced.
            started: ``time.perf_counter()`` when the round opened (the round's wall time is reported).
        """
        trainer, store = self.trainer, self.trainer.federation_state.store
        ordered_metrics, other_steps = combine_shares(round_ctx, self._bytes_before_clients, share)
        # global_step counts every optimizer step of the round, as in one process, on every rank.
        self.steps.add_other_ranks(other_steps)
        sync_store(store)
        new_params = trainer.aggregator.compute(round_ctx.global_params)
        # Callbacks' declared round state covers every rank's clients before on_aggregate reads it (the base's duty,
        # as the aggregator's compute reduces its own).
        for callback in self.hooks.callbacks:
            if isinstance(callback, CrossProcessState):
                callback.reduce_round_state()
        self.hooks.call("on_aggregate", round_ctx, new_params)
        # on_aggregate runs alike on every rank too: its store writes need no exchange either.
        store.take_changes()
        copy_state_(self.live, new_params)
        metrics = self._round_metrics(round_ctx, ordered_metrics)
        if share.dropped is not None:
            metrics["clients/dropped"] = float(len(share.dropped))
        # The aggregator's own measurements of the round (q-FedAvg's mean loss at the global model).
        metrics.update(trainer.aggregator.round_metrics())
        eval_metrics, client_results, client_prefix = self.evaluator.run(round_ctx.round_idx, round_ctx.client_ids)
        metrics.update(eval_metrics)
        metrics["time/round_s"] = time.perf_counter() - started
        return RoundResult(round_ctx, metrics, client_results, client_prefix)

    def _round_metrics(self, round_ctx: RoundContext, train_metrics: list[dict[str, float]]) -> dict[str, float]:
        """The round's metrics; ``train_metrics`` holds every accepted client's, in round order."""
        state = self.trainer.federation_state
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


__all__ = ["ServerHalf", "trainable_parameter_names"]
