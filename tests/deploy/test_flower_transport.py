"""GridTransport against a fake Flower grid (no Flower processes): it finds each client's node by asking the nodes
once, sends one message per task, decodes the replies and drops a client whose reply does not come."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch

flwr = pytest.importorskip("flwr", reason="Flower is the `flower` extra: pip install -e '.[flower]'")

from flwr.app import ConfigRecord, Error, Message, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from lightning_fed.deploy.flower import (  # noqa: E402
    GridTransport,
    client_ids_of,
    round_timeout,
    state_dir_of,
)
from lightning_fed.deploy.wire import decode, encode  # noqa: E402
from lightning_fed.messages import ClientReply, ClientTask  # noqa: E402


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch):
    """A message is built inside a Flower task (the ServerApp process sets its identity): pretend to be one."""
    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


class FakeGrid:
    """Nodes serving clients; ``silent`` clients never reply to a task; every message sent is kept."""

    def __init__(self, clients_of_nodes: dict[int, int], silent: frozenset[int] = frozenset()) -> None:
        self.clients_of_nodes = clients_of_nodes
        self.silent = silent
        self.sent: list[list[Message]] = []
        self.timeouts: list[float | None] = []

    def get_node_ids(self) -> list[int]:
        return list(self.clients_of_nodes)

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> list[Message]:
        messages = list(messages)
        self.sent.append(messages)
        self.timeouts.append(timeout)
        replies = []
        for message in messages:
            client_id = self.clients_of_nodes[message.metadata.dst_node_id]
            if message.metadata.message_type == "query":
                replies.append(
                    Message(RecordDict({"lightning_fed": ConfigRecord({"client-ids": [client_id]})}), reply_to=message)
                )
                continue
            task = decode(message.content["lightning_fed"]["task"], ClientTask)
            assert task.client_id == client_id
            if client_id in self.silent:
                continue
            if client_id < 0:
                replies.append(Message(Error(code=0, reason="boom"), reply_to=message))
                continue
            reply = ClientReply(
                task.round_idx, [client_id], {"aggregator": {"n": torch.tensor([1.0])}}, train_metrics={}, steps=3
            )
            replies.append(
                Message(RecordDict({"lightning_fed": ConfigRecord({"reply": encode(reply)})}), reply_to=message)
            )
        return replies


def _task(client_id: int, round_idx: int = 0) -> ClientTask:
    return ClientTask(
        round_idx, [client_id], [0, 1, 2], {0: 1, 1: 1, 2: 1}, 0, {"w": torch.zeros(2)}, broadcast={"aggregator": {}}
    )


def test_clients_are_found_once_and_a_missing_reply_drops_its_client():
    grid = FakeGrid({101: 0, 102: 1, 103: 2}, silent=frozenset({1}))
    transport = GridTransport(grid, timeout=5.0)  # type: ignore[arg-type]
    replies = transport.exchange([_task(0), _task(1), _task(2)]).replies
    assert sorted(replies) == [0, 2] and replies[2].client_id == 2 and replies[0].steps == 3
    assert transport.nodes == {0: 101, 1: 102, 2: 103}
    queries, tasks = grid.sent
    assert {m.metadata.message_type for m in queries} == {"query"}
    assert [m.metadata.dst_node_id for m in tasks] == [101, 102, 103]
    assert {m.metadata.group_id for m in tasks} == {"0"} and grid.timeouts == [5.0, 5.0]
    assert {m.metadata.message_type for m in tasks} == {"train"}
    # The next round sends the tasks only: the nodes were asked once.
    transport.exchange([_task(0, 1), _task(2, 1)])
    assert len(grid.sent) == 3 and [m.metadata.dst_node_id for m in grid.sent[2]] == [101, 103]


def test_an_evaluation_travels_as_an_evaluate_message_and_nothing_is_summed_in_secret():
    grid = FakeGrid({101: 0})
    task = _task(0)
    task.evaluate = True
    received = GridTransport(grid).exchange([task])  # type: ignore[arg-type]
    assert grid.sent[-1][0].metadata.message_type == "evaluate"
    assert list(received.replies) == [0] and received.secure_sum is None


def test_a_restarted_node_is_asked_and_a_client_without_a_node_is_dropped():
    grid = FakeGrid({101: 0, 102: 1})
    transport = GridTransport(grid)  # type: ignore[arg-type]
    assert sorted(transport.exchange([_task(0), _task(1), _task(2)]).replies) == [0, 1]  # nobody serves client 2
    grid.clients_of_nodes = {101: 0, 205: 1}  # client 1's SuperNode came back under a new node id
    assert sorted(transport.exchange([_task(0, 1), _task(1, 1)]).replies) == [0, 1]
    assert transport.nodes == {0: 101, 1: 205}


def test_a_restarted_node_is_asked_while_its_dead_predecessor_is_still_listed(capsys):
    grid = FakeGrid({101: 0, 102: 1})
    transport = GridTransport(grid)  # type: ignore[arg-type]
    assert sorted(transport.exchange([_task(0), _task(1)]).replies) == [0, 1]
    # Client 1's SuperNode was killed and restarted as node 205; the SuperLink lists 102 until it misses heartbeats.
    grid.clients_of_nodes = {101: 0, 102: 1, 205: 1}
    assert sorted(transport.exchange([_task(0, 1), _task(1, 1)]).replies) == [0, 1]
    queries, tasks = grid.sent[-2:]
    assert [m.metadata.dst_node_id for m in queries] == [205]  # only the new node is asked
    assert [m.metadata.dst_node_id for m in tasks] == [101, 205]
    assert transport.nodes == {0: 101, 1: 205}
    assert "SuperNodes 102 and 205 both serve client 1: 205 (newer) is used" in capsys.readouterr().err
    # Nothing new appeared: the next round asks nobody.
    transport.exchange([_task(0, 2), _task(1, 2)])
    assert [m.metadata.message_type for m in grid.sent[-1]] == ["train", "train"]


def test_a_failed_task_drops_its_client(capsys):
    grid = FakeGrid({101: 0, 102: -1})
    transport = GridTransport(grid)  # type: ignore[arg-type]
    assert sorted(transport.exchange([_task(0), _task(-1)]).replies) == [0]
    assert "boom" in capsys.readouterr().err


class _SuperLinkAnswering(FakeGrid):
    """As a real grid: sent messages get ids; a dead node's task is answered by the SuperLink (node 1) with an error."""

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> list[Message]:
        messages = list(messages)
        for position, message in enumerate(messages):
            message.metadata.__dict__["_message_id"] = f"message-{position}"
        replies = super().send_and_receive(messages, timeout=timeout)
        for reply in replies:
            if reply.has_error():
                reply.metadata.__dict__["_src_node_id"] = 1
        return replies


def test_an_error_the_superlink_sends_names_the_node_and_client_it_is_about(capsys):
    grid = _SuperLinkAnswering({101: 0, 102: -1})
    GridTransport(grid).exchange([_task(0), _task(-1)])  # type: ignore[arg-type]
    assert "SuperNode 102 (client -1) failed its task: boom" in capsys.readouterr().err


def test_node_and_run_config():
    assert client_ids_of({"client-id": 4, "partition-id": 1}) == [4]
    assert client_ids_of({"partition-id": 1, "num-partitions": 3}) == [1]
    assert client_ids_of({"client-ids": "0, 1,2", "client-id": 4}) == [0, 1, 2]
    with pytest.raises(ValueError, match="client-id"):
        client_ids_of({})
    assert str(state_dir_of({"state-dir": "a"}, {"state-dir": "b"})) == "a"
    assert str(state_dir_of({}, {"state-dir": "b"})) == "b"
    with pytest.raises(ValueError, match="state-dir"):
        state_dir_of({}, {"state-dir": ""})
    assert round_timeout({"round-timeout": 0.0}) is None and round_timeout({"round-timeout": 30}) == 30.0


def test_the_flower_api_used_is_the_one_written_against():
    """Fails loudly when Flower changes a signature lightning_fed.deploy.flower relies on (pin: flwr>=1.42,<1.43)."""
    assert list(inspect.signature(Grid.send_and_receive).parameters) == ["self", "messages", "timeout"]
    assert "get_node_ids" in vars(Grid)
    for handler in (ClientApp.train, ClientApp.evaluate, ClientApp.query):
        assert list(inspect.signature(handler).parameters)[:2] == ["self", "action"]
    message = inspect.signature(Message.__init__).parameters
    assert {"dst_node_id", "message_type", "group_id", "reply_to"} <= set(message)
    assert bytes in flwr.app.ConfigScalar.__args__
