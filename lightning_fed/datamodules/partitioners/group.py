"""Group partitioner: FedAMP's "practical non-IID" setting."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from torch import Tensor
from typing_extensions import override

from lightning_fed.checks import InvalidArgumentError, check_int, check_real
from lightning_fed.datamodules.partitioners._common import labels_to_numpy, to_index_tensors
from lightning_fed.datamodules.partitioners.base import Partitioner


class GroupPartitioner(Partitioner):
    """Groups of clients with shared dominant classes and group-dependent sizes.

    Source: Huang et al., "Personalized Cross-Silo Federated Learning on Non-IID Data" (FedAMP, AAAI 2021,
    arXiv:2007.03797), §Experiments, "practical non-IID data setting". Their EMNIST example: 62 clients in three
    groups, clients 0-9 / 10-35 / 36-61, whose dominant classes are the digits / upper-case / lower-case letters;
    80% of each client's data is sampled uniformly from its group's dominant classes and 20% from the other classes,
    with 1000 / 700 / 400 training samples per client by group; every client holds data from all classes.
    Reproduce it with
    ``GroupPartitioner(62, num_groups=3, clients_per_group=[10, 26, 26], classes_per_group=[10, 26, 26],
    samples_per_client=[1000, 700, 400])``. This is not PFLlib's "practical" split, which is a Dirichlet split.

    Conventions (the paper leaves them open):

    - Groups are contiguous blocks of client ids and of class ids (``numpy.array_split`` sizes by default), so the
      structure does not depend on the seed and the same settings applied to test labels (the paper gives each
      client 100 test samples of its training distribution) give every client the same class mix.
    - ``samples_per_client`` is a client's total. Its dominant part is ``round(dominant_ratio · size)``.
    - "Uniformly" is read per class: each part is spread evenly over its classes; leftover units rotate over the
      classes from client to client within a group, so the class totals are even too.
    - Examples are drawn without replacement (each example at most once; unused examples are left out).

    Args:
        num_partitions: Number of clients.
        num_groups: Number of client groups (3 in the paper).
        dominant_ratio: Share of a client's samples from its group's dominant classes, in [0, 1] (80% is 0.8).
        samples_per_client: Samples per client, one entry per group. ``None`` gives every client the largest equal
            size the labels can supply.
        clients_per_group: Clients per group, summing to ``num_partitions``. ``None`` splits them evenly.
        classes_per_group: Number of consecutive class ids dominant in each group. ``None`` splits the classes evenly.
        seed: Seed of the example draw.
    """

    def __init__(
        self,
        num_partitions: int,
        num_groups: int = 3,
        dominant_ratio: float = 0.8,
        samples_per_client: Sequence[int] | None = None,
        clients_per_group: Sequence[int] | None = None,
        classes_per_group: Sequence[int] | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(num_partitions, seed)
        self.num_groups = check_int("num_groups", num_groups, minimum=1)
        if self.num_groups > self.num_partitions:
            every_group_a_client = f"at most `num_partitions` ({self.num_partitions}), as every group needs a client"
            raise InvalidArgumentError("num_groups", num_groups, every_group_a_client)
        self.dominant_ratio = check_real("dominant_ratio", dominant_ratio, minimum=0.0, maximum=1.0)
        self.samples_per_client = _per_group("samples_per_client", samples_per_client, self.num_groups)
        self.clients_per_group = _per_group("clients_per_group", clients_per_group, self.num_groups)
        self.classes_per_group = _per_group("classes_per_group", classes_per_group, self.num_groups)
        if self.clients_per_group is not None and sum(self.clients_per_group) != self.num_partitions:
            summing = f"a list summing to `num_partitions` ({self.num_partitions})"
            raise InvalidArgumentError("clients_per_group", self.clients_per_group, summing)

    @override
    def partition(self, labels: Tensor, natural_ids: Tensor | None = None) -> list[Tensor]:
        """Returns one sorted int64 index tensor per client; see the class docstring."""
        y = labels_to_numpy(labels)
        if y.size == 0:
            raise ValueError("`labels` is empty; GroupPartitioner needs examples to draw from.")
        available = np.bincount(y)
        clients = self.clients_per_group or [
            len(block) for block in np.array_split(range(self.num_partitions), self.num_groups)
        ]
        group_of = np.repeat(np.arange(self.num_groups), clients)
        rank_in_group = np.arange(self.num_partitions) - np.repeat(np.cumsum(clients) - clients, clients)
        dominant = self._dominant_classes(available.size)
        if self.samples_per_client is None:
            sizes = self._largest_equal_size(group_of, rank_in_group, dominant, available)
        else:
            sizes = np.asarray(self.samples_per_client)[group_of]
        counts = self._class_counts(group_of, rank_in_group, dominant, sizes, available.size)
        _check_supply(counts, available)
        rng = np.random.default_rng(self.seed)
        parts: list[list[np.ndarray]] = [[] for _ in range(self.num_partitions)]
        for c in range(available.size):
            pool = rng.permutation(np.flatnonzero(y == c))
            for client, piece in enumerate(np.split(pool, np.cumsum(counts[:, c]))[:-1]):
                parts[client].append(piece)
        return to_index_tensors([np.concatenate(pieces) for pieces in parts])

    def _dominant_classes(self, num_classes: int) -> list[np.ndarray]:
        """Each group's dominant class ids: consecutive blocks of the class ids."""
        if self.classes_per_group is None:
            if num_classes < self.num_groups:
                raise ValueError(
                    f"`labels` hold {num_classes} classes, too few for `num_groups`={self.num_groups}; lower it."
                )
            return np.array_split(np.arange(num_classes), self.num_groups)
        if sum(self.classes_per_group) > num_classes:
            raise ValueError(
                f"`classes_per_group`={self.classes_per_group} needs {sum(self.classes_per_group)} classes but "
                f"`labels` hold {num_classes} (ids 0..{num_classes - 1}); lower `classes_per_group`."
            )
        return np.split(np.arange(sum(self.classes_per_group)), np.cumsum(self.classes_per_group)[:-1])

    def _class_counts(
        self,
        group_of: np.ndarray,
        rank_in_group: np.ndarray,
        dominant: list[np.ndarray],
        sizes: np.ndarray,
        num_classes: int,
    ) -> np.ndarray:
        """Per-client, per-class sample counts, shape [num_partitions, num_classes]."""
        counts = np.zeros((self.num_partitions, num_classes), dtype=np.int64)
        for client, (group, rank, size) in enumerate(zip(group_of, rank_in_group, sizes)):
            num_dominant = int(np.floor(self.dominant_ratio * size + 0.5))
            rest = np.setdiff1d(np.arange(num_classes), dominant[group])
            if rest.size == 0 and num_dominant < size:
                raise ValueError(
                    f"Group {group}'s dominant classes are all {num_classes} classes, leaving none for the other "
                    f"{1 - self.dominant_ratio:.0%}; lower `classes_per_group` or raise `num_groups`."
                )
            counts[client, dominant[group]] = _spread(num_dominant, dominant[group].size, rank)
            if rest.size:
                counts[client, rest] = _spread(int(size) - num_dominant, rest.size, rank)
        return counts

    def _largest_equal_size(
        self, group_of: np.ndarray, rank_in_group: np.ndarray, dominant: list[np.ndarray], available: np.ndarray
    ) -> np.ndarray:
        """The largest common client size whose class counts the labels can supply."""
        # Expected demand per class for a unit size bounds the answer; rounding may need a few steps below it.
        unit = self._class_counts(group_of, rank_in_group, dominant, np.full(group_of.size, 10**6), available.size)
        per_unit = unit.sum(axis=0) / 10**6
        used = per_unit > 0
        size = int(min(available.sum() // self.num_partitions, np.floor((available[used] / per_unit[used]).min())))
        while size > 0:
            sizes = np.full(group_of.size, size)
            if (self._class_counts(group_of, rank_in_group, dominant, sizes, available.size).sum(0) <= available).all():
                return sizes
            size -= 1
        raise ValueError(
            "The labels cannot give every client even one example under this group structure; lower "
            "`num_partitions` or `dominant_ratio`, or set `classes_per_group`."
        )


def _per_group(name: str, values: Sequence[int] | None, num_groups: int) -> list[int] | None:
    """Validates an optional list with one positive integer per group."""
    if values is None:
        return None
    allowed = f"a list of {num_groups} positive integers (one per group, `num_groups`={num_groups}) or None"
    # A string is a sequence too, but never a list of counts.
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)) or len(values) != num_groups:
        raise InvalidArgumentError(name, values, allowed)
    return [check_int(f"{name}[{index}]", value, minimum=1) for index, value in enumerate(values)]


def _spread(total: int, num_bins: int, rank: int) -> np.ndarray:
    """``total`` spread evenly over ``num_bins``; the remainder goes to bins that rotate with ``rank``."""
    counts = np.full(num_bins, total // num_bins, dtype=np.int64)
    remainder = total % num_bins
    counts[(rank * remainder + np.arange(remainder)) % num_bins] += 1
    return counts


def _check_supply(counts: np.ndarray, available: np.ndarray) -> None:
    """Raises a ``ValueError`` naming the classes that have too few examples."""
    needed = counts.sum(axis=0)
    short = np.flatnonzero(needed > available)
    if short.size:
        detail = ", ".join(f"class {c}: need {needed[c]}, have {available[c]}" for c in short[:5])
        raise ValueError(
            f"Not enough examples for this group split ({detail}{', ...' if short.size > 5 else ''}); lower "
            f"`samples_per_client` or `dominant_ratio`, or use fewer `num_partitions`."
        )
