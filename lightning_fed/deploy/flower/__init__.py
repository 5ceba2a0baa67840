"""Flower as the deployment's network: the ServerApp runs lightning_fed's server loop, the ClientApp its client half.

lightning_fed's rules stay lightning_fed's: the ServerApp (:data:`server_app`) runs the ordinary
``FederatedTrainer.fit`` through :func:`~lightning_fed.deploy.server.serve`, and Flower only carries each round's
:class:`~lightning_fed.deploy.wire.ClientTask` to the SuperNode of its client and the
:class:`~lightning_fed.deploy.wire.ClientReply` back (:class:`GridTransport`, over ``Grid.send_and_receive``). The
ClientApp (:data:`client_app`) forwards each task to its site's warm worker (:mod:`lightning_fed.deploy.worker`), a
long-lived process that answers it with :class:`~lightning_fed.deploy.site.ClientSite`: Flower starts a process per
message, and the worker pays Python's, torch's and Lightning's start-up once per site instead.

Both apps read the deployment from the Flower app directory that ``lightning-fed flower-app`` writes: its resolved
``config.yaml`` and the run config in its ``pyproject.toml`` (``round-timeout``, ``resume``, ``workdir``,
``state-dir``, ``roster``). A SuperNode says which client it serves, where it keeps that client's state and which key
signs for it in its node config::

    flower-supernode --root-certificates keys/ca.pem --auth-supernode-private-key keys/site-0.key \
        --superlink 127.0.0.1:8000 --node-config "client-id=0 state-dir='site-0-state' site-key='keys/site-0.key'"

With the run config's ``roster`` (:mod:`lightning_fed.deploy.roster`), the server accepts a node's claim to a client,
and its replies, only when signed with that client's roster key.

(``client-ids='0,1,2'`` for a node that serves several clients; optionally ``data-config='site-data.yaml'``: a
YAML whose ``data`` section replaces the app's at that site). In
Flower's simulation engine, where nodes have no such config, a node serves the client of its ``partition-id`` and
keeps state under the run config's ``state-dir``.

With the run config's ``secagg``, the round's sums travel under Flower's SecAgg+ (:class:`SecureGridTransport`).

* :mod:`~lightning_fed.deploy.flower.settings`: the app directory, run config and node config, and message keys.
* :mod:`~lightning_fed.deploy.flower.grid_transport`: one message per task over Flower's ``Grid``.
* :mod:`~lightning_fed.deploy.flower.secure_transport`: the same under SecAgg+.
* :mod:`~lightning_fed.deploy.flower.apps`: the ServerApp and the ClientApp.
* :mod:`~lightning_fed.deploy.flower.local_grid`: a ``Grid`` whose nodes run in this process.

This is the only package of lightning_fed that imports ``flwr`` (``pip install 'lightning-fed[flower]'``); nothing
imports it but Flower, which loads ``lightning_fed.deploy.flower:server_app`` and ``...:client_app``. The
Lightning stack is imported inside the handlers, so that the apps load quickly.
"""

from typing import TYPE_CHECKING

from lightning_fed.deploy.flower.apps import client_app, server_app, transport_of
from lightning_fed.deploy.flower.settings import client_ids_of, find_app_dir, round_timeout, state_dir_of
from lightning_fed.utilities.lazy import lazy_exports

if TYPE_CHECKING:
    from lightning_fed.deploy.flower.grid_transport import GridTransport
    from lightning_fed.deploy.flower.local_grid import InProcessGrid, server_context
    from lightning_fed.deploy.flower.secure_transport import SecureGridTransport

# The transports import torch and lightning_fed's wire format: a ClientApp answering a key exchange needs neither.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "GridTransport": "lightning_fed.deploy.flower.grid_transport",
        **dict.fromkeys(("InProcessGrid", "server_context"), "lightning_fed.deploy.flower.local_grid"),
        "SecureGridTransport": "lightning_fed.deploy.flower.secure_transport",
    },
)

__all__ = [
    "GridTransport",
    "InProcessGrid",
    "SecureGridTransport",
    "client_app",
    "client_ids_of",
    "find_app_dir",
    "round_timeout",
    "server_app",
    "server_context",
    "state_dir_of",
    "transport_of",
]
