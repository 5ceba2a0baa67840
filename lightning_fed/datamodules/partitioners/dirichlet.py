"""Dirichlet label-skew partitioner, in its per-class and per-client forms."""

from __future__ import annotations

import math

import numpy as np
from torch import Tensor

from lightning_fed.datamodules.partitioners._common import labels_to_numpy, require_int, to_index_tensors
from lightning_fed.datamodules.partitioners.base import Partitioner

_FORMS = ("class", "client")


class DirichletPartitioner(Partitioner):
    """Label skew drawn from a symmetric Dirichlet distribution with concentration ``alpha`` (the papers' β).

    Source: Wu, Liu, Xue, "Global Update Guided Federated Learning" (FedGG, 2022), §4.1: client i's class
    distribution is a vector p_i over the M classes with p_i ~ Dirichlet(β), β ∈ {0.5, 0.1}; smaller β is more
    skewed. That text is the ``partition_by="client"`` form. FedGG says it follows MOON (Li, He, Song, CVPR 2021), whose
    split is the ``"class"`` form, so both are offered; ``"class"`` is the default.

    - ``"class"``: for each class c, draw q_c ~ Dir(alpha · 1_K) over the K clients and cut c's shuffled examples
      at the cumulative proportions (floored). Every example is used exactly once; client sizes vary. The whole draw
      is repeated, at most ``max_retries`` times, until every client holds ``>= min_partition_size`` examples.
    - ``"client"``: client sizes are equal (they differ by at most one, every example used once). Client k draws
      p_k ~ Dir(alpha · 1_M) over the M classes and fills its quota by sampling without replacement: draws of a class
      that has run out are redrawn from p_k renormalised over the classes that remain. Clients fill in a seeded
      random order, so no fixed client is left with the remainder.

    ``alpha -> inf`` approaches IID; ``alpha -> 0`` approaches one class per client.

    Args:
        num_partitions: Number of clients K.
        alpha: Dirichlet concentration, > 0.
        min_partition_size: Fewest examples a client may get.
        max_retries: Most draws the ``"class"`` form tries before giving up.
        partition_by: ``"class"`` (per-class proportions over clients) or ``"client"`` (FedGG's per-client proportions
            over classes).
        seed: Seed of every draw.

    Raises:
        ValueError: On invalid settings, or when no draw satisfies ``min_partition_size``.
    """

    def __init__(
        self,
        num_partitions: int,
        alpha: float,
        min_partition_size: int = 10,
        max_retries: int = 100,
        partition_by: str = "class",
        seed: int = 0,
    ) -> None:
        super().__init__(num_partitions, seed)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
            raise ValueError(f"`alpha` must be a finite number > 0, got {alpha!r}.")
        if partition_by not in _FORMS:
            raise ValueError(f"`partition_by` must be one of {_FORMS}, got {partition_by!r}.")
        self.alpha = float(alpha)
        self.min_partition_size = require_int("min_partition_size", min_partition_size, 0)
        self.max_retries = require_int("max_retries", max_retries, 1)
        self.partition_by = partition_by

    def partition(self, labels: Tensor, natural_ids: Tensor | None = None) -> list[Tensor]:
        """Returns one sorted int64 index tensor per client; see the class docstring."""
        y = labels_to_numpy(labels)
        # No redraw can beat this bound, so fail before spending retries on it.
        if y.size // self.num_partitions < self.min_partition_size:
            raise ValueError(
                f"{y.size} examples cannot give `num_partitions`={self.num_partitions} clients "
                f"`min_partition_size`={self.min_partition_size} each; lower `min_partition_size` or `num_partitions`."
            )
        rng = np.random.default_rng(self.seed)
        by_class = [rng.permutation(np.flatnonzero(y == c)) for c in np.unique(y)]
        if self.partition_by == "class":
            return to_index_tensors(self._split_classes(by_class, rng))
        return to_index_tensors(self._fill_clients(by_class, y.size, rng))

    def _split_classes(self, by_class: list[np.ndarray], rng: np.random.Generator) -> list[np.ndarray]:
        """The per-class form: redraws until the smallest client is big enough."""
        best = 0
        for _ in range(self.max_retries):
            # Counts first: a rejected draw then costs O(classes x clients), not a copy of the indices.
            counts = np.stack([_cut(rng.dirichlet(np.full(self.num_partitions, self.alpha)), c.size) for c in by_class])
            smallest = int(counts.sum(axis=0).min())
            best = max(best, smallest)
            if smallest >= self.min_partition_size:
                bounds = np.cumsum(counts, axis=1)[:, :-1]
                pieces = [np.split(indices, cuts) for indices, cuts in zip(by_class, bounds)]
                return [np.concatenate([per_class[k] for per_class in pieces]) for k in range(self.num_partitions)]
        raise ValueError(
            f"DirichletPartitioner(partition_by='class') found no draw in `max_retries`={self.max_retries} giving "
            f"every client >= `min_partition_size`={self.min_partition_size} examples (the best draw's smallest "
            f"client got {best}). Lower `min_partition_size`, raise `alpha` (now {self.alpha}), use fewer "
            f"`num_partitions` (now {self.num_partitions}), raise `max_retries`, or use partition_by='client' "
            f"(equal sizes)."
        )

    def _fill_clients(self, by_class: list[np.ndarray], total: int, rng: np.random.Generator) -> list[np.ndarray]:
        """The per-client form: equal quotas filled from each client's own class proportions."""
        remaining = np.array([indices.size for indices in by_class])
        taken = np.zeros(len(by_class), dtype=np.int64)
        quotas = [part.size for part in np.array_split(np.arange(total), self.num_partitions)]
        parts: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * self.num_partitions
        for client in rng.permutation(self.num_partitions):
            proportions = rng.dirichlet(np.full(len(by_class), self.alpha))
            counts = _sample_without_replacement(proportions, remaining, quotas[client], rng)
            parts[client] = np.concatenate([idx[t : t + n] for idx, t, n in zip(by_class, taken, counts)])
            taken += counts
            remaining -= counts
        return parts


def _cut(proportions: np.ndarray, total: int) -> np.ndarray:
    """Integer counts summing to ``total``, cut at the floored cumulative proportions."""
    bounds = np.floor(np.cumsum(proportions) * total).astype(np.int64)
    bounds[-1] = total  # float round-off must not drop the last example
    return np.diff(bounds, prepend=0)


def _sample_without_replacement(
    proportions: np.ndarray, remaining: np.ndarray, quota: int, rng: np.random.Generator
) -> np.ndarray:
    """Class counts of ``quota`` draws from ``proportions``, redrawing over classes that remain once one runs out.

    Capping a multinomial at what remains and redrawing the excess is rejection sampling of the sequential draws,
    since i.i.d. draws are exchangeable.
    """
    counts = np.zeros_like(remaining)
    while quota > 0:
        weights = np.where(remaining - counts > 0, proportions, 0.0)
        if weights.sum() <= 0:
            # Every class this client favours is used up (proportions can underflow to 0 at tiny alpha).
            weights = (remaining - counts).astype(np.float64)
        draw = np.minimum(rng.multinomial(quota, weights / weights.sum()), remaining - counts)
        counts += draw
        quota -= int(draw.sum())
    return counts
