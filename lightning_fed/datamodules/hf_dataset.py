"""Client data from a Hugging Face ``datasets.Dataset``: its rows as dict items, a label column for the partitioners.

``datasets`` is the ``llm`` extra (``pip install 'lightning-fed[llm]'``); this module imports it only to check what
it is given.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset
from typing_extensions import override

from lightning_fed.checks import InvalidArgumentError
from lightning_fed.datamodules.dataset_federated import DatasetFederated
from lightning_fed.datamodules.partitioners.base import Partitioner
from lightning_fed.utilities.extras import require_extra


class HFDatasetAdapter(Dataset[dict[str, Any]]):
    """A ``datasets.Dataset`` as a map-style torch dataset of dict items, with its label column as ``targets``.

    Items are the rows' ``columns`` in the ``torch`` format (numbers and equal-length lists become tensors, text
    stays text), so they batch into the dicts HF's models take (``input_ids``, ``attention_mask``, ``labels``).
    Sequences must have one length per column within a batch: tokenize with ``padding="max_length"`` (and
    ``truncation=True``), as the default collation stacks them.

    Args:
        dataset: The ``datasets.Dataset`` (a split, not a ``DatasetDict``), or the directory ``save_to_disk`` wrote
            it to (what a YAML config names).
        label_column: The column of integer class ids the partitioners split by (``targets``); ``None`` for data
            without labels (only a label-free partitioner such as ``IidPartitioner`` splits it).
        columns: The columns each item holds; ``None`` takes them all.
    """

    def __init__(self, dataset: Any, label_column: str | None = "label", columns: Sequence[str] | None = None) -> None:
        (datasets,) = require_extra(type(self).__name__, "llm", "datasets")
        if isinstance(dataset, (str, os.PathLike)):
            dataset = _load_from_disk(datasets, dataset)
        if not isinstance(dataset, datasets.Dataset):
            hint = " (pick a split, e.g. dataset['train'])" if isinstance(dataset, datasets.DatasetDict) else ""
            raise TypeError(f"Expected a `datasets.Dataset`{hint}; got {type(dataset).__name__}.")
        names = list(dataset.column_names)
        if columns is not None:
            if isinstance(columns, str) or not columns:
                raise InvalidArgumentError("columns", columns, f"null or a list of column names of {names}")
            missing = [column for column in columns if column not in names]
            if missing:
                raise InvalidArgumentError("columns", list(columns), f"column names of the dataset ({names})")
        self.columns = list(names if columns is None else columns)
        if len(dataset) == 0:
            raise ValueError("The `datasets.Dataset` is empty.")
        self.targets: Tensor | None = None
        if label_column is not None:
            if label_column not in names:
                raise InvalidArgumentError(
                    "label_column", label_column, f"null or one of the dataset's columns {names}"
                )
            self.targets = _label_tensor(dataset, label_column)
        self.label_column = label_column
        self.dataset = dataset.with_format("torch", columns=self.columns)

    def __len__(self) -> int:
        return len(self.dataset)

    @override
    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.dataset[int(index)]

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        """The rows at ``indices``, read in one query (what a batched DataLoader calls) and split into items.

        Raises:
            ValueError: If a column's sequences differ in length within the batch (they could not be stacked).
        """
        batch = self.dataset[list(indices)]
        for column in self.columns:
            _check_one_length(column, batch[column])
        return [{column: batch[column][row] for column in self.columns} for row in range(len(indices))]


def _check_one_length(column: str, values: Any) -> None:
    """``datasets`` returns a ragged column as a list of tensors: refuse it in one line, before the collation does."""
    if not isinstance(values, list) or not values or not isinstance(values[0], Tensor):
        return
    lengths = {tuple(value.shape) for value in values}
    if len(lengths) > 1:
        raise ValueError(
            f"Column `{column}` holds sequences of different lengths in one batch ({sorted(lengths)[0]} to"
            f" {sorted(lengths)[-1]}): tokenize with padding='max_length' (and truncation=True), so that every row"
            " has one length."
        )


def _load_from_disk(datasets: Any, path: str | os.PathLike) -> Any:
    """The dataset that ``Dataset.save_to_disk`` wrote at ``path``."""
    if Path(path, "dataset_dict.json").is_file():
        raise FileNotFoundError(
            f"{str(path)!r} holds a `DatasetDict`: name one split's directory (e.g. {str(Path(path, 'train'))!r})."
        )
    if not Path(path, "dataset_info.json").is_file():
        raise FileNotFoundError(
            f"No dataset saved with `Dataset.save_to_disk` at {str(path)!r} (it has no dataset_info.json): save the"
            " tokenised split there, or pass the `datasets.Dataset` itself."
        )
    return datasets.load_from_disk(str(path))


def _label_tensor(dataset: Any, column: str) -> Tensor:
    """The column as int64 class ids; a float, boolean, text or nested column is refused in one line."""
    values = np.asarray(dataset.with_format("numpy", columns=[column])[column])
    if values.ndim != 1 or values.dtype.kind not in "iu":
        held = f"it holds {values.dtype} of shape {list(values.shape)}"
        raise InvalidArgumentError("label_column", column, f"a column of integer class ids ({held})")
    return torch.as_tensor(values, dtype=torch.int64)


class HFDatasetFederated(DatasetFederated):
    """Federates a Hugging Face ``datasets.Dataset``: rows as dict items (see :class:`HFDatasetAdapter`), split among
    clients by the partitioner on ``label_column``.

    Args:
        train_dataset: The training ``datasets.Dataset``, or the directory ``Dataset.save_to_disk`` wrote it to
            (from YAML: ``train_dataset: data/train``).
        test_dataset: The global test set, likewise; ``None`` uses the union of the client test splits.
        partitioner: Splits the training set among clients (by ``label_column`` where it uses labels).
        label_column: The column of integer class ids (e.g. ``"label"``, or a topic or source column to split by);
            ``None`` for data without labels.
        columns: The columns each item holds (e.g. ``["input_ids", "attention_mask", "labels"]``); ``None`` takes
            them all. Text columns batch as lists of strings.
        num_classes: Number of classes of ``label_column``; ``None`` takes the largest id + 1.
        batch_size, eval_batch_size, client_test_fraction, client_test_size, val_fraction, num_workers, seed,
            drop_last, pin_memory, persistent_workers: As in :class:`FederatedDataModule`.

    Example:
        >>> import datasets
        >>> from lightning_fed.datamodules import DirichletPartitioner
        >>> rows = datasets.Dataset.from_dict({"input_ids": [[1, 2]] * 40, "label": [0, 1] * 20})
        >>> data = HFDatasetFederated(rows, None, DirichletPartitioner(2, alpha=1.0), batch_size=4)
        >>> data.setup()
        >>> sorted(next(iter(data.client_dataloader(0, seed=0))))
        ['input_ids', 'label']
    """

    def __init__(
        self,
        train_dataset: Any,
        test_dataset: Any | None,
        partitioner: Partitioner,
        label_column: str | None = "label",
        columns: Sequence[str] | None = None,
        num_classes: int | None = None,
        batch_size: int = 32,
        eval_batch_size: int = 256,
        client_test_fraction: float = 0.2,
        client_test_size: int | None = None,
        val_fraction: float = 0.0,
        num_workers: int = 0,
        seed: int = 0,
        drop_last: bool = False,
        pin_memory: bool = False,
        persistent_workers: bool = False,
    ) -> None:
        train = HFDatasetAdapter(train_dataset, label_column, columns)
        test = None if test_dataset is None else HFDatasetAdapter(test_dataset, label_column, columns)
        super().__init__(
            train,
            test,
            num_classes,
            partitioner,
            batch_size=batch_size,
            eval_batch_size=eval_batch_size,
            client_test_fraction=client_test_fraction,
            client_test_size=client_test_size,
            val_fraction=val_fraction,
            num_workers=num_workers,
            seed=seed,
            drop_last=drop_last,
            pin_memory=pin_memory,
            persistent_workers=persistent_workers,
        )

    @override
    def _read_labels(self, train: Dataset) -> Tensor | None:
        # The label column, read once at construction; never a feature read as a label.
        return train.targets if isinstance(train, HFDatasetAdapter) else super()._read_labels(train)


__all__ = ["HFDatasetAdapter", "HFDatasetFederated"]
