"""Natural-id partitioner: one client per writer/user id, as in LEAF."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor
from typing_extensions import override

from lightning_fed.datamodules.partitioners._common import labels_to_numpy, to_index_tensors
from lightning_fed.datamodules.partitioners.base import Partitioner


class NaturalIdPartitioner(Partitioner):
    """One partition per distinct natural id, e.g. FEMNIST's writers or Sent140's users.

    The naturally non-IID setting of LEAF (Caldas et al., arXiv:1812.01097), used by rFedAvg (Wang et al.,
    "Distribution-Regularized Federated Learning on Non-IID Data", ICDE 2023) on FEMNIST and Sent140. Partition k
    holds every example whose id is the k-th smallest distinct id, so the mapping is deterministic and ``seed`` is
    unused. Subsample users (the paper samples 500) before partitioning.

    Args:
        num_partitions: Number of distinct natural ids expected.
        seed: Unused; kept for the common constructor.
    """

    uses_labels = False

    @override
    def partition(self, labels: Tensor, natural_ids: Tensor | None = None) -> list[Tensor]:
        """Returns one sorted int64 index tensor per distinct natural id, in ascending id order."""
        num_examples = labels_to_numpy(labels).size
        if natural_ids is None:
            raise ValueError("NaturalIdPartitioner needs `natural_ids` (one id per example); none were given.")
        ids = torch.as_tensor(natural_ids).detach().cpu().numpy()
        if ids.shape != (num_examples,):
            raise ValueError(f"`natural_ids` must have shape ({num_examples},) like `labels`; got {ids.shape}.")
        distinct, inverse = np.unique(ids, return_inverse=True)
        if distinct.size != self.num_partitions:
            raise ValueError(
                f"`natural_ids` hold {distinct.size} distinct ids but `num_partitions`={self.num_partitions}; "
                f"set `num_partitions` to {distinct.size} or subsample the ids first."
            )
        return to_index_tensors([np.flatnonzero(inverse == k) for k in range(distinct.size)])
