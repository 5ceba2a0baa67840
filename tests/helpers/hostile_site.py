"""A site that turns hostile in one round: the ClientApp of the hostile-site tests (real Flower processes).

Its SuperNode's node config says what it does for each of its clients in round ``hostile-round``
(``hostile='2:replay,3:shape,4:round,5:size'``) instead of answering honestly:

* ``replay``: sends again, as it was, the message it sent for that client in the round before;
* ``shape``: a reply whose summed round state has a tensor of the wrong shape;
* ``round``: a reply that says it answers the round before;
* ``size``: a reply one byte larger than the server accepts for the task (a site could send 10**9 bytes; Flower
  carries messages up to 2 GiB, so the test sends the smallest that must be refused).

Every tampered reply is signed with the site's key over the task's nonce, so that only the check it targets can
refuse it. Every other message is answered by lightning_fed's own ClientApp, whose handlers these call.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from helpers.flower_configs import use_client_app
from lightning_fed.deploy.flower import apps
from lightning_fed.deploy.flower.settings import (
    CLIENT_ID_KEY,
    NONCE_KEY,
    RECORD,
    REPLY_KEY,
    SIGNATURE_KEY,
    SITE_KEY,
    TASK_KEY,
    state_dir_of,
)
from lightning_fed.deploy.roster import load_private_key, reply_statement, sign

client_app = ClientApp()


@client_app.query()
def query(message: Message, context: Context) -> Message:
    return apps.client_query(message, context)


@client_app.train()
def train(message: Message, context: Context) -> Message:
    task = dict(message.content[RECORD])
    client, round_idx = int(task[CLIENT_ID_KEY]), int(message.metadata.group_id)
    plan = dict(item.split(":") for item in str(context.node_config.get("hostile", "")).split(",") if item)
    hostile_round = int(context.node_config.get("hostile-round", -1))
    what = plan.get(str(client)) if round_idx == hostile_round else None
    saved = state_dir_of(context.node_config, context.run_config) / f"hostile-{client}-sent.json"
    if what == "replay":
        record = {key: base64.b64decode(value) for key, value in json.loads(saved.read_text()).items()}
        return _message(record, message)
    honest = apps.client_train(message, context)
    record = dict(honest.content[RECORD])
    if what is None:
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps({key: base64.b64encode(value).decode() for key, value in record.items()}))
        return honest
    payload = _tampered(what, record[REPLY_KEY], task)
    key = load_private_key(str(context.node_config[SITE_KEY]))
    nonce = task[NONCE_KEY]
    signature = sign(key, reply_statement(nonce, client, payload))
    return _message({REPLY_KEY: payload, NONCE_KEY: nonce, SIGNATURE_KEY: signature}, message)


def _message(record: dict[str, Any], message: Message) -> Message:
    return Message(RecordDict({RECORD: ConfigRecord(record)}), reply_to=message)


def _tampered(what: str, reply_bytes: bytes, task: dict[str, Any]) -> bytes:
    from lightning_fed.deploy.reply_check import reply_size_limit
    from lightning_fed.deploy.wire import decode, encode
    from lightning_fed.messages import ClientReply, ClientTask

    if what == "size":
        return bytes(reply_size_limit(decode(task[TASK_KEY], ClientTask)) + 1)
    reply = decode(reply_bytes, ClientReply)
    if what == "round":
        reply.round_idx -= 1
    elif what == "shape":
        import torch

        assert reply.round_state is not None
        state = reply.round_state["aggregator"]
        # FedAvg's sum as the site packs it (one client's share as float32 entries and a weight), or as it is held.
        summed = state["_sum_as_float32"] if "_sum_as_float32" in state else state["_sum"]
        first = next(iter(summed))
        summed[first] = torch.zeros(3, dtype=summed[first].dtype)
    else:
        raise ValueError(f"no such hostility: {what}")
    return encode(reply)


def write_hostile_app(app: Path) -> None:
    """Points the app's ClientApp component at this module (the ServerApp stays lightning_fed's)."""
    use_client_app(app, "helpers.hostile_site:client_app")


__all__ = ["client_app", "write_hostile_app"]
