"""The partitioner contract: a pure function of the labels and a seed."""

from __future__ import annotations

from abc import ABC, abstractmethod

from torch import Tensor
from typing_extensions import override

from lightning_fed.checks import check_int


class Partitioner(ABC):
    """Splits a labelled dataset's indices among clients.

    A partitioner is a pure function of ``labels`` (and ``natural_ids`` where it uses them) and of the settings
    given to its constructor, seed included: the same inputs always give the same partition. Constructors validate
    their settings eagerly and name the argument to change.

    Args:
        num_partitions: Number of clients.
        seed: Seed of every random draw the partitioner makes.

    Attributes:
        uses_labels: Whether the partition depends on the labels; a partitioner that sets it false (IID, natural
            ids) also splits data without labels, which it receives as zeros.
    """

    uses_labels: bool = True

    def __init__(self, num_partitions: int, seed: int = 0) -> None:
        self.num_partitions = check_int("num_partitions", num_partitions, minimum=1)
        # NumPy's generators, which the partitioners draw from, reject negative seeds.
        self.seed = check_int("seed", seed, minimum=0)

    @abstractmethod
    def partition(self, labels: Tensor, natural_ids: Tensor | None = None) -> list[Tensor]:
        """Returns one int64 index tensor per client, indexing into ``labels``.

        Args:
            labels: 1-D int64 tensor of class labels, one per example.
            natural_ids: 1-D int64 tensor of natural client ids (e.g. LEAF writers), for partitioners that use them.
        """

    @override
    def __repr__(self) -> str:
        settings = ", ".join(f"{key}={value!r}" for key, value in vars(self).items() if not key.startswith("_"))
        return f"{type(self).__name__}({settings})"
