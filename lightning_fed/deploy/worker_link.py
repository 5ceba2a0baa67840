"""The link between a message's short-lived process and a site's warm worker: one task forwarded, one answer back.

Flower starts a fresh ``flwr-clientapp`` process for every message and that process handles exactly one; importing
torch and Lightning and building the module, the data and a trainer there costs seconds per message. A site keeps
one long-lived worker instead (:mod:`lightning_fed.deploy.worker`), which has paid that once; the message's process
only forwards the task's bytes to it over a Unix socket and hands the answer back to Flower. This module imports
neither torch nor Lightning, so forwarding costs milliseconds.

The worker is started on the first task (or again after it was killed, or after it exited when idle), detached from
the message's process; it holds no state its site's state directory does not also hold, so a task that was under way
when the worker died is simply sent again to a new one, with the same result.

Frames on the socket: the task's bytes, length-prefixed; back a JSON header (``ok``, ``error``, ``secagg_seed``,
``arrays``), the encoded reply and, under secure aggregation, the reply's sums as ``.npy`` arrays, each
length-prefixed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy

_LENGTH = 8  # bytes of a frame's length prefix (big-endian)


def send_frame(connection: socket.socket, data: bytes) -> None:
    """Sends ``data`` with its length in front."""
    connection.sendall(len(data).to_bytes(_LENGTH, "big") + data)


def receive_frame(connection: socket.socket, limit: int | None = None) -> bytes:
    """Receives one frame :func:`send_frame` sent.

    Raises:
        ConnectionError: If the peer closed the connection before the frame was whole.
        ValueError: If the frame is longer than ``limit`` bytes.
    """
    length = int.from_bytes(_receive(connection, _LENGTH), "big")
    if limit is not None and length > limit:
        raise ValueError(f"A frame of {length} bytes arrived; at most {limit} are accepted.")
    return _receive(connection, length)


def _receive(connection: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = connection.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def arrays_to_bytes(arrays: list[numpy.ndarray]) -> list[bytes]:
    """Each array as ``.npy`` bytes (no pickles)."""
    out = []
    for array in arrays:
        buffer = io.BytesIO()
        numpy.save(buffer, array, allow_pickle=False)
        out.append(buffer.getvalue())
    return out


@dataclass
class WorkerAnswer:
    """What a site's worker answered to one task.

    Attributes:
        reply: The encoded :class:`~lightning_fed.messages.ClientReply` (its secure sums, if any, in :attr:`arrays`).
        arrays: Under secure aggregation, the reply's sums (float64), for Flower's SecAgg+ client mod to mask.
        secagg_seed: Under secure aggregation, the seed of numpy's global generator for the mod's stochastic
            rounding (derived from the run seed, round and client, so that a run repeats to the bit).
    """

    reply: bytes
    arrays: list[numpy.ndarray] = field(default_factory=list)
    secagg_seed: int | None = None


class WorkerError(RuntimeError):
    """The site's worker could not answer the task (its one-line reason is the message)."""


class WorkerLink:
    """Forwards tasks to the warm worker of one site (a SuperNode and its clients), starting it when needed.

    Args:
        state_dir: The site's state directory (its clients' versions, the worker's log and pid file).
        app_config: The app's ``config.yaml``.
        data_config: The site's ``data-config``, if any.
        client_ids: The clients the site serves.
        start_timeout: Seconds a starting worker may take to listen.
    """

    def __init__(
        self,
        state_dir: str | Path,
        app_config: str | Path,
        data_config: str | Path | None,
        client_ids: list[int],
        start_timeout: float = 300.0,
    ) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.app_config = Path(app_config).resolve()
        self.data_config = None if data_config is None else Path(data_config).resolve()
        self.client_ids = list(client_ids)
        self.start_timeout = start_timeout
        key = worker_key(self.state_dir, self.app_config, self.data_config, self.client_ids)
        # Unix socket paths are short (108 bytes): the socket lives in the temporary directory, named by the key.
        self.socket_path = Path(tempfile.gettempdir()) / f"lightning_fed-{key}.sock"
        self.pid_file = self.state_dir / f"worker-{key}.pid"
        self.log_file = self.state_dir / f"worker-{key}.log"

    def answer(self, task: bytes) -> WorkerAnswer:
        """The worker's answer to ``task``; a worker that is not running is started, and a task whose worker died
        while answering it is sent once more, to a new one.

        Raises:
            WorkerError: If the worker refused or failed the task, or could not be started.
        """
        for attempt in range(2):
            try:
                return self._exchange(task)
            except (TimeoutError, ConnectionError, FileNotFoundError):
                if attempt:
                    raise
                self._start()
        raise AssertionError("unreachable")

    def _exchange(self, task: bytes) -> WorkerAnswer:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(str(self.socket_path))
            send_frame(connection, task)
            header: dict[str, Any] = json.loads(receive_frame(connection))
            if not header["ok"]:
                raise WorkerError(header["error"])
            reply = receive_frame(connection)
            arrays = [
                numpy.load(io.BytesIO(receive_frame(connection)), allow_pickle=False) for _ in range(header["arrays"])
            ]
        return WorkerAnswer(reply, arrays, header.get("secagg_seed"))

    def _start(self) -> None:
        """Starts the worker unless another process just did, and waits until it listens."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.state_dir / "worker.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self._listening():
                return
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
            command = [
                sys.executable,
                "-m",
                "lightning_fed.deploy.worker",
                "--app-config",
                str(self.app_config),
                "--state-dir",
                str(self.state_dir),
                "--socket",
                str(self.socket_path),
                "--pid-file",
                str(self.pid_file),
                "--client-ids",
                ",".join(map(str, self.client_ids)),
                # The message's process is the SuperNode's child: the worker lives as long as the SuperNode.
                "--parent-pid",
                str(os.getppid()),
            ]
            if self.data_config is not None:
                command += ["--data-config", str(self.data_config)]
            with open(self.log_file, "ab") as log:
                process = subprocess.Popen(
                    command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
                )
            deadline = time.monotonic() + self.start_timeout
            while not self._listening():
                if process.poll() is not None:
                    raise WorkerError(
                        f"The site's worker exited with code {process.returncode} before listening; its log:"
                        f" {self.log_file}: {_tail(self.log_file)}"
                    )
                if time.monotonic() > deadline:
                    raise WorkerError(f"The site's worker did not listen within {self.start_timeout:g} s.")
                time.sleep(0.05)

    def _listening(self) -> bool:
        if not self.socket_path.exists():
            return False
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(self.socket_path))
            except OSError:
                return False
            send_frame(probe, b"")  # an empty task: the worker answers nothing and goes on
        return True


def worker_key(state_dir: Path, app_config: Path, data_config: Path | None, client_ids: list[int]) -> str:
    """Names a site's worker by everything it was built from: a new app, data config or client list is a new
    worker (the old one exits when idle)."""
    digest = hashlib.sha256()
    digest.update(str(state_dir).encode())
    digest.update(app_config.read_bytes())
    if data_config is not None:
        digest.update(data_config.read_bytes())
    digest.update(",".join(map(str, client_ids)).encode())
    digest.update(sys.executable.encode())
    return digest.hexdigest()[:16]


def _tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


__all__ = [
    "WorkerAnswer",
    "WorkerError",
    "WorkerLink",
    "arrays_to_bytes",
    "receive_frame",
    "send_frame",
    "worker_key",
]
