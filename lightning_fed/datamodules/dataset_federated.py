"""A federated datamodule over datasets the user already holds."""

from __future__ import annotations

from typing import Literal

from torch.utils.data import Dataset
from typing_extensions import override

from lightning_fed.checks import check_instance
from lightning_fed.datamodules.base import FederatedDataModule
from lightning_fed.datamodules.partitioners.base import Partitioner
from lightning_fed.datamodules.sharing import DataSharing


class DatasetFederated(FederatedDataModule):
    """Federates user-supplied datasets, e.g. torchvision datasets with their own transforms.

    Args:
        train_dataset: Labelled map-style dataset yielding ``(input, label)``; labels are read from its ``targets``
            or ``labels`` attribute when it has one, else by iterating over it once.
        test_dataset: Global test set; ``None`` uses the union of the client test splits.
        num_classes: Number of classes.
        partitioner, batch_size, eval_batch_size, client_test_fraction, client_test_size, val_fraction,
        num_workers, seed, sharing, evaluation_split: As in :class:`FederatedDataModule`.
    """

    def __init__(
        self,
        train_dataset: Dataset,
        test_dataset: Dataset | None,
        num_classes: int,
        partitioner: Partitioner,
        batch_size: int = 32,
        eval_batch_size: int = 256,
        client_test_fraction: float = 0.2,
        client_test_size: int | None = None,
        val_fraction: float = 0.0,
        num_workers: int = 0,
        seed: int = 0,
        sharing: DataSharing | None = None,
        evaluation_split: Literal["test", "validation"] = "test",
    ) -> None:
        check_instance("train_dataset", train_dataset, Dataset, "a map-style torch Dataset of (input, label) pairs")
        check_instance("test_dataset", test_dataset, (Dataset, type(None)), "a map-style torch Dataset or None")
        self.num_classes = num_classes  # checked by FederatedDataModule
        super().__init__(
            partitioner,
            batch_size,
            eval_batch_size,
            client_test_fraction,
            client_test_size,
            val_fraction,
            num_workers,
            seed,
            sharing,
            evaluation_split,
        )
        self.train_dataset = train_dataset
        self.test_dataset = test_dataset

    @override
    def _load_datasets(self) -> tuple[Dataset, Dataset | None]:
        return self.train_dataset, self.test_dataset


__all__ = ["DatasetFederated"]
