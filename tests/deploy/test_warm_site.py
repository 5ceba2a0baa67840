"""A warm site (one built module, data and trainer answering task after task) answers every task exactly as a site
built for that task alone would; the worker's framing refuses what it must."""

from __future__ import annotations

import re
import socket
from typing import Any

import pytest
import torch
from helpers.boring import BoringClassifier, fast_trainer, make_datamodule

from deploy.test_loopback import NUM_CLIENTS, _RecordingTransport, _settings
from lightning_fed.deploy import ClientSite, SiteTrainer, serve
from lightning_fed.deploy.wire import decode, encode
from lightning_fed.deploy.worker import answer_task
from lightning_fed.deploy.worker_link import receive_frame, send_frame
from lightning_fed.messages import ClientReply, ClientTask


def _builder(tmp_path: Any, algorithm: str) -> Any:
    def build() -> tuple[Any, Any, SiteTrainer]:
        trainer = SiteTrainer(
            default_root_dir=str(tmp_path / "site"), accelerator="cpu", devices=1, **_settings(algorithm)
        )
        return BoringClassifier(lr=0.1, batch_norm=True), make_datamodule(NUM_CLIENTS), trainer

    return build


def _recorded_tasks(tmp_path: Any, algorithm: str) -> list[ClientTask]:
    sites = {cid: ClientSite(_builder(tmp_path, algorithm), tmp_path / "recorded-state") for cid in range(NUM_CLIENTS)}
    transport = _RecordingTransport(sites)
    torch.manual_seed(0)
    module = BoringClassifier(lr=0.1, batch_norm=True)
    serve(fast_trainer(tmp_path / "server", **_settings(algorithm)), module, make_datamodule(NUM_CLIENTS), transport)
    return transport.tasks


def _assert_same_reply(got: ClientReply, expected: ClientReply) -> None:
    assert (got.client_ids, got.rejected, got.steps, got.train_metrics) == (
        expected.client_ids,
        expected.rejected,
        expected.steps,
        expected.train_metrics,
    )
    assert (got.round_state or {}).keys() == (expected.round_state or {}).keys()
    for key, state in (expected.round_state or {}).items():
        for name, value in state.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(got.round_state[key][name], value), (key, name)


@pytest.mark.parametrize("algorithm", ["scaffold+fedcurv", "apfl"])
def test_a_warm_site_answers_as_a_site_built_for_each_task(tmp_path, algorithm):
    tasks = _recorded_tasks(tmp_path, algorithm)
    assert len({task.round_idx for task in tasks}) == 3  # tasks of every round, several clients each
    warm = ClientSite(_builder(tmp_path, algorithm), tmp_path / "warm-state")
    try:
        for task in tasks:
            cold = ClientSite(_builder(tmp_path, algorithm), tmp_path / "cold-state")
            try:
                expected = cold.handle(task)
            finally:
                cold.close()
            _assert_same_reply(warm.handle(task), expected)
    finally:
        warm.close()


def test_a_site_refuses_a_task_for_a_client_it_does_not_serve(tmp_path):
    task = _recorded_tasks(tmp_path, "apfl")[0]
    site = ClientSite(_builder(tmp_path, "apfl"), tmp_path / "state")
    try:
        served = [cid for cid in range(NUM_CLIENTS) if cid != task.client_id]
        refusal = re.escape(f"serves clients {served}; a task for client {task.client_id} arrived")
        with pytest.raises(ValueError, match=refusal):
            answer_task(site, encode(task), served)
        answer = answer_task(site, encode(task), [task.client_id])
        assert decode(answer.reply, ClientReply).client_id == task.client_id and answer.secagg_seed is None
    finally:
        site.close()


def test_a_frame_longer_than_the_limit_is_refused_before_it_is_read():
    left, right = socket.socketpair()
    with left, right:
        send_frame(left, b"x" * 100)
        with pytest.raises(ValueError, match="A frame of 100 bytes arrived; at most 10 are accepted"):
            receive_frame(right, limit=10)
    left, right = socket.socketpair()
    with left, right:
        send_frame(left, b"abc")
        assert receive_frame(right, limit=3) == b"abc"
        left.close()
        with pytest.raises(ConnectionError):  # a peer that hangs up mid-frame: the link starts a new worker
            receive_frame(right)
