"""The server's side of a deployed round: its clients train at their sites, and their round state is folded in.

:class:`RemoteClients` takes the place of the client half in the server's round
(:class:`~lightning_fed.engine.round.RoundRunner`'s ``client_side``): after the server half opened the round
(sampled, ran ``on_round_start``, reset the aggregator), it sends each sampled client a
:class:`~lightning_fed.deploy.wire.RoundTask`, and folds the replies' round state into the server's algorithm
objects in round order (``CrossProcessState.absorb_round_state``), so that the server half closes the round exactly
as one process would: the same ``compute``, ``on_aggregate``, evaluation, logging and checkpoint. Under secure
aggregation the sums arrive as one total over the round's replies (:mod:`~lightning_fed.deploy.secure_sum`), folded
in once.

The server also keeps, per client, the newest round whose reply it folded (its client store's :data:`FOLDED`
namespace, checkpointed with the round), and each task names it: a site may have written a round's version and
then lost its reply (killed, or too late), and must not continue from a state the server never absorbed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning.pytorch import LightningModule
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_fed.context import ClientShare, RoundContext
from lightning_fed.deploy.algorithms import algorithm_fingerprint, algorithm_objects, broadcast
from lightning_fed.deploy.secure_sum import rebuild_sums, split_round_state
from lightning_fed.deploy.transport import Transport
from lightning_fed.deploy.wire import RoundTask
from lightning_fed.engine.dispatch import HookDispatcher
from lightning_fed.engine.rejection import reject_client
from lightning_fed.engine.round import ClientSideFactory
from lightning_fed.engine.schedulers import scheduler_snapshot
from lightning_fed.engine.step_counter import StepCounter
from lightning_fed.functional.state_dict import StateDict, clone_state

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView

#: The namespace of the server's client store that holds each client's newest folded round. The server's store is
#: otherwise empty in a deployment (the clients' own state stays at their sites), and it is in every checkpoint, so a
#: resumed server knows which versions the checkpoint absorbed.
FOLDED = "deploy"


class RemoteClients:
    """Trains a round's clients at their sites over ``transport``.

    Args:
        transport: Reaches the sites.
        trainer: The server's federated trainer.
        module: The server's module (it holds the global model).
        steps: The fit's step counter; advanced by the steps the sites took.
        hooks: The server's hook dispatcher (unused: the per-client hooks run at the sites).
    """

    def __init__(
        self,
        transport: Transport,
        trainer: FederatedTrainerView,
        module: LightningModule,
        steps: StepCounter,
        hooks: HookDispatcher,
    ) -> None:
        self.transport = transport
        self.trainer = trainer
        self.module = module
        self.steps = steps
        self._configuration: dict[str, Any] | None = None

    def run(self, round_ctx: RoundContext, client_ids: list[int]) -> ClientShare:
        """Sends the round's tasks, folds the replies in round order and returns the round's share.

        A client whose reply does not arrive is dropped: it counts as rejected (``clients/rejected``) and contributes
        nothing, as a diverged client does in simulation.
        """
        self.steps.start_round()
        tasks = self._tasks(
            round_ctx.round_idx,
            client_ids,
            list(round_ctx.client_ids),
            dict(round_ctx.num_samples),
            round_ctx.global_params,
            schedulers=scheduler_snapshot(self.module.trainer),
        )
        received = self.transport.exchange(tasks)
        replies, secure = received.replies, self.transport.secure_range is not None
        objects = algorithm_objects(self.trainer)
        dropped: list[int] = []
        share = ClientShare(dropped=dropped)
        for client_id in client_ids:
            reply = replies.get(client_id)
            if reply is None:
                round_ctx.rejected.append(client_id)
                dropped.append(client_id)
                self.trainer.print(
                    f"[lightning_fed] Client {client_id} did not reply in round {round_ctx.round_idx}: it was left"
                    " out of the aggregate."
                )
                continue
            if reply.rejected:
                reject_client(self.trainer, round_ctx, client_id, reply.rejected_because or "its site rejected it")
            else:
                for key, obj in objects.items():
                    # Under secure aggregation a reply holds what is not a sum; the sums come as one total below.
                    obj.absorb_round_state(reply.round_state[key], partial=secure)
                share.train_metrics[client_id] = reply.train_metrics
                self.trainer.federation_state.store.put(FOLDED, client_id, round_ctx.round_idx)
            self.steps.add(reply.steps)
            round_ctx.bytes_up += reply.bytes_up
            round_ctx.bytes_down += reply.bytes_down
        if received.secure_sum is not None:
            # The round's sums over every reply (a rejected client added zeros), rebuilt in the server's declared
            # structure and folded in once.
            totals = rebuild_sums(split_round_state(objects)[0], received.secure_sum)
            for key, obj in objects.items():
                obj.absorb_round_state(totals[key], partial=True)
        share.rejected = list(round_ctx.rejected)
        share.steps = self.steps.round_steps
        return share

    def evaluate(self, round_idx: int, client_ids: list[int]) -> tuple[dict[int, dict[str, float]], bool]:
        """Asks each client's site to evaluate the new global model (or the client's personalised model) on the
        client's test split; returns the results of the clients that have one, in ``client_ids`` order, and whether
        any model was personalised. A site that does not answer is left out of the round's client statistics."""
        tasks = self._tasks(
            round_idx, client_ids, list(client_ids), {}, clone_state(self.module.state_dict()), evaluate=True
        )
        replies = self.transport.exchange(tasks).replies
        results: dict[int, dict[str, float]] = {}
        personalised = False
        store = self.trainer.federation_state.store
        for client_id in client_ids:
            reply = replies.get(client_id)
            if reply is None:
                continue
            # A personalisation hook may have written the client's state: the site saved it as this round's version.
            store.put(FOLDED, client_id, round_idx)
            if reply.eval_metrics is not None:
                results[client_id] = reply.eval_metrics
                personalised |= reply.personalised
        return results, personalised

    def _tasks(
        self,
        round_idx: int,
        client_ids: list[int],
        round_clients: list[int],
        num_samples: dict[int, int],
        global_params: StateDict,
        schedulers: list[Any] | None = None,
        evaluate: bool = False,
    ) -> list[RoundTask]:
        """One task per client of ``client_ids``; what they share (the broadcast state, the scheduler snapshot, the
        configuration's fingerprint) is computed once and shared by every task of the round."""
        trainer = self.trainer
        state = trainer.federation_state
        if self._configuration is None:
            view: Any = trainer
            self._configuration = algorithm_fingerprint(view, self.module, getattr(view, "fed_fingerprint", None))
        broadcast_state, run_id = broadcast(trainer), str(getattr(trainer, "fed_run_id", None) or "")
        resumable_from = oldest_checkpointed_round(self.module.trainer)
        return [
            RoundTask(
                round_idx=round_idx,
                client_id=client_id,
                client_ids=round_clients,
                num_samples=num_samples,
                seed=state.seed,
                global_params=global_params,
                broadcast=broadcast_state,
                schedulers=schedulers if schedulers is not None else [],
                # The client's newest folded round: committed, as the server checkpoints every round before the next
                # one starts (the deployment's ModelCheckpoint); an evaluation follows its own round's fold.
                committed_round=state.store.get(FOLDED, client_id, -1),
                resumable_from=resumable_from,
                run_id=run_id,
                fingerprint=self._configuration,
                evaluate=evaluate,
                secure_range=None if evaluate else self.transport.secure_range,
            )
            for client_id in client_ids
        ]


def oldest_checkpointed_round(trainer: Any) -> int | None:
    """The oldest round that a checkpoint the server keeps holds, for the sites to keep the versions it names.

    A ``ModelCheckpoint`` that monitors ``epoch`` (the default one, which keeps the last two rounds) knows the round
    of each file it keeps (its ``best_k_models`` scores). Any other checkpoint callback keeps files of rounds that
    cannot be told without reading them: ``-1``, and the sites keep every committed version. ``None`` without
    checkpoints: only the newest committed version can ever be resumed from.
    """
    callbacks = [callback for callback in trainer.checkpoint_callbacks if isinstance(callback, ModelCheckpoint)]
    if not callbacks:
        return None
    rounds: list[int] = []
    for callback in callbacks:
        if callback.monitor != "epoch":
            return -1
        rounds += [int(score) for score in callback.best_k_models.values()]
    return min(rounds) if rounds else None


def remote_clients(transport: Transport) -> ClientSideFactory:
    """The ``client_side`` of a server trainer whose clients train at the sites ``transport`` reaches."""

    def build(
        trainer: FederatedTrainerView, module: LightningModule, steps: StepCounter, hooks: HookDispatcher
    ) -> RemoteClients:
        return RemoteClients(transport, trainer, module, steps, hooks)

    return build


__all__ = ["FOLDED", "RemoteClients", "oldest_checkpointed_round", "remote_clients"]
