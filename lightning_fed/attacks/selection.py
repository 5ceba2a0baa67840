"""Which clients are malicious: a seeded, fixed share of the federation, drawn once per run."""

from __future__ import annotations

import math

import torch

from lightning_fed.checks import check_int, check_real
from lightning_fed.utilities.seeding import derive_seed


def num_malicious(num_clients: int, fraction: float) -> int:
    """``floor(fraction * num_clients)``, robust to the float error of e.g. ``0.3 * 10 = 3.0000000000000004`` or
    ``0.29 * 100 = 28.999999999999996``."""
    return math.floor(round(fraction * num_clients, 9))


def choose_malicious(seed: int, num_clients: int, fraction: float) -> list[int]:
    """The malicious clients of a run: the first ``floor(fraction * num_clients)`` of a seeded permutation.

    The permutation depends only on the run seed (through :func:`~lightning_fed.utilities.seeding.derive_seed`), so the
    choice is the same on every rank and after a resume, and, for one seed, the attackers of a smaller fraction are
    among those of a larger one (a robustness sweep over fractions adds attackers rather than drawing new ones).

    Args:
        seed: The run seed.
        num_clients: Clients in the federation.
        fraction: Share of them that is malicious, in ``[0, 1)``.

    Returns:
        The malicious client ids, sorted.
    """
    check_int("num_clients", num_clients, minimum=1)
    check_real("fraction", fraction, minimum=0.0, maximum=1.0, exclusive_maximum=True)
    generator = torch.Generator().manual_seed(derive_seed(seed, "attack", "malicious"))
    order = torch.randperm(num_clients, generator=generator)
    return sorted(order[: num_malicious(num_clients, fraction)].tolist())


__all__ = ["choose_malicious", "num_malicious"]
