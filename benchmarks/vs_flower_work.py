"""The FedAvg work that ``vs_flower.py`` gives both frameworks: cases, the shared data file, one client's training.

Both sides read the same file of normalised Fashion-MNIST tensors (written once by :func:`write_case_data`), start
from the same LeNet-5 weights (:func:`make_model`), and train a client on the same batches: client ``c`` owns rows
``c * n .. (c + 1) * n - 1`` of the file, and in round ``r`` (0-based) it visits them in the order drawn by a
generator seeded with ``derive_seed(seed, "data", r, c)``, which is what lightning_fed's round does. A Flower client
therefore trains exactly what a lightning_fed client trains; only the orchestration around it differs.

Nothing here imports Flower, so the tests can check the work without it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_fed.datamodules.partitioners import Partitioner
from lightning_fed.models import LeNet5
from lightning_fed.utilities.seeding import derive_seed


@dataclass(frozen=True)
class Case:
    """One federation: ``num_clients`` clients of ``samples_per_client`` images, ``clients_per_round`` per round."""

    name: str
    num_clients: int
    samples_per_client: int
    clients_per_round: int

    def __post_init__(self) -> None:
        if not 1 <= self.clients_per_round <= self.num_clients:
            raise ValueError(f"{self.name}: clients_per_round must lie in [1, {self.num_clients}].")
        if self.num_clients * self.samples_per_client > TRAIN_IMAGES:
            raise ValueError(f"{self.name}: {self.num_clients} x {self.samples_per_client} exceeds {TRAIN_IMAGES}.")

    @property
    def label(self) -> str:
        """``"10 x 6000, 10/round"``: how the table names the case."""
        return f"{self.num_clients} x {self.samples_per_client}, {self.clients_per_round}/round"

    def samples_per_round(self) -> int:
        return self.clients_per_round * self.samples_per_client

    def steps_per_round(self, batch_size: int) -> int:
        """Optimizer steps of one round: one local epoch per sampled client, the last batch possibly short."""
        return self.clients_per_round * math.ceil(self.samples_per_client / batch_size)


TRAIN_IMAGES = 60_000
"""Fashion-MNIST's training set."""

CASES = {
    "cross-silo": Case("cross-silo", 10, 6000, 10),
    "cross-device-100": Case("cross-device-100", 100, 60, 100),
    "cross-device-1000": Case("cross-device-1000", 1000, 60, 100),
}
"""The issue's three federations: 10 x 6 000 (all train), 100 x 60 (all train), 1 000 x 60 (100 sampled)."""

LEARNING_RATE = 0.01
"""SGD without momentum, as ``benchmarks/speed.py``."""


def client_rows(case: Case, client_id: int) -> Tensor:
    """The rows of the data file that belong to ``client_id``."""
    start = client_id * case.samples_per_client
    return torch.arange(start, start + case.samples_per_client)


class ContiguousPartitioner(Partitioner):
    """lightning_fed's view of the data file: client ``c`` gets :func:`client_rows` ``(case, c)``."""

    def __init__(self, case: Case) -> None:
        super().__init__(case.num_clients)
        self.case = case

    def partition(self, labels: Tensor, natural_ids: Tensor | None = None) -> list[Tensor]:
        expected = self.case.num_clients * self.case.samples_per_client
        if labels.numel() != expected:
            raise ValueError(f"{self.case.name} needs {expected} examples; the data file holds {labels.numel()}.")
        return [client_rows(self.case, client_id) for client_id in range(self.case.num_clients)]


def write_case_data(case: Case, images: Tensor, labels: Tensor, seed: int, path: Path) -> None:
    """Draws ``num_clients * samples_per_client`` training examples IID without replacement, in client order.

    Args:
        case: The federation.
        images: ``[60000, 1, 28, 28]`` normalised float training images.
        labels: ``[60000]`` int64 labels.
        seed: Seed of the draw.
        path: Where to ``torch.save`` ``{"x", "y"}``.
    """
    needed = case.num_clients * case.samples_per_client
    chosen = torch.from_numpy(np.random.default_rng(seed).permutation(labels.numel())[:needed])
    torch.save({"x": images[chosen].contiguous(), "y": labels[chosen].contiguous()}, path)


def load_case_data(path: str | Path) -> tuple[Tensor, Tensor]:
    data = torch.load(path, weights_only=True)
    return data["x"], data["y"]


def client_batches(
    x: Tensor, y: Tensor, case: Case, client_id: int, round_idx: int, batch_size: int, seed: int
) -> list[tuple[Tensor, Tensor]]:
    """One local epoch of ``client_id`` in round ``round_idx``, in lightning_fed's order for that client and round."""
    rows = client_rows(case, client_id)
    generator = torch.Generator().manual_seed(derive_seed(seed, "data", round_idx, client_id))
    order = rows[torch.randperm(rows.numel(), generator=generator)]
    return [(x[index], y[index]) for index in order.split(batch_size)]


def make_model(seed: int) -> nn.Module:
    """LeNet-5 for 1 x 28 x 28 inputs, with the initial weights of ``benchmarks/speed.py``'s ``make_module(seed)``."""
    torch.manual_seed(seed)
    return LeNet5(in_channels=1, num_classes=10)


def train_on_batches(model: nn.Module, batches: list[tuple[Tensor, Tensor]], lr: float = LEARNING_RATE) -> None:
    """The client step every FedAvg tutorial writes: fresh SGD, cross-entropy, backward, step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    for inputs, targets in batches:
        loss = F.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def per_round_time(round_ends: list[float]) -> float:
    """``(T_R - T_1) / (R - 1)`` from the wall-clock times at which rounds 1..R ended: round 1 and start-up left out."""
    if len(round_ends) < 2:
        raise ValueError(f"need the ends of at least 2 rounds to drop the first; got {len(round_ends)}.")
    return (round_ends[-1] - round_ends[0]) / (len(round_ends) - 1)
