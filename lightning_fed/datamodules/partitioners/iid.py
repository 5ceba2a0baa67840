"""IID partitioner: a seeded random permutation cut into near-equal parts."""

from __future__ import annotations

import numpy as np
from torch import Tensor
from typing_extensions import override

from lightning_fed.datamodules.partitioners._common import labels_to_numpy, to_index_tensors
from lightning_fed.datamodules.partitioners.base import Partitioner


class IidPartitioner(Partitioner):
    """Uniformly random split into ``num_partitions`` parts whose sizes differ by at most one.

    This is the IID setting of McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized
    Data" (AISTATS 2017, arXiv:1602.05629), also used by Zhao et al. (arXiv:1806.00582) and FedAMP (Huang et al.,
    AAAI 2021, arXiv:2007.03797). Every example is used exactly once; the first ``N mod num_partitions`` clients get
    one extra example. Labels are ignored except for their count.

    Args:
        num_partitions: Number of clients.
        seed: Seed of the permutation.
    """

    uses_labels = False

    @override
    def partition(self, labels: Tensor, natural_ids: Tensor | None = None) -> list[Tensor]:
        """Returns one sorted int64 index tensor per client; see the class docstring."""
        num_examples = labels_to_numpy(labels).size
        if num_examples < self.num_partitions:
            raise ValueError(
                f"Cannot give each of `num_partitions`={self.num_partitions} clients an example from only "
                f"{num_examples} labels; lower `num_partitions`."
            )
        permutation = np.random.default_rng(self.seed).permutation(num_examples)
        return to_index_tensors(np.array_split(permutation, self.num_partitions))
