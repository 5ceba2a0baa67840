"""Flower's ``Grid`` as a deployment's transport: one message per task to the SuperNode of its client."""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from lightning_fed.deploy.flower.settings import (
    CHALLENGE_KEY,
    CLIENT_ID_KEY,
    CLIENT_IDS_KEY,
    NONCE_KEY,
    PROOFS_KEY,
    RECORD,
    REPLY_KEY,
    SIGNATURE_KEY,
    TASK_KEY,
    say,
)
from lightning_fed.deploy.reply_check import reply_size_limit
from lightning_fed.deploy.roster import NONCE_BYTES, Roster, reply_statement, serves_statement
from lightning_fed.deploy.transport import RoundReplies
from lightning_fed.deploy.wire import decode, encode
from lightning_fed.messages import ClientReply, ClientTask


@dataclass(frozen=True)
class SentTask:
    """A task on its way: the node it went to and the fresh nonce its reply must be signed over."""

    task: ClientTask
    node_id: int
    nonce: bytes

    @property
    def who(self) -> str:
        return f"SuperNode {self.node_id} (client {self.task.client_id})"


class GridTransport:
    """A :class:`~lightning_fed.deploy.transport.Transport` over a Flower ``Grid``: one message per task.

    Each SuperNode serves the clients its node config names (``client-id``). The transport learns which node
    serves which client by sending a ``query`` message to each node it has not asked yet, whenever a node appears
    or a round samples a client it has no node for. A SuperNode restarted after a crash comes back under a new node
    id while the SuperLink still lists the old one as online (until it misses two heartbeats, up to a minute): the
    new node is asked at the next round, and serves its client from then on.

    With a roster (:class:`~lightning_fed.deploy.roster.Roster`), a node's word is not enough. The query carries a
    fresh challenge and a node must sign it for each client it names with the key the roster holds for that client;
    a claim that does not verify is refused with a line naming the node, and the client keeps its node (a second
    node cannot take its tasks). Each task carries a fresh nonce, and its reply must be signed over it with the
    client's roster key: anything else (a forged reply, one for another client, one replayed from another round or
    run) is refused before it is read. Without a roster (an insecure local trial) any node may serve any client, the
    newest claim winning.

    Every reply is also refused, in one line, if it is larger than its task allows
    (:func:`~lightning_fed.deploy.reply_check.reply_size_limit`, checked before the reply is hashed or decoded), or
    cannot be decoded, or answers another client than its task's.

    Args:
        grid: The ServerApp's grid.
        timeout: Seconds to wait for a round's replies (and for the nodes' answers to a query); a client whose
            reply has not arrived by then is dropped from the round. ``None`` waits for every reply.
        roster: Which key may serve which client; ``None``: an insecure local trial.
    """

    #: No secure aggregation: the replies carry their round state in clear (:class:`SecureGridTransport` masks it).
    secure_range: float | None = None

    def __init__(self, grid: Grid, timeout: float | None = None, roster: Roster | None = None) -> None:
        self.grid = grid
        self.timeout = timeout
        self.roster = roster
        #: The node serving each client, as the nodes answered (and, with a roster, proved).
        self.nodes: dict[int, int] = {}
        self._asked: set[int] = set()
        self._seen: set[int] = set()

    def exchange(self, tasks: list[ClientTask]) -> RoundReplies:
        """Sends each task to its client's node and returns the replies that arrived within :attr:`timeout`."""
        sent = [SentTask(task, node_id, secrets.token_bytes(NONCE_BYTES)) for task, node_id in self._route(tasks)]
        if not sent:
            return RoundReplies({})
        messages = [
            Message(
                RecordDict({RECORD: ConfigRecord(self.task_record(item))}),
                dst_node_id=item.node_id,
                message_type=MessageType.EVALUATE if item.task.evaluate else MessageType.TRAIN,
                group_id=str(item.task.round_idx),
            )
            for item in sent
        ]
        replies: dict[int, ClientReply] = {}
        for message in self.grid.send_and_receive(messages, timeout=self.timeout):
            if message.has_error():
                say(f"{self._failed(message, messages, sent)} failed its task: {message.error.reason}")
                continue
            record = message.content[RECORD] if RECORD in message.content.config_records else ConfigRecord()
            reply = self.accept(message.metadata.src_node_id, dict(record), sent)
            if reply is not None:
                replies[reply.client_id] = reply
        return RoundReplies(replies)

    @staticmethod
    def task_record(item: SentTask) -> dict[str, Any]:
        """What a task's message carries: the task, its nonce and (for the site to sign) its client id."""
        return {TASK_KEY: encode(item.task), NONCE_KEY: item.nonce, CLIENT_ID_KEY: item.task.client_id}

    @staticmethod
    def _failed(error: Message, messages: list[Message], sent: list[SentTask]) -> str:
        """Who an error reply is about: the SuperLink answers for a node that stopped its heartbeats, from its own
        id, so the node is found through the message the error replies to (the grid sets sent messages' ids)."""
        for message, item in zip(messages, sent, strict=True):
            if message.metadata.message_id and message.metadata.message_id == error.metadata.reply_to_message_id:
                return item.who
        return f"SuperNode {error.metadata.src_node_id}"

    def accept(self, node_id: int, record: dict[str, Any], sent: list[SentTask]) -> ClientReply | None:
        """The reply in ``record`` from node ``node_id``, or ``None`` with one line saying why it is refused.

        In order, before anything of it is read: it answers a task sent to that node (the nonce it echoes), it is no
        larger than the task allows, and (with a roster) the client's roster key signed it over the task's nonce;
        then it is decoded, and must answer its task's client.
        """
        item = _answered(node_id, record.get(NONCE_KEY), sent)
        if item is None:
            say(f"SuperNode {node_id} sent a reply to no task it was sent this round (a replayed reply?): refused.")
            return None
        payload = record.get(REPLY_KEY)
        if not isinstance(payload, bytes):
            say(f"{item.who} sent a reply without lightning_fed's payload: refused.")
            return None
        limit = reply_size_limit(item.task)
        if len(payload) > limit:
            say(
                f"{item.who} sent a reply of {len(payload)} bytes, more than the {limit} a reply to its task may hold:"
                " refused unread."
            )
            return None
        if self.roster is not None:
            statement = reply_statement(item.nonce, item.task.client_id, payload)
            if not self.roster.verify(item.task.client_id, statement, record.get(SIGNATURE_KEY)):
                say(
                    f"{item.who} sent a reply that client {item.task.client_id}'s roster key did not sign for this"
                    f" task of round {item.task.round_idx} (forged, replayed, or signed with another key): refused."
                )
                return None
        try:
            reply = decode(payload, ClientReply)
        except ValueError as error:
            say(f"{item.who} sent an unreadable reply: {error}")
            return None
        if reply.client_ids != [item.task.client_id]:
            say(f"{item.who} replied for clients {reply.client_ids}, not for the client it was sent: refused.")
            return None
        return reply

    def _route(self, tasks: list[ClientTask]) -> list[tuple[ClientTask, int]]:
        """Each task with the node of its client; a client no node serves is dropped, with a line saying so."""
        self.map_clients([task.client_id for task in tasks])
        routed = []
        for task in tasks:
            node_id = self.nodes.get(task.client_id)
            if node_id is None:
                say(f"No SuperNode serves client {task.client_id} (round {task.round_idx}): it is dropped.")
            else:
                routed.append((task, node_id))
        return routed

    def map_clients(self, client_ids: Iterable[int]) -> None:
        """Asks the nodes not asked yet which client they serve, if a node appeared since the last call or a client
        in ``client_ids`` has no node; with a roster, a claim the node cannot sign for is refused."""
        online = set(self.grid.get_node_ids())
        # A node that appeared may serve a client whose old node is dead but still listed: ask it even then.
        appeared, self._seen = online - self._seen, self._seen | online
        self.nodes = {client: node for client, node in self.nodes.items() if node in online}
        self._asked &= online
        unasked = sorted(online - self._asked)
        if not unasked or (not appeared and all(client in self.nodes for client in client_ids)):
            return
        challenges = {node_id: secrets.token_bytes(NONCE_BYTES) for node_id in unasked}
        queries = [
            Message(
                RecordDict({RECORD: ConfigRecord({CHALLENGE_KEY: challenges[node_id]})}),
                dst_node_id=node_id,
                message_type=MessageType.QUERY,
                group_id="client-id",
            )
            for node_id in unasked
        ]
        for message in self.grid.send_and_receive(queries, timeout=self.timeout):
            node_id = message.metadata.src_node_id
            if message.has_error():
                say(f"SuperNode {node_id} did not say which client it serves: {message.error.reason}")
                continue
            if node_id not in challenges:
                continue  # an answer to nothing this server asked
            answer = message.content[RECORD]
            served: Any = answer[CLIENT_IDS_KEY]
            proofs: Any = answer.get(PROOFS_KEY, [])
            for position, client_id in enumerate(map(int, served)):
                proof = proofs[position] if position < len(proofs) else None
                if not self._proven(node_id, client_id, challenges[node_id], proof):
                    continue
                previous = self.nodes.get(client_id)
                if previous is not None and previous != node_id:
                    say(
                        f"SuperNodes {previous} and {node_id} both serve client {client_id}: {node_id} (newer) is used."
                    )
                self.nodes[client_id] = node_id
            self._asked.add(node_id)

    def _proven(self, node_id: int, client_id: int, challenge: bytes, proof: Any) -> bool:
        """Whether node ``node_id`` may serve ``client_id``: always without a roster; with one, if the client's
        roster key signed the challenge (else one line naming the node and what it lacked)."""
        if self.roster is None:
            return True
        if client_id not in self.roster.keys:
            say(f"SuperNode {node_id} claims client {client_id}, whom the roster does not name: refused.")
            return False
        if proof is None:
            say(
                f"SuperNode {node_id} claims client {client_id} without signing for it: refused (its node config"
                " needs `site-key='<its private key>'`)."
            )
            return False
        if not self.roster.verify(client_id, serves_statement(challenge, node_id, client_id), proof):
            say(
                f"SuperNode {node_id} claims client {client_id} but does not hold the key the roster names for"
                f" client {client_id}: refused."
            )
            return False
        return True


def _answered(node_id: int, nonce: Any, sent: list[SentTask]) -> SentTask | None:
    """The task a reply from ``node_id`` that echoes ``nonce`` answers; without an echo, the one task sent to that
    node (if it was sent one only)."""
    to_node = [item for item in sent if item.node_id == node_id]
    if nonce is None:
        return to_node[0] if len(to_node) == 1 else None
    if not isinstance(nonce, bytes):
        return None
    return next((item for item in to_node if secrets.compare_digest(item.nonce, nonce)), None)


__all__ = ["GridTransport", "SentTask"]
