"""Dirichlet label-skew partitioner, in its per-class and per-client forms."""

from __future__ import annotations

from typing import Literal

import numpy as np
from torch import Tensor
from typing_extensions import override

from lightning_fed.checks import InvalidArgumentError, check_choice, check_int, check_real
from lightning_fed.datamodules.partitioners._common import labels_to_numpy, to_index_tensors
from lightning_fed.datamodules.partitioners.base import Partitioner
from lightning_fed.utilities.deprecation import deprecated

_Proportions = Literal["per_class", "per_client"]
_PROPORTIONS: tuple[_Proportions, ...] = ("per_class", "per_client")
# The deprecated `partition_by` spelling of each `proportions` value.
_PARTITION_BY: dict[str, _Proportions] = {"class": "per_class", "client": "per_client"}
_PARTITION_BY_OF = {new: old for old, new in _PARTITION_BY.items()}
_DEPRECATED_PARTITION_BY = (
    "DirichletPartitioner's `partition_by` is deprecated and will be removed in the next release: use "
    "`proportions` instead (partition_by='class' is proportions='per_class', 'client' is 'per_client')."
)


class DirichletPartitioner(Partitioner):
    """Label skew drawn from a symmetric Dirichlet distribution with concentration ``alpha`` (the papers' β).

    Source: Wu, Liu, Xue, "Global Update Guided Federated Learning" (FedGG, 2022, arXiv:2204.03920), §4.1: client
    i's class distribution is a vector p_i over the M classes with p_i ~ Dirichlet(β), β ∈ {0.5, 0.1}; smaller β is
    more skewed. That text is the ``proportions="per_client"`` form. FedGG says it follows MOON (Li, He, Song,
    "Model-Contrastive Federated Learning", CVPR 2021), whose split is the ``"per_class"`` form, so both are offered;
    ``"per_class"`` is the default.

    ``proportions`` names what one Dirichlet draw is a distribution over:

    - ``"per_class"``: for each class c, draw q_c ~ Dir(alpha · 1_K), the proportions of c's examples that go to each
      of the K clients, and cut c's shuffled examples at the cumulative proportions (floored). Every example is used
      exactly once; client sizes vary. The whole draw is repeated, at most ``max_retries`` times, until every client
      holds ``>= min_partition_size`` examples.
    - ``"per_client"``: client sizes are equal (they differ by at most one, every example used once). Client k draws
      p_k ~ Dir(alpha · 1_M), the proportions of the M classes in its data, and fills its quota by sampling without
      replacement: draws of a class that has run out are redrawn from p_k renormalised over the classes that remain.
      Clients fill in a seeded random order, so no fixed client is left with the remainder.

    ``alpha -> inf`` approaches IID; ``alpha -> 0`` approaches one class per client.

    Args:
        num_partitions: Number of clients K.
        alpha: Dirichlet concentration, > 0.
        min_partition_size: Fewest examples a client may get.
        max_retries: Most draws the ``"per_class"`` form tries before giving up.
        proportions: ``"per_class"`` (each class's proportions over the clients) or ``"per_client"`` (each client's
            proportions over the classes, FedGG's text).
        seed: Seed of every draw.
        partition_by: Deprecated alias of ``proportions`` (``"class"`` is ``"per_class"``, ``"client"`` is
            ``"per_client"``), removed in the next release. It was renamed because flwr-datasets'
            ``partition_by`` names the label column instead.

    Raises:
        ValueError: On invalid settings, or when no draw satisfies ``min_partition_size``.
    """

    def __init__(
        self,
        num_partitions: int,
        alpha: float,
        min_partition_size: int = 10,
        max_retries: int = 100,
        proportions: Literal["per_class", "per_client"] = "per_class",
        seed: int = 0,
        partition_by: Literal["class", "client"] | None = None,
    ) -> None:
        super().__init__(num_partitions, seed)
        self.alpha = check_real("alpha", alpha, minimum=0.0, exclusive_minimum=True)
        self.min_partition_size = check_int("min_partition_size", min_partition_size, minimum=0)
        self.max_retries = check_int("max_retries", max_retries, minimum=1)
        check_choice("proportions", proportions, _PROPORTIONS)
        if partition_by is not None:
            proportions = _from_partition_by(partition_by, proportions)
        self.proportions = proportions

    @property
    def partition_by(self) -> str:
        """Deprecated: ``"class"`` or ``"client"``, the old spelling of :attr:`proportions`."""
        deprecated(_DEPRECATED_PARTITION_BY)
        return _PARTITION_BY_OF[self.proportions]

    @override
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
        if self.proportions == "per_class":
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
            f"DirichletPartitioner(proportions='per_class') found no draw in `max_retries`={self.max_retries} giving "
            f"every client >= `min_partition_size`={self.min_partition_size} examples (the best draw's smallest "
            f"client got {best}). Lower `min_partition_size`, raise `alpha` (now {self.alpha}), use fewer "
            f"`num_partitions` (now {self.num_partitions}), raise `max_retries`, or use proportions='per_client' "
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


def _from_partition_by(partition_by: str, proportions: str) -> _Proportions:
    """The ``proportions`` value the deprecated ``partition_by`` stands for; warns that it is deprecated."""
    check_choice("partition_by", partition_by, tuple(_PARTITION_BY))
    deprecated(_DEPRECATED_PARTITION_BY, stacklevel=4)
    translated = _PARTITION_BY[partition_by]
    # `proportions` left at its default cannot be told from an explicit "per_class"; only a contradiction is an error.
    if proportions != "per_class" and proportions != translated:
        raise InvalidArgumentError(
            "partition_by", partition_by, f"left out, or consistent with `proportions` ({proportions!r})"
        )
    return translated
