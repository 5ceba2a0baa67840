"""Partitioners: pure, seeded functions from labels (and natural ids) to one index tensor per client."""

from lightning_fed.datamodules.partitioners.base import Partitioner
from lightning_fed.datamodules.partitioners.dirichlet import DirichletPartitioner
from lightning_fed.datamodules.partitioners.group import GroupPartitioner
from lightning_fed.datamodules.partitioners.iid import IidPartitioner
from lightning_fed.datamodules.partitioners.natural_id import NaturalIdPartitioner
from lightning_fed.datamodules.partitioners.shard import ShardPartitioner
from lightning_fed.datamodules.partitioners.similarity import SimilarityPartitioner
from lightning_fed.datamodules.partitioners.target_emd import TargetEmdPartitioner

__all__ = [
    "DirichletPartitioner",
    "GroupPartitioner",
    "IidPartitioner",
    "NaturalIdPartitioner",
    "Partitioner",
    "ShardPartitioner",
    "SimilarityPartitioner",
    "TargetEmdPartitioner",
]
