"""The streaming aggregator contract."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from lightning_fed.client import ClientUpdate, RoundContext, StateDict


class Aggregator(ABC):
    """Combines client updates into the next global model, one update at a time.

    The loop calls ``reset`` at the start of a round, ``update`` once per accepted client right after it trains
    (so memory stays O(model) whatever the number of clients), and ``compute`` once at the end of the round. The
    name is "aggregator", not "strategy", because ``Trainer(strategy=...)`` already means DDP/FSDP.

    Subclasses keep any cross-round server state (momentum, control variates) in ``state_dict`` so that a resumed
    run is bit-identical.
    """

    @abstractmethod
    def reset(self, global_params: StateDict, round_ctx: RoundContext) -> None:
        """Starts a round. ``round_ctx.num_samples`` gives every sampled client's training-set size."""

    @abstractmethod
    def update(self, update: ClientUpdate) -> None:
        """Folds one accepted client update into the running aggregate."""

    @abstractmethod
    def compute(self, global_params: StateDict) -> StateDict:
        """Returns the new global model. With no accepted update it must return ``global_params`` unchanged."""

    def should_aggregate(self, name: str) -> bool:
        """Whether entry ``name`` is aggregated; entries left out keep their global value (FedBN-style)."""
        return True

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores what ``state_dict`` returned."""
