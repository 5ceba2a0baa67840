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

import numpy
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common import (
    Code,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.compat.common import recorddict_compat
from flwr.server import ClientManager, LegacyContext, ServerConfig
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.strategy import Strategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.serverapp import Grid, ServerApp

from lightning_fed.deploy.app import SECAGG_RUN_CONFIG
from lightning_fed.deploy.transport import RoundReplies
from lightning_fed.deploy.wire import RoundTask, SiteReply, decode, encode

if TYPE_CHECKING:
    from flwr.app import UserConfigValue

#: The record of a message that holds lightning_fed's payload, and its keys.
RECORD = "lightning_fed"
TASK_KEY = "task"
REPLY_KEY = "reply"
#: Where SecAgg+'s legacy messages keep the task (the instructions' config) and the clear reply (the result's metrics).
LEGACY_TASK = "fitins.config"
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
    serves which client by sending a ``query`` message to each node it has not asked yet, whenever a round samples
    a client it has no node for (a SuperNode restarted after a crash comes back under a new node id: it is asked
    at the next round that needs its client).

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

    def exchange(self, tasks: list[RoundTask]) -> RoundReplies:
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
        replies: dict[int, SiteReply] = {}
        for message in self.grid.send_and_receive(messages, timeout=self.timeout):
            node_id = message.metadata.src_node_id
            if message.has_error():
                _say(f"SuperNode {node_id} failed its task: {message.error.reason}")
                continue
            reply = self._reply(node_id, _payload(message, REPLY_KEY), expected)
            if reply is not None:
                replies[reply.client_id] = reply
        return RoundReplies(replies)

    def _route(self, tasks: list[RoundTask]) -> list[tuple[RoundTask, int]]:
        """Each task with the node of its client; a client no node serves is dropped, with a line saying so."""
        self.map_clients([task.client_id for task in tasks])
        routed = []
        for task in tasks:
            node_id = self.nodes.get(task.client_id)
            if node_id is None:
                _say(f"No SuperNode serves client {task.client_id} (round {task.round_idx}): it is dropped.")
            else:
                routed.append((task, node_id))
        return routed

    @staticmethod
    def _reply(node_id: int, payload: bytes, expected: dict[int, int]) -> SiteReply | None:
        """The reply node ``node_id`` sent, or ``None`` with a line saying why it is not used."""
        try:
            reply = decode(payload, SiteReply)
        except ValueError as error:
            _say(f"SuperNode {node_id} sent an unreadable reply: {error}")
            return None
        if expected.get(reply.client_id) != node_id:
            _say(f"SuperNode {node_id} replied for client {reply.client_id}, which it was not sent: ignored.")
            return None
        return reply

    def map_clients(self, client_ids: Iterable[int]) -> None:
        """Asks the nodes not asked yet which client they serve, if a client in ``client_ids`` has no node."""
        online = set(self.grid.get_node_ids())
        self.nodes = {client: node for client, node in self.nodes.items() if node in online}
        self._asked &= online
        unasked = sorted(online - self._asked)
        if not unasked or all(client in self.nodes for client in client_ids):
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


class SecureGridTransport(GridTransport):
    """A :class:`GridTransport` whose training rounds run under Flower's SecAgg+: the server sees the sites' sums
    only as their total.

    Each round runs Flower's ``SecAggPlusWorkflow`` once, driven from lightning_fed's own round loop (so sampling,
    seeding, checkpoints and resume stay lightning_fed's): four exchanges with the round's nodes (public keys, key
    shares, masked vectors, unmasking). The site answers the third with its reply, whose sums
    (:attr:`~lightning_fed.deploy.wire.SiteReply.secure_sums`) Flower's ``secaggplus_mod`` quantises and masks before
    they leave the site; the rest of the reply (metrics, rejection, step counts, integer buffers) travels in clear in
    the reply's metrics. Every client is given weight 1, so the workflow's weighted mean is the plain mean, which times
    the number of replies is the sum the server folds in. Evaluation tasks carry no sums and travel as in
    :class:`GridTransport`.

    A node that fails after sending its masked vector is recovered by SecAgg+ (its masks are rebuilt from the
    others' shares); one that fails before is dropped from the round. A round that SecAgg+ cannot complete (fewer
    live nodes than the reconstruction threshold) drops every client of the round.

    Args:
        grid: The ServerApp's grid.
        context: The ServerApp's context (the workflow keeps its round in the context's state).
        timeout: Seconds to wait for each of the round's exchanges (``None``: wait for every reply).
        clipping_range: :math:`c`: every entry of a site's sums must lie in :math:`[-c, c]`.
        quantization_range: :math:`2^b`, the integer levels of :math:`[-c, c]`.
        num_shares: Into how many shares a node's secrets are split: a count (> 2), or a fraction of the round's
            nodes (Flower's ``SecAggPlusWorkflow``).
        reconstruction_threshold: How many shares rebuild a secret: a count, or a fraction of ``num_shares``; the
            server learns nothing unless that many nodes collude, and a round survives dropouts while that many live.
    """

    def __init__(
        self,
        grid: Grid,
        context: Context,
        timeout: float | None = None,
        *,
        clipping_range: float = SECAGG_RUN_CONFIG["secagg-clipping-range"],
        quantization_range: int = SECAGG_RUN_CONFIG["secagg-quantization-range"],
        num_shares: int | float = SECAGG_RUN_CONFIG["secagg-num-shares"],
        reconstruction_threshold: int | float = SECAGG_RUN_CONFIG["secagg-reconstruction-threshold"],
    ) -> None:
        super().__init__(grid, timeout)
        self.context = context
        self.secure_range = clipping_range
        # Weight 1 per client (max_weight 1): the workflow's weighted mean is the plain mean.
        self.workflow = SecAggPlusWorkflow(
            num_shares,
            reconstruction_threshold,
            max_weight=1.0,
            clipping_range=clipping_range,
            quantization_range=quantization_range,
            timeout=timeout,
        )

    def exchange(self, tasks: list[RoundTask]) -> RoundReplies:
        """Runs one SecAgg+ round over the tasks' nodes; returns the clear replies and the sums' total."""
        if not tasks or any(task.evaluate for task in tasks):
            return super().exchange(tasks)
        round_idx = tasks[0].round_idx
        routed = self._route(tasks)
        if len(routed) < 2:
            if routed:
                _say(
                    f"Round {round_idx}: only client {routed[0][0].client_id} has a SuperNode; secure aggregation"
                    " needs 2, so it is dropped too."
                )
            return RoundReplies({})
        strategy = _SecureRound(self.grid, self.context.run_id, routed)
        legacy = LegacyContext(self.context, ServerConfig(num_rounds=1), strategy)
        legacy.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: round_idx + 1})
        legacy.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord()
        self.workflow(self.grid, legacy)
        if strategy.results is None:
            _say(f"Round {round_idx}: secure aggregation did not complete; every client of the round is dropped.")
            return RoundReplies({})
        expected = {task.client_id: node_id for task, node_id in routed}
        replies: dict[int, SiteReply] = {}
        for proxy, result in strategy.results:
            payload = result.metrics.get(REPLY_KEY)
            reply = self._reply(proxy.node_id, payload, expected) if isinstance(payload, bytes) else None
            if reply is None:
                # Its masked sums are inside the total, and what they were is unknown: the round cannot be used.
                _say(f"Round {round_idx}: a reply could not be read; every client of the round is dropped.")
                return RoundReplies({})
            replies[reply.client_id] = reply
        count = len(strategy.results)
        means = parameters_to_ndarrays(strategy.results[0][1].parameters)
        total = [torch.as_tensor(mean, dtype=torch.float64) * count for mean in means]
        return RoundReplies(replies, total)


class _SecureRound(Strategy):
    """The legacy strategy that Flower's SecAgg+ workflow drives for one round: it hands out lightning_fed's tasks
    and keeps what the workflow gives back (each reply, its arrays replaced by the unmasked mean)."""

    def __init__(self, grid: Grid, run_id: int, routed: list[tuple[RoundTask, int]]) -> None:
        empty = Parameters(tensors=[], tensor_type="numpy.ndarray")
        self.instructions = [
            (GridClientProxy(node_id, grid, run_id), FitIns(empty, {TASK_KEY: encode(task)}))
            for task, node_id in routed
        ]
        self.results: list[tuple[ClientProxy, FitRes]] | None = None

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return None

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        return self.instructions

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        self.results = list(results)
        return None, {}

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        return []

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        return None, {}

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        return None


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


def transport_of(grid: Grid, context: Context) -> GridTransport:
    """The run's transport: a :class:`SecureGridTransport` when the run config sets ``secagg``, with its
    ``secagg-clipping-range``, ``secagg-quantization-range``, ``secagg-num-shares`` and
    ``secagg-reconstruction-threshold``; else a plain :class:`GridTransport`."""
    run_config = context.run_config
    timeout = round_timeout(run_config)
    if not bool(_setting(run_config, "secagg", False)):
        return GridTransport(grid, timeout=timeout)
    settings = {key: _setting(run_config, key, default) for key, default in SECAGG_RUN_CONFIG.items()}
    return SecureGridTransport(
        grid,
        context,
        timeout,
        clipping_range=float(settings["secagg-clipping-range"]),
        quantization_range=int(settings["secagg-quantization-range"]),
        num_shares=settings["secagg-num-shares"],
        reconstruction_threshold=settings["secagg-reconstruction-threshold"],
    )


@server_app.main()
def server_main(grid: Grid, context: Context) -> None:
    """Builds the server from the app's ``config.yaml`` and runs the fit with the clients trained at the sites.

    Run config: ``round-timeout`` (seconds, ``0``: wait for every reply), ``resume`` (``true``: resume the newest
    run of this configuration, as ``--ckpt_path last``), ``workdir`` (where relative paths of the config, such as
    ``default_root_dir``, lead; default: the SuperLink's working directory), ``secagg`` and its settings
    (:func:`transport_of`).
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
    transport = transport_of(grid, context)
    resume = bool(_setting(run_config, "resume", False))
    serve(trainer, module, datamodule, transport, ckpt_path="last" if resume else None)


@client_app.query()
def client_query(message: Message, context: Context) -> Message:
    """Answers which client this SuperNode serves."""
    client_id = client_id_of(context.node_config)
    return Message(RecordDict({RECORD: ConfigRecord({CLIENT_ID_KEY: client_id})}), reply_to=message)


def _secure_aggregation(message: Message, context: Context, call_next: Any) -> Message:
    """Flower's SecAgg+ client mod for the messages of its workflow (they carry its stage); others pass by."""
    if RECORD_KEY_CONFIGS in message.content.config_records:
        return secaggplus_mod(message, context, call_next)
    return call_next(message, context)


def _handle(task_bytes: bytes, context: Context) -> SiteReply:
    """Answers a task at this site (:class:`~lightning_fed.deploy.site.ClientSite`).

    Raises:
        ValueError: If the task is for another client than this SuperNode's.
    """
    from lightning_fed.deploy.config import site_builder
    from lightning_fed.deploy.site import ClientSite

    task = decode(task_bytes, RoundTask)
    client_id = client_id_of(context.node_config)
    if task.client_id != client_id:
        raise ValueError(f"This SuperNode serves client {client_id}; a task for client {task.client_id} arrived.")
    data_config = _setting(context.node_config, "data-config", "")
    build = site_builder(find_app_dir() / APP_CONFIG, str(data_config) if data_config else None)
    site = ClientSite(build, state_dir_of(context.node_config, context.run_config))
    reply = site.handle(task)
    if task.secure_range is not None:
        from lightning_fed.engine.seeding import derive_seed

        # secaggplus_mod rounds each value up or down at random with numpy's global generator right after this
        # handler returns: seeded from (run seed, round, client), a run repeats to the bit.
        numpy.random.seed(derive_seed(task.seed, "secagg", task.round_idx, task.client_id) % 2**32)
    return reply


def _reply_message(message: Message, reply: SiteReply) -> Message:
    return Message(RecordDict({RECORD: ConfigRecord({REPLY_KEY: encode(reply)})}), reply_to=message)


@client_app.train(mods=[_secure_aggregation])
def client_train(message: Message, context: Context) -> Message:
    """Trains the task's client at this site and replies.

    Under secure aggregation the task comes in SecAgg+'s legacy layout (``fitins``), and the reply goes back in it:
    the sums as the result's arrays, which ``secaggplus_mod`` masks, and the rest of the reply in its metrics.
    """
    if LEGACY_TASK not in message.content.config_records:
        return _reply_message(message, _handle(_payload(message, TASK_KEY), context))
    task_bytes = message.content.config_records[LEGACY_TASK][TASK_KEY]
    if not isinstance(task_bytes, bytes):
        raise ValueError(f"`{LEGACY_TASK}.{TASK_KEY}` holds {type(task_bytes).__name__}, not bytes")
    reply = _handle(task_bytes, context)
    arrays = [leaf.numpy() for leaf in reply.secure_sums]
    reply.secure_sums = []
    result = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), 1, {REPLY_KEY: encode(reply)})
    return Message(recorddict_compat.fitres_to_recorddict(result, keep_input=True), reply_to=message)


@client_app.evaluate()
def client_evaluate(message: Message, context: Context) -> Message:
    """Evaluates the task's model on the client's test split at this site and replies."""
    return _reply_message(message, _handle(_payload(message, TASK_KEY), context))


__all__ = [
    "GridTransport",
    "SecureGridTransport",
    "client_app",
    "client_id_of",
    "find_app_dir",
    "round_timeout",
    "server_app",
    "state_dir_of",
    "transport_of",
]
