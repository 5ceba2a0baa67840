"""Similarity-s partitioner: an IID fraction plus a label-sorted remainder."""

from __future__ import annotations

import numpy as np
from torch import Tensor
from typing_extensions import override

from lightning_fed.checks import check_real
from lightning_fed.datamodules.partitioners._common import labels_to_numpy, sort_with_random_ties, to_index_tensors
from lightning_fed.datamodules.partitioners.base import Partitioner


class SimilarityPartitioner(Partitioner):
    """The "similarity s%" split of SCAFFOLD, as used by rFedAvg.

    Source: Wang et al., "Distribution-Regularized Federated Learning on Non-IID Data" (rFedAvg, ICDE 2023), §VI:
    "we first allocate to each client s% IID data, then sort the remaining (100 - s)% data according to the label
    and allocate them evenly to the clients", following Karimireddy et al., "SCAFFOLD" (ICML 2020,
    arXiv:1910.06378). The paper uses s ∈ {0%, 10%, 100%}.

    Scheme: a seeded random ``round(similarity · N)`` examples are dealt evenly (``numpy.array_split``) to the
    clients; the rest are sorted by label (ties in random order) and cut into ``num_partitions`` contiguous chunks,
    chunk k going to client k, so client 0 holds the smallest labels. Every example is used exactly once and client
    sizes differ by at most two. ``similarity=1`` is IID; ``similarity=0`` is fully sorted (with N balanced classes
    and N clients, one class per client).

    Args:
        num_partitions: Number of clients.
        similarity: Fraction s of the data that is IID, in [0, 1] (10% is 0.1).
        seed: Seed of the IID draw and of the tie order.
    """

    def __init__(self, num_partitions: int, similarity: float, seed: int = 0) -> None:
        super().__init__(num_partitions, seed)
        self.similarity = check_real("similarity", similarity, minimum=0.0, maximum=1.0)

    @override
    def partition(self, labels: Tensor, natural_ids: Tensor | None = None) -> list[Tensor]:
        """Returns one sorted int64 index tensor per client; see the class docstring."""
        y = labels_to_numpy(labels)
        if y.size < self.num_partitions:
            raise ValueError(
                f"Cannot split {y.size} examples among `num_partitions`={self.num_partitions} clients; "
                f"lower `num_partitions`."
            )
        rng = np.random.default_rng(self.seed)
        order = sort_with_random_ties(y, rng)
        iid_mask = np.zeros(y.size, dtype=bool)
        iid_mask[rng.permutation(y.size)[: round(self.similarity * y.size)]] = True
        iid_part = rng.permutation(np.flatnonzero(iid_mask))
        sorted_part = order[~iid_mask[order]]
        iid_chunks = np.array_split(iid_part, self.num_partitions)
        sorted_chunks = np.array_split(sorted_part, self.num_partitions)
        return to_index_tensors([np.concatenate(pair) for pair in zip(iid_chunks, sorted_chunks)])
