"""lightning_fed on real Flower processes equals ``lightning-fed fit``: Flower's simulation engine (FedAvg, FedProx,
SCAFFOLD; FedAvg under SecAgg+ up to its rounding) and a local deployment (1 SuperLink and 3 SuperNodes, separate
processes on loopback).

Everything runs offline: ``FLWR_HOME`` in the test's directory, telemetry and the update check off, and no runtime
dependency installation (the SuperLink's ``--disable-runtime-dependency-installation``; a SuperNode's is off by
default). Each Flower process starts in its own session and is ended by its process group.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from helpers.flower_configs import write_config

pytest.importorskip("flwr", reason="Flower is the `flower` extra: pip install -e '.[flower]'")

from lightning_fed.deploy.app import write_app
from lightning_fed.deploy.config import build_from_config

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
NUM_SITES = 3


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        FLWR_HOME=str(home),
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        WANDB_MODE="offline",
        # The ServerApp and ClientApp processes import this checkout's lightning_fed.
        PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )
    return env


class Processes:
    """Flower processes, each in its own session, ended by process group."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, *command: str) -> subprocess.Popen[bytes]:
        log = (self.logs / f"{name}.log").open("wb")
        process = subprocess.Popen(
            command, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.logs
        )
        self.started.append(process)
        return process

    def stop(self) -> None:
        for process in reversed(self.started):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for process in self.started:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _start_superlink(processes: Processes, port: int, database: Path, simulation: bool) -> None:
    command = ["flower-superlink", "--insecure", "--disable-runtime-dependency-installation"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--database", str(database)]
    superlink = processes.start("superlink", *command, *(["--simulation"] if simulation else []))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert superlink.poll() is None, (processes.logs / "superlink.log").read_text()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError("the SuperLink did not come up within 60 s")


def _write_connection(home: Path, name: str, port: int, simulation: bool) -> None:
    home.mkdir(parents=True, exist_ok=True)
    text = f'[superlink]\ndefault = "{name}"\n\n[superlink.{name}]\naddress = "127.0.0.1:{port}"\ninsecure = true\n'
    if simulation:
        text += f"\n[superlink.{name}.options]\nnum-supernodes = {NUM_SITES}\n"
        text += f"\n[superlink.{name}.options.backend.client-resources]\nnum-cpus = 1\nnum-gpus = 0.0\n"
    (home / "config.toml").write_text(text)


def _flwr_run(env: dict[str, str], app: Path, connection: str, run_config: str, timeout: float) -> float:
    """Runs the app to its end (``--stream`` returns when the run ends); returns the seconds it took.

    Its output (the ServerApp's log) is kept in ``flwr-run.log`` beside the app.
    """
    start = time.monotonic()
    done = subprocess.run(
        ["flwr", "run", str(app), connection, "--run-config", run_config, "--stream"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout,
        start_new_session=True,
    )
    output = done.stdout.decode(errors="replace")
    (app.parent / "flwr-run.log").write_text(output)
    assert done.returncode == 0, output[-4000:]
    return time.monotonic() - start


def _fitted(tmp_path: Path, config: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, torch.Tensor]:
    """The model ``lightning-fed fit --config config`` trains."""
    monkeypatch.chdir(tmp_path)
    module, datamodule, trainer = build_from_config([config], save_config_callback=None)
    trainer.fit(module, datamodule=datamodule)
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _deployed(workdir: Path) -> tuple[dict[str, torch.Tensor], dict[str, object]]:
    """The deployed server's last checkpointed model and its summary.json."""
    (run_dir,) = (workdir / "runs").iterdir()
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    return checkpoint["state_dict"], json.loads((run_dir / "summary.json").read_text())


def _assert_equal(deployed: dict[str, torch.Tensor], fitted: dict[str, torch.Tensor]) -> None:
    assert deployed.keys() == fitted.keys()
    for name, value in fitted.items():
        torch.testing.assert_close(deployed[name], value, rtol=1e-5, atol=1e-6, msg=name)


@pytest.fixture(scope="module")
def simulation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], Path]]:
    """A SuperLink running Flower's simulation engine (3 virtual SuperNodes), shared by the module's runs."""
    root = tmp_path_factory.mktemp("flower-sim")
    home, port = root / "flwr-home", _free_port()
    _write_connection(home, "sim", port, simulation=True)
    processes = Processes(_env(home), root)
    try:
        _start_superlink(processes, port, root / "superlink.db", simulation=True)
        yield processes.env, root
    finally:
        processes.stop()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "scaffold"])
def test_the_simulation_engine_equals_the_fit(simulation, tmp_path, monkeypatch, algorithm):
    env, _ = simulation
    config = write_config(tmp_path, algorithm)
    app = write_app([config], tmp_path / "app", name=f"sim-{algorithm}")
    workdir, state = tmp_path / "server", tmp_path / "site-state"
    _flwr_run(env, app, "sim", f"workdir='{workdir}' state-dir='{state}'", timeout=600)
    deployed, summary = _deployed(workdir)
    assert summary["completed_rounds"] == 3 and summary["rejected_clients_total"] == 0
    _assert_equal(deployed, _fitted(tmp_path, config, monkeypatch))


@pytest.mark.timeout(900)
def test_secure_aggregation_on_the_simulation_engine_stays_within_1e4_of_the_fit(simulation, tmp_path, monkeypatch):
    """SecAgg+'s four exchanges per round through Flower's runtime: the model after 3 rounds is the fit's up to the
    fixed point's rounding."""
    env, _ = simulation
    config = write_config(tmp_path, "fedavg")
    app = write_app([config], tmp_path / "app", name="sim-secagg", secagg=True)
    workdir, state = tmp_path / "server", tmp_path / "site-state"
    _flwr_run(env, app, "sim", f"workdir='{workdir}' state-dir='{state}'", timeout=600)
    deployed, summary = _deployed(workdir)
    assert summary["completed_rounds"] == 3 and summary["rejected_clients_total"] == 0
    fitted = _fitted(tmp_path, config, monkeypatch)
    largest = max(float((deployed[name].double() - value.double()).abs().max()) for name, value in fitted.items())
    assert 0.0 < largest <= 1e-4


@pytest.mark.timeout(900)
def test_a_local_deployment_of_three_supernodes_equals_the_fit(tmp_path, monkeypatch):
    home, port = tmp_path / "flwr-home", _free_port()
    _write_connection(home, "local-deployment", port, simulation=False)
    processes = Processes(_env(home), tmp_path)
    config = write_config(tmp_path, "scaffold")
    app = write_app([config], tmp_path / "app", round_timeout=300)
    try:
        _start_superlink(processes, port, tmp_path / "superlink.db", simulation=False)
        for site in range(NUM_SITES):
            node_config = f"client-id={site} state-dir='{tmp_path / f'site-{site}-state'}'"
            processes.start(
                f"supernode-{site}",
                "flower-supernode",
                "--insecure",
                "--superlink",
                f"127.0.0.1:{port}",
                "--port",
                str(_free_port()),
                "--node-config",
                node_config,
            )
        seconds = _flwr_run(processes.env, app, "local-deployment", f"workdir='{tmp_path / 'server'}'", timeout=800)
    finally:
        processes.stop()
    print(f"deployed run: {seconds:.1f} s for 3 rounds")
    deployed, summary = _deployed(tmp_path / "server")
    # Every client in every round: none was dropped or rejected, and the model is the fit's.
    assert summary["completed_rounds"] == 3 and summary["rejected_clients_total"] == 0
    _assert_equal(deployed, _fitted(tmp_path, config, monkeypatch))
    for site in range(NUM_SITES):
        assert any((tmp_path / f"site-{site}-state").rglob("*")), f"site {site} kept no client state"
