"""A site that holds its task in one round until it is killed: the ClientApp of the killed-SuperNode crash test
(real Flower processes).

The SuperNode whose node config says ``hold-round=R`` receives round ``R``'s task, marks that it holds it (the file
``held-<client>-round<R>`` in its state directory) and waits without training, so that the test's SIGKILL lands
while the client's round is in progress, before the site has written anything of that round. Without ``hold-round``
(the other sites, and the killed site once restarted) every message is answered by lightning_fed's own ClientApp.
The kill must come from the test: a site left holding for :data:`HOLD_SECONDS` fails the round instead of answering.
"""

from __future__ import annotations

import time
from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from helpers.flower_configs import use_client_app
from lightning_fed.deploy.flower import apps
from lightning_fed.deploy.flower.settings import CLIENT_ID_KEY, RECORD, state_dir_of

#: How long a held task waits for the test's kill before the site gives up on it (raises: no reply, no state).
HOLD_SECONDS = 300.0

client_app = ClientApp()


def held_marker(state_dir: Path, client: int, round_idx: int) -> Path:
    """The file a held site writes once it holds ``client``'s task of ``round_idx``."""
    return state_dir / f"held-{client}-round{round_idx}"


@client_app.query()
def query(message: Message, context: Context) -> Message:
    return apps.client_query(message, context)


@client_app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    return apps.client_evaluate(message, context)


@client_app.train()
def train(message: Message, context: Context) -> Message:
    round_idx = int(message.metadata.group_id)
    if round_idx == int(context.node_config.get("hold-round", -1)):
        client = int(dict(message.content[RECORD])[CLIENT_ID_KEY])
        marker = held_marker(state_dir_of(context.node_config, context.run_config), client, round_idx)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        time.sleep(HOLD_SECONDS)
        raise RuntimeError(f"site held client {client}'s round {round_idx} for {HOLD_SECONDS:.0f} s and was not killed")
    return apps.client_train(message, context)


def write_held_app(app: Path) -> None:
    """Points the app's ClientApp component at this module (the ServerApp stays lightning_fed's)."""
    use_client_app(app, "helpers.held_site:client_app")


__all__ = ["HOLD_SECONDS", "client_app", "held_marker", "write_held_app"]
