"""Seeded, checkpointable client samplers."""

from __future__ import annotations

import math
from typing import Any

import torch

from lightning_fed.checks import InvalidArgumentError, check_int, check_real
from lightning_fed.utilities.seeding import derive_seed

_CLIENTS_PER_ROUND = "an integer count >= 1 or a fraction in (0, 1] of the registered clients"


class UniformClientSampler:
    """Samples ``clients_per_round`` distinct clients uniformly at random each round.

    The draw for round r depends only on ``(seed, r)``: no generator state advances from round to round, so the
    sample is the same after a resume, on any rank, and whatever happened in earlier rounds.

    Args:
        clients_per_round: A count (int ≥ 1) or a fraction of the registered clients (float in (0, 1]); a fraction
            rounds up, so at least one client trains.
        seed: Run seed.
    """

    # `int | float`, not `float`: jsonargparse would read a count of 10 as the fraction 10.0.
    def __init__(self, clients_per_round: int | float, seed: int = 0) -> None:
        self.clients_per_round = _check_clients_per_round(clients_per_round)
        self.seed = check_int("seed", seed)

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
        """The seed and ``clients_per_round``; only the seed is restored, the count is the current run's setting."""
        return {"seed": self.seed, "clients_per_round": self.clients_per_round}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores the seed, so that a resumed run samples the clients the interrupted one would have."""
        self.seed = int(state_dict["seed"])


def _check_clients_per_round(value: Any) -> int | float:
    """A float is a fraction of the clients and an integer a count, so the type decides which range applies."""
    try:
        if isinstance(value, float):
            return check_real("clients_per_round", value, minimum=0.0, maximum=1.0, exclusive_minimum=True)
        return check_int("clients_per_round", value, minimum=1)
    except InvalidArgumentError:
        # One message for both readings: a user who wrote 1.5 may have meant a count or a fraction.
        raise InvalidArgumentError("clients_per_round", value, _CLIENTS_PER_ROUND) from None
