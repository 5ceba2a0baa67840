"""Real Flower processes for the deployment tests: a SuperLink, SuperNodes and ``flwr run``, offline, on loopback.

Flower's executables (``flower-superlink``, ``flower-supernode``, ``flwr``) are taken from beside this interpreter
first (a virtual environment's ``bin/``, whether activated or not), then from ``PATH``; a test without them is skipped
naming where they were looked for, and each process's log starts with the command that ran. The interpreter's
directory also leads each process's ``PATH``, so the processes Flower starts itself (``flower-superexec``,
``flwr-serverapp``, ``flwr-clientapp``) come from the same environment.

Everything runs offline: ``FLWR_HOME`` in the test's directory, telemetry and the update check off, and no runtime
dependency installation (the SuperLink's ``--disable-runtime-dependency-installation``; a SuperNode's is off by
default). Each Flower process starts in its own session and is ended, or killed, with every process it started: by
its process group and the groups of its descendants. A SuperNode's SuperExec and ClientApps share its group, but the
SuperLink's SuperExec starts a session of its own, with the ServerApp in it (which outlives a killed SuperLink).

A secure deployment (:class:`SecureFleet`, as the docs run it): the SuperLink serves TLS with a certificate of the
test's own CA and authenticates SuperNodes; each site's key pair is made when its SuperNode first starts, registered
with ``flwr supernode register`` and written into the roster with the clients the site serves.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]

#: Where the environment of this interpreter keeps its console scripts (not resolved: a venv's python is a link).
INTERPRETER_BIN = Path(sys.executable).parent


def flower_executable(name: str) -> str:
    """The path of Flower's executable ``name``: beside this interpreter, else on ``PATH``; skips the test when
    neither has it."""
    beside = INTERPRETER_BIN / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is not None:
        return found
    pytest.skip(
        f"Flower's `{name}` is neither beside this interpreter ({INTERPRETER_BIN}) nor on PATH: install the `flower`"
        " extra into this interpreter's environment (pip install -e '.[flower]')"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def flower_env(home: Path) -> dict[str, str]:
    """The environment of every Flower process (and ``flwr run``) of a test whose Flower home is ``home``."""
    env = dict(os.environ)
    env.update(
        FLWR_HOME=str(home),
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        WANDB_MODE="offline",
        # Flower starts processes of its own by name (flower-superexec, flwr-serverapp): from this environment.
        PATH=os.pathsep.join([str(INTERPRETER_BIN), *filter(None, [os.environ.get("PATH")])]),
        # The ServerApp and ClientApp processes import this checkout's lightning_fed.
        PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )
    return env


class SecureFleet:
    """The keys of a secure local deployment: a CA, the SuperLink's certificate, and a key pair per site, made on
    demand, with the roster of the sites made so far.

    Args:
        directory: Where the keys go.
    """

    def __init__(self, directory: Path) -> None:
        from lightning_fed.deploy.keys import write_authority

        self.keys = write_authority(directory)
        self.roster: dict[int, Any] = {}
        self.registered: set[int] = set()

    def site_key(self, site: int, client_ids: list[int]) -> Path:
        """Site ``site``'s private key (made on first use), now serving ``client_ids`` in the roster."""
        from lightning_fed.deploy.keys import write_site_key
        from lightning_fed.deploy.roster import parse_public_key

        path = self.keys.site_key(site)
        if path.exists():
            public = parse_public_key(self.keys.site_public_key(site).read_text(), f"site {site}'s key")
        else:
            public = write_site_key(self.keys, site)
        self.roster.update(dict.fromkeys(client_ids, public))
        return path

    def write_roster(self) -> Path:
        from lightning_fed.deploy.roster import Roster

        return Roster(self.roster).write(self.keys.roster)


class Processes:
    """Flower processes, each in its own session, ended by process group.

    Args:
        env: Their environment (:func:`flower_env`).
        logs: Where each process's output goes, ``<name>.log`` (appended to, when a name is started again).
        fleet: The keys of a secure deployment (TLS, authenticated SuperNodes, a roster); ``None``: ``--insecure``.
    """

    def __init__(self, env: dict[str, str], logs: Path, fleet: SecureFleet | None = None) -> None:
        self.env = env
        self.logs = logs
        self.fleet = fleet
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, *command: str) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}.log").open("ab") as log:
            log.write(f"$ {shlex.join(command)}\n".encode())  # which executable ran
            log.flush()
            process = subprocess.Popen(
                command, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.logs
            )
        self.started.append(process)
        return process

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    @staticmethod
    def kill(process: subprocess.Popen[bytes]) -> None:
        """SIGKILLs ``process`` and everything it started (their process groups) and reaps the process."""
        _signal_groups(_groups([process.pid]), signal.SIGKILL)
        process.wait()

    def stop(self) -> None:
        """Ends every process started and all their descendants, killed ones included (a group outlives its
        leader): SIGTERM, then SIGKILL after 10 s."""
        groups = _groups([process.pid for process in self.started])
        _signal_groups(groups, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for process in self.started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.1, deadline - time.monotonic()))
        _signal_groups(groups, signal.SIGKILL)
        for process in self.started:
            process.wait()


def _groups(pids: list[int]) -> set[int]:
    """The process groups of ``pids`` (each leads its own) and of all their live descendants, never this one's."""
    children: dict[int, list[int]] = {}
    proc = Path("/proc")
    for entry in proc.iterdir() if proc.is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            # The fields after the command's closing parenthesis: state, ppid, pgrp, ...
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    groups, tree = set(pids), list(pids)
    for pid in tree:
        tree += children.get(pid, [])
        with contextlib.suppress(ProcessLookupError):
            groups.add(os.getpgid(pid))
    groups.discard(os.getpgrp())
    return groups


def _signal_groups(groups: set[int], signum: int) -> None:
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signum)


def start_superlink(
    processes: Processes, port: int, database: Path, simulation: bool = False, timeout: float = 60
) -> subprocess.Popen[bytes]:
    """Starts ``flower-superlink`` on ``port`` (its APIs and health endpoint) and waits until its health endpoint
    answers; with the processes' :class:`SecureFleet`, with TLS and SuperNode authentication."""
    fleet = processes.fleet
    command = [flower_executable("flower-superlink"), "--disable-runtime-dependency-installation"]
    if fleet is None:
        command.append("--insecure")
    else:
        keys = fleet.keys
        command += ["--ssl-ca-certfile", str(keys.ca), "--ssl-certfile", str(keys.superlink_certificate)]
        command += ["--ssl-keyfile", str(keys.superlink_key), "--enable-supernode-auth"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--database", str(database)]
    superlink = processes.start("superlink", *command, *(["--simulation"] if simulation else []))
    scheme = "http" if fleet is None else "https"
    context = None if fleet is None else ssl.create_default_context(cafile=str(fleet.keys.ca))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert superlink.poll() is None, processes.log("superlink")[-4000:]
        try:
            with urllib.request.urlopen(f"{scheme}://127.0.0.1:{port}/health", timeout=1, context=context) as response:
                if response.status == 200:
                    return superlink
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"the SuperLink did not come up within {timeout:.0f} s")


def start_supernode(
    processes: Processes,
    superlink_port: int,
    site: int,
    state_dir: Path,
    client_ids: str | None = None,
    *,
    key: Path | None = None,
    root_certificates: Path | None = None,
    register: bool = True,
    in_roster: bool = True,
    node_config: str = "",
) -> subprocess.Popen[bytes]:
    """Starts the SuperNode of site ``site``: it serves client ``site`` (or the comma-separated ``client_ids``) and
    keeps its state in ``state_dir``.

    With the processes' :class:`SecureFleet` it trusts the test's CA, authenticates with the site's key (registered
    with the SuperLink first, once) and signs its replies with it; the roster names that key for its clients. The
    keyword arguments make a node that breaks those rules: another private ``key`` (an impostor), another CA's
    ``root_certificates``, a key never ``register`` ed, or a site left out of the roster (``in_roster=False``).
    ``node_config`` adds to the node config.
    """
    clients = f"client-id={site}" if client_ids is None else f"client-ids='{client_ids}'"
    node_config = f"{clients} state-dir='{state_dir}' {node_config}".strip()
    command = [flower_executable("flower-supernode"), "--superlink", f"127.0.0.1:{superlink_port}"]
    fleet = processes.fleet
    if fleet is None:
        command.append("--insecure")
    else:
        served = [site] if client_ids is None else [int(value) for value in client_ids.split(",")]
        own_key = fleet.site_key(site, served if in_roster else [])
        key = key or own_key
        if register and site not in fleet.registered:
            _register(processes, key.with_suffix(".pub"))
            fleet.registered.add(site)
        command += ["--root-certificates", str(root_certificates or fleet.keys.ca)]
        command += ["--auth-supernode-private-key", str(key)]
        node_config += f" site-key='{key}'"
    return processes.start(f"supernode-{site}", *command, "--port", str(free_port()), "--node-config", node_config)


def _register(processes: Processes, public_key: Path) -> None:
    """Registers a site's public key with the SuperLink of the Flower home's default connection."""
    done = subprocess.run(
        [flower_executable("flwr"), "supernode", "register", str(public_key)],
        env=processes.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def write_connection(
    home: Path,
    name: str,
    port: int,
    simulation: bool = False,
    num_supernodes: int = 3,
    fleet: SecureFleet | None = None,
) -> None:
    """Writes the Flower home's ``config.toml`` naming the SuperLink connection ``name`` (simulation: with
    ``num_supernodes`` virtual SuperNodes; a secure ``fleet``: over TLS, trusting its CA)."""
    home.mkdir(parents=True, exist_ok=True)
    text = f'[superlink]\ndefault = "{name}"\n\n[superlink.{name}]\naddress = "127.0.0.1:{port}"\n'
    if fleet is None:
        text += "insecure = true\n"
    else:
        text += f'root-certificates = "{fleet.keys.ca.resolve()}"\n'
    if simulation:
        text += f"\n[superlink.{name}.options]\nnum-supernodes = {num_supernodes}\n"
        text += f"\n[superlink.{name}.options.backend.client-resources]\nnum-cpus = 1\nnum-gpus = 0.0\n"
    (home / "config.toml").write_text(text)


def run_local_deployment(
    tmp_path: Path,
    config: Path,
    start_supernodes: Callable[[Processes, int], object],
    timeout: float = 800,
    secure: bool = True,
) -> float:
    """Deploys ``config`` on loopback as the docs do: a SuperLink, the SuperNodes ``start_supernodes(processes,
    superlink_port)`` starts, and ``flwr run`` of its app to the end (the server's run directory under ``tmp_path /
    "server"``); every process is stopped after. ``secure``: TLS, authenticated SuperNodes and the roster of the
    sites started (:class:`SecureFleet`); else ``--insecure`` and an app without a roster. Returns the run's
    seconds."""
    from lightning_fed.deploy.app import write_app  # the `flower` extra's

    home, port = tmp_path / "flwr-home", free_port()
    fleet = SecureFleet(tmp_path / "keys") if secure else None
    write_connection(home, "local-deployment", port, fleet=fleet)
    processes = Processes(flower_env(home), tmp_path, fleet)
    try:
        start_superlink(processes, port, tmp_path / "superlink.db")
        start_supernodes(processes, port)
        roster = None if fleet is None else fleet.write_roster()
        app = write_app([config], tmp_path / "app", round_timeout=300, roster=roster)
        return flwr_run(processes.env, app, "local-deployment", f"workdir='{tmp_path / 'server'}'", timeout=timeout)
    finally:
        processes.stop()


def flwr_run_command(app: Path, connection: str, run_config: str) -> list[str]:
    """``flwr run`` of ``app`` that streams the ServerApp's log and returns when the run ends."""
    return [flower_executable("flwr"), "run", str(app), connection, "--run-config", run_config, "--stream"]


def flwr_run(env: dict[str, str], app: Path, connection: str, run_config: str, timeout: float) -> float:
    """Runs the app to its end; returns the seconds it took.

    Its output (the ServerApp's log) is kept in ``flwr-run.log`` beside the app.
    """
    start = time.monotonic()
    done = subprocess.run(
        flwr_run_command(app, connection, run_config),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout,
        start_new_session=True,
    )
    output = done.stdout.decode(errors="replace")
    (app.parent / "flwr-run.log").write_text(f"$ {shlex.join(done.args)}\n{output}")
    assert done.returncode == 0, output[-4000:]
    return time.monotonic() - start


def run_dir(workdir: Path) -> Path:
    """The one run directory a deployed server wrote under ``workdir``."""
    (directory,) = (workdir / "runs").iterdir()
    return directory


def deployed(workdir: Path) -> tuple[dict[str, torch.Tensor], dict[str, object]]:
    """The deployed server's last checkpointed model and its summary.json."""
    directory = run_dir(workdir)
    checkpoint = torch.load(directory / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    return checkpoint["state_dict"], json.loads((directory / "summary.json").read_text())


def assert_close_states(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """``got`` equals ``expected`` up to the tolerance of float reductions in another order."""
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=name)


def wait_for(condition: Callable[[], object], timeout: float, what: str, poll: float = 0.2) -> None:
    """Polls ``condition()`` until it is true; fails naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)
