"""A Flower ``Grid`` whose nodes run a ClientApp in this process: a deployment, SecAgg+ included, without Flower's
processes (to try an app before deploying it, and for tests)."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp


class InProcessGrid:
    """Nodes ``1..n`` serving clients ``0..n-1``, each keeping its client's state under ``state_root``.

    Every message is copied (a SuperNode receives its own copy over the network, and SecAgg+'s client mod edits the
    message it gets) and handed to ``app``, mods included, with its node's ``Context``, which keeps the node's state
    between messages as a SuperNode does. A handler that raises becomes an error reply, as a SuperNode sends.

    Args:
        app: The ClientApp the nodes run (:data:`~lightning_fed.deploy.flower.client_app`).
        num_clients: How many nodes, one client each.
        state_root: Each node's ``state-dir`` is ``state_root/site-<client>``.
        failing: Clients whose site fails while training: the node answers SecAgg+'s key exchanges but raises on
            the message that carries its task.

    Example::

        transport = SecureGridTransport(InProcessGrid(client_app, 3, Path("sites")), server_context())
        serve(trainer, module, datamodule, transport)
    """

    def __init__(self, app: ClientApp, num_clients: int, state_root: Path, failing: Iterable[int] = ()) -> None:
        self.app = app
        self.failing = set(failing)
        self.contexts = {
            client + 1: Context(
                run_id=1,
                node_id=client + 1,
                # The sites answer in this process: no warm worker processes to start and to stop.
                node_config={
                    "client-id": client,
                    "state-dir": str(Path(state_root) / f"site-{client}"),
                    "warm-worker": "false",
                },
                state=RecordDict(),
                run_config={},
            )
            for client in range(num_clients)
        }

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        replies = []
        for message in messages:
            context = self.contexts[message.metadata.dst_node_id]
            received = copy.deepcopy(message)
            try:
                carries_task = {"fitins.config", "lightning_fed"} & set(message.content.config_records)
                if int(context.node_config["client-id"]) in self.failing and carries_task:
                    raise RuntimeError(f"client {context.node_config['client-id']}'s site failed while training")
                replies.append(self.app(received, context))
            except Exception as error:
                replies.append(Message(Error(code=0, reason=str(error)), reply_to=received))
        return replies


def server_context() -> Context:
    """A ServerApp's context for a transport driven in this process."""
    return Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})


__all__ = ["InProcessGrid", "server_context"]
