"""A site's warm worker: one long-lived process that answers every task of its site's clients.

Started by :class:`~lightning_fed.deploy.worker_link.WorkerLink` (``python -m lightning_fed.deploy.worker ...``), it
imports torch and Lightning once, builds the site's module, data and trainer on its first task
(:class:`~lightning_fed.deploy.site.ClientSite`, warm thereafter) and answers one task per connection on its Unix
socket, one at a time. It keeps nothing that the site's state directory does not also hold, so it may be killed at
any point: the link starts a new one and sends the task again. It exits after ``--idle-timeout`` seconds without a
task, or once its SuperNode (``--parent-pid``) is gone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import time
from pathlib import Path

from lightning_fed.deploy.config import site_builder
from lightning_fed.deploy.site import ClientSite
from lightning_fed.deploy.wire import decode, encode
from lightning_fed.deploy.worker_link import WorkerAnswer, arrays_to_bytes, receive_frame, send_frame
from lightning_fed.messages import ClientTask
from lightning_fed.utilities.seeding import derive_seed

_POLL_S = 2.0  # how often an idle worker checks whether its SuperNode is still there

#: The largest task a worker reads (a task carries the global model): past it the task is refused, not read.
MAX_TASK_BYTES = 1 << 34


def serve(
    site: ClientSite, listener: socket.socket, client_ids: list[int], idle_timeout: float, parent_pid: int | None = None
) -> None:
    """Answers tasks on ``listener`` until none arrives for ``idle_timeout`` seconds, or process ``parent_pid`` (the
    SuperNode) is gone."""
    listener.settimeout(min(_POLL_S, idle_timeout))
    idle_since = time.monotonic()
    while True:
        try:
            connection, _ = listener.accept()
        except TimeoutError:
            if time.monotonic() - idle_since > idle_timeout or not _alive(parent_pid):
                return
            continue
        idle_since = time.monotonic()
        with connection:
            connection.settimeout(None)
            try:
                task_bytes = receive_frame(connection, limit=MAX_TASK_BYTES)
            except (ConnectionError, ValueError):
                continue
            if not task_bytes:  # a probe: is the worker listening?
                continue
            _answer(site, connection, task_bytes, client_ids)


def _alive(pid: int | None) -> bool:
    if pid is None:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def answer_task(site: ClientSite, task_bytes: bytes, client_ids: list[int]) -> WorkerAnswer:
    """``site``'s answer to an encoded task for one of ``client_ids``: the encoded reply, its secure sums apart.

    Raises:
        ValueError: If the task is unreadable or for a client the site does not serve.
    """
    task = decode(task_bytes, ClientTask)
    if task.client_id not in client_ids:
        raise ValueError(f"This site serves clients {client_ids}; a task for client {task.client_id} arrived.")
    started = time.perf_counter()
    reply = site.handle(task)
    # One line per task in the worker's log: what the site spent on it (benchmarks/deploy_rounds.py reads it).
    what = "evaluated" if task.evaluate else "trained"
    print(
        f"[lightning_fed] worker: round {task.round_idx} client {task.client_id} {what} in"
        f" {time.perf_counter() - started:.3f} s",
        file=sys.stderr,
        flush=True,
    )
    arrays = [leaf.numpy() for leaf in reply.secure_sums]
    reply.secure_sums = []
    seed = None
    if task.secure_range is not None:
        # Flower's secaggplus_mod rounds each value up or down at random with numpy's global generator: the message's
        # process seeds it from (run seed, round, client) just before, so a run repeats to the bit.
        seed = derive_seed(task.seed, "secagg", task.round_idx, task.client_id) % 2**32
    return WorkerAnswer(encode(reply), arrays, seed)


def _answer(site: ClientSite, connection: socket.socket, task_bytes: bytes, client_ids: list[int]) -> None:
    try:
        answer = answer_task(site, task_bytes, client_ids)
    except Exception as error:
        line = f"{type(error).__name__}: {error}".splitlines()[0]
        print(f"[lightning_fed] worker: {line}", file=sys.stderr, flush=True)
        with contextlib.suppress(OSError):
            send_frame(connection, json.dumps({"ok": False, "error": line}).encode())
        return
    header = {"ok": True, "error": "", "arrays": len(answer.arrays), "secagg_seed": answer.secagg_seed}
    with contextlib.suppress(OSError):
        send_frame(connection, json.dumps(header).encode())
        send_frame(connection, answer.reply)
        for data in arrays_to_bytes(answer.arrays):
            send_frame(connection, data)


def main(argv: list[str] | None = None) -> None:
    """``python -m lightning_fed.deploy.worker``: see the module's docstring."""
    parser = argparse.ArgumentParser(prog="python -m lightning_fed.deploy.worker", description=__doc__)
    parser.add_argument("--app-config", required=True, help="the app's config.yaml")
    parser.add_argument("--data-config", default=None, help="the site's data config (replaces the app's `data`)")
    parser.add_argument("--state-dir", required=True, help="the site's state directory")
    parser.add_argument("--socket", required=True, help="the Unix socket to listen on")
    parser.add_argument("--pid-file", required=True, help="where to write this process's id")
    parser.add_argument("--client-ids", required=True, help="the clients this site serves, comma-separated")
    parser.add_argument("--idle-timeout", type=float, default=600.0, help="seconds without a task before exiting")
    parser.add_argument("--parent-pid", type=int, default=None, help="exit once this process (the SuperNode) is gone")
    args = parser.parse_args(argv)
    client_ids = [int(value) for value in args.client_ids.split(",") if value]
    site = ClientSite(site_builder(args.app_config, args.data_config), args.state_dir)
    path = Path(args.socket)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen(16)
        Path(args.pid_file).write_text(f"{os.getpid()}\n")
        try:
            serve(site, listener, client_ids, args.idle_timeout, args.parent_pid)
        finally:
            site.close()
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


if __name__ == "__main__":
    main()


__all__ = ["MAX_TASK_BYTES", "answer_task", "main", "serve"]
