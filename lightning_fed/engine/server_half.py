"""The server half of a round: open it (sample, hooks, aggregator reset), hand its clients out as
:class:`~lightning_fed.messages.ClientTask` s, fold the :class:`~lightning_fed.messages.ClientReply` s in, and close
it (reduce the declared round state, aggregate, evaluate, report the round's metrics).

Every step here runs alike on every rank (with several processes each rank holds the server's state), so what the
server half computes and stores needs no exchange; only the replies are combined, by
:func:`~lightning_fed.engine.rank_shares.combine_replies` and :func:`~lightning_fed.engine.rank_shares.sync_store`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lightning.pytorch import LightningModule

from lightning_fed.context import RoundContext, RoundResult
from lightning_fed.engine.algorithm_state import algorithm_objects
from lightning_fed.engine.dispatch import HookDispatcher
from lightning_fed.engine.evaluator import RoundEvaluator
from lightning_fed.engine.rank_shares import combine_replies, sync_store
from lightning_fed.engine.rejection import reject_client
from lightning_fed.engine.step_counter import StepCounter
from lightning_fed.functional.state_dict import StateDict, clone_state, copy_state_
from lightning_fed.messages import ClientReply, ClientTask
from lightning_fed.parallel.reduction import CrossProcessState

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView


def trainable_parameter_names(module: LightningModule) -> frozenset[str]:
    """The state-dict keys of ``module``'s trainable parameters, tied ones under every name they have."""
    return frozenset(name for name, p in module.named_parameters(remove_duplicate=False) if p.requires_grad)


@dataclass
class _Folded:
    """What the replies of the open round brought, besides the round state: every accepted client's training
    metrics in round order, and the clients that never answered (``None``: no reply could go missing)."""

    train_metrics: list[dict[str, float]] = field(default_factory=list)
    dropped: list[int] | None = None


class ServerHalf:
    """Opens and closes the rounds of a fit on the trainer's module, which holds the global model between rounds.

    Args:
        trainer: The federated trainer (sampler, aggregator, callbacks, federation state).
        module: The user's LightningModule.
        live: The live tensors of the module's federated part (``functional.federated_state``), loaded with the
            aggregate at the end.
        steps: The fit's step counter (advanced by the other ranks' steps once the replies are combined).
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
        self._folded = _Folded()

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
        self.steps.start_round()
        self._folded = _Folded()
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
        # Bytes counted so far (by on_round_start, alike on every rank) are counted once when the replies are combined.
        self._bytes_before_clients = (round_ctx.bytes_up, round_ctx.bytes_down)
        return round_ctx

    def task(self, round_ctx: RoundContext, client_ids: list[int]) -> ClientTask:
        """The task of a client half that runs beside this server half, on the same algorithm objects: train
        ``client_ids`` (a share of the round, in round order) in the round :meth:`open_round` opened."""
        return ClientTask(
            round_idx=round_ctx.round_idx,
            client_ids=list(client_ids),
            round_clients=round_ctx.client_ids,
            num_samples=round_ctx.num_samples,
            seed=self.trainer.federation_state.seed,
            global_params=round_ctx.global_params,
        )

    def fold(self, round_ctx: RoundContext, replies: list[ClientReply]) -> None:
        """Takes the round's replies in, in round order: their clients' metrics, rejections, bytes and steps, and
        the round state of each reply that carries it (a client half apart from this one: a deployment's site), so
        that :meth:`close_round` closes the round as if every client had trained beside it.

        Every rank folds its own replies, then the ranks' are combined (a collective: every rank calls this once per
        round). A reply whose round state is in place (``None``) was produced on this process's objects: its
        clients' rejections were announced and its steps counted where they happened.
        """
        trainer, folded = self.trainer, self._folded
        metrics: dict[int, dict[str, float]] = {}
        objects = algorithm_objects(trainer)
        for reply in replies:
            in_place = reply.round_state is None
            if not in_place and folded.dropped is None:
                folded.dropped = []  # replies from elsewhere: a client may fail to answer
            for client_id in reply.dropped:
                round_ctx.rejected.append(client_id)
                assert folded.dropped is not None
                folded.dropped.append(client_id)
                trainer.print(
                    f"[lightning_fed] Client {client_id} did not reply in round {round_ctx.round_idx}: it was left"
                    " out of the aggregate."
                )
            for client_id, because in reply.rejected.items():
                if in_place:
                    round_ctx.rejected.append(client_id)
                else:
                    reject_client(trainer, round_ctx, client_id, because or "its site rejected it")
            answered = [cid for cid in reply.client_ids if cid not in reply.rejected and cid not in reply.dropped]
            if reply.round_state and (answered or not reply.client_ids):
                for key, obj in objects.items():
                    # Under secure aggregation a site's reply holds what is not a sum; the sums come as one total.
                    obj.absorb_round_state(reply.round_state[key], partial=reply.partial)
            if not in_place:
                self.steps.add(reply.steps)
            metrics.update(reply.train_metrics)
            round_ctx.bytes_up += reply.bytes_up
            round_ctx.bytes_down += reply.bytes_down
        own_steps = sum(reply.steps for reply in replies)
        folded.train_metrics, other_steps = combine_replies(round_ctx, self._bytes_before_clients, metrics, own_steps)
        # global_step counts every optimizer step of the round, as in one process, on every rank.
        self.steps.add_other_ranks(other_steps)

    def close_round(self, round_ctx: RoundContext, started: float) -> RoundResult:
        """Aggregates the folded round, runs ``on_aggregate``, loads the new global model, evaluates it.

        Args:
            round_ctx: The round :meth:`open_round` opened, its replies folded (:meth:`fold`).
            started: ``time.perf_counter()`` when the round opened (the round's wall time is reported).
        """
        trainer, store = self.trainer, self.trainer.federation_state.store
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
        metrics = self._round_metrics(round_ctx, self._folded.train_metrics)
        if self._folded.dropped is not None:
            metrics["clients/dropped"] = float(len(self._folded.dropped))
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
