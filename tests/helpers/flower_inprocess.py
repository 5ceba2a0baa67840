"""A Flower ``Grid`` whose nodes run lightning_fed's ClientApp in the test's process (no Flower processes).

Every message is copied (a SuperNode receives its own copy over the network; SecAgg+'s client mod edits the message it
gets) and handed to the real ``client_app``, mods included, with its node's ``Context``, which keeps the node's state
between messages as a SuperNode does. The server side (``SecureGridTransport`` and Flower's ``SecAggPlusWorkflow``)
runs unchanged over it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp


class InProcessGrid:
    """Nodes ``1..n`` serving clients ``0..n-1``, each keeping its state under ``state_root``.

    Args:
        app: The ClientApp the nodes run.
        num_clients: How many nodes (one client each).
        state_root: Each node's ``state-dir`` is ``state_root/site-<client>``.
        failing: Clients whose site fails while training: the node answers SecAgg+'s key exchanges but raises on the
            message that carries its task.
    """

    def __init__(self, app: ClientApp, num_clients: int, state_root: Path, failing: Iterable[int] = ()) -> None:
        self.app = app
        self.failing = set(failing)
        self.contexts = {
            client + 1: Context(
                run_id=1,
                node_id=client + 1,
                node_config={"client-id": client, "state-dir": str(state_root / f"site-{client}")},
                state=RecordDict(),
                run_config={},
            )
            for client in range(num_clients)
        }
        #: The message types of every message sent, in order.
        self.sent: list[str] = []

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        replies = []
        for message in messages:
            self.sent.append(message.metadata.message_type)
            context = self.contexts[message.metadata.dst_node_id]
            client = int(context.node_config["client-id"])
            received = copy.deepcopy(message)
            try:
                carries_task = {"fitins.config", "lightning_fed"} & set(message.content.config_records)
                if client in self.failing and carries_task:
                    raise RuntimeError(f"client {client}'s site failed while training")
                replies.append(self.app(received, context))
            except Exception as error:  # a SuperNode turns a failed handler into an error reply
                replies.append(Message(Error(code=0, reason=str(error)), reply_to=received))
        return replies


def server_context() -> Any:
    """A ServerApp's context for a transport driven in the test's process."""
    return Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
