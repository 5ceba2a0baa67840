"""lightning_fed's ServerApp and ClientApp: the server's fit over the sites, and a site's answer to each task."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.compat.common import recorddict_compat
from flwr.serverapp import Grid, ServerApp

from lightning_fed.deploy.app import SECAGG_RUN_CONFIG
from lightning_fed.deploy.flower.settings import (
    APP_CONFIG,
    CHALLENGE_KEY,
    CLIENT_ID_KEY,
    CLIENT_IDS_KEY,
    LEGACY_TASK,
    NONCE_KEY,
    PROOFS_KEY,
    RECORD,
    REPLY_KEY,
    SIGNATURE_KEY,
    SITE_KEY,
    TASK_KEY,
    client_ids_of,
    find_app_dir,
    payload,
    roster_of,
    round_timeout,
    say,
    setting,
    state_dir_of,
)

if TYPE_CHECKING:
    from lightning_fed.deploy.flower.grid_transport import GridTransport
    from lightning_fed.deploy.worker_link import WorkerAnswer

# torch, the wire format and the Lightning stack are imported where a handler needs them: Flower starts a ClientApp
# process per message, and SecAgg+'s key exchanges (three of its four messages a round) need none of them.

server_app = ServerApp()
client_app = ClientApp()


def transport_of(grid: Grid, context: Context) -> GridTransport:
    """The run's transport: a :class:`SecureGridTransport` when the run config sets ``secagg``, with its
    ``secagg-clipping-range``, ``secagg-quantization-range``, ``secagg-num-shares`` and
    ``secagg-reconstruction-threshold``; else a plain :class:`GridTransport`. Either checks every node's claims
    and replies against the run config's ``roster``; without one (an insecure local trial) it says so in one line."""
    from lightning_fed.deploy.flower.grid_transport import GridTransport
    from lightning_fed.deploy.flower.secure_transport import SecureGridTransport

    run_config = context.run_config
    timeout = round_timeout(run_config)
    roster = roster_of(run_config)
    if roster is None:
        say(
            "No roster (run config `roster`): any SuperNode may serve any client and its replies are not signed;"
            " this app is for a local trial only (`lightning-fed flower-app --insecure`)."
        )
    if not bool(setting(run_config, "secagg", False)):
        return GridTransport(grid, timeout=timeout, roster=roster)
    settings = {key: setting(run_config, key, default) for key, default in SECAGG_RUN_CONFIG.items()}
    return SecureGridTransport(
        grid,
        context,
        timeout,
        roster=roster,
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
    workdir = setting(run_config, "workdir", "")
    if workdir:
        Path(str(workdir)).mkdir(parents=True, exist_ok=True)
        os.chdir(str(workdir))
    module, datamodule, trainer = build_from_config([config])
    transport = transport_of(grid, context)
    resume = bool(setting(run_config, "resume", False))
    serve(trainer, module, datamodule, transport, ckpt_path="last" if resume else None)


@client_app.query()
def client_query(message: Message, context: Context) -> Message:
    """Answers which clients this SuperNode serves; with a ``site-key`` in its node config, each signed over the
    server's challenge (:func:`~lightning_fed.deploy.roster.serves_statement`), which the server checks against its
    roster."""
    from lightning_fed.deploy.roster import serves_statement, sign

    client_ids = client_ids_of(context.node_config)
    answer: dict[str, Any] = {CLIENT_IDS_KEY: client_ids}
    request: Any = message.content[RECORD] if RECORD in message.content.config_records else {}
    challenge = request.get(CHALLENGE_KEY)
    key = _site_key(context)
    if isinstance(challenge, bytes) and key is not None:
        answer[PROOFS_KEY] = [
            sign(key, serves_statement(challenge, context.node_id, client_id)) for client_id in client_ids
        ]
    return Message(RecordDict({RECORD: ConfigRecord(answer)}), reply_to=message)


def _site_key(context: Context) -> Any:
    """The node's private key (node config ``site-key``), or ``None`` if it names none."""
    from lightning_fed.deploy.roster import load_private_key

    path = setting(context.node_config, SITE_KEY, "")
    return load_private_key(str(path)) if path else None


def _signed(reply: bytes, task: dict[str, Any], context: Context) -> dict[str, Any]:
    """What goes back with a reply: the reply, the task's nonce echoed and, with a ``site-key``, the node's signature
    over the nonce, the client id and the reply (:func:`~lightning_fed.deploy.roster.reply_statement`)."""
    from lightning_fed.deploy.roster import reply_statement, sign

    answer: dict[str, Any] = {REPLY_KEY: reply}
    nonce, client_id = task.get(NONCE_KEY), task.get(CLIENT_ID_KEY)
    if isinstance(nonce, bytes):
        answer[NONCE_KEY] = nonce
        key = _site_key(context)
        if key is not None and isinstance(client_id, int):
            answer[SIGNATURE_KEY] = sign(key, reply_statement(nonce, client_id, reply))
    return answer


def _secure_aggregation(message: Message, context: Context, call_next: Any) -> Message:
    """Flower's SecAgg+ client mod for the messages of its workflow (they carry its stage); others pass by."""
    if RECORD_KEY_CONFIGS in message.content.config_records:
        return secaggplus_mod(message, context, call_next)
    return call_next(message, context)


def _handle(task_bytes: bytes, context: Context) -> WorkerAnswer:
    """Forwards a task to this site's warm worker (:mod:`lightning_fed.deploy.worker`) and returns its answer.

    This process imports neither torch nor Lightning: the worker, started on the site's first task, has paid for
    them once and answers every task of the site's clients (:class:`~lightning_fed.deploy.worker_link.WorkerLink`).

    Raises:
        WorkerError: If the task is for a client this SuperNode does not serve, or the worker failed it.
    """
    from lightning_fed.deploy.worker_link import WorkerLink

    data_config = setting(context.node_config, "data-config", "")
    state_dir, app_config = state_dir_of(context.node_config, context.run_config), find_app_dir() / APP_CONFIG
    client_ids, site_data = client_ids_of(context.node_config), str(data_config) if data_config else None
    if str(setting(context.node_config, "warm-worker", "true")).lower() in ("false", "0", "no"):
        answer = _answer_here(task_bytes, state_dir, app_config, site_data, client_ids)
    else:
        answer = WorkerLink(state_dir, app_config, site_data, client_ids).answer(task_bytes)
    if answer.secagg_seed is not None:
        # secaggplus_mod rounds each value up or down at random with numpy's global generator right after this
        # handler returns: seeded from (run seed, round, client), a run repeats to the bit.
        numpy.random.seed(answer.secagg_seed)
    return answer


def _answer_here(
    task_bytes: bytes, state_dir: Path, app_config: Path, data_config: str | None, client_ids: list[int]
) -> WorkerAnswer:
    """Answers a task in this process, with a site built for it alone (a node config's ``warm-worker=false``)."""
    from lightning_fed.deploy.config import site_builder
    from lightning_fed.deploy.site import ClientSite
    from lightning_fed.deploy.worker import answer_task

    site = ClientSite(site_builder(app_config, data_config), state_dir)
    try:
        return answer_task(site, task_bytes, client_ids)
    finally:
        site.close()


def _reply_message(message: Message, reply: bytes, context: Context) -> Message:
    task = dict(message.content[RECORD])
    return Message(RecordDict({RECORD: ConfigRecord(_signed(reply, task, context))}), reply_to=message)


@client_app.train(mods=[_secure_aggregation])
def client_train(message: Message, context: Context) -> Message:
    """Trains the task's client at this site and replies.

    Under secure aggregation the task comes in SecAgg+'s legacy layout (``fitins``), and the reply goes back in it:
    the sums as the result's arrays, which ``secaggplus_mod`` masks, and the rest of the reply in its metrics.
    """
    if LEGACY_TASK not in message.content.config_records:
        return _reply_message(message, _handle(payload(message, TASK_KEY), context).reply, context)
    task = dict(message.content.config_records[LEGACY_TASK])
    task_bytes = task.get(TASK_KEY)
    if not isinstance(task_bytes, bytes):
        raise ValueError(f"`{LEGACY_TASK}.{TASK_KEY}` holds {type(task_bytes).__name__}, not bytes")
    answer = _handle(task_bytes, context)
    signed = _signed(answer.reply, task, context)
    result = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(answer.arrays), 1, signed)
    return Message(recorddict_compat.fitres_to_recorddict(result, keep_input=True), reply_to=message)


@client_app.evaluate()
def client_evaluate(message: Message, context: Context) -> Message:
    """Evaluates the task's model on the client's test split at this site and replies."""
    return _reply_message(message, _handle(payload(message, TASK_KEY), context).reply, context)


__all__ = ["client_app", "server_app", "transport_of"]
