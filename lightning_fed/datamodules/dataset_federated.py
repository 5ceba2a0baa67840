"""A federated datamodule over datasets the user already holds."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from torch import Tensor
from torch.utils.data import Dataset
from typing_extensions import override

from lightning_fed.checks import check_instance
from lightning_fed.datamodules.base import FederatedDataModule
from lightning_fed.datamodules.layout import extract_labels
from lightning_fed.datamodules.partitioners.base import Partitioner
from lightning_fed.datamodules.sharing import DataSharing


class DatasetFederated(FederatedDataModule):
    """Federates user-supplied datasets, e.g. torchvision datasets with their own transforms.

    Labels come from ``label_fn`` when given, else from the dataset's ``targets`` or ``labels`` attribute, else
    from its items when they declare one: ``(input, label)`` tuples (or ``{"label": ...}`` dicts) whose label is an
    integer scalar, read by iterating once. Anything else (bare tensors, float targets) is data without labels,
    which trains under a label-free partitioner (:class:`IidPartitioner`); a feature is never read as a label.

    Args:
        train_dataset: Map-style training dataset, with or without labels.
        test_dataset: Global test set; ``None`` uses the union of the client test splits.
        num_classes: Number of classes; ``None`` takes the largest label + 1, and data without labels needs
            ``None``.
        partitioner, batch_size, eval_batch_size, client_test_fraction, client_test_size, val_fraction,
        num_workers, seed, sharing, evaluation_split, drop_last, pin_memory, persistent_workers, batch_format,
        batch_keys: As in :class:`FederatedDataModule`.
        label_fn: Maps an item of ``train_dataset`` to its integer class id, for datasets whose labels are neither
            an attribute nor the second element of their items (e.g. ``lambda item: item["y"]``); called once per
            item at ``setup``.

    Example:
        >>> import torch
        >>> from lightning_fed.datamodules import IidPartitioner
        >>> unlabeled = torch.utils.data.TensorDataset(torch.randn(40, 3))  # items are (tensor,): no labels
        >>> data = DatasetFederated(unlabeled, None, None, IidPartitioner(4), batch_size=5)
        >>> data.setup()
        >>> data.has_labels, data.client_num_samples(0)
        (False, 8)
    """

    def __init__(
        self,
        train_dataset: Dataset,
        test_dataset: Dataset | None,
        num_classes: int | None,
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
        drop_last: bool = False,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        batch_format: Literal["tuple", "dict"] = "tuple",
        batch_keys: Sequence[str] = ("image", "label"),
        label_fn: Callable[[Any], Any] | None = None,
    ) -> None:
        check_instance("train_dataset", train_dataset, Dataset, "a map-style torch Dataset")
        check_instance("test_dataset", test_dataset, (Dataset, type(None)), "a map-style torch Dataset or None")
        if label_fn is not None and not callable(label_fn):
            raise TypeError(f"`label_fn` must be a callable (item -> class id); got {label_fn!r}.")
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
            drop_last=drop_last,
            pin_memory=pin_memory,
            persistent_workers=persistent_workers,
            batch_format=batch_format,
            batch_keys=batch_keys,
        )
        self.train_dataset = train_dataset
        self.test_dataset = test_dataset
        self.label_fn = label_fn

    @override
    def _load_datasets(self) -> tuple[Dataset, Dataset | None]:
        return self.train_dataset, self.test_dataset

    @override
    def _read_labels(self, train: Dataset) -> Tensor | None:
        return extract_labels(train, "train", self.label_fn)


__all__ = ["DatasetFederated"]
