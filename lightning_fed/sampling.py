"""Seeded, checkpointable client samplers."""

from __future__ import annotations

import math
from typing import Any

import torch

from lightning_fed.seeding import derive_seed


class UniformClientSampler:
    """Samples ``clients_per_round`` distinct clients uniformly at random each round.

    The draw for round r depends only on ``(seed, r)``: no generator state advances from round to round, so the
    sample is the same after a resume, on any rank, and whatever happened in earlier rounds.

    Args:
        clients_per_round: A count (int ≥ 1) or a fraction of the registered clients (float in (0, 1]); a fraction
            rounds up, so at least one client trains.
        seed: Run seed.
    """

    def __init__(self, clients_per_round: int | float, seed: int = 0) -> None:
        if isinstance(clients_per_round, bool) or not isinstance(clients_per_round, (int, float)):
            raise TypeError(f"`clients_per_round` must be an int or a float, got {clients_per_round!r}.")
        if isinstance(clients_per_round, float) and not 0.0 < clients_per_round <= 1.0:
            raise ValueError(f"`clients_per_round` as a fraction must be in (0, 1], got {clients_per_round}.")
        if isinstance(clients_per_round, int) and clients_per_round < 1:
            raise ValueError(f"`clients_per_round` must be >= 1, got {clients_per_round}.")
        self.clients_per_round = clients_per_round
        self.seed = seed

    def num_sampled(self, num_clients: int) -> int:
        """How many clients train per round with ``num_clients`` registered.

        Raises:
            ValueError: If more clients per round are asked for than are registered.
        """
        if isinstance(self.clients_per_round, float):
            return max(1, math.ceil(self.clients_per_round * num_clients))
        if self.clients_per_round > num_clients:
            raise ValueError(
                f"`clients_per_round={self.clients_per_round}` exceeds the {num_clients} registered clients: lower"
                f" `clients_per_round` or raise the partitioner's `num_partitions`."
            )
        return self.clients_per_round

    def sample(self, round_idx: int, num_clients: int) -> list[int]:
        """The sorted ids of the clients that train in round ``round_idx``."""
        count = self.num_sampled(num_clients)
        if count == num_clients:
            return list(range(num_clients))
        generator = torch.Generator().manual_seed(derive_seed(self.seed, "sample", round_idx))
        return sorted(torch.randperm(num_clients, generator=generator)[:count].tolist())

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "clients_per_round": self.clients_per_round}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.seed = int(state_dict["seed"])
