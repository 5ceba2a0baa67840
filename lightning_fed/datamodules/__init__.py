"""Federated datamodules and the partitioners that split their data among clients.

Everything is importable from here, so configs can name e.g. ``lightning_fed.datamodules.FashionMNISTFederated``
and ``lightning_fed.datamodules.DirichletPartitioner``.
"""

from lightning_fed.datamodules.base import FederatedDataModule
from lightning_fed.datamodules.dataset_federated import DatasetFederated
from lightning_fed.datamodules.generated import MNIST1DFederated, SyntheticFederated, synthetic_fedprox
from lightning_fed.datamodules.hf_dataset import HFDatasetAdapter, HFDatasetFederated
from lightning_fed.datamodules.leaf import FEMNISTFederated, Sent140Federated
from lightning_fed.datamodules.partitioners import (
    DirichletPartitioner,
    GroupPartitioner,
    IidPartitioner,
    NaturalIdPartitioner,
    Partitioner,
    ShardPartitioner,
    SimilarityPartitioner,
    TargetEmdPartitioner,
)
from lightning_fed.datamodules.shakespeare import ShakespeareFederated
from lightning_fed.datamodules.sharing import DataSharing
from lightning_fed.datamodules.tensor_dataset import TensorClassificationDataset, tensor_dataloader
from lightning_fed.datamodules.token_patterns import TokenPatternsFederated, TokenSequenceDataset
from lightning_fed.datamodules.vision import (
    DEBIAN_FASHION_MNIST_DIR,
    CIFAR10Federated,
    CIFAR100Federated,
    EMNISTFederated,
    FashionMNISTFederated,
    MNISTFederated,
    SVHNFederated,
)

__all__ = [
    "DEBIAN_FASHION_MNIST_DIR",
    "CIFAR10Federated",
    "CIFAR100Federated",
    "DataSharing",
    "DatasetFederated",
    "EMNISTFederated",
    "FEMNISTFederated",
    "FashionMNISTFederated",
    "FederatedDataModule",
    "HFDatasetAdapter",
    "HFDatasetFederated",
    "MNIST1DFederated",
    "MNISTFederated",
    "SVHNFederated",
    "Sent140Federated",
    "ShakespeareFederated",
    "SyntheticFederated",
    "TensorClassificationDataset",
    "TokenPatternsFederated",
    "TokenSequenceDataset",
    "synthetic_fedprox",
    "tensor_dataloader",
    "DirichletPartitioner",
    "GroupPartitioner",
    "IidPartitioner",
    "NaturalIdPartitioner",
    "Partitioner",
    "ShardPartitioner",
    "SimilarityPartitioner",
    "TargetEmdPartitioner",
]
