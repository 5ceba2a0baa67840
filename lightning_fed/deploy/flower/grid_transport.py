"""Flower's ``Grid`` as a deployment's transport: one message per task to the SuperNode of its client."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from lightning_fed.deploy.flower.settings import CLIENT_IDS_KEY, RECORD, REPLY_KEY, TASK_KEY, payload, say
from lightning_fed.deploy.transport import RoundReplies
from lightning_fed.deploy.wire import decode, encode
from lightning_fed.messages import ClientReply, ClientTask


class GridTransport:
    """A :class:`~lightning_fed.deploy.transport.Transport` over a Flower ``Grid``: one message per task.

    Each SuperNode serves one client, named by ``client-id`` in its node config. The transport learns which node
    serves which client by sending a ``query`` message to each node it has not asked yet, whenever a node appears
    or a round samples a client it has no node for. A SuperNode restarted after a crash comes back under a new node
    id while the SuperLink still lists the old one as online (until it misses two heartbeats, up to a minute): the
    new node is asked at the next round, and serves its client from then on.

    Args:
        grid: The ServerApp's grid.
        timeout: Seconds to wait for a round's replies (and for the nodes' answers to a query); a client whose
            reply has not arrived by then is dropped from the round. ``None`` waits for every reply.
    """

    #: No secure aggregation: the replies carry their round state in clear (:class:`SecureGridTransport` masks it).
    secure_range: float | None = None

    def __init__(self, grid: Grid, timeout: float | None = None) -> None:
        self.grid = grid
        self.timeout = timeout
        #: The node serving each client, as the nodes answered.
        self.nodes: dict[int, int] = {}
        self._asked: set[int] = set()
        self._seen: set[int] = set()

    def exchange(self, tasks: list[ClientTask]) -> RoundReplies:
        """Sends each task to its client's node and returns the replies that arrived within :attr:`timeout`."""
        routed = self._route(tasks)
        if not routed:
            return RoundReplies({})
        messages = [
            Message(
                RecordDict({RECORD: ConfigRecord({TASK_KEY: encode(task)})}),
                dst_node_id=node_id,
                message_type=MessageType.EVALUATE if task.evaluate else MessageType.TRAIN,
                group_id=str(task.round_idx),
            )
            for task, node_id in routed
        ]
        expected = {task.client_id: node_id for task, node_id in routed}
        replies: dict[int, ClientReply] = {}
        for message in self.grid.send_and_receive(messages, timeout=self.timeout):
            node_id = message.metadata.src_node_id
            if message.has_error():
                say(f"{self._failed(message, messages, routed)} failed its task: {message.error.reason}")
                continue
            reply = self._reply(node_id, payload(message, REPLY_KEY), expected)
            if reply is not None:
                replies[reply.client_id] = reply
        return RoundReplies(replies)

    @staticmethod
    def _failed(error: Message, sent: list[Message], routed: list[tuple[ClientTask, int]]) -> str:
        """Who an error reply is about: the SuperLink answers for a node that stopped its heartbeats, from its own
        id, so the node is found through the message the error replies to (the grid sets sent messages' ids)."""
        for message, (task, node_id) in zip(sent, routed, strict=True):
            if message.metadata.message_id and message.metadata.message_id == error.metadata.reply_to_message_id:
                return f"SuperNode {node_id} (client {task.client_id})"
        return f"SuperNode {error.metadata.src_node_id}"

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

    @staticmethod
    def _reply(node_id: int, payload: bytes, expected: dict[int, int]) -> ClientReply | None:
        """The reply node ``node_id`` sent, or ``None`` with a line saying why it is not used."""
        try:
            reply = decode(payload, ClientReply)
        except ValueError as error:
            say(f"SuperNode {node_id} sent an unreadable reply: {error}")
            return None
        if expected.get(reply.client_id) != node_id:
            say(f"SuperNode {node_id} replied for client {reply.client_id}, which it was not sent: ignored.")
            return None
        return reply

    def map_clients(self, client_ids: Iterable[int]) -> None:
        """Asks the nodes not asked yet which client they serve, if a node appeared since the last call or a client
        in ``client_ids`` has no node."""
        online = set(self.grid.get_node_ids())
        # A node that appeared may serve a client whose old node is dead but still listed: ask it even then.
        appeared, self._seen = online - self._seen, self._seen | online
        self.nodes = {client: node for client, node in self.nodes.items() if node in online}
        self._asked &= online
        unasked = sorted(online - self._asked)
        if not unasked or (not appeared and all(client in self.nodes for client in client_ids)):
            return
        queries = [
            Message(RecordDict(), dst_node_id=node_id, message_type=MessageType.QUERY, group_id="client-id")
            for node_id in unasked
        ]
        for message in self.grid.send_and_receive(queries, timeout=self.timeout):
            node_id = message.metadata.src_node_id
            if message.has_error():
                say(f"SuperNode {node_id} did not say which client it serves: {message.error.reason}")
                continue
            served: Any = message.content[RECORD][CLIENT_IDS_KEY]
            for client_id in map(int, served):
                previous = self.nodes.get(client_id)
                if previous is not None and previous != node_id:
                    say(
                        f"SuperNodes {previous} and {node_id} both serve client {client_id}: {node_id} (newer) is used."
                    )
                self.nodes[client_id] = node_id
            self._asked.add(node_id)


__all__ = ["GridTransport"]
