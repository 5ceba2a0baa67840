"""Flower as the deployment's network: the ServerApp runs lightning_fed's server loop, the ClientApp its client half.

lightning_fed's rules stay lightning_fed's: the ServerApp (:data:`server_app`) runs the ordinary
``FederatedTrainer.fit`` through :func:`~lightning_fed.deploy.server.serve`, and Flower only carries each round's
:class:`~lightning_fed.deploy.wire.RoundTask` to the SuperNode of its client and the
:class:`~lightning_fed.deploy.wire.SiteReply` back (:class:`GridTransport`, over ``Grid.send_and_receive``). The
ClientApp (:data:`client_app`) answers a task with :class:`~lightning_fed.deploy.site.ClientSite`.

Both apps read the deployment from the Flower app directory that ``lightning-fed flower-app`` writes: its resolved
``config.yaml`` and the run config in its ``pyproject.toml`` (``round-timeout``, ``resume``, ``workdir``,
``state-dir``). A SuperNode says which client it serves and where it keeps that client's state in its node config::

    flower-supernode --insecure --superlink 127.0.0.1:8000 --node-config "client-id=0 state-dir='site-0-state'"

(optionally ``data-config='site-data.yaml'``: a YAML whose ``data`` section replaces the app's at that site). In
Flower's simulation engine, where nodes have no such config, a node serves the client of its ``partition-id`` and
keeps state under the run config's ``state-dir``.

This is the only module of lightning_fed that imports ``flwr`` (``pip install 'lightning-fed[flower]'``); nothing
imports it but Flower, which loads ``lightning_fed.deploy.flower:server_app`` and ``...:client_app``. The
Lightning stack is imported inside the handlers, so that the apps load quickly.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from lightning_fed.deploy.wire import RoundTask, SiteReply, decode, encode

if TYPE_CHECKING:
    from flwr.app import UserConfigValue

#: The record of a message that holds lightning_fed's payload, and its keys.
RECORD = "lightning_fed"
TASK_KEY = "task"
REPLY_KEY = "reply"
CLIENT_ID_KEY = "client-id"

#: The file of the app directory that holds the deployment's resolved configuration.
APP_CONFIG = "config.yaml"
#: The value of ``[tool.flwr.app.components]`` that marks a directory as a lightning_fed Flower app.
SERVER_APP_REF = "lightning_fed.deploy.flower:server_app"
CLIENT_APP_REF = "lightning_fed.deploy.flower:client_app"


def _say(text: str) -> None:
    print(f"[lightning_fed] {text}", file=sys.stderr, flush=True)


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

    def __init__(self, grid: Grid, timeout: float | None = None) -> None:
        self.grid = grid
        self.timeout = timeout
        #: The node serving each client, as the nodes answered.
        self.nodes: dict[int, int] = {}
        self._asked: set[int] = set()
        self._seen: set[int] = set()

    def exchange(self, tasks: list[RoundTask]) -> dict[int, SiteReply]:
        """Sends each task to its client's node and returns the replies that arrived within :attr:`timeout`."""
        self.map_clients([task.client_id for task in tasks])
        messages: list[Message] = []
        expected: dict[int, int] = {}  # client id -> node id
        for task in tasks:
            node_id = self.nodes.get(task.client_id)
            if node_id is None:
                _say(f"No SuperNode serves client {task.client_id} (round {task.round_idx}): it is dropped.")
                continue
            content = RecordDict({RECORD: ConfigRecord({TASK_KEY: encode(task)})})
            messages.append(
                Message(content, dst_node_id=node_id, message_type=MessageType.TRAIN, group_id=str(task.round_idx))
            )
            expected[task.client_id] = node_id
        if not messages:
            return {}
        replies: dict[int, SiteReply] = {}
        for message in self.grid.send_and_receive(messages, timeout=self.timeout):
            node_id = message.metadata.src_node_id
            if message.has_error():
                _say(f"SuperNode {node_id} failed its task: {message.error.reason}")
                continue
            try:
                reply = decode(_payload(message, REPLY_KEY), SiteReply)
            except ValueError as error:
                _say(f"SuperNode {node_id} sent an unreadable reply: {error}")
                continue
            if expected.get(reply.client_id) != node_id:
                _say(f"SuperNode {node_id} replied for client {reply.client_id}, which it was not sent: ignored.")
                continue
            replies[reply.client_id] = reply
        return replies

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
                _say(f"SuperNode {node_id} did not say which client it serves: {message.error.reason}")
                continue
            client_id = int(message.content[RECORD][CLIENT_ID_KEY])  # type: ignore[arg-type]
            previous = self.nodes.get(client_id)
            if previous is not None and previous != node_id:
                _say(f"SuperNodes {previous} and {node_id} both serve client {client_id}: {node_id} (newer) is used.")
            self.nodes[client_id] = node_id
            self._asked.add(node_id)


def _payload(message: Message, key: str) -> bytes:
    value = message.content[RECORD][key]
    if not isinstance(value, bytes):
        raise ValueError(f"`{RECORD}.{key}` holds {type(value).__name__}, not bytes")
    return value


# ----------------------------------------------------------------------------------------------------------------
# The app directory and its settings


def find_app_dir() -> Path:
    """The lightning_fed Flower app directory Flower loaded this app from (it puts it on ``sys.path``).

    Raises:
        FileNotFoundError: If no directory on ``sys.path`` holds an app written by ``lightning-fed flower-app``.
    """
    for entry in sys.path:
        directory = Path(entry or ".")
        pyproject = directory / "pyproject.toml"
        if (directory / APP_CONFIG).is_file() and pyproject.is_file() and SERVER_APP_REF in pyproject.read_text():
            return directory.resolve()
    raise FileNotFoundError(
        "No lightning_fed Flower app directory (pyproject.toml naming lightning_fed.deploy.flower, beside a"
        " config.yaml) is on sys.path: run an app written by `lightning-fed flower-app`."
    )


def _setting(config: dict[str, UserConfigValue], key: str, default: Any) -> Any:
    value = config.get(key, default)
    return default if value == "" else value


def round_timeout(run_config: dict[str, UserConfigValue]) -> float | None:
    """The run config's ``round-timeout`` in seconds; ``0`` (or less) waits for every reply."""
    value = float(_setting(run_config, "round-timeout", 0))
    return value if value > 0 else None


def client_id_of(node_config: dict[str, UserConfigValue]) -> int:
    """The client a SuperNode serves: its node config's ``client-id``, else (simulation) its ``partition-id``.

    Raises:
        ValueError: If the node config has neither.
    """
    for key in (CLIENT_ID_KEY, "partition-id"):
        if key in node_config:
            return int(node_config[key])
    raise ValueError(
        "This SuperNode serves no client: start it with `--node-config \"client-id=<id> state-dir='<dir>'\"`."
    )


def state_dir_of(node_config: dict[str, UserConfigValue], run_config: dict[str, UserConfigValue]) -> Path:
    """Where a site keeps its client's state: the node config's ``state-dir``, else the run config's.

    Raises:
        ValueError: If neither sets it.
    """
    value = _setting(node_config, "state-dir", "") or _setting(run_config, "state-dir", "")
    if not value:
        raise ValueError(
            "This SuperNode has no state directory for its client: add `state-dir='<dir>'` to its --node-config."
        )
    return Path(str(value))


# ----------------------------------------------------------------------------------------------------------------
# The apps

server_app = ServerApp()
client_app = ClientApp()


@server_app.main()
def server_main(grid: Grid, context: Context) -> None:
    """Builds the server from the app's ``config.yaml`` and runs the fit with the clients trained at the sites.

    Run config: ``round-timeout`` (seconds, ``0``: wait for every reply), ``resume`` (``true``: resume the newest
    run of this configuration, as ``--ckpt_path last``), ``workdir`` (where relative paths of the config, such as
    ``default_root_dir``, lead; default: the SuperLink's working directory).
    """
    from lightning_fed.deploy.config import build_from_config
    from lightning_fed.deploy.server import serve

    run_config = context.run_config
    config = find_app_dir() / APP_CONFIG
    workdir = _setting(run_config, "workdir", "")
    if workdir:
        Path(str(workdir)).mkdir(parents=True, exist_ok=True)
        os.chdir(str(workdir))
    module, datamodule, trainer = build_from_config([config])
    transport = GridTransport(grid, timeout=round_timeout(run_config))
    resume = bool(_setting(run_config, "resume", False))
    serve(trainer, module, datamodule, transport, ckpt_path="last" if resume else None)


@client_app.query()
def client_query(message: Message, context: Context) -> Message:
    """Answers which client this SuperNode serves."""
    client_id = client_id_of(context.node_config)
    return Message(RecordDict({RECORD: ConfigRecord({CLIENT_ID_KEY: client_id})}), reply_to=message)


@client_app.train()
def client_train(message: Message, context: Context) -> Message:
    """Trains the task's client at this site (:class:`~lightning_fed.deploy.site.ClientSite`) and replies.

    Raises:
        ValueError: If the task is for another client than this SuperNode's.
    """
    from lightning_fed.deploy.config import site_builder
    from lightning_fed.deploy.site import ClientSite

    data = _payload(message, TASK_KEY)
    task = decode(data, RoundTask)
    client_id = client_id_of(context.node_config)
    if task.client_id != client_id:
        raise ValueError(f"This SuperNode serves client {client_id}; a task for client {task.client_id} arrived.")
    data_config = _setting(context.node_config, "data-config", "")
    build = site_builder(find_app_dir() / APP_CONFIG, str(data_config) if data_config else None)
    site = ClientSite(build, state_dir_of(context.node_config, context.run_config))
    answer = site.handle_bytes(data)
    return Message(RecordDict({RECORD: ConfigRecord({REPLY_KEY: answer})}), reply_to=message)


__all__ = [
    "GridTransport",
    "client_app",
    "client_id_of",
    "find_app_dir",
    "round_timeout",
    "server_app",
    "state_dir_of",
]
