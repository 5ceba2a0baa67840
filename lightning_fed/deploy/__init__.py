"""Running a federated fit across real sites: the server keeps lightning_fed's loop, each site runs the client half.

* :mod:`~lightning_fed.deploy.wire`: the encoding of the seam's messages (:mod:`lightning_fed.messages`: a round's
  task down, the site's reply up).
* :mod:`~lightning_fed.deploy.site`: a client site (builds the module from the configuration, trains the client).
* :mod:`~lightning_fed.deploy.site_store`: the clients' state at their site, versioned per round.
* :mod:`~lightning_fed.deploy.remote`: the server's client side over a transport.
* :mod:`~lightning_fed.deploy.transport`: the transport contract and the in-process loopback.
* :mod:`~lightning_fed.deploy.secure_sum`: what travels masked under secure aggregation (the declared sums).
* :mod:`~lightning_fed.deploy.server`: the server's fit.
* :mod:`~lightning_fed.deploy.roster`: which node's key may serve which client, and the signatures that prove it.
* :mod:`~lightning_fed.deploy.reply_check`: what a site's reply may hold before the server folds it.
* :mod:`~lightning_fed.deploy.keys`: ``lightning-fed deploy-keys``, a test CA, the SuperLink's certificate and the
  sites' key pairs.
"""

from typing import TYPE_CHECKING

from lightning_fed.utilities.lazy import lazy_exports

if TYPE_CHECKING:
    from lightning_fed.deploy.remote import RemoteClients, remote_clients
    from lightning_fed.deploy.roster import Roster
    from lightning_fed.deploy.server import check_server, serve
    from lightning_fed.deploy.site import ClientSite, SiteTrainer
    from lightning_fed.deploy.site_store import SiteStateStore
    from lightning_fed.deploy.transport import LoopbackTransport, RoundReplies, Transport
    from lightning_fed.deploy.wire import WIRE_VERSION, decode, encode

# Imported on first use: a Flower ClientApp process that only answers SecAgg+'s key exchanges needs none of it.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        **dict.fromkeys(("RemoteClients", "remote_clients"), "lightning_fed.deploy.remote"),
        "Roster": "lightning_fed.deploy.roster",
        **dict.fromkeys(("check_server", "serve"), "lightning_fed.deploy.server"),
        **dict.fromkeys(("ClientSite", "SiteTrainer"), "lightning_fed.deploy.site"),
        "SiteStateStore": "lightning_fed.deploy.site_store",
        **dict.fromkeys(("LoopbackTransport", "RoundReplies", "Transport"), "lightning_fed.deploy.transport"),
        **dict.fromkeys(("WIRE_VERSION", "decode", "encode"), "lightning_fed.deploy.wire"),
    },
)

__all__ = [
    "WIRE_VERSION",
    "ClientSite",
    "LoopbackTransport",
    "RemoteClients",
    "Roster",
    "RoundReplies",
    "SiteStateStore",
    "SiteTrainer",
    "Transport",
    "check_server",
    "decode",
    "encode",
    "remote_clients",
    "serve",
]
