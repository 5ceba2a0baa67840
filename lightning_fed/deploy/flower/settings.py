"""What a lightning_fed Flower app reads from its directory, its run config and a SuperNode's node config, and the
keys of lightning_fed's records in Flower's messages."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flwr.app import Message

if TYPE_CHECKING:
    from flwr.app import UserConfigValue

    from lightning_fed.deploy.roster import Roster

#: The record of a message that holds lightning_fed's payload, and its keys.
RECORD = "lightning_fed"
TASK_KEY = "task"
REPLY_KEY = "reply"
#: Where SecAgg+'s legacy messages keep the task (the instructions' config) and the clear reply (the result's metrics).
LEGACY_TASK = "fitins.config"
CLIENT_ID_KEY = "client-id"
CLIENT_IDS_KEY = "client-ids"
#: A task's fresh nonce (echoed back with the reply) and the site's signature of its reply
#: (:func:`~lightning_fed.deploy.roster.reply_statement`).
NONCE_KEY = "nonce"
SIGNATURE_KEY = "signature"
#: A query's fresh challenge, and the node's signature for each client it names
#: (:func:`~lightning_fed.deploy.roster.serves_statement`).
CHALLENGE_KEY = "challenge"
PROOFS_KEY = "proofs"
#: The node config's path of the node's private key (the file given to ``--auth-supernode-private-key``).
SITE_KEY = "site-key"
#: The run config's path of the roster (relative paths lead into the app directory); empty: an insecure trial.
ROSTER_KEY = "roster"

#: The file of the app directory that holds the deployment's resolved configuration.
APP_CONFIG = "config.yaml"
#: The value of ``[tool.flwr.app.components]`` that marks a directory as a lightning_fed Flower app.
SERVER_APP_REF = "lightning_fed.deploy.flower:server_app"
CLIENT_APP_REF = "lightning_fed.deploy.flower:client_app"


def say(text: str) -> None:
    """One line on stderr, where the SuperLink's and SuperNodes' logs show it."""
    print(f"[lightning_fed] {text}", file=sys.stderr, flush=True)


def payload(message: Message, key: str) -> bytes:
    """The bytes lightning_fed's record of ``message`` holds under ``key``."""
    value = message.content[RECORD][key]
    if not isinstance(value, bytes):
        raise ValueError(f"`{RECORD}.{key}` holds {type(value).__name__}, not bytes")
    return value


def find_app_dir() -> Path:
    """The lightning_fed Flower app directory Flower loaded this app from (it puts it on ``sys.path``).

    Raises:
        FileNotFoundError: If no directory on ``sys.path`` holds an app written by ``lightning-fed flower-app``.
    """
    for entry in sys.path:
        directory = Path(entry or ".")
        pyproject = directory / "pyproject.toml"
        if (directory / APP_CONFIG).is_file() and pyproject.is_file() and SERVER_APP_REF in pyproject.read_text():
            return directory.resolve()
    raise FileNotFoundError(
        "No lightning_fed Flower app directory (pyproject.toml naming lightning_fed.deploy.flower, beside a"
        " config.yaml) is on sys.path: run an app written by `lightning-fed flower-app`."
    )


def setting(config: dict[str, UserConfigValue], key: str, default: Any) -> Any:
    value = config.get(key, default)
    return default if value == "" else value


def round_timeout(run_config: dict[str, UserConfigValue]) -> float | None:
    """The run config's ``round-timeout`` in seconds; ``0`` (or less) waits for every reply."""
    value = float(setting(run_config, "round-timeout", 0))
    return value if value > 0 else None


def roster_of(run_config: dict[str, UserConfigValue]) -> Roster | None:
    """The run's roster (:class:`~lightning_fed.deploy.roster.Roster`), from the run config's ``roster`` (a path in
    the app directory, or absolute); ``None`` when it names none (an insecure local trial).

    Raises:
        ValueError: In one line, if the file cannot be read as a roster.
    """
    from lightning_fed.deploy.roster import Roster

    value = str(setting(run_config, ROSTER_KEY, ""))
    if not value:
        return None
    path = Path(value).expanduser()
    return Roster.load(path if path.is_absolute() else find_app_dir() / path)


def client_ids_of(node_config: dict[str, UserConfigValue]) -> list[int]:
    """The clients a SuperNode serves: its node config's ``client-ids`` (comma-separated) or ``client-id``, else
    (simulation) its ``partition-id``.

    Raises:
        ValueError: If the node config has none of them.
    """
    if CLIENT_IDS_KEY in node_config:
        return [int(value) for value in str(node_config[CLIENT_IDS_KEY]).split(",") if value.strip()]
    for key in (CLIENT_ID_KEY, "partition-id"):
        if key in node_config:
            return [int(node_config[key])]
    raise ValueError(
        "This SuperNode serves no client: start it with `--node-config \"client-id=<id> state-dir='<dir>'\"` (or"
        " `client-ids='0,1,2'` for several)."
    )


def state_dir_of(node_config: dict[str, UserConfigValue], run_config: dict[str, UserConfigValue]) -> Path:
    """Where a site keeps its client's state: the node config's ``state-dir``, else the run config's.

    Raises:
        ValueError: If neither sets it.
    """
    value = setting(node_config, "state-dir", "") or setting(run_config, "state-dir", "")
    if not value:
        raise ValueError(
            "This SuperNode has no state directory for its client: add `state-dir='<dir>'` to its --node-config."
        )
    return Path(str(value))


__all__ = [
    "APP_CONFIG",
    "CLIENT_APP_REF",
    "CLIENT_ID_KEY",
    "LEGACY_TASK",
    "RECORD",
    "REPLY_KEY",
    "SERVER_APP_REF",
    "TASK_KEY",
    "CLIENT_IDS_KEY",
    "CHALLENGE_KEY",
    "NONCE_KEY",
    "PROOFS_KEY",
    "ROSTER_KEY",
    "SIGNATURE_KEY",
    "SITE_KEY",
    "client_ids_of",
    "find_app_dir",
    "payload",
    "roster_of",
    "round_timeout",
    "say",
    "setting",
    "state_dir_of",
]
