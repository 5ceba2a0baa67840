"""lightning_fed on real Flower processes equals ``lightning-fed fit``: Flower's simulation engine (FedAvg, FedProx,
SCAFFOLD; FedAvg under SecAgg+ up to its rounding) and a local deployment (1 SuperLink and 3 SuperNodes, separate
processes on loopback).

The Flower processes run offline and end with the test (:mod:`helpers.flower_processes`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.flower_configs import fitted_model, write_config
from helpers.flower_processes import (
    Processes,
    assert_close_states,
    deployed,
    flower_env,
    flwr_run,
    free_port,
    run_local_deployment,
    start_superlink,
    start_supernode,
    write_connection,
)

pytest.importorskip("flwr", reason="Flower is the `flower` extra: pip install -e '.[flower]'")

from lightning_fed.deploy.app import write_app

pytestmark = pytest.mark.slow

NUM_SITES = 3


@pytest.fixture(scope="module")
def simulation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], Path]]:
    """A SuperLink running Flower's simulation engine (3 virtual SuperNodes), shared by the module's runs."""
    root = tmp_path_factory.mktemp("flower-sim")
    home, port = root / "flwr-home", free_port()
    write_connection(home, "sim", port, simulation=True, num_supernodes=NUM_SITES)
    processes = Processes(flower_env(home), root)
    try:
        start_superlink(processes, port, root / "superlink.db", simulation=True)
        yield processes.env, root
    finally:
        processes.stop()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "scaffold"])
def test_the_simulation_engine_equals_the_fit(simulation, tmp_path, algorithm):
    env, _ = simulation
    config = write_config(tmp_path, algorithm)
    app = write_app([config], tmp_path / "app", name=f"sim-{algorithm}")
    workdir, state = tmp_path / "server", tmp_path / "site-state"
    flwr_run(env, app, "sim", f"workdir='{workdir}' state-dir='{state}'", timeout=600)
    model, summary = deployed(workdir)
    assert summary["completed_rounds"] == 3 and summary["rejected_clients_total"] == 0
    assert_close_states(model, fitted_model(config, tmp_path / "fit"))


@pytest.mark.timeout(900)
def test_secure_aggregation_on_the_simulation_engine_stays_within_1e4_of_the_fit(simulation, tmp_path):
    """SecAgg+'s four exchanges per round through Flower's runtime: the model after 3 rounds is the fit's up to the
    fixed point's rounding."""
    env, _ = simulation
    config = write_config(tmp_path, "fedavg")
    app = write_app([config], tmp_path / "app", name="sim-secagg", secagg=True)
    workdir, state = tmp_path / "server", tmp_path / "site-state"
    flwr_run(env, app, "sim", f"workdir='{workdir}' state-dir='{state}'", timeout=600)
    model, summary = deployed(workdir)
    assert summary["completed_rounds"] == 3 and summary["rejected_clients_total"] == 0
    fitted = fitted_model(config, tmp_path / "fit")
    largest = max(float((model[name].double() - value.double()).abs().max()) for name, value in fitted.items())
    assert 0.0 < largest <= 1e-4


@pytest.mark.timeout(900)
def test_a_local_deployment_of_three_supernodes_equals_the_fit(tmp_path):
    config = write_config(tmp_path, "scaffold")

    def three_sites(processes: Processes, port: int) -> None:
        for site in range(NUM_SITES):
            start_supernode(processes, port, site, tmp_path / f"site-{site}-state")

    seconds = run_local_deployment(tmp_path, config, three_sites)
    print(f"deployed run: {seconds:.1f} s for 3 rounds")
    model, summary = deployed(tmp_path / "server")
    # Every client in every round: none was dropped or rejected, and the model is the fit's.
    assert summary["completed_rounds"] == 3 and summary["rejected_clients_total"] == 0
    assert_close_states(model, fitted_model(config, tmp_path / "fit"))
    for site in range(NUM_SITES):
        assert any((tmp_path / f"site-{site}-state").rglob("*")), f"site {site} kept no client state"
