"""Shard partitioner: McMahan's pathological #C-classes-per-client split."""

from __future__ import annotations

import warnings

import numpy as np
from torch import Tensor
from typing_extensions import override

from lightning_fed.checks import check_int
from lightning_fed.datamodules.partitioners._common import labels_to_numpy, sort_with_random_ties, to_index_tensors
from lightning_fed.datamodules.partitioners.base import Partitioner

# Swap proposals per shard when randomising the assignment; enough to mix the class pairings well.
_SWAPS_PER_SHARD = 10


class ShardPartitioner(Partitioner):
    """Sort by label, cut into shards, give each client ``shards_per_client`` shards.

    Source: McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data" (AISTATS
    2017, arXiv:1602.05629), pathological non-IID split; used with 1 and 2 classes per client by Zhao et al.,
    "Federated Learning with Non-IID Data" (arXiv:1806.00582, 10 clients), with 96 clients x 2 blocks by Shoham et
    al., "Overcoming Forgetting in Federated Learning on Non-IID Data" (FedCurv, NeurIPS 2019 workshop), and as
    FedAMP's "pathological" setting (two classes per client; Huang et al., AAAI 2021, arXiv:2007.03797).

    Scheme: sort the examples by label (equal labels in seeded random order) and cut the sorted order into
    S = ``num_partitions · shards_per_client`` contiguous shards with ``numpy.array_split`` (sizes differ by at most
    one; every example is used exactly once, where FedCurv discarded a remainder). A shard's class is its most
    frequent label. The assignment of shards to clients avoids giving one client two shards of the same class
    whenever that is possible (no class owns more than ``num_partitions`` shards): shards grouped by class are dealt
    round-robin, which is duplicate-free by construction, then randomised by seeded shard swaps between clients that
    never create a duplicate. With balanced labels and shard boundaries on class boundaries every client therefore
    holds exactly ``shards_per_client`` classes. When duplicates cannot be avoided a ``UserWarning`` says so.

    Args:
        num_partitions: Number of clients.
        shards_per_client: Shards (hence classes, in the aligned case) per client, the paper's #C.
        seed: Seed of the tie order and of the assignment.
    """

    def __init__(self, num_partitions: int, shards_per_client: int, seed: int = 0) -> None:
        super().__init__(num_partitions, seed)
        self.shards_per_client = check_int("shards_per_client", shards_per_client, minimum=1)

    @override
    def partition(self, labels: Tensor, natural_ids: Tensor | None = None) -> list[Tensor]:
        """Returns one sorted int64 index tensor per client; see the class docstring."""
        y = labels_to_numpy(labels)
        num_shards = self.num_partitions * self.shards_per_client
        if y.size < num_shards:
            raise ValueError(
                f"{y.size} examples cannot be cut into `num_partitions` x `shards_per_client` = {num_shards} "
                f"shards; lower `shards_per_client` or `num_partitions`."
            )
        rng = np.random.default_rng(self.seed)
        shards = np.array_split(sort_with_random_ties(y, rng), num_shards)
        shard_class = np.array([np.bincount(y[shard]).argmax() for shard in shards])
        owners = self._assign(shard_class, rng)
        if any(_duplicates(shard_class[row]) for row in owners):
            warnings.warn(
                f"Some client got two shards of the same class: a class fills more than `num_partitions`="
                f"{self.num_partitions} of the {num_shards} shards. Raise `num_partitions` or lower "
                f"`shards_per_client` for exactly `shards_per_client` classes per client.",
                UserWarning,
                stacklevel=2,
            )
        return to_index_tensors([np.concatenate([shards[s] for s in row]) for row in owners])

    def _assign(self, shard_class: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Returns a [num_partitions, shards_per_client] array of shard ids, one row per client."""
        # Group shards by class (classes and shards within a class in random order) and deal them round-robin:
        # client k gets positions k, k+K, k+2K, ..., so a class owning at most K shards never repeats in a row.
        class_rank = rng.permutation(shard_class.max() + 1)[shard_class]
        dealt = np.lexsort((rng.random(shard_class.size), class_rank))
        owners = dealt.reshape(self.shards_per_client, self.num_partitions).T.copy()
        _mix(owners, shard_class, rng)
        return owners[rng.permutation(self.num_partitions)]


def _duplicates(classes: np.ndarray) -> int:
    """Number of shards in a row whose class already appeared in that row."""
    as_list = classes.tolist()
    return len(as_list) - len(set(as_list))


def _mix(owners: np.ndarray, shard_class: np.ndarray, rng: np.random.Generator) -> None:
    """Randomises ``owners`` in place by swapping shards between clients, accepting no swap that adds duplicates."""
    num_clients, per_client = owners.shape
    # With one shard per client a swap only relabels clients, which the caller's permutation already does.
    if num_clients < 2 or per_client < 2:
        return
    num_proposals = _SWAPS_PER_SHARD * owners.size
    firsts = rng.integers(owners.size, size=num_proposals)
    seconds = rng.integers(owners.size, size=num_proposals)
    for first, second in zip(firsts, seconds):
        (u, i), (v, j) = divmod(int(first), per_client), divmod(int(second), per_client)
        if u == v:
            continue
        before = _duplicates(shard_class[owners[u]]) + _duplicates(shard_class[owners[v]])
        owners[u, i], owners[v, j] = owners[v, j], owners[u, i]
        after = _duplicates(shard_class[owners[u]]) + _duplicates(shard_class[owners[v]])
        if after > before:
            owners[u, i], owners[v, j] = owners[v, j], owners[u, i]
