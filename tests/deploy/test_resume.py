"""A deployment whose server crashes after the sites trained a round, resumed from its last checkpoint, ends with
the model and the site stores bit-identical to an uninterrupted deployment; the site store's commit protocol."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.boring import BoringClassifier, fast_trainer, make_datamodule

from lightning_fed.aggregators import FedAvg
from lightning_fed.callbacks import FedCurv, Scaffold
from lightning_fed.deploy import ClientSite, LoopbackTransport, SiteTrainer, serve
from lightning_fed.deploy.site_store import SiteStateStore
from lightning_fed.deploy.transport import RoundReplies
from lightning_fed.messages import ClientTask

NUM_CLIENTS = 4
ROUNDS = 4


class _ServerCrash(Exception):
    """The server died after the sites answered, before its checkpoint of the round."""


class _CrashingTransport(LoopbackTransport):
    def __init__(self, sites: dict[int, ClientSite], crash_round: int | None) -> None:
        super().__init__(sites)
        self.crash_round = crash_round

    def exchange(self, tasks: list[ClientTask]) -> RoundReplies:
        replies = super().exchange(tasks)
        if tasks and tasks[0].round_idx == self.crash_round:
            raise _ServerCrash
        return replies


def _settings(clients_per_round: int = 2) -> dict[str, Any]:
    return dict(
        num_rounds=ROUNDS,
        clients_per_round=clients_per_round,
        aggregator=FedAvg(weighting="uniform"),
        callbacks=[Scaffold(), FedCurv(lam=0.1)],
        client_eval="none",
        eval_every_n_rounds=0,
        seed=0,
    )


def _sites(state_dir: Path, clients_per_round: int = 2) -> dict[int, ClientSite]:
    def build() -> tuple[Any, Any, SiteTrainer]:
        settings = _settings(clients_per_round)
        trainer = SiteTrainer(default_root_dir=str(state_dir / "site"), accelerator="cpu", devices=1, **settings)
        return BoringClassifier(lr=0.1), make_datamodule(NUM_CLIENTS), trainer

    return {cid: ClientSite(build, state_dir) for cid in range(NUM_CLIENTS)}


def _serve(
    root: Path,
    state_dir: Path,
    crash_round: int | None = None,
    ckpt_path: str | None = None,
    clients_per_round: int = 2,
) -> Any:
    torch.manual_seed(0)
    module = BoringClassifier(lr=0.1)
    trainer = fast_trainer(root, enable_checkpointing=True, **_settings(clients_per_round))
    transport = _CrashingTransport(_sites(state_dir, clients_per_round), crash_round)
    serve(trainer, module, make_datamodule(NUM_CLIENTS), transport, ckpt_path)
    return module


def _stores(state_dir: Path) -> dict[int, dict[str, Any]]:
    # The state each client's next task would start from, whichever round comes next.
    return {cid: SiteStateStore(state_dir, cid).load(committed_round=ROUNDS) for cid in range(NUM_CLIENTS)}


def test_a_resumed_deployment_is_bit_identical_to_an_uninterrupted_one(tmp_path):
    reference = _serve(tmp_path / "a", tmp_path / "a-sites")
    with pytest.raises(_ServerCrash):
        _serve(tmp_path / "b", tmp_path / "b-sites", crash_round=2)
    # The sites trained round 2 and wrote it as pending: versions the checkpoint does not know.
    assert any(2 in SiteStateStore(tmp_path / "b-sites", cid).versions() for cid in range(NUM_CLIENTS))
    resumed = _serve(tmp_path / "b", tmp_path / "b-sites", ckpt_path="last")
    for name, value in reference.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], value), name
    expected, got = _stores(tmp_path / "a-sites"), _stores(tmp_path / "b-sites")
    assert expected.keys() == got.keys()
    for cid in expected:
        assert expected[cid].keys() == got[cid].keys(), cid
        for namespace in expected[cid]:
            torch.testing.assert_close(got[cid][namespace], expected[cid][namespace], rtol=0, atol=0)


def test_a_resume_that_falls_back_to_an_older_checkpoint_finds_the_sites_versions_it_names(tmp_path):
    """The server crashed in round 3 and its newest checkpoint (round 2) is corrupt: the resume falls back to round
    1's, which names every client's round-1 version. The sites (real site stores; every client trains every round)
    kept it through round 3's tasks, so the run ends as an uninterrupted one, model and site state."""
    every = dict(clients_per_round=NUM_CLIENTS)
    reference = _serve(tmp_path / "a", tmp_path / "a-sites", **every)
    with pytest.raises(_ServerCrash):
        _serve(tmp_path / "b", tmp_path / "b-sites", crash_round=3, **every)
    (checkpoints,) = (tmp_path / "b" / "runs").glob("*/checkpoints")
    assert sorted(path.name for path in checkpoints.iterdir()) == ["last.ckpt", "round0001.ckpt", "round0002.ckpt"]
    newest = checkpoints / "round0002.ckpt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    for cid in range(NUM_CLIENTS):
        assert 1 in SiteStateStore(tmp_path / "b-sites", cid).versions(), "round 1's version is gone"
    with pytest.warns(UserWarning, match="Skipping the corrupt checkpoint"):
        resumed = _serve(tmp_path / "b", tmp_path / "b-sites", ckpt_path="last", **every)
    for name, value in reference.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], value), name
    expected, got = _stores(tmp_path / "a-sites"), _stores(tmp_path / "b-sites")
    for cid in expected:
        assert expected[cid].keys() == got[cid].keys() and expected[cid], cid
        for namespace in expected[cid]:
            torch.testing.assert_close(got[cid][namespace], expected[cid][namespace], rtol=0, atol=0)


def test_the_site_store_keeps_what_the_kept_checkpoints_name(tmp_path):
    """A kept checkpoint of round q names the client's newest version at or before q: the site keeps that one for
    the oldest kept checkpoint (``resumable_from``) and every committed version after it."""
    store = SiteStateStore(tmp_path, client_id=2)
    for round_idx in (0, 2, 3, 5):
        store.save(round_idx, {"ns": torch.tensor(float(round_idx))})
    # Committed 3, oldest kept checkpoint of round 3: versions 0 and 2 are named by none, 5 was never folded.
    assert store.load(committed_round=3, resumable_from=3)["ns"].item() == 3.0
    assert store.versions() == [3]
    store.save(4, {"ns": torch.tensor(4.0)})
    store.save(5, {"ns": torch.tensor(5.0)})
    # Committed 5, checkpoints of rounds 4 and 5 kept: round 4's names version 4, which stays beside 5.
    assert store.load(committed_round=5, resumable_from=4)["ns"].item() == 5.0
    assert store.versions() == [4, 5]
    # The server cannot tell its checkpoints' rounds (-1): every committed version stays.
    store.save(7, {"ns": torch.tensor(7.0)})
    assert store.load(committed_round=7, resumable_from=-1)["ns"].item() == 7.0
    assert store.versions() == [4, 5, 7]
    # No checkpoint kept (None): only the committed version can be resumed from.
    assert store.load(committed_round=7)["ns"].item() == 7.0
    assert store.versions() == [7]


def test_the_site_store_keeps_the_newest_committed_version_and_drops_the_rest(tmp_path):
    store = SiteStateStore(tmp_path, client_id=7)
    assert store.load(committed_round=-1) == {}
    for round_idx in (1, 3, 4, 6):
        store.save(round_idx, {"ns": torch.tensor(float(round_idx))})
    # The server committed round 4 (its checkpoint), then resumed from it: round 6 will run again.
    state = store.load(committed_round=5)
    assert state["ns"].item() == 4.0
    assert store.versions() == [4]
    store.save(5, {"ns": torch.tensor(5.0)})
    assert store.load(committed_round=4)["ns"].item() == 4.0  # round 5 was never committed
    assert store.versions() == [4]
