"""Warm site workers with real Flower processes: a worker killed mid-run, and a SuperNode serving three clients.

Each SuperNode's ClientApp forwards its tasks to one long-lived worker (:mod:`lightning_fed.deploy.worker`); the
worker holds nothing its state directory does not, so a killed one is replaced on the next message (or the same task,
sent again) and the run equals ``lightning-fed fit`` as if nothing had happened.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
from helpers.flower_configs import fitted_model, write_config
from helpers.flower_processes import (
    Processes,
    assert_close_states,
    deployed,
    run_local_deployment,
    start_supernode,
    wait_for,
)

pytest.importorskip("flwr", reason="Flower is the `flower` extra: pip install -e '.[flower]'")

from lightning_fed.deploy.site_store import SiteStateStore

pytestmark = pytest.mark.slow

NUM_SITES = 3


def _worker_pid(state_dir: Path) -> int | None:
    pid_files = sorted(state_dir.glob("worker-*.pid"))
    return int(pid_files[0].read_text()) if pid_files else None


@pytest.mark.timeout(900)
def test_a_worker_killed_mid_run_is_replaced_and_the_run_equals_the_fit(tmp_path):
    config = write_config(tmp_path, "scaffold")
    state_dir = tmp_path / "site-0-state"
    killed: list[int] = []

    def kill_site_0_after_its_first_version() -> None:
        # Round 0's version of client 0 is written just before its reply leaves: the worker dies with the round's
        # other clients still training (or the server folding), and the next task finds no worker.
        wait_for(lambda: SiteStateStore(state_dir, 0).versions(), timeout=600, what="client 0's first version")
        pid = _worker_pid(state_dir)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    killer = threading.Thread(target=kill_site_0_after_its_first_version, daemon=True)

    def three_sites_and_the_killer(processes: Processes, port: int) -> None:
        for site in range(NUM_SITES):
            start_supernode(processes, port, site, tmp_path / f"site-{site}-state")
        killer.start()

    run_local_deployment(tmp_path, config, three_sites_and_the_killer)
    killer.join(timeout=5)
    assert killed, "the worker was never killed"
    replacement = _worker_pid(state_dir)
    assert replacement is not None and replacement != killed[0], "no new worker answered site 0 after the kill"
    model, summary = deployed(tmp_path / "server")
    assert summary["completed_rounds"] == 3 and summary["rejected_clients_total"] == 0
    assert_close_states(model, fitted_model(config, tmp_path / "fit"))


@pytest.mark.timeout(900)
def test_one_supernode_serving_three_clients_equals_the_fit(tmp_path):
    config = write_config(tmp_path, "fedavg")
    state_dir = tmp_path / "site-state"
    run_local_deployment(
        tmp_path, config, lambda processes, port: start_supernode(processes, port, 0, state_dir, "0,1,2")
    )
    model, summary = deployed(tmp_path / "server")
    assert summary["completed_rounds"] == 3 and summary["rejected_clients_total"] == 0
    assert_close_states(model, fitted_model(config, tmp_path / "fit"))
    # One worker answered all three clients.
    assert len(list(state_dir.glob("worker-*.pid"))) == 1
