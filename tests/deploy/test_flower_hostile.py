"""Hostile sites against a secure local deployment (issue 40): real SuperLink and SuperNode processes on loopback, the
SuperLink serving TLS with the test CA's certificate and authenticating SuperNodes, the app carrying a roster.

One run of 3 rounds, FedAvg, 6 clients in every round. Sites 0 and 1 serve clients 0 and 1 honestly; site 2 serves
clients 2 to 5 and turns hostile in round 1 (:mod:`helpers.hostile_site`): for client 2 it replays its round-0 message,
for client 3 it sends a sum of the wrong shape, for client 4 a reply that says it answers round 0, for client 5 a reply
one byte over the size a reply to its task may have. Around them:

* a node whose key is not registered with the SuperLink (Flower refuses it);
* a node that trusts another CA (its TLS handshake fails);
* a registered node, started once round 0 is checkpointed, that claims client 0 with its own key (the roster names
  another): the bug of issue 40 gave it client 0's tasks from then on.

Each is refused with one line naming what was wrong, nothing it sent is folded (the model equals a one-process
deployment that loses clients 2-5 in round 1), the run continues and its checkpoints load.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import torch
from helpers.deploy_faults import DroppingTransport
from helpers.flower_configs import write_config
from helpers.flower_processes import (
    REPO,
    Processes,
    SecureFleet,
    assert_close_states,
    deployed,
    flower_env,
    flwr_run_command,
    free_port,
    run_dir,
    start_superlink,
    start_supernode,
    wait_for,
    write_connection,
)

pytest.importorskip("flwr", reason="Flower is the `flower` extra: pip install -e '.[flower]'")

from helpers.hostile_site import write_hostile_app

from lightning_fed.deploy import ClientSite, serve
from lightning_fed.deploy.app import write_app
from lightning_fed.deploy.config import build_from_config, site_builder
from lightning_fed.deploy.keys import write_authority

pytestmark = pytest.mark.slow

NUM_CLIENTS, ROUNDS, HOSTILE_ROUND = 6, 3, 1
HOSTILE = {2: "replay", 3: "shape", 4: "round", 5: "size"}


def _config(directory: Path) -> Path:
    config = write_config(directory, "fedavg")
    text = config.read_text().replace("num_partitions: 3", f"num_partitions: {NUM_CLIENTS}")
    config.write_text(text.replace("clients_per_round: 3", f"clients_per_round: {NUM_CLIENTS}"))
    return config


def _reference(root: Path, config: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, torch.Tensor]:
    """A one-process deployment of ``config`` that loses the hostile clients' replies in the hostile round."""
    (root / "reference").mkdir()
    monkeypatch.chdir(root / "reference")
    module, datamodule, trainer = build_from_config([config], save_config_callback=None)
    sites = {cid: ClientSite(site_builder(config), root / "reference-sites") for cid in range(NUM_CLIENTS)}
    serve(trainer, module, datamodule, DroppingTransport(sites, HOSTILE, HOSTILE_ROUND))
    return {name: value.detach().clone() for name, value in module.state_dict().items()}


def _exited(processes: Processes, process: object, name: str) -> str:
    """The log of a SuperNode that must exit by itself (Flower refused it), once it has."""
    wait_for(lambda: process.poll() is not None, 120, f"{name} to exit")  # type: ignore[attr-defined]
    assert process.returncode != 0  # type: ignore[attr-defined]
    return processes.log(name)


@pytest.mark.timeout(900)
def test_hostile_sites_are_refused_in_one_line_each_and_nothing_they_send_is_folded(tmp_path, monkeypatch):
    started = time.monotonic()
    config = _config(tmp_path)
    home, port = tmp_path / "flwr-home", free_port()
    fleet = SecureFleet(tmp_path / "keys")
    write_connection(home, "secure", port, fleet=fleet)
    env = flower_env(home)
    env["PYTHONPATH"] += f":{REPO / 'tests'}"  # the hostile site's ClientApp: helpers.hostile_site
    processes = Processes(env, tmp_path, fleet)
    try:
        start_superlink(processes, port, tmp_path / "superlink.db")
        start_supernode(processes, port, 0, tmp_path / "site-0-state")
        start_supernode(processes, port, 1, tmp_path / "site-1-state")
        hostile = ",".join(f"{client}:{what}" for client, what in HOSTILE.items())
        plan = f"hostile='{hostile}' hostile-round={HOSTILE_ROUND}"
        start_supernode(processes, port, 2, tmp_path / "site-2-state", "2,3,4,5", node_config=plan)
        # Flower's own refusals: a key the SuperLink never registered, and a SuperNode that trusts another CA.
        unregistered = start_supernode(processes, port, 3, tmp_path / "s3", "1", register=False, in_roster=False)
        other_ca = write_authority(tmp_path / "other-ca").ca
        wrong_ca = start_supernode(
            processes, port, 4, tmp_path / "s4", "1", root_certificates=other_ca, in_roster=False
        )
        app = write_app([config], tmp_path / "app", round_timeout=300, roster=fleet.write_roster())
        write_hostile_app(app)
        workdir = tmp_path / "server"
        run = processes.start("flwr-run", *flwr_run_command(app, "secure", f"workdir='{workdir}'"))
        # Once round 0 is checkpointed, a registered node claims client 0 with its own key.
        wait_for(
            lambda: run.poll() is not None or any(workdir.glob("runs/*/checkpoints/round0000.ckpt")), 300, "round 0"
        )
        impostor = start_supernode(processes, port, 5, tmp_path / "s5", "0", in_roster=False)
        assert run.wait(600) == 0, processes.log("flwr-run")[-4000:]
        print(f"hostile-site deployment: {time.monotonic() - started:.1f} s")
        assert impostor.poll() is None, "the impostor is a valid SuperNode: Flower lets it in, the roster does not"

        log = processes.log("flwr-run")
        # The server's lines (a progress bar may share a line with one of them).
        refusals = re.findall(r"\[lightning_fed\] [^\r\n]*(?:: refused|is refused:)[^\r\n]*", log)
        print("\n".join(refusals))
        # One line each, naming what was wrong.
        assert any("claims client 0 but does not hold the key the roster names for client 0" in x for x in refusals)
        assert any("a reply to no task it was sent this round (a replayed reply?)" in x for x in refusals)
        assert any(
            "Client 3's reply in round 1 is refused: `aggregator._sum." in x and "shape (3,)" in x for x in refusals
        )
        assert any(
            "Client 4's reply in round 1 is refused: a reply for round 0 arrived in round 1" in x for x in refusals
        )
        assert any("(client 5) sent a reply of" in x and "refused unread" in x for x in refusals)
        assert len(refusals) == 5, refusals
        assert "No roster" not in log and "No SuperNode serves" not in log and "did not say" not in log
        assert "No SuperNode found with the given public key" in processes.log("superlink")
        assert "Failed to activate SuperNode" in _exited(processes, unregistered, "supernode-3")
        assert "CERTIFICATE_VERIFY_FAILED" in _exited(processes, wrong_ca, "supernode-4")
    finally:
        processes.stop()

    model, summary = deployed(workdir)
    assert summary["completed_rounds"] == ROUNDS and summary["rejected_clients_total"] == len(HOSTILE)
    # The impostor never got client 0's tasks: client 0 answered every round.
    checkpoints = sorted((run_dir(workdir) / "checkpoints").glob("round*.ckpt"))
    assert checkpoints, "the server kept its round checkpoints"
    for checkpoint in checkpoints:
        torch.load(checkpoint, map_location="cpu", weights_only=False)
    assert_close_states(model, _reference(tmp_path, config, monkeypatch))
