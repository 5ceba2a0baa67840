"""What a callback sees when several clients train side by side (``client_parallelism``): the group, and one step.

Tensors are stacked: dimension 0 runs over clients. A step may involve only some of the group's clients (a client
that has run out of batches, or whose batch has another shape, steps apart), so every per-client tensor a callback
prepared for the whole group goes through :meth:`GroupStep.select` first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lightning_fed.client import ClientContext


@dataclass
class ClientGroup:
    """Clients of one round that train together.

    Attributes:
        contexts: Their contexts, in round order (position ``i`` is row ``i`` of every stacked tensor).
        cache: Per-group data that callbacks compute once (e.g. their stacked per-client tensors), by key.
    """

    contexts: list[ClientContext]
    cache: dict[str, Any] = field(default_factory=dict)

    def stacked(self, key: str, per_client: Callable[[ClientContext], dict[str, Tensor]]) -> dict[str, Tensor]:
        """``per_client(ctx)`` for every client, stacked by name, computed once per group under ``key``."""
        if key not in self.cache:
            values = [per_client(ctx) for ctx in self.contexts]
            self.cache[key] = {name: torch.stack([v[name] for v in values]) for name in values[0]}
        return self.cache[key]


@dataclass
class GroupStep:
    """One optimizer step of some of a group's clients.

    Attributes:
        group: The group.
        members: Positions in ``group.contexts`` of the clients taking this step.
        params: Their trainable parameters by name, stacked ``[len(members), *shape]``; edit them in place in
            ``on_group_after_optimizer_step`` (as the sequential hook edits the module's weights).
        grads: Their gradients, same shapes; add to them in place in ``on_group_before_optimizer_step``.
        log: ``log(position, name, value)`` logs a value for the client at ``position`` in ``members`` order, as
            ``pl_module.log`` does for the client that trains alone.
    """

    group: ClientGroup
    members: list[int]
    params: dict[str, Tensor]
    grads: dict[str, Tensor]
    log: Callable[[int, str, Any], None]
    _index: Tensor | None = None

    @property
    def contexts(self) -> list[ClientContext]:
        """The stepping clients' contexts, in ``members`` order."""
        return [self.group.contexts[i] for i in self.members]

    @property
    def everyone(self) -> bool:
        """Whether every client of the group takes this step."""
        return len(self.members) == len(self.group.contexts)

    def select(self, stacked: Tensor) -> Tensor:
        """The rows of a group-stacked tensor that belong to this step's clients."""
        if self.everyone:
            return stacked
        if self._index is None or self._index.device != stacked.device:
            self._index = torch.tensor(self.members, device=stacked.device)
        return stacked.index_select(0, self._index)


__all__ = ["ClientGroup", "GroupStep"]
