"""The server's side of a deployed round: its clients train at their sites.

:class:`RemoteClients` is the client side of the server's round (:class:`~lightning_fed.engine.RoundRunner`'s
``client_side``): the server half's task for the round's clients becomes one :class:`~lightning_fed.messages.
ClientTask` per client, carrying what a site needs to open the round as the server did (the algorithms' broadcast
state, the LR schedulers, the configuration's fingerprint), and the sites' :class:`~lightning_fed.messages.
ClientReply` s come back in round order, each with its client's round state, for the server half to fold in
(``ServerHalf.fold``) exactly as one process would. Each reply is checked first (:mod:`~lightning_fed.deploy.
reply_check`: its round, its client, the shape of its round state); a client whose reply does not arrive, or is
refused, is answered for with
:meth:`ClientReply.no_answer <lightning_fed.messages.ClientReply.no_answer>`. Under secure aggregation the sums
arrive as one total over the round's replies (:mod:`~lightning_fed.deploy.secure_sum`): one more reply, with no
client, that carries that total.

The server also keeps, per client, the newest round whose reply it folded (its client store's :data:`FOLDED`
namespace, checkpointed with the round), and each task names it: a site may have written a round's version and
then lost its reply (killed, or too late), and must not continue from a state the server never absorbed.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from lightning.pytorch import LightningModule
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_fed.deploy.algorithms import algorithm_fingerprint
from lightning_fed.deploy.reply_check import check_reply, expected_round_state
from lightning_fed.deploy.secure_sum import rebuild_sums, split_round_state
from lightning_fed.deploy.transport import Transport
from lightning_fed.engine import (
    ClientSideFactory,
    HookDispatcher,
    StepCounter,
    algorithm_objects,
    broadcast,
    scheduler_snapshot,
)
from lightning_fed.functional.federated_state import federated_state
from lightning_fed.functional.state_dict import StateDict, clone_state
from lightning_fed.messages import ClientReply, ClientTask
from lightning_fed.run.checkpoint_state import module_base

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
        steps: The fit's step counter (unused: the server half counts the steps the replies report).
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
        self._configuration: dict[str, Any] | None = None
        self._base: dict[str, Any] | None = None

    def answer(self, task: ClientTask) -> list[ClientReply]:
        """Sends each of the task's clients its own task and returns the replies in round order (a client whose site
        did not answer gets :meth:`~lightning_fed.messages.ClientReply.no_answer`; under secure aggregation one more
        reply carries the round's summed state)."""
        tasks = self._tasks(
            task.round_idx,
            list(task.client_ids),
            list(task.round_clients),
            dict(task.num_samples),
            task.global_params,
            schedulers=scheduler_snapshot(self.module.trainer),
        )
        # The round state the server declared, as its objects hold it until the replies are folded: what each reply's
        # must look like.
        expected = expected_round_state(algorithm_objects(self.trainer))
        received = self.transport.exchange(tasks)
        store = self.trainer.federation_state.store
        objects = algorithm_objects(self.trainer)
        replies: list[ClientReply] = []
        sent = {sent.client_id: sent for sent in tasks}
        for client_id in task.client_ids:
            reply = _checked(_unpacked(received.replies.get(client_id), objects), sent[client_id], expected)
            if reply is None:
                replies.append(ClientReply.no_answer(task.round_idx, client_id))
                continue
            if client_id not in reply.rejected:
                store.put(FOLDED, client_id, task.round_idx)
            replies.append(reply)
        if received.secure_sum is not None:
            # The round's sums over every reply (a rejected client added zeros), rebuilt in the server's declared
            # structure: folded in once, after the replies that hold the rest.
            totals = rebuild_sums(split_round_state(algorithm_objects(self.trainer))[0], received.secure_sum)
            replies.append(ClientReply(round_idx=task.round_idx, client_ids=[], round_state=totals, partial=True))
        return replies

    def evaluate(self, round_idx: int, client_ids: list[int]) -> tuple[dict[int, dict[str, float]], bool]:
        """Asks each client's site to evaluate the new global model (or the client's personalised model) on the
        client's test split; returns the results of the clients that have one, in ``client_ids`` order, and whether
        any model was personalised. A site that does not answer is left out of the round's client statistics."""
        # The federated part only: a site holds the frozen base already.
        new_global = clone_state(federated_state(self.module, self.trainer.federated_keys))
        tasks = self._tasks(round_idx, client_ids, list(client_ids), {}, new_global, evaluate=True)
        replies = self.transport.exchange(tasks).replies
        results: dict[int, dict[str, float]] = {}
        personalised = False
        store = self.trainer.federation_state.store
        sent = {sent.client_id: sent for sent in tasks}
        for client_id in client_ids:
            reply = _checked(replies.get(client_id), sent[client_id], None)
            if reply is None:
                continue
            # A personalisation hook may have written the client's state: the site saved it as this round's version.
            store.put(FOLDED, client_id, round_idx)
            if client_id in reply.eval_metrics:
                results[client_id] = reply.eval_metrics[client_id]
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
    ) -> list[ClientTask]:
        """One task per client of ``client_ids``; what they share (the broadcast state, the scheduler snapshot, the
        configuration's fingerprint) is computed once and shared by every task of the round."""
        trainer = self.trainer
        state = trainer.federation_state
        if self._configuration is None:
            view: Any = trainer
            self._configuration = algorithm_fingerprint(view, self.module, getattr(view, "fed_fingerprint", None))
            # The frozen base's fingerprint (computed once per fit), for each site to check its own base against.
            self._base = module_base(view).to_dict()
        broadcast_state, run_id = broadcast(trainer), str(getattr(trainer, "fed_run_id", None) or "")
        resumable_from = oldest_checkpointed_round(self.module.trainer)
        return [
            ClientTask(
                round_idx=round_idx,
                client_ids=[client_id],
                round_clients=round_clients,
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
                base=self._base or {},
                evaluate=evaluate,
                secure_range=None if evaluate else self.transport.secure_range,
            )
            for client_id in client_ids
        ]


def _unpacked(reply: ClientReply | None, objects: dict[str, Any]) -> ClientReply | None:
    """``reply`` with each algorithm's round state as the site held it (what its ``pack_round_state`` sent, back
    bit for bit), ready for the checks; a round state that does not unpack is left as it came, and the checks
    refuse it."""
    if reply is None or not isinstance(reply.round_state, dict) or reply.partial:
        return reply
    unpacked: dict[str, Any] = {}
    for key, value in reply.round_state.items():
        try:
            unpacked[key] = objects[key].unpack_round_state(value) if key in objects else value
        except Exception:  # a malformed packed state from a hostile or broken site: the checks name what is wrong
            return reply
    reply.round_state = unpacked
    return reply


def _checked(reply: ClientReply | None, task: ClientTask, expected: Any) -> ClientReply | None:
    """``reply`` if it may be folded as the answer to ``task`` (:func:`~lightning_fed.deploy.reply_check.check_reply`);
    else ``None``, with one line saying why it is refused (its client is then dropped, as if it had not answered)."""
    if reply is None:
        return None
    why = check_reply(reply, task, expected)
    if why is None:
        return reply
    what = "evaluation" if task.evaluate else "reply"
    print(
        f"[lightning_fed] Client {task.client_id}'s {what} in round {task.round_idx} is refused: {why}.",
        file=sys.stderr,
        flush=True,
    )
    return None


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
