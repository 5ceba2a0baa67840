"""A client whose site trained a round and wrote its state version, but whose reply the server never folded (the
site was killed between its write and its reply, or the reply missed the round timeout), continues from the state
the server knows: the deployment equals simulation rejecting that client in that round, its per-client state (SCAFFOLD's
``c_i``, FedCurv's statistics, APFL's personalised model) and its personalised evaluation included."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.boring import BoringClassifier, PoisonClient, fast_trainer, make_datamodule
from helpers.deploy_faults import DroppingTransport

from lightning_fed.aggregators import FedAvg
from lightning_fed.callbacks import APFL, FedCurv, Scaffold
from lightning_fed.deploy import ClientSite, SiteTrainer, serve
from lightning_fed.deploy.remote import FOLDED
from lightning_fed.deploy.site_store import SiteStateStore

NUM_CLIENTS = 3
ROUNDS = 3
DROPPED, DROP_ROUND = 1, 1

# (callbacks, namespaces of per-client state, client_eval): every site and the server build their own objects.
ALGORITHMS: dict[str, tuple[Callable[[], list[Any]], tuple[str, ...], str]] = {
    "scaffold+fedcurv": (lambda: [Scaffold(), FedCurv(lam=0.1)], ("scaffold", "fedcurv"), "none"),
    # The dropped client is evaluated after the round it was dropped in, with its personalised model.
    "apfl": (lambda: [APFL(alpha=0.25)], ("apfl",), "sampled"),
}


def _settings(algorithm: str) -> dict[str, Any]:
    callbacks, _, client_eval = ALGORITHMS[algorithm]
    # Every client in every round: the dropped client trains again after the round it was dropped in.
    return dict(
        num_rounds=ROUNDS,
        clients_per_round=NUM_CLIENTS,
        aggregator=FedAvg(weighting="uniform"),
        callbacks=callbacks(),
        client_eval=client_eval,
        eval_every_n_rounds=0,
        seed=0,
    )


def _module() -> BoringClassifier:
    torch.manual_seed(0)
    return BoringClassifier(lr=0.1)


def _sites(state_dir: Path, algorithm: str) -> dict[int, ClientSite]:
    def build() -> tuple[Any, Any, SiteTrainer]:
        settings = _settings(algorithm)
        trainer = SiteTrainer(default_root_dir=str(state_dir / "site"), accelerator="cpu", devices=1, **settings)
        return BoringClassifier(lr=0.1), make_datamodule(NUM_CLIENTS), trainer

    return {cid: ClientSite(build, state_dir) for cid in range(NUM_CLIENTS)}


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_a_dropped_reply_leaves_the_client_where_the_server_knows_it_as_simulation_rejecting_it(tmp_path, algorithm):
    settings = _settings(algorithm)
    settings["callbacks"].append(PoisonClient(DROPPED, round_idx=DROP_ROUND))
    simulated, reference = _module(), fast_trainer(tmp_path / "sim", **settings)
    reference.fit(simulated, datamodule=make_datamodule(NUM_CLIENTS))

    state_dir = tmp_path / "site-state"
    transport = DroppingTransport(_sites(state_dir, algorithm), DROPPED, DROP_ROUND)
    deployed, trainer = _module(), fast_trainer(tmp_path / "server", **_settings(algorithm))
    serve(trainer, deployed, make_datamodule(NUM_CLIENTS), transport)

    # The site did train the dropped round and wrote its version: a state the server never folded.
    assert transport.versions_after_drop[-1] == DROP_ROUND
    # The client's next task (an evaluation of the round, or the next round's training) tells the site which of the
    # client's rounds the server folded: the one before the drop; the other clients' tasks name the dropped round.
    tasks = transport.tasks
    dropped = next(i for i, t in enumerate(tasks) if (t.client_id, t.round_idx) == (DROPPED, DROP_ROUND))
    following = next(t for t in tasks[dropped + 1 :] if t.client_id == DROPPED)
    assert following.committed_round == DROP_ROUND - 1
    others = [t for t in tasks if t.client_id != DROPPED and t.round_idx == DROP_ROUND + 1 and not t.evaluate]
    assert others and {t.committed_round for t in others} == {DROP_ROUND}

    history, expected = trainer.federation_state.history, reference.federation_state.history
    assert [m["clients/dropped"] for m in history] == [float(r == DROP_ROUND) for r in range(ROUNDS)]
    assert [m["clients/rejected"] for m in history] == [m["clients/rejected"] for m in expected]
    for name, value in simulated.state_dict().items():
        torch.testing.assert_close(deployed.state_dict()[name], value, rtol=1e-5, atol=1e-6, msg=name)
    # A personalised evaluation of the dropped client used the model the server knows, as simulation's did.
    for got, want in zip(history, expected):
        personal = {k: v for k, v in want.items() if k.startswith("personal/")}
        assert {k: got[k] for k in personal} == pytest.approx(personal, rel=1e-5, abs=1e-6)
    # Each site's state is the simulated store's: the dropped client's state never moved in the round it was dropped.
    for cid in range(NUM_CLIENTS):
        site_state = SiteStateStore(state_dir, cid).load(committed_round=ROUNDS)
        for namespace in ALGORITHMS[algorithm][1]:
            torch.testing.assert_close(
                site_state[namespace],
                reference.federation_state.store.get(namespace, cid),
                rtol=1e-5,
                atol=1e-6,
                msg=f"{namespace} of client {cid}",
            )
    # The server keeps, per client, the round of its newest folded reply (checkpointed, so that a resume knows it).
    store = trainer.federation_state.store
    assert store.namespaces() == [FOLDED]
    assert [store.get(FOLDED, cid) for cid in range(NUM_CLIENTS)] == [ROUNDS - 1] * NUM_CLIENTS


def test_an_evaluation_reads_the_newest_folded_version_and_drops_the_versions_after_it(tmp_path):
    store = SiteStateStore(tmp_path, client_id=2)
    for round_idx in (1, 3, 4):
        store.save(round_idx, {"ns": torch.tensor(float(round_idx))})
    # The server folded round 3 (not yet checkpointed) but not round 4's reply.
    assert store.latest(3)["ns"].item() == 3.0
    # Round 1 stays: a server that resumes from its checkpoint before round 3 continues from it.
    assert store.versions() == [1, 3]
