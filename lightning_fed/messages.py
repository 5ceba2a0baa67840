"""The one seam of a round: the task a client half is given and the reply it returns.

A round has two halves (:mod:`lightning_fed.engine`): the server half opens it and closes it, the client half trains
clients. They meet through these two messages and nothing else, wherever the client half runs:

* in the server's process (one process, or each DDP rank with its share of the clients): the task names the
  share and says that the round is already open on this process's algorithm objects (``broadcast is None``); the
  reply's round state stays in those objects (``round_state is None``) and the server half reduces it;
* at a deployment's site (:mod:`lightning_fed.deploy`): the task carries what the site needs to open the round as
  the server did (the algorithms' broadcast state, the LR schedulers, the configuration's fingerprint); the reply
  carries each algorithm's declared round state, unreduced, which the server folds in round order.

``ClientHalf.run_task(task) -> ClientReply`` is the one way a client half is driven and
``ServerHalf.fold(round_ctx, replies)`` the one way a server half takes results. :mod:`lightning_fed.deploy.wire`
encodes the two messages for the network; nothing here knows how they travel.

Example::

    task = server.task(round_ctx, client_ids=[3, 7])   # a share of the round, in this process
    reply = client.run_task(task)                      # trains clients 3 and 7
    server.fold(round_ctx, [reply])                    # metrics, rejections, bytes, steps (and remote round state)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from lightning_fed.functional.state_dict import StateDict


@dataclass
class ClientTask:
    """What a client half is asked to do: train (or evaluate) some clients of one round.

    Attributes:
        round_idx: The round (0-based).
        client_ids: The clients to train or evaluate, in round order (a task that crosses to a site names one).
        round_clients: Every client sampled this round, in round order (positions decide the integer buffers' copy).
        num_samples: Each sampled client's training-set size.
        seed: The run seed; every draw of a client derives from ``(seed, purpose, round, client)``.
        global_params: The global model's federated part at the round's start (the trainable parameters and the
            buffers, :mod:`~lightning_fed.functional.federated_state`; the frozen base never travels); for an
            evaluation task, after the round's aggregation.
        broadcast: Each algorithm's broadcast state, by algorithm key (:func:`~lightning_fed.engine.algorithm_state.
            algorithm_objects`): the client half opens the round itself from it (``on_round_start``, the aggregator's
            reset) and replies with the algorithms' round state. ``None``: the client half runs beside the server
            half that opened the round, on the same algorithm objects, and the round state stays in them.
        schedulers: The LR schedulers' ``state_dict`` and the optimizers' hyperparameters at the round's start
            (empty: the client half's schedulers already hold them).
        committed_round: For a task that crosses to a site, its client's newest round whose reply the server folded
            and whose checkpoint is written (``-1``: none; an evaluation task's may be its own round, folded but not
            yet checkpointed): the site continues from its version of that round and drops newer ones.
        resumable_from: For a task that crosses to a site, the oldest round that a checkpoint the server keeps holds:
            a resume that falls back to it (the newer ones corrupt) names the client's version of that round, so the
            site keeps the newest version at or before it and every version after it. ``-1``: the server cannot tell
            which rounds its checkpoints hold (a checkpoint callback that does not monitor ``epoch``), and the site
            keeps every committed version; ``None``: the server keeps no checkpoint, and the site keeps only the
            committed one.
        run_id: The server's run id, for the site's logs.
        fingerprint: The server's experiment fingerprint without its data settings and seed; a site built from
            another configuration refuses the task (empty: not checked).
        base: The server's frozen-base fingerprint (:meth:`BaseFingerprint.to_dict
            <lightning_fed.functional.federated_state.BaseFingerprint.to_dict>`: a digest and a short hash per
            tensor, never the tensors); a site whose own base differs refuses the task, naming its first tensor that
            differs (empty: not checked).
        evaluate: Evaluate instead of training: ``global_params`` (or each client's personalised model, as the
            callbacks' ``on_client_evaluate_start`` decide) on the client's own test split.
        secure_range: Under secure aggregation, the range ±c every entry of the client's sums must fit; ``None``:
            no secure aggregation.
    """

    round_idx: int
    client_ids: list[int]
    round_clients: list[int]
    num_samples: dict[int, int]
    seed: int
    global_params: StateDict
    broadcast: dict[str, dict[str, Any]] | None = None
    schedulers: list[Any] = field(default_factory=list)
    committed_round: int = -1
    resumable_from: int | None = -1
    run_id: str = ""
    fingerprint: dict[str, Any] = field(default_factory=dict)
    base: dict[str, Any] = field(default_factory=dict)
    evaluate: bool = False
    secure_range: float | None = None

    @property
    def opens_round(self) -> bool:
        """Whether the client half must open the round itself (it runs apart from the server half)."""
        return self.broadcast is not None

    @property
    def client_id(self) -> int:
        """The one client of a task that names one (every task that crosses to a site does).

        Raises:
            ValueError: If the task names several clients or none.
        """
        return _the_one_client(self.client_ids, "task")


@dataclass
class ClientReply:
    """What a client half returns for a :class:`ClientTask`.

    Attributes:
        round_idx: The round it answers.
        client_ids: The clients the task named, in round order.
        round_state: Each algorithm's declared round state after the task's clients, unreduced, by algorithm key.
            ``None``: the round state is in the algorithm objects of the process that opened the round (the task's
            ``broadcast`` was ``None``), where the server half reduces it.
        train_metrics: Each accepted client's training metrics, in round order.
        rejected: Each rejected client (non-finite, beyond secure aggregation's range, or refused by the server),
            with why, in round order; a rejected client's update is in no round state.
        steps: Optimizer steps the task's clients took.
        bytes_up: Client-to-server bytes counted for the task's clients.
        bytes_down: Server-to-client bytes counted for the task's clients.
        eval_metrics: An evaluation task's results, by client, for the clients that have a test split.
        personalised: Whether an evaluated model was a client's personalised one.
        dropped: Clients that never answered (a deployment's site killed or too late); set by the server's side of
            a transport, never by a client half. They count as rejected.
        partial: Whether ``round_state`` holds part of each object's declared state only (under secure aggregation:
            what is not a sum at a site; the masked sums' total at the server).
        secure_sums: Under secure aggregation, the clients' sums as float64 arrays, zero when rejected; they never
            reach the server one by one (the transport masks them). Empty otherwise.
    """

    round_idx: int
    client_ids: list[int]
    round_state: dict[str, dict[str, Any]] | None = None
    train_metrics: dict[int, dict[str, float]] = field(default_factory=dict)
    rejected: dict[int, str] = field(default_factory=dict)
    steps: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    eval_metrics: dict[int, dict[str, float]] = field(default_factory=dict)
    personalised: bool = False
    dropped: list[int] = field(default_factory=list)
    partial: bool = False
    secure_sums: list[Tensor] = field(default_factory=list)

    @property
    def client_id(self) -> int:
        """The one client of a reply to a task that named one (every reply from a site).

        Raises:
            ValueError: If the reply names several clients or none.
        """
        return _the_one_client(self.client_ids, "reply")

    @classmethod
    def no_answer(cls, round_idx: int, client_id: int) -> ClientReply:
        """The reply the server records for a client whose site did not answer."""
        return cls(round_idx=round_idx, client_ids=[client_id], round_state={}, dropped=[client_id])


def _the_one_client(client_ids: list[int], message: str) -> int:
    if len(client_ids) != 1:
        raise ValueError(f"This {message} names {len(client_ids)} clients ({client_ids}), not one.")
    return client_ids[0]


__all__ = ["ClientReply", "ClientTask"]
