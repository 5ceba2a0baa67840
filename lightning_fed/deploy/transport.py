"""How a deployment's server reaches its client sites: one task out and one reply back per sampled client.

:class:`Transport` is what the server loop needs; :class:`LoopbackTransport` runs the sites in the server's process
(tests, and the reference a real deployment must equal). Flower's ``Grid`` is the transport of a real deployment.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from lightning_fed.deploy.site import ClientSite
from lightning_fed.deploy.wire import RoundTask, SiteReply, decode, encode


class Transport(Protocol):
    """Delivers a round's tasks to the sites of their clients and collects the replies."""

    def exchange(self, tasks: list[RoundTask]) -> dict[int, SiteReply]:
        """Sends every task and returns the replies that arrived in time, by client id (a missing client dropped
        out of the round)."""
        ...


class LoopbackTransport:
    """Runs each client's site in this process, through the wire encoding (so whatever a task or a reply holds is
    known to travel).

    Args:
        sites: The site of each client id; a client without a site is dropped from every round it is sampled in.
    """

    def __init__(self, sites: Mapping[int, ClientSite]) -> None:
        self.sites = dict(sites)
        self.bytes_sent = 0
        self.bytes_received = 0

    def exchange(self, tasks: list[RoundTask]) -> dict[int, SiteReply]:
        replies: dict[int, SiteReply] = {}
        for task in tasks:
            site = self.sites.get(task.client_id)
            if site is None:
                continue
            data = encode(task)
            answer = site.handle_bytes(data)
            self.bytes_sent += len(data)
            self.bytes_received += len(answer)
            replies[task.client_id] = decode(answer, SiteReply)
        return replies


__all__ = ["LoopbackTransport", "Transport"]
