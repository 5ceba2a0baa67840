"""How a deployment's server reaches its client sites: one task out and one reply back per sampled client.

:class:`Transport` is what the server loop needs; :class:`LoopbackTransport` runs the sites in the server's process
(tests, and the reference a real deployment must equal). Flower's ``Grid`` is the transport of a real deployment, with
SecAgg+ when the app asks for secure aggregation (:mod:`lightning_fed.deploy.flower`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from torch import Tensor

from lightning_fed.deploy.wire import decode, encode
from lightning_fed.messages import ClientReply, ClientTask

if TYPE_CHECKING:
    from lightning_fed.deploy.site import ClientSite


@dataclass
class RoundReplies:
    """What came back from a round's sites.

    Attributes:
        replies: The replies that arrived in time, by client id (a missing client dropped out of the round).
        secure_sum: Under secure aggregation, the sum over ``replies`` of their
            :attr:`~lightning_fed.deploy.wire.ClientReply.secure_sums` (the only form in which the server sees them);
            ``None`` otherwise, or when no reply arrived.
    """

    replies: dict[int, ClientReply]
    secure_sum: list[Tensor] | None = None


class Transport(Protocol):
    """Delivers a round's tasks to the sites of their clients and collects the replies.

    Attributes:
        secure_range: With secure aggregation, the fixed-point range :math:`\\pm c` of the masked sums (the tasks
            carry it to the sites); ``None`` without.
    """

    secure_range: float | None

    def exchange(self, tasks: list[ClientTask]) -> RoundReplies:
        """Sends every task and returns the replies that arrived in time."""
        ...


class LoopbackTransport:
    """Runs each client's site in this process, through the wire encoding (so whatever a task or a reply holds is
    known to travel).

    Args:
        sites: The site of each client id; a client without a site is dropped from every round it is sampled in.
        secure_range: Run the sites as under secure aggregation (their sums travel apart and reach the server only as
            a total), summed here in float64 without masking or quantisation: the data path of SecAgg+ without its
            rounding; ``None``: plain replies.
    """

    def __init__(self, sites: Mapping[int, ClientSite], secure_range: float | None = None) -> None:
        self.sites = dict(sites)
        self.secure_range = secure_range
        self.bytes_sent = 0
        self.bytes_received = 0

    def exchange(self, tasks: list[ClientTask]) -> RoundReplies:
        replies: dict[int, ClientReply] = {}
        for task in tasks:
            site = self.sites.get(task.client_id)
            if site is None:
                continue
            data = encode(task)
            answer = site.handle_bytes(data)
            self.bytes_sent += len(data)
            self.bytes_received += len(answer)
            replies[task.client_id] = decode(answer, ClientReply)
        secure_sum: list[Tensor] | None = None
        for reply in replies.values():
            if reply.secure_sums:
                if secure_sum is None:
                    secure_sum = [leaf.clone() for leaf in reply.secure_sums]
                else:
                    for total, leaf in zip(secure_sum, reply.secure_sums, strict=True):
                        total.add_(leaf)
                reply.secure_sums = []  # the server sees the total only
        return RoundReplies(replies, secure_sum)


__all__ = ["LoopbackTransport", "RoundReplies", "Transport"]
