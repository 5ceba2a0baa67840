"""The steps of :meth:`FederatedDataModule.setup <lightning_fed.datamodules.base.FederatedDataModule.setup>`, as
functions of the labels and the settings: read the labels, carve out the global validation set, partition the rest
among the clients, and hold out each client's test split. :class:`Layout` holds the result."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset, Subset

from lightning_fed.checks import InvalidArgumentError
from lightning_fed.datamodules._splits import RaggedIndex, holdout_sizes, stratified_holdout
from lightning_fed.datamodules.partitioners.base import Partitioner
from lightning_fed.utilities.seeding import derive_seed


@dataclass
class Layout:
    """Everything ``setup`` derives; built completely before it is attached, so a failed setup leaves no trace.

    Attributes:
        train: The training dataset every index below (but ``client_tests`` and ``test_indices``) points into.
        labels: ``[len(train)]`` int64 labels of ``train``; zeros for data without labels (``labelled`` false).
        val: Indices of the global validation set.
        clients: Every client's training indices.
        client_tests: Every client's test indices, into ``client_test_source``.
        client_test_source: The dataset the client test splits index (``train``, or LEAF's test data).
        test: The global test dataset.
        test_indices: The indices of ``test`` that form the global test set; ``None`` means all of it.
        fingerprint: A digest of the labels and every split, checked on resume.
        shared: Indices of Zhao et al.'s global set G, or ``None`` without data sharing.
        shares: Every client's share of G, or ``None`` without data sharing.
        labelled: Whether ``labels`` are the data's labels; without them every holdout is a uniform random draw.
        num_classes: The classes ``labels`` range over (1 for data without labels).
    """

    train: Dataset
    labels: Tensor
    val: Tensor
    clients: RaggedIndex
    client_tests: RaggedIndex
    client_test_source: Dataset
    test: Dataset
    test_indices: Tensor | None
    fingerprint: str
    shared: Tensor | None = None
    shares: RaggedIndex | None = None
    labelled: bool = True
    num_classes: int = 1


NO_LABELS_HINT = (
    "give the dataset a `targets` (or `labels`) attribute of integer class ids, pass DatasetFederated a `label_fn`"
    " (item -> class id), or yield (input, integer label) items"
)
"""How to give a dataset labels: ends every message about data without them."""


def _item_label(item: object) -> int | None:
    """The label an item declares, or ``None``: the second element of a tuple or list when it is an integer scalar
    (a Python or NumPy integer, or a 0-dim integer tensor), or a mapping's ``"label"`` entry likewise.

    A bare tensor, a float second element or a feature vector is never a label.
    """
    if isinstance(item, Mapping):
        value = item.get("label")
    elif isinstance(item, (tuple, list)) and len(item) >= 2:
        value = item[1]
    else:
        return None
    if isinstance(value, Tensor):
        if value.ndim != 0 or value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            return None
        return int(value)
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return None


def extract_labels(dataset: Dataset, name: str, label_fn: Callable[[Any], Any] | None = None) -> Tensor | None:
    """The dataset's labels as an int64 tensor, or ``None`` when it has none.

    Labels come from, in order: ``label_fn`` applied to every item; a ``targets`` or ``labels`` attribute of the
    dataset's length (through ``Subset``\\ s); items that declare one (see :func:`_item_label`), read by iterating
    once when the first item does. Data whose first item declares no label (a bare tensor, say) has none: a feature
    is never read as a label.

    Raises:
        ValueError: If the dataset is empty, ``label_fn`` returns a non-integer, or a later item lacks the label
            that the first one declared.
    """
    size = len(dataset)  # type: ignore[arg-type]  # map-style datasets are sized; torch's Dataset does not say so
    if size == 0:
        raise ValueError(f"The {name} dataset is empty.")
    if label_fn is not None:
        computed = []
        for index in range(size):
            value = label_fn(dataset[index])
            label = _item_label((None, value))
            if label is None:
                raise ValueError(f"`label_fn` must return an integer class id for every {name} item; got {value!r}.")
            computed.append(label)
        return torch.tensor(computed, dtype=torch.int64)
    if isinstance(dataset, Subset):
        inner = extract_labels(dataset.dataset, name)
        return None if inner is None else inner[torch.as_tensor(dataset.indices, dtype=torch.int64)]
    for attribute in ("targets", "labels"):
        values = getattr(dataset, attribute, None)
        if values is not None and len(values) == size:
            return torch.as_tensor(values).to(torch.int64).reshape(-1)
    if _item_label(dataset[0]) is None:
        return None
    labels: list[int] = []
    for index in range(size):
        label = _item_label(dataset[index])
        if label is None:
            raise ValueError(
                f"{name.capitalize()} item 0 has an integer label but item {index} does not: every item must be"
                f" (input, integer label), or {NO_LABELS_HINT}."
            )
        labels.append(label)
    return torch.tensor(labels, dtype=torch.int64)


def no_labels_error(name: str, value: object, allowed: str) -> InvalidArgumentError:
    """The one-line error for a setting that needs labels the training data does not have."""
    return InvalidArgumentError(name, value, f"{allowed}: the training data has no labels ({NO_LABELS_HINT})")


def exposed_labels(dataset: Dataset) -> Tensor | None:
    """The dataset's labels when it exposes them (``targets``/``labels``, through ``Subset``\\ s), else ``None``.

    Unlike :func:`extract_labels` it never iterates the dataset: evaluation data is only checked where that is free.
    """
    if isinstance(dataset, Subset):
        labels = exposed_labels(dataset.dataset)
        return None if labels is None else labels[torch.as_tensor(dataset.indices, dtype=torch.int64)]
    size = len(dataset) if hasattr(dataset, "__len__") else None
    for attribute in ("targets", "labels"):
        values = getattr(dataset, attribute, None)
        if values is not None and size is not None and len(values) == size:
            return torch.as_tensor(values).to(torch.int64).reshape(-1)
    return None


def check_label_range(labels: Tensor, num_classes: int, what: str = "Training labels") -> None:
    """Raises a ``ValueError`` unless every label lies in ``[0, num_classes)``."""
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(
            f"{what} span [{int(labels.min())}, {int(labels.max())}] but `num_classes` is "
            f"{num_classes}: labels must lie in [0, num_classes)."
        )


def check_evaluation_labels(
    test: Dataset,
    test_indices: Tensor | None,
    client_tests: RaggedIndex,
    source: Dataset,
    train: Dataset,
    num_classes: int,
) -> None:
    """Range-checks the labels of the global test set and of the client test splits, where the datasets expose them
    (those drawn from the training data are checked already): a label out of range would otherwise train a whole
    round and then fail in the first evaluation.
    """
    if test is not train:
        labels = exposed_labels(test)
        if labels is not None:
            check_label_range(labels if test_indices is None else labels[test_indices], num_classes, "Test labels")
    if source is not train and source is not test and client_tests.flat.numel():
        labels = exposed_labels(source)
        if labels is not None:
            check_label_range(labels[client_tests.flat], num_classes, "Client test labels")


def carve_validation(
    labels: Tensor, natural_ids: Tensor | None, val_fraction: float, num_clients: int, seed: int
) -> tuple[Tensor, Tensor]:
    """Returns (validation indices, the remaining indices to partition).

    The holdout is label-stratified. With natural client ids it is taken from every natural client (stratified by
    label within it, leaving each at least one example), so that no natural client vanishes before partitioning.

    Raises:
        ValueError: If fewer than ``num_clients`` examples would remain.
    """
    total = labels.numel()
    if natural_ids is None:
        groups = torch.zeros_like(labels)
        size = 0 if val_fraction == 0 else max(1, math.floor(total * val_fraction + 0.5))
        sizes = torch.tensor([size])
    else:
        groups = torch.unique(natural_ids, return_inverse=True)[1]
        sizes = holdout_sizes(torch.bincount(groups), val_fraction, None)
    remaining = total - int(sizes.sum())
    if remaining < num_clients:
        raise InvalidArgumentError(
            "val_fraction",
            val_fraction,
            f"small enough to leave each of the {num_clients} clients an example: it holds out {total - remaining} of"
            f" {total} for validation, leaving {remaining} (or lower the partitioner's `num_partitions`)",
        )
    if val_fraction == 0:
        return torch.zeros(0, dtype=torch.int64), torch.arange(total)
    generator = torch.Generator().manual_seed(derive_seed(seed, "val"))
    mask = stratified_holdout(labels, groups, sizes, generator)
    return mask.nonzero().squeeze(1), (~mask).nonzero().squeeze(1)


def assign_partitions(
    partitioner: Partitioner,
    labels: Tensor,
    natural_ids: Tensor | None,
    pool: Tensor,
    held_out: dict[str, tuple[object, int]] | None = None,
) -> RaggedIndex:
    """Partitions ``pool`` (indices into ``labels``) with ``partitioner``; checks it gave one disjoint part per client.

    Args:
        held_out: The settings that took examples out of the pool before partitioning, as ``{name: (value,
            count)}`` (``val_fraction``, ``sharing``): when the partitioner fails on the pool but not on all the
            data, the first of them is the setting to name.

    Raises:
        ValueError: If the partitioner returned the wrong number of parts or gave an example to two clients.
        InvalidArgumentError: Naming the holdout setting, when the partitioner fails only for want of the examples
            it held out.
    """
    num_clients = partitioner.num_partitions
    try:
        parts = partitioner.partition(labels[pool], None if natural_ids is None else natural_ids[pool])
    except ValueError as error:
        _blame_holdouts(error, partitioner, labels, natural_ids, pool, held_out or {})
        raise
    if len(parts) != num_clients:
        raise ValueError(f"{partitioner!r} returned {len(parts)} partitions instead of {num_clients}.")
    clients = RaggedIndex.from_parts([pool[torch.as_tensor(part, dtype=torch.int64)] for part in parts])
    if clients.flat.numel() and torch.bincount(clients.flat).max() > 1:
        raise ValueError(f"{partitioner!r} assigned an example to more than one client.")
    return clients


def _blame_holdouts(
    error: ValueError,
    partitioner: Partitioner,
    labels: Tensor,
    natural_ids: Tensor | None,
    pool: Tensor,
    held_out: dict[str, tuple[object, int]],
) -> None:
    """Raises an :class:`InvalidArgumentError` naming the holdout setting when ``partitioner``, which failed on
    ``pool``, would succeed on all the data: the examples the setting held out are what it lacked."""
    taken = {name: entry for name, entry in held_out.items() if entry[1] > 0}
    if not taken or pool.numel() == labels.numel():
        return
    try:
        partitioner.partition(labels, natural_ids)
    except ValueError:
        return  # it fails without the holdouts too: its own settings are the ones to change
    name, (value, count) = next(iter(taken.items()))
    reason = " ".join(str(error).split()).rstrip(".")
    raise InvalidArgumentError(
        name,
        value,
        f"smaller: it holds out {count} of {labels.numel()} examples, and the {pool.numel()} left are too few for"
        f" the partitioner ({reason})",
    ) from error


def hold_out_client_tests(
    partitions: RaggedIndex, labels: Tensor, fraction: float, size: int | None, seed: int
) -> tuple[RaggedIndex, RaggedIndex]:
    """Splits every client's partition into (train split, test split), the test split label-stratified.

    A client holds out ``round(n * fraction)`` examples, or ``size`` when given, always keeping one for training.

    Raises:
        InvalidArgumentError: If ``size`` is given and some client has ``size`` examples or fewer: a fixed test size
            that a client cannot give is an impossible request, not one to cap silently.
    """
    lengths = partitions.lengths()
    if size is not None and lengths.numel() and size > int(lengths.min()) - 1:
        smallest = int(lengths.argmin())
        raise InvalidArgumentError(
            "client_test_size",
            size,
            f"at most {int(lengths[smallest]) - 1}: client {smallest} has {int(lengths[smallest])} examples and keeps"
            " one for training (lower it, or use `client_test_fraction`)",
        )
    sizes = holdout_sizes(lengths, fraction, size)
    groups = partitions.group_ids()
    generator = torch.Generator().manual_seed(derive_seed(seed, "client_test"))
    held = stratified_holdout(labels[partitions.flat], groups, sizes, generator)
    clients = RaggedIndex.from_groups(partitions.flat[~held], groups[~held], len(partitions))
    return clients, RaggedIndex.from_groups(partitions.flat[held], groups[held], len(partitions))


def check_no_empty_client(clients: RaggedIndex, partitioner: Partitioner) -> None:
    """Raises a ``ValueError`` naming the settings to change when a client has no training example."""
    empty = (clients.lengths() == 0).nonzero().squeeze(1)
    if empty.numel():
        raise ValueError(
            f"{empty.numel()} of {len(clients)} clients (e.g. client {int(empty[0])}) have no training "
            f"examples with {partitioner!r}: lower `num_partitions`, or change the partitioner's settings "
            "that skew sizes (e.g. raise Dirichlet `alpha` or `min_partition_size`)."
        )


__all__ = [
    "NO_LABELS_HINT",
    "Layout",
    "assign_partitions",
    "carve_validation",
    "check_evaluation_labels",
    "check_label_range",
    "check_no_empty_client",
    "exposed_labels",
    "extract_labels",
    "no_labels_error",
    "hold_out_client_tests",
]
