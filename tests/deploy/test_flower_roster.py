"""GridTransport with a roster, against a fake Flower grid whose nodes answer with lightning_fed's own ClientApp
handlers (no Flower processes): a node serves a client only if it signs the server's challenge with the client's
roster key, and a reply is read only if it is signed over its task's nonce, no larger than its task allows and for
its task's client. Each refusal is one line naming the node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("flwr", reason="Flower is the `flower` extra: pip install -e '.[flower]'")

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from lightning_fed.deploy.flower import GridTransport
from lightning_fed.deploy.flower.apps import _signed, client_query
from lightning_fed.deploy.keys import DeploymentKeys, write_keys
from lightning_fed.deploy.reply_check import reply_size_limit
from lightning_fed.deploy.roster import Roster
from lightning_fed.deploy.wire import decode, encode
from lightning_fed.messages import ClientReply, ClientTask


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch):
    """A message is built inside a Flower task (the ServerApp process sets its identity): pretend to be one."""
    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> DeploymentKeys:
    """Sites 0, 1, 2 serving clients 0, 1, 2; site 3's key is in no roster entry of its own (an outsider's)."""
    directory = tmp_path_factory.mktemp("keys")
    keys = write_keys(directory, [[0], [1], [2], [3]])
    roster = Roster.load(keys.roster)
    Roster({client: key for client, key in roster.keys.items() if client != 3}).write(keys.roster)
    return keys


class SigningGrid:
    """Nodes answering with lightning_fed's ClientApp query handler and signing their replies as its train handler
    does; ``tamper[client]`` changes a reply's record before it goes back. Every message sent is kept."""

    def __init__(self, nodes: dict[int, tuple[list[int], Path | None]]) -> None:
        self.nodes = nodes  # node id -> (clients it claims, its site key)
        self.sent: list[list[Message]] = []
        self.tamper: dict[int, Any] = {}
        self.records: list[dict[str, Any]] = []  # every reply record sent back

    def context(self, node_id: int) -> Context:
        clients, key = self.nodes[node_id]
        node_config: dict[str, Any] = {"client-ids": ",".join(map(str, clients))}
        if key is not None:
            node_config["site-key"] = str(key)
        return Context(run_id=1, node_id=node_id, node_config=node_config, state=RecordDict(), run_config={})

    def get_node_ids(self) -> list[int]:
        return list(self.nodes)

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> list[Message]:
        messages = list(messages)
        self.sent.append(messages)
        replies = []
        for message in messages:
            node_id = message.metadata.dst_node_id
            context = self.context(node_id)
            if message.metadata.message_type == "query":
                reply = client_query(message, context)
                reply.metadata.__dict__["_src_node_id"] = node_id
                replies.append(reply)
                continue
            task_record = dict(message.content["lightning_fed"])
            task = decode(task_record["task"], ClientTask)
            answer = ClientReply(
                task.round_idx, [task.client_id], {"aggregator": {"n": torch.tensor([1.0])}}, train_metrics={}, steps=3
            )
            record = _signed(encode(answer), task_record, context)
            tampered = self.tamper.get(task.client_id)
            if tampered is not None:
                record = tampered(record, task)
            self.records.append(record)
            reply = Message(RecordDict({"lightning_fed": ConfigRecord(record)}), reply_to=message)
            reply.metadata.__dict__["_src_node_id"] = node_id
            replies.append(reply)
        return replies


def _task(client_id: int, round_idx: int = 0) -> ClientTask:
    return ClientTask(
        round_idx, [client_id], [0, 1, 2], {0: 1, 1: 1, 2: 1}, 0, {"w": torch.zeros(2)}, broadcast={"aggregator": {}}
    )


def _transport(keys: DeploymentKeys, grid: SigningGrid) -> GridTransport:
    return GridTransport(grid, roster=Roster.load(keys.roster))  # type: ignore[arg-type]


def test_honest_nodes_serve_their_clients_and_their_signed_replies_are_read(keys, capsys):
    grid = SigningGrid({101: ([0], keys.site_key(0)), 102: ([1], keys.site_key(1)), 103: ([2], keys.site_key(2))})
    transport = _transport(keys, grid)
    replies = transport.exchange([_task(0), _task(1), _task(2)]).replies
    assert sorted(replies) == [0, 1, 2] and transport.nodes == {0: 101, 1: 102, 2: 103}
    assert "refused" not in capsys.readouterr().err
    # Every task carried its own fresh nonce.
    nonces = [m.content["lightning_fed"]["nonce"] for m in grid.sent[-1]]
    assert len(set(nonces)) == 3 and all(len(nonce) == 32 for nonce in nonces)


def test_a_second_node_claiming_a_client_without_its_key_cannot_take_its_tasks(keys, capsys):
    """Issue 40's report: a SuperNode started after round 1 with `client-id=0` got client 0's tasks."""
    grid = SigningGrid({101: ([0], keys.site_key(0)), 102: ([1], keys.site_key(1))})
    transport = _transport(keys, grid)
    assert sorted(transport.exchange([_task(0), _task(1)]).replies) == [0, 1]
    grid.nodes[2**64 - 5] = ([0], keys.site_key(3))  # registered with Flower, but not client 0's key
    grid.nodes[206] = ([7], keys.site_key(3))  # a client the roster does not name
    grid.nodes[207] = ([1], None)  # no site key at all
    for round_idx in (1, 2):
        assert sorted(transport.exchange([_task(0, round_idx), _task(1, round_idx)]).replies) == [0, 1]
        assert [m.metadata.dst_node_id for m in grid.sent[-1]] == [101, 102]
    assert transport.nodes == {0: 101, 1: 102}
    err = capsys.readouterr().err.strip().splitlines()
    assert sorted(err) == [
        f"[lightning_fed] SuperNode {2**64 - 5} claims client 0 but does not hold the key the roster names for"
        " client 0: refused.",
        "[lightning_fed] SuperNode 206 claims client 7, whom the roster does not name: refused.",
        "[lightning_fed] SuperNode 207 claims client 1 without signing for it: refused (its node config needs"
        " `site-key='<its private key>'`).",
    ]


def test_a_restarted_node_with_the_same_key_serves_its_client_again(keys, capsys):
    grid = SigningGrid({101: ([0], keys.site_key(0))})
    transport = _transport(keys, grid)
    transport.exchange([_task(0)])
    # Restarted: a new node id (Flower's node ids are unsigned 64-bit integers).
    grid.nodes = {101: ([0], keys.site_key(0)), 2**64 - 1: ([0], keys.site_key(0))}
    assert list(transport.exchange([_task(0, 1)]).replies) == [0]
    assert transport.nodes == {0: 2**64 - 1}
    assert f"{2**64 - 1} (newer) is used" in capsys.readouterr().err


def _resign_with(key_path: Path):
    from lightning_fed.deploy.roster import load_private_key, reply_statement, sign

    def tamper(record: dict[str, Any], task: ClientTask) -> dict[str, Any]:
        statement = reply_statement(record["nonce"], task.client_id, record["reply"])
        return {**record, "signature": sign(load_private_key(key_path), statement)}

    return tamper


def test_a_reply_that_is_not_signed_for_its_task_by_its_clients_key_is_refused(keys, capsys):
    grid = SigningGrid({101: ([0], keys.site_key(0)), 102: ([1], keys.site_key(1))})
    transport = _transport(keys, grid)
    assert sorted(transport.exchange([_task(0), _task(1)]).replies) == [0, 1]
    round_0 = {record["nonce"]: record for record in grid.records}
    # Another key, no signature, a round-0 message sent again as it was, and a round-0 reply and signature under
    # this task's nonce.
    grid.tamper[0] = _resign_with(keys.site_key(1))
    grid.tamper[1] = lambda record, task: {k: v for k, v in record.items() if k != "signature"}
    assert transport.exchange([_task(0, 1), _task(1, 1)]).replies == {}
    old = list(round_0.values())
    grid.tamper[0] = lambda record, task: old[0]
    grid.tamper[1] = lambda record, task: {**old[1], "nonce": record["nonce"]}
    assert transport.exchange([_task(0, 2), _task(1, 2)]).replies == {}
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4
    assert (
        "SuperNode 101 (client 0) sent a reply that client 0's roster key did not sign for this task of round 1"
        in err[0]
    )
    assert "SuperNode 102 (client 1) sent a reply that client 1's roster key did not sign" in err[1]
    assert "SuperNode 101 sent a reply to no task it was sent this round (a replayed reply?): refused." in err[2]
    assert (
        "SuperNode 102 (client 1) sent a reply that client 1's roster key did not sign for this task of round 2"
        in err[3]
    )


class _Huge(bytes):
    """Bytes that say they are 10**9 long: a reply of that size, without allocating it."""

    def __len__(self) -> int:
        return 10**9


def test_a_reply_larger_than_its_task_allows_is_refused_before_it_is_read(keys, capsys, monkeypatch):
    grid = SigningGrid({101: ([0], keys.site_key(0)), 102: ([1], keys.site_key(1))})
    transport = _transport(keys, grid)
    limit = reply_size_limit(_task(0))
    assert limit < 10**9
    grid.tamper[0] = lambda record, task: {**record, "reply": _Huge(b"x")}
    grid.tamper[1] = lambda record, task: {**record, "reply": bytes(limit + 1)}
    read: list[int] = []
    monkeypatch.setattr("lightning_fed.deploy.flower.grid_transport.reply_statement", lambda *a: read.append(1))
    assert transport.exchange([_task(0), _task(1)]).replies == {}
    assert not read, "an oversized reply was hashed"
    err = capsys.readouterr().err
    assert f"SuperNode 101 (client 0) sent a reply of 1000000000 bytes, more than the {limit} a reply" in err
    assert f"SuperNode 102 (client 1) sent a reply of {limit + 1} bytes" in err and "refused unread" in err


def test_a_signed_reply_for_another_client_is_refused(keys, capsys):
    grid = SigningGrid({101: ([0, 1], keys.site_key(0))})
    roster = Roster.load(keys.roster)
    roster = Roster({0: roster.keys[0], 1: roster.keys[0]})  # site 0 serves clients 0 and 1

    def for_client_1(record: dict[str, Any], task: ClientTask) -> dict[str, Any]:
        reply = encode(ClientReply(task.round_idx, [1], {}, steps=1))
        return _resign_with(keys.site_key(0))({**record, "reply": reply}, task)

    grid.tamper[0] = for_client_1
    transport = GridTransport(grid, roster=roster)  # type: ignore[arg-type]
    assert list(transport.exchange([_task(0), _task(1)]).replies) == [1]
    assert "SuperNode 101 (client 0) replied for clients [1], not for the client it was sent: refused." in (
        capsys.readouterr().err
    )


def test_secure_aggregation_with_a_roster_signs_the_clear_replies_and_repeats_the_unsigned_run_to_the_bit(
    tmp_path, monkeypatch, keys
):
    """Under SecAgg+ the clear part of each reply travels in the legacy result's metrics: signed there, checked
    there. Flower's real client mod and workflow, in this process (:class:`InProcessGrid`)."""
    from helpers.flower_configs import write_config

    from lightning_fed.deploy.app import write_app
    from lightning_fed.deploy.config import build_from_config
    from lightning_fed.deploy.flower import InProcessGrid, SecureGridTransport, client_app, server_context
    from lightning_fed.deploy.server import serve

    config = write_config(tmp_path, "fedavg")
    config.write_text(config.read_text().replace("num_rounds: 3", "num_rounds: 1"))
    models = {}
    for name, roster in (("unsigned", None), ("signed", Roster.load(keys.roster))):
        app = write_app([config], tmp_path / f"{name}-app", secagg=True)
        monkeypatch.syspath_prepend(str(app))
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        module, datamodule, trainer = build_from_config([app / "config.yaml"], save_config_callback=None)
        grid: Any = InProcessGrid(client_app, 3, tmp_path / f"{name}-sites")
        if roster is not None:
            for node_id, context in grid.contexts.items():
                context.node_config["site-key"] = str(keys.site_key(node_id - 1))
        serve(trainer, module, datamodule, SecureGridTransport(grid, server_context(), roster=roster))
        assert trainer.federation_state.history[0]["clients/dropped"] == 0.0, name
        models[name] = {key: value.detach().clone() for key, value in module.state_dict().items()}
    assert all(torch.equal(models["signed"][key], value) for key, value in models["unsigned"].items())
