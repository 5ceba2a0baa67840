"""Faults of a deployment's network, in one process: a loopback transport that loses a client's reply."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from lightning_fed.deploy import ClientSite, LoopbackTransport, RoundReplies
from lightning_fed.deploy.site_store import SiteStateStore
from lightning_fed.messages import ClientTask


class DroppingTransport(LoopbackTransport):
    """The loopback, losing ``client_id``'s training reply in round ``round_idx``: its site trains the client and
    writes the round's state version, as a site killed between its write and its reply does, but the server never
    sees the reply (a missed ``round-timeout``, or a reply the server refused).

    Args:
        sites: The site of each client id.
        client_id: The client whose reply is lost (or several clients).
        round_idx: The round in which it is lost.
    """

    def __init__(self, sites: Mapping[int, ClientSite], client_id: int | Iterable[int], round_idx: int) -> None:
        super().__init__(sites)
        self.client_ids = {client_id} if isinstance(client_id, int) else set(client_id)
        self.client_id = min(self.client_ids)
        self.round_idx = round_idx
        #: Every task sent, in order.
        self.tasks: list[ClientTask] = []
        #: The dropped client's state versions at its site right after the round its reply was lost in.
        self.versions_after_drop: list[int] = []

    def exchange(self, tasks: list[ClientTask]) -> RoundReplies:
        self.tasks += tasks
        received = super().exchange(tasks)
        if any(not task.evaluate and task.round_idx == self.round_idx for task in tasks):
            for client_id in self.client_ids:
                received.replies.pop(client_id, None)
            site = self.sites.get(self.client_id)
            if site is not None:
                self.versions_after_drop = SiteStateStore(site.state_dir, self.client_id).versions()
        return received
